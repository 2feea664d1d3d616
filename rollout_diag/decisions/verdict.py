"""The overall verdict: one level, its cause, one sentence saying what to do first (docs/hints.md, "The verdict").

Pure: a run's metrics, its hints and its size in, an :class:`~rollout_diag.results.OverallVerdict` out. The same
function judges a whole run, a step or a group of rows (``slicing``), so it reads nothing but its arguments.

The rules, in order:

1. **Pipeline first.** When a hint shows a pipeline bug (``PIPELINE_HINTS``: more than 1 % of the rows or tokens
   skipped as invalid, a shifted gather, no mask over environment-like tokens, placeholder logprobs under the mask,
   processed logprobs on one side), the level is
   ``bad``, the cause ``pipeline`` and the sentence says which to fix first: the mismatch metrics measure the bug,
   and a rollout correction would hide it.
2. **Token-level metrics set the level.** The judged metrics (``catalogue.Role.JUDGED``) set it at their worst,
   except those whose expected value grows with the response length (``catalogue.Role.LENGTH_GROWING``: χ² seq ≈
   exp(N·Var δ) − 1): they never raise the level above the other metrics'; when they would, a note says what
   they mean (sequence-level IS would be degenerate at N tokens per row; prefer a token-level correction).
3. **A negative χ²** is judged ok and gets a note that reads it. χ² token: a sample estimate below its expected
   value (≈ 0). χ² seq (``_chi2_seq_note``): E[ρ] = 1 makes E[ρ²] ≥ 1, so a mean of ρ² far below 1 is what
   degenerate weights give (most rows ≈ 0, a few huge ones the sample missed). It is called *degenerate* (the
   length note's sentence) when χ² seq ≤ ``DEGENERATE_CHI2`` or a row's log-weight spreads by σ² >
   ``SEQ_SPREAD_RELIABLE`` (σ² ≈ tokens per row × 2·k3_kl, as Var δ ≈ 2·k3_kl for small δ); *noise* only when σ²
   is small and χ² seq lies within ``NOISE_SE`` standard errors of a log-normal ρ's mean of ρ² over the rows;
   otherwise *a shift*: the row weights sit below 1 on average.
4. **A few outliers or a broad mismatch?** When the metrics at the worst level are ok without the catastrophic
   tokens (``diag/…_without_catastrophic``), the sentence says so: the outliers are the problem, not the bulk.
5. **Little data** (``LITTLE_DATA_TOKENS`` model tokens or fewer, or one row) adds a note: the levels are
   indicative.
6. **Identical logprobs** (no model token whose two logprobs differ in any bit, ``diag/mismatched_tokens`` = 0,
   compared as float32 where either column was; a result without that key: mean |δ| exactly 0) over at least one
   model token: level ``ok``, cause ``identical``, a sentence saying δ ≡ 0 and the two ways that happens
   (deterministic, batch-invariant inference, or a trainer column copied from the rollout's as verl's bypass mode
   does) and how to tell them apart, and no notes (a χ² of −4e-13 is rounding of exp(0), and one token cannot move a
   level that every token says is 0). Both columns all exactly 0 are placeholders, not agreement: level ``bad``,
   cause ``pipeline``, finding ``dummy_logprobs``.
7. **A few bitwise differences** under an ok level: the sentence says how many model tokens differ in any bit, their
   share and the largest |δ| (``BITWISE_ROUNDING``: a max |δ| no larger reads as rounding), so that 96 tokens one ulp
   apart do not read as a plain "ok".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rollout_diag import catalogue
from rollout_diag.catalogue import short_name
from rollout_diag.decisions.hints import PIPELINE_HINT_IDS
from rollout_diag.decisions.levels import RULES, judge
from rollout_diag.decisions.prompts import FIX_FIRST as STALE_FIX_FIRST
from rollout_diag.formatting import number, percent
from rollout_diag.results import Hint, OverallVerdict, StepResult, StepTable, Verdict, metric_column

LEVEL_ORDER = ("bad", "watch", "ok", "n/a")
RESUME_SHARE = 0.5  # a resume_spike is a pipeline finding when its steps carry ≥ half of the run's Σ min(|δ|, 1)
# Hints that are pipeline bugs, in the order to fix them: a shifted gather moves every token's logprob, so it
# comes first; a missing mask or placeholder logprobs put tokens nobody scored into the loss; processed logprobs
# (temperature, top-p) change every token's value but keep the tokens right.
# Rows skipped as invalid come before them all: past 1 % skipped (decisions/skipped.py), the metrics describe the rows
# that happened to be valid, so no other finding can be read until every row is.
# Truncated sampling logprobs come before temperature: both change every token's value, truncation also the support.
# Retokenization changes the tokens after turn boundaries only; a resume spike counts only where it carries at least
# half of the run's mismatch (RESUME_SHARE): a small transient in a long run is no pipeline bug.
# stale_prefix_cache only when it explains the mismatch (``_is_pipeline``)
PIPELINE_HINTS = (*PIPELINE_HINT_IDS, "stale_prefix_cache")
FIX_FIRST = {
    "invalid_rows": "fix what writes the dump, so that no row is left out (the skipped rows are listed with their "
    "file, row and column; --strict stops at the first)",
    "off_by_one": "fix the off-by-one gather of the logprobs (labels vs logits shifted by one position)",
    "no_mask": "give the response mask (--column mask=NAME), so that environment tokens leave the measurement",
    "dummy_logprobs": "fix the response mask, so that tokens the engine never scored leave the loss",
    "fill_values": "fix the response mask (or the dump), so that tokens holding a fill value instead of a logprob "
    "leave the loss",
    "processed_logprobs": "compute both sides' logprobs from the same distribution, at the same temperature (one "
    "side's come from a temperature-scaled one)",
    "top_p_truncation": "take the rollout logprobs from the full distribution, before top-p / top-k (vLLM: "
    "logprobs_mode='raw_logprobs'), or apply the same truncation in the trainer",
    "retokenization": "reuse the rollout's token ids for the multi-turn history (do not re-tokenize it in the "
    "trainer), or re-score with them",
    "resume_spike": "check what the resume restores (the inference engine's weights and their sync, the "
    "checkpoint's optimizer and scheduler state) and leave the steps right after it out of any comparison",
    "stale_prefix_cache": STALE_FIX_FIRST,
}
# A single token with |δ| = 1 moves k3_kl by (e − 2)/N: over 1000 tokens that is 7e-4, close to the watch
# level (1e-3), so a verdict on fewer tokens rests on a handful of them.
LITTLE_DATA_TOKENS = 1000
LITTLE_DATA_ROWS = 1  # a sequence-level metric over one row has no spread to speak of
# Rule 7: a largest |δ| at most this reads as rounding (float32's ulp at |logprob| ≈ 8 is 9.5e-7; bf16's is far above)
BITWISE_ROUNDING = 1e-6
# χ² seq read when negative (rule 3): E[ρ²] ≥ 1, so a mean of ρ² at or below 0.5 says at least half the rows carry
# almost no weight; a log-normal ρ's sample mean of ρ² stops estimating E[ρ²] = exp(σ²) once σ² > 1 (its variance
# exp(6σ²) − exp(2σ²) outgrows any batch); within 3 standard errors a negative value is sampling noise.
DEGENERATE_CHI2 = -0.5
SEQ_SPREAD_RELIABLE = 1.0
NOISE_SE = 3.0
ADVICE = {
    "bad": "the run is off-policy enough to matter: consider a rollout correction (compare-presets shows what "
    "each would do to this data).",
    "watch": "look at the per-step trends and where the mismatch sits.",
    "ok": "training and rollout agree within the usual bf16/fp32 range.",
    "n/a": "no key metric could be computed.",
}
# key metric -> the same metric over the tokens with |δ| ≤ the catastrophic threshold
WITHOUT_CATASTROPHIC = {
    catalogue.K3_KL.key: catalogue.K3_KL_WITHOUT_CATASTROPHIC.key,
    catalogue.CHI2_TOKEN.key: catalogue.CHI2_TOKEN_WITHOUT_CATASTROPHIC.key,
}


def _is_pipeline(hint: Hint) -> bool:
    """Whether a pipeline hint sets the cause: a stale prefix cache only where its excess explains the mismatch
    (decisions/prompts.py ``STALE_EXPLAINS_SHARE``), a resume spike only where its steps carry ≥ RESUME_SHARE of the
    run's mismatch, every other pipeline hint always."""
    if hint.id == "resume_spike":
        return hint.evidence.get("share_of_run", 0.0) >= RESUME_SHARE
    return hint.id != "stale_prefix_cache" or hint.evidence.get("explains_mismatch") == 1.0


