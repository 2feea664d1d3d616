"""Rich tables for ``--dialect``: one framework's metrics under its own names, or every framework side by side.

The catalog (framework titles, each metric's concept) comes in as plain data (``results.DialectLayout``) so that
this module stays free of torch; ``rollout_diag.metrics.dialects.layout()`` builds it. The sentences on where the
frameworks part are ``decisions.dialects.differences`` (the report prints them too).
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from rollout_diag.decisions.dialects import VALID_ROWS, differences
from rollout_diag.render.format import number
from rollout_diag.results import AnalysisResult, DialectLayout, StepResult

VALID_COLUMN = "verl" + VALID_ROWS


def render_dialects(result: AnalysisResult, names: Sequence[str], layout: DialectLayout) -> RenderableType:
    """One framework: its metrics for the run, the first and the last step. Several: frameworks as columns."""
    if len(names) == 1:
        return single_table(result, names[0], layout)
    return Group(side_by_side(result.run, names, layout), *(Text(line) for line in differences(result.run)))


def single_table(result: AnalysisResult, name: str, layout: DialectLayout) -> Table:
    steps = [s for s in result.steps if name in s.dialects]
    shown = steps if len(steps) <= 2 else [steps[0], steps[-1]]
    table = Table(title=f"{layout.titles.get(name, name)} metrics, under its own names", title_justify="left")
    table.add_column("metric as logged")
    table.add_column("run", justify="right")
    for step in shown:
        table.add_column(f"step {step.step}", justify="right")
    values = result.run.dialects.get(name, {})
    for metric in layout.metrics.get(name, {}):
        if metric in values or any(metric in s.dialects[name] for s in shown):
            cells = [number(values.get(metric))] + [number(s.dialects[name].get(metric)) for s in shown]
            table.add_row(escape(metric), *cells)
    return table


def side_by_side(run: StepResult, names: Sequence[str], layout: DialectLayout) -> Table:
    """Rows = what is measured, columns = frameworks (plus verl over valid rows), cells = run values."""
    columns = list(names)
    if "verl" in names and any(m.endswith(VALID_ROWS) for m in run.dialects.get("verl", {})):
        columns.insert(columns.index("verl") + 1, VALID_COLUMN)
    cells: dict[str, dict[str, float]] = {}
    for name in names:
        for metric, value in run.dialects.get(name, {}).items():
            concept = layout.metrics.get(name, {}).get(metric)
            if concept is None:
                continue
            column = VALID_COLUMN if name == "verl" and metric.endswith(VALID_ROWS) else name
            cells.setdefault(concept, {})[column] = value
    table = Table(
        title="Every trainer's mismatch metrics on this run (docs/dialects.md names them)", title_justify="left"
    )
    table.add_column("what is measured")
    for column in columns:
        title = "verl, valid rows" if column == VALID_COLUMN else layout.titles.get(column, column)
        table.add_column(title, justify="right")
    for concept in layout.concepts:
        row = cells.get(concept)
        if row:
            table.add_row(escape(concept), *(number(row[c], 4) if c in row else "" for c in columns))
    return table
