"""The legacy IS family (METRICS.md §8): the xtuner / early-verl "mismatch" helper, keys ``mismatch/rollout_is_*``.

As in that helper, every metric is taken on the safety-bounded raw weight w = exp(clamp20(ℓ)) before the
mode acts (truncation changes the weights a trainer would use, not the metrics); std and ESS use
clamp(w, L, U). Mask mode rejects tokens whose w is outside the mask bounds; the veto rejects a whole
row when any model token has ρ = exp(δ) outside the veto bounds.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch

from rollout_diag.metrics.base import CLAMP, EPS, State, clamp20
from rollout_diag.metrics.correction import (
    ChunkDivergences,
    CorrectionAccumulator,
    effective_sample_size,
    log_bound,
    population_std,
    safe_exp,
    sample_std,
    values_of,
)
from rollout_diag.presets import LegacyCorrection

PREFIX = "mismatch/"


def legacy_log_ratio(shared: ChunkDivergences, level: str) -> torch.Tensor:
    """§8 ℓ, unclamped: token δ per model token; sequence S_i[δ], geometric R_i[δ] per row."""
    if level == "token":
        return shared.log_ratio
    if level == "sequence":
        return shared.seq_log_ratio
    return shared.memo(("legacy_geometric",), lambda: shared.row_mean(shared.log_ratio))


def legacy_weights(shared: ChunkDivergences, level: str) -> torch.Tensor:
    """§8 w = exp(clamp20(ℓ)) per model token (row value broadcast for sequence / geometric)."""

    def compute() -> torch.Tensor:
        if level == "token":
            return torch.exp(shared.clamped_log_ratio)
        return torch.exp(clamp20(legacy_log_ratio(shared, level)))[shared.token_row]

    return shared.memo(("legacy_weights", level), compute)


def legacy_catastrophic(shared: ChunkDivergences, config: LegacyCorrection) -> torch.Tensor:
    """§8 veto: model tokens with ρ outside the veto bounds, tested in log space on unclamped δ (bool [M])."""

    def compute() -> torch.Tensor:
        lower, upper = log_bound(config.veto_lower, -math.inf), log_bound(config.veto_upper, math.inf)
        return (shared.log_ratio < lower) | (shared.log_ratio > upper)

    return shared.memo(("legacy_veto", config.veto_lower, config.veto_upper), compute)


def legacy_mask_keep(shared: ChunkDivergences, config: LegacyCorrection) -> torch.Tensor:
    """§8 mask mode: model tokens whose w lies in [mask lower, mask upper] (all True in truncate mode)."""

    def compute() -> torch.Tensor:
        weight = legacy_weights(shared, config.level)
        if not config.masks:
            return torch.ones_like(weight, dtype=torch.bool)
        return (weight >= config.mask_lower) & (weight <= config.mask_upper)

    return shared.memo(("legacy_mask", config.level, config.mode, config.mask_lower, config.mask_upper), compute)


def legacy_keep(shared: ChunkDivergences, config: LegacyCorrection) -> torch.Tensor:
    """§8 modified mask on model tokens: mask-mode keep × no veto on the row (bool [M])."""
    vetoed_rows = shared.rows_with(legacy_catastrophic(shared, config))
    return legacy_mask_keep(shared, config) & ~vetoed_rows[shared.token_row]


class LegacyAccumulator(CorrectionAccumulator):
    """§8 metrics of one legacy config."""

    REDUCTIONS: ClassVar[dict[str, str]] = {
        "tokens": "sum",
        "rows": "sum",
        "weight_sum": "sum",  # Σ m·w
        "extreme_max": "max",  # token: max w over model tokens; sequence/geometric: max_i ℓ_i over all rows
        "extreme_min": "min",
        "high": "sum",  # token/geometric: #tokens above U; sequence: #rows ℓ_i > log U
        "low": "sum",
        "clamped": "moments",  # clamp(w, L, U) over model tokens
        "seq_weight": "moments",  # q_i = R_i[w] over all rows
        "seq_weight_max": "max",
        "seq_weight_min": "min",
        "seq_deviation_max": "max",
        "seq_high": "sum",  # #rows q_i > U
        "seq_low": "sum",
        "catastrophic_tokens": "sum",
        "vetoed_rows": "sum",
        "masked_tokens": "sum",  # mask mode: #tokens with w outside the mask bounds
        "masked_rows": "sum",  # token level: rows with a masked token; sequence/geometric: rows whose w is outside
    }

    def __init__(self, config: LegacyCorrection) -> None:
        super().__init__()
        self.config = config

    def _shared_stats(self, shared: ChunkDivergences) -> dict[str, torch.Tensor]:
        config = self.config
        weight = legacy_weights(shared, config.level)
        log_upper, log_lower = log_bound(config.upper, math.inf), log_bound(config.lower, -math.inf)
        if config.level == "token":
            extreme_max, extreme_min = shared.step_max_tokens(weight), shared.step_min_tokens(weight)
            high = shared.step_sum_tokens(weight > config.upper)
            low = shared.step_sum_tokens(weight < config.lower)
        else:  # §8 as §2 sequence: max/min from unclamped ℓ_i over all rows
            level_log_ratio = legacy_log_ratio(shared, config.level)
            extreme_max, extreme_min = shared.step_max_rows(level_log_ratio), shared.step_min_rows(level_log_ratio)
            row_high, row_low = level_log_ratio > log_upper, level_log_ratio < log_lower
            if config.level == "sequence":  # fractions over all rows
                high, low = shared.step_sum_rows(row_high), shared.step_sum_rows(row_low)
            else:  # geometric: the row flags broadcast to tokens, token-weighted
                high = shared.step_sum_tokens(row_high[shared.token_row])
                low = shared.step_sum_tokens(row_low[shared.token_row])
        seq_weight = shared.row_mean(weight)
        catastrophic = legacy_catastrophic(shared, config)
        masked = ~legacy_mask_keep(shared, config)
        if config.level == "token":
            masked_rows = shared.rows_with(masked)
        else:  # the helper reads the row's (broadcast) flag at position 0: empty rows have w = exp(0) = 1
            row_weight = torch.exp(clamp20(legacy_log_ratio(shared, config.level)))
            row_kept = (row_weight >= config.mask_lower) & (row_weight <= config.mask_upper)
            masked_rows = ~row_kept if config.masks else torch.zeros_like(row_kept)
        return {
            "tokens": shared.step_tokens,
            "rows": shared.step_rows,
            "weight_sum": shared.step_sum_tokens(weight),
            "extreme_max": extreme_max,
            "extreme_min": extreme_min,
            "high": high,
            "low": low,
            "clamped": shared.step_moments_tokens(weight.clamp(config.lower, config.upper)),
            "seq_weight": shared.step_moments_rows(seq_weight),
            "seq_weight_max": shared.step_max_rows(seq_weight),
            "seq_weight_min": shared.step_min_rows(seq_weight),
            "seq_deviation_max": shared.step_max_rows((seq_weight - 1.0).abs()),
            "seq_high": shared.step_sum_rows(seq_weight > config.upper),
            "seq_low": shared.step_sum_rows(seq_weight < config.lower),
            "catastrophic_tokens": shared.step_sum_tokens(catastrophic),
            "vetoed_rows": shared.step_sum_rows(shared.rows_with(catastrophic)),
            "masked_tokens": shared.step_sum_tokens(masked),
            "masked_rows": shared.step_sum_rows(masked_rows),
        }

    def _finalize(self, state: State) -> dict[str, float]:
        value = values_of(state)
        tokens, rows = value["tokens"], value["rows"]
        if tokens == 0:
            return {}  # §1: a step with N = 0 has no metrics
        config = self.config
        denominator = tokens + EPS
        if config.level == "token":
            is_max, is_min = value["extreme_max"], value["extreme_min"]
        else:
            is_max, is_min = safe_exp(min(value["extreme_max"], CLAMP)), safe_exp(value["extreme_min"])
        fraction_base = rows if config.level == "sequence" else denominator
        metrics = {
            "rollout_is_veto_fraction": value["vetoed_rows"] / rows,
            "rollout_is_catastrophic_token_fraction": value["catastrophic_tokens"] / denominator,
            "rollout_is_max": is_max,
            "rollout_is_min": is_min,
            "rollout_is_mean": value["weight_sum"] / denominator,
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
        if config.masks:
            metrics["rollout_is_masked_fraction"] = value["masked_tokens"] / denominator
            metrics["rollout_is_seq_masked_fraction"] = value["masked_rows"] / rows
        return {PREFIX + name: float(v) for name, v in metrics.items()}