def worst_level(levels: Sequence[str]) -> str:
    """The worst of ``levels`` (bad > watch > ok > n/a)."""
    return next((level for level in LEVEL_ORDER if level in levels), "n/a")


def overall_verdict(
    metrics: Mapping[str, float],
    hints: Sequence[Hint] = (),
    *,
    rows: int,
    tokens: int,
    catastrophic_threshold: float = 1.0,
) -> OverallVerdict:
    """The verdict on ``metrics`` (a run's, a step's or a group's), its ``hints``, ``rows`` rows and ``tokens``
    model tokens (see the module docstring for the rules)."""
    verdicts = judge(dict(metrics))
    pipeline = [hint for kind in PIPELINE_HINTS for hint in hints if hint.id == kind and _is_pipeline(hint)]
    if not pipeline and identical(metrics, tokens):
        if _all_zero(metrics):  # both columns all 0: placeholders, nothing was scored on either side
            sentence = (
                f"a pipeline bug (dummy_logprobs): every one of the {tokens} model tokens has a logprob of exactly 0 "
                f"on both sides: placeholders, not agreement. First, {FIX_FIRST['dummy_logprobs']}, or dump the "
                "logprobs each side computed."
            )
            return OverallVerdict("bad", "pipeline", sentence, [], ["dummy_logprobs"], [])
        return OverallVerdict("ok", "identical", _identical_sentence(tokens), [], [], [])
    notes = _negative_notes(verdicts, metrics, rows, tokens) + _little_data_notes(rows, tokens)
    growing = set(catalogue.keys_with_role(catalogue.Role.LENGTH_GROWING))
    token_level = [v for v in verdicts if v.metric not in growing]
    level = worst_level([v.level for v in token_level])
    for verdict in verdicts:
        if verdict.metric in growing and LEVEL_ORDER.index(verdict.level) < LEVEL_ORDER.index(level):
            notes.append(_length_note(verdict, rows, tokens))
    flagged = [v for v in verdicts if v.level == level and level in ("bad", "watch")]
    if pipeline:
        first = pipeline[0]
        rest = [hint.id for hint in pipeline[1:]]
        until = (
            "the metrics describe only the rows that were valid, and a rollout correction chosen on them would hide "
            "the bug."
            if first.id == "invalid_rows"
            else "the mismatch metrics measure the bug, and a rollout correction would hide it."
        )
        sentence = (
            f"a pipeline bug ({first.id}). First, {FIX_FIRST[first.id]}"
            + (f"; then look again at {', '.join(rest)}" if rest else "")
            + f". Until then {until}"
        )
        # the other notes read the metrics, which measure the bug here: only the amount of data is worth a note
        notes = _little_data_notes(rows, tokens)
        return OverallVerdict(
            "bad", "pipeline", sentence, [v.metric for v in flagged], [hint.id for hint in pipeline], notes
        )
    if level in ("bad", "watch"):
        names = ", ".join(short_name(v.metric) for v in flagged)
        detail = f"{names} at {level} level ({len(flagged)} of {len(verdicts)} key metrics)"
        outliers = _outliers(flagged, metrics, catastrophic_threshold)
        sentence = (
            f"{detail}{outliers} — a few outlier tokens, not a broad mismatch: look at the worst tokens; a "
            "token-level correction (truncated token IS or token rejection) bounds them."
            if outliers
            else f"{detail}: {ADVICE[level]}"
        )
        return OverallVerdict(level, "mismatch", sentence, [v.metric for v in flagged], [], notes)
    return OverallVerdict(level, "none", ADVICE[level] + _bitwise(metrics, level), [], [], notes)


