"""``runs --report FILE``: one HTML page for many runs: the answer, a per-run table, each key metric's step curves
overlaid (one line per run), a forest plot of the knob effects (ratio and interval on a log axis) and their table,
the prompts matched across runs (a prompts × runs heatmap of row mismatch and the deterministic outliers).
Reads a finished RunsResult; nothing is computed here but layout."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rollout_diag.catalogue import short_name
from rollout_diag.formatting import number
from rollout_diag.report.figures import (
    GREY,
    HEAT_SCALE,
    PALETTE,
    Figure,
    TrendPanel,
    axis,
    base_layout,
    trends_figure,
)
from rollout_diag.report.markup import Column, Markup, escape, table
from rollout_diag.report.page import render_page
from rollout_diag.report.sections import Canvas, Section
from rollout_diag.results import RunsPrompts, RunsResult

RUN_COLUMNS = (
    Column("run"),
    Column("knobs"),
    Column("verdict"),
    Column("metric"),
    Column("value", True),
    Column("interval", True, "bootstrap interval over the run's rows (resampled within steps)"),
    Column("onset step", True, "first step departing from the baseline run beyond noise"),
)
OUTLIER_COLUMNS = (
    Column("prompt"),
    Column("key"),
    Column("runs", True, "runs it appears in"),
    Column("rows per run", False),
    Column("mean row mismatch per run", False, "mean |log-ppl diff| of its rows in each run"),
    Column("chance", True, "probability that its rows all land in each run's worst share by chance"),
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
    sections.append(_prompts_section(result.prompts, [run.name for run in result.runs], canvas))
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


def _prompts_section(prompts: RunsPrompts | None, runs: list[str], canvas: Canvas) -> Section:
    """One line without a prompt identity or a prompt seen in two runs; else the outliers' table and the prompts ×
    runs heatmap of the matrix's prompts."""
    if prompts is None:
        body = (
            "<p>No prompt identity in the runs (no <code>prompt_id</code> column, no prompt tokens under mask 0 with "
            "token ids): nothing matched across runs. Name the prompt's column with "
            "<code>--column prompt_id=NAME</code>.</p>"
        )
        return Section("prompts", "Prompts across runs", body)
    if prompts.shared == 0:
        body = f"<p>Prompt identity: {escape(prompts.identity)}. No prompt recurs across runs: nothing matched.</p>"
        return Section("prompts", "Prompts across runs", body)
    shown = [run for run in runs if run in prompts.runs]
    lead = (
        f"<p>Prompt identity: {escape(prompts.identity)}. {prompts.shared} prompts seen in two runs or more "
        f"({prompts.in_every_run} in every run); {prompts.outliers} in the worst 1 % (by row score) in every run they "
        "appear in: deterministic outliers, listed when the chance of that (Π share<sup>rows</sup> over its runs), "
        f"times the {prompts.shared} recurring prompts, is at most 1 %. Worst-1 % cut per run: "
        + ", ".join(f"{escape(w.run)} ≥ {number(w.threshold, 3)}" for w in prompts.worst)
        + (
            f". Prompts followed: {prompts.sampled_share:.3g} (distinct sampling)."
            if prompts.sampled_share < 1
            else "."
        )
        + "</p>"
    )
    rows = []
    for item in prompts.listed:
        cells = [item.cell(run) for run in shown]
        rows.append(
            [
                item.prompt,
                item.key,
                len(item.cells),
                ", ".join("—" if cell is None else str(cell.rows) for cell in cells),
                ", ".join("—" if cell is None else number(cell.score_mean, 3) for cell in cells),
                number(item.chance, 2),
            ]
        )
    outliers = str(table(OUTLIER_COLUMNS, rows)) if rows else ""
    caption = (
        f"<p>Row mismatch (mean |log-ppl diff| of the prompt's rows) of the {len(prompts.matrix)} most extreme "
        f"recurring prompts (outliers first) in each run ({escape(', '.join(shown))}); blank: not in that run"
        + (f"; {prompts.matrix_cut} more recurring prompts not shown." if prompts.matrix_cut else ".")
        + "</p>"
    )
    body = lead + outliers + caption + str(canvas.plot("runs-prompts", prompts_figure(prompts, shown)))
    return Section("prompts", "Prompts across runs", body)


def prompts_figure(prompts: RunsPrompts, runs: list[str]) -> Figure:
    """The prompts × runs heatmap: one row per matrix prompt (top to bottom in the matrix's order), one column per
    run, the prompt's mean row score there (blank where it is absent); rows and the worst-1 % mark on hover."""
    labels = [escape(f"{'★ ' if item.listed else ''}{item.prompt}", 40) for item in prompts.matrix]
    values, hover = [], []
    for item in prompts.matrix:
        cells = [item.cell(run) for run in runs]
        values.append([None if cell is None else cell.score_mean for cell in cells])
        hover.append(
            [
                "" if cell is None else f"{cell.rows} rows{' · all in the worst 1 %' if cell.worst else ''}"
                for cell in cells
            ]
        )
    present = sorted(value for row in values for value in row if value is not None and value > 0)
    trace = {
        "type": "heatmap",
        "x": [escape(run) for run in runs],
        "y": labels,
        "z": values,
        "customdata": hover,
        "colorscale": HEAT_SCALE,
        "reversescale": True,
        "zmin": present[0] if present else None,
        "zmax": present[-1] if present else None,
        "colorbar": {"title": {"text": "row mismatch", "side": "right"}, "thickness": 12},
        "hoverongaps": False,
        "hovertemplate": "%{y}<br>run %{x}<br>mean row mismatch %{z:.4g}<br>%{customdata}<extra></extra>",
        "xgap": 1,
        "ygap": 1,
    }
    layout = base_layout(
        max(220, min(900, 90 + 16 * len(labels))),
        xaxis=axis(title={"text": "run", "standoff": 4}, type="category"),
        yaxis=axis(type="category", autorange="reversed"),
    )
    layout["margin"]["t"] = 12
    return {"data": [trace], "layout": layout}
