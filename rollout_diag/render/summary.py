"""The overall verdict and the recommendation, as lines: the first lines of ``analyze`` and ``compare-presets``
(where the mismatch sits is worded by rollout_diag/results/wording.py, for every renderer).

Reads what the result already carries (``verdict``, its hints, the skipped data); judges and computes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import RenderableType
from rich.text import Text

from rollout_diag.catalogue import short_name as short_name
from rollout_diag.render.format import LEVEL_STYLE, plain
from rollout_diag.results import Hint, OverallVerdict, Recommendation, SkippedData

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
