"""Findings in words: the "Where:" lines and the most divergent round, worded once for every place that prints them
(the terminal's first screen and ``watch``, the report's "What stands out", a notebook's ``_repr_html_``).

Reads what a result carries (its steps, ``divergent_round``, worst rows and tokens, groups, trends); judges nothing:
whether a round stands out was decided when the result was built (rollout_diag/decisions/). Plain strings: each
renderer escapes and styles them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import groupby
from typing import TYPE_CHECKING

import numpy as np

from rollout_diag.catalogue import (
    K1_WRITTEN_ROWS,
    K1_WRITTEN_TOKENS,
    K3_KL,
    LOGPROB_ABS_DIFF,
    OFFPOLICY_PREFIX,
    short_name,
)
from rollout_diag.formatting import group_label, number, percent, visible
from rollout_diag.paths import file_label
from rollout_diag.presets import k1_bounds_asymmetric
from rollout_diag.results.columns import StepTable

if TYPE_CHECKING:
    from rollout_diag.results.analysis import AnalysisResult, GroupResult
    from rollout_diag.results.association import TrainerColumns
    from rollout_diag.results.rows import DivergentRound, StepResult

HEADLINE = K3_KL.key  # the metric that ranks steps


def worst_step(steps: Sequence[StepResult], metric: str = HEADLINE) -> StepResult | None:
    """The step with the largest finite ``metric`` (the first of equal maxima); None when no step has one."""
    if isinstance(steps, StepTable) and (read := steps.float_column(metric)) is not None:
        present, values = read  # from the column: no step is built but the worst (the first of equal maxima)
        scored = np.flatnonzero(present & np.isfinite(values))
        return steps.step(int(scored[np.argmax(values[scored])])) if scored.size else None
    scored_steps = [s for s in steps if s.step is not None and _finite(s.metrics.get(metric))]
    return max(scored_steps, key=lambda s: s.metrics[metric]) if scored_steps else None


def most_divergent_round(result: AnalysisResult) -> DivergentRound | None:
    """The round the analysis named as most divergent, when it stands out from the others (``divergent_round``)."""
    found = result.divergent_round
    return found if found is not None and found.stands_out else None


def round_label(found: DivergentRound) -> str:
    """The round's number, "≥ 8" for the bucket that pools every later round."""
    return f"≥ {found.round}" if found.pooled else str(found.round)


def round_numbers(found: DivergentRound, *, versus: bool = True) -> str:
    """ "mean |δ| 0.031 over 1,204 tokens, 2.1× the other rounds" (the ratio left out without ``versus``)."""
    ratio = f", {found.factor:.2g}× the other rounds" if versus and found.factor is not None else ""
    return f"mean |δ| {number(found.logprob_abs_diff_mean)} over {number(found.token_count)} tokens{ratio}"


def _no_round(found: DivergentRound) -> str:
    made = f"; {found.note}" if found.note else ""
    return f"no round stands out (the highest, round {round_label(found)}: {round_numbers(found)}{made})"


def round_phrase(found: DivergentRound) -> str:
    """ "most divergent round 3 (mean |δ| …, 2.1× the other rounds)" or "no round stands out (the highest, …)"."""
    if found.stands_out:
        return f"most divergent round {round_label(found)} ({round_numbers(found)})"
    return _no_round(found)


def round_sentence(found: DivergentRound) -> str:
    """:func:`round_phrase` as a finding of its own: "Most divergent round: 3 (…)." or "No round stands out (…)."."""
    if found.stands_out:
        return f"Most divergent round: {round_label(found)} ({round_numbers(found)})."
    phrase = _no_round(found)
    return f"{phrase[0].upper()}{phrase[1:]}."


def worst_group_line(groups: Sequence[GroupResult]) -> str | None:
    """The worst group of each spec, joined ("env_name=code is the worst group: bad (k3_kl 0.035, 31 % of
    tokens)"); None without groups."""
    lines = []
    for column, members in groupby(groups, key=lambda g: g.column):
        worst = next(iter(members))
        k3 = worst.metrics.get(K3_KL.key)
        lines.append(
            f"{column}={group_label(worst.value)} is the worst group: {worst.verdict.get('level', 'n/a')} "
            f"(k3_kl {number(k3)}, {percent(worst.token_share)} of tokens)"
        )
    return "; ".join(lines) or None


