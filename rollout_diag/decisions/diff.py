"""``diff``: run A against run B, metric by metric, with a bootstrap interval of the difference over sequences.

Pure functions over result objects: each side is an AnalysisResult (the exact values, per-round and per-position
tables) plus its RowStats (per-row sums). The interval is a seeded percentile bootstrap of value(B) − value(A):
rows are resampled with replacement *within each step* (a step is one training batch, so its size is fixed by
the trainer), A and B independently, and every metric is recomputed from the resampled row sums. Rows, not
tokens, are the unit: tokens of one sequence are correlated, sequences of a batch are (close to) independent.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rollout_diag import catalogue
from rollout_diag.decisions.bootstrap import DEFAULT_LEVEL, DEFAULT_REPLICATES, DEFAULT_SEED, tail_interval
from rollout_diag.decisions.rowmetrics import KEY_METRICS, RowMetric, rejected_share
from rollout_diag.errors import ConfigError, option_name
from rollout_diag.results import (
    SCHEMA_VERSION,
    AnalysisResult,
    ExtraValue,
    RowStats,
    StepResult,
    StepTable,
    each,
    item_to_json,
    json_as,
    json_row,
    repr_text,
    run_rows,
    short_repr,
)

ROUNDING = 1e-12  # relative size of a difference that is only summation order
WEIGHT_CELLS = 4_000_000  # replicate × row weights held at once (32 MB of float64)

BETTER, WORSE, SAME, UNKNOWN = "better", "worse", "no detectable change", "n/a"


@dataclass(frozen=True)
class DiffSide:
    """One side of the comparison: a label (file names or a step range), what analyze found, its per-row sums.

    ``diff_runs`` gives each side the run-level part of the analysis (``RowPass.summary``: the run's metrics, rounds,
    positions and groups, each step's counts), not its per-step metrics, dialect metrics or findings: run ``analyze``
    for those."""

    label: str
    result: AnalysisResult
    rows: RowStats


@dataclass(frozen=True)
class MetricDiff:
    """One metric in A and B, B/A, the bootstrap interval of B − A and what it means (lower is better)."""

    metric: str
    a: float
    b: float
    ratio: float | None
    difference: float
    low: float
    high: float
    verdict: str
    meaning: str = ""


@dataclass(frozen=True)
class PresetDiff:
    """The share of model tokens a preset drops in A and B; ``changed`` when the interval excludes 0."""

    preset: str
    a: float
    b: float
    difference: float
    low: float
    high: float
    changed: bool


@dataclass(frozen=True)
class GroupDiff:
    """``diff --by``: one group of rows (``column`` = the --by spec, ``value`` its value or bucket; None: null) in A
    and B, each key metric B against A with its bootstrap interval over the group's rows alone."""

    column: str
    value: ExtraValue
    rows_a: int
    rows_b: int
    tokens_a: int
    tokens_b: int = field(metadata=json_as(then=("change",)))
    metrics: list[MetricDiff] = field(metadata=json_as(write=each(lambda metric: json_row(vars(metric)))))

    @property
    def headline(self) -> MetricDiff:
        """The primary metric (rollout_corr/k3_kl) of the group."""
        return next((m for m in self.metrics if m.metric == catalogue.K3_KL.key), self.metrics[0])

    @property
    def change(self) -> float:
        """|B − A| of the primary metric (k3_kl), the order of the groups table; NaN where a side has no row."""
        return abs(self.headline.difference)

    def to_json(self) -> dict[str, Any]:
        """The group's fields, its ``change`` after the token counts."""
        return item_to_json(self)


@dataclass(frozen=True)
class DiffResult:
    """What ``diff`` found; ``to_json()`` is the documented JSON (schemas/diff.schema.json)."""

    a: DiffSide
    b: DiffSide
    metrics: list[MetricDiff]
    presets: list[PresetDiff]
    replicates: int
    level: float
    seed: int
    warnings: list[str] = field(default_factory=list)
    groups: list[GroupDiff] = field(default_factory=list)  # diff --by: largest change first

    @property
    def changed_presets(self) -> list[PresetDiff]:
        return [preset for preset in self.presets if preset.changed]

    @property
    def changed_preset_groups(self) -> list[list[PresetDiff]]:
        """The changed presets, those with the same numbers (A, B, B − A and its interval) in one group, in the
        order of each group's first member: as compare-presets shares one row among presets of equal effect
        (``decoupled_k3_rs`` and ``bypass_ppo_clip_k3_rs`` drop the same tokens offline)."""
        groups: dict[tuple[float, ...], list[PresetDiff]] = {}
        for preset in self.changed_presets:
            groups.setdefault((preset.a, preset.b, preset.difference, preset.low, preset.high), []).append(preset)
        return list(groups.values())

    def __repr__(self) -> str:
        verdicts = Counter(metric.verdict for metric in self.metrics)
        return short_repr(
            "DiffResult",
            f"A {repr_text(self.a.label)} vs B {repr_text(self.b.label)}",
            ", ".join(f"{count} {name}" for name, count in verdicts.most_common()) or "no metrics",
            f"{len(self.changed_presets):,} of {len(self.presets):,} presets changed",
            f"{self.a.rows.rows:,} vs {self.b.rows.rows:,} rows",
        )

    def answer(self) -> str:
        """The A/B answer in one sentence (the report's banner says it): which key metrics B made worse or better
        beyond the bootstrap interval, else that none changed detectably."""
        by_verdict: dict[str, list[str]] = {}
        for metric in self.metrics:
            by_verdict.setdefault(metric.verdict, []).append(catalogue.short_name(metric.metric))
        level = f"{self.level:.0%}"
        said = [
            f"{word} on {', '.join(by_verdict[verdict])}"
            for verdict, word in ((WORSE, "worse"), (BETTER, "better"))
            if by_verdict.get(verdict)
        ]
        if not said:
            return f"B against A: no detectable change in any key metric ({level} bootstrap intervals contain 0)."
        rest = len(by_verdict.get(SAME, []))
        tail = f"; no detectable change on {rest} other(s)" if rest else ""
        return f"B against A: {'; '.join(said)}{tail} ({level} bootstrap intervals of B − A)."

    def to_json(self) -> dict[str, Any]:
        def side(value: DiffSide) -> dict[str, Any]:
            result = value.result
            return {
                "label": value.label,
                "inputs": list(result.inputs),
                "steps": _step_ids(result.steps),
                "rows": result.run.rows,
                "tokens": result.run.tokens,
                "rounds": [json_row(row) for row in result.rounds],
                "positions": [json_row(row) for row in run_rows(result.positions)],
            }

        return {
            "schema_version": SCHEMA_VERSION,
            "a": side(self.a),
            "b": side(self.b),
            "bootstrap": {"replicates": self.replicates, "level": self.level, "seed": self.seed, "unit": "rows"},
            "metrics": [json_row(vars(metric)) for metric in self.metrics],
            "presets": [json_row(vars(preset)) for preset in self.presets],
            "changed_presets": [preset.preset for preset in self.changed_presets],
            "groups": [group.to_json() for group in self.groups],
            "warnings": list(self.warnings),
        }


def _step_ids(steps: Sequence[StepResult]) -> list[int]:
    """The step of each per-step result; a StepTable's from its column (no StepResult made per step)."""
    if isinstance(steps, StepTable):
        return steps.step_ids.tolist()
    return [step.step for step in steps if step.step is not None]  # a per-step result always has its step


def diff(
    a: DiffSide,
    b: DiffSide,
    *,
    presets: Sequence[str] | None = None,
    replicates: int = DEFAULT_REPLICATES,
    level: float = DEFAULT_LEVEL,
    seed: int = DEFAULT_SEED,
) -> DiffResult:
    """Every key metric of A and B with a ``level`` bootstrap interval of B − A and a verdict, and, for each preset
    in ``presets`` (default: every preset both sides carry), the change in the share of tokens it drops.

    Values come from the AnalysisResults where they report the metric (exactly what ``analyze`` prints), else
    from the row sums. Raises ConfigError for fewer than 100 replicates or a level outside (0, 1).
    """
    if replicates < 100:
        raise ConfigError(f"{option_name('replicates')}={replicates}: use at least 100 bootstrap replicates.")
    if not 0.0 < level < 1.0:
        raise ConfigError(f"{option_name('level')}={level}: the interval's level must lie in (0, 1), e.g. 0.95.")
    shared = [name for name in a.rows.rejected if name in b.rows.rejected]
    chosen = shared if presets is None else [name for name in presets if name in shared]
    row_metrics = [*KEY_METRICS, *(rejected_share(name) for name in chosen)]
    differences = bootstrap_differences(a.rows, b.rows, row_metrics, replicates, seed)
    tail = (1.0 - level) / 2.0
    metric_diffs, preset_diffs = [], []
    for index, metric in enumerate(row_metrics):
        value_a, value_b = _value(metric, a), _value(metric, b)
        low, high = tail_interval(differences[:, index], tail)
        if index < len(KEY_METRICS):
            metric_diffs.append(_metric_diff(metric, value_a, value_b, low, high))
        else:
            name = chosen[index - len(KEY_METRICS)]
            changed = math.isfinite(low) and (low > _noise(value_a, value_b) or high < -_noise(value_a, value_b))
            preset_diffs.append(PresetDiff(name, value_a, value_b, value_b - value_a, low, high, changed))
    warnings = [
        f"{side.label}: only {side.rows.rows} sequences; the interval is rough below 30."
        for side in (a, b)
        if side.rows.rows < 30
    ]
    return DiffResult(a, b, metric_diffs, preset_diffs, replicates, level, seed, warnings)


def _metric_diff(metric: RowMetric, value_a: float, value_b: float, low: float, high: float) -> MetricDiff:
    return MetricDiff(
        metric.name,
        value_a,
        value_b,
        value_b / value_a if value_a not in (0.0,) and math.isfinite(value_a) else None,
        value_b - value_a,
        low,
        high,
        verdict(value_a, value_b, low, high),
        metric.meaning,
    )


@dataclass(frozen=True)
class GroupSide:
    """One group of rows on one side of ``diff --by``: its key metrics (``GroupResult.metrics``, empty where the
    side has no such row) and its rows' statistics."""

    metrics: Mapping[str, float]
    rows: RowStats
    tokens: int


def diff_group(
    column: str,
    value: ExtraValue,
    a: GroupSide,
    b: GroupSide,
    *,
    replicates: int = DEFAULT_REPLICATES,
    level: float = DEFAULT_LEVEL,
    seed: int = DEFAULT_SEED,
) -> GroupDiff:
    """Each key metric of one group in A and B, as ``diff`` of the two sides' rows of that group alone would give:
    the values the group's analysis reports (else from its row sums), the bootstrap interval of B − A over its rows
    (resampled within steps, the same seed). A side without a row of the group gives NaN, and no interval."""
    differences = bootstrap_differences(a.rows, b.rows, KEY_METRICS, replicates, seed)
    tail = (1.0 - level) / 2.0
    metrics = []
    for index, metric in enumerate(KEY_METRICS):
        value_a, value_b = _group_value(metric, a), _group_value(metric, b)
        low, high = tail_interval(differences[:, index], tail)
        metrics.append(_metric_diff(metric, value_a, value_b, low, high))
    return GroupDiff(column, value, a.rows.rows, b.rows.rows, a.tokens, b.tokens, metrics)


def _group_value(metric: RowMetric, side: GroupSide) -> float:
    if side.rows.rows == 0:
        return math.nan
    reported = side.metrics.get(metric.name)
    return float(reported) if reported is not None else metric.value(side.rows)


def sort_group_diffs(groups: Sequence[GroupDiff]) -> list[GroupDiff]:
    """By --by spec, then the largest change of k3_kl first (groups missing from a side last)."""
    return sorted(groups, key=lambda g: (g.column, -(g.change if math.isfinite(g.change) else -1.0), str(g.value)))


def verdict(a: float, b: float, low: float, high: float) -> str:
    """better / worse (lower is better) when the interval of B − A excludes 0, else no detectable change."""
    if not (math.isfinite(a) and math.isfinite(b) and math.isfinite(low) and math.isfinite(high)):
        return UNKNOWN
    if high < -_noise(a, b):
        return BETTER
    if low > _noise(a, b):
        return WORSE
    return SAME


def _noise(a: float, b: float) -> float:
    """Differences this small are float64 summation order, not a change."""
    return ROUNDING * max(abs(a), abs(b))


def _value(metric: RowMetric, side: DiffSide) -> float:
    reported = side.result.run.metrics.get(metric.name)
    return float(reported) if reported is not None else metric.value(side.rows)


def bootstrap_differences(
    a: RowStats, b: RowStats, metrics: Sequence[RowMetric], replicates: int, seed: int
) -> np.ndarray:
    """[replicates, metrics] of metric(B*) − metric(A*) on rows resampled within steps (seeded: A and B get
    independent streams of one ``np.random.SeedSequence(seed)``)."""
    stream_a, stream_b = (np.random.default_rng(child) for child in np.random.SeedSequence(seed).spawn(2))
    return _replicates(b, metrics, replicates, stream_b) - _replicates(a, metrics, replicates, stream_a)


def bootstrap_values(
    rows: RowStats, metrics: Sequence[RowMetric], replicates: int, rng: np.random.Generator
) -> np.ndarray:
    """[replicates, metrics] of each metric on ``replicates`` within-step resamples of ``rows`` (``runs`` draws run
    i from child i of ``np.random.SeedSequence(seed)``, as ``diff`` draws A from child 0 and B from child 1)."""
    return _replicates(rows, metrics, replicates, rng)


def percentile_interval(replicates: np.ndarray, level: float) -> tuple[float, float]:
    """The ``level`` percentile interval of one statistic's replicates (its finite ones; NaN, NaN when none)."""
    return tail_interval(replicates, (1.0 - level) / 2.0)


def _replicates(rows: RowStats, metrics: Sequence[RowMetric], replicates: int, rng: np.random.Generator) -> np.ndarray:
    """[replicates, metrics] of each metric on ``replicates`` within-step resamples of ``rows``."""
    out = np.full((replicates, len(metrics)), np.nan)
    if rows.rows == 0:
        return out
    # every metric is Σ w·num / (Σ w·den + eps) + offset: one matrix product per batch of replicates
    columns = np.stack([part for metric in metrics for part in (metric.numerator(rows), metric.denominator(rows))], 1)
    eps = np.array([metric.eps for metric in metrics])
    offset = np.array([metric.offset for metric in metrics])
    runs = _step_runs(rows.step)
    drawing = [run for run in runs if run.members.shape[1] > 1]  # a step of one row draws it once, every time
    batch = max(1, min(replicates, WEIGHT_CELLS // rows.rows))
    weights = np.empty((0, rows.rows))
    for start in range(0, replicates, batch):
        count = min(batch, replicates - start)
        if weights.shape[0] != count:  # the first batch, or the last when shorter
            weights = np.ones((count, rows.rows))
        elif not drawing:  # every step holds one row: the same weights, so the same sums as the batch before
            out[start : start + count] = out[start - count : start]
            continue
        # each step keeps its size: draw its rows' indices, count how often each row was drawn (exact integers)
        for run in drawing:
            weights[:, run.members.ravel()] = run.counts(rng, count)
        # weights @ columns, the same dot products (each sum over the rows in the same order: tests check that the
        # two agree bit for bit), asked of BLAS as columnsᵀ · weightsᵀ: the [few, rows] @ [rows, 2·metrics] shape
        # made OpenBLAS's threads spin (1 s of CPU instead of 30 ms on 200 000 rows, per batch)
        sums = (columns.T @ weights.T).T
        with np.errstate(divide="ignore", invalid="ignore"):
            out[start : start + count] = sums[:, 0::2] / (sums[:, 1::2] + eps) + offset
    return out


@dataclass(frozen=True)
class _StepRun:
    """Consecutive steps (in ascending step order) that hold the same number of rows: ``members`` [steps, size],
    each step's row indices in reading order."""

    members: np.ndarray

    def counts(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """[count, steps·size]: how often each of the run's rows (``members`` in C order) is drawn in each of
        ``count`` resamples of its step. The random stream is the one a ``rng.integers(0, size, (count, size))`` per
        step, in step order, consumes: one call fills its values in C order from the same generator. Runs of
        one-row steps are not drawn (``rng.integers(0, 1, …)`` takes nothing from the stream)."""
        steps, size = self.members.shape
        picked = rng.integers(0, size, size=(steps, count, size))
        flat = (np.arange(steps * count)[:, None] * size + picked.reshape(steps * count, size)).ravel()
        drawn = np.bincount(flat, minlength=steps * count * size).reshape(steps, count, size)
        return drawn.transpose(1, 0, 2).reshape(count, steps * size)


def _step_runs(step: np.ndarray) -> list[_StepRun]:
    """The rows grouped by step (ascending), consecutive steps of one size in one run."""
    order = np.argsort(step, kind="stable")
    _, sizes = np.unique(step[order], return_counts=True)
    runs = []
    bounds = np.flatnonzero(np.diff(sizes)) + 1
    starts = np.concatenate([[0], np.cumsum(sizes)])
    for first, last in zip(np.concatenate([[0], bounds]), np.concatenate([bounds, [sizes.size]]), strict=True):
        size = int(sizes[first])
        members = order[starts[first] : starts[last]].reshape(int(last - first), size)
        runs.append(_StepRun(members))
    return runs
