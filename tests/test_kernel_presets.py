"""The compiled pass of the presets' derived token quantities (rollout_diag/kernels/presets.py) against the torch
engine on the CPU: 1e-12 relative, counts exact, also where weights land on truncation, IcePop, mask and veto bounds
(the IS weight is torch's exp on both engines, so a token on a bound falls on the side torch puts it)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_correction import ALL_PRESETS, assert_metrics_close, make_chunk
from test_kernel import assert_same_document

import rollout_diag as rd
from rollout_diag.kernels import compiled_presets, use_engine
from rollout_diag.metrics.correction import DERIVED
from rollout_diag.metrics.outcome import CorrectionAnalysis
from rollout_diag.metrics.segments import ChunkStats, KernelStats

RTOL = 1e-12
# every ratio bound of the built-in and test presets, and their log (where δ sits for w = exp(c) to land on them)
BOUNDS = (2.0, 0.5, 5.0, 1.001, 0.999, 1e-4, 20.0, 1.5, 3.0, 0.2, 0.7, 1.3, 0.8, 1.25, 1.05, 0.3, 1000.0, 0.001)


@pytest.mark.parametrize("size", [1, 2, 7, 8, 9, 127, 128, 129, 130, 255, 256, 1000, 1031, 4096, 5000])
def test_pairwise_sum_is_numpys_reduceat_bit_for_bit(size):
    values = np.random.default_rng(size).normal(0, 1, size) * np.exp2(np.random.default_rng(1).integers(-30, 30, size))
    kernels = compiled_presets()
    rest = kernels._pairwise(values, 1, size - 1) if size > 1 else -0.0
    assert values[0] + rest == np.add.reduceat(values, [0])[0]


def bound_rows(seed: int, rows: int) -> list:
    """Rows whose δ sits on the log of a bound, a few ulps either side, or far from every bound."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(rows):
        length = int(rng.integers(0, 40))
        bound = np.log(rng.choice(BOUNDS, length))
        delta = bound + rng.integers(-3, 4, length) * np.spacing(np.abs(bound) + 1e-300)
        far = rng.random(length) < 0.3
        delta[far] = rng.normal(0, 0.5, int(far.sum()))
        rollout = -rng.exponential(1.0, length) - 10.0
        trainer = rollout + delta
        mask = (rng.random(length) > 0.15).astype(np.float64)
        out.append((trainer, rollout, mask))
    return out


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), steps=st.integers(1, 4))
def test_presets_on_the_bounds_equal_the_torch_engine(seed, steps):
    records = [(step, row) for step in range(steps) for row in bound_rows(seed + step, 6)]
    results = []
    for engine in (KernelStats, ChunkStats):
        chunk = make_chunk(records)
        chunk.cache["stats"] = engine(chunk)
        analysis = CorrectionAnalysis(ALL_PRESETS)
        analysis.update(chunk)
        results.append(analysis.finalize())
    numba, torch_engine = results
    for name, (steps_torch, run_torch) in torch_engine.items():
        steps_numba, run_numba = numba[name]
        assert_metrics_close(run_numba, run_torch, f"{name} run", RTOL)
        assert set(steps_numba) == set(steps_torch)
        for step, metrics in steps_torch.items():
            assert_metrics_close(steps_numba[step], metrics, f"{name} step {step}", RTOL)
            counted = [key for key in metrics if "fraction" in key or "rejected" in key or "kept" in key]
            assert all(steps_numba[step][key] == metrics[key] for key in counted), name


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_every_derived_quantity_reduces_as_the_torch_engine(seed):
    """Per segment: sums bit for bit (numpy reduceat's order, the same per-token values), maxima, minima, and counts."""
    records = [(step, row) for step in range(2) for row in bound_rows(seed + 7 * step, 5)]
    kernel_chunk, torch_chunk = make_chunk(records), make_chunk(records)
    kernel_chunk.cache["stats"] = kernel = KernelStats(kernel_chunk)
    torch_chunk.cache["stats"] = reference = ChunkStats(torch_chunk)
    analysis = CorrectionAnalysis(ALL_PRESETS)
    analysis.update(kernel_chunk)
    assert len(DERIVED) > 10
    for name in DERIVED:
        if name not in kernel._sums:
            continue
        assert torch.equal(kernel._sums[name], reference.segment_sum(name)), name
        assert torch.equal(kernel.segment_max(name), reference.segment_max(name)), name
        assert torch.equal(kernel.segment_min(name), reference.segment_min(name)), name


def test_compare_presets_on_bounds_equals_the_torch_engine(tmp_path):
    from test_correction import write_dump

    steps = {step: bound_rows(100 + step, 9) for step in (0, 2, 3)}
    rounded = {
        step: [(np.float32(a).astype(np.float64), np.float32(r).astype(np.float64), m) for a, r, m in rows]
        for step, rows in steps.items()
    }
    path = tmp_path / "bounds.parquet"
    write_dump(path, rounded)
    with use_engine("numba"):
        numba_result = rd.compare_presets(path, ALL_PRESETS, device="cpu", chunk_tokens=61)
    with use_engine("torch"):
        torch_result = rd.compare_presets(path, ALL_PRESETS, device="cpu", chunk_tokens=61)
    assert_same_document(numba_result.to_json(), torch_result.to_json())
    assert math.isfinite(numba_result.presets[0].run.metrics["rollout_corr/rollout_is_mean"])
