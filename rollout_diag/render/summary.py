"""The overall verdict and where the mismatch sits, as lines: the first lines of ``analyze`` (and, through the same
result fields, of the report's banner and of ``compare-presets``).

Reads what the result already carries (``verdict``, its hints, ``divergent_round``, steps, worst rows and tokens);
judges and computes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from rich.console import RenderableType
from rich.text import Text

from rollout_diag import catalogue
from rollout_diag.catalogue import short_name as short_name
from rollout_diag.paths import file_label
from rollout_diag.render.format import LEVEL_STYLE, number, plain
from rollout_diag.render.groups import worst_group_line
from rollout_diag.results import (
    AnalysisResult,
    Hint,
    OverallVerdict,
    Recommendation,
    SkippedData,
    StepResult,
    StepTable,
)

HEADLINE = catalogue.K3_KL.key  # the metric that ranks steps
INVALID_ROWS = "invalid_rows"  # the finding whose words are the skipped data's (decisions/skipped.py names it)


def verdict_lines(
    verdict: OverallVerdict | None, hints: Sequence[Hint] = (), skipped: SkippedData | None = None
) -> list[RenderableType]:
    """``Verdict: LEVEL — sentence``, then what reading skipped ("64 of 128 rows (50 %) skipped: …", as the finding
    ``invalid_rows`` when it is one), each other pipeline finding (the hint's sentence), then the notes."""
    if verdict is None:
        return [plain("Verdict: – (this result carries no verdict: made by an older rollout-diag)")]
    line = Text("Verdict: ", style="bold")
    line.append(verdict.level.upper(), style=LEVEL_STYLE.get(verdict.level, ""))
    if verdict.cause == "pipeline":
        line.append(" (pipeline bug)", style=LEVEL_STYLE.get(verdict.level, ""))
    line.append_text(plain(f" — {verdict.sentence}"))
    lines: list[RenderableType] = [line]
    by_id = {hint.id: hint for hint in hints}
    if skipped is not None and skipped.rows and INVALID_ROWS not in verdict.findings:
        lines.append(plain(f"  {skipped.line()}", style="yellow"))
    for finding in verdict.findings:
        hint = by_id.get(finding)
        if hint is not None:
            message = hint.message
        elif finding == INVALID_ROWS and skipped is not None:
            message = skipped.detail()
        else:
            message = "see the hints below"
        lines.append(plain(f"  ↳ {finding}: {message}", style="bold"))
    lines.extend(plain(f"  note: {note}", style="dim") for note in verdict.notes)
    return lines


def recommendation_line(recommendation: Recommendation | None, withheld: str | None, alarm: bool = True) -> Text:
    """One line: the recommended preset and its reason, none, or why it is withheld (in red with ``alarm``: a
    pipeline bug; "no correction needed" is no alarm)."""
    line = Text("Recommendation: ", style="bold")
    if withheld:
        line.append_text(plain(withheld, style="bold red" if alarm else "bold"))
    elif recommendation is None:
        line.append("– (this result carries no recommendation: made by an older rollout-diag)")
    elif recommendation.preset is None:
        line.append_text(plain(f"none — {'; '.join(recommendation.reasons)}", style="yellow"))
    else:
        line.append(recommendation.preset, style="bold green")
        line.append_text(plain(f" — {'; '.join(recommendation.reasons)}"))
        if recommendation.tie_reason:
            line.append_text(plain(f" ({recommendation.tie_reason})", style="dim"))
    return line


def worst_step(steps: Sequence[StepResult], metric: str = HEADLINE) -> StepResult | None:
    if isinstance(steps, StepTable) and (read := steps.float_column(metric)) is not None:
        present, values = read  # from the column: no step is built but the worst (the first of equal maxima)
        scored = np.flatnonzero(present & np.isfinite(values))
        return steps.step(int(scored[np.argmax(values[scored])])) if scored.size else None
    scored = [s for s in steps if s.step is not None and _finite(s.metrics.get(metric))]
    return max(scored, key=lambda s: s.metrics[metric]) if scored else None


def most_divergent_round(result: AnalysisResult) -> dict | None:
    """The round the analysis named as most divergent, when it stands out from the others (``divergent_round``)."""
    found = result.divergent_round
    return found if found is not None and found.get("stands_out") else None


def round_phrase(found: dict) -> str:
    """ "most divergent round 3 (mean |δ| …, 2.1× the others)" or "no round stands out (…)"."""
    label = f"≥ {found['round']}" if found.get("pooled") else str(found["round"])
    factor = found.get("factor")
    versus = f", {factor:.2g}× the other rounds" if factor is not None else ""
    numbers = f"mean |δ| {number(found['logprob_abs_diff_mean'])} over {number(found['token_count'])} tokens{versus}"
    if found.get("stands_out"):
        return f"most divergent round {label} ({numbers})"
    made = f"; {found['note']}" if found.get("note") else ""
    return f"no round stands out (the highest, round {label}: {numbers}{made})"


def where(result: AnalysisResult) -> list[str]:
    """Where the mismatch sits: the step trends that rise ("mean |δ| up 2.5× from step 0 to 44"), the worst step,
    the most divergent round, the worst row and token, the worst group of each ``--by`` spec. A place whose value is
    0 is no place (identical logprobs have no worst step, row or token)."""
    lines = [trend.headline for trend in result.trends if trend.against == "step" and trend.headline]
    step = worst_step(result.steps)
    run_value = result.run.metrics.get(HEADLINE)
    if step is not None and len(result.steps) > 1 and _positive(step.metrics.get(HEADLINE)):
        value = step.metrics[HEADLINE]
        ratio = f", {value / run_value:.1f}× the run" if _finite(run_value) and run_value > 0 else ""
        lines.append(f"worst step {step.step} ({short_name(HEADLINE)} {number(value)}{ratio})")
    if result.divergent_round is not None and _positive(result.divergent_round.get("logprob_abs_diff_mean")):
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
    return lines


def _positive(value: float | None) -> bool:
    return _finite(value) and value > 0  # type: ignore[operator]


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)
