"""The scanner's line and record state machine: each line one JSON object, its members' keys matched against the
schema's names, the fields of interest read into typed arrays (:func:`scan`), every other value skipped
(``skipping.py``). A line is accepted only where every member reads; what a refused line wrote is dropped.

Speed (docs/benchmarks.md, issue 20 session 4): the per-item work (number, conversion, a skipped scalar) is inlined
into the list loop (a call per item cost about half the scan), and the output buffers are reserved at their bound (one
item per two bytes) instead of counted in a first pass: the pages are taken only as written. A list field is one call
(:func:`_list_field`: a call per list, not per item), which also keeps ``scan``'s own compile small; every array is
passed as an unowned view (``words.unowned``: no reference count per call).

Compile time (issue 20 session 5): numba inlines ``inline="always"`` functions at its own IR level, so each call site
of the item reader is typed and lowered again. Lists and lists of lists therefore share one call site of
:func:`_items`, and integers have their own small reader (``numbers.integer_literal``) rather than the float number
reader with a flag.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rollout_diag.io.jsonl.numbers import integer_literal, number
from rollout_diag.io.jsonl.skipping import MAX_DEPTH, skip_value, string_end
from rollout_diag.io.jsonl.words import FLAGS, INLINE, is_false, is_null, is_true, space, unowned

# value kinds of a field, and element kinds of list fields
INT, STRING, LIST, LIST2 = 0, 1, 2, 3
FLOAT_ELEMENT, INT_ELEMENT, BOOL_ELEMENT = 0, 1, 2
ABSENT, NULL, PRESENT = 0, 1, 2  # per line and field


@njit(**INLINE)
def _element(buf, p, end, element, floats, ints, nulls, n):
    """One list element at ``p`` into slot ``n``: returns the position after it, or -1."""
    if p >= end:
        return -1
    if buf[p] == 110:
        if not is_null(buf, p, end):
            return -1
        nulls[n] = 1
        floats[n] = 0.0
        ints[n] = 0
        return p + 4
    nulls[n] = 0
    if element == BOOL_ELEMENT:
        if buf[p] == 116 and is_true(buf, p, end):
            ints[n] = 1
            return p + 4
        if buf[p] == 102 and is_false(buf, p, end):
            ints[n] = 0
            return p + 5
        return -1
    if element == INT_ELEMENT:
        q, whole = integer_literal(buf, p, end)
        ints[n] = whole
        return q
    q, value, literal_int = number(buf, p, end)
    if literal_int and abs(value) >= 9007199254740992.0:
        return -1  # an integer Python keeps exact: Arrow refuses it as a float beyond 2**53
    floats[n] = value
    return q


@njit(**INLINE)
def _separator(buf, p, end, close):
    """After a list item or object member ending at ``p`` (-1: none): (the next one's position, True) after a comma,
    (the position after the container, False) after ``close`` (``]`` or ``}``), or (-1, False)."""
    if p < 0:
        return -1, False
    p = space(buf, p, end)
    if p < end and buf[p] == 44:  # ,
        p = space(buf, p + 1, end)
        if p >= end:
            return -1, False
        return p, True
    if p < end and buf[p] == close:
        return p + 1, False
    return -1, False


@njit(**INLINE)
def _items(buf, p, end, element, floats, ints, nulls, n):
    """The items of the list whose ``[`` is at ``p`` into the element arrays from index ``n``: (the position after its
    ``]``, the next free index, whether an item was null), or (-1, …) where the list is not one the fast path reads."""
    p = space(buf, p + 1, end)
    null_seen = False
    if p < end and buf[p] == 93:
        return p + 1, n, null_seen
    while p >= 0:  # the separator test is written out here, not _list_next's: inlined, that cost 11 % of the loop
        q = _element(buf, p, end, element, floats, ints, nulls, n)
        if q < 0:
            break
        null_seen |= buf[p] == 110  # the item read was null
        p = q
        n += 1
        p = space(buf, p, end)
        if p < end and buf[p] == 44:
            p = space(buf, p + 1, end)
            if p >= end:
                p = -1
        elif p < end and buf[p] == 93:
            return p + 1, n, null_seen
        else:
            p = -1
    return -1, n, null_seen


@njit(**INLINE)
def _list_field(buf, p, end, line, key, nested, element, out, values, subs, n, m):
    """The list field ``key`` of ``line`` whose ``[`` is at ``p``: a LIST, or (``nested``) a LIST2, a list of lists or
    nulls. Returns (the position after it or -1, the next free element index, the next free sub-list index). Inlined
    into :func:`scan`, where the element arrays are allocated: a call taking them as arguments let LLVM assume they
    may alias the line's bytes, and the item loop ran 35-40 % slower."""
    _, first, count, field_nulls = out
    sub_first, sub_count, sub_null = subs
    first[line, key] = m if nested else n
    more = True
    if nested:
        p = space(buf, p + 1, end)
        if p < end and buf[p] == 93:  # ]: no sub-lists
            p += 1
            more = False
    while more:
        if nested:
            sub_first[m] = n
            sub_null[m] = 0
        if p < end and buf[p] == 91:  # [: the one call site of _items (compile time)
            p, n, null_seen = _items(buf, p, end, element, values[0], values[1], values[2], n)
            field_nulls[key] |= null_seen
        elif nested and p < end and buf[p] == 110:
            p = p + 4 if is_null(buf, p, end) else -1
            sub_null[m] = 1
        else:
            p = -1
        if p < 0 or not nested:
            break
        sub_count[m] = n - sub_first[m]
        m += 1
        p, more = _separator(buf, p, end, 93)
    count[line, key] = (m if nested else n) - first[line, key]
    return p, n, m


@njit(**FLAGS)
def _integer(buf, p, end):
    """An integer field's value (a call per line)."""
    return integer_literal(buf, p, end)


@njit(**INLINE)
def _key_index(buf, p, key_end, key_bytes, key_starts):
    """The schema's index of the key string ``buf[p:key_end]`` (quotes included), or -1."""
    length = key_end - p - 2
    for k in range(key_starts.shape[0] - 1):
        a, b = key_starts[k], key_starts[k + 1]
        if b - a == length:
            same = True
            for i in range(length):
                if buf[p + 1 + i] != key_bytes[a + i]:
                    same = False
                    break
            if same:
                return k
    return -1


@njit(**INLINE)
def _object_open(buf, p, end):
    """The line from ``p`` opens an object: (its first member's position, True), (the position after an empty
    object's ``}``, False), or (-1, False)."""
    p = space(buf, p, end)
    if p >= end or buf[p] != 123:  # {
        return -1, False
    p = space(buf, p + 1, end)
    if p >= end:
        return -1, False
    if buf[p] == 125:  # }: empty
        return p + 1, False
    return p, True


@njit(**INLINE)
def _member_key(buf, p, end, key_bytes, key_starts):
    """The object member at ``p``: (its value's position, past the ``:``, or -1; the schema's index of its key, or
    -1 for a key no field has)."""
    key_end = string_end(buf, p, end, True) if p < end and buf[p] == 34 else -1
    if key_end < 0:
        return -1, -1
    key = _key_index(buf, p, key_end, key_bytes, key_starts)
    p = space(buf, key_end, end)
    if p >= end or buf[p] != 58:  # :
        return -1, key
    p = space(buf, p + 1, end)
    return (p if p < end else -1), key


@njit(**INLINE)
def _opens_list(buf, p, line, key, status, kinds):
    """Whether the value at ``p`` is a list field's list, read here for the first time on ``line``."""
    return key >= 0 and status[line, key] == ABSENT and kinds[key] >= LIST and buf[p] == 91


@njit(**INLINE)
def _other_value(buf, p, end, line, key, kinds, out, stack):
    """Any member value at ``p`` but a list field's list: skipped (``key`` -1), a field's ``null``, integer or string
    read. Returns the position after it, or -1 (a grammar error, a field given twice, a value of another type)."""
    status, first, count, _ = out
    if key < 0:
        return skip_value(buf, p, end, stack)
    if status[line, key] != ABSENT:
        return -1  # given twice: Python keeps the last; left to it
    if buf[p] == 110:
        status[line, key] = NULL
        return p + 4 if is_null(buf, p, end) else -1
    status[line, key] = PRESENT
    kind = kinds[key]
    if kind == INT:
        p, whole = _integer(buf, p, end)
        first[line, key] = whole
        return p
    if kind != STRING or buf[p] != 34:
        return -1
    first[line, key] = p + 1
    p = string_end(buf, p, end, True)
    count[line, key] = p - 1
    return p


@njit(**FLAGS)
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
    owned_out = (
        np.zeros((lines, keys), np.int8),  # status
        np.zeros((lines, keys), np.int64),  # first
        np.zeros((lines, keys), np.int64),  # count
        np.zeros(keys, np.bool_),  # per field: a null item may have been written (so its flags are gathered)
    )
    # every list item takes a byte and is followed by , or ]; every sub-list opens with [ and is followed by , or ]:
    # at most one per two bytes. The memory is only reserved: a page is taken when the scan first writes to it.
    items = (starts[lines] - starts[0]) // 2 + 1
    owned = (np.empty(items, np.float64), np.empty(items, np.int64), np.empty(items, np.uint8))
    owned_subs = (np.empty(items, np.int64), np.empty(items, np.int64), np.empty(items, np.uint8))
    owned_stack = np.empty(MAX_DEPTH, np.uint8)
    buf = unowned(raw)
    out = (unowned(owned_out[0]), unowned(owned_out[1]), unowned(owned_out[2]), unowned(owned_out[3]))
    values = (unowned(owned[0]), unowned(owned[1]), unowned(owned[2]))
    subs = (unowned(owned_subs[0]), unowned(owned_subs[1]), unowned(owned_subs[2]))
    stack = unowned(owned_stack)
    n = np.int64(0)  # elements used (typed int64 from the start: a literal 0 would compile _list_field twice)
    m = np.int64(0)  # sub-lists used
    for line in range(lines):
        p, end = starts[line], starts[line + 1]
        line_n, line_m = n, m
        p, more = _object_open(buf, p, end)
        while more:
            p, key = _member_key(buf, p, end, key_bytes, key_starts)
            if p >= 0 and _opens_list(buf, p, line, key, out[0], kinds):
                out[0][line, key] = PRESENT
                p, n, m = _list_field(
                    buf, p, end, line, key, kinds[key] == LIST2, elements[key], out, values, subs, n, m
                )
            elif p >= 0:
                p = _other_value(buf, p, end, line, key, kinds, out, stack)
            p, more = _separator(buf, p, end, 125)
        if p >= 0 and space(buf, p, end) == end:
            accepted[line] = True
        else:  # what the line wrote is dropped
            n, m = line_n, line_m
            for k in range(keys):
                out[0][line, k] = ABSENT
    owned_stack[0] = 0  # a use after the loop: numba frees an array after its last use, and the views are of them
    return (
        accepted,
        owned_out[3],
        owned_out[0],
        owned_out[1],
        owned_out[2],
        owned_subs[0][:m],
        owned_subs[1][:m],
        owned_subs[2][:m],
        owned[0][:n],
        owned[1][:n],
        owned[2][:n],
    )
