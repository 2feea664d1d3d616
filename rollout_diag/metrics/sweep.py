"""Threshold sweep: for each rejection option (METRICS.md §3) and IS truncation (§2), which threshold rejects a
target share of tokens or sequences, what share verl's default threshold rejects, and the whole curve.

- Sequence options are exact: the row statistic of every valid row is kept (memory grows with rows, not tokens).
- Token options come from a histogram of c = clamp20(δ) with BINS_PER_DECADE bins per decade of |c| on each
  sign (memory fixed). Every token statistic is a monotone function of c on each side (k1 = −c, k2 = ½c²,
  k3 = eᶜ − 1 − c, the IS ratio = eᶜ), so the share above a threshold is bounded by whole bins: the
  reported threshold never rejects more than the target, and is at most one bin (|c| × 10^(1/32) ≈ 1.075)
  above the exact one.
Shares are over model tokens (token options) or over rows with at least one model token (sequence options:
``base.sequence_share``, the definition the preset table uses too).
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from rollout_diag.catalogue import CLAMP, EPS
from rollout_diag.engine import arrays
from rollout_diag.engine.arrays import Array
from rollout_diag.engine.quantities import GATE_HISTOGRAM
from rollout_diag.engine.state import Ragged, StateTable
from rollout_diag.engine.stats import ChunkStats, stats
from rollout_diag.io.chunk import Chunk
from rollout_diag.metrics.base import State, StepAccumulator, sequence_share
from rollout_diag.results import ItemSequence

BINS_PER_DECADE = 32
DECADE_MIN, DECADE_MAX = -12, 2  # |c| from 1e-12 (smaller: first bin) to 100 (clamp20 keeps |c| ≤ 20)
HISTOGRAM_BINS = (DECADE_MAX - DECADE_MIN) * BINS_PER_DECADE
EDGES = 10.0 ** (DECADE_MIN + np.arange(HISTOGRAM_BINS + 1) / BINS_PER_DECADE)
EDGES[0] = 0.0  # the first bin also holds |c| < 1e-12, zero included
DEFAULT_TARGETS = (0.001, 0.01, 0.05)
# the probability gates (presets.GATE_STATISTICS): each row's sum, for the exact sweep of their seq_mean options
GATES = ("kpop", "bkl", "tv")
GATE_ROW_FIELDS = tuple(f"sum_{gate}" for gate in GATES)
GATE_OPTIONS = frozenset(f"{scope}_{gate}" for scope in ("token", "seq_mean") for gate in GATES)  # in OPTIONS
CURVE_POINTS = 41
# ChunkStats.memo key of a chunk's signed histograms of c per step group ([G, 2·HISTOGRAM_BINS]): the compiled preset
# pass's where it counted them (metrics.correction.prepare_derived), else signed_histograms'
SIGNED_HISTOGRAM = "sweep_signed_histogram"
ROW_FIELDS = ("sum_c", "sum_k2", "sum_k3", "max_k2", "max_k3", "count", "seq_log_ratio", *GATE_ROW_FIELDS)


@dataclass(frozen=True)
class SweepOption:
    """An option whose threshold is swept. ``kind``: k1 (two-sided, ratio U, L = 1/U), upper (metric U) or
    is (ratio U, upper side only)."""

    name: str
    level: str  # "token" | "sequence"
    kind: str
    verl_default: str | None  # the threshold verl's presets use with this option, as verl writes it


OPTIONS: tuple[SweepOption, ...] = (
    SweepOption("is_token", "token", "is", "2.0"),
    SweepOption("is_sequence", "sequence", "is", "2.0"),
    SweepOption("token_k1", "token", "k1", None),
    SweepOption("token_k2", "token", "upper", None),
    SweepOption("token_k3", "token", "upper", None),
    SweepOption("seq_sum_k1", "sequence", "k1", "0.5_2.0"),
    SweepOption("seq_sum_k2", "sequence", "upper", None),
    SweepOption("seq_sum_k3", "sequence", "upper", None),
    SweepOption("seq_mean_k1", "sequence", "k1", "0.999_1.001"),
    SweepOption("seq_mean_k2", "sequence", "upper", None),
    SweepOption("seq_mean_k3", "sequence", "upper", "0.01"),
    SweepOption("seq_max_k2", "sequence", "upper", None),
    SweepOption("seq_max_k3", "sequence", "upper", None),
    # the probability gates (docs/gates.md): token options from a histogram of the gate's value, seq_mean exact
    *(SweepOption(f"token_{gate}", "token", "gate", None) for gate in GATES),
    *(SweepOption(f"seq_mean_{gate}", "sequence", "upper", None) for gate in GATES),
)


def _k3(c: np.ndarray | float) -> np.ndarray | float:
    # histogram edges only: expm1 keeps the edge scores increasing down to |c| = 1e-12, where verl's
    # exp(c) − 1 − c (used for the row statistics) would round to noise
    return np.expm1(c) - c


class SweepAccumulator(StepAccumulator):
    """Per step: signed histograms of c over model tokens, and the row statistics of every valid row."""

    REDUCTIONS: ClassVar[dict[str, str]] = {
        "positive": "sum",  # histogram of c > 0 over |c| bins
        "negative": "sum",  # histogram of c ≤ 0 over |c| bins
        "tokens": "sum",
        "rows": "concat",  # [rows, len(ROW_FIELDS)] of valid rows
        "gates": "sum",  # histograms of each probability gate's value over |c|'s bins, GATES in order
    }

    def __init__(self, gates: bool = True) -> None:
        """``gates``: the probability gates' options too (their values cost compare-presets about 25 % more CPU:
        it asks for them only with a gate preset); without, their columns and histograms hold zeros."""
        super().__init__()
        self.gates = gates

    def _stats(self, chunk: Chunk) -> dict[str, Array]:
        s = stats(chunk)
        groups = chunk.groups
        # one histogram of 2·HISTOGRAM_BINS per step: c > 0 in the first half, c ≤ 0 in the second
        signed = signed_histograms(s)
        rows = row_fields(s, self.gates)
        valid = s.row_count > 0
        return {
            "positive": signed[:, :HISTOGRAM_BINS],
            "negative": signed[:, HISTOGRAM_BINS:],
            "tokens": s.group_sum_rows(s.row_count),
            "rows": Ragged(arrays.host(rows[valid]), arrays.host(groups.row_group[valid])),
            "gates": gate_histograms(s)
            if self.gates
            else arrays.zeros((signed.shape[0], len(GATES) * HISTOGRAM_BINS), signed),
        }

    def _finalize(self, state: State) -> dict[str, float]:
        return {}  # the sweep is a table, not metrics: see sweep_tables()

    def table(self, state: State, targets: tuple[float, ...], curve: bool) -> list[dict[str, Any]]:
        return [
            _option_row(option, state, targets, curve)
            for option in OPTIONS
            if self.gates or option.name not in GATE_OPTIONS
        ]


class RunSweepAccumulator(SweepAccumulator):
    """The run's sweep only (``compare-presets`` shows no per-step sweep): every chunk adds into one state, kept as
    step 0, so state and per-chunk work do not grow with the step count. ``run_state()`` equals
    SweepAccumulator's: the same histogram counts and the same valid rows (in read order; the table sorts them)."""

    def update(self, chunk: Chunk) -> None:
        s = stats(chunk)
        # the step groups' counts added (whole numbers: exact in any order), on the host: the state is numpy
        counts = arrays.host(signed_histograms(s)).sum(axis=0)
        signed = np.asarray(counts, dtype=np.float64).reshape(1, -1)
        rows = arrays.host(row_fields(s, self.gates))
        valid = arrays.host(s.row_count) > 0
        partial = {
            "positive": signed[:, :HISTOGRAM_BINS],
            "negative": signed[:, HISTOGRAM_BINS:],
            "tokens": arrays.host(s.row_count).sum(keepdims=True),  # a sum of whole counts: exact in any order
            "rows": Ragged(rows[valid], np.zeros(int(valid.sum()), dtype=np.int64)),
            "gates": (
                np.asarray(arrays.host(gate_histograms(s)), dtype=np.float64).sum(axis=0, keepdims=True)
                if self.gates
                else np.zeros((1, len(GATES) * HISTOGRAM_BINS))
            ),
        }
        # the rows held aside, not copied again
        self.append_table(StateTable.from_groups(self.REDUCTIONS, [0], partial))


