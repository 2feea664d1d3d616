"""Terminal and JUnit renderings of the decisions: ``check`` gates, ``diff`` A/B tables, the preset recommendation."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.markup import escape
from rich.segment import Segment, Segments
from rich.table import Table
from rich.text import Text

from rollout_diag.render.diff import diff_tables as diff_tables  # the diff tables live in render/diff.py
from rollout_diag.render.format import number
from rollout_diag.render.lines import FAST_ROWS, ONE_LINE, ansi, table_box

if TYPE_CHECKING:
    from rollout_diag.decisions.check import CheckResult, GateOutcome
    from rollout_diag.decisions.recommend import Recommendation

VERDICT_STYLE = {"better": "green", "worse": "bold red", "no detectable change": "", "n/a": "dim"}
MAX_LISTED_PASSES = 30  # per-step checks can be thousands: list failures, count passes


# ----------------------------------------------------------------------------------------- check
def check_table(result: CheckResult) -> Group:
    """One line saying pass or fail, then a table of the failures (or of every check when all pass and few)."""
    failures = result.failures
    checks = len(result.outcomes)
    skipped = sum(outcome.status == "skipped" for outcome in result.outcomes)
    gates = len(result.gates)
    headline = (
        Text(
            f"FAIL: {len(result.failed_gates)} of {gates} gates failed, in {len(failures)} of {checks} checks "
            "(run, steps, groups)",
            style="bold red",
        )
        if failures
        else Text(f"PASS: all {gates} gates passed ({checks - skipped} checks)", style="bold green")
    )
    shown = failures or (result.outcomes if checks <= MAX_LISTED_PASSES else [])
    parts: list = [headline]
    grouped = any(outcome.group is not None for outcome in result.outcomes)  # check --by
    if shown:
        headers = (("metric", "left"), *((("group", "left"),) if grouped else ()), ("where", "left"))
        columns = [*headers, ("value", "right"), ("limit", "right")]
        columns.append(("past the limit by" if failures else "status", "right"))
        limits: dict[tuple[str, float], str] = {}
        rows = []
        for outcome in shown:
            gate = outcome.gate
            limit = limits.get((gate.bound, gate.limit))
            if limit is None:
                limit = limits[gate.bound, gate.limit] = (
                    f"{'≤' if gate.bound == 'max' else '≥'} {number(gate.limit, 4)}"
                )
            last = (
                ("NaN" if outcome.excess is None else _excess(outcome.excess, gate.limit))
                if outcome.status == "fail"
                else outcome.status
            )
            place = "run" if outcome.step is None else f"step {outcome.step}"
            group = (outcome.group or "all rows",) if grouped else ()
            rows.append((gate.metric, *group, place, number(outcome.value, 4), limit, last))
        parts.append(_GateTable("Failed gates" if failures else "Gates", columns, rows))
    parts.extend(Text(outcome.detail, style="bold red") for outcome in failures if outcome.detail)
    parts.extend(Text(f"• {bounds.line}", style="dim") for bounds in result.k1_bounds)  # verl's k1 bounds (#6377)
    if skipped:
        why = "no model token" + (", or not a key metric computed per group" if grouped else "")
        parts.append(Text(f"{skipped} check(s) skipped: the metric is not reported for that step or group ({why})."))
    return Group(*parts)


class _GateTable:
    """The gates' table as a rich Table of plain-text cells (the metric column never wraps), written as rich writes
    it. From FAST_ROWS rows on, rich lays out the title, header and the rows that are widest in some column (so
    that its column widths are those of the whole table), and every row is written as one line joined from its
    cells: rich measures and renders cell by cell, which took seconds for the 12 000 failures of 200 000 steps.
    When a cell would wrap or the joined lines differ from rich's, rich lays out the whole table."""

    def __init__(self, title: str, columns: Sequence[tuple[str, str]], rows: Sequence[tuple[str, ...]]) -> None:
        self.title, self.columns, self.rows = title, list(columns), rows

    def _table(self, rows: Sequence[tuple[str, ...]]) -> Table:
        table = Table(title=self.title, title_justify="left")
        for header, justify in self.columns:
            table.add_column(header, justify=justify, no_wrap=header == "metric")  # type: ignore[arg-type]
        for row in rows:
            table.add_row(*(escape(cell) for cell in row))
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        lines = self._lines(console, options) if len(self.rows) >= FAST_ROWS else None
        if lines is None:
            yield self._table(self.rows)
            return
        yield from lines

    def _lines(self, console: Console, options: ConsoleOptions) -> list[Segments] | None:
        count = len(self.columns)
        widths = [max(cell_len(row[index]) for row in self.rows) for index in range(count)]
        widest = sorted({0, 1, *(_widest_row(self.rows, index) for index in range(count))})
        natural = [max(width, cell_len(header)) for width, (header, _) in zip(widths, self.columns, strict=True)]
        if sum(natural) + 3 * count + 1 > options.max_width:  # rich would narrow some column: it lays out all
            return None
        head = self._table([self.rows[r] for r in widest])
        rendered = console.render_lines(head, options, pad=False, new_lines=False)
        box = table_box(head, console, options)
        body = len(rendered) - 1 - len(widest)  # title, top, header, separator; then a line per row; the bottom
        if box is None or body < 0:
            return None
        justify = [justify for _, justify in self.columns]

        def line(row: tuple[str, ...]) -> str:
            cells = (
                cell + " " * (width - cell_len(cell)) if side == "left" else " " * (width - cell_len(cell)) + cell
                for cell, width, side in zip(row, natural, justify, strict=True)
            )
            return box.mid_left + " " + f" {box.mid_vertical} ".join(cells) + " " + box.mid_right

        if any(not ONE_LINE.isdisjoint(cell) or cell != cell.strip() for row in self.rows for cell in row):
            return None
        for at, row in zip(range(body, body + len(widest)), (self.rows[r] for r in widest), strict=True):
            if ansi([Segment(line(row))]) != ansi(rendered[at]):
                return None
        out = [Segments([*segments, Segment.line()]) for segments in rendered[:body]]
        out.extend(Segments([Segment(line(row)), Segment.line()]) for row in self.rows)
        out.append(Segments([*rendered[-1], Segment.line()]))
        return out


