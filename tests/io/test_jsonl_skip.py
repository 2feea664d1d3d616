"""Skipping the values a trainer format does not read (io/jsonl/skipping.py) against Python's json, the reference.

The scanner skips an unused list of numbers and nulls by one tight loop (``flat_list_end``) and leaves anything else
to its general loop (``skip_value``). Either way a skipped value must end where Python's json ends it, and a value
Python refuses must be refused (so the line goes to the format's own parser and its message): the skip checks the
grammar as reading does. Lists are drawn in the shapes the trainers write (no whitespace, or ``", "``) and broken at
random.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from numba import njit

from rollout_diag.io.jsonl import Scanner, skipping


@njit(cache=False)
def _ends(buf):
    """(the tight loop's end, -1 where the value is no list (it is called at a [ only); the general skip's end)."""
    stack = np.empty(skipping.MAX_DEPTH, np.uint8)
    flat = skipping.flat_list_end(buf, 0, buf.shape[0]) if buf.shape[0] and buf[0] == 91 else -1
    return flat, skipping.skip_value(buf, 0, buf.shape[0], stack)


def _python_end(text: str) -> int:
    """Where Python's json ends the value at the start of ``text`` (after whitespace, as in a line), or -1 where it
    refuses it."""
    try:
        return json.JSONDecoder().raw_decode(text, len(text) - len(text.lstrip(" \t\n\r")))[1]
    except ValueError:
        return -1


_SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(width=32, allow_nan=False, allow_infinity=False),
    st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=4),
)


@st.composite
def _list_text(draw) -> str:
    items = draw(st.lists(_SCALAR, max_size=8))
    separator = draw(st.sampled_from([",", ", ", ",  ", " , ", ",\t"]))
    text = "[" + separator.join(json.dumps(item) for item in items) + "]"
    if draw(st.integers(0, 1)) == 0:  # break it: drop, double or insert a character
        at = draw(st.integers(0, len(text) - 1))
        how = draw(st.integers(0, 2))
        extra = draw(st.sampled_from(list('[]{},:" 0123-+.eEnultrfasNI\\')))
        text = text[:at] + (text[at + 1 :] if how == 0 else text[at] + text[at:] if how == 1 else extra + text[at:])
    return text + draw(st.sampled_from(["", " ", ",", "}", "]", "x"]))  # what follows the value in a line


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_list_text())
@example("[0.5,0.5,0.5]}")
@example("[1,2,]")
@example("[01]")
@example("[-]")
@example("[1.]")
@example("[1e]")
@example("[1e+]")
@example("[nul]")
@example("[null,nulll]")
@example("[tru]")
@example("[true,fals]")
@example('["a\\qb"]')
@example('["\x01"]')
@example("[-Infinity, NaN]")
@example("[1,,2]")
@example("[1 2]")
@example("[[1], 2]")
@example("[")
@example("[1")
@example("[1,")
def test_a_skipped_list_ends_where_python_ends_it(text):
    flat, general = _ends(np.frombuffer(text.encode(), np.uint8))
    python = _python_end(text)
    assert general == python, text
    assert flat in (-1, python), text  # the tight loop decides only what it reads in full


@pytest.mark.parametrize(
    "text",
    ["[0.5,0.5,0.5]", "[0, 1, 2, 30]", "[null,null]", "[null, -1.5e-3, 1E+2, 0.25]", "[]", "[-0]"],
)
def test_lists_the_trainers_write_take_the_tight_loop(text):
    flat, general = _ends(np.frombuffer(text.encode(), np.uint8))
    assert flat == general == len(text)


_SCHEMA = pa.schema([("i", pa.int64()), ("f", pa.list_(pa.float64())), ("b", pa.list_(pa.bool_()))])


def _scan(lines: list[str]):
    data = "".join(line + "\n" for line in lines).encode()
    starts = np.cumsum([0, *(len(line.encode()) + 1 for line in lines)]).astype(np.int64)
    return Scanner(_SCHEMA).scan(data, starts)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_list_text(), min_size=1, max_size=4), st.booleans())
def test_a_line_with_a_skipped_list_is_read_exactly_where_python_reads_it(values, compact):
    separator = "," if compact else ", "
    lines = [
        separator.join([f'{{"i":{index}', f'"x":{value}', '"f":[1.5,null]', '"b":[true]}'])
        for index, value in enumerate(values)
    ]
    scanned = _scan(lines)
    readable = []
    for line in lines:
        try:
            readable.append(isinstance(json.loads(line), dict))
        except ValueError:
            readable.append(False)
    assert scanned.rows.tolist() == [index for index, ok in enumerate(readable) if ok]
    for row, index in zip(scanned.table.to_pylist(), scanned.rows.tolist(), strict=True):
        assert row == {"i": index, "f": [1.5, None], "b": [True]}


def test_null_items_of_a_refused_line_leave_no_null_in_the_fields_read():
    lines = ['{"f": [null, 1.0], "b": [null], "i": "not an integer"}', '{"f": [2.0], "b": [false], "i": 3}']
    scanned = _scan(lines)
    assert scanned.rows.tolist() == [1]
    assert scanned.table.to_pylist() == [{"i": 3, "f": [2.0], "b": [False]}]
    assert scanned.table.column("f").chunk(0).values.null_count == 0
    assert scanned.table.column("b").chunk(0).values.null_count == 0


def test_null_items_are_read_in_the_field_that_holds_them_only():
    scanned = _scan(['{"f": [null, 1.0, null], "b": [true, false], "i": 1}', '{"f": [2.0], "b": [true], "i": 2}'])
    assert scanned.table.to_pylist() == [
        {"i": 1, "f": [None, 1.0, None], "b": [True, False]},
        {"i": 2, "f": [2.0], "b": [True]},
    ]
    assert scanned.table.column("b").chunk(0).values.null_count == 0
