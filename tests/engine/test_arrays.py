"""rollout_diag.engine.arrays: the numpy operations give the bits of the obvious loop (and of torch's CPU kernels)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_diag.engine import arrays

values = st.floats(allow_nan=True, allow_infinity=True, width=64) | st.sampled_from([0.0, -0.0, 1e-310, -1e308])


def loop_index_add(out: list[float], index: list[int], added: list[float]) -> list[float]:
    """out[index[k]] += added[k], k in order: the definition."""
    out = list(out)
    for bucket, value in zip(index, added, strict=True):
        out[bucket] += value
    return out


def same_bits(first: np.ndarray, second: np.ndarray) -> bool:
    """Equal bit for bit, NaN where NaN (its payload aside)."""
    nan = np.isnan(first)
    return np.array_equal(nan, np.isnan(second)) and first[~nan].tobytes() == second[~nan].tobytes()


@settings(max_examples=300, deadline=None)
@given(
    buckets=st.integers(1, 6),
    data=st.data(),
    start=st.sampled_from(["zeros", "negative zeros", "values"]),
)
def test_index_add_adds_in_order_as_the_loop_and_torch_do(buckets, data, start):
    n = data.draw(st.integers(0, 40))
    index = np.array(data.draw(st.lists(st.integers(0, buckets - 1), min_size=n, max_size=n)), dtype=np.int64)
    added = np.array(data.draw(st.lists(values, min_size=n, max_size=n)), dtype=np.float64)
    if start == "zeros":
        out = np.zeros(buckets)
    elif start == "negative zeros":
        out = np.full(buckets, -0.0)
    else:
        out = np.array(data.draw(st.lists(values, min_size=buckets, max_size=buckets)), dtype=np.float64)
    expected = np.array(loop_index_add(out.tolist(), index.tolist(), added.tolist()), dtype=np.float64)
    through_torch = torch.from_numpy(out.copy()).index_add_(0, torch.from_numpy(index), torch.from_numpy(added))
    result = arrays.index_add(out.copy(), index, added)
    assert same_bits(result, expected)
    assert same_bits(result, through_torch.numpy())


def test_index_add_returns_the_array_it_filled():
    out = np.zeros(3)
    assert arrays.index_add(out, np.array([2, 0, 2]), np.array([1.0, 2.0, 3.0])) is out
    assert out.tolist() == [2.0, 0.0, 4.0]


def test_index_add_refuses_an_index_past_the_buckets():
    with pytest.raises(IndexError):
        arrays.index_add(np.zeros(2), np.array([0, 2]), np.array([1.0, 1.0]))
    with pytest.raises(IndexError):
        arrays.index_add(np.array([1.0, 0.0]), np.array([0, 2]), np.array([1.0, 1.0]))


def test_index_add_of_rows_of_values():
    """[R, K] values into [G, K] buckets (the per-row buckets of the hints): each column as the loop adds it."""
    index = np.array([1, 0, 1, 1])
    added = np.array([[1.0, math.inf], [2.0, -0.0], [1e16, 1.0], [-1e16, 2.0]])
    out = arrays.index_add(np.zeros((2, 2)), index, added)
    assert out.tolist() == [[2.0, 0.0], [1.0 + 1e16 - 1e16, math.inf]]


@settings(max_examples=300, deadline=None)
@given(buckets=st.integers(1, 6), data=st.data(), ordered=st.booleans(), start=st.sampled_from(["identity", "values"]))
def test_scatter_extremes_take_what_ufunc_at_takes(buckets, data, ordered, start):
    """scatter_max / scatter_min against numpy's ufunc.at (the definition, one value at a time) and torch's
    scatter_reduce: NaN wins, infinities and empty buckets as they are. An index that never goes down takes the
    reduceat path, any other ufunc.at; equal as numbers (+0.0 and -0.0 tie: neither keeps a promised one)."""
    n = data.draw(st.integers(0, 40))
    index = np.array(data.draw(st.lists(st.integers(0, buckets - 1), min_size=n, max_size=n)), dtype=np.int64)
    if ordered:
        index.sort()
    given_values = np.array(data.draw(st.lists(values, min_size=n, max_size=n)), dtype=np.float64)
    for ours, ufunc, identity, reduce in (
        (arrays.scatter_max, np.maximum, -math.inf, "amax"),
        (arrays.scatter_min, np.minimum, math.inf, "amin"),
    ):
        if start == "identity":
            out = np.full(buckets, identity)
        else:
            out = np.array(data.draw(st.lists(values, min_size=buckets, max_size=buckets)), dtype=np.float64)
        expected = out.copy()
        with np.errstate(invalid="ignore"):
            ufunc.at(expected, index, given_values)
        through_torch = torch.from_numpy(out.copy()).scatter_reduce_(
            0, torch.from_numpy(index), torch.from_numpy(given_values), reduce=reduce
        )
        result = ours(out.copy(), index, given_values)
        assert np.array_equal(result, expected, equal_nan=True), (ufunc.__name__, index, given_values, out)
        assert np.array_equal(result, through_torch.numpy(), equal_nan=True)