def signed_histograms(s: ChunkStats) -> Array:
    """The chunk's histogram of each model token's ``signed_bins`` per step group ([G, 2·HISTOGRAM_BINS] counts):
    counted by the compiled preset pass where the reader's prepare pool ran it (``drivers.sweep``, ``compare-presets``'
    ``Pass.prepare``), else here from the bins. The same counts either way (tests/kernels/test_kernel_presets.py)."""
    return s.memo(SIGNED_HISTOGRAM, lambda: s.group_bincount(signed_bins(s), 2 * HISTOGRAM_BINS))


def gate_histograms(s: ChunkStats) -> Array:
    """Per step group, the histogram of each probability gate's value (kpop, bkl, tv: GATES) over the bins of |c|
    (``magnitude_bins``: every gate is ≥ 0 and below 20), [G, len(GATES)·HISTOGRAM_BINS] counts."""

    def count() -> Array:
        parts = [s.group_bincount(magnitude_bins(s.token(f"rs_{gate}")), HISTOGRAM_BINS) for gate in GATES]
        return arrays.stack(parts, axis=1).reshape(parts[0].shape[0], -1)

    return s.memo(GATE_HISTOGRAM, count)


def signed_bins(s: ChunkStats) -> Array:
    """Histogram bin of each model token's c (int64, of the chunk's kind): |c|'s bin, plus HISTOGRAM_BINS where
    c ≤ 0."""
    clamped = s.token("clamped_log_ratio")
    return magnitude_bins(abs(clamped)) + arrays.astype(clamped <= 0, "int64") * HISTOGRAM_BINS


