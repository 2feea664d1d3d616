"""compare-presets drops the presets' per-step states once finalized (``CorrectionAnalysis.settle``, issue 20 item 3:
200 000 steps × 26 accumulators held ~680 MB of state through the analysis's finalize): the same digits after."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers.presets import ALL_PRESETS, _fed, make_chunk, random_steps

from rollout_diag.memory import trim_heap


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("seed", [0, 8])
def test_settled_results_are_the_digits_of_the_states(seed: int) -> None:
    plain, settled = _fed(seed), _fed(seed)
    settled.settle()
    assert all(not accumulator.store.steps.shape[0] for accumulator in settled.accumulators.values())
    runs, settled_runs = plain.finalize_run(), settled.finalize_run()
    assert runs.keys() == settled_runs.keys()
    for name, metrics in runs.items():
        assert list(metrics) == list(settled_runs[name])
        assert all(_same(value, settled_runs[name][key]) for key, value in metrics.items()), name
    for preset in ALL_PRESETS:
        for (steps, groups), (settled_steps, settled_groups) in zip(
            plain.step_columns(preset.name), settled.step_columns(preset.name), strict=True
        ):
            assert np.array_equal(steps, settled_steps)
            for (reports, values), (settled_reports, settled_values) in zip(groups, settled_groups, strict=True):
                assert np.array_equal(reports, settled_reports)
                assert list(values) == list(settled_values)
                for key, column in values.items():
                    assert np.array_equal(column, settled_values[key], equal_nan=True), key


def test_a_settled_analysis_takes_no_more_chunks() -> None:
    settled = _fed(0)
    settled.settle()
    settled.settle()  # a second call changes nothing
    with pytest.raises(RuntimeError):
        settled.update(make_chunk([(0, random_steps(0)[0][0])]))
    with pytest.raises(RuntimeError):
        _fed(0).merge(settled)
    with pytest.raises(RuntimeError):
        settled.finalize()


def test_trim_heap_runs_on_glibc() -> None:
    import platform

    assert trim_heap() is (platform.system() == "Linux" and platform.libc_ver()[0] == "glibc")
