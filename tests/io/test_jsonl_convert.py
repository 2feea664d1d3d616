"""The JSON-lines importers' vectorised conversions (``FastLines.convert``) against their per-row definitions."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_diag.io.formats import base, prime_rl

_VALUES = st.one_of(
    st.sampled_from([0.0, -0.0, 1.5, -0.5, 2.0, -3.0, math.nan, None]), st.floats(-4, 4, allow_nan=False)
)


@st.composite
def _rows(draw):
    rows = []
    for _ in range(draw(st.integers(0, 12))):
        length = draw(st.integers(0, 7))
        mask = draw(st.lists(st.booleans(), min_size=length, max_size=length))
        kind = draw(st.integers(0, 5))
        if kind == 0:
            values = None  # absent
        elif kind == 1:
            values = draw(st.lists(_VALUES, max_size=length + 1))  # maybe ragged
        elif kind == 2:  # one value over the row (GRPO)
            values = [draw(_VALUES)] * length
        else:
            values = draw(st.lists(_VALUES, min_size=length, max_size=length))
        rows.append((mask, values))
    return rows


@settings(max_examples=300, deadline=None)
@given(rows=_rows())
def test_prime_rl_advantages_equal_the_per_row_rule(rows):
    """_advantages (trained tokens' runs, sign changes found by search) gives _advantage's value for every row: the
    first trained token's value where the signs agree (NaN and -0.0 count as 0), 0.0 without trained tokens, null
    for mixed signs or a list that is not whole numbers of the row's length."""
    lengths = np.array([len(mask) for mask, _ in rows], dtype=np.int64)
    trained = np.array([t for mask, _ in rows for t in mask], dtype=bool)
    values = pa.array([values for _, values in rows], pa.list_(pa.float64()))
    got = prime_rl._advantages(values, lengths, trained).to_pylist()
    want = [prime_rl._advantage(values, np.array(mask, dtype=np.int8)) for mask, values in rows]
    assert [repr(v) for v in got] == [repr(v) for v in want]


@settings(max_examples=200, deadline=None)
@given(
    lists=st.lists(st.one_of(st.none(), st.lists(st.one_of(st.none(), st.just(1.0)), max_size=5)), max_size=10),
    start=st.integers(0, 3),
)
def test_row_count_of_flagged_items(lists, start):
    """row_count (no flag, every item flagged, some) on a list array, sliced too."""
    array = pa.array(lists, pa.list_(pa.float64())).slice(min(start, len(lists)))
    flags = base.null_flags(array.values)
    counts = base.row_count(array, flags).tolist()
    assert counts == [0 if row is None else sum(item is None for item in row) for row in array.to_pylist()]


@settings(max_examples=300, deadline=None)
@given(
    lists=st.lists(
        st.one_of(st.none(), st.lists(st.one_of(st.floats(allow_nan=True), st.none()), max_size=200)), max_size=8
    ),
    keep=st.lists(st.integers(0, 220), min_size=8, max_size=8),
    start=st.integers(0, 2),
    null_rows=st.booleans(),
    dense=st.booleans(),
)
def test_prefixes_keep_each_rows_first_items(lists, keep, start, null_rows, dense):
    """prefixes (nothing cut: a slice; long rows: a copy per row; else a take) equals cutting each row in Python."""
    if dense:  # no null item: the row-by-row copy applies where rows are long
        lists = [None if row is None else [0.5 if v is None else v for v in row] for row in lists]
    array = pa.array(lists, pa.list_(pa.float64())).slice(min(start, len(lists)))
    rows = array.to_pylist()
    keep = np.array(keep[: len(rows)], dtype=np.int64)
    nulls = np.array([row is None for row in rows]) if null_rows else None
    got = base.prefixes(array, keep, nulls).to_pylist()
    want = [None if null_rows and row is None else (row or [])[: int(k)] for row, k in zip(rows, keep, strict=True)]
    assert [repr(row) for row in got] == [repr(row) for row in want]
