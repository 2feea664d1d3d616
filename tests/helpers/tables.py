"""Random state tables (hypothesis strategies), their families and how two of them must agree; accumulator families."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
from hypothesis import strategies as st

from rollout_diag.engine.state import Ragged, Sparse, StateTable
from rollout_diag.io.reader import DumpReader
from rollout_diag.metrics.base import StepAccumulator
from rollout_diag.metrics.debug import DebugAccumulator
from rollout_diag.metrics.drift import DriftAccumulator
from rollout_diag.metrics.localize import PositionAccumulator
from rollout_diag.metrics.offpolicy import OffPolicyAccumulator
from rollout_diag.metrics.outcome import CorrectionAnalysis
from rollout_diag.metrics.rollout_kl import RolloutKLAccumulator
from rollout_diag.metrics.rounds import RoundAccumulator
from rollout_diag.metrics.sweep import SweepAccumulator, sweep_tables
from rollout_diag.presets import PRESETS

REDUCTIONS = {
    "count": "sum",
    "high": "max",
    "low": "min",
    "spread": "moments",
    "pair": "sum",  # small: a dense column
    "small_sparse": "max",  # given as entries, small: made a dense column
    "buckets": "sum",  # wide: (step, bucket) entries
    "bucket_max": "max",
    "bucket_min": "min",
    "bucket_moments": "moments",
    "given_entries": "sum",  # wide, given as entries (a kernel's Sparse)
    "rows": "concat",
}


IDENTITY = {"sum": 0.0, "max": -math.inf, "min": math.inf, "moments": 0.0}


def _value(rng: np.random.Generator) -> float:
    """Mostly ordinary values; now and then a NaN, an infinity or a signed zero (each must land where it did)."""
    pick = rng.random()
    if pick < 0.03:
        return math.nan
    if pick < 0.06:
        return math.inf if rng.random() < 0.5 else -math.inf
    if pick < 0.09:
        return -0.0
    return float(rng.normal(0.0, 2.0))


def _wide(rng: np.random.Generator, groups: int, shape: tuple[int, ...], reduction: str, hit: float) -> np.ndarray:
    """Each bucket hit with probability ``hit``; a negative ``hit``: each group hits its buckets 0…k, k drawn (as
    rounds and log2 positions fill)."""
    tail = (6,) if reduction == "moments" else ()
    out = np.full((groups, *shape, *tail), IDENTITY[reduction])
    flat = math.prod(shape)
    ends = rng.integers(0, flat + 1, groups)
    for index in np.ndindex(groups, *shape):
        inside = np.ravel_multi_index(index[1:], shape) < ends[index[0]] if shape else rng.random() < 0.7
        if (rng.random() < hit) if hit >= 0 else inside:
            if reduction == "moments":
                out[index] = [rng.integers(1, 5), _value(rng), _value(rng), abs(_value(rng)), rng.random(), _value(rng)]
            else:
                out[index] = _value(rng)
    return out


def _partial(rng: np.random.Generator, groups: int, hit: float) -> dict:
    """A chunk's partial state over ``groups`` step groups; ``hit``: the share of wide buckets a group fills."""
    entries = _wide(rng, groups, (30,), "sum", hit).reshape(groups, -1)
    group, bucket = np.nonzero(entries != 0.0)
    small = _wide(rng, groups, (4,), "max", hit).reshape(groups, -1)
    small_group, small_bucket = np.nonzero(small != -math.inf)
    rows = int(rng.integers(0, 6))
    return {
        "count": np.array([_value(rng) for _ in range(groups)]),
        "high": _wide(rng, groups, (), "max", 0.7),
        "low": _wide(rng, groups, (), "min", 0.7),
        "spread": _wide(rng, groups, (), "moments", 0.7),
        "pair": np.array([[_value(rng), 0.0] for _ in range(groups)]),
        "small_sparse": Sparse(small_group, small_bucket, small[small_group, small_bucket], (4,)),
        "buckets": _wide(rng, groups, (20,), "sum", hit),
        "bucket_max": _wide(rng, groups, (3, 4), "max", hit),
        "bucket_min": _wide(rng, groups, (12,), "min", hit),
        "bucket_moments": _wide(rng, groups, (10,), "moments", hit),
        "given_entries": Sparse(group, bucket, entries[group, bucket], (30,)),
        "rows": Ragged(rng.normal(size=(rows, 3)), rng.integers(0, groups, rows)),
    }


def _table(rng: np.random.Generator, steps: list[int], hit: float) -> StateTable:
    return StateTable.from_groups(REDUCTIONS, steps, _partial(rng, len(steps), hit))


