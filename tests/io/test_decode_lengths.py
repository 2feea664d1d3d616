"""``io.decode._list_lengths``: each row's list length (-1 for a null list) from the offsets where a column has no null
list, by Arrow's compute functions otherwise; the same values and dtype either way, for sliced batches too."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_diag.io.decode import _list_lengths

LIST_TYPES = [pa.list_(pa.float32()), pa.large_list(pa.float32()), pa.list_(pa.int8())]


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(st.one_of(st.none(), st.lists(st.integers(-1, 1), max_size=5)), max_size=12),
    list_type=st.sampled_from(LIST_TYPES),
    start=st.integers(0, 12),
    length=st.integers(0, 12),
)
def test_lengths_match_arrows_own(rows, list_type, start, length):
    array = pa.array(rows, list_type).slice(min(start, len(rows)), length)
    expected = pc.list_value_length(array).fill_null(-1).to_numpy(zero_copy_only=False)
    lengths = _list_lengths(array)
    assert lengths.dtype == expected.dtype
    assert np.array_equal(lengths, expected)


def test_fixed_size_lists_take_arrows_path():
    array = pa.array([[1.0, 2.0], None, [3.0, 4.0]], pa.list_(pa.float32(), 2))
    assert _list_lengths(array).tolist() == [2, -1, 2]
