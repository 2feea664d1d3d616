"""The legacy IS family (METRICS.md §8): the xtuner / early-verl "mismatch" helper, keys ``mismatch/rollout_is_*``.

As in that helper, every metric is taken on the safety-bounded raw weight w = exp(clamp20(ℓ)) before the
mode acts (truncation changes the weights a trainer would use, not the metrics); std and ESS use
clamp(w, L, U). Mask mode rejects tokens whose w is outside the mask bounds; the veto rejects a whole
row when any model token has ρ = exp(δ) outside the veto bounds.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from rollout_diag import catalogue
from rollout_diag.engine import arrays
from rollout_diag.engine.arrays import Array
from rollout_diag.engine.formulas import clamp20, derived, row_mean
from rollout_diag.engine.stats import ChunkStats, PerToken
from rollout_diag.metrics.correction import (
    WEIGHT_REDUCTIONS,
    CorrectionAccumulator,
    log_bound,
    rejection_counts,
    sequence_log_ratio,
    sequence_weight,
    token_denominator,
    token_weight_names,
    weight_metrics,
    weight_stats,
)
from rollout_diag.presets import LegacyCorrection

PREFIX = catalogue.LEGACY_PREFIX


def legacy_log_ratio(s: ChunkStats, level: str) -> Array:
    """§8 ℓ per row, unclamped: S_i[δ] (sequence) or R_i[δ] (geometric)."""
    if level == "sequence":
        return sequence_log_ratio(s)
    return s.memo("legacy_geometric", lambda: row_mean(sequence_log_ratio(s), s.row_count))


def legacy_weights(s: ChunkStats, level: str) -> PerToken:
    """§8 w = exp(clamp20(ℓ)): per token (token level) or per row (sequence / geometric); the token and sequence
    weights are §2's w_raw, shared with the IS accumulators; numpy's exp on the CPU (``arrays.host_exp``)."""
    if level == "token":
        return PerToken.quantity(s, "token_is_weight")
    if level == "sequence":
        return sequence_weight(s)
    return s.memo(
        "legacy_geometric_weight", lambda: PerToken(arrays.host_exp(clamp20(legacy_log_ratio(s, level))), by_row=True)
    )


def legacy_catastrophic(s: ChunkStats, config: LegacyCorrection) -> PerToken:
    """§8 veto: model tokens with ρ outside the veto bounds, tested in log space on unclamped δ."""

    def compute() -> PerToken:
        lower, upper = log_bound(config.veto_lower, -math.inf), log_bound(config.veto_upper, math.inf)
        log_ratio = s.token("log_ratio")
        return PerToken((log_ratio < lower) | (log_ratio > upper))

    return s.memo(("legacy_veto", config.veto_lower, config.veto_upper), compute)


def legacy_mask_keep(s: ChunkStats, config: LegacyCorrection) -> PerToken:
    """§8 mask mode: w inside [mask lower, mask upper] (row-level for sequence / geometric, where an empty
    row has w = exp(0) = 1); all True in truncate mode (a per-row flag: nothing to compute per token)."""

    def compute() -> PerToken:
        if not config.masks:
            return PerToken(arrays.ones(s.chunk.rows, s.chunk.trainer, "bool"), by_row=True)
        weight = legacy_weights(s, config.level)
        return weight.map(lambda w: (w >= config.mask_lower) & (w <= config.mask_upper))

    return s.memo(("legacy_mask", config.level, config.mode, config.mask_lower, config.mask_upper), compute)


def veto_name(config: LegacyCorrection) -> str:
    """The derived flag of §8's vetoed tokens: δ outside the veto bounds in log space (unclamped δ)."""
    return derived(
        "log_ratio", "beyond", log_bound(config.veto_lower, -math.inf), log_bound(config.veto_upper, math.inf)
    )


def mask_name(config: LegacyCorrection) -> str:
    """The derived flag of §8 token-level mask mode's masked tokens: w outside the mask bounds."""
    return derived("token_is_weight", "outside", config.mask_lower, config.mask_upper)


def legacy_rejections(s: ChunkStats, config: LegacyCorrection) -> tuple[Array, list[str]]:
    """What §8 rejects: rows (vetoed, or outside the mask at sequence / geometric level) and the named token flag of
    token-level masking."""
    rows = s.row_sum(veto_name(config)) > 0
    if config.masks and config.level != "token":
        rows = rows | ~legacy_mask_keep(s, config).values
    return rows, [mask_name(config)] if config.masks and config.level == "token" else []


def legacy_keep(s: ChunkStats, config: LegacyCorrection) -> PerToken:
    """§8 modified mask on model tokens: mask-mode keep × no veto on the row."""
    vetoed_rows = s.rows_with(legacy_catastrophic(s, config))
    return s.both(legacy_mask_keep(s, config), PerToken(~vetoed_rows, by_row=True))


def legacy_weight_stats(s: ChunkStats, level: str, lower: float, upper: float) -> dict[str, Array]:
    """§8 weight summary (WEIGHT_REDUCTIONS) of one level and bounds, shared by the configs that differ only in
    mode or veto (truncate and mask at the same bounds report the same weights)."""

    def compute() -> dict[str, Array]:
        weight = legacy_weights(s, level)  # metrics on the raw w: w_raw = w here
        level_log_ratio = None if level == "token" else legacy_log_ratio(s, level)
        # c = clamp(w, L, U); geometric fractions are token-weighted (row flags broadcast), sequence ones over rows
        return weight_stats(s, weight, weight, level_log_ratio, (lower, lower, upper), level == "geometric")

    return s.memo(("legacy_weight_stats", level, lower, upper), compute)


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

    def token_quantities(self) -> tuple[list[str], list[str]]:
        config = self.config
        names, moments = [veto_name(config)], list[str]()
        if config.level == "token":
            weight_names, moments = token_weight_names("token_is_weight", config.lower, config.lower, config.upper)
            names += weight_names
            if config.masks:
                names.append(mask_name(config))
        return names, moments

    def shared_stats(self, s: ChunkStats) -> dict[str, Array]:
        config = self.config
        weights = legacy_weight_stats(s, config.level, config.lower, config.upper)
        catastrophic_tokens, vetoed_rows = rejection_counts(s, s.row_sum(veto_name(config)))
        if config.level == "token" and config.masks:  # a named flag: no token tensor on the numba engine
            masked_tokens, masked_rows = rejection_counts(s, s.row_sum(mask_name(config)))
        else:
            masked = legacy_mask_keep(s, config).map(arrays.logical_not)
            masked_tokens, rows_with_masked = rejection_counts(s, masked)
            # token level: rows with a masked token; sequence/geometric: the helper reads each row's broadcast flag
            masked_rows = s.group_sum_rows(masked.values) if masked.by_row else rows_with_masked
        return {
            "tokens": s.group_tokens,
            "rows": s.group_rows,
            **weights,
            "catastrophic_tokens": catastrophic_tokens,
            "vetoed_rows": vetoed_rows,
            "masked_tokens": masked_tokens,
            "masked_rows": masked_rows,
        }

    def _metrics(self, value: dict[str, Any]) -> dict[str, Any]:
        rows = value["rows"]
        config = self.config
        denominator = token_denominator(value)
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
        return {PREFIX + name: v for name, v in metrics.items()}
