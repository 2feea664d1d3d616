"""The overall verdict and where the mismatch sits, as sentences: the first lines of ``analyze`` and of the report.

Reads values the result already carries (verdicts, steps, per_round/most_divergent_round, worst rows and
tokens); computes no metric.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rollout_diag import catalogue
from rollout_diag.catalogue import short_name as short_name
from rollout_diag.decisions.summary import LEVEL_ORDER as LEVEL_ORDER
from rollout_diag.decisions.summary import overall as overall
from rollout_diag.paths import file_label
from rollout_diag.render.format import number
from rollout_diag.results import AnalysisResult, StepResult

HEADLINE = catalogue.K3_KL.key  # the metric that ranks steps


def worst_step(steps: Sequence[StepResult], metric: str = HEADLINE) -> StepResult | None:
    scored = [s for s in steps if s.step is not None and _finite(s.metrics.get(metric))]
    return max(scored, key=lambda s: s.metrics[metric]) if scored else None


def most_divergent_round(result: AnalysisResult) -> dict | None:
    """The round the analysis named (``per_round/most_divergent_round``), when there are several rounds."""
    named = result.run.metrics.get(catalogue.MOST_DIVERGENT_ROUND.key)
    if len(result.rounds) < 2 or not _finite(named) or named < 0:
        return None
    return next((r for r in result.rounds if r["round"] == int(named)), None)


def where(result: AnalysisResult) -> list[str]:
    """Where the mismatch sits: the worst step, the most divergent round, the worst row and token."""
    lines = []
    step = worst_step(result.steps)
    run_value = result.run.metrics.get(HEADLINE)
    if step is not None and len(result.steps) > 1:
        value = step.metrics[HEADLINE]
        ratio = f", {value / run_value:.1f}× the run" if _finite(run_value) and run_value > 0 else ""
        lines.append(f"worst step {step.step} ({short_name(HEADLINE)} {number(value)}{ratio})")
    chosen = most_divergent_round(result)
    if chosen is not None:
        label = f"≥ {chosen['round']}" if chosen.get("pooled") else str(chosen["round"])
        lines.append(
            f"most divergent round {label} (mean |δ| {number(chosen['logprob_abs_diff_mean'])} over "
            f"{number(chosen['token_count'])} tokens)"
        )
    rows = [r for r in result.worst_rows if r.criterion == "log_ppl_abs_diff"]
    if rows:
        row = rows[0]
        lines.append(
            f"worst row: sample {row.sample_id} of step {row.step} ({file_label(row.file, result.inputs)}:{row.row}, "
            f"log-ppl diff {number(row.log_ppl_diff)})"
        )
    if result.worst_tokens:
        token = result.worst_tokens[0]
        lines.append(
            f"largest |δ| {number(abs(token.log_ratio))} at position {token.position} of sample {token.sample_id}"
        )
    return lines


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)
