"""Where the trainers' own mismatch metrics (``--dialect``) part on this data: one sentence per difference.

Pure: a run's StepResult in, sentences out; the terminal (``render.dialects``) and the report print them.
"""

from __future__ import annotations

import math

from rollout_diag import catalogue
from rollout_diag.formatting import number
from rollout_diag.results import StepResult

VALID_ROWS = "@valid_rows"  # suffix of verl's metrics taken over rows with a model token only


class _Dialects:
    """A step's dialect metrics by framework; a missing or NaN value reads as None."""

    def __init__(self, run: StepResult) -> None:
        self.run = run

    def get(self, framework: str, metric: str) -> float | None:
        value = self.run.dialects.get(framework, {}).get(metric)
        return None if value is None or math.isnan(value) else value

    def token_abs(self) -> float | None:
        """Mean |δ| over tokens: SkyRL's, else TRL's."""
        value = self.get("skyrl", "policy/rollout_train_logprobs_abs_diff_mean")
        return self.get("trl", "sampling/sampling_logp_difference/mean") if value is None else value


def _normalisation(dialects: _Dialects) -> str | None:
    token_abs = dialects.token_abs()
    sequence_abs = dialects.get("slime", "train/train_rollout_logprob_abs_diff")
    if token_abs is None or sequence_abs is None or not token_abs > 0:
        return None
    heavier = "short" if sequence_abs > token_abs else "long"
    return (
        f"mean |δ| is {number(token_abs, 4)} over tokens (SkyRL, TRL) but {number(sequence_abs, 4)} as slime's mean "
        f"of per-sequence means ({sequence_abs / token_abs:.3g}×): {heavier} sequences diverge more here."
    )


def _probability_space(dialects: _Dialects) -> str | None:
    mult = dialects.get("nemo-rl", "train/token_mult_prob_error")
    if mult is None:
        return None
    token_abs = dialects.token_abs()
    log_space = f"; in log space the same tokens have mean |δ| {number(token_abs, 4)}" if token_abs else ""
    prob_diff = dialects.get("roll", "actor/train_infer_diff_token_mean")
    roll = f"; ROLL's train_infer_diff_* are signed p_a − p_r (token: {number(prob_diff, 4)})" if prob_diff else ""
    return (
        f"NeMo-RL's token_mult_prob_error {number(mult, 4)} is mean exp|δ| (1 = identical, alert above 1.05)"
        f"{log_space}{roll}."
    )


def _padding(dialects: _Dialects) -> str | None:
    is_min = dialects.get("skyrl", "policy/loss_metrics/is_ratio_min")
    if is_min is None:
        return None
    if is_min != 0.0:
        return "every row is full length and fully masked here, so none."
    kept_min = dialects.get("areal", "ppo_actor/update/behave_imp_weight/min")
    other = f" (AReaL's, over model tokens: {number(kept_min, 4)})" if kept_min is not None else ""
    is_std = dialects.get("skyrl", "policy/loss_metrics/is_ratio_std")
    return (
        f"SkyRL's is_ratio_min is 0 and its is_ratio_std {number(is_std, 4)} counts the zeros of padding and "
        f"environment tokens; the other minima are over model tokens only{other}."
    )


def _empty_rows(dialects: _Dialects) -> str | None:
    empty_rows = dialects.run.empty_rows
    if not empty_rows:
        return "every row has a model token here, so it changes nothing."
    verl_valid = dialects.get("verl", catalogue.LOG_PPL_ABS_DIFF.key + VALID_ROWS)
    verl_value = dialects.get("verl", catalogue.LOG_PPL_ABS_DIFF.key)
    moved = (
        f" (verl's log_ppl_abs_diff {number(verl_value, 4)} vs {number(verl_valid, 4)} over valid rows)"
        if verl_valid is not None and verl_value is not None
        else ""
    )
    return (
        f"{empty_rows} row(s) have no model token; verl's row means{moved} and slime count them, TRL counts them as "
        "ratio 1, ROLL and NeMo-RL's per-sequence values leave them out."
    )


def _clamping(dialects: _Dialects) -> str | None:
    max_abs = dialects.get("skyrl", "policy/rollout_train_logprobs_abs_diff_max")
    if max_abs is None:
        max_abs = dialects.get("trl", "sampling/sampling_logp_difference/max")
    if max_abs is None:
        return None
    if max_abs > 20.0:
        return (
            f"a token has |δ| = {number(max_abs, 4)} > 20: verl's χ² and SkyRL's is_ratio clamp δ at ±20, "
            "prime-rl, NeMo-RL, ROLL, TRL and AReaL exponentiate it raw."
        )
    return f"the largest |δ| is {number(max_abs, 4)} ≤ 20, so clamping changes nothing."


