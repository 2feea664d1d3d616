"""Rich tables for ``--dialect``: one framework's metrics under its own names, or every framework side by side.

The catalog (framework titles, each metric's concept) comes in as plain data (``results.DialectLayout``) so that
this module stays free of torch; ``rollout_diag.metrics.dialects.layout()`` builds it. The sentences on where the
frameworks part are ``decisions.dialects.differences`` (the report prints them too).
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.text import Text

from rollout_diag.decisions.dialects import differences
from rollout_diag.render.format import plain
from rollout_diag.render.table import Column, FitTable, Num
from rollout_diag.results import AnalysisResult, DialectLayout, StepResult


def render_dialects(result: AnalysisResult, names: Sequence[str], layout: DialectLayout) -> RenderableType:
    """One framework: its metrics for the run, the first and the last step. Several: frameworks as columns."""
    if len(names) == 1:
        return single_table(result, names[0], layout)
    return Group(side_by_side(result.run, names, layout), *(plain(line) for line in differences(result.run)))


def single_table(result: AnalysisResult, name: str, layout: DialectLayout) -> FitTable:
    steps = [s for s in result.steps if name in s.dialects]
    shown = steps if len(steps) <= 2 else [steps[0], steps[-1]]
    table = FitTable(
        f"{layout.titles.get(name, name)} metrics, under its own names",
        [
            Column("metric as logged", "left", wrap=True, fold_width=36),
            Column("run"),
            *(Column(f"step {step.step}") for step in shown),
        ],
    )
    values = result.run.dialects.get(name, {})
    for metric in layout.metrics.get(name, {}):
        if metric in values or any(metric in s.dialects[name] for s in shown):
            table.add_row(metric, Num(values.get(metric)), *(Num(s.dialects[name].get(metric)) for s in shown))
    return table


def side_by_side(run: StepResult, names: Sequence[str], layout: DialectLayout) -> FitTable:
    """Long form: one line per value a trainer logs (what is measured · trainer · its logged name · run value),
    grouped by what is measured; most trainers log few of the concepts, so a trainers-as-columns matrix is mostly
    empty and too wide for a terminal."""
    logged: dict[str, list[tuple[str, str, float]]] = {}
    for name in names:
        for metric, value in run.dialects.get(name, {}).items():
            concept = layout.metrics.get(name, {}).get(metric)
            if concept is not None:
                logged.setdefault(concept, []).append((layout.titles.get(name, name), metric, value))
    table = FitTable(
        "Every trainer's mismatch metrics on this run (docs/dialects.md names them)",
        [Column("trainer", "left"), Column("logged name", "left", wrap=True, fold_width=40), Column("value")],
    )
    for concept in layout.concepts:
        if concept in logged:
            table.add_row("", Text(concept, style="bold"), "")  # what is measured, above the names that log it
        for trainer, metric, value in logged.get(concept, []):
            table.add_row(trainer, f"  {metric}", Num(value))
    return table