SLICE_SHIFT = 52 - 6  # = kernels.presets.SLICE_SHIFT: a slice of |c| shares a float64 exponent and 6 mantissa bits


def magnitude_bins(magnitude: Array) -> Array:
    """The |c| part of ``signed_bins``: numpy's log10 on the host, so the CPU engines and the compiled pass's edges
    (``exact_bin_edges``) bin alike; torch's on a GPU (``arrays.host_log10``)."""
    level = arrays.host_log10(arrays.clamp(magnitude, lower=10.0**DECADE_MIN)) - DECADE_MIN
    return arrays.clamp(arrays.astype(level * BINS_PER_DECADE, "int64"), 0, HISTOGRAM_BINS - 1)


@functools.cache
def exact_bin_edges() -> tuple[np.ndarray, np.ndarray]:
    """Where ``signed_bins``' formula on the host (numpy's log10) changes bin, so the compiled preset pass bins c
    exactly as the engines do on the CPU without a log10 of its own (numba's libm log10 and numpy's can differ in the
    last bit): ``edges`` float64
    [HISTOGRAM_BINS], edges[k] (k ≥ 1) the smallest float64 |c| the formula puts in bin k or above (found by
    bisection on the bit patterns of positive floats, which order as the floats do; edges[0] = 0), and ``table``
    int64, the bin of the lower end of each slice of |c| (the floats that share an exponent and the top 6 bits of
    the mantissa: a ratio of at most 1 + 1/64, narrower than a bin) from edges[1]'s slice up to |c| = CLAMP's.
    Computed once per process with this machine's numpy, so the edges are the ones its log10 gives; they assume
    only that the formula never gives a smaller bin to a larger |c| (tests/metrics/test_sweep.py checks every edge's
    neighbourhood and random values)."""
    k = np.arange(1, HISTOGRAM_BINS, dtype=np.int64)
    low = np.zeros_like(k)  # bits of +0.0: bin 0 < k
    high = np.full_like(k, np.float64(np.finfo(np.float64).max).view(np.int64))  # the last bin ≥ k
    while bool(((high - low) > 1).any()):
        middle = low + (high - low) // 2
        reached = magnitude_bins(middle.view(np.float64)) >= k
        high = np.where(reached, middle, high)
        low = np.where(reached, low, middle)
    edges = np.concatenate([[0.0], high.view(np.float64)])
    first, last = (int(np.float64(x).view(np.int64)) >> SLICE_SHIFT for x in (edges[1], CLAMP))
    lower_ends = (np.arange(first, last + 1, dtype=np.int64) << SLICE_SHIFT).view(np.float64)
    table = np.searchsorted(edges[1:], lower_ends, side="right").astype(np.int64)
    # the compiled pass steps over one edge at most within a slice (kernels.presets._count_signed_bins): a bin spans a
    # ratio of 10^(1/32) ≈ 1.075 and a slice at most 1 + 1/64, so no slice (nor |c| up to CLAMP in the last) holds two
    if np.diff(table).max(initial=0) > 1 or np.searchsorted(edges[1:], CLAMP, side="right") - table[-1] > 1:
        raise RuntimeError("the sweep's histogram edges: a slice of |c| holds two bin edges")
    return edges, table


