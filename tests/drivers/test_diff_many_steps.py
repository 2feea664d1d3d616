"""``diff`` on many steps: the bootstrap's draws made a run of equal-sized steps at a time give the same replicates as
one draw per step (the former code, kept here as the reference).

The draws are the code's own and are compared exactly where they are exposed (the random stream); each replicate is
then a ratio of BLAS products, whose summation order is the BLAS kernel's (Intel or AMD, AVX2 or AVX-512 differ by
an ulp), so replicates are compared to ``DRAW_RTOL``: a wrong draw moves a replicate by O(1) of itself."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
from helpers.dumps import random_rows as dump_rows
from helpers.dumps import write_sequence_dump
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_diag.decisions import diff as diff_module
from rollout_diag.decisions.diff import WEIGHT_CELLS, DiffSide, _replicates, bootstrap_differences
from rollout_diag.decisions.rowmetrics import KEY_METRICS
from rollout_diag.drivers.diff import diff_runs
from rollout_diag.metrics.rowstats import ROW_SUMS
from rollout_diag.results import Rows, RowStats, StepTable, run_rows

# Summation order inside a BLAS product is the BLAS kernel's: one product of ≤ 200 000 terms moves by ~n·2^-53 of its
# terms' magnitude at most, far below this; a different draw of rows moves a replicate by a large part of itself.
DRAW_RTOL = 1e-9


def assert_same_replicates(new: np.ndarray, old: np.ndarray) -> None:
    np.testing.assert_allclose(new, old, rtol=DRAW_RTOL, atol=0.0, equal_nan=True)


def per_step_replicates(
    rows: RowStats, metrics, replicates: int, rng: np.random.Generator, weight_cells: int = WEIGHT_CELLS
) -> np.ndarray:
    """The former ``_replicates``: one ``rng.integers`` per step and batch, steps in ascending order."""
    out = np.full((replicates, len(metrics)), np.nan)
    if rows.rows == 0:
        return out
    columns = np.stack([part for metric in metrics for part in (metric.numerator(rows), metric.denominator(rows))], 1)
    eps = np.array([metric.eps for metric in metrics])
    offset = np.array([metric.offset for metric in metrics])
    groups = [np.flatnonzero(rows.step == step) for step in np.unique(rows.step)]
    batch = max(1, min(replicates, weight_cells // rows.rows))
    for start in range(0, replicates, batch):
        count = min(batch, replicates - start)
        drawn = np.concatenate(
            [members[rng.integers(0, members.size, size=(count, members.size))] for members in groups], 1
        )
        flat = (np.arange(count)[:, None] * rows.rows + drawn).ravel()
        weights = np.bincount(flat, minlength=count * rows.rows).reshape(count, rows.rows).astype(np.float64)
        sums = weights @ columns
        with np.errstate(divide="ignore", invalid="ignore"):
            out[start : start + count] = sums[:, 0::2] / (sums[:, 1::2] + eps) + offset
    return out


def random_rows(rng: np.random.Generator, steps: np.ndarray) -> RowStats:
    lengths = rng.integers(0, 30, steps.size).astype(np.float64)
    sums = {name: rng.normal(0.0, 1.0, steps.size) * lengths for name in ROW_SUMS}
    sums["abs_log_ratio"] = np.abs(sums["abs_log_ratio"])
    sums["k3"] = np.abs(sums["k3"])
    return RowStats(steps.astype(np.int64), lengths, sums)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=40),
    shuffle=st.booleans(),
    replicates=st.integers(100, 130),
    seed=st.integers(0, 2**32 - 1),
)
def test_runs_of_steps_draw_what_one_draw_per_step_drew(
    sizes: list[int], shuffle: bool, replicates: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    step_values = np.sort(rng.choice(10_000, len(sizes), replace=False)) - 5_000  # any order, negative too
    steps = np.repeat(step_values, sizes)
    if shuffle:  # steps interleaved in reading order
        steps = steps[rng.permutation(steps.size)]
    rows = random_rows(rng, steps)
    new = _replicates(rows, KEY_METRICS, replicates, np.random.default_rng(seed))
    old = per_step_replicates(rows, KEY_METRICS, replicates, np.random.default_rng(seed))
    assert_same_replicates(new, old)


def test_many_batches_and_one_row_steps_match_the_per_step_draws(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches of replicates (fewer weight cells than replicates × rows, the last batch short), one-row steps
    between multi-row ones."""
    monkeypatch.setattr(diff_module, "WEIGHT_CELLS", 60_000)
    rng = np.random.default_rng(5)
    sizes = rng.choice([1, 1, 1, 2, 3, 8], 3_000)
    rows = random_rows(rng, np.repeat(np.arange(sizes.size), sizes))
    assert 200 % (60_000 // rows.rows) != 0
    for seed in (0, 1):
        new = _replicates(rows, KEY_METRICS, 200, np.random.default_rng(seed))
        old = per_step_replicates(rows, KEY_METRICS, 200, np.random.default_rng(seed), 60_000)
        assert_same_replicates(new, old)


def test_one_row_steps_only_reuse_the_sums_and_match_the_per_step_draws(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step one row (a token-layout dump with a wrong step column): every batch has the same weights; the
    replicates equal the per-step code's, the short last batch too, and the stream is left as it found it."""
    monkeypatch.setattr(diff_module, "WEIGHT_CELLS", 60_000)
    rng = np.random.default_rng(8)
    rows = random_rows(rng, rng.permutation(7_000) * 3)
    assert 150 % (60_000 // rows.rows) != 0
    stream, reference = np.random.default_rng(4), np.random.default_rng(4)
    new = _replicates(rows, KEY_METRICS, 150, stream)
    old = per_step_replicates(rows, KEY_METRICS, 150, reference, 60_000)
    assert_same_replicates(new, old)
    assert stream.integers(0, 2**62) == reference.integers(0, 2**62)


def test_the_differences_of_two_sides_match_the_per_step_draws() -> None:
    rng = np.random.default_rng(11)
    a = random_rows(rng, np.repeat(np.arange(50), 4))
    b = random_rows(rng, np.repeat(np.arange(70), rng.integers(1, 5, 70)))
    new = bootstrap_differences(a, b, KEY_METRICS, 150, 3)
    stream_a, stream_b = (np.random.default_rng(child) for child in np.random.SeedSequence(3).spawn(2))
    old = per_step_replicates(b, KEY_METRICS, 150, stream_b) - per_step_replicates(a, KEY_METRICS, 150, stream_a)
    assert_same_replicates(new, old)


@pytest.mark.parametrize(("replicates", "rows", "metrics"), [(20, 200_000, 33), (7, 50_001, 8), (200, 20_000, 33)])
def test_the_transposed_product_is_the_weighted_sums(replicates: int, rows: int, metrics: int) -> None:
    """``_replicates`` asks BLAS for columnsᵀ · weightsᵀ: the same dot products as weights @ columns at the shapes
    ``diff`` meets (one-row steps of 200 000 rows, a few replicates per batch), each within a few ulps of its terms'
    magnitude Σ|w·c| (BLAS kernels add in their own order: no digit-for-digit promise across machines)."""
    rng = np.random.default_rng(rows)
    weights = rng.integers(0, 4, (replicates, rows)).astype(np.float64)
    columns = np.stack([rng.lognormal(0.0, 3.0, rows) * rng.choice([-1.0, 1.0], rows) for _ in range(2 * metrics)], 1)
    transposed, direct = (columns.T @ weights.T).T, weights @ columns
    # exact to float64 rounding of the sum: math.fsum per cell, on a few cells (a full fsum is slow)
    magnitude = np.abs(weights) @ np.abs(columns)
    assert np.all(np.abs(transposed - direct) <= 16 * np.finfo(np.float64).eps * magnitude)
    for row, column in ((0, 0), (replicates - 1, 2 * metrics - 1)):
        exact = math.fsum(weights[row] * columns[:, column])
        assert abs(transposed[row, column] - exact) <= 16 * np.finfo(np.float64).eps * magnitude[row, column]


def test_the_json_of_steps_and_run_positions_held_as_columns_is_the_json_of_the_lists(tmp_path: Path) -> None:
    """``DiffResult.to_json`` reads a StepTable's step column and a Rows' head: the document equals the one made
    from the same results as plain lists of StepResults and dicts."""
    for name, seed in (("a", 1), ("b", 2)):
        write_sequence_dump(tmp_path / f"{name}.parquet", dump_rows(seed, steps=range(40), rows_per_step=2))
    result = diff_runs(str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet"), device="cpu", replicates=100)
    assert isinstance(result.a.result.steps, StepTable) and isinstance(result.a.result.positions, Rows)
    assert any(row["step"] is not None for row in result.a.result.positions)  # per-step rows to leave out

    def as_lists(side: DiffSide) -> DiffSide:
        plain = dataclasses.replace(side.result, steps=list(side.result.steps), positions=list(side.result.positions))
        return dataclasses.replace(side, result=plain)

    listed = dataclasses.replace(result, a=as_lists(result.a), b=as_lists(result.b))
    assert json.dumps(result.to_json()) == json.dumps(listed.to_json())
    assert result.to_json()["a"]["steps"] == list(range(40))
    for table in (result.a.result.positions, result.b.result.rounds):  # the report's curves read these
        assert run_rows(table) == [row for row in list(table) if row.get("step") is None]