def _bitwise(metrics: Mapping[str, float], level: str) -> str:
    """Rule 7: " Bitwise, 96 of 128 model tokens (75 %) differ, by at most |δ| 1.2e-7: rounding." under an ok level
    with differing tokens; "" otherwise."""
    count = metrics.get(catalogue.MISMATCHED_TOKENS.key)
    share = metrics.get(catalogue.MISMATCHED_TOKEN_SHARE.key)
    largest = metrics.get(catalogue.MAX_ABS_DELTA.key)
    if level != "ok" or not count or share is None or largest is None or math.isnan(share):
        return ""
    total = round(count / share)
    reads = ": rounding-level differences, not identical logprobs" if largest <= BITWISE_ROUNDING else ""
    return (
        f" Bitwise, {int(count):,} of {total:,} model tokens ({percent(share)}) differ, by at most |δ| "
        f"{number(largest)}{reads}."
    )


def _outliers(flagged: Sequence[Verdict], metrics: Mapping[str, float], threshold: float) -> str:
    """ ", from N catastrophic tokens (…): without them k3_kl 2.3e-4 and chi2_token 5.4e-4 are ok" when every
    flagged token metric that has a without-catastrophic twin is ok without them (and one has); else ""."""
    count = metrics.get(catalogue.CATASTROPHIC_TOKENS.key)
    share = metrics.get(catalogue.CATASTROPHIC_TOKEN_SHARE.key)
    twins = [(v, metrics.get(WITHOUT_CATASTROPHIC[v.metric])) for v in flagged if v.metric in WITHOUT_CATASTROPHIC]
    if not count or share is None or not twins or any(value is None or math.isnan(value) for _, value in twins):
        return ""
    if any(abs(value) >= verdict.watch for verdict, value in twins if value is not None and value > 0):
        return ""
    without = " and ".join(f"{short_name(verdict.metric)} {number(value)}" for verdict, value in twins)
    return (
        f", from {int(count)} catastrophic token(s) (|δ| > {threshold:g}, {percent(share)} of model tokens): "
        f"without them {without} {'is' if len(twins) == 1 else 'are'} ok"
    )


