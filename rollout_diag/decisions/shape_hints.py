"""The hints that say where the mismatch sits (docs/hints.md): the first or last token, low-probability tokens, long
contexts, growth over turns, stale rows. Pure functions of the hint evidence (``metrics/hints.py``) and, for the
turns, the result's rounds."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from rollout_diag.catalogue import ROUNDS_PREFIX
from rollout_diag.decisions.contrasts import (
    HIGH_BUCKETS,
    LOW_BUCKETS,
    MAX_STEPS,
    MIN_GAP,
    MIN_GROUP_TOKENS,
    PROBABILITY_LABELS,
    Contrast,
    Group,
    bucket_group,
    example_rows,
    fmt,
    group_of,
    strongest_steps,
)
from rollout_diag.decisions.trends import least_squares
from rollout_diag.results import AnalysisResult, Evidence, Hint, Sums

EDGE_MIN_FACTOR = 3.0  # first_token / last_token: mean at least 3× the other tokens'
LOW_PROBABILITY_MIN_FACTOR = 3.0  # p < 0.1 tokens' mean at least 3× that of p ≥ 0.5 tokens
LONG_CONTEXT_MIN_BUCKETS = 4  # log2 position buckets (positions ≥ 1) with ≥ 30 tokens
LONG_CONTEXT_MIN_FACTOR = 2.0  # later half of the buckets at least 2× the earlier half
TURN_MIN_ROUNDS = 3  # rounds with ≥ 30 tokens (the round trend's own rule)
TURN_MIN_FACTOR = 2.0  # the fitted mean |δ| at the last such round at least 2× the fitted one at the first
STALENESS_MIN_FACTOR = 1.5  # rows behind the freshest policy at least 1.5× the mismatch of the freshest


# ------------------------------------------------------------------------------------------ first / last
def _edge(sums: Sums, prefix: str) -> Contrast | None:
    contrast = Contrast(group_of(sums, prefix), group_of(sums, "rest"))
    return contrast if contrast.holds(EDGE_MIN_FACTOR) else None


def _edge_hint(evidence: Evidence, prefix: str) -> Hint | None:
    contrast = _edge(evidence.run, prefix)
    if contrast is None:
        return None
    what = (
        "the first token of each round (position 0 of a model segment)"
        if prefix == "first"
        else ("the last model token of each row")
    )
    cause = (
        "a prompt/response boundary or BOS/chat-template token scored differently on the two sides"
        if prefix == "first"
        else "an EOS/stop token, or the token after it, handled differently on the two sides"
    )
    return Hint(
        id=f"{prefix}_token",
        message=(
            f"Mismatch on {what} is {contrast.factor:.1f}× that of the other tokens (mean min(|δ|, 1) "
            f"{fmt(contrast.high.mean)} vs {fmt(contrast.low.mean)}): {cause}."
        ),
        evidence={
            "mean": contrast.high.mean,
            "rest_mean": contrast.low.mean,
            "factor": contrast.factor,
            "welch_t": contrast.t,
            "tokens": contrast.high.n,
        },
        steps=strongest_steps(evidence, lambda s: None if (c := _edge(s, prefix)) is None else c.factor),
        rows=example_rows(evidence, f"{prefix}_token"),
        look_at="position 0 of each round" if prefix == "first" else "the final token of each row",
    )


def first_token(evidence: Evidence) -> Hint | None:
    return _edge_hint(evidence, "first")


def last_token(evidence: Evidence) -> Hint | None:
    return _edge_hint(evidence, "last")


def _low_probability(sums: Sums) -> Contrast | None:
    buckets = sums["probability_buckets"]
    low = sum((bucket_group(buckets[k]) for k in LOW_BUCKETS), Group(0.0, 0.0, 0.0))
    high = sum((bucket_group(buckets[k]) for k in HIGH_BUCKETS), Group(0.0, 0.0, 0.0))
    contrast = Contrast(low, high)
    return contrast if contrast.holds(LOW_PROBABILITY_MIN_FACTOR) else None


def low_probability(evidence: Evidence) -> Hint | None:
    contrast = _low_probability(evidence.run)
    if contrast is None:
        return None
    buckets = evidence.run["probability_buckets"]
    total_abs = sum(b["abs"] for b in buckets)
    tokens = sum(b["tokens"] for b in buckets)
    lowest = max(k for k, b in enumerate(buckets) if b["tokens"] > 0)
    abs_share = buckets[lowest]["abs"] / total_abs if total_abs > 0 else 0.0
    token_share = buckets[lowest]["tokens"] / tokens
    return Hint(
        id="low_probability",
        message=(
            f"Mismatch is concentrated on low-probability tokens: rollout p < 0.1 tokens have {contrast.factor:.1f}× "
            f"the mean min(|δ|, 1) of p ≥ 0.5 tokens ({fmt(contrast.high.mean)} vs {fmt(contrast.low.mean)}), and "
            f"the {PROBABILITY_LABELS[lowest]} bucket carries {abs_share:.0%} of Σ|δ| with {token_share:.0%} of the "
            "tokens — the numerical-precision signature (bf16 logits, a low-precision lm_head or softmax)."
        ),
        evidence={
            "low_mean": contrast.high.mean,
            "high_mean": contrast.low.mean,
            "factor": contrast.factor,
            "welch_t": contrast.t,
            "lowest_bucket_abs_share": abs_share,
            "lowest_bucket_token_share": token_share,
        },
        steps=strongest_steps(evidence, lambda s: None if (c := _low_probability(s)) is None else c.factor),
        rows=[],
        look_at=f"tokens with rollout {PROBABILITY_LABELS[lowest]} (the worst-tokens table); precision of the "
        "lm_head / logits on both sides",
    )


# ------------------------------------------------------------------------------------------ long_context
def _long_context(sums: Sums) -> tuple[Contrast, float, int, int] | None:
    """(late vs early contrast, slope per log2 bucket, first position of the late half, buckets used)."""
    buckets = [(k, bucket_group(b)) for k, b in enumerate(sums["position_buckets"]) if k >= 1]
    used = [(k, g) for k, g in buckets if g.n >= MIN_GROUP_TOKENS]
    if len(used) < LONG_CONTEXT_MIN_BUCKETS:
        return None
    fit = least_squares([float(k) for k, _ in used], [g.mean for _, g in used])
    if fit is None or fit[1] <= 0:
        return None
    half = len(used) // 2
    early = sum((g for _, g in used[:half]), Group(0.0, 0.0, 0.0))
    late = sum((g for _, g in used[half:]), Group(0.0, 0.0, 0.0))
    contrast = Contrast(late, early)
    if not contrast.holds(LONG_CONTEXT_MIN_FACTOR):
        return None
    return contrast, fit[0], 1 << (used[half][0] - 1), len(used)


def long_context(evidence: Evidence) -> Hint | None:
    found = _long_context(evidence.run)
    if found is None:
        return None
    contrast, slope, start, buckets = found
    return Hint(
        id="long_context",
        message=(
            f"Mismatch grows with the position in the row: from position {start} on, mean min(|δ|, 1) is "
            f"{contrast.factor:.1f}× that of earlier positions ({fmt(contrast.high.mean)} vs "
            f"{fmt(contrast.low.mean)}; +{slope:.3g} per doubling of the position): long-context numerics "
            "(RoPE scaling, attention kernels, KV-cache precision) differ between the engines."
        ),
        evidence={
            "late_mean": contrast.high.mean,
            "early_mean": contrast.low.mean,
            "factor": contrast.factor,
            "welch_t": contrast.t,
            "slope_per_doubling": slope,
            "late_from_position": float(start),
            "position_buckets": float(buckets),
        },
        steps=strongest_steps(evidence, lambda s: None if (f := _long_context(s)) is None else f[0].factor),
        rows=[],
        look_at=f"positions ≥ {start} (the per-position table)",
    )


# ------------------------------------------------------------------------------------------ turn_growth
def _turn_growth(rounds: Sequence[Mapping[str, Any]]) -> tuple[float, float, float, float, int, int] | None:
    """(slope, CI low, fitted mean |δ| at the first and at the last round used, last round, rounds used)."""
    used = [r for r in rounds if not r["pooled"] and r["token_count"] >= MIN_GROUP_TOKENS]
    if len(used) < TURN_MIN_ROUNDS:
        return None
    xs, ys = [float(r["round"]) for r in used], [r["logprob_abs_diff_mean"] for r in used]
    fit = least_squares(xs, ys)
    if fit is None or fit[1] <= 0:
        return None
    # the fitted line, not the last round's own mean: late rounds are few and noisy
    intercept = sum(ys) / len(ys) - fit[0] * sum(xs) / len(xs)
    first, last = intercept + fit[0] * xs[0], intercept + fit[0] * xs[-1]
    if first <= 0 or last - first < MIN_GAP or last < TURN_MIN_FACTOR * first:
        return None
    return fit[0], fit[1], first, last, int(used[-1]["round"]), len(used)


def _step_rounds(metrics: Mapping[str, float], pooled: set[int], keys: Sequence[tuple[int, str, str]]) -> list[dict]:
    """A step's per-round table, what ``_turn_growth`` reads of it, from its per_round/round_<k>/… metrics: ``keys``
    (round, its token_count key, its logprob_abs_diff_mean key) of the rounds the run has tokens in, ascending (a
    step's round with tokens is one of them); ``pooled``: the pooled round. Looked up, not parsed from every key of
    the step (~430 at the default max_rounds)."""
    rounds = []
    for k, tokens_key, mean_key in keys:
        tokens, mean = metrics.get(tokens_key), metrics.get(mean_key)
        if tokens is not None and mean is not None and math.isfinite(mean):
            rounds.append({"round": k, "pooled": k in pooled, "token_count": tokens, "logprob_abs_diff_mean": mean})
    return rounds


def turn_growth(result: AnalysisResult) -> Hint | None:
    found = _turn_growth(result.rounds)
    if found is None:
        return None
    slope, low, first, last, last_round, used = found
    steps = []
    pooled = {int(r["round"]) for r in result.rounds if r["pooled"]}
    keys = [
        (k, f"{ROUNDS_PREFIX}round_{k}/token_count", f"{ROUNDS_PREFIX}round_{k}/logprob_abs_diff_mean")
        for k in sorted(int(r["round"]) for r in result.rounds)
    ]
    for step in result.steps:
        step_found = _turn_growth(_step_rounds(step.metrics, pooled, keys))
        if step_found is not None and step.step is not None:
            steps.append((step_found[3] / max(step_found[2], 1e-12), step.step))
    return Hint(
        id="turn_growth",
        message=(
            f"Mismatch grows with the turn: mean |δ| rises by {slope:.3g} per round (95 % CI from {low:.3g}), from "
            f"{fmt(first)} at the first round to {fmt(last)} at round {last_round} (fitted): the two sides see "
            "different contexts "
            "in later turns (tool outputs re-tokenized, chat template or truncation differences)."
        ),
        evidence={
            "slope_per_round": slope,
            "ci_low": low,
            "first_round_mean": first,
            "last_round_mean": last,
            "factor": last / first if first > 0 else math.inf,
            "rounds": float(used),
        },
        steps=[step for _, step in sorted(steps, key=lambda item: (-item[0], item[1]))[:MAX_STEPS]],
        rows=[],
        look_at=f"rounds ≥ 1 up to round {last_round} (the per-round table): how later turns are tokenized",
    )


# ------------------------------------------------------------------------------------------ staleness
def staleness(evidence: Evidence) -> Hint | None:
    lags = {lag: Group(s[0], s[1], s[2]) for lag, s in evidence.lags.items() if s[0] > 0}
    if not evidence.has_versions or len(lags) < 2:
        return None
    freshest = min(lags)
    stale = sum((g for lag, g in lags.items() if lag != freshest), Group(0.0, 0.0, 0.0))
    contrast = Contrast(stale, lags[freshest])
    if not contrast.holds(STALENESS_MIN_FACTOR):
        return None
    rows = example_rows(evidence, "staleness")
    per_lag = ", ".join(f"lag {lag - freshest}: {fmt(g.mean)}" for lag, g in sorted(lags.items())[:6])
    return Hint(
        id="staleness",
        message=(
            f"Mismatch grows with policy staleness: rows generated by an older policy have {contrast.factor:.1f}× "
            f"the mean min(|δ|, 1) of the freshest ({per_lag}): off-policy lag, not numerics — bound the async "
            "lag or correct for it (IS over the behaviour policy)."
        ),
        evidence={
            "stale_mean": contrast.high.mean,
            "fresh_mean": contrast.low.mean,
            "factor": contrast.factor,
            "welch_t": contrast.t,
            "max_lag": float(max(lags) - freshest),
            "stale_tokens": contrast.high.n,
        },
        steps=sorted({row.step for row in rows})[:MAX_STEPS],
        rows=rows,
        look_at="rows whose policy_version lags their step the most",
    )
