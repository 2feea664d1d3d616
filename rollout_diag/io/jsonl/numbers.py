"""The scanner's numbers: JSON integer and number literals at a position, converted exactly as Python's ``float()``
converts them (correctly rounded), or only checked (:func:`number_shape_end`, a skipped number).

Clinger's fast path where the digits fit in 53 bits and the power of ten is exact, else the Eisel–Lemire algorithm (a
128-bit product with a truncated power of five; Lemire, "Number Parsing at a Gigabyte per Second", 2021, and Mushtak &
Lemire, "Fast Number Parsing Without Fallback", 2023, which shows the second product always suffices; the 128-bit
products are one widening multiply). Fraction digits are read eight at a time where eight bytes are all digits
(fast_float's word test; little-endian machines)."""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.cpython.unsafe.numbers import leading_zeros

from rollout_diag.io.jsonl.words import (
    INLINE,
    LITTLE_ENDIAN,
    eight_digits,
    is_infinity,
    is_nan,
    load8,
    multiply,
    parse8,
)

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
_TEN = np.uint64(10)
_TEN8 = np.uint64(100_000_000)


@njit(**INLINE)
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
    return _eisel_lemire(w, q, negative)


@njit(**INLINE)
def _eisel_lemire(w, q, negative):
    """:func:`decimal_to_double` where Clinger's path does not apply (``w`` > 0, ``q`` within the table)."""
    lz = int(leading_zeros(w))
    w = w << np.uint64(lz)
    index = 2 * (q - _SMALLEST_POWER)
    high, low = multiply(w, _POWER_OF_FIVE[index])
    if (high & _PRECISION_MASK) == _PRECISION_MASK:
        high2, _ = multiply(w, _POWER_OF_FIVE[index + 1])
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


@njit(**INLINE)
def integer_literal(buf, p, end):
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


@njit(**INLINE)
def number(buf, p, end):
    """A JSON number at ``p`` as a float (Python's grammar, ``NaN``/``Infinity``/``-Infinity`` included).

    Returns (end position or -1, value, is_integer_literal); -1 also where the value is left to Python (more than 19
    significant digits, outside the normal double range). Integer fields use :func:`integer_literal`."""
    negative = False
    if p < end and buf[p] == 45:  # -
        negative = True
        p += 1
    if p >= end:
        return -1, 0.0, False
    c = buf[p]
    if c == 73 and is_infinity(buf, p, end):
        return p + 8, (-np.inf if negative else np.inf), False
    if c == 78 and not negative and is_nan(buf, p, end):
        return p + 3, np.nan, False
    w = np.uint64(0)
    digits = 0  # significant digits in w (leading zeros not counted)
    if c == 48:  # 0
        p += 1
    elif 49 <= c <= 57:
        while p < end and 48 <= buf[p] <= 57:
            w = w * _TEN + np.uint64(buf[p] - 48)
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
        while LITTLE_ENDIAN and p + 8 <= end:  # eight digits at a time (the first is significant here)
            chunk = load8(buf, p)
            if not eight_digits(chunk):
                break
            w = w * _TEN8 + parse8(chunk)  # wraps past 19 digits: such numbers are refused below
            digits += 8
            p += 8
        while p < end and 48 <= buf[p] <= 57:
            w = w * _TEN + np.uint64(buf[p] - 48)
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


@njit(**INLINE)
def number_shape_end(buf, p, end):
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
        while LITTLE_ENDIAN and p + 8 <= end and eight_digits(load8(buf, p)):
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
