"""``runs --report FILE``: one HTML page for many runs: the answer, a per-run table, each key metric's step curves
overlaid (one line per run), a forest plot of the knob effects (ratio and interval on a log axis) and their table.
Reads a finished RunsResult; nothing is computed here but layout."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rollout_diag.catalogue import short_name
from rollout_diag.formatting import number
from rollout_diag.report.figures import GREY, PALETTE, Figure, TrendPanel, axis, base_layout, trends_figure
from rollout_diag.report.markup import Column, Markup, escape, table
from rollout_diag.report.page import render_page
from rollout_diag.report.sections import Canvas, Section
from rollout_diag.results import RunsResult

RUN_COLUMNS = (
    Column("run"),
    Column("knobs"),
    Column("verdict"),
    Column("metric"),
    Column("value", True),
    Column("interval", True, "bootstrap interval over the run's rows (resampled within steps)"),
    Column("onset step", True, "first step departing from the baseline run beyond noise"),
)
EFFECT_COLUMNS = (
    Column("knob"),
    Column("metric"),
    Column("ratio", True, "metric at the new level over the baseline's level"),
    Column("interval", True),
    Column("effect"),
    Column("method", False, "pair: two runs differing in that knob alone; fit: least squares on log(metric)"),
)


def write_runs_report(result: RunsResult, path: str | Path, *, title: str | None = None) -> Path:
    """Write the runs report of ``result`` to ``path``; returns the path. Raises OSError when it cannot be written."""
    target = Path(path)
    target.write_text(render_runs_report(result, title=title), encoding="utf-8")
    return target


def render_runs_report(result: RunsResult, *, title: str | None = None) -> str:
    """The runs report as one HTML string."""
    from rollout_diag.report import _footer, _generated, _plotly_js

    canvas = Canvas()
    sections = [_runs_section(result), _curves_section(result, canvas)]
    if result.effects:
        sections.append(_effects_section(result, canvas))
    title = title or f"rollout-diag runs: {len(result.runs)} runs"
    header = (
        f'<h1>{escape(title)}</h1><p class="lead"><strong>{escape(result.answer)}</strong></p>'
        f"<p>Baseline: <code>{escape(result.baseline)}</code>. {escape(_generated())}</p>"
    )
    return render_page(title, header, sections, {"figures": canvas.figures, "strips": []}, _footer(), _plotly_js())


def _runs_section(result: RunsResult) -> Section:
    rows = []
    for run in result.runs:
        knobs = ", ".join(f"{k}={v}" for k, v in run.knobs.items())
        onset = "baseline" if run.name == result.baseline else ("—" if run.onset_step is None else run.onset_step)
        for index, metric in enumerate(run.metrics):
            first = index == 0
            rows.append(
                [
                    run.name if first else "",
                    knobs if first else "",
                    run.verdict if first else "",
                    short_name(metric.metric),
                    number(metric.value, 4),
                    f"[{number(metric.low, 3)}, {number(metric.high, 3)}]",
                    onset if first else "",
                ]
            )
    caption = Markup(
        f"<p>{result.level:.0%} bootstrap intervals, {result.replicates} resamples of each run's rows within steps "
        f"(seed {result.seed}). Verdict: the overall verdict's rules on each run's metrics (no hint evidence: run "
        "<code>analyze</code> on a run for its hints).</p>"
    )
    return Section("runs", "Runs", str(caption) + str(table(RUN_COLUMNS, rows)))


def _curves_section(result: RunsResult, canvas: Canvas) -> Section:
    panels = []
    for metric in result.metrics:
        lines = [
            (steps.run, steps.step.tolist(), [None if not math.isfinite(v) else v for v in steps.values[metric]])
            for steps in result.steps
        ]
        panels.append(TrendPanel(short_name(metric), lines, legend=True, percent="share" in metric))
    figure = trends_figure(panels)
    seen: set[str] = set()
    for trace in figure["data"]:  # one legend entry per run (its lines in every panel toggle together)
        name = trace.get("name", "")
        trace["legendgroup"] = name
        trace["showlegend"] = name not in seen
        seen.add(name)
    body = canvas.plot("runs-curves", figure)
    return Section("curves", "Per-step curves, every run", str(body))


def _effects_section(result: RunsResult, canvas: Canvas) -> Section:
    rows, classes = [], []
    for effect in result.effects:
        finite = math.isfinite(effect.low) and math.isfinite(effect.high)
        rows.append(
            [
                f"{effect.knob}: {effect.from_} → {effect.to}",
                short_name(effect.metric),
                "n/a" if effect.ratio is None else number(effect.ratio, 3),
                f"[{number(effect.low, 3)}, {number(effect.high, 3)}]" if finite else "n/a",
                "detectable" if effect.detectable else "no detectable effect",
                effect.method + (f" ({effect.runs[0]} → {effect.runs[1]})" if effect.runs else ""),
            ]
        )
        classes.append("intrusive" if effect.detectable and (effect.ratio or 0.0) > 1.0 else "")
    body = str(canvas.plot("runs-forest", forest_figure(result))) + str(table(EFFECT_COLUMNS, rows, classes))
    return Section("effects", "Knob effects", body)


def forest_figure(result: RunsResult) -> Figure:
    """Each knob effect with a ratio: a point at the ratio, a bar over its interval, a log x axis, a line at 1; one
    colour per metric."""
    data: list[dict[str, Any]] = []
    labels: list[str] = []
    for index, metric in enumerate(result.metrics):
        effects = [e for e in result.effects if e.metric == metric and e.ratio is not None]
        if not effects:
            continue
        names = [escape(f"{e.knob}={e.to} · {short_name(metric)}") for e in effects]
        labels.extend(names)
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": escape(short_name(metric)),
                "x": [e.ratio for e in effects],
                "y": names,
                "marker": {"color": PALETTE[index % len(PALETTE)], "size": 9},
                "error_x": {
                    "type": "data",
                    "symmetric": False,
                    "array": [_above(e.ratio, e.high) for e in effects],
                    "arrayminus": [_above(e.low, e.ratio) for e in effects],
                },
                "hovertemplate": "%{y}: ratio %{x:.3g}<extra></extra>",
            }
        )
    layout = base_layout(max(220, 28 * len(labels) + 90), showlegend=True)
    layout["xaxis"] = axis(type="log", title={"text": "ratio to the baseline's level (log)"})
    layout["yaxis"] = axis(autorange="reversed")
    layout["shapes"] = [
        {"type": "line", "xref": "x", "yref": "paper", "x0": 1, "x1": 1, "y0": 0, "y1": 1, "line": {"color": GREY}}
    ]
    return {"data": data, "layout": layout}


def _above(low: float | None, high: float | None) -> float:
    """high − low for an error bar's arm (0 where either end is missing or not finite)."""
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return 0.0
    return max(0.0, high - low)