def where(result: AnalysisResult) -> list[str]:
    """Where the mismatch sits: the step trends that rise ("mean |δ| up 2.5× from step 0 to 44"), why the mismatch moved
    between the early and the late steps (``drift``, when beyond noise), the worst step,
    the most divergent round, the worst row and token, the worst group of each ``--by`` spec. A place whose value is
    0 is no place (identical logprobs have no worst step, row or token)."""
    lines = [trend.headline for trend in result.trends if trend.against == "step" and trend.headline]
    lines += [sentence for entry in result.drift if (sentence := drift_sentence(entry))]
    step = worst_step(result.steps)
    run_value = result.run.metrics.get(HEADLINE)
    if step is not None and len(result.steps) > 1 and _positive(step.metrics.get(HEADLINE)):
        value = step.metrics[HEADLINE]
        ratio = (
            f", {value / run_value:.1f}× the run"
            if run_value is not None and _finite(run_value) and run_value > 0
            else ""
        )
        lines.append(f"worst step {step.step} ({short_name(HEADLINE)} {number(value)}{ratio})")
    if result.divergent_round is not None and _positive(result.divergent_round.logprob_abs_diff_mean):
        lines.append(round_phrase(result.divergent_round))
    rows = [r for r in result.worst_rows if r.criterion == "log_ppl_abs_diff" and r.log_ppl_diff != 0]
    if rows:
        row = rows[0]
        lines.append(
            f"worst row: sample {row.sample_id} of step {row.step} ({file_label(row.file, result.inputs)}:{row.row}, "
            f"log-ppl diff {number(row.log_ppl_diff)})"
        )
    if result.worst_tokens and result.worst_tokens[0].log_ratio != 0:
        token = result.worst_tokens[0]
        lines.append(
            f"largest |δ| {number(abs(token.log_ratio))} at position {token.position} of sample {token.sample_id}"
        )
    line = worst_group_line([group for group in result.groups if _positive(group.metrics.get(HEADLINE))])
    if line:
        lines.append(line)
    return lines + trainer_column_lines(result.trainer_columns)


# What a relation of row mismatch to a trainer column means for the correction, by column and sign.
_MEANING = {
    ("reward", 1): "the rows the trainer rewards most are those trainer and rollout disagree on: a correction that "
    "drops or down-weights them removes the reward signal",
    ("advantage", 1): "IS truncation or rejection would cut most where the advantage is highest: the gradient GRPO "
    "wanted",
    (
        "entropy",
        1,
    ): "the mismatch sits in uncertain (high-entropy) rows, where sampling noise and precision matter most",
    ("response_length", 1): "longer responses diverge more (per-token mismatch grows along the sequence)",
    ("response_length", -1): "short responses diverge more (their mean over few tokens is noisier)",
}


def trainer_column_lines(found: TrainerColumns | None) -> list[str]:
    """The relations of row mismatch to the trainer's columns that stand out (decided in
    decisions/association.py), one sentence each ("row |log-ppl diff| rises with reward (Spearman 0.41, 95 % 0.35 to
    0.47, 1,200 rows): …"; "the worst row of a uid group is its highest-advantage sample in 31 of 40 groups …")."""
    if found is None:
        return []
    lines = []
    for item in found.correlations:
        if not item.significant:
            continue
        sign = 1 if item.spearman > 0 else -1
        meaning = _MEANING.get((item.role, sign))
        trend = "rises" if sign > 0 else "falls"
        lines.append(
            f"row |log-ppl diff| {trend} with {item.column} (Spearman {number(item.spearman, 2)}, "
            f"95 % {number(item.ci_low, 2)} to {number(item.ci_high, 2)}, {item.rows:,} rows)"
            + (f": {meaning}" if meaning else "")
        )
    groups = found.groups
    if groups is not None and groups.significant:
        lines.append(
            f"the worst row of a {groups.column} group (largest |log-ppl diff|) is its highest-{groups.ranked_by} "
            f"sample in {groups.worst_is_best:,} of {groups.groups:,} groups (chance: {number(groups.expected, 3)}): "
            "IS would cut exactly the gradient GRPO wanted"
        )
    return lines


def _positive(value: float | None) -> bool:
    return _finite(value) and value > 0  # type: ignore[operator]


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def k1_bounds_line(name: str, config: dict, metrics: dict) -> str | None:
    """One line for a preset whose first asymmetric k1 option (L·U ≠ 1) has ``summary/k1_as_written_*``: verl
    applies ρ ∈ [1/U, 1/L] (verl #6377, closed unmerged; its numbers are kept), and what [L, U] as written would
    reject; None for any other preset."""
    written_tokens = metrics.get(K1_WRITTEN_TOKENS.key)
    if written_tokens is None:
        return None
    options = str(config.get("rollout_rs") or "").split(",")
    thresholds = str(config.get("rollout_rs_threshold") or "").split(",")
    for index, option in enumerate(options):
        spec = thresholds[index] if len(thresholds) == len(options) else thresholds[0]
        if not option.endswith("_k1") or "_" not in spec:
            continue
        lower, upper = (float(part) for part in spec.split("_"))
        if not k1_bounds_asymmetric(math.log(lower), math.log(upper)):
            continue
        verl_tokens = metrics.get(f"{OFFPOLICY_PREFIX}rollout_rs_{option}_masked_fraction")
        verl_rows = metrics.get(f"{OFFPOLICY_PREFIX}rollout_rs_{option}_seq_masked_fraction")
        written_rows = metrics.get(K1_WRITTEN_ROWS.key)
        applied = f"[{number(1 / upper, 6)}, {number(1 / lower, 6)}]"
        return (
            f"{name}: verl applies {option} {spec} as ρ ∈ [1/U, 1/L] = {applied} "
            f"(rejecting {percent(verl_tokens)} of tokens, {percent(verl_rows)} of rows); ρ ∈ [{lower:g}, {upper:g}] "
            f"as written would reject {percent(written_tokens)} of tokens, {percent(written_rows)} of rows"
        )
    return None


