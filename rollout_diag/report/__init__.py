"""One self-contained HTML report of an analysis (and optionally a preset comparison): no network needed to open it.

``write_report(result, path)`` renders what ``analyze`` / ``compare_presets`` found; it never recomputes a metric.
It reads typed results only (rollout_diag.results); a saved ``--format json`` document becomes one through
``rollout_diag.results.result_from_json`` (re-exported here), or ``load_results`` for saved files.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING

from rollout_diag.errors import ConfigError
from rollout_diag.paths import inputs_label
from rollout_diag.report.comparison import presets_section, rejection_by_step, select_presets
from rollout_diag.report.dialects import dialects_section
from rollout_diag.report.diff import diff_section, recommendation_section
from rollout_diag.report.drift import drift_section
from rollout_diag.report.groups import groups_section, selection_section
from rollout_diag.report.header import header_html
from rollout_diag.report.hints import hints_section
from rollout_diag.report.markup import escape
from rollout_diag.report.page import compact, render_page
from rollout_diag.report.sections import (
    Canvas,
    Section,
    delta_section,
    glossary_section,
    positions_section,
    rounds_section,
    trends_section,
)
from rollout_diag.report.series import SIZE_RULE
from rollout_diag.report.trainer_columns import trainer_columns_section
from rollout_diag.report.worst import worst_section
from rollout_diag.results import (
    SCHEMA_VERSION,
    AnalysisResult,
    ComparisonResult,
    PresetResult,
    StepResult,
    result_from_json,
)

if TYPE_CHECKING:  # a DiffResult is only read here
    from rollout_diag.decisions.diff import DiffResult

__all__ = ["render_report", "result_from_json", "write_report"]


def write_report(
    result: AnalysisResult | ComparisonResult,
    path: str | Path,
    *,
    comparison: ComparisonResult | None = None,
    title: str | None = None,
    presets: Sequence[str] | None = None,
    diff: DiffResult | None = None,
) -> Path:
    """Write the HTML report of ``result`` (an AnalysisResult, or a compare_presets result) to ``path``.

    ``comparison`` adds the presets section (only ``presets`` when given) and the recommendation; ``diff`` (a
    DiffResult) the A/B section. Returns the path written.
    Raises ConfigError for a preset name the comparison does not have, OSError when the file cannot be written.
    """
    target = Path(path)
    text = render_report(result, comparison=comparison, title=title, presets=presets, diff=diff)
    target.write_text(text, encoding="utf-8")
    return target


def render_report(
    result: AnalysisResult | ComparisonResult,
    *,
    comparison: ComparisonResult | None = None,
    title: str | None = None,
    presets: Sequence[str] | None = None,
    diff: DiffResult | None = None,
) -> str:
    """The report as one HTML string (see ``write_report``)."""
    if isinstance(result, ComparisonResult):
        if comparison is not None:
            raise ConfigError("give one comparison: the result is already a compare-presets result.")
        comparison, result = result, analysis_from_comparison(result)
    selected = select_presets(comparison, presets) if comparison is not None else []
    canvas = Canvas()
    sections = _sections(result, canvas, comparison, selected, diff)
    title = title or default_title(result.inputs)
    payload = {
        "figures": canvas.figures,
        "strips": compact(canvas.strips, digits=4),  # tooltips show 4 digits; keeps long strips small
        "catastrophic": result.catastrophic_threshold,
    }
    return render_page(
        title, header_html(result, title, _generated(), comparison, diff), sections, payload, _footer(), _plotly_js()
    )


def _sections(
    result: AnalysisResult,
    canvas: Canvas,
    comparison: ComparisonResult | None,
    selected: Sequence[PresetResult],
    diff: DiffResult | None,
) -> list[Section]:
    """The page's sections in order, those with nothing to say left out (each draws its figures on ``canvas`` in
    this order)."""
    found: list[Section | None] = [
        selection_section(result) if result.selection else None,  # --where / --steps: first, which rows the page is
        trends_section(result, canvas, rejection_by_step(selected)),
        drift_section(result, canvas),  # why the trend moved, beside it
        hints_section(result),
        rounds_section(result, canvas) if len(result.rounds) > 1 else None,  # single-turn data: nothing per round
        positions_section(result, canvas),
        delta_section(result, canvas),
        worst_section(result, canvas),
        groups_section(result, canvas),
        trainer_columns_section(result, canvas),
        presets_section(comparison, selected, canvas) if comparison is not None else None,
        # "which correction should I turn on?"
        recommendation_section(comparison, selected) if comparison is not None else None,
        dialects_section(result),
        diff_section(diff, canvas) if diff is not None else None,  # report A --vs B
        glossary_section(),
    ]
    return [section for section in found if section is not None]


def default_title(inputs: Sequence[str]) -> str:
    if not inputs:
        return "rollout-diag report"
    return f"rollout-diag report: {inputs_label(list(inputs))}"  # run/ (8 files) for a directory dump


def analysis_from_comparison(comparison: ComparisonResult) -> AnalysisResult:
    """An AnalysisResult view of a comparison alone: every preset carries the §1 metrics, per step and per run."""
    first = comparison.presets[0] if comparison.presets else None
    run = first.run if first is not None else StepResult(None, 0, 0, {})
    return AnalysisResult(
        inputs=[str(p) for p in comparison.inputs],
        columns=dict(comparison.columns),
        layout=comparison.layout,
        device=comparison.device,
        run=run,
        steps=list(first.steps) if first is not None else [],
        rounds=[],
        verdicts=list(comparison.verdicts),
        warnings=list(comparison.warnings),
        verdict=comparison.verdict,
        step_levels=list(comparison.step_levels),
        groups=list(comparison.groups),
        selection=dict(comparison.selection),
    )


def _version() -> str:
    try:
        return version("rollout-diag")
    except PackageNotFoundError:
        return "unknown"


def _generated() -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"Training–inference logprob mismatch · rollout-diag {_version()} · {stamp}"


def _footer() -> str:
    return (
        f"<p>Made by rollout-diag {escape(_version())} (result schema {SCHEMA_VERSION}). Self-contained: opens "
        "offline, loads nothing from the network.</p>"
        f"<p>{escape(SIZE_RULE)}</p>"
    )


def _plotly_js() -> str:
    from plotly.offline import get_plotlyjs  # lazy: plotly is only needed to write a report

    return get_plotlyjs()
