"""AReaL at its current code (areal-project/AReaL, cbff54d): every train–inference mismatch metric its PPO actor logs,
under its names and its ``stats_tracker`` aggregation, per token in float32 as AReaL computes them.

Definitions, areal-project/AReaL at commit cbff54d64 (the repository moved from inclusionAI/AReaL):
- ``areal/utils/functional/functional.py`` ``apply_rejection_sampling``: log_ratio = float32(proximal) −
  float32(old), non-finite → 0; metric ``ratio`` = exp(log_ratio), or ``binary_kl`` (KPop) =
  max(KL(p‖q), KL(q‖p)) of the Bernoulli pair p = exp(proximal), q = exp(old), each clamped to [1e-8, 1 − 1e-8]
  (``compute_binary_kl_divergence``); a token (or, at sequence level, a sequence by the mean of the metric) is kept
  when metric ≤ upper (and ≥ lower); action ``mask`` drops the others from the loss mask; behave_imp_weight =
  exp(log_ratio) where kept, else 0; ``filtered_fraction`` = dropped / loss-mask tokens.
- ``ppo_actor_loss_fn``: behave_approx_kl = proximal − old where behave_mask = (behave_imp_weight > 0) ∧ kept;
  ``masked_token_ratio`` = 1 − (loss-mask tokens) / numel(loss_mask).
- ``areal/trainer/ppo/actor.py`` ``grpo_loss_fn`` under the ``ppo_actor`` / ``update`` scopes: logp_diff =
  (old − logprobs)·loss_mask and its abs over ``n_valid_tokens`` (the loss mask); behave_imp_weight and
  behave_approx_kl over ``unclipped_behave_tokens`` (behave_mask); behave_filtered_ratio = loss_mask ∧ ¬behave_mask
  over ``n_valid_tokens``; scalars ``masked_token_ratio`` and ``rs_filtered_fraction``;
  ``_log_proximal_approximation_stats`` (scope ``compute_logp``, mask behave_mask, when the batch carries
  versions): kl_div_direct = −x, kl_div_taylor = x²/2, kl_div_dual = exp(x) − 1 − x with x = float32(logprobs) −
  float32(old).
- ``areal/utils/stats_tracker.py``: a ``stat`` gives ``/avg`` = Σ over the denominator / its count (absent when
  it is empty), ``/min`` and ``/max`` over the denominator, each dropped when infinite (``_min_of`` / ``_max_of``
  return None for ±inf); a ``scalar`` is the mean of the values recorded (one per micro-batch).
- ``areal/api/cli_args.py`` ``RejectionSamplingConfig`` and ``examples/math/gsm8k_kpop.yaml``.

Offline: proximal = logprobs = the trainer's logprob a (recomputed, the first PPO minibatch), old = the rollout's r.
The per-token values are float32 as AReaL's (exp and log correctly rounded, AReaL's torch ones within an ulp of
them); the sums over a step are float64 (AReaL sums float32 in its own order).

AReaL's traps, reproduced and annotated (the ``note: …`` keys count them per step; docs/dialects.md):
- at cbff54d ``RejectionSamplingConfig.__post_init__`` accepts only ratio / kl_k1 / kl_k2 / kl_k3: ``metric:
  binary_kl`` raises, so AReaL's own ``gsm8k_kpop.yaml`` does not load (``areal:kpop`` gives what its code
  computes once that check lets it through);
- 1 − 1e-8 is 1.0 in float32, so the clamp does nothing at the top: a logprob of 0.0 (p = 1, or any logprob
  above −2⁻²⁵) gives (1 − p)·log(0 / …) = 0·(−∞) = NaN, NaN ≤ upper is false, and the token is always
  filtered (at sequence level, the whole sequence);
- ``masked_token_ratio`` counts every position of the micro-batch tensor, prompts and padding included, not the
  tokens the gate dropped;
- an infinite ``/min`` or ``/max`` (a float32 ratio above e^88.7 that the gate keeps) is silently dropped;
- a kept token whose float32 weight underflows to 0 (δ < −103.97) leaves behave_mask: it is counted as filtered in
  ``behave_filtered_ratio`` though ``rs_filtered_fraction`` does not count it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from rollout_diag.engine import arrays
from rollout_diag.engine.arrays import Array, segment_max, segment_min, segment_sum
from rollout_diag.engine.stats import stats
from rollout_diag.io.chunk import Chunk
from rollout_diag.metrics.base import State, StepAccumulator, as_float
from rollout_diag.metrics.dialects.base import DialectMetric, Framework, reductions

SCOPE = "ppo_actor/update/"
LOGP = "compute_logp/"
EPS = 1e-8  # compute_binary_kl_divergence's eps
# 1 − 1e-8 rounds to 1.0 in float32 (np.float32(1 - 1e-8) == 1.0): the clamp does nothing at the top (the NaN trap)
PROMPT_COLUMNS = ("prompt_len", "prompt_length", "prompt_lens")  # per-row prompt lengths, when a dump carries them
# Stats over a denominator: name -> (denominator, per-token float32 value); "valid" = the loss mask (every model
# token), "behave" = behave_mask.
STATS = {
    "logp_diff": "valid",
    "logp_abs_diff": "valid",
    "behave_imp_weight": "behave",
    "behave_approx_kl": "behave",
    "behave_filtered_ratio": "valid",
    LOGP + "kl_div_direct": "behave",
    LOGP + "kl_div_taylor": "behave",
    LOGP + "kl_div_dual": "behave",
}
NOTE_NAN = "note: tokens AReaL filters for a NaN binary-KL score (a logprob of 0.0)"
NOTE_UNDERFLOW = "note: kept tokens whose float32 weight underflows to 0 (counted as filtered)"
NOTE_DROPPED = "note: infinite /min or /max values AReaL drops"


@dataclass(frozen=True)
class Gate:
    """``RejectionSamplingConfig`` with action ``mask`` (agg ``mean`` at sequence level)."""

    metric: str = "ratio"  # ratio | binary_kl
    upper: float = 5.0
    lower: float | None = None
    level: str = "token"  # token | sequence


def _f32(values: Array) -> Array:
    return arrays.astype(values, "float32")


def _exp(values: Array) -> Array:
    """float32 exp, correctly rounded: float64 exp rounded to float32. A float32 exp of numpy or torch may differ in
    the last bit between a vectorised loop and its tail (so with the chunking); AReaL's own (torch, on its device)
    is within an ulp of this."""
    with np.errstate(over="ignore"):
        return _f32(arrays.exp(arrays.float64(values)))


def _log(values: Array) -> Array:
    """float32 log, correctly rounded as ``_exp``."""
    values = arrays.float64(values)
    if arrays.is_tensor(values):
        return _f32(values.log())
    with np.errstate(divide="ignore", invalid="ignore"):
        return _f32(np.log(values))


def _maximum(a: Array, b: Array) -> Array:
    """Elementwise max, NaN winning (torch.maximum)."""
    larger = arrays.where(a > b, a, b)
    return arrays.where(arrays.isnan(a) | arrays.isnan(b), math.nan, larger)


def binary_kl(log_p: Array, log_q: Array) -> Array:
    """``compute_binary_kl_divergence`` on float32 logprobs: KL of Bernoulli(p) from Bernoulli(q), p and q clamped
    to [1e-8, 1 − 1e-8], which is [1e-8, 1] in float32 (Python-float bounds stay float32, as torch's do)."""
    p = arrays.clamp(_exp(log_p), lower=EPS, upper=1.0 - EPS)
    q = arrays.clamp(_exp(log_q), lower=EPS, upper=1.0 - EPS)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return p * _log(p / q) + (1 - p) * _log((1 - p) / (1 - q))


def gate(s: Any, config: Gate) -> dict[str, Array]:
    """AReaL's per-token float32 values at the step's model tokens: kept (bool), nan_score (bool: a NaN metric),
    weight (behave_imp_weight, 0 where not kept), behave (behave_mask), x = proximal − old (float32)."""
    a, r = _f32(s.token("trainer")), _f32(s.token("rollout"))
    x = a - r  # proximal − old, float32
    log_ratio = arrays.where(arrays.isfinite(x), x, 0.0)
    weight = _exp(log_ratio)  # float32: +inf above δ ≈ 88.72, 0 below ≈ −103.97
    if config.metric == "ratio":
        metric = weight
    elif config.metric == "binary_kl":
        metric = _maximum(binary_kl(a, r), binary_kl(r, a))
    else:
        raise ValueError(f"AReaL dialect: unknown rejection-sampling metric {config.metric!r}")
    nan_score = arrays.isnan(metric)
    if config.level == "sequence":
        chunk = s.chunk
        row = chunk.model.row
        count = arrays.clamp(s.row_count, lower=1.0)
        if config.metric == "ratio":  # geometric mean: the weight is the sequence's too
            seq = _f32(segment_sum(log_ratio, row, chunk.rows) / count)
            per_row = _exp(seq)
            weight = per_row[row]
        else:
            per_row = _f32(segment_sum(metric, row, chunk.rows) / count)  # a NaN token makes its row NaN
        metric = per_row[row]
    kept = metric <= config.upper  # False for NaN
    if config.lower is not None:
        kept = kept & (metric >= config.lower)
    weight = arrays.where(kept, weight, 0.0)
    return {"kept": kept, "nan_score": nan_score & ~kept, "weight": weight, "behave": kept & (weight > 0), "x": x}


def token_values(s: Any, config: Gate) -> tuple[dict[str, tuple[str, Array]], dict[str, Array]]:
    """Per stat (denominator, float32 value at every model token), and the gate's flags."""
    g = gate(s, config)
    x = g["x"]
    r_minus_a = -x  # (old − logprobs)·loss_mask at loss-mask tokens
    with np.errstate(over="ignore", invalid="ignore"):
        dual = _exp(x) - 1.0 - x
    out = {
        "logp_diff": r_minus_a,
        "logp_abs_diff": abs(r_minus_a),
        "behave_imp_weight": g["weight"],
        "behave_approx_kl": x,
        "behave_filtered_ratio": _f32(~g["behave"]),
        LOGP + "kl_div_direct": -x,
        LOGP + "kl_div_taylor": x * x / 2.0,
        LOGP + "kl_div_dual": dual,
    }
    return {name: (STATS[name], value) for name, value in out.items()}, g


class ArealAccumulator(StepAccumulator):
    """Per step: model tokens, positions, gate counts, and count / Σ / max / min of every stat over its
    denominator."""

    GATE: ClassVar[Gate] = Gate()
    REDUCTIONS: ClassVar[dict[str, str]] = reductions(
        sum=("valid", "behave", "positions", "filtered", "nan_score", "underflow", *(f"{name}|sum" for name in STATS)),
        max=(f"{name}|max" for name in STATS),
        min=(f"{name}|min" for name in STATS),
    )

    def _stats(self, chunk: Chunk) -> dict[str, Array]:
        s = stats(chunk)
        groups = chunk.groups
        group = s.token_group
        per_token, g = token_values(s, self.GATE)
        denominators = {"valid": None, "behave": g["behave"]}

        def total(flags: Array) -> Array:
            return segment_sum(arrays.float64(flags), group, groups.count)

        out = {
            "valid": segment_sum(arrays.float64(s.row_count), groups.row_group, groups.count),
            "behave": total(g["behave"]),
            "positions": _positions(chunk),
            "filtered": total(~g["kept"]),
            "nan_score": total(g["nan_score"]),
            "underflow": total(g["kept"] & ~g["behave"]),
        }
        for name, (denominator, value) in per_token.items():
            value = arrays.float64(value)
            where = denominators[denominator]
            if where is None:
                summed, high, low = value, value, value
            else:
                summed = arrays.where(where, value, 0.0)
                high = arrays.where(where, value, -math.inf)
                low = arrays.where(where, value, math.inf)
            out[f"{name}|sum"] = segment_sum(summed, group, groups.count)
            out[f"{name}|max"] = segment_max(high, group, groups.count)
            out[f"{name}|min"] = segment_min(low, group, groups.count)
        return out

    def _finalize(self, state: State) -> dict[str, float]:
        valid = as_float(state["valid"])
        if valid == 0:
            return {}
        out: dict[str, float] = {}
        dropped = 0
        for name, denominator in STATS.items():
            count = as_float(state[denominator])
            if count == 0:
                continue  # _avg_of: None for an empty denominator; min / max are ±inf, dropped too
            out[SCOPE + name + "/avg"] = as_float(state[f"{name}|sum"]) / count
            for statistic in ("min", "max"):
                value = as_float(state[f"{name}|{statistic}"])
                if math.isinf(value):
                    dropped += 1  # _min_of / _max_of: None when infinite, the key is not logged
                else:
                    out[SCOPE + name + "/" + statistic] = value
        out[SCOPE + "masked_token_ratio"] = 1.0 - valid / max(as_float(state["positions"]), 1.0)
        out[SCOPE + "rs_filtered_fraction"] = as_float(state["filtered"]) / max(valid, 1.0)
        out[NOTE_NAN] = as_float(state["nan_score"])
        out[NOTE_UNDERFLOW] = as_float(state["underflow"])
        out[NOTE_DROPPED] = float(dropped)
        return out


def _positions(chunk: Chunk) -> Array:
    """Per step group, the positions AReaL's loss-mask tensor would hold: every token of the dump's rows, plus the
    rows' prompt lengths when the dump has a per-row prompt-length column."""
    lengths = arrays.float64(chunk.offsets[1:] - chunk.offsets[:-1])
    for name in PROMPT_COLUMNS:
        prompt = chunk.extra.get(name)
        if prompt is not None:
            extra = np.array([0.0 if v is None else float(v) for v in (prompt[i] for i in range(chunk.rows))])
            lengths = lengths + arrays.like(extra, lengths)
            break
    return segment_sum(lengths, chunk.groups.row_group, chunk.groups.count)


class ArealKPopAccumulator(ArealAccumulator):
    GATE: ClassVar[Gate] = Gate(metric="binary_kl", upper=2.0)


_VALID = "over the loss-mask tokens (`n_valid_tokens`)"
_BEHAVE = "over behave_mask = kept ∧ float32 weight > 0 (`unclipped_behave_tokens`)"
_DROP = "; absent when infinite (stats_tracker drops ±inf)"
_SOURCE = (
    "areal-project/AReaL (formerly inclusionAI/AReaL) `areal/utils/functional/functional.py`, "
    "`areal/trainer/ppo/actor.py`, `areal/utils/stats_tracker.py`, `areal/api/cli_args.py`, "
    "`examples/math/gsm8k_kpop.yaml` @ cbff54d645d2cd8ee1f1c358a82f3f473588433d"
)
_OFFLINE = (
    "proximal = π_θ = the trainer's logprob a (recomputed; the first PPO minibatch), old = the rollout's r; "
    "per-token values in float32 as AReaL's, sums in float64 (AReaL sums float32 in its own order: an avg can "
    "differ in the 7th digit). AReaL averages a scalar over micro-batches and ranks: here one micro-batch per step. "
    "`masked_token_ratio`: AReaL's tensor also holds every prompt position (and padding in the padded layout); "
    "from a dump without a `prompt_len` column the ratio counts the response positions only. The `…__count` "
    "scalars (micro-batches) are left out. The `compute_logp/kl_div_*` keys are logged when the batch carries "
    "per-token versions (AReaL's rollout workflows stamp them). `note: …` keys are rollout-diag's, not AReaL's"
)


def _metrics(gate_text: str) -> tuple[DialectMetric, ...]:
    def trio(name: str, concept: str, formula: str, over: str) -> list[DialectMetric]:
        return [
            DialectMetric(
                f"{SCOPE}{name}/{stat}",
                f"{concept}{'' if stat == 'avg' else ', ' + stat}",
                formula,
                f"{'mean' if stat == 'avg' else stat} {over}{_DROP if stat != 'avg' else ''}",
            )
            for stat in ("avg", "min", "max")
        ]

    return (
        *trio("logp_diff", "k1 r − a (token mean)", "r − a, float32", _VALID),
        *trio("logp_abs_diff", "|δ| (token mean)", "|r − a|, float32", _VALID),
        *trio("behave_imp_weight", "IS ratio exp(δ), mean", "exp(a − r) in float32, 0 where filtered", _BEHAVE),
        *trio("behave_approx_kl", "k1 a − r (token mean)", "a − r, float32", _BEHAVE),
        *trio(
            "behave_filtered_ratio",
            "share of tokens the gate filters",
            f"1 where not in behave_mask ({gate_text}; also a kept token whose weight underflows)",
            _VALID,
        ),
        DialectMetric(
            SCOPE + "masked_token_ratio",
            "share of positions outside the loss mask",
            "1 − loss-mask tokens / numel(loss_mask): counts prompt and padding positions, not gated tokens",
            "mean over micro-batches (one per step here), positions of the dump's rows (+ `prompt_len`)",
        ),
        DialectMetric(
            SCOPE + "rs_filtered_fraction",
            "share of tokens the gate filters",
            f"filtered / loss-mask tokens ({gate_text})",
            "mean over micro-batches (one per step here)",
        ),
        *trio(LOGP + "kl_div_direct", "k1 r − a (token mean)", "−(a − r), float32", _BEHAVE),
        *trio(LOGP + "kl_div_taylor", "k2 ½δ² (token mean)", "(a − r)² / 2, float32", _BEHAVE),
        *trio(LOGP + "kl_div_dual", "k3 KL exp(δ) − δ − 1 (token mean)", "exp(x) − 1 − x, float32", _BEHAVE),
        DialectMetric(
            NOTE_NAN,
            "rollout-diag's note on AReaL's KPop gate",
            "tokens whose binary-KL score is NaN: 1 − 1e-8 is 1.0 in float32, so p = 1 gives 0·log 0",
            "count per step (AReaL filters them all; 0 with the ratio gate)",
        ),
        DialectMetric(
            NOTE_UNDERFLOW,
            "rollout-diag's note on AReaL's behave_mask",
            "kept tokens with exp(float32 δ) = 0",
            "count per step (counted in behave_filtered_ratio, not in rs_filtered_fraction)",
        ),
        DialectMetric(
            NOTE_DROPPED,
            "rollout-diag's note on AReaL's stats_tracker",
            "`/min` and `/max` keys whose value is ±inf",
            "count per step (AReaL logs nothing under those names)",
        ),
    )


FRAMEWORK = Framework(
    name="areal",
    title="AReaL",
    source=_SOURCE,
    config=(
        "use_decoupled_loss with rejection_sampling {level: token, action: mask, metric: ratio, upper: 5.0} "
        "(the configuration AReaL's warning gives for its old default; with rejection_sampling null no behave_* "
        "value is logged). `--dialect areal:kpop` for the binary-KL gate, `areal@4aef98d` for the dialect before "
        "AReaL moved"
    ),
    offline=_OFFLINE + ".",
    metrics=_metrics("exp(δ) > 5"),
    accumulator=ArealAccumulator,
)

FRAMEWORK_KPOP = Framework(
    name="areal:kpop",
    title="AReaL (KPop)",
    source=_SOURCE,
    config=(
        "use_decoupled_loss with rejection_sampling {level: token, action: mask, metric: binary_kl, upper: 2.0} "
        "(examples/math/gsm8k_kpop.yaml). At cbff54d AReaL's own config check rejects `metric: binary_kl` "
        "(RejectionSamplingConfig.__post_init__ lists ratio, kl_k1, kl_k2, kl_k3 only): that example does not load; "
        "these are the numbers its code computes once the check lets it through"
    ),
    offline=_OFFLINE
    + ". A token with a logprob of 0.0 on either side (or above −2⁻²⁵) gets a NaN score and is always filtered: "
    "`note: tokens AReaL filters for a NaN binary-KL score` counts them.",
    metrics=_metrics("max(KL(p‖q), KL(q‖p)) > 2 or NaN"),
    accumulator=ArealKPopAccumulator,
)