EXTREME_PROMPTS_NAMED = 3


def extreme_prompts_line(result: AnalysisResult) -> str | None:
    """The prompts that are extreme every time, in one line ("2 prompts are extreme every time …"); None when the
    result lists none (or the dump has no prompt identity)."""
    found = getattr(result, "prompts", None)
    if found is None or not found.extreme:
        return None
    count = len(found.extreme) + found.extreme_cut
    named = ", ".join(
        f"{visible(item.prompt[:40])} ({item.rows} rows, {len(item.steps)}{'+' if len(item.steps) >= 10 else ''} steps)"
        for item in found.extreme[:EXTREME_PROMPTS_NAMED]
    )
    more = count - min(len(found.extreme), EXTREME_PROMPTS_NAMED)
    return (
        f"{count} prompt{'s are' if count > 1 else ' is'} extreme every time (every row in the worst "
        f"{percent(found.worst_share)} by |log-ppl diff|, score ≥ {number(found.worst_threshold)}): {named}"
        + (f" and {more} more" if more > 0 else "")
        + "; --export-repro FILE writes their rows for replay"
    )


# ------------------------------------------------------------------------------------------------ drift
_DRIFT_NAMES = {LOGPROB_ABS_DIFF.key: "mean |δ|"}
_BUCKET_NOUNS = {"probability": "probability bucket", "length": "length", "position": "position", "round": "round"}


def _toward(factor: str, bucket: str) -> str:
    """The bucket the tokens moved toward, in words."""
    if factor == "probability":
        return f"tokens of rollout {bucket}"
    if factor == "length":
        return f"responses of {bucket} tokens"
    if factor == "position":
        return f"positions {bucket}"
    if factor == "round":
        return f"round {bucket}"
    return f"rows of {factor} = {bucket}"


def _share(value: float) -> str:
    return f"{100.0 * value:.0f} %"


def drift_steps(pair: Sequence[int]) -> str:
    """A window's steps: "0–8", or "3" for one step."""
    return str(pair[0]) if pair[0] == pair[1] else f"{pair[0]}–{pair[1]}"


def drift_name(metric: str) -> str:
    """A drift metric's name in sentences: k3_kl, mean |δ|."""
    return _DRIFT_NAMES.get(metric) or short_name(metric)


def drift_sentence(entry: dict) -> str | None:
    """The analysis' ``drift`` entry of one metric in one sentence when its change is beyond noise (None otherwise):
    "k3_kl rose 3.1× from steps 0–8 to 36–44: 74 % from the shift toward responses of 1024–2047 tokens (length mix),
    little change within each length"."""
    if not entry.get("beyond_noise"):
        return None
    ratio = entry["ratio"]
    name = drift_name(entry["metric"])
    verb = "rose" if entry["change"] > 0 else "fell"
    moved = f"rose {ratio:.1f}×" if entry["change"] > 0 else f"fell {1.0 / ratio:.1f}×" if ratio else "fell"
    head = f"{name} {moved} from steps {drift_steps(entry['from_steps'])} to {drift_steps(entry['to_steps'])}"
    found = entry.get("explained_by")
    if not found:
        return head
    factor = found["factor"]
    noun = _BUCKET_NOUNS.get(factor, f"{factor} group")
    if found["part"] == "mix":
        tail = (
            f"little change within each {noun}"
            if found["rest_little"]
            else f"within each {noun} it {verb} too ({_share(found['rest'])})"
        )
        toward = _toward(factor, found["toward"])
        return f"{head}: {_share(found['share'])} from the shift toward {toward} ({factor} mix), {tail}"
    most = f" (no factor's mix carries more than {_share(found['mix_share'])})" if found["mix_share"] > 0 else ""
    return (
        f"{head}: the mismatch itself {verb} within buckets, not a shift in rollout probability, length, position "
        f"or round{most}"
    )
