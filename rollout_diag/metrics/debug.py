"""verl's debug metrics on probabilities (METRICS.md §5, keys ``training/…``)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from rollout_diag import catalogue
from rollout_diag.engine.arrays import Array
from rollout_diag.engine.stats import stats
from rollout_diag.io.chunk import Chunk
from rollout_diag.metrics.base import Columns, KeyGroup, StepAccumulator

PREFIX = catalogue.DEBUG_PREFIX


class DebugAccumulator(StepAccumulator):
    """|p_a − p_r| max and moments, and the (p_a, p_r) co-moments for Pearson, merged by Chan's update."""

    CHUNK_ONLY: ClassVar[bool] = True
    REDUCTIONS: ClassVar[dict[str, str]] = {
        "probs_diff_max": "max",
        "probs_diff": "moments",  # [n, mean, mean, M2, M2, C] of |p_a − p_r| (x = y)
        "probs": "moments",  # [n, mean p_a, mean p_r, M2 p_a, M2 p_r, C]
    }

    def _stats(self, chunk: Chunk) -> dict[str, Array]:
        s = stats(chunk)
        return {
            "probs_diff_max": s.group_max("prob_diff"),
            "probs_diff": s.group_moments("prob_diff", "prob_diff"),
            "probs": s.group_moments("trainer_prob", "rollout_prob"),
        }

    def finalize_block(self, columns: Columns) -> list[KeyGroup]:
        """The family's metrics over a block of steps: its one formula (the run is a block of one, ``_finalize``)."""
        diff, probs = columns["probs_diff"], columns["probs"]
        n, mean = diff[:, 0], diff[:, 1]
        valid = n != 0
        denominator = np.sqrt(probs[:, 3] * probs[:, 4])
        with np.errstate(divide="ignore", invalid="ignore"):
            std = np.where(n >= 2, np.sqrt(np.maximum(diff[:, 3], 0.0) / (n - 1)), 0.0)
            pearson = np.where(denominator > 0, np.minimum(np.maximum(probs[:, 5] / denominator, -1.0), 1.0), np.nan)
        return [
            (
                np.ones(n.shape[0], dtype=bool),
                {
                    PREFIX + "rollout_probs_diff_valid": valid.astype(np.float64),
                    PREFIX + "rollout_probs_diff_max": np.where(valid, columns["probs_diff_max"], np.nan),
                    PREFIX + "rollout_probs_diff_mean": np.where(valid, mean, np.nan),
                    PREFIX + "rollout_probs_diff_std": np.where(valid, std, np.nan),
                    PREFIX + "rollout_actor_probs_pearson_corr": np.where(valid, pearson, np.nan),
                },
            )
        ]