def assert_same_table(actual: StateTable, expected: StateTable) -> None:
    """Bit for bit: the same steps, fields, entries, dtypes and shapes (signed zeros included; NaN where NaN). A NaN's
    sign is not compared: which of two NaNs an addition keeps is the CPU's choice by SIMD lane, so it follows the
    lengths of the arrays added, and the layered table (StepStore._begin_layer) adds other lengths than one
    merge after another (NaN reads, prints and sorts as NaN either way)."""

    def same(a: np.ndarray, e: np.ndarray, where: str) -> None:
        assert a.dtype == e.dtype and a.shape == e.shape, f"{where}: {a.dtype}{a.shape} != {e.dtype}{e.shape}"
        if a.dtype.kind == "f":
            a, e = (np.where(np.isnan(x), np.nan, x) for x in (a, e))
        assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(e).tobytes(), f"{where}: {a} != {e}"

    same(actual.steps, expected.steps, "steps")
    assert actual.shapes == expected.shapes
    assert list(actual.dense) == list(expected.dense)
    assert list(actual.sparse) == list(expected.sparse)
    assert list(actual.ragged) == list(expected.ragged)
    for name in expected.dense:
        same(actual.dense[name], expected.dense[name], name)
    for name in expected.sparse:
        for part, a, e in zip(("step", "bucket", "values"), actual.sparse[name], expected.sparse[name], strict=True):
            same(a, e, f"{name} {part}")
    for name in expected.ragged:
        for part, a, e in zip(("step", "values"), actual.ragged[name], expected.ragged[name], strict=True):
            same(a, e, f"{name} {part}")


class _Family(StepAccumulator):
    REDUCTIONS: ClassVar[dict[str, str]] = REDUCTIONS

    def _stats(self, chunk):  # fed tables directly (``append_table``)
        raise NotImplementedError

    def _finalize(self, state):
        return {}


def table_specs(first_low: int, first_high: int, max_size: int) -> st.SearchStrategy:
    """Tables as (first step, gaps between its steps (a gap of 0 adds no step), bucket hit rate; ``steps_of``): the
    first step drawn from [first_low, first_high]."""
    return st.lists(
        st.tuples(
            st.integers(first_low, first_high),
            st.lists(st.integers(0, 3), max_size=4),
            st.sampled_from([0.0, 0.3, 1.0, -1.0]),
        ),
        min_size=1,
        max_size=max_size,
    )


def steps_of(first: int, gaps: list[int]) -> list[int]:
    """The steps of a ``table_specs`` table: ``first``, then each non-zero gap further on."""
    steps = [first]
    for gap in gaps:
        if gap:
            steps.append(steps[-1] + gap)
    return steps


def chunks(path: str, chunk_tokens: int) -> list[Any]:
    return [chunk for chunk, _ in DumpReader([path], chunk_tokens=chunk_tokens).chunks("cpu")]


def finalized(accumulator: Any) -> Any:
    """Everything a family's finalize gives: per step and run values (and the sweep's tables)."""
    if isinstance(accumulator, CorrectionAnalysis):
        return accumulator.finalize()
    out: dict[str, Any] = {"steps": accumulator.finalize_steps(), "run": accumulator.finalize_run()}
    if isinstance(accumulator, SweepAccumulator):
        out["tables"] = sweep_tables(accumulator)
    if isinstance(accumulator, RoundAccumulator):
        out["table"] = accumulator.finalize_table()
    if isinstance(accumulator, PositionAccumulator):
        out["positions"] = accumulator.position_rows()
        out["histogram"] = accumulator.delta_histogram()
    if isinstance(accumulator, DriftAccumulator):  # no metric of its own: its per-step sums are what the split reads
        out["states"] = {step: {k: v.tolist() for k, v in state.items()} for step, state in accumulator.store.states()}
    return out


FAMILIES: dict[str, Callable[[], StepAccumulator | CorrectionAnalysis]] = {
    "offpolicy": OffPolicyAccumulator,
    "debug": DebugAccumulator,
    "rollout_kl": RolloutKLAccumulator,
    "rounds": lambda: RoundAccumulator(max_rounds=3, catastrophic=0.5),
    "positions": lambda: PositionAccumulator(0.5),
    "drift": DriftAccumulator,
    "sweep": SweepAccumulator,
    "correction (every preset: IS, RS options and chains, legacy, drop rules)": lambda: CorrectionAnalysis(
        list(PRESETS.values())
    ),
}