def _excess(excess: float, limit: float) -> str:
    relative = f" ({excess / abs(limit):.0%})" if limit else ""
    return f"{number(excess, 3)}{relative}"


def junit_xml(result: CheckResult, suite: str = "rollout-diag check") -> str:
    """JUnit XML: one testsuite, one testcase per gate, step and ``--by`` group (``name`` = gate, ``classname`` =
    where: ``rollout-diag.step_3``, ``rollout-diag.env_name=math.step_3``)."""
    failures = len(result.failures)
    skipped = sum(outcome.status == "skipped" for outcome in result.outcomes)
    counts = {"tests": str(len(result.outcomes)), "failures": str(failures), "errors": "0", "skipped": str(skipped)}
    root = ElementTree.Element("testsuites", {"name": suite, **{k: counts[k] for k in ("tests", "failures", "errors")}})
    testsuite = ElementTree.SubElement(root, "testsuite", {"name": suite, **counts, "time": "0"})
    properties = ElementTree.SubElement(testsuite, "properties")
    for index, path in enumerate(result.inputs):
        ElementTree.SubElement(properties, "property", {"name": f"input.{index}", "value": path})
    for outcome in result.outcomes:
        gate = outcome.gate
        case = ElementTree.SubElement(
            testsuite,
            "testcase",
            {"name": gate.describe(), "classname": _classname(outcome), "time": "0"},
        )
        if outcome.status == "fail":
            failure = ElementTree.SubElement(case, "failure", {"message": outcome.message(), "type": "GateFailed"})
            failure.text = f"{outcome.message()}\n{gate.source}".strip()
        elif outcome.status == "skipped":
            ElementTree.SubElement(case, "skipped", {"message": outcome.message()})
        else:
            ElementTree.SubElement(case, "system-out").text = outcome.message()
    ElementTree.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ElementTree.tostring(root, encoding="unicode") + "\n"


def _classname(outcome: GateOutcome) -> str:
    place = "run" if outcome.step is None else f"step_{outcome.step}"
    group = "" if outcome.group is None else outcome.group.replace(" ", "_").replace(".", "_") + "."
    return f"rollout-diag.{group}{place}"


# ----------------------------------------------------------------------------------------- recommendation
def recommendation_lines(recommendation: Recommendation, shown: int = 5, headline: bool = True) -> Group:
    """The recommendation, its rule, the runner-up and why the next ``shown`` more intrusive presets lost; without
    ``headline`` (compare-presets, whose first lines already say the recommendation) under "Why … was chosen"."""
    lines: list[Text] = []
    if headline:
        head = Text("Recommendation: ", style="bold")
        if recommendation.preset is None:
            head.append("none of these presets meets the rule", style="bold yellow")
        else:
            head.append(recommendation.preset, style="bold green")
            head.append(f" — {'; '.join(recommendation.reasons)}")
    else:
        chosen = "no preset" if recommendation.preset is None else recommendation.preset
        head = Text(f"Why {chosen} (the recommendation at the top):", style="bold")
    lines.append(head)
    if recommendation.equivalent:
        lines.append(Text(f"  same numbers in another mode: {', '.join(recommendation.equivalent)}"))
    lines.append(Text(f"  rule: {recommendation.rule}", style="dim"))
    if recommendation.runner_up:
        lines.append(Text(f"  runner-up: {recommendation.runner_up} — {recommendation.runner_up_reason}"))
    for name, reason in recommendation.not_chosen[:shown]:
        lines.append(Text(f"  not {name}: {reason}"))
    if len(recommendation.not_chosen) > shown:
        more = len(recommendation.not_chosen) - shown
        note = f"  and {more} more presets not chosen (all in --format json: recommendation.not_chosen)"
        lines.append(Text(note, style="dim"))
    if recommendation.note:
        lines.append(Text(f"  note: {recommendation.note}"))
    return Group(*lines)


def _widest_row(rows: Sequence[tuple[str, ...]], index: int) -> int:
    """The first row whose cell ``index`` is the widest."""
    return max(range(len(rows)), key=lambda at: cell_len(rows[at][index]))
