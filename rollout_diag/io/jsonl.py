"""A compiled (numba) reader of JSON lines for the fields a trainer format uses: the fast path of
:func:`rollout_diag.io.formats.base.jsonl_file`. Not a trainer format itself.

One pass over a block of lines, byte by byte, with no Python object per value. Each line must be one JSON
object; the fields named in the format's schema are read into typed arrays, every other value is checked
against JSON's grammar (as Python's ``json`` reads it, ``NaN``/``Infinity``/``-Infinity`` included) and
skipped. A line is **accepted** only where Python's ``json.loads`` would certainly read it to the same
values; any doubt sends the line back to the format's own line parser, which then gives the row (or the
message) it always gave. Doubt means: not an object, a grammar error anywhere, a key with an escape, a
field of interest given twice or with a value of another JSON type, an integer of more than 18 digits, an
integer literal of magnitude 2**53 or more in a float list (Python keeps it exact, ``pa.array`` refuses it),
a number of more than 19 significant digits or outside the normal double range, a string value with an
escape or a control character, nesting deeper than 64. ``-0`` (an integer to Python) reads as 0.0.

Numbers are converted exactly as Python's ``float()`` does (correctly rounded): Clinger's fast path where
the digits fit in 53 bits and the power of ten is exact, else the Eisel–Lemire algorithm (a 128-bit
product with a truncated power of five; Lemire, "Number Parsing at a Gigabyte per Second", 2021, and
Mushtak & Lemire, "Fast Number Parsing Without Fallback", 2023, which shows the second product always
suffices; the 128-bit products are one widening multiply). Fraction digits are read eight at a time where eight
bytes are all digits (fast_float's word test; little-endian machines). tests/io/test_jsonl_scan.py and
tests/io/test_jsonl_blocks.py check it against Python's json on 1.4 million strings and hypothesis.

Speed (docs/benchmarks.md, issue 20 session 4): the per-item work (number, conversion, a skipped scalar) is
inlined into the list loop (a call per item cost about half the scan), and the output buffers are reserved at
their bound (one item per two bytes) instead of counted in a first pass: the pages are taken only as written.
The scan holds no GIL (``nogil``): ``io/formats/base.py`` runs it on parts of a block on every core. An unused list
of numbers and nulls (prime-rl's ``position_ids``, ``entropy``, …; NeMo-RL's ``advantages``) is skipped by one tight
loop, checked as strictly (issue 20 session 7: a line with every field skipped about 1.95 -> 1.55 ns per byte); a list
field's null flags are gathered only where the scan read a null item in it.

Compile time (issue 20 session 5; about 35 s of CPU before, about 20 after): numba inlines ``inline="always"``
functions at its own IR level, so each call site of the item reader is typed and lowered again. Lists and lists
of lists therefore share one call site of ``_items``, and integers have their own small reader
(:func:`_integer_literal`) rather than the float number reader with a flag. Array copies are loops, not slice
assignments (a slice assignment compiles numba's size-check message: about 2-3 s for ``line_ends``). Where the
rest goes (session 7): numba copies an inlined function's IR block by block, each copy of a block copying the
function's whole variable scope, so the nested item reader (``_items`` <- ``_element`` <- ``_number``) costs about
5 s of ``scan``'s 10; calls instead of inlining halve that but slow the scan by 5-70 % (numba's calls are not
inlined by LLVM here).

Schema kinds (``pyarrow`` types of a :data:`FastLines.schema`): ``int64``, ``string``, and lists or lists
of lists of ``float64`` / ``int64`` / ``bool``. A JSON ``null`` (or an absent field) is an Arrow null at
that place, as pyarrow's JSON reader gives it; :class:`Scanned` also says which nulls were written out.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from llvmlite import ir
from numba import njit, types
from numba.cpython.unsafe.numbers import leading_zeros
from numba.extending import intrinsic
from numba.np.arrayobj import populate_array

# value kinds of a field, and element kinds of list fields
INT, STRING, LIST, LIST2 = 0, 1, 2, 3
FLOAT_ELEMENT, INT_ELEMENT, BOOL_ELEMENT = 0, 1, 2
ABSENT, NULL, PRESENT = 0, 1, 2  # per line and field
MAX_DEPTH = 64

_FLAGS: dict[str, Any] = {"cache": True, "nogil": True}
_INLINE: dict[str, Any] = {
    **_FLAGS,
    "inline": "always",
}  # per list item: no call (measured 2-3x faster on null/bool/int items)

# -------------------------------------------------------------------------------- powers for Eisel–Lemire
_SMALLEST_POWER, _LARGEST_POWER = -342, 308


def _powers_of_five() -> np.ndarray:
    """128-bit truncated, normalised 5**q for q in [-342, 308], as (high, low) uint64 pairs (fast_float's table)."""
    table = []
    for q in range(_SMALLEST_POWER, 0):
        power5 = 5**-q
        z = power5.bit_length()  # smallest z with 2**z >= power5 (power5 is never a power of two)
        if q >= -27:
            c = 2 ** (z + 127) // power5 + 1
        else:
            c = 2 ** (2 * z + 128) // power5 + 1
            while c >= 1 << 128:
                c //= 2
        table.append(c)
    for q in range(0, _LARGEST_POWER + 1):
        power5 = 5**q
        while power5 < 1 << 127:
            power5 *= 2
        while power5 >= 1 << 128:
            power5 //= 2
        table.append(power5)
    flat = []
    for c in table:
        flat += [c >> 64, c & ((1 << 64) - 1)]
    return np.array(flat, dtype=np.uint64)


_POWER_OF_FIVE = _powers_of_five()
_EXACT_POWERS_OF_TEN = np.array([10.0**i for i in range(23)])  # exact doubles: 10**22 < 2**53 * 5**22 fits
_ALL_ONES = np.uint64(0xFFFFFFFFFFFFFFFF)
_PRECISION_MASK = np.uint64(0xFFFFFFFFFFFFFFFF >> 55)
_ONE = np.uint64(1)
_TWO53 = np.uint64(1 << 53)
_HIDDEN = np.uint64(1 << 52)
_SIGN = np.uint64(1 << 63)


@intrinsic
def _multiply(typingctx, a, b):
    """The 128-bit product of two uint64 as (high, low): one widening multiply (LLVM's i128)."""
    if a != types.uint64 or b != types.uint64:
        return None
    signature = types.UniTuple(types.uint64, 2)(types.uint64, types.uint64)

    def codegen(context, builder, signature, args):
        wide = ir.IntType(128)
        product = builder.mul(builder.zext(args[0], wide), builder.zext(args[1], wide))
        high = builder.trunc(builder.lshr(product, ir.Constant(wide, 64)), ir.IntType(64))
        low = builder.trunc(product, ir.IntType(64))
        return context.make_tuple(builder, signature.return_type, [high, low])

    return signature, codegen


@njit(**_INLINE)
def decimal_to_double(w, q, negative):
    """``w * 10**q`` correctly rounded to a double (``w`` a uint64 of at most 19 digits); ok False where this
    path does not decide (out of the normal range), so the caller leaves the number to Python."""
    if w == np.uint64(0):
        return (-0.0 if negative else 0.0), True
    if -22 <= q <= 22 and w <= _TWO53:  # Clinger: both operands exact, one rounding
        value = float(w)
        value = value * _EXACT_POWERS_OF_TEN[q] if q >= 0 else value / _EXACT_POWERS_OF_TEN[-q]
        return (-value if negative else value), True
    if q < _SMALLEST_POWER or q > _LARGEST_POWER:
        return 0.0, False
    lz = int(leading_zeros(w))
    w = w << np.uint64(lz)
    index = 2 * (q - _SMALLEST_POWER)
    high, low = _multiply(w, _POWER_OF_FIVE[index])
    if (high & _PRECISION_MASK) == _PRECISION_MASK:
        high2, _ = _multiply(w, _POWER_OF_FIVE[index + 1])
        low = low + high2
        if high2 > low:
            high = high + _ONE
    if low == _ALL_ONES and (q < -27 or q > 55):
        return 0.0, False  # the older, more cautious rule: leave it to Python
    upper = int(high >> np.uint64(63))
    shift = np.uint64(upper + 9)
    mantissa = high >> shift
    power2 = (((152170 + 65536) * q) >> 16) + 63 + upper - lz + 1023
    if power2 <= 0:
        return 0.0, False  # subnormal
    if low <= _ONE and -4 <= q <= 23 and (mantissa & np.uint64(3)) == _ONE and (mantissa << shift) == high:
        mantissa = mantissa & ~_ONE  # exactly half way: round to even
    mantissa = (mantissa + (mantissa & _ONE)) >> _ONE
    if mantissa >= (_HIDDEN << _ONE):
        mantissa = _HIDDEN
        power2 += 1
    if power2 >= 0x7FF:
        return 0.0, False  # overflows to infinity
    sign = _SIGN if negative else np.uint64(0)
    pattern = (np.uint64(power2) << np.uint64(52)) | (mantissa & ~_HIDDEN) | sign
    return np.uint64(pattern).view(np.float64), True


# -------------------------------------------------------------------------------- the byte scanner
_LITTLE_ENDIAN = sys.byteorder == "little"  # eight digits are read as one little-endian word
_TEN8 = np.uint64(100_000_000)
_HIGH_NIBBLES = np.uint64(0xF0F0F0F0F0F0F0F0)
_SIXES = np.uint64(0x0606060606060606)
_THREES = np.uint64(0x3333333333333333)
_ZEROS = np.uint64(0x3030303030303030)
_BYTES_0_4 = np.uint64(0x000000FF000000FF)
_MUL_100_1000000 = np.uint64(100 + (1_000_000 << 32))
_MUL_1_10000 = np.uint64(1 + (10_000 << 32))
_S4, _S8, _S16, _S32 = np.uint64(4), np.uint64(8), np.uint64(16), np.uint64(32)


@intrinsic
def _load8(typingctx, array, index):
    """The eight bytes ``array[index:index + 8]`` as one (unaligned) uint64 word; the caller checks the bounds."""
    signature = types.uint64(array, index)

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        address = builder.gep(data, [args[1]])
        return builder.load(builder.bitcast(address, ir.IntType(64).as_pointer()), align=1)

    return signature, codegen


@njit(**_INLINE)
def _eight_digits(chunk):
    """Whether all eight bytes of a little-endian word are ASCII digits (fast_float's test)."""
    return ((chunk & _HIGH_NIBBLES) | (((chunk + _SIXES) & _HIGH_NIBBLES) >> _S4)) == _THREES


@njit(**_INLINE)
def _parse8(chunk):
    """The value of eight ASCII digits in a little-endian word, the first byte the most significant digit."""
    chunk = chunk - _ZEROS
    chunk = chunk * np.uint64(10) + (chunk >> _S8)
    low = (chunk & _BYTES_0_4) * _MUL_100_1000000
    high = ((chunk >> _S16) & _BYTES_0_4) * _MUL_1_10000
    return (low + high) >> _S32


@intrinsic
def _unowned(typingctx, array):
    """A view of ``array`` without its memory owner (as ``numba.carray`` gives): passing it to a helper costs no
    atomic reference count (measured: they took over half the scan's time). The caller keeps ``array`` alive."""

    def codegen(context, builder, signature, args):
        source = context.make_array(signature.args[0])(context, builder, args[0])
        view = context.make_array(signature.return_type)(context, builder)
        populate_array(
            view, data=source.data, shape=source.shape, strides=source.strides, itemsize=source.itemsize, meminfo=None
        )
        return view._getvalue()  # noqa: SLF001  (numba's intrinsic API: the proxy's LLVM value)

    return array(array), codegen


@njit(**_INLINE)
def _space(buf, p, end):
    while p < end:
        c = buf[p]
        if c != 32 and c != 10 and c != 9 and c != 13:
            return p
        p += 1
    return p


_NULL_WORD = np.uint64(int.from_bytes(b"null", "little"))
_LOW_FOUR = np.uint64(0xFFFFFFFF)


@njit(**_INLINE)
def _is_null(buf, p, end):
    if _LITTLE_ENDIAN and p + 8 <= end:  # one compare of the word's first four bytes
        return (_load8(buf, p) & _LOW_FOUR) == _NULL_WORD
    return p + 4 <= end and buf[p] == 110 and buf[p + 1] == 117 and buf[p + 2] == 108 and buf[p + 3] == 108


@njit(**_INLINE)
def _is_true(buf, p, end):
    return p + 4 <= end and buf[p] == 116 and buf[p + 1] == 114 and buf[p + 2] == 117 and buf[p + 3] == 101


@njit(**_INLINE)
def _is_false(buf, p, end):
    return (
        p + 5 <= end
        and buf[p] == 102
        and buf[p + 1] == 97
        and buf[p + 2] == 108
        and buf[p + 3] == 115
        and buf[p + 4] == 101
    )


@njit(**_FLAGS)
def _is_nan(buf, p, end):
    return p + 3 <= end and buf[p] == 78 and buf[p + 1] == 97 and buf[p + 2] == 78


@njit(**_FLAGS)
def _is_infinity(buf, p, end):
    if p + 8 > end:
        return False
    for i in range(8):  # noqa: SIM110 - a generator in all() does not compile in numba
        if buf[p + i] != b"Infinity"[i]:
            return False
    return True


@njit(**_INLINE)
def _integer_literal(buf, p, end):
    """A JSON integer literal of at most 18 digits at ``p``: (end position, value), or (-1, 0) where there is none
    (a fraction or an exponent included: Python reads those as floats)."""
    negative = p < end and buf[p] == 45  # -
    if negative:
        p += 1
    if p >= end:
        return -1, 0
    c = buf[p]
    whole = 0
    digits = 0
    if c == 48:  # 0: a leading zero stands alone
        p += 1
    elif 49 <= c <= 57:
        while p < end and 48 <= buf[p] <= 57:
            if digits < 18:
                whole = whole * 10 + (buf[p] - 48)
            digits += 1
            p += 1
    else:
        return -1, 0
    if digits > 18 or (p < end and (buf[p] == 46 or buf[p] == 101 or buf[p] == 69)):  # . e E
        return -1, 0
    return p, (-whole if negative else whole)


@njit(**_INLINE)
def _number(buf, p, end):
    """A JSON number at ``p`` as a float (Python's grammar, ``NaN``/``Infinity``/``-Infinity`` included).

    Returns (end position or -1, value, is_integer_literal); -1 also where the value is left to Python (more than 19
    significant digits, outside the normal double range). Integer fields use :func:`_integer_literal`."""
    negative = False
    if p < end and buf[p] == 45:  # -
        negative = True
        p += 1
    if p >= end:
        return -1, 0.0, False
    c = buf[p]
    if c == 73 and _is_infinity(buf, p, end):
        return p + 8, (-np.inf if negative else np.inf), False
    if c == 78 and not negative and _is_nan(buf, p, end):
        return p + 3, np.nan, False
    w = np.uint64(0)
    digits = 0  # significant digits in w (leading zeros not counted)
    ten = np.uint64(10)
    if c == 48:  # 0
        p += 1
    elif 49 <= c <= 57:
        while p < end and 48 <= buf[p] <= 57:
            w = w * ten + np.uint64(buf[p] - 48)
            digits += 1
            p += 1
    else:
        return -1, 0.0, False
    literal_int = True
    fraction = 0
    if p < end and buf[p] == 46:  # .
        literal_int = False
        p += 1
        start = p
        if not digits:  # leading zeros are no significant digits
            while p < end and buf[p] == 48:
                p += 1
        while _LITTLE_ENDIAN and p + 8 <= end:  # eight digits at a time (the first is significant here)
            chunk = _load8(buf, p)
            if not _eight_digits(chunk):
                break
            w = w * _TEN8 + _parse8(chunk)  # wraps past 19 digits: such numbers are refused below
            digits += 8
            p += 8
        while p < end and 48 <= buf[p] <= 57:
            w = w * ten + np.uint64(buf[p] - 48)
            digits += 1
            p += 1
        fraction = p - start
        if p == start:
            return -1, 0.0, False
    exponent = 0
    if p < end and (buf[p] == 101 or buf[p] == 69):  # e E
        literal_int = False
        p += 1
        minus = False
        if p < end and (buf[p] == 43 or buf[p] == 45):
            minus = buf[p] == 45
            p += 1
        start = p
        while p < end and 48 <= buf[p] <= 57:
            if p - start < 6:
                exponent = exponent * 10 + (buf[p] - 48)
            p += 1
        if p == start or p - start > 5:
            return -1, 0.0, False
        if minus:
            exponent = -exponent
    if digits > 19:
        return -1, 0.0, False
    if literal_int:
        negative = negative and digits > 0  # Python reads -0 as the integer 0: +0.0 as a float
    value, ok = decimal_to_double(w, exponent - fraction, negative)
    if not ok:
        return -1, 0.0, False
    return p, value, literal_int


@njit(**_FLAGS)
def _string_end(buf, p, end, plain):
    """Position after the JSON string starting at ``p`` (a quote), or -1; ``plain``: refuse escapes."""
    p += 1
    while p < end:
        c = buf[p]
        if c == 34:
            return p + 1
        if c < 32:
            return -1
        if c == 92:
            if plain or p + 1 >= end:
                return -1
            e = buf[p + 1]
            if e == 117:  # u: four hex digits
                if p + 6 > end:
                    return -1
                for i in range(p + 2, p + 6):
                    h = buf[i]
                    if not (48 <= h <= 57 or 65 <= h <= 70 or 97 <= h <= 102):
                        return -1
                p += 6
                continue
            if not (e == 34 or e == 92 or e == 47 or e == 98 or e == 102 or e == 110 or e == 114 or e == 116):
                return -1
            p += 2
            continue
        p += 1
    return -1


@njit(**_INLINE)
def _scalar_end(buf, p, end):
    """Position after a JSON value that is not a container (string, number, literal), or -1 (grammar only:
    a skipped number is not converted)."""
    c = buf[p]
    if c == 34:
        return _string_end(buf, p, end, False)
    if c == 110:
        return p + 4 if _is_null(buf, p, end) else -1
    if c == 116:
        return p + 4 if _is_true(buf, p, end) else -1
    if c == 102:
        return p + 5 if _is_false(buf, p, end) else -1
    if c == 78:
        return p + 3 if _is_nan(buf, p, end) else -1
    if c == 73:
        return p + 8 if _is_infinity(buf, p, end) else -1
    if c == 45 and p + 1 < end and buf[p + 1] == 73:
        return p + 9 if _is_infinity(buf, p + 1, end) else -1
    return _number_shape_end(buf, p, end)


@njit(**_INLINE)
def _number_shape_end(buf, p, end):
    """Position after a number Python reads though this module does not convert it (long, huge), or -1."""
    if p < end and buf[p] == 45:
        p += 1
    if p >= end:
        return -1
    if buf[p] == 48:
        p += 1
    elif 49 <= buf[p] <= 57:
        while p < end and 48 <= buf[p] <= 57:
            p += 1
    else:
        return -1
    if p < end and buf[p] == 46:
        p += 1
        start = p
        while _LITTLE_ENDIAN and p + 8 <= end and _eight_digits(_load8(buf, p)):
            p += 8
        while p < end and 48 <= buf[p] <= 57:
            p += 1
        if p == start:
            return -1
    if p < end and (buf[p] == 101 or buf[p] == 69):
        p += 1
        if p < end and (buf[p] == 43 or buf[p] == 45):
            p += 1
        start = p
        while p < end and 48 <= buf[p] <= 57:
            p += 1
        if p == start:
            return -1
    return p


@njit(**_FLAGS)
def _member_value(buf, p, end):
    """After an object member's key string at ``p``: the position of its value (past ``:``), or -1."""
    p = _string_end(buf, p, end, False) if p < end and buf[p] == 34 else -1
    if p < 0:
        return -1
    p = _space(buf, p, end)
    if p >= end or buf[p] != 58:
        return -1
    return _space(buf, p + 1, end)


@njit(**_FLAGS)
def _flat_list_end(buf, p, end):
    """Position after the list whose ``[`` is at ``p`` when it is a list of numbers and ``null`` written without
    whitespace or with one space after each comma (checked as :func:`_skip_value` checks them), else -1: anything
    else (other whitespace, a container, a string, ``true``, ``NaN``, a grammar error) is left to the caller's general
    loop. The large lists the trainer formats' readers skip are such lists: one tight loop per item, no stack (and
    no more: each kind of item is code to compile)."""
    p += 1
    if p < end and buf[p] == 93:  # ]
        return p + 1
    while p < end:
        c = buf[p]
        if 48 <= c <= 57 or c == 45:  # a digit or -
            p = _number_shape_end(buf, p, end)
        elif c == 110:
            p = p + 4 if _is_null(buf, p, end) else -1
        else:
            return -1
        if p < 0 or p >= end:
            return -1
        c = buf[p]
        if c == 44:  # ,
            p += 1
            if p < end and buf[p] == 32:
                p += 1
        elif c == 93:
            return p + 1
        else:
            return -1
    return -1


@njit(**_FLAGS)
def _skip_value(buf, p, end, stack):
    """Position after the JSON value at ``p`` (any value, checked), or -1."""
    depth = 0
    while True:
        p = _space(buf, p, end)
        if p >= end:
            return -1
        c = buf[p]
        flat = _flat_list_end(buf, p, end) if c == 91 else -1
        if flat >= 0:
            p = flat
        elif c == 123 or c == 91:  # { [
            q = _space(buf, p + 1, end)
            if q < end and buf[q] == c + 2:  # } ]: empty
                p = q + 1
            else:
                if depth >= MAX_DEPTH:
                    return -1
                stack[depth] = c
                depth += 1
                p = _member_value(buf, q, end) if c == 123 else q
                if p < 0:
                    return -1
                continue
        else:
            p = _scalar_end(buf, p, end)
            if p < 0:
                return -1
        while True:  # a value ended: close what it ends
            if depth == 0:
                return p
            p = _space(buf, p, end)
            if p >= end:
                return -1
            c = buf[p]
            if c == 44:  # ,
                p = _space(buf, p + 1, end)
                if stack[depth - 1] == 123:
                    p = _member_value(buf, p, end)
                    if p < 0:
                        return -1
                break
            if c == stack[depth - 1] + 2:
                p += 1
                depth -= 1
                continue
            return -1


@njit(**_INLINE)
def _element(buf, p, end, element, floats, ints, nulls, n):
    """One list element at ``p`` into slot ``n``: returns the position after it, or -1."""
    if p >= end:
        return -1
    if buf[p] == 110:
        if not _is_null(buf, p, end):
            return -1
        nulls[n] = 1
        floats[n] = 0.0
        ints[n] = 0
        return p + 4
    nulls[n] = 0
    if element == BOOL_ELEMENT:
        if buf[p] == 116 and _is_true(buf, p, end):
            ints[n] = 1
            return p + 4
        if buf[p] == 102 and _is_false(buf, p, end):
            ints[n] = 0
            return p + 5
        return -1
    if element == INT_ELEMENT:
        q, whole = _integer_literal(buf, p, end)
        ints[n] = whole
        return q
    q, value, literal_int = _number(buf, p, end)
    if literal_int and abs(value) >= 9007199254740992.0:
        return -1  # an integer Python keeps exact: Arrow refuses it as a float beyond 2**53
    floats[n] = value
    return q


@njit(**_INLINE)
def _items(buf, p, end, element, floats, ints, nulls, n):
    """The items of the list whose ``[`` is at ``p`` into the element arrays from index ``n``: (the position after its
    ``]``, the next free index, whether an item was null), or (-1, …) where the list is not one the fast path reads."""
    p = _space(buf, p + 1, end)
    null_seen = False
    if p < end and buf[p] == 93:
        return p + 1, n, null_seen
    while p >= 0:
        q = _element(buf, p, end, element, floats, ints, nulls, n)
        if q < 0:
            break
        null_seen |= buf[p] == 110  # the item read was null
        p = q
        n += 1
        p = _space(buf, p, end)
        if p < end and buf[p] == 44:
            p = _space(buf, p + 1, end)
            if p >= end:
                p = -1
        elif p < end and buf[p] == 93:
            return p + 1, n, null_seen
        else:
            p = -1
    return -1, n, null_seen


@njit(**_FLAGS)
def _integer(buf, p, end):
    """An integer field's value (a call per line)."""
    return _integer_literal(buf, p, end)


@njit(**_FLAGS)
def scan(raw, starts, key_bytes, key_starts, kinds, elements):
    """Read lines ``raw[starts[i]:starts[i + 1]]``.

    Returns ``accepted[line]``; per field whether a list item read was ``null`` (``field_nulls``, which may also be
    set by a line later refused); per line and field ``status`` (ABSENT, NULL, PRESENT), ``first`` and ``count``:
    an INT's value (first) / a STRING's byte range / a LIST's first element and length / a LIST2's first
    sub-list and number of sub-lists; sub-lists as (``sub_first``, ``sub_count``, ``sub_null``); elements
    in ``floats``/``ints`` with ``nulls`` (one slot each, shared by all fields)."""
    lines = starts.shape[0] - 1
    keys = kinds.shape[0]
    accepted = np.zeros(lines, np.bool_)
    status = np.zeros((lines, keys), np.int8)
    first = np.zeros((lines, keys), np.int64)
    count = np.zeros((lines, keys), np.int64)
    field_nulls = np.zeros(keys, np.bool_)  # per field: a null item may have been written (so its flags are gathered)
    # every list item takes a byte and is followed by , or ]; every sub-list opens with [ and is followed by , or ]:
    # at most one per two bytes. The memory is only reserved: a page is taken when the scan first writes to it.
    items = (starts[lines] - starts[0]) // 2 + 1
    owned = (np.empty(items, np.float64), np.empty(items, np.int64), np.empty(items, np.uint8))
    owned_subs = (np.empty(items, np.int64), np.empty(items, np.int64), np.empty(items, np.uint8))
    owned_stack = np.empty(MAX_DEPTH, np.uint8)
    buf = _unowned(raw)
    floats, ints, nulls = _unowned(owned[0]), _unowned(owned[1]), _unowned(owned[2])
    sub_first, sub_count, sub_null = _unowned(owned_subs[0]), _unowned(owned_subs[1]), _unowned(owned_subs[2])
    stack = _unowned(owned_stack)
    n = 0  # elements used
    m = 0  # sub-lists used
    for line in range(lines):
        p, end = starts[line], starts[line + 1]
        line_n, line_m = n, m
        ok = False
        p = _space(buf, p, end)
        if p < end and buf[p] == 123:
            p = _space(buf, p + 1, end)
            if p < end and buf[p] == 125:
                p += 1
                ok = True
            while p < end and not ok:
                if buf[p] != 34:
                    break
                key_end = _string_end(buf, p, end, True)
                if key_end < 0:
                    break
                key = -1
                for k in range(keys):
                    a, b = key_starts[k], key_starts[k + 1]
                    if b - a == key_end - p - 2:
                        same = True
                        for i in range(b - a):
                            if buf[p + 1 + i] != key_bytes[a + i]:
                                same = False
                                break
                        if same:
                            key = k
                            break
                p = _space(buf, key_end, end)
                if p >= end or buf[p] != 58:
                    break
                p = _space(buf, p + 1, end)
                if p >= end:
                    break
                if key < 0:
                    p = _skip_value(buf, p, end, stack)
                elif status[line, key] != ABSENT:
                    break  # given twice: Python keeps the last; left to it
                elif buf[p] == 110:
                    p = p + 4 if _is_null(buf, p, end) else -1
                    status[line, key] = NULL
                else:
                    kind = kinds[key]
                    status[line, key] = PRESENT
                    if kind == INT:
                        p, whole = _integer(buf, p, end)
                        first[line, key] = whole
                    elif kind == STRING:
                        first[line, key] = p + 1
                        p = _string_end(buf, p, end, True) if buf[p] == 34 else -1
                        count[line, key] = p - 1
                    elif buf[p] != 91:
                        p = -1
                    else:  # a LIST, or a LIST2 (a list of lists or nulls): one place reads items (compile time)
                        nested = kind == LIST2
                        first[line, key] = m if nested else n
                        more = True
                        if nested:
                            p = _space(buf, p + 1, end)
                            if p < end and buf[p] == 93:
                                p += 1
                                more = False
                        while more:
                            if nested:
                                sub_first[m] = n
                                sub_null[m] = 0
                            if p >= end:
                                p = -1
                            elif buf[p] == 91:
                                p, n, null_seen = _items(buf, p, end, elements[key], floats, ints, nulls, n)
                                if null_seen:
                                    field_nulls[key] = True
                            elif nested and buf[p] == 110:
                                p = p + 4 if _is_null(buf, p, end) else -1
                                sub_null[m] = 1
                            else:
                                p = -1
                            if p < 0 or not nested:
                                break
                            sub_count[m] = n - sub_first[m]
                            m += 1
                            p = _space(buf, p, end)
                            if p < end and buf[p] == 44:
                                p = _space(buf, p + 1, end)
                                if p >= end:
                                    p = -1
                                    break
                            elif p < end and buf[p] == 93:
                                p += 1
                                break
                            else:
                                p = -1
                                break
                        count[line, key] = (m if nested else n) - first[line, key]
                if p < 0:
                    break
                p = _space(buf, p, end)
                if p >= end:
                    break
                if buf[p] == 125:  # }: the object ends
                    p += 1
                    ok = True
                elif buf[p] == 44:
                    p = _space(buf, p + 1, end)
                else:
                    break
        if ok and _space(buf, p, end) == end:
            accepted[line] = True
        else:
            n, m = line_n, line_m  # what the line wrote is dropped
            for k in range(keys):
                status[line, k] = ABSENT
    owned_stack[0] = 0  # a use after the loop: numba frees an array after its last use, and ``stack`` is a view of it
    return (
        accepted,
        field_nulls,
        status,
        first,
        count,
        owned_subs[0][:m],
        owned_subs[1][:m],
        owned_subs[2][:m],
        owned[0][:n],
        owned[1][:n],
        owned[2][:n],
    )


_ONES = np.uint64(0x0101010101010101)
_HIGH_BITS = np.uint64(0x8080808080808080)
_LOW_BITS = np.uint64(0x7F7F7F7F7F7F7F7F)
_NEWLINES = np.uint64(0x0A0A0A0A0A0A0A0A)
_RETURNS = np.uint64(0x0D0D0D0D0D0D0D0D)
_S7, _S56 = np.uint64(7), np.uint64(56)


@njit(**_INLINE)
def _holds(word, pattern):
    """Non-zero where some byte of ``word`` equals the byte repeated in ``pattern`` (exact as a yes/no)."""
    x = word ^ pattern
    return (x - _ONES) & ~x & _HIGH_BITS


@njit(**_INLINE)
def _equal_bytes(word, pattern):
    """1 in each byte of ``word`` that equals the byte repeated in ``pattern``, else 0 (exact per byte: no carry
    crosses bytes, unlike :func:`_holds`)."""
    x = word ^ pattern
    return (~(((x & _LOW_BITS) + _LOW_BITS) | x | _LOW_BITS)) >> _S7


@njit(**_FLAGS)
def line_ends(buf, start, stop):
    """(the position after each newline (byte 10) of ``buf[start:stop]``, in order, int64; whether those bytes are
    all ASCII). One pass, 32 bytes at a time: four words without a newline are passed over whole (the four loads
    and tests are independent, so they overlap)."""
    ends = np.empty(1024, np.int64)
    lines = 0
    high = np.uint64(0)
    p = start
    while p < stop:
        while p + 32 <= stop:  # words without a newline (this loop touches no array it could have to count)
            w0, w1, w2, w3 = _load8(buf, p), _load8(buf, p + 8), _load8(buf, p + 16), _load8(buf, p + 24)
            high |= (w0 | w1) | (w2 | w3)
            if (_holds(w0, _NEWLINES) | _holds(w1, _NEWLINES)) | (_holds(w2, _NEWLINES) | _holds(w3, _NEWLINES)):
                break
            p += 32
        upto = min(p + 32, stop)
        for i in range(p, upto):
            c = buf[i]
            high |= np.uint64(c)
            if c == 10:
                if lines == ends.shape[0]:
                    grown = np.empty(2 * lines, np.int64)
                    for j in range(lines):  # a loop, not a slice copy: no size-check message to compile (about 3 s)
                        grown[j] = ends[j]
                    ends = grown
                ends[lines] = i + 1
                lines += 1
        p = upto
    return ends[:lines].copy(), (high & _HIGH_BITS) == 0


@njit(**_FLAGS)
def newlines_and_returns(buf, upto):
    """(newlines, carriage returns) in ``buf[:upto]``, 32 bytes at a time: each byte's equality as a 0/1 byte of a
    word (exact), added up per byte over four words, then across the bytes by one multiply."""
    newlines, returns = 0, 0
    p = 0
    while p + 32 <= upto:
        lines = np.uint64(0)
        carriage = np.uint64(0)
        for k in range(4):  # each byte of the sums reaches 4 at most
            word = _load8(buf, p + 8 * k)
            lines += _equal_bytes(word, _NEWLINES)
            carriage += _equal_bytes(word, _RETURNS)
        newlines += int((lines * _ONES) >> _S56)  # the sum of the eight bytes (at most 32) in the top byte
        returns += int((carriage * _ONES) >> _S56)
        p += 32
    for i in range(p, upto):
        newlines += buf[i] == 10
        returns += buf[i] == 13
    return newlines, returns


@njit(**_FLAGS)
def _gather(rows, first, count, values):
    """Concatenate ``values[first[r]:first[r] + count[r]]`` over ``rows``; returns (offsets, values)."""
    total = 0
    for r in rows:
        total += count[r]
    out = np.empty(total, values.dtype)
    offsets = np.empty(rows.shape[0] + 1, np.int32)
    offsets[0] = 0
    at = 0
    for i in range(rows.shape[0]):
        r = rows[i]
        for j in range(first[r], first[r] + count[r]):  # a loop, not a slice copy: no size check to compile
            out[at] = values[j]
            at += 1
        offsets[i + 1] = at
    return offsets, out


# -------------------------------------------------------------------------------- from scan to Arrow
@dataclass(frozen=True)
class _Field:
    kind: int
    element: int
    arrow: pa.DataType


def _field(data_type: pa.DataType) -> _Field:
    elements = {pa.float64(): FLOAT_ELEMENT, pa.int64(): INT_ELEMENT, pa.bool_(): BOOL_ELEMENT}
    if data_type == pa.int64():
        return _Field(INT, INT_ELEMENT, data_type)
    if data_type == pa.string():
        return _Field(STRING, INT_ELEMENT, data_type)
    if pa.types.is_list(data_type):
        inner = data_type.value_type
        if inner in elements:
            return _Field(LIST, elements[inner], data_type)
        if pa.types.is_list(inner) and inner.value_type in elements:
            return _Field(LIST2, elements[inner.value_type], data_type)
    raise TypeError(f"io.jsonl reads int64, string and (lists of) lists of float64/int64/bool, not {data_type}")


def _announce_compiling() -> None:
    """Say on stderr when the scanner is not in numba's cache yet (its first compile takes seconds)."""
    try:
        cached = os.path.exists(scan._cache._cache_file._index_path)  # noqa: SLF001  (no public cache query)
    except AttributeError:  # numba's cache internals moved: say nothing
        return
    if not cached:
        print("rollout-diag: compiling the JSON-lines reader once (about 20 s; cached after).", file=sys.stderr)
        from rollout_diag.engine.kernels import drop_stale_caches

        drop_stale_caches(sys.modules[__name__])  # an upgrade's first run: the last version's files go


class Scanner:
    """Reads blocks of lines into an Arrow table of ``schema``'s fields (see the module's docstring)."""

    def __init__(self, schema: pa.Schema) -> None:
        _announce_compiling()
        self.schema = schema
        self.fields = [_field(field.type) for field in schema]
        names = [name.encode() for name in schema.names]
        self._key_bytes = np.frombuffer(b"".join(names) or b"\0", np.uint8)
        self._key_starts = np.cumsum([0, *map(len, names)]).astype(np.int64)
        self._kinds = np.array([f.kind for f in self.fields], np.int64)
        self._elements = np.array([f.element for f in self.fields], np.int64)

    def scan(self, data: bytes, starts: np.ndarray) -> Scanned:
        """Lines ``data[starts[i]:starts[i + 1]]`` (ASCII or checked UTF-8): the accepted ones, read."""
        buf = np.frombuffer(data, np.uint8)
        buf.flags.writeable = False  # one compiled type whether ``data`` is bytes or a reused buffer
        accepted, field_nulls, status, first, count, sub_first, sub_count, sub_null, floats, ints, nulls = scan(
            buf, starts, self._key_bytes, self._key_starts, self._kinds, self._elements
        )
        rows = np.flatnonzero(accepted)
        status = status[rows]
        every = np.arange(len(rows))
        columns = []
        for k, field in enumerate(self.fields):
            present = status[:, k] == PRESENT
            starts_k = np.ascontiguousarray(first[rows, k])
            if field.kind == INT:
                columns.append(pa.array(starts_k, pa.int64(), mask=~present))
                continue
            if field.kind == STRING:
                ends = count[rows, k].tolist()
                values = [
                    data[a:b].decode("utf-8") if ok else None
                    for a, b, ok in zip(starts_k.tolist(), ends, present.tolist(), strict=True)
                ]
                columns.append(pa.array(values, pa.string()))
                continue
            items = ints if field.element != FLOAT_ELEMENT else floats.view(np.int64)  # one compiled _gather: bits
            any_null = field_nulls[k]  # else the field's items' null flags (all 0) are not gathered
            lengths = np.where(present, count[rows, k], 0)
            if field.kind == LIST2:
                offsets, subs = _gather(every, starts_k, lengths, np.arange(len(sub_first)))
                inner_offsets, values = _gather(subs, sub_first, sub_count, items)
                value_nulls = _gather(subs, sub_first, sub_count, nulls)[1] if any_null else None
                inner_nulls = sub_null[subs].view(np.bool_)
                inner = pa.ListArray.from_arrays(
                    pa.array(inner_offsets),
                    _values(values, value_nulls, field.element),
                    mask=pa.array(inner_nulls) if inner_nulls.any() else None,
                )
            else:
                offsets, values = _gather(every, starts_k, lengths, items)
                value_nulls = _gather(every, starts_k, lengths, nulls)[1] if any_null else None
                inner = _values(values, value_nulls, field.element)
            mask = None if present.all() else pa.array(~present)
            columns.append(pa.ListArray.from_arrays(pa.array(offsets), inner, mask=mask))
        table = pa.Table.from_arrays(columns, schema=self.schema)
        return Scanned(rows, table, status == NULL)


def _values(values: np.ndarray, value_nulls: np.ndarray | None, element: int) -> pa.Array:
    """``values`` (int64, or float64's bits as int64) as the element type's Arrow array."""
    mask = value_nulls.view(np.bool_) if value_nulls is not None and value_nulls.any() else None
    if element == BOOL_ELEMENT:
        return pa.array(values.astype(np.bool_), pa.bool_(), mask=mask)
    if element == FLOAT_ELEMENT:
        return pa.array(values.view(np.float64), pa.float64(), mask=mask)
    return pa.array(values, pa.int64(), mask=mask)


@dataclass(frozen=True)
class Scanned:
    """What :meth:`Scanner.scan` read: ``rows`` (indexes of the accepted lines in the block), ``table`` (one
    row each, the schema's fields) and ``written_null[row, field]`` (a ``null`` written out, not absent)."""

    rows: np.ndarray
    table: pa.Table
    written_null: np.ndarray
