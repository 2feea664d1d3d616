"""Lines of a block of bytes: where each ends (:func:`line_ends`) and how many newlines and carriage returns a prefix
holds (:func:`newlines_and_returns`), 32 bytes at a time by word tests (``words.holds``, ``words.equal_bytes``)."""

from __future__ import annotations

import numpy as np
from numba import njit

from rollout_diag.io.jsonl.words import FLAGS, equal_bytes, holds, load8

_ONES = np.uint64(0x0101010101010101)
_HIGH_BITS = np.uint64(0x8080808080808080)
_NEWLINES = np.uint64(0x0A0A0A0A0A0A0A0A)
_RETURNS = np.uint64(0x0D0D0D0D0D0D0D0D)
_S56 = np.uint64(56)


@njit(**FLAGS)
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
            w0, w1, w2, w3 = load8(buf, p), load8(buf, p + 8), load8(buf, p + 16), load8(buf, p + 24)
            high |= (w0 | w1) | (w2 | w3)
            if (holds(w0, _NEWLINES) | holds(w1, _NEWLINES)) | (holds(w2, _NEWLINES) | holds(w3, _NEWLINES)):
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


@njit(**FLAGS)
def newlines_and_returns(buf, upto):
    """(newlines, carriage returns) in ``buf[:upto]``, 32 bytes at a time: each byte's equality as a 0/1 byte of a
    word (exact), added up per byte over four words, then across the bytes by one multiply."""
    newlines, returns = 0, 0
    p = 0
    while p + 32 <= upto:
        lines = np.uint64(0)
        carriage = np.uint64(0)
        for k in range(4):  # each byte of the sums reaches 4 at most
            word = load8(buf, p + 8 * k)
            lines += equal_bytes(word, _NEWLINES)
            carriage += equal_bytes(word, _RETURNS)
        newlines += int((lines * _ONES) >> _S56)  # the sum of the eight bytes (at most 32) in the top byte
        returns += int((carriage * _ONES) >> _S56)
        p += 32
    for i in range(p, upto):
        newlines += buf[i] == 10
        returns += buf[i] == 13
    return newlines, returns
