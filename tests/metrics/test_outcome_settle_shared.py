"""``CorrectionAnalysis.settle`` keeps one array for columns equal bit for bit across the presets' accumulators
(issue 20 item 3: on 200 000 one-row steps 194 of 252 columns were copies of another, ~0.35 GB)."""

from __future__ import annotations

import numpy as np
from helpers.presets import ALL_PRESETS, _fed
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_diag.metrics.outcome import _ArrayPool


def _bits(array: np.ndarray) -> bytes:
    return array.dtype.str.encode() + str(array.shape).encode() + array.tobytes()


def test_the_pool_hands_back_only_arrays_equal_bit_for_bit() -> None:
    pool = _ArrayPool()
    base = np.linspace(0.0, 1.0, 1000)
    assert pool.shared(base) is base
    assert pool.shared(base.copy()) is base
    changed = base.copy()
    changed[1] = np.nextafter(changed[1], 2.0)  # not in the fingerprint's sample: found by the full comparison
    assert pool.shared(changed) is changed
    zeros, negative = np.zeros(100), -np.zeros(100)
    assert pool.shared(zeros) is zeros and pool.shared(negative) is negative  # signed zeros told apart
    quiet = np.full(10, np.nan)
    payload = quiet.copy()
    payload.view(np.uint64)[3] |= 1  # another NaN payload
    assert pool.shared(quiet) is quiet and pool.shared(payload) is payload
    assert pool.shared(quiet.copy()) is quiet
    assert pool.shared(np.zeros(100, np.float32)) is not zeros  # dtype
    assert pool.shared(np.zeros((10, 10))) is not zeros  # shape
    flags = np.array([True, False, True])
    assert pool.shared(flags.copy()) is not flags and pool.shared(flags.copy()) is pool.shared(flags.copy())
    strided = base[::2]
    assert pool.shared(strided) is strided  # not contiguous: kept as given
    assert pool.shared(np.zeros(0)).size == 0


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.sampled_from([0.0, -0.0, 1.0, np.nan, np.inf, 2.5]), min_size=0, max_size=70), max_size=12))
def test_every_array_handed_back_equals_the_one_given(columns: list[list[float]]) -> None:
    pool = _ArrayPool()
    given_arrays = [np.array(values, dtype=np.float64) for values in columns]
    handed = [pool.shared(array) for array in given_arrays]
    for array, back in zip(given_arrays, handed, strict=True):
        assert _bits(array) == _bits(back)
    distinct = {_bits(array) for array in given_arrays}
    assert len({id(back) for back in handed}) == len(distinct)


def test_settled_columns_are_shared_and_equal_bit_for_bit_to_the_unsettled() -> None:
    plain, settled = _fed(3), _fed(3)
    settled.settle()
    arrays, ids = 0, set()
    for preset in ALL_PRESETS:
        for (steps, groups), (settled_steps, settled_groups) in zip(
            plain.step_columns(preset.name), settled.step_columns(preset.name), strict=True
        ):
            assert _bits(steps) == _bits(settled_steps)
            for (reports, values), (settled_reports, settled_values) in zip(groups, settled_groups, strict=True):
                assert _bits(reports) == _bits(settled_reports)
                assert list(values) == list(settled_values)
                for key, column in values.items():
                    assert _bits(np.asarray(column)) == _bits(settled_values[key]), key
                    arrays += 1
                    ids.add(id(settled_values[key]))
    assert arrays and ids

    def columns(analysis) -> list[np.ndarray]:
        return [c for _, groups in analysis._finalized.values() for _, values in groups for c in values.values()]

    assert len({id(c) for c in columns(plain)}) == len(columns(plain))  # each accumulator its own columns …
    assert len({id(c) for c in columns(settled)}) < len(columns(settled))  # … settled: equal ones are one array
