"""OpenRLHF: ``train/vllm_kl``, the k1 estimate E[r − a] over action tokens.

Definition: OpenRLHF/OpenRLHF ``openrlhf/models/loss.py`` (``PolicyLoss.forward``: vllm_kl =
``masked_mean(rollout_log_probs − old_log_probs, action_mask)``, Σ/N without a guard, computed when
``enable_vllm_is_correction`` with the ppo loss), ``openrlhf/trainer/ray/ppo_actor.py`` (0-dim metrics weighted by
tokens across micro-batches) and ``openrlhf/utils/logging_utils.py`` (logged as ``train/<key>``), commit
3c3be6234e0cb353e76bb8019947db9dfe99fca7.
"""

from __future__ import annotations

from typing import ClassVar

from rollout_diag.engine.arrays import Array
from rollout_diag.engine.stats import stats
from rollout_diag.io.chunk import Chunk
from rollout_diag.metrics.base import State, StepAccumulator, as_float
from rollout_diag.metrics.dialects.base import DialectMetric, Framework, by_step, reductions

NAME = "train/vllm_kl"


class OpenRLHFAccumulator(StepAccumulator):
    """Σ m·(r − a) and the token count."""

    REDUCTIONS: ClassVar[dict[str, str]] = reductions(sum=("tokens", "reverse_sum"))

    def _stats(self, chunk: Chunk) -> dict[str, Array]:
        s = stats(chunk)
        # Σ m·(r − a) = −Σ m·δ exactly (negation is exact in floating point)
        return {"tokens": by_step(s, s.row_count), "reverse_sum": -by_step(s, s.row_sum("log_ratio"))}

    def _finalize(self, state: State) -> dict[str, float]:
        tokens = as_float(state["tokens"])
        if tokens == 0:
            return {}
        return {NAME: as_float(state["reverse_sum"]) / tokens}


FRAMEWORK = Framework(
    name="openrlhf",
    title="OpenRLHF",
    source=(
        "OpenRLHF/OpenRLHF `openrlhf/models/loss.py`, `openrlhf/trainer/ray/ppo_actor.py`, "
        "`openrlhf/utils/logging_utils.py` @ 3c3be6234e0cb353e76bb8019947db9dfe99fca7"
    ),
    config="enable_vllm_is_correction with policy_loss_type ppo",
    offline=("computed per micro-batch and combined weighted by tokens: the whole-batch token mean computed here."),
    metrics=(DialectMetric(NAME, "k1 KL r − a (token mean)", "r − a", "Σ m·(r − a) / N over action tokens"),),
    accumulator=OpenRLHFAccumulator,
)
