"""SkyRL: ``policy/rollout_train_logprobs_abs_diff_{mean,std,max,min}`` and
``policy/loss_metrics/is_ratio_{mean,std,max,min}``.

Definitions: NovaSky-AI/SkyRL ``skyrl/train/trainer.py`` (|rollout − action logprob| over ``loss_mask > 0``
tokens of the whole training batch: max, min, mean, torch std), ``skyrl/backends/skyrl_train/utils/
off_policy_correction_utils.py`` (``compute_off_policy_correction``: is_ratio = ``safe_exp_delta(old − rollout,
clip=20)``; mean = ``masked_mean``, Σ m·w / max(N, 1); std / max / min of ``is_ratio * loss_mask`` over the whole
padded tensor, so padding and environment tokens enter as zeros), ``skyrl/backends/skyrl_train/workers/
worker.py`` (loss metrics logged as ``loss_metrics/<key>`` under ``policy/``; ``worker_utils.reduce_metrics``
averages micro-batches), commit a9564572eb8e91076be43c1bd5e4615e3de17265.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from rollout_diag.catalogue import CLAMP
from rollout_diag.engine import arrays
from rollout_diag.engine.arrays import Array
from rollout_diag.engine.formulas import quantity
from rollout_diag.engine.state import merge_moments
from rollout_diag.engine.stats import ChunkStats, stats
from rollout_diag.io.chunk import Chunk
from rollout_diag.metrics.base import State, StepAccumulator, as_float
from rollout_diag.metrics.dialects.base import (
    DialectMetric,
    Framework,
    by_step,
    reductions,
    row_extreme,
    statistics,
    token_moments,
)

ABS = "policy/rollout_train_logprobs_abs_diff_"
IS = "policy/loss_metrics/is_ratio_"


@quantity("exp_clamped_log_ratio")
def _is_ratio(s: ChunkStats) -> Array:  # safe_exp_delta: exp(clamp(δ, −20, 20))
    return arrays.exp(arrays.clamp(s.token("log_ratio"), -CLAMP, CLAMP))


class SkyRLAccumulator(StepAccumulator):
    """Moments / max / min of |δ| and of the IS ratio over model tokens, rows and the longest row (the padding)."""

    REDUCTIONS: ClassVar[dict[str, str]] = reductions(
        moments=("abs", "ratio"), max=("abs_max", "ratio_max", "longest"), min=("abs_min", "ratio_min"), sum=("rows",)
    )

    def _stats(self, chunk: Chunk) -> dict[str, Array]:
        s = stats(chunk)
        return {
            "abs": token_moments(s, "abs_log_ratio"),
            "abs_max": by_step(s, row_extreme(s, "abs_log_ratio", "amax"), "max"),
            "abs_min": by_step(s, row_extreme(s, "abs_log_ratio", "amin"), "min"),
            "ratio": token_moments(s, "exp_clamped_log_ratio"),
            "ratio_max": by_step(s, row_extreme(s, "exp_clamped_log_ratio", "amax"), "max"),
            "ratio_min": by_step(s, row_extreme(s, "exp_clamped_log_ratio", "amin"), "min"),
            "rows": by_step(s, arrays.ones(chunk.rows, s.row_count)),
            # the response tensor is padded to the longest response (environment tokens included)
            "longest": by_step(s, arrays.float64(chunk.lengths), "max"),
        }

    def _finalize(self, state: State) -> dict[str, float]:
        tokens, abs_mean, _, abs_m2, _, _ = (float(v) for v in state["abs"])
        if tokens == 0:
            return {}
        out = {
            ABS + "mean": abs_mean,
            ABS + "std": _std(abs_m2, tokens),
            ABS + "max": as_float(state["abs_max"]),
            ABS + "min": as_float(state["abs_min"]),
        }
        # the padded [B, L] tensor: the N model tokens' ratios plus B·L − N zeros
        cells = as_float(state["rows"]) * as_float(state["longest"])
        zeros = np.zeros(6)
        zeros[0] = cells - tokens
        padded = merge_moments(np.asarray(state["ratio"], dtype=np.float64), zeros)
        out[IS + "mean"] = float(state["ratio"][1])  # masked_mean: over model tokens only
        out[IS + "std"] = _std(float(padded[3]), cells)
        out[IS + "max"] = as_float(state["ratio_max"])  # ratios are positive: the zeros never win
        out[IS + "min"] = 0.0 if cells > tokens else as_float(state["ratio_min"])
        return out


def _std(m2: float, count: float) -> float:
    return math.sqrt(max(m2, 0.0) / (count - 1)) if count > 1 else math.nan  # torch.std: unbiased, NaN for one value


_BATCH = "over the masked tokens of the whole training batch"
_PADDED = "over every cell of the padded [B, L] tensor (zeros outside the mask)"

FRAMEWORK = Framework(
    name="skyrl",
    title="SkyRL",
    source=(
        "NovaSky-AI/SkyRL `skyrl/train/trainer.py`, `skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py`, "
        "`skyrl/backends/skyrl_train/utils/torch_utils.py`, `skyrl/backends/skyrl_train/workers/worker.py` "
        "@ a9564572eb8e91076be43c1bd5e4615e3de17265"
    ),
    config="abs_diff: whenever rollout logprobs and a forward pass exist; is_ratio: when off-policy correction is on",
    offline=(
        "is_ratio_* are computed per micro-batch and averaged (min/max taken) over micro-batches; here the whole "
        "batch is one micro-batch, padded to its longest row (environment tokens included). SkyRL exponentiates "
        "in float32; rollout-diag in float64."
    ),
    metrics=(
        *statistics(
            ABS,
            "|r − a|",
            _BATCH,
            {
                "mean": "|δ|, token mean",
                "std": "|δ|, std over tokens",
                "max": "|δ|, max over tokens",
                "min": "|δ|, min over tokens",
            },
        ),
        DialectMetric(IS + "mean", "IS ratio exp(δ), mean", "exp(clamp20(δ))", "Σ m·w / max(N, 1)"),
        DialectMetric(IS + "std", "IS ratio exp(δ), std", "exp(clamp20(δ))·m", "unbiased std " + _PADDED),
        DialectMetric(IS + "max", "IS ratio exp(δ), max", "exp(clamp20(δ))·m", "max " + _PADDED),
        DialectMetric(
            IS + "min",
            "IS ratio exp(δ), min",
            "exp(clamp20(δ))·m",
            "min " + _PADDED + " (0 once any cell is outside the mask)",
        ),
    ),
    accumulator=SkyRLAccumulator,
)