def row_fields(s: ChunkStats, gates: bool = True) -> Array:
    """ROW_FIELDS of every row of the chunk [R, len(ROW_FIELDS)], of the chunk's kind (the gates' sums 0 without
    ``gates``)."""
    n = s.row_count
    zero = n * 0.0
    return arrays.stack(
        [
            s.row_sum("clamped_log_ratio"),
            s.row_sum("rs_k2"),
            s.row_sum("rs_k3"),
            arrays.clamp(s.row_max("rs_k2"), lower=0.0),
            arrays.clamp(s.row_max("rs_k3"), lower=0.0),
            n,
            s.row_sum("log_ratio"),
            *(s.row_sum(f"rs_{gate}") if gates else zero for gate in GATES),
        ],
        axis=-1,
    )


# ----------------------------------------------------------------------------------- finalize
def _row_values(option: SweepOption, rows: np.ndarray) -> np.ndarray:
    """The §3 row statistic of each valid row (IS: s_i = S_i[δ])."""
    column = {name: rows[:, i] for i, name in enumerate(ROW_FIELDS)}
    n = column["count"] + EPS
    values = {
        "is_sequence": column["seq_log_ratio"],
        "seq_sum_k1": -column["sum_c"],  # k1 = −clamp20(δ)
        "seq_mean_k1": -column["sum_c"] / n,
        "seq_sum_k2": column["sum_k2"],
        "seq_mean_k2": column["sum_k2"] / n,
        "seq_max_k2": column["max_k2"],
        "seq_sum_k3": column["sum_k3"],
        "seq_mean_k3": column["sum_k3"] / n,
        "seq_max_k3": column["max_k3"],
        **{f"seq_mean_{gate}": column[f"sum_{gate}"] / n for gate in GATES},
    }
    return values[option.name]


def _gate_index(option: SweepOption) -> int:
    return GATES.index(option.name.rpartition("_")[2])


