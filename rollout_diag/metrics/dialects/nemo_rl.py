"""NeMo-RL: ``train/token_mult_prob_error`` (and its 1.05 alert level), ``train/gen_kl_error``,
``train/policy_kl_error``, ``train/js_divergence_error``, ``train/sampling_importance_ratio`` and the
per-sequence multiplicative error.

Definitions: NVIDIA-NeMo/RL ``nemo_rl/algorithms/loss/loss_functions.py`` (``ClippedPGLossFn.__call__``: token means
over ``token_mask × sample_mask`` with the global valid-token count), ``nemo_rl/algorithms/utils.py``
(``calculate_kl``: k3 of logr = reference − logprobs, unclamped here; ``masked_mean``: Σ/(N + 1e-8)),
``nemo_rl/algorithms/grpo.py`` (``compute_and_apply_seq_logprob_error_masking``: per-sequence values over valid
sequences; the ``token_mult_prob_error > 1.05`` check that logs ``train/token_mult_prob_error_plot_sample``;
metrics logged with the ``train/`` prefix), commit 7ea279abfbeb698b092856d0dab61e7cf39bc909.
``sampling_importance_ratio`` (loss_functions.py, "Off-policy (actor) importance-sampling correction" and
"Metric: sampling importance ratio"): with the default token-level ratios and no truncation, the token mean
over the mask of ``nan_to_num(exp(prev_logprobs − generation_logprobs), nan=0, posinf=0, neginf=0)`` = e^δ,
0 where it overflows, normalised by the global valid-token count like the errors above.
In NeMo-RL's names a = ``prev_logprobs`` (trainer), r = ``generation_logprobs``.
"""

from __future__ import annotations

import math
from typing import ClassVar

from rollout_diag.catalogue import EPS
from rollout_diag.engine import arrays
from rollout_diag.engine.arrays import Array
from rollout_diag.engine.formulas import quantity
from rollout_diag.engine.stats import ChunkStats, stats
from rollout_diag.io.chunk import Chunk
from rollout_diag.metrics.base import State, StepAccumulator, as_float
from rollout_diag.metrics.dialects.base import DialectMetric, Framework, by_step, reductions, valid_extremes

PREFIX = "train/"
ALERT_LEVEL = (
    1.05  # grpo.py: above it NeMo-RL plots the worst sample ("needs investigation", docs/adding-new-models.md)
)
ALERT = f"alert: token_mult_prob_error > {ALERT_LEVEL}"
LN2 = math.log(2.0)


@quantity("exp_abs_log_ratio")
def _exp_abs_log_ratio(s: ChunkStats) -> Array:  # exp(|a − r|): NeMo-RL's multiplicative probability error
    return arrays.exp(s.token("abs_log_ratio"))


@quantity("nemo_is_weight")
def _is_weight(s: ChunkStats) -> Array:  # nan_to_num(exp(a − r), posinf=0): an overflow weighs 0
    weight = arrays.exp(s.token("log_ratio"))
    return arrays.where(arrays.isfinite(weight), weight, 0.0)


@quantity("nemo_js")
def _js(s: ChunkStats) -> Array:
    # ½·k3(a − m) + ½·k3(r − m) with m = log(½e^a + ½e^r), k3(x) = e^x − x − 1 (loss_functions.py, JSD)
    trainer, rollout = s.token("trainer"), s.token("rollout")
    mixture = arrays.logaddexp(trainer, rollout) - LN2
    to_trainer, to_rollout = trainer - mixture, rollout - mixture
    return 0.5 * (arrays.expm1(to_trainer) - to_trainer) + 0.5 * (arrays.expm1(to_rollout) - to_rollout)


TOKEN_MEANS = {
    "token_mult_prob_error": "exp_abs_log_ratio",
    "gen_kl_error": "k3",  # calculate_kl(logprobs=r, reference=a): logr = a − r, e^logr − 1 − logr
    "policy_kl_error": "skyrl_k3",  # calculate_kl(logprobs=a, reference=r): logr = r − a, e^(−δ) − 1 + δ
    "js_divergence_error": "nemo_js",
    "sampling_importance_ratio": "nemo_is_weight",
}


