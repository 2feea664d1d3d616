"""Every judgement of an analysis, run once when its result is built (``engine.build_result``): the key metrics'
levels, per-step levels, anomalies and trends, root-cause hints (``invalid_rows`` first when too much was skipped), the
most divergent round, the overall verdict.

``judge_analysis`` takes the finished numbers and returns the result with its findings filled in; the terminal, the
report and the exports only read them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from rollout_diag import catalogue
from rollout_diag.decisions.association import judge_trainer_columns
from rollout_diag.decisions.hints import Evidence, find_hints
from rollout_diag.decisions.levels import judge
from rollout_diag.decisions.prompts import prompt_findings, stale_prefix_cache
from rollout_diag.decisions.resume import resume_steps, resume_windows
from rollout_diag.decisions.skipped import invalid_rows_hint
from rollout_diag.decisions.trends import (
    ANOMALY_KEEP,
    ANOMALY_MIN_HISTORY,
    find_anomalies,
    keep_largest,
    label_resumes,
    round_trend,
    step_trends,
)
from rollout_diag.decisions.verdict import overall_verdict, step_levels_of
from rollout_diag.results import AnalysisResult, DivergentRound, PromptEvidence, step_ids

# The most divergent round "stands out" (is named as a finding, drawn in red) only when its mean |δ| is at least
# 1.5× the token-weighted mean of the other supported rounds: per-token |δ| is heavy-tailed and tokens of one row
# are correlated, so smaller gaps between rounds of a few hundred tokens are within their scatter. It must also be
# 1.5× with its largest |δ| token left out: one token of |δ| 10 among 200 adds 0.05 to a round's mean |δ|.
ROUND_STANDS_OUT = 1.5


def judge_analysis(
    result: AnalysisResult, evidence: Evidence | None, prompts: PromptEvidence | None = None
) -> AnalysisResult:
    """``result`` (numbers only) with every finding filled in: verdicts, step levels, anomalies (and how many were
    cut), trends, hints (none without ``evidence``), the most divergent round, the overall verdict. Warnings about
    the findings are appended to ``result.warnings``."""
    warnings = list(result.warnings)
    # steps right after a resumed run starts: labelled as its transient, left out of the step trends
    resumes = resume_windows(resume_steps(evidence), step_ids(result.steps).tolist()) if result.steps else {}
    trends = [t for t in (round_trend(result.rounds),) if t is not None] + step_trends(result.steps, resumes)
    anomalies, cut = keep_largest(find_anomalies(result.steps))
    anomalies = label_resumes(anomalies, resumes)
    if cut:
        warnings.append(f"{len(anomalies) + cut} anomaly flags: the {ANOMALY_KEEP} largest are kept, {cut} cut.")
    judged = replace(
        result,
        verdicts=judge(result.run.metrics),
        step_levels=step_levels_of(result.steps),
        anomalies=anomalies,
        anomalies_cut=cut,
        anomaly_check=anomaly_check(len(result.steps)),
        trends=trends,
        divergent_round=divergent_round(result.rounds, result.run.metrics),
        warnings=warnings,
        trainer_columns=judge_trainer_columns(result.trainer_columns),
    )
    invalid = invalid_rows_hint(result.skipped_data)
    hints = ([] if invalid is None else [invalid]) + ([] if evidence is None else find_hints(evidence, judged))
    hints += [hint for hint in (stale_prefix_cache(prompts),) if hint is not None]  # decisions/prompts.py
    verdict = overall_verdict(
        result.run.metrics,
        hints,
        rows=result.run.rows,
        tokens=result.run.tokens,
        catastrophic_threshold=result.catastrophic_threshold,
    )
    return replace(judged, hints=hints, verdict=verdict, prompts=prompt_findings(prompts))


def anomaly_check(steps: int) -> str:
    """Why the anomaly rule cannot apply to a run of ``steps`` steps ("" when it can): it compares a step with at
    least ANOMALY_MIN_HISTORY earlier ones."""
    needed = ANOMALY_MIN_HISTORY + 1
    if 1 < steps < needed:
        return f"anomaly check needs {needed}+ steps; this run has {steps}"
    return ""


def divergent_round(rounds: Sequence[Mapping[str, Any]], run_metrics: Mapping[str, float]) -> DivergentRound | None:
    """The round ``per_round/most_divergent_round`` names (the support rule, metrics/rounds.py), its mean |δ|, the
    token-weighted mean of the other rounds (tiny rounds weigh little), their ratio, the ratio without the round's
    largest |δ| token, whether it stands out (both ratios ≥ ROUND_STANDS_OUT: one token cannot make a round stand out)
    and the rounds below the support rule (never named, whatever their mean); None with fewer than two rounds or no
    round named."""
    named = run_metrics.get(catalogue.MOST_DIVERGENT_ROUND.key)
    if len(rounds) < 2 or named is None or named != named or named < 0:
        return None
    chosen = next((r for r in rounds if r["round"] == int(named)), None)
    if chosen is None:
        return None
    others = [r for r in rounds if r["round"] != chosen["round"] and r["token_count"] > 0]
    tokens = sum(r["token_count"] for r in others)
    others_mean = sum(r["logprob_abs_diff_mean"] * r["token_count"] for r in others) / tokens if tokens else None
    mean = chosen["logprob_abs_diff_mean"]
    factor = mean / others_mean if others_mean else None
    without = _factor_without_largest(chosen, others_mean)
    one_token = factor is not None and factor >= ROUND_STANDS_OUT and without is not None and without < ROUND_STANDS_OUT
    eligible = {r["round"] for r in catalogue.supported_rounds([dict(r) for r in rounds])}
    return DivergentRound(
        round=int(chosen["round"]),
        pooled=bool(chosen.get("pooled")),
        logprob_abs_diff_mean=mean,
        token_count=int(chosen["token_count"]),
        others_mean=others_mean,
        factor=factor,
        factor_without_largest=without,
        stands_out=factor is not None and factor >= ROUND_STANDS_OUT and not one_token,
        note=(
            f"made by one token: {without:.2g}× the others without its largest |δ| ({chosen['max_abs_diff']:.3g})"
            if one_token
            else ""
        ),
        unsupported=sorted(int(r["round"]) for r in rounds if r["round"] not in eligible),
    )


def _factor_without_largest(chosen: Mapping[str, Any], others_mean: float | None) -> float | None:
    """The round's mean |δ| with its largest |δ| token left out ((mean·n − max) / (n − 1)) over the others' mean;
    None without a max, a second token or the others' mean."""
    largest, count = chosen.get("max_abs_diff"), int(chosen["token_count"])
    if not others_mean or largest is None or largest != largest or count < 2:
        return None
    return (chosen["logprob_abs_diff_mean"] * count - largest) / (count - 1) / others_mean
