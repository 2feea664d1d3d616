"""AReaL as it was at 4aef98d (``--dialect areal@4aef98d``; ``areal`` is AReaL at its current code, areal.py):
``ppo_actor/update/behave_approx_kl/{avg,min,max}`` and ``ppo_actor/update/behave_imp_weight/{avg,min,max}``, in
float64. Kept so that numbers reported before the dialect moved to cbff54d can be reproduced digit for digit.

Definitions: inclusionAI/AReaL ``areal/utils/functional/functional.py`` (``apply_rejection_sampling``: token level,
metric ``ratio`` = exp(proximal − old logprob), action ``mask`` keeps tokens with ratio ≤ upper;
``ppo_actor_loss_fn``: behave_approx_kl = proximal − old on tokens with behave_imp_weight > 0 and the updated
loss mask), ``areal/trainer/ppo/actor.py`` (``stats_tracker.stat(..., denominator="unclipped_behave_tokens")``
under the ``ppo_actor`` / ``update`` scopes), ``areal/utils/stats_tracker.py`` (avg = Σ/count, min, max over the
denominator's tokens, absent when it is empty) and ``areal/api/cli_args.py`` (``RejectionSamplingConfig``
defaults: level token, action mask, metric ratio, upper 5.0, lower None), commit
4aef98d8d818af55b43621aaadba047ae10f4e77. Here proximal = the trainer's logprob a, old = the rollout's r.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar

from rollout_diag.engine import arrays
from rollout_diag.engine.arrays import Array
from rollout_diag.engine.formulas import quantity
from rollout_diag.engine.stats import ChunkStats, stats
from rollout_diag.io.chunk import Chunk
from rollout_diag.metrics.base import State, StepAccumulator, as_float
from rollout_diag.metrics.dialects.base import Framework, by_step, reductions, row_extreme, statistics

KL = "ppo_actor/update/behave_approx_kl/"
WEIGHT = "ppo_actor/update/behave_imp_weight/"
UPPER = 5.0  # RejectionSamplingConfig.upper default (the old behave_imp_weight_cap)


@quantity("areal4_kept")
def _kept(s: ChunkStats) -> Array:  # 1 where exp(δ) ≤ upper: the token survives rejection
    return arrays.float64(arrays.exp(s.token("log_ratio")) <= UPPER)


# each value AReaL logs (avg, min and max over the kept tokens): its state fields' stem, its logged prefix and the
# token quantity it reads
VALUES = (("kl", KL, "log_ratio"), ("weight", WEIGHT, "exp_log_ratio"))


def _kept_only(value: str, fill: float) -> Callable[[ChunkStats], Array]:  # fill where a token is rejected
    def compute(s: ChunkStats) -> Array:
        return arrays.where(s.token("areal4_kept") > 0, s.token(value), fill)

    return compute


def _kept_times(value: str) -> Callable[[ChunkStats], Array]:  # 0 where a token is rejected
    def compute(s: ChunkStats) -> Array:
        return s.token(value) * s.token("areal4_kept")

    return compute


for _field, _, _value in VALUES:
    quantity(f"areal4_{_field}_kept")(_kept_times(_value))
    quantity(f"areal4_{_field}_for_max")(_kept_only(_value, -math.inf))
    quantity(f"areal4_{_field}_for_min")(_kept_only(_value, math.inf))


class ArealAccumulator(StepAccumulator):
    """Kept-token count, Σ, max and min of δ and of exp(δ) over the tokens rejection sampling keeps."""

    REDUCTIONS: ClassVar[dict[str, str]] = reductions(
        sum=("tokens", "kept", *(field + "_sum" for field, _, _ in VALUES)),
        max=(field + "_max" for field, _, _ in VALUES),
        min=(field + "_min" for field, _, _ in VALUES),
    )

    def _stats(self, chunk: Chunk) -> dict[str, Array]:
        s = stats(chunk)
        out = {"tokens": by_step(s, s.row_count), "kept": by_step(s, s.row_sum("areal4_kept"))}
        for field, _, _ in VALUES:
            out[field + "_sum"] = by_step(s, s.row_sum(f"areal4_{field}_kept"))
            out[field + "_max"] = by_step(s, row_extreme(s, f"areal4_{field}_for_max", "amax"), "max")
            out[field + "_min"] = by_step(s, row_extreme(s, f"areal4_{field}_for_min", "amin"), "min")
        return out

    def _finalize(self, state: State) -> dict[str, float]:
        kept = as_float(state["kept"])
        if as_float(state["tokens"]) == 0 or kept == 0:
            return {}  # stats_tracker drops a statistic whose denominator is empty
        out = {}
        for field, logged, _ in VALUES:
            out[logged + "avg"] = as_float(state[field + "_sum"]) / kept
            out[logged + "min"] = as_float(state[field + "_min"])
            out[logged + "max"] = as_float(state[field + "_max"])
        return out


_KEPT = f"over the masked tokens with exp(δ) ≤ {UPPER:g} (the tokens rejection sampling keeps)"

FRAMEWORK = Framework(
    name="areal@4aef98d",
    title="AReaL @4aef98d",
    source=(
        "inclusionAI/AReaL `areal/utils/functional/functional.py`, `areal/trainer/ppo/actor.py`, "
        "`areal/utils/stats_tracker.py`, `areal/api/cli_args.py` @ 4aef98d8d818af55b43621aaadba047ae10f4e77"
    ),
    config=(
        "use_decoupled_loss with rejection_sampling {level: token, action: mask, metric: ratio, upper: 5.0} "
        "(the configuration AReaL's warning gives for its old default; with rejection_sampling null nothing is logged)"
    ),
    offline=(
        "AReaL accumulates these over the PPO mini-batches of one update and all data-parallel ranks: each token "
        "once, so the whole-batch statistic is the same. AReaL subtracts in float32; rollout-diag in float64."
    ),
    metrics=(
        *statistics(
            KL,
            "a − r",
            _KEPT,
            {"avg": "k1 a − r (token mean)", "min": "k1 a − r, min over tokens", "max": "k1 a − r, max over tokens"},
        ),
        *statistics(
            WEIGHT,
            "exp(a − r)",
            _KEPT,
            {"avg": "IS ratio exp(δ), mean", "min": "IS ratio exp(δ), min", "max": "IS ratio exp(δ), max"},
        ),
    ),
    accumulator=ArealAccumulator,
)
