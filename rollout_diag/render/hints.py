"""The root-cause hints of an AnalysisResult as terminal lines: id, sentence, evidence, where to look."""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text

from rollout_diag.render.format import number, visible
from rollout_diag.results import AnalysisResult, Hint

ROWS_SHOWN = 3


def hint_lines(result: AnalysisResult) -> list[RenderableType]:
    """One block per hint (nothing for clean data)."""
    return [hint_text(hint) for hint in result.hints]


def hint_text(hint: Hint) -> Text:
    text = Text()
    text.append("hint ", style="bold magenta")
    text.append(hint.id, style="bold")
    text.append(f": {hint.message}")
    evidence = ", ".join(f"{name} {number(value, 4)}" for name, value in hint.evidence.items())
    text.append(f"\n  evidence: {evidence}", style="dim")
    where = []
    if hint.steps:
        where.append("steps " + ", ".join(str(step) for step in hint.steps))
    if hint.rows:
        # sample ids are data: control characters shown escaped, never sent to the terminal
        shown = ", ".join(f"{visible(str(row.sample_id))} (step {row.step})" for row in hint.rows[:ROWS_SHOWN])
        more = len(hint.rows) - ROWS_SHOWN
        where.append(f"rows {shown}" + (f" and {more} more" if more > 0 else ""))
    if hint.look_at:
        where.append(hint.look_at)
    if where:
        text.append(f"\n  look at: {'; '.join(where)}", style="dim")
    return text
