"""slime: ``train/train_rollout_logprob_abs_diff``, the mean |trainer − rollout logprob|.

Definition: THUDM/slime ``slime/backends/megatron_utils/loss.py`` (``policy_loss_function``:
``sum_of_sample_mean(|log_probs − rollout_log_probs|)``), ``slime/backends/megatron_utils/cp_utils.py``
(``get_sum_of_sample_mean``: Σ_i Σ_t m·x / clamp_min(n_i, 1), or Σ_t m·x with ``--calculate-per-token-loss``),
``slime/backends/megatron_utils/loss.py`` (``loss_function``: num_tokens = Σ_i clamp_min(n_i, 1)) and
``slime/observability/train_metric_utils.py`` (``reduce_train_step_metrics``: the sum over micro-batches and
ranks divided by the step's global batch size, or by num_tokens per token), logged as ``train/<key>`` in
``slime/backends/megatron_utils/model.py``, commit 624b824a898ab0ec1fcb4d373004c7f3852bf515.
"""

from __future__ import annotations

from typing import ClassVar

from rollout_diag.engine import arrays
from rollout_diag.engine.arrays import Array
from rollout_diag.engine.stats import stats
from rollout_diag.io.chunk import Chunk
from rollout_diag.metrics.base import State, StepAccumulator, as_float
from rollout_diag.metrics.dialects.base import DialectMetric, Framework, by_step, reductions

NAME = "train/train_rollout_logprob_abs_diff"
PER_TOKEN = NAME + " (--calculate-per-token-loss)"


class SlimeAccumulator(StepAccumulator):
    """Σ_i of per-sample means (with slime's clamp_min(n_i, 1)), Σ m·|δ| and Σ_i clamp_min(n_i, 1)."""

    REDUCTIONS: ClassVar[dict[str, str]] = reductions(
        sum=("rows", "tokens", "sample_means", "abs_sum", "token_denominator")
    )

    def _stats(self, chunk: Chunk) -> dict[str, Array]:
        s = stats(chunk)
        n = s.row_count
        denominator = arrays.clamp(n, lower=1.0)  # an empty sample still counts one token (and one sample)
        abs_sum = s.row_sum("abs_log_ratio")
        return {
            "rows": by_step(s, arrays.ones(chunk.rows, n)),
            "tokens": by_step(s, n),
            "sample_means": by_step(s, abs_sum / denominator),
            "abs_sum": by_step(s, abs_sum),
            "token_denominator": by_step(s, denominator),
        }

    def _finalize(self, state: State) -> dict[str, float]:
        if as_float(state["tokens"]) == 0:
            return {}
        return {
            NAME: as_float(state["sample_means"]) / as_float(state["rows"]),
            PER_TOKEN: as_float(state["abs_sum"]) / as_float(state["token_denominator"]),
        }


FRAMEWORK = Framework(
    name="slime",
    title="slime",
    source=(
        "THUDM/slime `slime/backends/megatron_utils/loss.py`, `slime/backends/megatron_utils/cp_utils.py`, "
        "`slime/observability/train_metric_utils.py`, `slime/backends/megatron_utils/model.py` "
        "@ 624b824a898ab0ec1fcb4d373004c7f3852bf515"
    ),
    config="logged whenever the batch carries rollout logprobs; the trainer side is old_log_probs "
    "(log_probs with --use-rollout-logprobs)",
    offline=(
        "one training step per rollout and one sample per rollout group (slime's default): then the per-rollout "
        "denominators are the per-sample mask sums and the divisor is every sample of the batch. With "
        "--num-steps-per-rollout > 1 slime logs one value per optimizer step; here the whole rollout batch is one step."
    ),
    metrics=(
        DialectMetric(
            NAME,
            "|δ|, mean of per-sequence means",
            "Σ_t m·|a − r| / max(n_i, 1)",
            "sum over samples / B (every sample of the batch, empty ones included)",
        ),
        DialectMetric(
            PER_TOKEN,
            "|δ|, token mean",
            "|a − r|",
            "Σ m·|δ| / Σ_i max(n_i, 1) (an empty sample adds 1 to the denominator)",
        ),
    ),
    accumulator=SlimeAccumulator,
)
