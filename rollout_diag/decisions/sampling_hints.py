"""The sampling fingerprints (docs/hints.md): truncated sampling logprobs (``top_p_truncation``) and processed ones
(``processed_logprobs``: temperature), read from the sign of δ per rollout-probability bucket."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from rollout_diag.decisions.contrasts import (
    MIN_GAP,
    MIN_GROUP_TOKENS,
    MIN_T,
    PROBABILITY_LABELS,
    example_rows,
    fmt,
    strongest_steps,
)
from rollout_diag.results import Evidence, Hint, Sums

# ------------------------------------------------------------------------------------------ signed buckets
# top_p_truncation and processed_logprobs read the sign of δ per rollout-probability bucket: Σδ against Σ|δ| (the
# share of |δ| on the negative side) and t = Σδ / √Σy² (the mean's t for a mean near 0; y² = min(|δ|, 1)²).
TRUNCATION_MIN_LOG_MASS = 0.005  # |mean δ| over all model tokens: a kept mass ≤ 99.5 % (top_p 0.99 gives ≈ 0.008)
TRUNCATION_MIN_SHARE = 0.8  # ≥ 80 % of Σ|δ| on the truncating side over all tokens (1.00 at top_p ≤ 0.95)
TRUNCATION_BUCKET_SHARE = 0.9  # … and ≥ 90 % in at least two buckets (placeholder zeros make one: p ≥ 0.9)
TRUNCATION_MIN_BUCKETS = 2
CONTRADICT_T = 3.0  # a bucket with its mean on the other side at t ≥ 3 rules truncation out (temperature, noise)
SAMPLING_MIN_STEPS = 3  # with ≥ 3 steps, at least half of them must show the pattern on their own
SAMPLING_MIN_STEP_SHARE = 0.5
PROCESSED_SIDE_SHARE = 0.8  # temperature: one bucket ≥ 80 % of Σ|δ| negative, another ≥ 80 % positive …
# (each with |mean δ| ≥ MIN_GAP and |t| ≥ MIN_T)


@dataclass(frozen=True)
class Signed:
    """A rollout-probability bucket's tokens, Σδ, Σ|δ| and Σy²."""

    n: float
    delta: float
    abs: float
    squares: float

    @property
    def mean(self) -> float:
        return self.delta / self.n if self.n > 0 else 0.0

    @property
    def negative_share(self) -> float:
        """Share of Σ|δ| on tokens with δ < 0 (0.5 when Σ|δ| is 0)."""
        return (self.abs - self.delta) / (2 * self.abs) if self.abs > 0 else 0.5

    @property
    def t(self) -> float:
        return self.delta / math.sqrt(self.squares) if self.squares > 0 else 0.0

    def __add__(self, other: Signed) -> Signed:
        return Signed(self.n + other.n, self.delta + other.delta, self.abs + other.abs, self.squares + other.squares)


def _signed_buckets(sums: Sums) -> list[tuple[int, Signed]]:
    """(bucket, signed sums) of the rollout-probability buckets with ≥ MIN_GROUP_TOKENS tokens."""
    out = []
    for k, b in enumerate(sums["probability_buckets"]):
        if b["tokens"] >= MIN_GROUP_TOKENS:
            out.append((k, Signed(b["tokens"], b.get("delta", 0.0), b["abs"], b["y2"])))
    return out


# ------------------------------------------------------------------------------------------ top_p_truncation
def _truncation(sums: Sums) -> tuple[float, Signed, list[tuple[int, Signed]]] | None:
    """(sign of δ on the truncated side's tokens: −1 rollout truncated, +1 trainer; all tokens; the buckets) when
    δ has one sign in every populated bucket and the kept mass is clearly below 1."""
    buckets = _signed_buckets(sums)
    if len(buckets) < 2:
        return None
    total = sum((b for _, b in buckets), Signed(0.0, 0.0, 0.0, 0.0))
    sign = -1.0 if total.delta < 0 else 1.0
    share = total.negative_share if sign < 0 else 1.0 - total.negative_share
    if abs(total.mean) < TRUNCATION_MIN_LOG_MASS or sign * total.t < MIN_T or share < TRUNCATION_MIN_SHARE:
        return None
    shares = [b.negative_share if sign < 0 else 1.0 - b.negative_share for _, b in buckets]
    contradicted = any(-sign * b.t >= CONTRADICT_T and abs(b.mean) >= MIN_GAP for _, b in buckets)
    if contradicted or sum(share >= TRUNCATION_BUCKET_SHARE for share in shares) < TRUNCATION_MIN_BUCKETS:
        return None
    return sign, total, buckets


