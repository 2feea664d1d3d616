"""Terminal and JUnit renderings of the decisions: ``check`` gates, ``diff`` A/B tables, the preset recommendation."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from typing import TYPE_CHECKING

from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from rollout_diag.render.diff import diff_tables as diff_tables  # the diff tables live in render/diff.py
from rollout_diag.render.format import number

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
    headline = (
        Text(f"FAIL: {len(failures)} of {checks} checks failed ({len(result.gates)} gates)", style="bold red")
        if failures
        else Text(f"PASS: all {checks - skipped} checks passed ({len(result.gates)} gates)", style="bold green")
    )
    shown = failures or (result.outcomes if checks <= MAX_LISTED_PASSES else [])
    parts: list = [headline]
    grouped = any(outcome.group is not None for outcome in result.outcomes)  # check --by
    if shown:
        table = Table(title="Failed gates" if failures else "Gates", title_justify="left")
        headers = (("metric", "left"), *((("group", "left"),) if grouped else ()), ("where", "left"))
        for header, justify in (*headers, ("value", "right"), ("limit", "right")):
            table.add_column(header, justify=justify, no_wrap=header == "metric")  # type: ignore[arg-type]
        table.add_column("past the limit by" if failures else "status", justify="right")
        for outcome in shown:
            gate = outcome.gate
            limit = f"{'≤' if gate.bound == 'max' else '≥'} {number(gate.limit, 4)}"
            last = (
                ("NaN" if outcome.excess is None else _excess(outcome.excess, gate.limit))
                if outcome.status == "fail"
                else outcome.status
            )
            place = "run" if outcome.step is None else f"step {outcome.step}"
            group = (escape(outcome.group or "all rows"),) if grouped else ()
            table.add_row(escape(gate.metric), *group, place, number(outcome.value, 4), limit, last)
        parts.append(table)
    if skipped:
        why = "no model token" + (", or not a key metric computed per group" if grouped else "")
        parts.append(Text(f"{skipped} check(s) skipped: the metric is not reported for that step or group ({why})."))
    return Group(*parts)


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