def _sign(dialects: _Dialects) -> str | None:
    reverse = dialects.get("openrlhf", "train/vllm_kl")
    if reverse is None:
        reverse = dialects.get("verl", catalogue.KL.key)
    forward = dialects.get("areal", "ppo_actor/update/behave_approx_kl/avg")
    if reverse is None or forward is None:
        return None
    return (
        f"verl's kl and OpenRLHF's vllm_kl are E[r − a] = {number(reverse, 4)}; AReaL's behave_approx_kl is "
        f"E[a − r] over the tokens its rejection keeps = {number(forward, 4)}."
    )


# rollout-diag's notes beside AReaL's values (rollout_diag/metrics/dialects/areal.py spells the same keys)
AREAL_NAN = "note: tokens AReaL filters for a NaN binary-KL score (a logprob of 0.0)"
AREAL_UNDERFLOW = "note: kept tokens whose float32 weight underflows to 0 (counted as filtered)"
AREAL_DROPPED = "note: infinite /min or /max values AReaL drops"
AREAL = "ppo_actor/update/"


def _areal_traps(dialects: _Dialects) -> str | None:
    """What AReaL's own code gets wrong on this data, for each AReaL dialect computed."""
    parts: list[str] = []
    for name in ("areal", "areal:kpop"):
        masked = dialects.get(name, AREAL + "masked_token_ratio")
        if masked is None:
            continue
        filtered = dialects.get(name, AREAL + "rs_filtered_fraction") or 0.0
        found = []
        if nan := dialects.get(name, AREAL_NAN):
            found.append(
                f"{nan:.0f} token(s) with a logprob of 0.0 get a NaN binary-KL score (1 − 1e-8 is 1.0 in float32) "
                "and are filtered, whatever their mismatch"
            )
        if dropped := dialects.get(name, AREAL_DROPPED):
            found.append(f"{dropped:.0f} infinite /min or /max value(s) are dropped (AReaL logs nothing for them)")
        if underflow := dialects.get(name, AREAL_UNDERFLOW):
            found.append(
                f"{underflow:.0f} kept token(s) whose float32 weight underflows to 0 count as filtered in "
                "behave_filtered_ratio but not in rs_filtered_fraction"
            )
        if not parts:  # the same positions in every AReaL dialect: said once
            found.append(
                f"masked_token_ratio {number(masked, 4)} is the share of positions outside the loss mask (AReaL's "
                f"own count adds prompts and padding), not what its gate filtered ({number(filtered, 4)})"
            )
        if found:
            parts.append(f"{name}: " + "; ".join(found))
    if not parts:
        return None
    return " — ".join(parts) + "."


def _versions(dialects: _Dialects) -> str | None:
    """verl's rollout_is_* before and after #5722, when a verl@b178a3c dialect was asked for."""
    for name in ("verl@b178a3c", "verl@b178a3c:seq"):
        old = dialects.get(name, catalogue.IS_MEAN.key)
        if old is None:
            continue
        return (
            f"{name}'s rollout_is_mean {number(old, 4)} averages the weights before truncation, as verl logged it "
            "until #5722 (2026-03-24); verl since then logs the truncated mean under the same name (compare-presets), "
            "so a curve from before that date is not comparable with one after it."
        )
    return None


# where the frameworks part, in the order printed: each sentence's heading, and its rule (the rest of the sentence,
# None where the data says nothing)
_DIFFERENCES = (
    ("token- vs sequence-normalised", _normalisation),
    ("probability vs log space", _probability_space),
    ("padding leaking into min/std", _padding),
    ("empty rows counted or not", _empty_rows),
    ("clamped vs raw", _clamping),
    ("sign", _sign),
    ("AReaL's own code (cbff54d) on this data", _areal_traps),
    ("one key, two meanings", _versions),
)


def differences(run: StepResult) -> list[str]:
    """Where the frameworks' numbers part on this data, one line each (only for the frameworks computed)."""
    dialects = _Dialects(run)
    return [f"{heading}: {body}" for heading, rule in _DIFFERENCES if (body := rule(dialects)) is not None]
