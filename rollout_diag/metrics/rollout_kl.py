"""Rollout-KL estimators as SkyRL's rollout KL loss aggregates them (METRICS.md §6, keys ``rollout_kl/…``)."""

from __future__ import annotations

from typing import ClassVar

import torch

from rollout_diag.io.chunk import Chunk
from rollout_diag.metrics.base import State, StepAccumulator, as_float, row_mean, segment_sum

PREFIX = "rollout_kl/"
ESTIMATORS = ("k1", "abs", "k2", "k3")


def estimator_values(log_ratio: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-token estimators of §6 for x = a − r."""
    return {
        "k1": log_ratio,
        "abs": log_ratio.abs(),
        "k2": 0.5 * log_ratio * log_ratio,
        "k3": torch.expm1(-log_ratio) + log_ratio,  # exp(−x) − 1 + x
    }


class RolloutKLAccumulator(StepAccumulator):
    """Σ_i R_i[estimator] and the row count: the value is the mean over rows of the row means."""

    REDUCTIONS: ClassVar[dict[str, str]] = {"rows": "sum", "tokens": "sum", **{name: "sum" for name in ESTIMATORS}}

    def _stats(self, chunk: Chunk) -> dict[str, torch.Tensor]:
        model = chunk.model
        count = chunk.groups.count
        row_group = chunk.groups.row_group
        n = chunk.tokens_per_row
        stats = {
            "rows": segment_sum(torch.ones(chunk.rows, dtype=torch.float64, device=chunk.device), row_group, count),
            "tokens": segment_sum(n.to(torch.float64), row_group, count),
        }
        for name, values in estimator_values(model.log_ratio).items():
            per_row = row_mean(segment_sum(values, model.row, chunk.rows), n)
            stats[name] = segment_sum(per_row, row_group, count)
        return stats

    def _finalize(self, state: State) -> dict[str, float]:
        rows, tokens = as_float(state["rows"]), as_float(state["tokens"])
        if rows == 0 or tokens == 0:
            return {}
        return {PREFIX + name: as_float(state[name]) / rows for name in ESTIMATORS}