class NemoRLAccumulator(StepAccumulator):
    """Token sums of the four per-token errors; count, sum, max and min of the per-sequence error."""

    REDUCTIONS: ClassVar[dict[str, str]] = reductions(
        sum=("tokens", *TOKEN_MEANS, "valid_rows", "seq_sum"), max=("seq_max",), min=("seq_min",)
    )

    def _stats(self, chunk: Chunk) -> dict[str, Array]:
        s = stats(chunk)
        n = s.row_count
        valid = n > 0
        out = {"tokens": by_step(s, n), **{name: by_step(s, s.row_sum(token)) for name, token in TOKEN_MEANS.items()}}
        # per sequence: Σ exp|δ| / max(n_i, 1) over valid sequences only (an empty one would drag the min to 0)
        per_row = s.row_sum("exp_abs_log_ratio") / arrays.clamp(n, lower=1.0)
        out["valid_rows"] = by_step(s, arrays.float64(valid))
        out["seq_sum"] = by_step(s, arrays.where(valid, per_row, 0.0))
        out["seq_max"], out["seq_min"] = valid_extremes(s, per_row, valid)
        return out

    def _finalize(self, state: State) -> dict[str, float]:
        tokens = as_float(state["tokens"])
        if tokens == 0:
            return {}
        out = {PREFIX + name: as_float(state[name]) / (tokens + EPS) for name in TOKEN_MEANS}
        valid_rows = as_float(state["valid_rows"])
        out[PREFIX + "max_seq_mult_prob_error"] = as_float(state["seq_max"])
        out[PREFIX + "mean_seq_mult_prob_error"] = as_float(state["seq_sum"]) / valid_rows
        out[PREFIX + "min_seq_mult_prob_error"] = as_float(state["seq_min"])
        out[ALERT] = 1.0 if out[PREFIX + "token_mult_prob_error"] > ALERT_LEVEL else 0.0
        return out


_TOKENS = "token mean over token_mask × sample_mask, Σ/(N + 1e-8) with the step's global token count"
_SEQS = "over sequences with at least one masked token"

FRAMEWORK = Framework(
    name="nemo-rl",
    title="NeMo-RL",
    source=(
        "NVIDIA-NeMo/RL `nemo_rl/algorithms/loss/loss_functions.py`, `nemo_rl/algorithms/utils.py`, "
        "`nemo_rl/algorithms/grpo.py` @ 7ea279abfbeb698b092856d0dab61e7cf39bc909"
    ),
    config=(
        "always logged by ClippedPGLossFn; `reference_policy_kl_type` k3 (the default); "
        "`sampling_importance_ratio` with token-level ratios (`sequence_level_importance_ratios: false`) and no "
        "`truncated_importance_sampling_type` (the defaults)"
    ),
    offline=(
        "NeMo-RL sums micro-batch values each normalised by the global token count: with one global batch per "
        "step (train_global_batch_size = prompts × generations, the default) that is the whole-batch token mean "
        f"computed here. `{ALERT}` is rollout-diag's flag (1 or 0) for the level above which NeMo-RL logs "
        "`train/token_mult_prob_error_plot_sample`."
    ),
    metrics=(
        DialectMetric(
            PREFIX + "token_mult_prob_error", "exp|δ|, multiplicative prob error (token mean)", "exp(|a − r|)", _TOKENS
        ),
        DialectMetric(ALERT, "alert level", f"1 when token_mult_prob_error > {ALERT_LEVEL}, else 0", "per step"),
        DialectMetric(PREFIX + "gen_kl_error", "k3 KL exp(δ) − δ − 1 (token mean)", "exp(δ) − 1 − δ", _TOKENS),
        DialectMetric(
            PREFIX + "policy_kl_error", "reverse k3 KL exp(−δ) + δ − 1 (token mean)", "exp(−δ) − 1 + δ", _TOKENS
        ),
        DialectMetric(
            PREFIX + "js_divergence_error",
            "Jensen–Shannon (token mean)",
            "½·k3(a − m) + ½·k3(r − m), m = log(½e^a + ½e^r), k3(x) = e^x − x − 1",
            _TOKENS,
        ),
        DialectMetric(
            PREFIX + "sampling_importance_ratio",
            "IS ratio exp(δ) (token mean)",
            "exp(δ), 0 where it overflows",
            _TOKENS,
        ),
        DialectMetric(
            PREFIX + "max_seq_mult_prob_error", "exp|δ| per sequence, max", "Σ_t m·exp|δ| / max(n_i, 1)", "max " + _SEQS
        ),
        DialectMetric(
            PREFIX + "mean_seq_mult_prob_error",
            "exp|δ| per sequence, mean",
            "Σ_t m·exp|δ| / max(n_i, 1)",
            "mean " + _SEQS,
        ),
        DialectMetric(
            PREFIX + "min_seq_mult_prob_error", "exp|δ| per sequence, min", "Σ_t m·exp|δ| / max(n_i, 1)", "min " + _SEQS
        ),
    ),
    accumulator=NemoRLAccumulator,
)
