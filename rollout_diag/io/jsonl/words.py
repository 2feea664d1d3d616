"""The scanner's byte-level pieces: unaligned eight-byte loads, word tests (fast_float's digit test, SWAR byte
matches), JSON's literals and whitespace. Each is ``inline="always"`` where the scanner calls it per item."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic
from numba.np.arrayobj import populate_array

FLAGS: dict[str, Any] = {"cache": True, "nogil": True}
# per list item: no call (measured 2-3x faster on null/bool/int items)
INLINE: dict[str, Any] = {**FLAGS, "inline": "always"}

LITTLE_ENDIAN = sys.byteorder == "little"  # eight digits are read as one little-endian word
_HIGH_NIBBLES = np.uint64(0xF0F0F0F0F0F0F0F0)
_SIXES = np.uint64(0x0606060606060606)
_THREES = np.uint64(0x3333333333333333)
_ZEROS = np.uint64(0x3030303030303030)
_BYTES_0_4 = np.uint64(0x000000FF000000FF)
_MUL_100_1000000 = np.uint64(100 + (1_000_000 << 32))
_MUL_1_10000 = np.uint64(1 + (10_000 << 32))
_S4, _S7, _S8, _S16, _S32 = np.uint64(4), np.uint64(7), np.uint64(8), np.uint64(16), np.uint64(32)
_ONES = np.uint64(0x0101010101010101)
_HIGH_BITS = np.uint64(0x8080808080808080)
_LOW_BITS = np.uint64(0x7F7F7F7F7F7F7F7F)
_NULL_WORD = np.uint64(int.from_bytes(b"null", "little"))
_LOW_FOUR = np.uint64(0xFFFFFFFF)


@intrinsic
def multiply(typingctx, a, b):
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


@intrinsic
def load8(typingctx, array, index):
    """The eight bytes ``array[index:index + 8]`` as one (unaligned) uint64 word; the caller checks the bounds."""
    signature = types.uint64(array, index)

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        address = builder.gep(data, [args[1]])
        return builder.load(builder.bitcast(address, ir.IntType(64).as_pointer()), align=1)

    return signature, codegen


@intrinsic
def unowned(typingctx, array):
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


@njit(**INLINE)
def eight_digits(chunk):
    """Whether all eight bytes of a little-endian word are ASCII digits (fast_float's test)."""
    return ((chunk & _HIGH_NIBBLES) | (((chunk + _SIXES) & _HIGH_NIBBLES) >> _S4)) == _THREES


@njit(**INLINE)
def parse8(chunk):
    """The value of eight ASCII digits in a little-endian word, the first byte the most significant digit."""
    chunk = chunk - _ZEROS
    chunk = chunk * np.uint64(10) + (chunk >> _S8)
    low = (chunk & _BYTES_0_4) * _MUL_100_1000000
    high = ((chunk >> _S16) & _BYTES_0_4) * _MUL_1_10000
    return (low + high) >> _S32


@njit(**INLINE)
def holds(word, pattern):
    """Non-zero where some byte of ``word`` equals the byte repeated in ``pattern`` (exact as a yes/no)."""
    x = word ^ pattern
    return (x - _ONES) & ~x & _HIGH_BITS


@njit(**INLINE)
def equal_bytes(word, pattern):
    """1 in each byte of ``word`` that equals the byte repeated in ``pattern``, else 0 (exact per byte: no carry
    crosses bytes, unlike :func:`holds`)."""
    x = word ^ pattern
    return (~(((x & _LOW_BITS) + _LOW_BITS) | x | _LOW_BITS)) >> _S7


@njit(**INLINE)
def space(buf, p, end):
    """The first position from ``p`` that is not JSON whitespace (``end`` at most)."""
    while p < end:
        c = buf[p]
        if c != 32 and c != 10 and c != 9 and c != 13:
            return p
        p += 1
    return p


@njit(**INLINE)
def is_null(buf, p, end):
    if LITTLE_ENDIAN and p + 8 <= end:  # one compare of the word's first four bytes
        return (load8(buf, p) & _LOW_FOUR) == _NULL_WORD
    return p + 4 <= end and buf[p] == 110 and buf[p + 1] == 117 and buf[p + 2] == 108 and buf[p + 3] == 108


@njit(**INLINE)
def is_true(buf, p, end):
    return p + 4 <= end and buf[p] == 116 and buf[p + 1] == 114 and buf[p + 2] == 117 and buf[p + 3] == 101


@njit(**INLINE)
def is_false(buf, p, end):
    return (
        p + 5 <= end
        and buf[p] == 102
        and buf[p + 1] == 97
        and buf[p + 2] == 108
        and buf[p + 3] == 115
        and buf[p + 4] == 101
    )


@njit(**FLAGS)
def is_nan(buf, p, end):
    return p + 3 <= end and buf[p] == 78 and buf[p + 1] == 97 and buf[p + 2] == 78


@njit(**FLAGS)
def is_infinity(buf, p, end):
    if p + 8 > end:
        return False
    for i in range(8):  # noqa: SIM110 - a generator in all() does not compile in numba
        if buf[p + i] != b"Infinity"[i]:
            return False
    return True
