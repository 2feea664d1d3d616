"""prime-rl: ``mismatch_kl/all/{mean,std,min,max}``, the k3 estimator over the step's trainable tokens.

Definition: PrimeIntellect-ai/prime-rl ``src/prime_rl/trainer/rl/loss.py``
(``compute_importance_ratio_and_mismatch_kl``: mismatch_kl = exp(δ) − δ − 1 with δ = trainer − inference logprob),
``src/prime_rl/trainer/rl/train.py`` (values at ``loss_mask`` tokens appended per micro-batch) and
``src/prime_rl/trainer/utils.py`` (``Tensors.compute_stats``: all-gathered over micro-batches and ranks, then
mean / median / std / min / max), commit 559b44772e471d1538537b8805cc77f3824a5e64.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch

from rollout_diag.io.chunk import Chunk
from rollout_diag.metrics.base import State, StepAccumulator, as_float
from rollout_diag.metrics.dialects.base import DialectMetric, Framework, by_step, row_extreme, token_moments
from rollout_diag.metrics.segments import stats

PREFIX = "mismatch_kl/all/"


class PrimeRLAccumulator(StepAccumulator):
    """Chan moments, max and min of the per-token k3 over the step's model tokens."""

    REDUCTIONS: ClassVar[dict[str, str]] = {"k3": "moments", "k3_max": "max", "k3_min": "min"}

    def _stats(self, chunk: Chunk) -> dict[str, torch.Tensor]:
        s = stats(chunk)
        return {
            "k3": token_moments(s, "k3"),  # exp(δ) − δ − 1 (expm1 form: the same value, rounded better near 0)
            "k3_max": by_step(s, row_extreme(s, "k3", "amax"), "max"),
            "k3_min": by_step(s, row_extreme(s, "k3", "amin"), "min"),
        }

    def _finalize(self, state: State) -> dict[str, float]:
        n, mean, _, m2, _, _ = (float(v) for v in state["k3"])
        if n == 0:
            return {}
        return {
            PREFIX + "mean": mean,
            # torch.Tensor.std: unbiased, NaN for a single value
            PREFIX + "std": math.sqrt(max(m2, 0.0) / (n - 1)) if n > 1 else math.nan,
            PREFIX + "min": as_float(state["k3_min"]),
            PREFIX + "max": as_float(state["k3_max"]),
        }


_AGG = "over every trainable token of the step (all micro-batches and ranks gathered)"

FRAMEWORK = Framework(
    name="prime-rl",
    title="prime-rl",
    source=(
        "PrimeIntellect-ai/prime-rl `src/prime_rl/trainer/rl/loss.py`, `src/prime_rl/trainer/rl/train.py`, "
        "`src/prime_rl/trainer/utils.py` @ 559b44772e471d1538537b8805cc77f3824a5e64"
    ),
    config="always logged; `all` = every environment (per-environment keys need env names the dump lacks)",
    offline=(
        "`mismatch_kl/all/median` is left out: an exact median needs every token value, which a streaming pass "
        "does not keep. W&B receives only mean and max (the other statistics go to the console and other monitors)."
    ),
    metrics=(
        DialectMetric(PREFIX + "mean", "k3 KL exp(δ) − δ − 1 (token mean)", "exp(δ) − δ − 1", "mean, " + _AGG),
        DialectMetric(PREFIX + "std", "k3 KL, std over tokens", "exp(δ) − δ − 1", "unbiased std, " + _AGG),
        DialectMetric(PREFIX + "min", "k3 KL, min over tokens", "exp(δ) − δ − 1", "min, " + _AGG),
        DialectMetric(PREFIX + "max", "k3 KL, max over tokens", "exp(δ) − δ − 1", "max, " + _AGG),
    ),
    accumulator=PrimeRLAccumulator,
)