KEPT_EXPLAINED = 0.5  # with a kept_mass column: Σ|δ − log M| at most half of Σ|δ| (δ tracks log M)


def _kept_mass_column(sums: Sums) -> tuple[float, float] | None:
    """(mean log M, Σ|δ − log M| / Σ|δ|) when a kept_mass column shows a kept mass ≤ 99.5 % that δ follows."""
    tokens = sums.get("kept_tokens", 0.0)
    if tokens < MIN_GROUP_TOKENS or sums["kept_abs"] <= 0:
        return None
    mean_log, residual = sums["kept_log"] / tokens, sums["kept_residual"] / sums["kept_abs"]
    if mean_log > -TRUNCATION_MIN_LOG_MASS or residual > KEPT_EXPLAINED:
        return None
    return mean_log, residual


def top_p_truncation(evidence: Evidence) -> Hint | None:
    """The engine reports logprobs of the truncated, renormalised sampling distribution (top-p / top-k) and the trainer
    those of the full one: for a token of a kept set of mass M, r = a − log M, so δ = log M ≤ 0 on every token and ρ
    = M; every rollout-probability bucket leans to one side (TRL #6789). A kept_mass column, where the dump has one,
    decides instead."""
    if evidence.run.get("kept_tokens", 0.0) > 0:
        return _top_p_from_column(evidence)
    found = _truncation(evidence.run)
    if found is None or not _persistent(evidence, _truncation):
        return None
    sign, total, buckets = found
    kept = math.exp(-abs(total.mean))  # ρ = M per token: exp(mean δ) is the geometric mean of the kept mass
    side, other = ("rollout", "trainer") if sign < 0 else ("trainer", "rollout")
    share = total.negative_share if sign < 0 else 1.0 - total.negative_share
    per_bucket = ", ".join(f"{PROBABILITY_LABELS[k]}: {fmt(b.mean)}" for k, b in buckets)
    return Hint(
        id="top_p_truncation",
        message=(
            f"δ leans to one side in every rollout-probability bucket ({share:.0%} of Σ|δ| has δ "
            f"{'<' if sign < 0 else '>'} 0; mean δ {per_bucket}): the {side} logprobs come from a truncated, "
            f"renormalised distribution (top-p / top-k) and the {other}'s from the full one. Kept probability mass "
            f"≈ {kept:.3g} (exp of mean δ: for such sampling every token's ρ is its kept mass)."
        ),
        evidence={
            "kept_mass": kept,
            "mean_log_ratio": total.mean,
            "one_sided_share": share,
            "welch_t": abs(total.t),
            "buckets": float(len(buckets)),
            "tokens": total.n,
        },
        steps=strongest_steps(evidence, lambda s: None if (f := _truncation(s)) is None else abs(f[1].mean)),
        rows=[],
        look_at=f"the {side} engine's sampling parameters (top_p, top_k, min_p) and whether its logprobs are taken "
        "before or after they are applied (e.g. vLLM logprobs_mode='processed_logprobs')",
    )


def _top_p_from_column(evidence: Evidence) -> Hint | None:
    found = _kept_mass_column(evidence.run)
    if found is None:
        return None
    mean_log, residual = found
    kept = math.exp(mean_log)
    return Hint(
        id="top_p_truncation",
        message=(
            f"The dump's kept_mass column says top-p / top-k kept {kept:.3g} of the probability (geometric mean over "
            f"{int(evidence.run['kept_tokens'])} model tokens) and δ follows log kept_mass (Σ|δ − log M| is "
            f"{residual:.0%} of Σ|δ|): the rollout logprobs are those of the truncated, renormalised distribution, the "
            "trainer's of the full one."
        ),
        evidence={"kept_mass": kept, "mean_log_kept_mass": mean_log, "unexplained_share": residual},
        steps=strongest_steps(evidence, lambda s: None if (f := _kept_mass_column(s)) is None else -f[0]),
        rows=[],
        look_at="the rollout engine's sampling parameters (top_p, top_k, min_p) and whether its logprobs are taken "
        "before or after they are applied (e.g. vLLM logprobs_mode='processed_logprobs')",
    )


