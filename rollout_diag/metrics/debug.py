"""verl's debug metrics on probabilities (METRICS.md §5, keys ``training/…``)."""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from rollout_diag import catalogue
from rollout_diag.engine.arrays import Array
from rollout_diag.engine.stats import stats
from rollout_diag.io.chunk import Chunk
from rollout_diag.metrics.base import Columns, KeyGroup, State, StepAccumulator, as_float, sample_std

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

    def _finalize_columns(self, columns: Columns) -> list[KeyGroup]:
        """``_finalize`` over a block of steps (the same float64 operations)."""
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

    def _finalize(self, state: State) -> dict[str, float]:
        n, mean = float(state["probs_diff"][0]), float(state["probs_diff"][1])
        if n == 0:  # §5: no masked token -> valid 0, values NaN
            names = (
                "rollout_probs_diff_max",
                "rollout_probs_diff_mean",
                "rollout_probs_diff_std",
                "rollout_actor_probs_pearson_corr",
            )
            return {PREFIX + "rollout_probs_diff_valid": 0.0, **{PREFIX + name: math.nan for name in names}}
        _, _, _, m2_trainer, m2_rollout, co_moment = (float(v) for v in state["probs"])
        denominator = math.sqrt(m2_trainer * m2_rollout)
        return {
            PREFIX + "rollout_probs_diff_valid": 1.0,
            PREFIX + "rollout_probs_diff_max": as_float(state["probs_diff_max"]),
            PREFIX + "rollout_probs_diff_mean": mean,
            # unbiased, as torch.std; 0 with fewer than 2 values (METRICS.md, Notation)
            PREFIX + "rollout_probs_diff_std": sample_std(state["probs_diff"]),
            # clipped to [-1, 1] as torch.corrcoef does
            PREFIX + "rollout_actor_probs_pearson_corr": min(max(co_moment / denominator, -1.0), 1.0)
            if denominator > 0
            else math.nan,
        }
