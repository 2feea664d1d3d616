"""The report's dialects section: each trainer's own metrics (``--dialect``) for the run and their range over steps."""

from __future__ import annotations

import math

from rollout_diag.decisions.dialects import differences
from rollout_diag.report.markup import Column, Markup, escape, table
from rollout_diag.report.sections import Section
from rollout_diag.results import AnalysisResult


def dialects_section(result: AnalysisResult) -> Section | None:
    """None unless a dialect other than the default verl was asked for (verl's names fill the rest of the page)."""
    frameworks = [name for name in result.run.dialects if name != "verl"] and list(result.run.dialects)
    if not frameworks:
        return None
    columns = [Column("metric as logged"), Column("run", True), Column("min over steps", True), Column("max", True)]
    parts: list[str] = [
        Markup(
            '<p class="lead">Each trainer\'s own mismatch metrics, under the names it logs, computed and aggregated '
            "as it does (definitions and sources: docs/dialects.md).</p>"
        )
    ]
    for framework in frameworks:
        rows = []
        for metric, value in result.run.dialects[framework].items():
            per_step = [
                v
                for step in result.steps
                if (v := step.dialects.get(framework, {}).get(metric)) is not None and not math.isnan(v)
            ]
            rows.append((metric, value, min(per_step, default=None), max(per_step, default=None)))
        parts.append(f"<h3>{escape(framework)}</h3>{table(columns, rows)}")
    notes = "".join(f"<li>{escape(line)}</li>" for line in differences(result.run))
    if notes:
        parts.append(f"<h3>Where they differ on this data</h3><ul>{notes}</ul>")
    return Section("dialects", "Trainer dialects", "".join(parts))