# ------------------------------------------------------------------------------------------ processed_logprobs
def _processed_sign_flip(sums: Sums) -> tuple[int, Signed, int, Signed] | None:
    """(bucket, sums) of the likeliest bucket that leans one way and of a less likely one that leans the other way,
    each ≥ 80 % of its Σ|δ| on its side, |mean| ≥ MIN_GAP and |t| ≥ MIN_T: the temperature signature."""
    buckets = _signed_buckets(sums)

    def leaning(b: Signed, sign: float) -> bool:
        share = b.negative_share if sign < 0 else 1.0 - b.negative_share
        return share >= PROCESSED_SIDE_SHARE and sign * b.mean >= MIN_GAP and sign * b.t >= MIN_T

    for high_index, (k, high) in enumerate(buckets):
        for sign in (-1.0, 1.0):
            if not leaning(high, sign):
                continue
            for j, low in buckets[high_index + 1 :]:
                if leaning(low, -sign):
                    return k, high, j, low
    return None


def _persistent(evidence: Evidence, test: Callable[[Sums], object | None]) -> bool:
    """Whether at least half of the steps with ≥ 2 populated probability buckets pass ``test`` on their own (with
    fewer than SAMPLING_MIN_STEPS such steps, the run's test alone decides). A sampling setting holds for every
    step; a few steps of heavy rollout noise (a spike) make the buckets lean by selection alone (bucketing by r picks
    the tokens whose noise raised r), in those steps only."""
    steps = [sums for _, sums in evidence.steps.items() if len(_signed_buckets(sums)) >= 2]
    if len(steps) < SAMPLING_MIN_STEPS:
        return True
    return sum(test(sums) is not None for sums in steps) >= SAMPLING_MIN_STEP_SHARE * len(steps)


def processed_logprobs(evidence: Evidence) -> Hint | None:
    """One side's logprobs at a temperature T ≠ 1: r = log softmax(z / T)[tok], not a / T. At T < 1 the likely tokens
    gain probability and the unlikely ones lose it: δ < 0 where the rollout says p is high, δ > 0 where low (T > 1
    the reverse). Truncation keeps one sign everywhere (``top_p_truncation``), numerical noise has no sign."""
    found = _processed_sign_flip(evidence.run)
    if found is None or not _persistent(evidence, _processed_sign_flip):
        return None
    k, high, j, low = found
    sharper = high.mean < 0  # the rollout gives its likely tokens more than the trainer does
    what = (
        "the rollout distribution is sharper than the trainer's (a temperature T < 1 on the rollout side, or T > 1 "
        "on the trainer's)"
        if sharper
        else "the rollout distribution is flatter than the trainer's (T > 1 on the rollout side, or T < 1 on the "
        "trainer's)"
    )
    return Hint(
        id="processed_logprobs",
        message=(
            f"δ changes sign with the rollout probability: mean δ {fmt(high.mean)} on {PROBABILITY_LABELS[k]} tokens "
            f"({max(high.negative_share, 1 - high.negative_share):.0%} of their Σ|δ| one way) and {fmt(low.mean)} on "
            f"{PROBABILITY_LABELS[j]} tokens: {what}. One side's logprobs come from a temperature-processed "
            "distribution."
        ),
        evidence={
            "likely_bucket_mean": high.mean,
            "unlikely_bucket_mean": low.mean,
            "likely_welch_t": high.t,
            "unlikely_welch_t": low.t,
            "sharper_rollout": 1.0 if sharper else 0.0,
        },
        steps=strongest_steps(evidence, lambda s: None if (f := _processed_sign_flip(s)) is None else abs(f[3].mean)),
        rows=example_rows(evidence, "processed_logprobs"),
        look_at="the temperature with which each side computes its logprobs (the engine's logprobs mode, the trainer's "
        "logits / T)",
    )
