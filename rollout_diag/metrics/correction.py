"""Rollout-correction metrics: IS weights (METRICS.md §2) and rejection sampling (§3), keys ``rollout_corr/…``.

:class:`ChunkDivergences` computes δ, the k1/k2/k3 statistics, row values, IS weights and keep masks once
per chunk (lazily, memoised) and every accumulator of a pass reads them; ``outcome.CorrectionAnalysis``
holds one accumulator per *distinct* part of the chosen presets. The legacy family (§8) is in ``legacy.py``.

Exactness under chunking: every state is a float64 sum, count, min, max, or (count, mean, M2) merged by
Chan's formula. Nothing in §2/§3 needs a step-level value during the row pass: the §2 metrics are taken
on w before batch normalisation (METRICS.md says so, as verl computes them), the batch-norm factor is a
ratio of two sums, and ESS / std are functions of (N, Σc, Σc²) — see :func:`effective_sample_size`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

import numpy as np
import torch

from rollout_diag.io.chunk import Chunk
from rollout_diag.metrics.base import (
    CLAMP,
    EPS,
    State,
    StepAccumulator,
    as_float,
    clamp20,
    effective_sample_size,
    population_std,
    row_mean,
    safe_exp,
    sample_std,
    segment_max,
    segment_min,
    segment_moments,
    segment_sum,
)
from rollout_diag.metrics.segments import reduce_runs
from rollout_diag.metrics.segments import stats as segment_stats
from rollout_diag.presets import ImportanceSampling, RejectionOption

PREFIX = "rollout_corr/"


# --------------------------------------------------------------------------- shared per-chunk values
MAX_RUNS = 64  # a chunk whose steps interleave in more runs than this reduces tokens through rows


@dataclass(frozen=True)
class PerToken:
    """A value at every model token: ``values`` [M], or, when ``by_row``, one value per row [R] that every
    model token of the row shares (sequence-level weights and statistics), kept at row size so reductions
    over tokens cost O(rows): Σ over tokens = Σ_i n_i·v_i."""

    values: torch.Tensor
    by_row: bool = False

    def map(self, function: Callable[[torch.Tensor], torch.Tensor]) -> PerToken:
        return PerToken(function(self.values), self.by_row)


class ChunkDivergences:
    """Per-chunk tensors every correction accumulator reads, each computed once on first use.

    Token tensors are over the chunk's model tokens (mask 1, ``chunk.model``), in row order [M]; row
    tensors over all rows [R]. Rows are whole (the reader never splits one), so row sums here are final.
    Reductions avoid ``index_add`` over tokens: row sums are run reductions (rows are contiguous), and
    steps are runs of consecutive rows, so a step's token sum is one slice sum (``token_runs``).
    """

    def __init__(self, chunk: Chunk) -> None:
        self.chunk = chunk
        self._memo: dict[Hashable, Any] = {}

    @classmethod
    def of(cls, chunk: Chunk) -> ChunkDivergences:
        """The chunk's shared instance (kept in ``chunk.cache``, created on first use)."""
        found = chunk.cache.get("divergences")
        if found is None:
            found = chunk.cache["divergences"] = cls(chunk)
        return found

    def memo(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """``compute()`` once per chunk and key (shared by every accumulator of the pass)."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    # -- layout ----------------------------------------------------------------------------------
    @cached_property
    def token_row(self) -> torch.Tensor:
        return self.chunk.model.row

    @cached_property
    def row_group(self) -> torch.Tensor:
        return self.chunk.groups.row_group

    @cached_property
    def row_tokens(self) -> torch.Tensor:
        """n_i (int64 [R])."""
        return segment_stats(self.chunk).row_count.to(torch.int64)

    @cached_property
    def row_weight(self) -> torch.Tensor:
        """n_i as float64: the weight of a row value in a token reduction."""
        return self.row_tokens.to(torch.float64)

    @cached_property
    def valid_rows(self) -> torch.Tensor:
        """n_i > 0 (bool [R])."""
        return self.row_tokens > 0

    @property
    def group_count(self) -> int:
        return self.chunk.groups.count

    @cached_property
    def token_runs(self) -> list[tuple[int, int, int]] | None:
        """(step group, first, end) model-token slices of consecutive rows of one step; None past MAX_RUNS."""
        rows = self.chunk.rows
        if rows == 0:
            return []
        boundaries = torch.nonzero(self.row_group[1:] != self.row_group[:-1]).flatten() + 1
        if boundaries.numel() >= MAX_RUNS:
            return None
        zero = torch.zeros(1, dtype=torch.int64, device=self.chunk.device)
        token_offsets = torch.cat([zero, torch.cumsum(self.row_tokens, 0)])
        starts = torch.cat([zero, boundaries])
        ends = torch.cat([boundaries, torch.full_like(zero, rows)])
        return list(
            zip(
                self.row_group[starts].tolist(),
                token_offsets[starts].tolist(),
                token_offsets[ends].tolist(),
                strict=True,
            )
        )

    # -- reductions --------------------------------------------------------------------------------
    def row_sum(self, quantity: PerToken) -> torch.Tensor:
        """S_i[x] for every row (float64 [R])."""
        if quantity.by_row:
            return self.row_weight * quantity.values
        return self._row_reduce(quantity.values, "sum")

    def row_mean(self, quantity: PerToken) -> torch.Tensor:
        """R_i[x] = S_i[x] / (n_i + 1e-8) (Notation; 0 for an empty row)."""
        return row_mean(self.row_sum(quantity), self.row_tokens)

    def rows_with(self, flags: PerToken) -> torch.Tensor:
        """Rows with at least one flagged model token (bool [R])."""
        if flags.by_row:
            return flags.values & self.valid_rows
        return self._row_reduce(flags.values, "sum") > 0

    def _row_reduce(self, token_values: torch.Tensor, reduce: str) -> torch.Tensor:
        """sum / max / min of each row's model tokens; empty rows get 0 / −inf / +inf."""
        return reduce_runs(token_values, self.row_tokens, reduce)

    def step_sum(self, quantity: PerToken) -> torch.Tensor:
        """Σ over each step's model tokens (float64 [G])."""
        if quantity.by_row:
            return self.step_sum_rows(self.row_weight * quantity.values)
        return self._step_reduce(quantity.values, "sum")

    def step_max(self, quantity: PerToken) -> torch.Tensor:
        """Max over each step's model tokens (−inf for a step without one)."""
        if quantity.by_row:
            return self.step_max_rows(quantity.values, self.valid_rows)
        return self._step_reduce(quantity.values, "max")

    def step_min(self, quantity: PerToken) -> torch.Tensor:
        if quantity.by_row:
            return self.step_min_rows(quantity.values, self.valid_rows)
        return self._step_reduce(quantity.values, "min")

    def step_moments(self, quantity: PerToken) -> torch.Tensor:
        """[N, mean, 0, M2, 0, 0] per step over model tokens (base.segment_moments' layout), two passes."""
        count = self.step_tokens
        mean = self.step_sum(quantity) / count.clamp(min=1.0)
        if quantity.by_row:
            centred = quantity.values - mean[self.row_group]
            m2 = self.step_sum_rows(self.row_weight * centred * centred)
        else:
            m2 = self._step_reduce(quantity.values, "sum", centre=mean)
        zeros = torch.zeros_like(count)
        return torch.stack([count, mean, zeros, m2, zeros, zeros], dim=-1)

    def _step_reduce(self, token_values: torch.Tensor, reduce: str, centre: torch.Tensor | None = None) -> torch.Tensor:
        """sum / max / min over each step's model tokens; with ``centre``, the sum of (x − centre[step])²."""
        values = token_values
        runs = self.token_runs
        if runs is None:  # interleaved steps: through rows
            values = values.to(torch.float64)
            if centre is not None:
                centred = values - centre[self.row_group[self.token_row]]
                values = centred * centred
            per_row = self._row_reduce(values, reduce)
            return {"sum": self.step_sum_rows, "max": self.step_max_rows, "min": self.step_min_rows}[reduce](per_row)
        identity = {"sum": 0.0, "max": -math.inf, "min": math.inf}[reduce]
        out = torch.full((self.group_count,), identity, dtype=torch.float64, device=values.device)
        for group, start, end in runs:
            if end == start:
                continue
            part = values[start:end]
            if centre is not None:
                part = part - centre[group]
                part = part * part
            if reduce == "sum":  # a bool slice sums to an exact int64 count
                out[group] += part.sum().to(torch.float64)
            elif reduce == "max":
                out[group] = torch.maximum(out[group], part.max())
            else:
                out[group] = torch.minimum(out[group], part.min())
        return out

    def step_sum_rows(self, row_values: torch.Tensor) -> torch.Tensor:
        return segment_sum(row_values, self.row_group, self.group_count)

    def step_max_rows(self, row_values: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Max per step over all rows, or over the rows flagged in ``rows`` (−inf where none)."""
        values = row_values if rows is None else row_values.masked_fill(~rows, -math.inf)
        return segment_max(values, self.row_group, self.group_count)

    def step_min_rows(self, row_values: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        values = row_values if rows is None else row_values.masked_fill(~rows, math.inf)
        return segment_min(values, self.row_group, self.group_count)

    def step_moments_rows(self, row_values: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Moments per step over all rows, or over the rows flagged in ``rows``."""
        group = self.row_group
        if rows is not None:
            row_values, group = row_values[rows], group[rows]
        return segment_moments(row_values, torch.zeros_like(row_values), group, self.group_count)

    @cached_property
    def step_tokens(self) -> torch.Tensor:
        return self.step_sum_rows(self.row_weight)

    @cached_property
    def step_rows(self) -> torch.Tensor:
        return self.step_sum_rows(torch.ones(self.chunk.rows, dtype=torch.float64, device=self.chunk.device))

    @cached_property
    def step_valid_rows(self) -> torch.Tensor:
        return self.step_sum_rows(self.valid_rows)

    def both(self, first: PerToken, second: PerToken) -> PerToken:
        """Token-wise AND of two keep flags (row-level when both are)."""
        if first.by_row == second.by_row:
            return PerToken(first.values & second.values, first.by_row)
        row_flags, token_flags = (first, second) if first.by_row else (second, first)
        return PerToken(row_flags.values[self.token_row] & token_flags.values)

    # -- divergences -------------------------------------------------------------------------------
    @property
    def log_ratio(self) -> torch.Tensor:
        """δ = a − r per model token, unclamped."""
        return self.chunk.model.log_ratio

    @cached_property
    def clamped_log_ratio(self) -> torch.Tensor:
        """clamp20(δ), shared with the other families (segments.py)."""
        return segment_stats(self.chunk).token("clamped_log_ratio")

    @cached_property
    def seq_log_ratio(self) -> torch.Tensor:
        """s_i = S_i[δ] (unclamped, every row; 0 for an empty row): the row sum §1 takes too, computed once."""
        return segment_stats(self.chunk).row_sum("log_ratio")

    def token_statistic(self, statistic: str) -> torch.Tensor:
        """§3: k1 = −clamp20(δ), k2 = ½·clamp20(δ)², k3 = exp(clamp20(δ)) − 1 − clamp20(δ) per model token."""

        def compute() -> torch.Tensor:
            if statistic == "k1":
                return -self.clamped_log_ratio
            return segment_stats(self.chunk).token(f"rs_{statistic}")  # shared with the sweep

        return self.memo(("statistic", statistic), compute)

    def rs_row_value(self, option: RejectionOption) -> torch.Tensor:
        """§3 v_i per row: S_i[k] (seq_sum), R_i[k] (seq_mean and token options), max (seq_max, 0 if empty)."""

        def compute() -> torch.Tensor:
            # row sums and maxima from the shared per-chunk engine (segments.ChunkStats), as the sweep reads them
            rows = segment_stats(self.chunk)
            if option.statistic == "k1":  # k1 = −clamp20(δ): its row sum is −Σ clamp20(δ)
                row_total = -rows.row_sum("clamped_log_ratio")
            else:
                row_total = rows.row_sum(f"rs_{option.statistic}")
            if option.scope == "seq_sum":
                return row_total
            if option.scope == "seq_max":  # k2 / k3 only (§3 has no seq_max_k1)
                return torch.where(self.valid_rows, rows.row_max(f"rs_{option.statistic}"), 0.0)
            return row_mean(row_total, self.row_tokens)

        return self.memo(("row_value", option.scope, option.statistic), compute)

    def rs_statistic(self, option: RejectionOption) -> PerToken:
        """§3 per-token statistic: the token's own value, or its row's value (sequence options)."""
        if option.is_sequence:
            return PerToken(self.rs_row_value(option), by_row=True)
        return PerToken(self.token_statistic(option.statistic))

    def rs_keep(self, option: RejectionOption) -> PerToken:
        """§3 keep flag: k1 log L ≤ stat ≤ log U; k2/k3 stat ≤ U (sequence options keep or drop whole rows)."""

        def compute() -> PerToken:
            stat = self.rs_statistic(option).values
            keep = stat <= option.upper
            if option.has_lower:
                keep = keep & (stat >= option.lower)
            return PerToken(keep, option.is_sequence)

        return self.memo(("keep", option), compute)

    def rs_final_keep(self, options: tuple[RejectionOption, ...]) -> PerToken:
        """§3 final mask on model tokens: Π(option keeps)."""

        def compute() -> PerToken:
            keep = PerToken(torch.ones(self.chunk.rows, dtype=torch.bool, device=self.chunk.device), by_row=True)
            for option in options:
                keep = self.both(keep, self.rs_keep(option))
            return keep

        return self.memo(("final_keep", options), compute)

    def importance_weights(self, config: ImportanceSampling) -> tuple[PerToken, PerToken]:
        """§2 (w_raw, w): token exp(clamp20(δ)), sequence exp(clamp20(s_i)) per row; TIS w = min(w_raw, U),
        IcePop w = w_raw inside [L, U] else 0."""

        def compute() -> tuple[PerToken, PerToken]:
            if config.level == "token":
                raw = PerToken(torch.exp(self.clamped_log_ratio))
            else:
                raw = PerToken(torch.exp(clamp20(self.seq_log_ratio)), by_row=True)
            if config.icepop:
                return raw, raw.map(lambda w: torch.where((w >= config.lower) & (w <= config.upper), w, 0.0))
            return raw, raw.map(lambda w: w.clamp(max=config.upper))

        return self.memo(("is", config.level, config.upper, config.lower, config.icepop), compute)


class CorrectionAccumulator(StepAccumulator, ABC):
    """A StepAccumulator reading the chunk's shared :class:`ChunkDivergences`, so every accumulator of a pass
    (every preset) computes δ, k1/k2/k3, row values and keep masks once per chunk."""

    def _stats(self, chunk: Chunk) -> dict[str, torch.Tensor]:
        return self._shared_stats(ChunkDivergences.of(chunk))

    def _finalize(self, state: State) -> dict[str, float]:
        value = values_of(state)
        if value["tokens"] == 0:
            return {}  # §1: a step with N = 0 has no metrics
        return self._metrics(value)

    @abstractmethod
    def _metrics(self, value: dict[str, Any]) -> dict[str, float]:
        """Metric values from a merged state of a step (or run) that has model tokens."""

    @abstractmethod
    def _shared_stats(self, shared: ChunkDivergences) -> dict[str, torch.Tensor]:
        """Partial state of each step group: name -> tensor [G, ...]."""


def log_bound(ratio: float | None, missing: float) -> float:
    """log of a ratio bound; log 0 = −inf, and ``missing`` (±inf) when there is no bound."""
    if ratio is None:
        return missing
    return math.log(ratio) if ratio > 0 else -math.inf


def values_of(state: State) -> dict[str, Any]:
    """Scalars as floats, moment vectors as arrays."""
    return {name: (array if np.ndim(array) else as_float(array)) for name, array in state.items()}


# --------------------------------------------------------------------------- §2 IS weights
# The weight summary that §2 and the legacy helper (§8) share; each adds its own keys around it.
WEIGHT_REDUCTIONS: dict[str, str] = {
    "weight_sum": "sum",  # Σ m·w
    "extreme_max": "max",  # token level: max w over model tokens; else max_i ℓ_i (log ratio) over all rows
    "extreme_min": "min",
    "high": "sum",  # token level: #tokens w_raw > U; else rows (or their tokens) with ℓ_i > log U
    "low": "sum",
    "clamped": "moments",  # c = clamp(w, floor, U) over model tokens
    "seq_weight": "moments",  # q_i = R_i[w] over all rows
    "seq_weight_max": "max",
    "seq_weight_min": "min",
    "seq_deviation_max": "max",  # max_i |q_i − 1|
    "seq_high": "sum",  # #rows R_i[w_raw] > U
    "seq_low": "sum",
}


def weight_stats(
    shared: ChunkDivergences,
    raw: PerToken,
    weight: PerToken,
    level_log_ratio: torch.Tensor | None,
    bounds: tuple[float, float, float],
    token_weighted_fractions: bool = False,
) -> dict[str, torch.Tensor]:
    """Partial state of WEIGHT_REDUCTIONS. ``level_log_ratio``: ℓ_i per row for sequence-like levels (None at
    token level); ``bounds``: (clamp floor of c, lower L', upper U) in ratio space."""
    floor, lower, upper = bounds
    if level_log_ratio is None:  # token level: extremes of w, fractions of w_raw over model tokens
        extremes = {"extreme_max": shared.step_max(weight), "extreme_min": shared.step_min(weight)}
        high = shared.step_sum(raw.map(lambda w: w > upper))
        low = shared.step_sum(raw.map(lambda w: w < lower))
    else:  # sequence-like: unclamped ℓ_i over all rows, vs log U in float64 (verl takes log of a float32 U)
        extremes = {
            "extreme_max": shared.step_max_rows(level_log_ratio),
            "extreme_min": shared.step_min_rows(level_log_ratio),
        }
        high_rows = level_log_ratio > log_bound(upper, math.inf)
        low_rows = level_log_ratio < log_bound(lower, -math.inf)
        if token_weighted_fractions:
            high, low = shared.step_sum(PerToken(high_rows, True)), shared.step_sum(PerToken(low_rows, True))
        else:
            high, low = shared.step_sum_rows(high_rows), shared.step_sum_rows(low_rows)
    seq_weight = shared.row_mean(weight)
    raw_seq_weight = seq_weight if raw is weight else shared.row_mean(raw)
    return {
        "weight_sum": shared.step_sum(weight),
        **extremes,
        "high": high,
        "low": low,
        "clamped": shared.step_moments(weight.map(lambda w: w.clamp(floor, upper))),
        "seq_weight": shared.step_moments_rows(seq_weight),
        "seq_weight_max": shared.step_max_rows(seq_weight),
        "seq_weight_min": shared.step_min_rows(seq_weight),
        "seq_deviation_max": shared.step_max_rows((seq_weight - 1.0).abs()),
        "seq_high": shared.step_sum_rows(raw_seq_weight > upper),
        "seq_low": shared.step_sum_rows(raw_seq_weight < lower),
    }


def weight_metrics(value: dict[str, Any], log_extremes: bool, fraction_base: float) -> dict[str, float]:
    """rollout_is_mean … _seq_fraction_low from a WEIGHT_REDUCTIONS state (names without prefix).

    ``log_extremes``: max/min are exp(min(max ℓ, 20)) / exp(min ℓ) (sequence-like levels); ``fraction_base``:
    what the ratio fractions divide by (N + ε for token-weighted ones, B for row ones).
    """
    tokens, rows = value["tokens"], value["rows"]
    if log_extremes:  # §2 sequence: exp(min(max_i s_i, 20)), exp(min_i s_i)
        is_max, is_min = safe_exp(min(value["extreme_max"], CLAMP)), safe_exp(value["extreme_min"])
    else:
        is_max, is_min = value["extreme_max"], value["extreme_min"]
    return {
        "rollout_is_mean": value["weight_sum"] / (tokens + EPS),  # T[w]
        "rollout_is_max": is_max,
        "rollout_is_min": is_min,
        "rollout_is_ratio_fraction_high": value["high"] / fraction_base,
        "rollout_is_ratio_fraction_low": value["low"] / fraction_base,
        "rollout_is_std": population_std(value["clamped"]),
        "rollout_is_eff_sample_size": effective_sample_size(value["clamped"]),
        "rollout_is_seq_mean": float(value["seq_weight"][1]),
        "rollout_is_seq_std": sample_std(value["seq_weight"]),
        "rollout_is_seq_max": value["seq_weight_max"],
        "rollout_is_seq_min": value["seq_weight_min"],
        "rollout_is_seq_max_deviation": value["seq_deviation_max"],
        "rollout_is_seq_fraction_high": value["seq_high"] / rows,
        "rollout_is_seq_fraction_low": value["seq_low"] / rows,
    }


class ImportanceAccumulator(CorrectionAccumulator):
    """§2 metrics of one IS config, on w before batch normalisation, plus the batch-norm factor."""

    REDUCTIONS: ClassVar[dict[str, str]] = {
        "tokens": "sum",
        "rows": "sum",
        "valid_rows": "sum",
        **WEIGHT_REDUCTIONS,
        "oob": "sum",  # IcePop: #tokens w_raw outside [L, U]
        "valid_seq_weight_sum": "sum",  # Σ_valid q_i (sequence batch norm)
    }

    def __init__(self, config: ImportanceSampling) -> None:
        super().__init__()
        self.config = config

    def _shared_stats(self, shared: ChunkDivergences) -> dict[str, torch.Tensor]:
        config = self.config
        raw, weight = shared.importance_weights(config)
        # §2: token level T[w_raw > U]; sequence level mean_i [s_i > log U] with unclamped s_i; c = clamp(w, 0, U)
        level_log_ratio = shared.seq_log_ratio if config.level == "sequence" else None
        stats = weight_stats(shared, raw, weight, level_log_ratio, (0.0, config.lower, config.upper))
        if config.icepop:  # §2 T[w_raw < L or w_raw > U]
            oob = shared.step_sum(raw.map(lambda w: (w < config.lower) | (w > config.upper)))
        else:
            oob = torch.zeros_like(shared.step_tokens)
        seq_weight = shared.row_mean(weight)
        return {
            "tokens": shared.step_tokens,
            "rows": shared.step_rows,
            "valid_rows": shared.step_valid_rows,
            **stats,
            "oob": oob,
            "valid_seq_weight_sum": shared.step_sum_rows(torch.where(shared.valid_rows, seq_weight, 0.0)),
        }

    def _metrics(self, value: dict[str, Any]) -> dict[str, float]:
        tokens, rows = value["tokens"], value["rows"]
        config = self.config
        denominator = tokens + EPS  # T[x] = Σ m·x / (N + 1e-8)
        sequence = config.level == "sequence"
        metrics = weight_metrics(value, log_extremes=sequence, fraction_base=rows if sequence else denominator)
        if config.icepop:
            metrics["rollout_is_oob_ratio"] = value["oob"] / denominator
        if config.batch_normalize:  # §2: f = T[w] (token) or Σ_valid q_i / max(#valid, 1e-8) (sequence)
            if sequence:
                factor = value["valid_seq_weight_sum"] / max(value["valid_rows"], EPS)
            else:
                factor = value["weight_sum"] / denominator
            metrics["rollout_is_batch_norm_factor"] = factor if factor > EPS else 1.0
        return {PREFIX + name: float(v) for name, v in metrics.items()}


# --------------------------------------------------------------------------- §3 rejection sampling
class RejectionOptionAccumulator(CorrectionAccumulator):
    """§3 metrics ``rollout_rs_<option>_…`` of one option with its bounds."""

    REDUCTIONS: ClassVar[dict[str, str]] = {
        "tokens": "sum",
        "valid_rows": "sum",
        "stat_sum": "sum",  # Σ m·stat (row value broadcast for sequence options)
        "stat_max": "max",  # sequence options: over valid rows' values; token options: over model tokens
        "stat_min": "min",
        "high": "sum",  # sequence: #valid rows v > upper; token: #tokens stat > upper
        "low": "sum",
        "clamped": "moments",  # clamp(stat, lower, upper) over model tokens
        "row_value": "moments",  # v_i over valid rows
        "row_value_max": "max",
        "row_value_min": "min",
        "row_value_abs_max": "max",
        "row_high": "sum",  # #valid rows v_i > upper
        "row_low": "sum",
        "rejected_tokens": "sum",
        "rejected_rows": "sum",  # valid rows with a rejected model token
    }

    def __init__(self, option: RejectionOption) -> None:
        super().__init__()
        self.option = option

    def _shared_stats(self, shared: ChunkDivergences) -> dict[str, torch.Tensor]:
        option = self.option
        valid = shared.valid_rows
        statistic = shared.rs_statistic(option)
        row_value = shared.rs_row_value(option)
        row_high = shared.step_sum_rows(valid & (row_value > option.upper))
        row_low = shared.step_sum_rows(valid & (row_value < option.lower))
        row_value_max = shared.step_max_rows(row_value, valid)
        row_value_min = shared.step_min_rows(row_value, valid)
        if option.is_sequence:  # §3: max/min/fractions of sequence options over valid rows' values
            stat_max, stat_min, high, low = row_value_max, row_value_min, row_high, row_low
        else:
            stat_max, stat_min = shared.step_max(statistic), shared.step_min(statistic)
            high = shared.step_sum(statistic.map(lambda stat: stat > option.upper))
            low = shared.step_sum(statistic.map(lambda stat: stat < option.lower))
        rejected = shared.rs_keep(option).map(torch.logical_not)
        return {
            "tokens": shared.step_tokens,
            "valid_rows": shared.step_valid_rows,
            "stat_sum": shared.step_sum(statistic),
            "stat_max": stat_max,
            "stat_min": stat_min,
            "high": high,
            "low": low,
            "clamped": shared.step_moments(statistic.map(lambda stat: stat.clamp(option.lower, option.upper))),
            "row_value": shared.step_moments_rows(row_value, valid),
            "row_value_max": row_value_max,
            "row_value_min": row_value_min,
            "row_value_abs_max": shared.step_max_rows(row_value.abs(), valid),
            "row_high": row_high,
            "row_low": row_low,
            "rejected_tokens": shared.step_sum(rejected),
            "rejected_rows": shared.step_sum_rows(shared.rows_with(rejected)),
        }

    def _metrics(self, value: dict[str, Any]) -> dict[str, float]:
        tokens, valid = value["tokens"], value["valid_rows"]
        option = self.option
        denominator = tokens + EPS
        # §3 fractions: sequence options over valid rows, token options T[·]
        share = (lambda count: count / valid) if option.is_sequence else (lambda count: count / denominator)
        metrics = {
            "mean": value["stat_sum"] / denominator,
            "max": value["stat_max"],
            "min": value["stat_min"],
            "fraction_high": share(value["high"]),
            "fraction_low": share(value["low"]) if option.has_lower else 0.0,  # §3: _low is 0.0 for k2/k3
            "std": population_std(value["clamped"]),
        }
        seq_names = ["seq_mean", "seq_std", "seq_max", "seq_min", "seq_max_deviation", "seq_fraction_high"]
        if option.has_lower:
            seq_names.append("seq_fraction_low")
        if valid > 0:
            seq_metrics = {
                "seq_mean": float(value["row_value"][1]),
                "seq_std": sample_std(value["row_value"]),
                "seq_max": value["row_value_max"],
                "seq_min": value["row_value_min"],
                "seq_max_deviation": value["row_value_abs_max"],  # max |v|: deviation from 0
                "seq_fraction_high": value["row_high"] / valid,
                "seq_fraction_low": value["row_low"] / valid,
            }
            metrics.update({name: seq_metrics[name] for name in seq_names})
        else:  # §3: all 0.0 when no row is valid
            metrics.update(dict.fromkeys(seq_names, 0.0))
        metrics["masked_fraction"] = value["rejected_tokens"] / denominator  # §3 T[1 − keep]
        metrics["seq_masked_fraction"] = value["rejected_rows"] / valid if valid > 0 else 0.0
        return {f"{PREFIX}rollout_rs_{option.option}_{name}": float(v) for name, v in metrics.items()}


class DropCountAccumulator(CorrectionAccumulator):
    """Counts of model tokens, and of rows with a model token, that a keep rule drops (per step)."""

    REDUCTIONS: ClassVar[dict[str, str]] = {
        "tokens": "sum",
        "rows": "sum",
        "valid_rows": "sum",
        "rejected_tokens": "sum",
        "rejected_rows": "sum",  # rows (of all rows) with a rejected model token
    }

    @abstractmethod
    def kept_tokens(self, shared: ChunkDivergences) -> PerToken:
        """Keep flag of every model token under the rule."""

    def _shared_stats(self, shared: ChunkDivergences) -> dict[str, torch.Tensor]:
        rejected = self.kept_tokens(shared).map(torch.logical_not)
        return {
            "tokens": shared.step_tokens,
            "rows": shared.step_rows,
            "valid_rows": shared.step_valid_rows,
            "rejected_tokens": shared.step_sum(rejected),
            "rejected_rows": shared.step_sum_rows(shared.rows_with(rejected)),
        }


class RejectionChainAccumulator(DropCountAccumulator):
    """§3 overall: ``rollout_rs_masked_fraction`` = T[1 − final]; ``rollout_rs_seq_masked_fraction`` =
    share of all rows with a rejected model token."""

    def __init__(self, options: tuple[RejectionOption, ...]) -> None:
        super().__init__()
        self.options = options

    def kept_tokens(self, shared: ChunkDivergences) -> PerToken:
        return shared.rs_final_keep(self.options)

    def _metrics(self, value: dict[str, Any]) -> dict[str, float]:
        return {
            PREFIX + "rollout_rs_masked_fraction": value["rejected_tokens"] / (value["tokens"] + EPS),
            PREFIX + "rollout_rs_seq_masked_fraction": value["rejected_rows"] / value["rows"],
        }
