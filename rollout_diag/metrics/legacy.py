"""The legacy IS family (METRICS.md §8): the xtuner / early-verl "mismatch" helper, keys ``mismatch/rollout_is_*``.

As in that helper, every metric is taken on the safety-bounded raw weight w = exp(clamp20(ℓ)) before the
mode acts (truncation changes the weights a trainer would use, not the metrics); std and ESS use
clamp(w, L, U). Mask mode rejects tokens whose w is outside the mask bounds; the veto rejects a whole
row when any model token has ρ = exp(δ) outside the veto bounds.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch

from rollout_diag.metrics.base import EPS, clamp20, row_mean
from rollout_diag.metrics.correction import (
    WEIGHT_REDUCTIONS,
    ChunkDivergences,
    CorrectionAccumulator,
    PerToken,
    log_bound,
    weight_metrics,
    weight_stats,
)
from rollout_diag.presets import LegacyCorrection

PREFIX = "mismatch/"


def legacy_log_ratio(shared: ChunkDivergences, level: str) -> torch.Tensor:
    """§8 ℓ per row, unclamped: S_i[δ] (sequence) or R_i[δ] (geometric)."""
    if level == "sequence":
        return shared.seq_log_ratio
    return shared.memo(("legacy_geometric",), lambda: row_mean(shared.seq_log_ratio, shared.row_tokens))


def legacy_weights(shared: ChunkDivergences, level: str) -> PerToken:
    """§8 w = exp(clamp20(ℓ)): per token (token level) or per row (sequence / geometric)."""

    def compute() -> PerToken:
        if level == "token":
            return PerToken(torch.exp(shared.clamped_log_ratio))
        return PerToken(torch.exp(clamp20(legacy_log_ratio(shared, level))), by_row=True)

    return shared.memo(("legacy_weights", level), compute)


def legacy_catastrophic(shared: ChunkDivergences, config: LegacyCorrection) -> PerToken:
    """§8 veto: model tokens with ρ outside the veto bounds, tested in log space on unclamped δ."""

    def compute() -> PerToken:
        lower, upper = log_bound(config.veto_lower, -math.inf), log_bound(config.veto_upper, math.inf)
        return PerToken((shared.log_ratio < lower) | (shared.log_ratio > upper))

    return shared.memo(("legacy_veto", config.veto_lower, config.veto_upper), compute)


def legacy_mask_keep(shared: ChunkDivergences, config: LegacyCorrection) -> PerToken:
    """§8 mask mode: w inside [mask lower, mask upper] (row-level for sequence / geometric, where an empty
    row has w = exp(0) = 1); all True in truncate mode."""

    def compute() -> PerToken:
        weight = legacy_weights(shared, config.level)
        if not config.masks:
            return weight.map(lambda w: torch.ones_like(w, dtype=torch.bool))
        return weight.map(lambda w: (w >= config.mask_lower) & (w <= config.mask_upper))

    return shared.memo(("legacy_mask", config.level, config.mode, config.mask_lower, config.mask_upper), compute)


def legacy_keep(shared: ChunkDivergences, config: LegacyCorrection) -> PerToken:
    """§8 modified mask on model tokens: mask-mode keep × no veto on the row."""
    vetoed_rows = shared.rows_with(legacy_catastrophic(shared, config))
    return shared.both(legacy_mask_keep(shared, config), PerToken(~vetoed_rows, by_row=True))


class LegacyAccumulator(CorrectionAccumulator):
    """§8 metrics of one legacy config."""

    REDUCTIONS: ClassVar[dict[str, str]] = {
        "tokens": "sum",
        "rows": "sum",
        **WEIGHT_REDUCTIONS,  # with w the raw weight and c = clamp(w, L, U)
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
        weight = legacy_weights(shared, config.level)  # metrics on the raw w: w_raw = w here
        level_log_ratio = None if config.level == "token" else legacy_log_ratio(shared, config.level)
        bounds = (config.lower, config.lower, config.upper)  # c = clamp(w, L, U)
        # geometric fractions are token-weighted (row flags broadcast), sequence ones over all rows
        stats = weight_stats(shared, weight, weight, level_log_ratio, bounds, config.level == "geometric")
        catastrophic = legacy_catastrophic(shared, config)
        mask_keep = legacy_mask_keep(shared, config)
        masked = mask_keep.map(torch.logical_not)
        # token level: rows with a masked token; sequence/geometric: the helper reads each row's broadcast flag
        masked_rows = masked.values if mask_keep.by_row else shared.rows_with(masked)
        return {
            "tokens": shared.step_tokens,
            "rows": shared.step_rows,
            **stats,
            "catastrophic_tokens": shared.step_sum(catastrophic),
            "vetoed_rows": shared.step_sum_rows(shared.rows_with(catastrophic)),
            "masked_tokens": shared.step_sum(masked),
            "masked_rows": shared.step_sum_rows(masked_rows),
        }

    def _metrics(self, value: dict[str, Any]) -> dict[str, float]:
        tokens, rows = value["tokens"], value["rows"]
        config = self.config
        denominator = tokens + EPS
        metrics = {
            "rollout_is_veto_fraction": value["vetoed_rows"] / rows,
            "rollout_is_catastrophic_token_fraction": value["catastrophic_tokens"] / denominator,
            **weight_metrics(
                value,
                log_extremes=config.level != "token",
                fraction_base=rows if config.level == "sequence" else denominator,
            ),
        }
        if config.masks:
            metrics["rollout_is_masked_fraction"] = value["masked_tokens"] / denominator
            metrics["rollout_is_seq_masked_fraction"] = value["masked_rows"] / rows
        return {PREFIX + name: float(v) for name, v in metrics.items()}
