"""What every dialect module declares: the framework, where its definitions live, and each metric it logs.

A dialect is a trainer's own mismatch metrics under its exact logged names, computed the way that trainer
computes and aggregates them. Each framework module holds one mergeable accumulator (a ``StepAccumulator``
over float64 sufficient statistics, like every other family) and a :class:`Framework` record that
``docs/dialects.md`` and the terminal table are generated from.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from rollout_diag.engine import arrays
from rollout_diag.engine.arrays import Array, segment_max, segment_min, segment_sum
from rollout_diag.engine.formulas import quantity
from rollout_diag.engine.stats import ChunkStats
from rollout_diag.io.chunk import Chunk
from rollout_diag.metrics.base import StepAccumulator


@dataclass(frozen=True)
class DialectMetric:
    """One logged metric: its exact name, the concept it measures (the row of the side-by-side table),
    its formula in the notation of docs/dialects.md, and how the framework aggregates it over a step."""

    name: str
    concept: str
    formula: str
    aggregation: str


class DialectFamily(Protocol):
    """What the dialect registry needs of a framework's accumulator: a ``StepAccumulator``, or a composite."""

    def update(self, chunk: Chunk) -> None: ...
    def merge(self, other: Any) -> None: ...
    def finalize_steps(self) -> dict[int, dict[str, float]]: ...
    def finalize_run(self) -> dict[str, float]: ...
    def step_accumulators(self) -> Sequence[StepAccumulator]: ...


# how an aggregation names each statistic a trainer logs of one value
STATISTIC_WORDS = {"avg": "mean", "mean": "mean", "std": "unbiased std", "min": "min", "max": "max"}


def statistics(
    prefix: str, formula: str, over: str, concepts: Mapping[str, str], joined: str = " "
) -> tuple[DialectMetric, ...]:
    """The metrics a trainer logs as ``prefix + stat`` for each statistic of one value, in the order of ``concepts``
    (stat -> the concept's words): the same ``formula``, aggregated as "<mean | unbiased std | min | max>" +
    ``joined`` + ``over``."""
    return tuple(
        DialectMetric(prefix + stat, concept, formula, STATISTIC_WORDS[stat] + joined + over)
        for stat, concept in concepts.items()
    )


@dataclass(frozen=True)
class Framework:
    """A trainer whose metric names rollout-diag speaks."""

    name: str  # the --dialect value
    title: str  # as the project spells itself
    source: str  # repo, file(s) and commit the definitions were read from
    config: str  # the configuration the numbers assume (defaults, or the setting that turns the metric on)
    offline: str  # what an offline dump cannot reproduce, and the whole-batch equivalent chosen
    metrics: tuple[DialectMetric, ...]
    accumulator: Callable[[], DialectFamily]


def reductions(**fields: Iterable[str]) -> dict[str, str]:
    """A family's ``REDUCTIONS`` written by how each field merges: ``reductions(sum=("tokens", "kl_sum"),
    max=("kl_max",))`` is ``{"tokens": "sum", "kl_sum": "sum", "kl_max": "max"}``, keys in the order given.
    Raises ValueError when a field is named twice."""
    named = {reduction: tuple(names) for reduction, names in fields.items()}
    table = {field: reduction for reduction, names in named.items() for field in names}
    if len(table) != sum(len(names) for names in named.values()):
        raise ValueError(f"reductions: a field named twice in {named}")
    return table


@quantity("exp_log_ratio")
def _exp_log_ratio(s: ChunkStats) -> Array:  # exp(δ), unclamped (ROLL, AReaL)
    return arrays.exp(s.token("log_ratio"))


# Reductions built only on the stable per-chunk API (``stats``: ``token``, ``row_sum``, ``row_count``) and the
# chunk's own row / step-group indices, so that the segment machinery can change underneath.
def token_group(s: ChunkStats) -> Array:
    """Step group of every model token (int64 [M])."""
    return s.token_group


def row_extreme(s: ChunkStats, name: str, how: str) -> Array:
    """Max (``how="amax"``) or min (``"amin"``) of a token quantity over each row (∓inf for an empty row)."""
    values = arrays.float64(s.token(name))
    if how == "amax":
        return arrays.scatter_max(arrays.full(s.chunk.rows, -math.inf, values), s.chunk.model.row, values)
    return arrays.scatter_min(arrays.full(s.chunk.rows, math.inf, values), s.chunk.model.row, values)


def by_step(s: ChunkStats, row_values: Array, how: str = "sum") -> Array:
    """Σ / max / min of per-row values over each step group of the chunk (float64 [G])."""
    groups = s.chunk.groups
    reducer = {"sum": segment_sum, "max": segment_max, "min": segment_min}[how]
    return reducer(arrays.float64(row_values), groups.row_group, groups.count)


def valid_extremes(s: ChunkStats, row_values: Array, valid: Array) -> tuple[Array, Array]:
    """(max, min) of per-row values over each step group's valid rows only (−inf, +inf for a group without one): an
    empty row's value would otherwise drag the extreme to its placeholder."""
    return (
        by_step(s, arrays.where(valid, row_values, -math.inf), "max"),
        by_step(s, arrays.where(valid, row_values, math.inf), "min"),
    )


def token_moments(s: ChunkStats, name: str) -> Array:
    """Per step group [n, mean, mean, M2, M2, M2] of a token quantity (the ``moments`` layout of base.py):
    the mean first, then centred squares, so that values far from zero (ratios near 1) keep their variance."""
    return s.group_moments(name, name)


def round_sums(s: ChunkStats, name: str) -> tuple[Array, Array, Array]:
    """(Σ of a token quantity, token count, row) of every round: a maximal run of model tokens within a row."""
    model = s.chunk.model
    row, position = model.row, model.position
    if arrays.size(row) == 0:
        return arrays.zeros(0, row), arrays.zeros(0, row), row[:0]
    starts = arrays.ones(arrays.size(row), row, "bool")
    starts[1:] = (row[1:] != row[:-1]) | (position[1:] != position[:-1] + 1)
    round_id = arrays.cumsum(arrays.astype(starts, "int64")) - 1
    count = int(round_id[-1]) + 1
    sums = segment_sum(s.token(name), round_id, count)
    lengths = segment_sum(arrays.ones(arrays.size(row), row), round_id, count)
    return sums, lengths, row[starts]
