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
    row_mean,
    segment_max,
    segment_min,
    segment_moments,
    segment_sum,
)
from rollout_diag.presets import ImportanceSampling, RejectionOption

PREFIX = "rollout_corr/"


# --------------------------------------------------------------------------- shared per-chunk values
class ChunkDivergences:
    """Per-chunk tensors every correction accumulator reads, each computed once on first use.

    Token tensors are over the chunk's model tokens (mask 1, ``chunk.model``) [M]; row tensors over all
    rows [R]. Rows are whole (the reader never splits one), so row sums here are final.
    """

    def __init__(self, chunk: Chunk) -> None:
        self.chunk = chunk
        self._memo: dict[Hashable, Any] = {}

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
    def token_group(self) -> torch.Tensor:
        return self.chunk.groups.row_group[self.token_row]

    @cached_property
    def row_tokens(self) -> torch.Tensor:
        """n_i (int64 [R])."""
        return self.chunk.tokens_per_row

    @cached_property
    def valid_rows(self) -> torch.Tensor:
        """n_i > 0 (bool [R])."""
        return self.row_tokens > 0

    @property
    def group_count(self) -> int:
        return self.chunk.groups.count

    # -- reductions --------------------------------------------------------------------------------
    def row_sum(self, token_values: torch.Tensor) -> torch.Tensor:
        """S_i[x] for every row (float64 [R])."""
        return segment_sum(token_values, self.token_row, self.chunk.rows)

    def row_mean(self, token_values: torch.Tensor) -> torch.Tensor:
        """R_i[x] = S_i[x] / (n_i + 1e-8) (Notation; 0 for an empty row)."""
        return row_mean(self.row_sum(token_values), self.row_tokens)

    def rows_with(self, token_flags: torch.Tensor) -> torch.Tensor:
        """Rows with at least one flagged model token (bool [R])."""
        return self.row_sum(token_flags.to(torch.float64)) > 0

    def step_sum_tokens(self, token_values: torch.Tensor) -> torch.Tensor:
        return segment_sum(token_values, self.token_group, self.group_count)

    def step_sum_rows(self, row_values: torch.Tensor) -> torch.Tensor:
        return segment_sum(row_values, self.chunk.groups.row_group, self.group_count)

    def step_max_tokens(self, token_values: torch.Tensor) -> torch.Tensor:
        return segment_max(token_values, self.token_group, self.group_count)

    def step_min_tokens(self, token_values: torch.Tensor) -> torch.Tensor:
        return segment_min(token_values, self.token_group, self.group_count)

    def step_max_rows(self, row_values: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Max per step over all rows, or over the rows flagged in ``rows`` (−inf where none)."""
        values = row_values if rows is None else row_values.masked_fill(~rows, -math.inf)
        return segment_max(values, self.chunk.groups.row_group, self.group_count)

    def step_min_rows(self, row_values: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        values = row_values if rows is None else row_values.masked_fill(~rows, math.inf)
        return segment_min(values, self.chunk.groups.row_group, self.group_count)

    def step_moments_tokens(self, token_values: torch.Tensor) -> torch.Tensor:
        """[n, mean, ·, M2, ·, ·] per step over model tokens (base.segment_moments, second value unused)."""
        return segment_moments(token_values, torch.zeros_like(token_values), self.token_group, self.group_count)

    def step_moments_rows(self, row_values: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Moments per step over all rows, or over the rows flagged in ``rows``."""
        group = self.chunk.groups.row_group
        if rows is not None:
            row_values, group = row_values[rows], group[rows]
        return segment_moments(row_values, torch.zeros_like(row_values), group, self.group_count)

    @cached_property
    def step_tokens(self) -> torch.Tensor:
        return self.step_sum_rows(self.row_tokens)

    @cached_property
    def step_rows(self) -> torch.Tensor:
        return self.step_sum_rows(torch.ones(self.chunk.rows, dtype=torch.float64, device=self.chunk.device))

    @cached_property
    def step_valid_rows(self) -> torch.Tensor:
        return self.step_sum_rows(self.valid_rows)

    # -- divergences -------------------------------------------------------------------------------
    @property
    def log_ratio(self) -> torch.Tensor:
        """δ = a − r per model token, unclamped."""
        return self.chunk.model.log_ratio

    @cached_property
    def clamped_log_ratio(self) -> torch.Tensor:
        """clamp20(δ)."""
        return clamp20(self.log_ratio)

    @cached_property
    def seq_log_ratio(self) -> torch.Tensor:
        """s_i = S_i[δ] (unclamped, every row; 0 for an empty row)."""
        return self.row_sum(self.log_ratio)

    def token_statistic(self, statistic: str) -> torch.Tensor:
        """§3: k1 = −clamp20(δ), k2 = ½·clamp20(δ)², k3 = exp(clamp20(δ)) − 1 − clamp20(δ) per model token."""

        def compute() -> torch.Tensor:
            x = self.clamped_log_ratio
            if statistic == "k1":
                return -x
            if statistic == "k2":
                return 0.5 * x * x
            return torch.exp(x) - 1.0 - x  # not expm1: the same rounding as verl and the reference

        return self.memo(("statistic", statistic), compute)

    def rs_row_value(self, option: RejectionOption) -> torch.Tensor:
        """§3 v_i per row: S_i[k] (seq_sum), R_i[k] (seq_mean and token options), max (seq_max, 0 if empty)."""

        def compute() -> torch.Tensor:
            stat = self.token_statistic(option.statistic)
            if option.scope == "seq_sum":
                return self.row_sum(stat)
            if option.scope == "seq_max":
                row_max = segment_max(stat, self.token_row, self.chunk.rows)
                return torch.where(self.valid_rows, row_max, torch.zeros_like(row_max))
            return self.row_mean(stat)

        return self.memo(("row_value", option.scope, option.statistic), compute)

    def rs_token_value(self, option: RejectionOption) -> torch.Tensor:
        """§3 per-token statistic: the token's own value, or its row's value broadcast (sequence options)."""
        if option.is_sequence:
            return self.rs_row_value(option)[self.token_row]
        return self.token_statistic(option.statistic)

    def rs_keep(self, option: RejectionOption) -> torch.Tensor:
        """§3 keep flag per model token: k1 log L ≤ stat ≤ log U; k2/k3 stat ≤ U (rows kept or not whole)."""

        def compute() -> torch.Tensor:
            stat = self.rs_row_value(option) if option.is_sequence else self.token_statistic(option.statistic)
            keep = stat <= option.upper
            if option.has_lower:
                keep = keep & (stat >= option.lower)
            return keep[self.token_row] if option.is_sequence else keep

        return self.memo(("keep", option), compute)

    def rs_final_keep(self, options: tuple[RejectionOption, ...]) -> torch.Tensor:
        """§3 final mask on model tokens: Π(option keeps)."""

        def compute() -> torch.Tensor:
            keep = torch.ones_like(self.log_ratio, dtype=torch.bool)
            for option in options:
                keep = keep & self.rs_keep(option)
            return keep

        return self.memo(("final_keep", options), compute)

    def importance_weights(self, config: ImportanceSampling) -> tuple[torch.Tensor, torch.Tensor]:
        """§2 (w_raw, w) per model token: token exp(clamp20(δ)), sequence exp(clamp20(s_i)) broadcast;
        TIS w = min(w_raw, U), IcePop w = w_raw inside [L, U] else 0."""

        def compute() -> tuple[torch.Tensor, torch.Tensor]:
            if config.level == "token":
                raw = torch.exp(self.clamped_log_ratio)
            else:
                raw = torch.exp(clamp20(self.seq_log_ratio))[self.token_row]
            if config.icepop:
                inside = (raw >= config.lower) & (raw <= config.upper)
                return raw, torch.where(inside, raw, torch.zeros_like(raw))
            return raw, raw.clamp(max=config.upper)

        return self.memo(("is", config.level, config.upper, config.lower, config.icepop), compute)


class CorrectionAccumulator(StepAccumulator, ABC):
    """A StepAccumulator that reads a :class:`ChunkDivergences` shared by all accumulators of a pass.

    ``update_shared(shared)`` uses the given one; plain ``update(chunk)`` builds its own, so each class
    also works alone.
    """

    def __init__(self) -> None:
        super().__init__()
        self._shared: ChunkDivergences | None = None

    def update_shared(self, shared: ChunkDivergences) -> None:
        self._shared = shared
        try:
            self.update(shared.chunk)
        finally:
            self._shared = None

    def _stats(self, chunk: Chunk) -> dict[str, torch.Tensor]:
        shared = self._shared
        if shared is None or shared.chunk is not chunk:
            shared = ChunkDivergences(chunk)
        return self._shared_stats(shared)

    @abstractmethod
    def _shared_stats(self, shared: ChunkDivergences) -> dict[str, torch.Tensor]:
        """Partial state of each step group: name -> tensor [G, ...]."""


# --------------------------------------------------------------------------- finalize helpers
def population_std(moments: np.ndarray) -> float:
    """§2/§3 ``_std``: sqrt(max(T[c²] − T[c]², 0)) when N > 1, else 0, from [N, mean, ·, M2, ·, ·].

    With Σc = N·mean and Σc² = M2 + N·mean², T[c²] − T[c]² = (M2·(N+ε) + N·mean²·ε) / (N+ε)²: the same
    value as verl's formula without its cancellation, and chunking-invariant.
    """
    count, mean, m2 = float(moments[0]), float(moments[1]), float(moments[3])
    if count <= 1:
        return 0.0
    denominator = count + EPS
    variance = (m2 * denominator + count * mean * mean * EPS) / (denominator * denominator)
    return math.sqrt(max(variance, 0.0))


def effective_sample_size(moments: np.ndarray) -> float:
    """§2 ESS = 1 / T[(c / (T[c] + ε))²] = (T[c] + ε)² · (N + ε) / Σc², from [N, mean, ·, M2, ·, ·].

    All-zero weights (IcePop rejecting every token) give 1/0: inf (verl raises there).
    """
    count, mean, m2 = float(moments[0]), float(moments[1]), float(moments[3])
    sum_squares = m2 + count * mean * mean
    if sum_squares <= 0:
        return math.inf
    token_mean = count * mean / (count + EPS)
    return (token_mean + EPS) ** 2 * (count + EPS) / sum_squares


def sample_std(moments: np.ndarray) -> float:
    """Notation: unbiased (n−1) std over rows; 0 with fewer than 2 values."""
    count, m2 = float(moments[0]), float(moments[3])
    return math.sqrt(max(m2, 0.0) / (count - 1)) if count >= 2 else 0.0


def safe_exp(value: float) -> float:
    """exp that gives inf instead of raising on overflow (a row's summed log ratio can be huge)."""
    with np.errstate(over="ignore"):
        return float(np.exp(value))


def log_bound(ratio: float | None, missing: float) -> float:
    """log of a ratio bound; log 0 = −inf, and ``missing`` (±inf) when there is no bound."""
    if ratio is None:
        return missing
    return math.log(ratio) if ratio > 0 else -math.inf


def values_of(state: State) -> dict[str, Any]:
    """Scalars as floats, moment vectors as arrays."""
    return {name: (array if np.ndim(array) else as_float(array)) for name, array in state.items()}


# --------------------------------------------------------------------------- §2 IS weights
class ImportanceAccumulator(CorrectionAccumulator):
    """§2 metrics of one IS config, on w before batch normalisation, plus the batch-norm factor."""

    REDUCTIONS: ClassVar[dict[str, str]] = {
        "tokens": "sum",
        "rows": "sum",
        "valid_rows": "sum",
        "weight_sum": "sum",  # Σ m·w
        "extreme_max": "max",  # token: max w over model tokens; sequence: max_i s_i over all rows
        "extreme_min": "min",
        "high": "sum",  # token: #tokens w_raw > U; sequence: #rows s_i > log U
        "low": "sum",
        "clamped": "moments",  # c = clamp(w, 0, U) over model tokens
        "seq_weight": "moments",  # q_i = R_i[w] over all rows
        "seq_weight_max": "max",
        "seq_weight_min": "min",
        "seq_deviation_max": "max",  # max_i |q_i − 1|
        "seq_high": "sum",  # #rows R_i[w_raw] > U
        "seq_low": "sum",
        "oob": "sum",  # IcePop: #tokens w_raw outside [L, U]
        "valid_seq_weight_sum": "sum",  # Σ_valid q_i (sequence batch norm)
    }

    def __init__(self, config: ImportanceSampling) -> None:
        super().__init__()
        self.config = config

    def _shared_stats(self, shared: ChunkDivergences) -> dict[str, torch.Tensor]:
        config = self.config
        raw, weight = shared.importance_weights(config)
        seq_weight = shared.row_mean(weight)  # §2 q_i = R_i[w], every row
        raw_seq_weight = shared.row_mean(raw)  # §2 R_i[w_raw] for the seq fractions
        if config.level == "token":
            extreme_max, extreme_min = shared.step_max_tokens(weight), shared.step_min_tokens(weight)
            high = shared.step_sum_tokens(raw > config.upper)  # §2 T[w_raw > U]
            low = shared.step_sum_tokens(raw < config.lower)  # §2 T[w_raw < L']
        else:
            seq_log_ratio = shared.seq_log_ratio  # §2 sequence max/min/fractions use unclamped s_i
            extreme_max, extreme_min = shared.step_max_rows(seq_log_ratio), shared.step_min_rows(seq_log_ratio)
            high = shared.step_sum_rows(seq_log_ratio > math.log(config.upper))  # mean_i [s_i > log U]
            low = shared.step_sum_rows(seq_log_ratio < math.log(config.lower))
        if config.icepop:  # §2 T[w_raw < L or w_raw > U]
            oob = shared.step_sum_tokens((raw < config.lower) | (raw > config.upper))
        else:
            oob = torch.zeros_like(shared.step_tokens)
        return {
            "tokens": shared.step_tokens,
            "rows": shared.step_rows,
            "valid_rows": shared.step_valid_rows,
            "weight_sum": shared.step_sum_tokens(weight),
            "extreme_max": extreme_max,
            "extreme_min": extreme_min,
            "high": high,
            "low": low,
            "clamped": shared.step_moments_tokens(weight.clamp(0.0, config.upper)),  # §2 c = clamp(w, 0, U)
            "seq_weight": shared.step_moments_rows(seq_weight),
            "seq_weight_max": shared.step_max_rows(seq_weight),
            "seq_weight_min": shared.step_min_rows(seq_weight),
            "seq_deviation_max": shared.step_max_rows((seq_weight - 1.0).abs()),
            "seq_high": shared.step_sum_rows(raw_seq_weight > config.upper),
            "seq_low": shared.step_sum_rows(raw_seq_weight < config.lower),
            "oob": oob,
            "valid_seq_weight_sum": shared.step_sum_rows(torch.where(shared.valid_rows, seq_weight, 0.0)),
        }

    def _finalize(self, state: State) -> dict[str, float]:
        value = values_of(state)
        tokens, rows = value["tokens"], value["rows"]
        if tokens == 0:
            return {}  # §1: a step with N = 0 has no metrics
        config = self.config
        denominator = tokens + EPS  # T[x] = Σ m·x / (N + 1e-8)
        if config.level == "token":
            is_max, is_min = value["extreme_max"], value["extreme_min"]
            fraction_high, fraction_low = value["high"] / denominator, value["low"] / denominator
        else:  # §2 sequence: exp(min(max_i s_i, 20)), exp(min_i s_i), fractions over all rows
            is_max, is_min = safe_exp(min(value["extreme_max"], CLAMP)), safe_exp(value["extreme_min"])
            fraction_high, fraction_low = value["high"] / rows, value["low"] / rows
        metrics = {
            "rollout_is_mean": value["weight_sum"] / denominator,
            "rollout_is_max": is_max,
            "rollout_is_min": is_min,
            "rollout_is_ratio_fraction_high": fraction_high,
            "rollout_is_ratio_fraction_low": fraction_low,
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
        if config.icepop:
            metrics["rollout_is_oob_ratio"] = value["oob"] / denominator
        if config.batch_normalize:  # §2: f = T[w] (token) or Σ_valid q_i / max(#valid, 1e-8) (sequence)
            if config.level == "token":
                factor = value["weight_sum"] / denominator
            else:
                factor = value["valid_seq_weight_sum"] / max(value["valid_rows"], EPS)
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
        token_value = shared.rs_token_value(option)
        row_value = shared.rs_row_value(option)
        row_high = shared.step_sum_rows(valid & (row_value > option.upper))
        row_low = shared.step_sum_rows(valid & (row_value < option.lower))
        row_value_max = shared.step_max_rows(row_value, valid)
        row_value_min = shared.step_min_rows(row_value, valid)
        if option.is_sequence:  # §3: max/min/fractions of sequence options over valid rows' values
            stat_max, stat_min, high, low = row_value_max, row_value_min, row_high, row_low
        else:
            stat_max, stat_min = shared.step_max_tokens(token_value), shared.step_min_tokens(token_value)
            high = shared.step_sum_tokens(token_value > option.upper)
            low = shared.step_sum_tokens(token_value < option.lower)
        rejected = ~shared.rs_keep(option)
        return {
            "tokens": shared.step_tokens,
            "valid_rows": shared.step_valid_rows,
            "stat_sum": shared.step_sum_tokens(token_value),
            "stat_max": stat_max,
            "stat_min": stat_min,
            "high": high,
            "low": low,
            "clamped": shared.step_moments_tokens(token_value.clamp(option.lower, option.upper)),
            "row_value": shared.step_moments_rows(row_value, valid),
            "row_value_max": row_value_max,
            "row_value_min": row_value_min,
            "row_value_abs_max": shared.step_max_rows(row_value.abs(), valid),
            "row_high": row_high,
            "row_low": row_low,
            "rejected_tokens": shared.step_sum_tokens(rejected),
            "rejected_rows": shared.step_sum_rows(shared.rows_with(rejected)),
        }

    def _finalize(self, state: State) -> dict[str, float]:
        value = values_of(state)
        tokens, valid = value["tokens"], value["valid_rows"]
        if tokens == 0:
            return {}  # §1: a step with N = 0 has no metrics
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
        "rejected_tokens": "sum",
        "rejected_rows": "sum",  # rows (of all rows) with a rejected model token
    }

    @abstractmethod
    def kept_tokens(self, shared: ChunkDivergences) -> torch.Tensor:
        """bool [M]: the model tokens the rule keeps."""

    def _shared_stats(self, shared: ChunkDivergences) -> dict[str, torch.Tensor]:
        rejected = ~self.kept_tokens(shared)
        return {
            "tokens": shared.step_tokens,
            "rows": shared.step_rows,
            "rejected_tokens": shared.step_sum_tokens(rejected),
            "rejected_rows": shared.step_sum_rows(shared.rows_with(rejected)),
        }


class RejectionChainAccumulator(DropCountAccumulator):
    """§3 overall: ``rollout_rs_masked_fraction`` = T[1 − final]; ``rollout_rs_seq_masked_fraction`` =
    share of all rows with a rejected model token."""

    def __init__(self, options: tuple[RejectionOption, ...]) -> None:
        super().__init__()
        self.options = options

    def kept_tokens(self, shared: ChunkDivergences) -> torch.Tensor:
        return shared.rs_final_keep(self.options)

    def _finalize(self, state: State) -> dict[str, float]:
        value = values_of(state)
        if value["tokens"] == 0:
            return {}
        return {
            PREFIX + "rollout_rs_masked_fraction": value["rejected_tokens"] / (value["tokens"] + EPS),
            PREFIX + "rollout_rs_seq_masked_fraction": value["rejected_rows"] / value["rows"],
        }
