"""The report's root-cause hints section: one table row per hint the data supports."""

from __future__ import annotations

from rollout_diag.formatting import number
from rollout_diag.report.markup import Column, Markup, code, escape, note, table
from rollout_diag.report.sections import Section
from rollout_diag.results import AnalysisResult, Hint

ROWS_SHOWN = 5

COLUMNS = (
    Column("hint", title="id of the check (docs/hints.md)"),
    Column("what the data shows"),
    Column("evidence", title="the numbers behind the hint"),
    Column("where to look", title="steps that show it on their own, example rows, and what to inspect"),
)


def hints_section(result: AnalysisResult) -> Section:
    """Root-cause hints; a note saying none fired for clean data."""
    title = "Root-cause hints"
    if not result.hints:
        return Section(
            "hints",
            title,
            note(
                "No root-cause hint: none of the checks (off-by-one gather, dummy logprobs, processed logprobs, "
                "first/last token, low probability, long context, turn growth, staleness) found its pattern."
            ),
        )
    intro = note("Likely causes the data supports, each with its evidence; the rules are in docs/hints.md.")
    return Section("hints", title, Markup(intro + table(COLUMNS, [_row(hint) for hint in result.hints])))


def _row(hint: Hint) -> list[object]:
    evidence = Markup(
        "<br>".join(f"{escape(name)} {escape(number(value, 4))}" for name, value in hint.evidence.items())
    )
    where = []
    if hint.steps:
        where.append(escape("steps " + ", ".join(str(step) for step in hint.steps)))
    for row in hint.rows[:ROWS_SHOWN]:
        where.append(f"{code(row.sample_id)} " + escape(f"step {row.step}, row {row.row}"))
    if hint.look_at:
        where.append(escape(hint.look_at))
    # Markup, not str: a plain string cell is clipped at 200 characters
    return [code(hint.id), Markup(escape(hint.message)), evidence, Markup("<br>".join(where))]