def identical(metrics: Mapping[str, float], tokens: int) -> bool:
    """Whether trainer and rollout logprobs are equal on every model token, over ``tokens`` > 0: no token whose two
    values differ in any bit (``diag/mismatched_tokens``); without that key, mean |δ| exactly 0 (a sum of |δ| is 0
    only when every term is)."""
    mismatched = metrics.get(catalogue.MISMATCHED_TOKENS.key)
    if mismatched is not None and not math.isnan(mismatched):
        return tokens > 0 and mismatched == 0.0
    value = metrics.get(catalogue.LOGPROB_ABS_DIFF.key)
    return tokens > 0 and value is not None and value == 0.0


def _all_zero(metrics: Mapping[str, float]) -> bool:
    """Whether the rollout's logprobs are all exactly 0 (with identical logprobs: the trainer's too): mean_i −R_i[r] is
    0, and a sum of logprobs (≤ 0) is 0 only when every one is."""
    return metrics.get(catalogue.ROLLOUT_LOG_PPL.key) == 0.0


def _identical_sentence(tokens: int) -> str:
    return (
        f"trainer and rollout agree exactly: all {tokens} model tokens have bitwise the same logprob on both sides "
        "(δ ≡ 0), so there is no mismatch to correct. Two ways give this: deterministic, batch-invariant inference, "
        "or a trainer column copied from the rollout's (verl's bypass mode). If the trainer ran no forward pass for "
        "old_log_probs (verl: rollout_correction.bypass_mode), it is a copy and this dump cannot measure the mismatch."
    )


def _negative_notes(verdicts: Sequence[Verdict], metrics: Mapping[str, float], rows: int, tokens: int) -> list[str]:
    notes = []
    for v in verdicts:
        if v.value is None or math.isnan(v.value) or v.value >= 0:
            continue
        if v.metric == catalogue.CHI2_SEQ.key:
            notes.append(_chi2_seq_note(v.value, metrics, rows, tokens))
        else:
            notes.append(
                f"{short_name(v.metric)} is negative ({number(v.value)}): a sample estimate below its expected value, "
                "read as ≈ 0 (no spread in the IS weights), not as large."
            )
    return notes


def seq_log_weight_spread(metrics: Mapping[str, float], rows: int, tokens: int) -> float | None:
    """σ², the variance of a row's log-weight S_i = Σ_t δ: tokens per row × Var δ, with Var δ ≈ 2·k3_kl (k3 ≈ δ²/2
    for small δ, and never negative); None without k3_kl or rows."""
    k3 = metrics.get(catalogue.K3_KL.key)
    if k3 is None or math.isnan(k3) or rows <= 0:
        return None
    return tokens / rows * 2.0 * max(k3, 0.0)


def _chi2_seq_note(value: float, metrics: Mapping[str, float], rows: int, tokens: int) -> str:
    """A negative χ² seq read as degenerate weights, sampling noise or a shift (module docstring, rule 3)."""
    name = short_name(catalogue.CHI2_SEQ.key)
    spread = seq_log_weight_spread(metrics, rows, tokens)
    mean = tokens / rows if rows else 0.0
    if value <= DEGENERATE_CHI2 or (spread is not None and spread > SEQ_SPREAD_RELIABLE):
        measured = "" if spread is None else f"; a row's log-weight varies by σ² ≈ {number(spread)}"
        near = ", near −1" if value <= DEGENERATE_CHI2 else " (negative)"
        return (
            f"{name} is {number(value)}{near}: what degenerate sequence weights give (most rows' weights ≈ 0, a few "
            f"huge ones the sample missed{measured}), not a lack of spread. Sequence-level IS would be degenerate at "
            f"a mean of {mean:.0f} tokens per row: prefer token-level correction."
        )
    error = math.sqrt(max(math.expm1(6 * spread) - math.expm1(2 * spread), 0.0) / rows) if spread is not None else 0
    if spread is not None and value >= -NOISE_SE * error:
        return (
            f"{name} is negative ({number(value)}): within the sampling noise of {rows} rows (±{number(error)} at "
            f"σ² ≈ {number(spread)}), read as ≈ 0 (little spread in the sequence weights), not as large."
        )
    return (
        f"{name} is negative ({number(value)}), below what sampling noise over {rows} rows explains: the sequence "
        "weights sit below 1 on average (a systematic shift between the two sides), not a lack of spread."
    )


