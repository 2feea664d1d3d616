"""TRL (GRPO with vLLM importance-sampling correction): ``sampling/sampling_logp_difference/{mean,max}`` and
``sampling/importance_sampling_ratio/{min,mean,max}``.

Definition: huggingface/trl ``trl/trainer/grpo_trainer.py`` (``_generate_and_score_completions``: δ = old − sampling
logprob times the completion mask; the sequence modes take exp(Σ_t m·δ) per sequence, ``sequence_mask`` sets
ratios outside [clip_min, clip_max] to 0; |δ| mean and max over masked tokens, ratio min / mean / max over every
sequence in sequence modes) and ``trl/trainer/grpo_config.py`` (defaults: ``vllm_importance_sampling_mode =
"sequence_mask"``, ``vllm_importance_sampling_clip_max = 3.0``, ``clip_min = None``), commit
f2cd57710ae345ea6428ae95363267fcf38a3dc8.
"""

from __future__ import annotations

from typing import ClassVar

from rollout_diag.engine import arrays
from rollout_diag.engine.arrays import Array
from rollout_diag.engine.stats import stats
from rollout_diag.io.chunk import Chunk
from rollout_diag.metrics.base import State, StepAccumulator, as_float
from rollout_diag.metrics.dialects.base import Framework, by_step, reductions, row_extreme, statistics

DIFF = "sampling/sampling_logp_difference/"
RATIO = "sampling/importance_sampling_ratio/"
CLIP_MAX = 3.0  # GRPOConfig.vllm_importance_sampling_clip_max default


class TRLAccumulator(StepAccumulator):
    """Σ and max of |δ| over model tokens; Σ, min and max of the masked sequence ratio over every row."""

    REDUCTIONS: ClassVar[dict[str, str]] = reductions(
        sum=("tokens", "abs_sum", "rows", "ratio_sum"), max=("abs_max", "ratio_max"), min=("ratio_min",)
    )

    def _stats(self, chunk: Chunk) -> dict[str, Array]:
        s = stats(chunk)
        n = s.row_count
        ratio = arrays.exp(s.row_sum("log_ratio"))  # exp(Σ_t m·δ), unclamped (an empty row has ratio 1)
        ratio = arrays.where(ratio > CLIP_MAX, 0.0, ratio)  # sequence_mask; no lower bound by default
        return {
            "tokens": by_step(s, n),
            "abs_sum": by_step(s, s.row_sum("abs_log_ratio")),
            "abs_max": by_step(s, row_extreme(s, "abs_log_ratio", "amax"), "max"),
            "rows": by_step(s, arrays.ones(chunk.rows, n)),
            "ratio_sum": by_step(s, ratio),
            "ratio_min": by_step(s, ratio, "min"),
            "ratio_max": by_step(s, ratio, "max"),
        }

    def _finalize(self, state: State) -> dict[str, float]:
        tokens = as_float(state["tokens"])
        if tokens == 0:
            return {}
        return {
            DIFF + "mean": as_float(state["abs_sum"]) / tokens,
            DIFF + "max": as_float(state["abs_max"]),
            RATIO + "min": as_float(state["ratio_min"]),
            RATIO + "mean": as_float(state["ratio_sum"]) / as_float(state["rows"]),
            RATIO + "max": as_float(state["ratio_max"]),
        }


_SEQ = f"over every sequence of the batch, empty ones included (ratio 1); ratios above {CLIP_MAX:g} count as 0"

FRAMEWORK = Framework(
    name="trl",
    title="TRL",
    source=(
        "huggingface/trl `trl/trainer/grpo_trainer.py`, `trl/trainer/grpo_config.py` "
        "@ f2cd57710ae345ea6428ae95363267fcf38a3dc8"
    ),
    config=(
        "use_vllm with vllm_importance_sampling_correction (the default), mode sequence_mask, clip_max 3.0, "
        "clip_min None (the defaults)"
    ),
    offline=(
        "TRL computes these per process per generation batch and averages the means over processes (min / max "
        "over processes) and over the logging interval; here one step is one batch on one process."
    ),
    metrics=(
        *statistics(DIFF, "|a − r|", "over masked tokens", {"mean": "|δ|, token mean", "max": "|δ|, max over tokens"}),
        *statistics(
            RATIO,
            "exp(S_i[δ]), 0 when above 3",
            _SEQ,
            {stat: f"sequence IS ratio exp(S_i[δ]), {stat}" for stat in ("min", "mean", "max")},
        ),
    ),
    accumulator=TRLAccumulator,
)