def _histograms(
    option: SweepOption, positive: np.ndarray, negative: np.ndarray, gates: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The (positive, negative) histograms a token option's shares read: c's, or its gate's value (one side)."""
    if option.kind != "gate":
        return positive, negative
    gates = np.asarray(gates, np.float64).reshape(-1)
    index = _gate_index(option)
    return gates[index * HISTOGRAM_BINS : (index + 1) * HISTOGRAM_BINS], negative


def _score(option: SweepOption, values: np.ndarray) -> np.ndarray:
    """Rejected iff score > threshold-in-metric-space: |stat| for k1 (L = 1/U), stat otherwise."""
    return np.abs(values) if option.kind == "k1" else values


def _to_verl(option: SweepOption, metric_threshold: float) -> float:
    """Metric-space threshold → the number verl's config takes (a ratio U for k1 and IS)."""
    return math.exp(min(metric_threshold, 700.0)) if option.kind in ("k1", "is") else metric_threshold


def _parse_default(option: SweepOption) -> tuple[float, float]:
    """(lower, upper) bounds in metric space of verl's default spec; lower = -inf for one-sided options."""
    assert option.verl_default is not None
    parts = [float(p) for p in option.verl_default.split("_")]
    if option.kind == "upper":
        return -math.inf, parts[0]
    upper = math.log(parts[-1])
    lower = math.log(parts[0]) if len(parts) == 2 else -upper
    return (lower, upper) if option.kind == "k1" else (-math.inf, upper)


@functools.cache
def _token_sides(option: SweepOption) -> tuple[tuple[np.ndarray, ...], np.ndarray, tuple[np.ndarray, ...]]:
    """For a token option: the edge scores of each side (positive c, negative c), the candidate thresholds (every
    edge score, and 0) and, per side, the tail index each candidate falls in. They depend on the option only, so a
    sweep of 200 000 steps computes them once."""
    if option.kind in ("is", "k1", "gate"):
        scores: tuple[np.ndarray, ...] = (EDGES, EDGES) if option.kind == "k1" else (EDGES,)
    elif option.name.endswith("k2"):
        scores = (0.5 * EDGES**2, 0.5 * EDGES**2)
    else:
        scores = (np.asarray(_k3(EDGES)), np.asarray(_k3(-EDGES)))
    candidates = np.unique(np.concatenate([[0.0], *scores]))
    holding = tuple(_holding(side, candidates) for side in scores)
    return scores, candidates, holding


@functools.cache
def _score_lists(option: SweepOption) -> list[list[float]]:
    """The edge scores of each side as Python lists (for bisect)."""
    return [side.tolist() for side in _token_sides(option)[0]]


def _holding(scores: np.ndarray, threshold: float | np.ndarray) -> Any:
    """Index of the tail count above ``threshold`` on a side with these edge scores."""
    return np.clip(np.searchsorted(scores, threshold, side="right") - 1, 0, HISTOGRAM_BINS)


class _TokenShares:
    """Conservative share of tokens whose statistic exceeds a metric-space threshold, from c histograms.

    On each side of c the statistic grows with |c|, so each histogram edge maps to a score. A bin counts
    as rejected when any value in it can exceed the threshold (an upper bound); the share only changes at
    edge scores, so those are the candidate thresholds.
    """

    def __init__(self, option: SweepOption, positive: np.ndarray, negative: np.ndarray, tokens: float) -> None:
        self.tokens = max(tokens, 1.0)

        def tail(counts: np.ndarray) -> np.ndarray:  # tokens in bins ≥ j, for j = 0 … HISTOGRAM_BINS
            return np.concatenate([np.cumsum(counts[::-1])[::-1], [0.0]])

        self.option = option
        self.scores, self.candidates, self.holding = _token_sides(option)
        # IS: truncated, c > log U (positive side only); k1: |c| > log U (L = 1/U); k2: ½c² > U; k3: eᶜ − 1 − c > U
        self.tails = (tail(positive),) if option.kind in ("is", "gate") else (tail(positive), tail(negative))
        self.candidate_shares: np.ndarray | None = None

    def share(self, threshold: float | np.ndarray) -> np.ndarray | float:
        """Upper bound of the share of tokens above ``threshold`` (a number or an array of them)."""
        total = 0.0
        if isinstance(threshold, float):  # one number: bisect on the edge scores, as searchsorted does
            for scores, tails in zip(_score_lists(self.option), self.tails, strict=True):
                total = total + tails[min(max(bisect.bisect_right(scores, threshold) - 1, 0), HISTOGRAM_BINS)]
            return total / self.tokens
        for side, tails in zip(self.scores, self.tails, strict=True):
            total = total + tails[_holding(side, threshold)]
        return total / self.tokens

    def threshold_for(self, target: float) -> float:
        """The smallest edge score whose share is at most ``target``: at most one bin above the exact one."""
        if self.candidate_shares is None:  # the same sums as share(candidates), once for every target
            total = np.zeros(self.candidates.shape[0])
            for tails, holding in zip(self.tails, self.holding, strict=True):
                total = total + tails[holding]
            self.candidate_shares = total / self.tokens
        passing = np.flatnonzero(self.candidate_shares <= target)
        return float(self.candidates[passing[0]] if passing.size else self.candidates[-1])


# (share rejected at a metric-space threshold, the threshold for a target share) of one option's state
Rule = tuple[Callable[[float], float], Callable[[float], float]]


def _option_row(option: SweepOption, state: State, targets: tuple[float, ...], curve: bool) -> dict[str, Any]:
    row: dict[str, Any] = {"option": option.name, "level": option.level, "verl_default": option.verl_default}
    if option.verl_default is not None:  # the upper bound, in verl's units, where the curve is marked
        row["default_threshold"] = float(option.verl_default.split("_")[-1])
    rule = _sequence_rule if option.level == "sequence" else _token_rule
    share, threshold_for = rule(option, state, row)
    row["thresholds"] = []
    for target in targets:
        metric_threshold = threshold_for(target)
        row["thresholds"].append(
            {"target": target, "threshold": _to_verl(option, metric_threshold), "share": share(metric_threshold)}
        )
    if curve:
        marked = () if option.verl_default is None else (_parse_default(option)[1],)
        row["curve"] = _curve(option, threshold_for, share, marked)
    return row


def _sequence_rule(option: SweepOption, state: State, row: dict[str, Any]) -> Rule:
    """A sequence option's exact shares over its rows' values; ``row`` gets its count and default share."""
    values = _row_values(option, state["rows"]) if len(state["rows"]) else np.zeros(0)
    scores = np.sort(_score(option, values))[::-1]
    total = len(scores)
    row["count"] = total
    row["exact"] = True

    def share(threshold: float) -> float:
        return sequence_share(float(np.count_nonzero(scores > threshold)), total)

    def threshold_for(target: float) -> float:
        rank = math.floor(target * total)  # at most `rank` rows strictly above scores[rank]
        return float(scores[rank]) if rank < total else 0.0

    if option.verl_default is not None:
        lower, upper = _parse_default(option)
        rejected = np.count_nonzero((values > upper) | (values < lower)) if total else 0
        row["default_share"] = sequence_share(float(rejected), total)
    return share, threshold_for


def _token_rule(option: SweepOption, state: State, row: dict[str, Any]) -> Rule:
    """A token option's conservative shares from its histograms; ``row`` gets its count and default share."""
    tokens = float(np.asarray(state["tokens"]).reshape(()))
    shares = _TokenShares(option, *_histograms(option, state["positive"], state["negative"], state["gates"]), tokens)
    row["count"] = int(tokens)
    row["exact"] = False

    def share(threshold: float) -> float:
        return float(shares.share(threshold))

    if option.verl_default is not None:
        row["default_share"] = share(_parse_default(option)[1])
    return share, shares.threshold_for


def _curve(
    option: SweepOption,
    threshold_for: Callable[[float], float],
    share: Callable[[float], float],
    marked: tuple[float, ...] = (),
) -> list[dict[str, float]]:
    """Share rejected at thresholds spread between the 50 % and the 0.01 % quantile (log-spaced in score), plus
    the ``marked`` thresholds inside that range: the share is a step function, and a chart that draws lines between
    samples would pass beside the default's marker instead of through it."""
    high, low = threshold_for(1e-4), threshold_for(0.5)
    low = max(low, high * 1e-6, 1e-12)
    if not high > low:
        return []
    inside = [t for t in marked if low < t < high]
    points = np.unique(np.concatenate([np.geomspace(low, high, CURVE_POINTS), inside]))
    return [{"threshold": _to_verl(option, float(t)), "share": share(float(t))} for t in points]


def sweep_tables(
    accumulator: SweepAccumulator, targets: tuple[float, ...] = DEFAULT_TARGETS
) -> tuple[list[dict[str, Any]], Sequence[dict[str, Any]]]:
    """(run table with curves, per-step tables without curves). The per-step tables are computed when first read
    (``compare-presets`` reads only the run's), every step at once (``step_columns``), and each step's dict is built
    when read."""
    run_state = accumulator.run_state()
    run = [] if run_state is None else accumulator.table(run_state, targets, curve=True)
    return run, StepTables(accumulator, targets)


class StepTables(ItemSequence[dict[str, Any]]):
    """The per-step sweep tables (``{"step", "options"}`` dicts, as ``table`` writes them), from ``step_columns``;
    equal to, and pickled as, the list of them (``ItemSequence``)."""

    def __init__(self, accumulator: SweepAccumulator, targets: tuple[float, ...]) -> None:
        self.accumulator, self.targets = accumulator, targets

    @functools.cached_property
    def columns(self) -> StepColumns:
        return step_columns(self.accumulator, self.targets)

    def __len__(self) -> int:
        return int(self.accumulator.store.steps.shape[0])

    def item(self, index: int) -> dict[str, Any]:
        return self.columns.step_table(index)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        columns = self.columns
        return (columns.step_table(index) for index in range(len(self)))


@dataclass
class OptionColumns:
    """One option's per-step sweep: ``count`` [S]; ``default_share`` [S] (None without a verl default); per target,
    the threshold in verl's units and the share it rejects [S]."""

    count: np.ndarray  # int64
    default_share: np.ndarray | None
    thresholds: list[np.ndarray]  # float64, one per target
    shares: list[np.ndarray]


@dataclass
class StepColumns:
    """Every step's sweep as columns: ``steps`` and one OptionColumns per option (OPTIONS order)."""

    steps: list[int]
    targets: tuple[float, ...]
    options: list[OptionColumns]

    def step_table(self, index: int) -> dict[str, Any]:
        """Step ``index``'s ``{"step", "options"}``: what ``table(state, targets, curve=False)`` gives."""
        rows = []
        for option, columns in zip(OPTIONS, self.options, strict=True):
            row: dict[str, Any] = {"option": option.name, "level": option.level, "verl_default": option.verl_default}
            if option.verl_default is not None:
                row["default_threshold"] = float(option.verl_default.split("_")[-1])
            row["count"] = int(columns.count[index])
            row["exact"] = option.level == "sequence"
            if columns.default_share is not None:
                row["default_share"] = float(columns.default_share[index])
            row["thresholds"] = [
                {"target": target, "threshold": float(thresholds[index]), "share": float(shares[index])}
                for target, thresholds, shares in zip(self.targets, columns.thresholds, columns.shares, strict=True)
            ]
            rows.append(row)
        return {"step": self.steps[index], "options": rows}


def step_columns(accumulator: SweepAccumulator, targets: tuple[float, ...] = DEFAULT_TARGETS) -> StepColumns:
    """Every step's sweep (``table(state, targets, curve=False)`` of each step's state), computed a block of steps at
    a time with the same float64 operations, so the same digits, without a state or a dict per step."""
    table = accumulator.store
    step_count = table.steps.shape[0]
    parts: list[list[tuple]] = [[] for _ in OPTIONS]
    row_step, row_values = table.ragged["rows"]  # every valid row's statistics, by step
    lengths = np.bincount(np.searchsorted(table.steps, row_step), minlength=step_count).astype(np.int64)
    stacked = np.asarray(row_values, np.float64).reshape(-1, len(ROW_FIELDS))
    for index, option in enumerate(OPTIONS):
        if option.level == "sequence":  # every step at once: a step's rows are a run of the row columns
            parts[index].append(_sequence_block(option, stacked, lengths, targets))
    for _, columns in table.blocks(names=("tokens", "positive", "negative", "gates")):
        tokens = np.asarray(columns["tokens"], np.float64).reshape(-1)
        # tokens in bins ≥ j, j = 0 … HISTOGRAM_BINS, per step (the same sums as _TokenShares.tail, row by row)
        gates = np.asarray(columns["gates"], np.float64)
        positive, negative, *gate_tails = (
            np.concatenate([np.cumsum(np.asarray(h, np.float64)[:, ::-1], axis=1)[:, ::-1], np.zeros((len(h), 1))], 1)
            for h in (
                columns["positive"],
                columns["negative"],
                *(gates[:, g * HISTOGRAM_BINS : (g + 1) * HISTOGRAM_BINS] for g in range(len(GATES))),
            )
        )
        for index, option in enumerate(OPTIONS):
            if option.level == "token":
                sides = (gate_tails[_gate_index(option)], negative) if option.kind == "gate" else (positive, negative)
                parts[index].append(_token_block(option, *sides, tokens, targets))
    options = []
    for option, blocks in zip(OPTIONS, parts, strict=True):
        count = np.concatenate([block[0] for block in blocks])
        default = None if option.verl_default is None else np.concatenate([block[1] for block in blocks])
        thresholds = [np.concatenate([block[2][t] for block in blocks]) for t in range(len(targets))]
        shares = [np.concatenate([block[3][t] for block in blocks]) for t in range(len(targets))]
        options.append(OptionColumns(count, default, thresholds, shares))
    assert all(option.count.shape[0] == step_count for option in options)
    return StepColumns(table.steps.tolist(), tuple(targets), options)


def _token_block(option: SweepOption, positive: np.ndarray, negative: np.ndarray, tokens: np.ndarray, targets):
    """``_TokenShares`` of a block of steps at once, from each side's tails [B, HISTOGRAM_BINS + 1]: (count, default
    share, thresholds and shares per target)."""
    scores, candidates, holding = _token_sides(option)
    tails = (positive,) if option.kind in ("is", "gate") else (positive, negative)
    denominator = np.maximum(tokens, 1.0)

    steps = np.arange(denominator.shape[0])

    def shares_at(indices: Sequence[np.ndarray | int]) -> np.ndarray:
        """Each step's share at its own tail index per side (``_TokenShares.share``'s sums, step by step)."""
        total: Any = 0.0
        for side, at in zip(tails, indices, strict=True):
            total = total + side[steps, at]
        return total / denominator

    count = candidates.shape[0]
    verl_units = np.array([_to_verl(option, float(t)) for t in candidates.tolist()])  # the candidates', once
    thresholds, shares = [], []
    for target in targets:
        # threshold_for: the first candidate whose share is at most ``target``. The shares do not increase along the
        # candidates (tails of non-negative counts, rounding is monotone), so a binary search per step finds the
        # index the scan over every candidate finds, from the same sums.
        low, high = np.zeros(steps.shape[0], np.int64), np.full(steps.shape[0], count)
        while (open_ := low < high).any():
            middle = np.minimum((low + high) // 2, count - 1)
            passing = shares_at([side[middle] for side in holding]) <= target
            high = np.where(open_ & passing, middle, high)
            low = np.where(open_ & ~passing, middle + 1, low)
        chosen = np.where(low < count, low, count - 1)
        thresholds.append(verl_units[chosen])
        shares.append(shares_at([_holding(side, candidates[chosen]) for side in scores]))
    default = None
    if option.verl_default is not None:
        limit = _parse_default(option)[1]
        default = shares_at([np.full(steps.shape[0], _holding(side, limit)) for side in scores])
    return tokens.astype(np.int64), default, thresholds, shares


def _sequence_block(option: SweepOption, stacked: np.ndarray, lengths: np.ndarray, targets):
    """The sequence rows of ``_option_row`` for steps whose valid rows are consecutive runs of ``stacked`` [R, fields]
    (``lengths[s]`` rows for step s): the same values, sorted per step."""
    values = _row_values(option, stacked) if stacked.shape[0] else np.zeros(0)
    scores = _score(option, values)
    owner = np.repeat(np.arange(lengths.shape[0]), lengths)
    ascending = scores[np.lexsort((scores, owner))]  # each step's scores in ascending order, steps in order
    ends = np.cumsum(lengths)
    totals = lengths.astype(np.float64)
    thresholds, shares = [], []
    for target in targets:
        rank = np.floor(target * totals).astype(np.int64)  # math.floor(target * total), step by step
        inside = rank < lengths
        # the descending order's scores[rank] is the ascending order's [end - 1 - rank]
        metric = np.where(inside, ascending[np.where(inside, ends - 1 - rank, 0)] if ascending.size else 0.0, 0.0)
        above = np.bincount(owner, weights=scores > np.repeat(metric, lengths), minlength=lengths.shape[0])
        # math.exp step by step where verl's units are a ratio (numpy's exp may round differently)
        thresholds.append(np.array([_to_verl(option, value) for value in metric.tolist()]) if metric.size else metric)
        shares.append(_shares(above, totals))
    default = None
    if option.verl_default is not None:
        lower, upper = _parse_default(option)
        rejected = np.bincount(owner, weights=(values > upper) | (values < lower), minlength=lengths.shape[0])
        default = _shares(rejected, totals)
    return lengths, default, thresholds, shares


def _shares(rejected: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """``sequence_share`` of each step: rejected / valid rows (the same division), 0.0 without a valid row."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(totals > 0, rejected / np.where(totals > 0, totals, 1.0), 0.0)