def _little_data_notes(rows: int, tokens: int) -> list[str]:
    if tokens <= LITTLE_DATA_TOKENS or rows <= LITTLE_DATA_ROWS:
        return [
            f"judged on little data ({tokens} model tokens in {rows} row{'s' if rows != 1 else ''}): one token can "
            "move a level; read the levels as indicative."
        ]
    return []


def _length_note(verdict: Verdict, rows: int, tokens: int) -> str:
    mean = tokens / rows if rows else 0.0
    return (
        f"{short_name(verdict.metric)} is at {verdict.level} level ({number(verdict.value)}) while the token-level "
        f"metrics are not: it grows with the response length (≈ exp(N·Var δ) − 1), so sequence-level IS would be "
        f"degenerate at a mean of {mean:.0f} tokens per row: prefer token-level correction."
    )


def step_levels(steps: Sequence[tuple[int | None, Mapping[str, float]]]) -> list[dict[str, Any]]:
    """Per step: its level (the worst of its judged metrics but the length-growing ones, as the overall verdict's)
    and each judged metric's level (what ``analyze``'s per-step table and the report's cards count)."""
    growing = set(catalogue.keys_with_role(catalogue.Role.LENGTH_GROWING))
    out: list[dict[str, Any]] = []
    for step, metrics in steps:
        levels = {v.metric: v.level for v in judge(dict(metrics))}
        level = worst_level([value for key, value in levels.items() if key not in growing])
        out.append({"step": step, "level": level, "levels": levels})
    return out


def step_levels_of(steps: Sequence[StepResult]) -> list[dict[str, Any]]:
    """``step_levels`` of every step, judged a metric column at a time (the same levels as ``judge`` step by step:
    ``n/a`` for a missing or NaN value, ``bad`` at or above ``bad``, ``watch`` at or above ``watch``, else ``ok``).
    Steps judged alike share one ``levels`` dict (read it, never change it): 200 000 steps hold a few distinct
    patterns, not 200 000 dicts."""
    growing = set(catalogue.keys_with_role(catalogue.Role.LENGTH_GROWING))
    count = len(steps)
    names = np.array(LEVEL_ORDER, dtype=object)
    metrics: list[str] = []
    ranks: list[np.ndarray] = []
    worst = np.full(count, len(LEVEL_ORDER) - 1)  # the index in LEVEL_ORDER of each step's worst level
    for rule in RULES:
        _, values = metric_column(steps, rule.metric)
        with np.errstate(invalid="ignore"):
            rank = np.where(np.isnan(values), 3, np.where(values >= rule.bad, 0, np.where(values >= rule.watch, 1, 2)))
        metrics.append(rule.metric)
        ranks.append(rank)
        if rule.metric not in growing:
            worst = np.minimum(worst, rank)
    ids = [step.step for step in steps] if not isinstance(steps, StepTable) else steps.step_ids.tolist()
    if ranks:  # each distinct row of levels made into a dict once
        patterns, which = np.unique(np.stack(ranks, 1), axis=0, return_inverse=True)
        shared = [dict(zip(metrics, names[pattern].tolist(), strict=True)) for pattern in patterns]
        levels_of = [shared[index] for index in which.reshape(-1).tolist()]
    else:
        levels_of = [{} for _ in range(count)]
    return [
        {"step": step, "level": level, "levels": levels}
        for step, level, levels in zip(ids, names[worst].tolist(), levels_of, strict=True)
    ]


def group_verdict(
    metrics: Mapping[str, float], *, rows: int, tokens: int, catastrophic_threshold: float = 1.0
) -> dict[str, object]:
    """A ``--by`` group's verdict: the overall verdict's rules on the group's own metrics (its level, sentence and
    notes) and each judged metric's value and level."""
    verdict = overall_verdict(metrics, rows=rows, tokens=tokens, catastrophic_threshold=catastrophic_threshold)
    return {
        "level": verdict.level,
        "sentence": verdict.sentence,
        "notes": list(verdict.notes),
        "metrics": {v.metric: {"value": v.value, "level": v.level} for v in judge(dict(metrics))},
    }
