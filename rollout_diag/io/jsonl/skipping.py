"""Skipping the values a trainer format does not read: each checked against JSON's grammar as Python's ``json`` reads
it (``NaN``/``Infinity``/``-Infinity`` included) and passed over, without converting a number or keeping a string.
An unused list of numbers and nulls (prime-rl's ``position_ids``, ``entropy``, …; NeMo-RL's ``advantages``) is skipped
by one tight loop (:func:`flat_list_end`), checked as strictly (issue 20 session 7: a line with every field skipped
about 1.95 -> 1.55 ns per byte); anything else by the general loop (:func:`skip_value`), nesting at most
:data:`MAX_DEPTH` deep."""

from __future__ import annotations

from numba import njit

from rollout_diag.io.jsonl.numbers import number_shape_end
from rollout_diag.io.jsonl.words import FLAGS, INLINE, is_false, is_infinity, is_nan, is_null, is_true, space

MAX_DEPTH = 64


@njit(**FLAGS)
def string_end(buf, p, end, plain):
    """Position after the JSON string starting at ``p`` (a quote), or -1; ``plain``: refuse escapes."""
    p += 1
    while p < end:
        c = buf[p]
        if c == 34:
            return p + 1
        if c < 32:
            return -1
        if c == 92:
            p = -1 if plain else _escape_end(buf, p, end)
            if p < 0:
                return -1
            continue
        p += 1
    return -1


@njit(**INLINE)
def _escape_end(buf, p, end):
    """Position after the escape whose backslash is at ``p``, or -1."""
    if p + 1 >= end:
        return -1
    e = buf[p + 1]
    if e == 117:  # u: four hex digits
        if p + 6 > end:
            return -1
        for i in range(p + 2, p + 6):
            h = buf[i]
            if not (48 <= h <= 57 or 65 <= h <= 70 or 97 <= h <= 102):
                return -1
        return p + 6
    if not (e == 34 or e == 92 or e == 47 or e == 98 or e == 102 or e == 110 or e == 114 or e == 116):
        return -1
    return p + 2


@njit(**INLINE)
def _scalar_end(buf, p, end):
    """Position after a JSON value that is not a container (string, number, literal), or -1 (grammar only:
    a skipped number is not converted)."""
    c = buf[p]
    if c == 34:
        return string_end(buf, p, end, False)
    if c == 110:
        return p + 4 if is_null(buf, p, end) else -1
    if c == 116:
        return p + 4 if is_true(buf, p, end) else -1
    if c == 102:
        return p + 5 if is_false(buf, p, end) else -1
    if c == 78:
        return p + 3 if is_nan(buf, p, end) else -1
    if c == 73:
        return p + 8 if is_infinity(buf, p, end) else -1
    if c == 45 and p + 1 < end and buf[p + 1] == 73:
        return p + 9 if is_infinity(buf, p + 1, end) else -1
    return number_shape_end(buf, p, end)


@njit(**FLAGS)
def _member_value(buf, p, end):
    """After an object member's key string at ``p``: the position of its value (past ``:``), or -1."""
    p = string_end(buf, p, end, False) if p < end and buf[p] == 34 else -1
    if p < 0:
        return -1
    p = space(buf, p, end)
    if p >= end or buf[p] != 58:
        return -1
    return space(buf, p + 1, end)


@njit(**FLAGS)
def flat_list_end(buf, p, end):
    """Position after the list whose ``[`` is at ``p`` when it is a list of numbers and ``null`` written without
    whitespace or with one space after each comma (checked as :func:`skip_value` checks them), else -1: anything
    else (other whitespace, a container, a string, ``true``, ``NaN``, a grammar error) is left to the caller's general
    loop. The large lists the trainer formats' readers skip are such lists: one tight loop per item, no stack (and
    no more: each kind of item is code to compile)."""
    p += 1
    if p < end and buf[p] == 93:  # ]
        return p + 1
    while p < end:
        c = buf[p]
        if 48 <= c <= 57 or c == 45:  # a digit or -
            p = number_shape_end(buf, p, end)
        elif c == 110:
            p = p + 4 if is_null(buf, p, end) else -1
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


@njit(**FLAGS)
def skip_value(buf, p, end, stack):
    """Position after the JSON value at ``p`` (any value, checked), or -1; ``stack`` holds :data:`MAX_DEPTH` bytes."""
    depth = 0
    while True:
        p = space(buf, p, end)
        if p >= end:
            return -1
        c = buf[p]
        flat = flat_list_end(buf, p, end) if c == 91 else -1
        if flat >= 0:
            p = flat
        elif c == 123 or c == 91:  # { [
            p, depth, opened = _open(buf, p, end, c, stack, depth)
            if p < 0:
                return -1
            if opened:
                continue
        else:
            p = _scalar_end(buf, p, end)
            if p < 0:
                return -1
        p, depth = _close(buf, p, end, stack, depth)
        if p < 0 or depth == 0:
            return p


@njit(**INLINE)
def _open(buf, p, end, c, stack, depth):
    """The container ``c`` (``{`` or ``[``) at ``p``: (the position after it where it is empty, else of its first
    value; the depth; whether it was opened), or (-1, …)."""
    q = space(buf, p + 1, end)
    if q < end and buf[q] == c + 2:  # } ]: empty
        return q + 1, depth, False
    if depth >= MAX_DEPTH:
        return -1, depth, False
    stack[depth] = c
    p = _member_value(buf, q, end) if c == 123 else q
    return p, depth + 1, True


@njit(**INLINE)
def _close(buf, p, end, stack, depth):
    """After a value ending at ``p`` inside ``depth`` open containers: close those it ends. Returns (the position of
    the next value, or after the outermost container where ``depth`` is 0, or -1; the depth)."""
    while depth > 0:
        p = space(buf, p, end)
        if p >= end:
            return -1, depth
        c = buf[p]
        if c == 44:  # ,
            p = space(buf, p + 1, end)
            if stack[depth - 1] == 123:
                p = _member_value(buf, p, end)
            return p, depth
        if c != stack[depth - 1] + 2:
            return -1, depth
        p += 1
        depth -= 1
    return p, depth
