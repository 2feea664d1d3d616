"""Plotly figure specs as plain dicts ({"data": [...], "layout": {...}}), drawn in the page by Plotly.newPlot.

Plain dicts keep plotly's Python package out of the hot path (only its bundled JS is needed). Every string
from the data that reaches a figure is HTML-escaped first: plotly renders a small HTML subset in labels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rollout_diag.formatting import number
from rollout_diag.report.markup import escape

Figure = dict[str, Any]

FONT_STACK = "system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif"
BLUE, RED, AMBER, GREY, GREEN = "#0969da", "#cf222e", "#bf8700", "#8c959f", "#1a7f37"
PALETTE = ("#0969da", "#8250df", "#bf3989", "#1a7f37", "#bc4c00", "#1b7c83", "#6e7781", "#cf222e")
HEAT_SCALE = "YlOrRd"


@dataclass
class TrendPanel:
    """One small chart of the per-step trends: lines over steps, anomaly markers, verdict thresholds."""

    title: str
    lines: Sequence[tuple[str, Sequence[int | None], Sequence[float | None]]]  # (name, steps, values)
    anomalies: list[tuple[int, float, str]] = field(default_factory=list)  # (step, value, hover text)
    thresholds: list[tuple[str, float]] = field(default_factory=list)  # ("watch", 1e-3), ("bad", 1e-2)
    signed: bool = False  # the metric can be negative: do not force the axis to start at zero
    legend: bool = False  # name the lines in a legend (one-panel figures only)
    percent: bool = False  # a share: ticks and hover in %
    unit: str = ""  # the y axis title: what the values are measured in (nats, probability, …)


def base_layout(height: int, **extra: Any) -> dict[str, Any]:
    layout = {
        "height": height,
        "margin": {"l": 64, "r": 24, "t": 36, "b": 44},
        "font": {"family": FONT_STACK, "size": 12, "color": "#1f2328"},
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#ffffff",
        "hovermode": "closest",
        "showlegend": False,
        "hoverlabel": {"font": {"family": FONT_STACK}},
    }
    layout.update(extra)
    return layout


def axis(**extra: Any) -> dict[str, Any]:
    return {
        "gridcolor": "#eaeef2",
        "zerolinecolor": "#d0d7de",
        "linecolor": "#d0d7de",
        "automargin": True,
        "exponentformat": "e",  # 5e-4, not plotly's SI "500µ"
        **extra,
    }


def grid(rows: int, cols: int, titles: Sequence[str], vgap: float = 0.12, hgap: float = 0.09) -> dict[str, Any]:
    """Layout entries for a rows×cols grid of subplots (cell n uses axes x{n}/y{n}), each titled."""
    layout: dict[str, Any] = {"annotations": []}
    width = (1 - (cols - 1) * hgap) / cols
    height = (1 - (rows - 1) * vgap) / rows
    for cell, title in enumerate(titles):
        row, col = divmod(cell, cols)
        suffix = "" if cell == 0 else str(cell + 1)
        x0 = col * (width + hgap)
        y1 = 1 - row * (height + vgap)
        layout[f"xaxis{suffix}"] = axis(domain=[x0, x0 + width], anchor=f"y{suffix}")
        layout[f"yaxis{suffix}"] = axis(domain=[y1 - height, y1], anchor=f"x{suffix}")
        layout["annotations"].append(
            {
                "text": f"<b>{title}</b>",
                "x": x0 + width / 2,
                "y": y1,
                "xref": "paper",
                "yref": "paper",
                "xanchor": "center",
                "yanchor": "bottom",
                "showarrow": False,
                "font": {"size": 13},
            }
        )
    return layout


def step_ticks(steps: Sequence[int]) -> dict[str, Any]:
    """Integer ticks on a step axis: one per step when there are few (plotly would put ticks at 0.5)."""
    span = max(steps, default=0) - min(steps, default=0)
    return {"tickformat": "d", "dtick": 1} if span <= 12 else {"tickformat": "d"}


def axis_names(cell: int) -> tuple[str, str]:
    suffix = "" if cell == 0 else str(cell + 1)
    return f"x{suffix}", f"y{suffix}"


# ------------------------------------------------------------------------------------------ trends
def trends_figure(panels: Sequence[TrendPanel], note: str = "") -> Figure:
    """Small multiples over steps, two per row, zoom linked on the step axis; ``note`` (how the lines were thinned
    out) is written above the panels."""
    cols = 2 if len(panels) > 1 else 1
    rows = math.ceil(len(panels) / cols)
    layout = base_layout(rows * 230 + 70, **grid(rows, cols, [p.title for p in panels], vgap=0.42 / rows))
    if note:  # a line of its own above the panels' titles
        layout["height"] += 22
        layout["margin"] = {**layout["margin"], "t": layout["margin"]["t"] + 22}
        layout["annotations"].append(
            {
                "text": escape(note),
                "xref": "paper",
                "yref": "paper",
                "x": 0,
                "y": 1,
                "xanchor": "left",
                "yanchor": "bottom",
                "yshift": 24,
                "showarrow": False,
                "font": {"size": 11, "color": GREY},
            }
        )
    layout["shapes"] = []
    data: list[dict[str, Any]] = []
    for cell, panel in enumerate(panels):
        x_name, y_name = axis_names(cell)
        layout[_axis_key(x_name)].update(step_ticks([x for _, xs, _ in panel.lines for x in xs if x is not None]))
        if cell:
            layout[_axis_key(x_name)]["matches"] = "x"
        if cell >= len(panels) - cols:
            layout[_axis_key(x_name)]["title"] = {"text": "step", "standoff": 4}
        if not panel.signed:
            layout[_axis_key(y_name)]["rangemode"] = "tozero"
        if panel.percent:
            layout[_axis_key(y_name)]["tickformat"] = (
                "~%"  # no fixed precision: small shares never print two equal ticks
            )
        values = [v for _, _, ys in panel.lines for v in ys if v is not None]
        if panel.percent and values and not any(values):  # a share that is 0 at every step: say so
            layout[_axis_key(y_name)].update(range=[0, 1], showticklabels=False)
            layout["annotations"].append(_panel_note("none at any step", x_name, y_name))
        if panel.unit:
            layout[_axis_key(y_name)]["title"] = {"text": escape(panel.unit), "standoff": 2, "font": {"size": 11}}
        data.extend(_trend_traces(panel, cell, x_name, y_name))
        _add_thresholds(layout, panel, x_name, y_name)
    if any(panel.legend for panel in panels):
        layout.update(showlegend=True, legend={"x": 1.02, "y": 1, "xanchor": "left", "font": {"size": 11}})
    return {"data": data, "layout": layout}


def _axis_key(name: str) -> str:
    return f"{name[0]}axis{name[1:]}"


def _trend_traces(panel: TrendPanel, cell: int, x_name: str, y_name: str) -> list[dict[str, Any]]:
    traces = []
    value_format = ".3%" if panel.percent else ".4g"
    for index, (name, steps, values) in enumerate(panel.lines):
        color = PALETTE[(cell if not panel.legend else index) % len(PALETTE)]
        traces.append(
            {
                "type": "scatter",
                "mode": "lines+markers" if len(steps) <= 60 else "lines",
                "x": steps,
                "y": values,
                "name": escape(name),
                "line": {"color": color, "width": 1.6},
                "marker": {"size": 5, "color": color},
                "xaxis": x_name,
                "yaxis": y_name,
                "showlegend": panel.legend,
                "hovertemplate": f"{escape(name)}<br>step %{{x}}: %{{y:{value_format}}}<extra></extra>",
            }
        )
    if panel.anomalies:
        marked_steps, marked_values, texts = zip(*panel.anomalies, strict=True)
        traces.append(
            {
                "type": "scatter",
                "mode": "markers",
                "x": list(marked_steps),
                "y": list(marked_values),
                "text": list(texts),
                "name": "anomaly",
                "marker": {
                    "symbol": "circle-open",
                    "size": 11 if len(marked_steps) <= 30 else 7,
                    "color": RED,
                    "line": {"width": 2},
                },
                "xaxis": x_name,
                "yaxis": y_name,
                "showlegend": False,
                "hovertemplate": "%{text}<extra>anomaly</extra>",
            }
        )
    return traces


def _add_thresholds(layout: dict[str, Any], panel: TrendPanel, x_name: str, y_name: str) -> None:
    """Dotted verdict lines, only where they sit within the data's scale (a far-away line would flatten the
    curve; one far below the data would lie on the zero line and cover the other's label)."""
    values = [v for _, _, ys in panel.lines for v in ys if v is not None]
    top = max((abs(v) for v in values), default=0.0)
    for label, level in panel.thresholds:
        if not 0.03 * top <= level <= 1.5 * top:
            continue
        color = RED if label == "bad" else AMBER
        layout["shapes"].append(
            {
                "type": "line",
                "xref": f"{x_name} domain",
                "x0": 0,
                "x1": 1,
                "yref": y_name,
                "y0": level,
                "y1": level,
                "line": {"color": color, "width": 1, "dash": "dot"},
            }
        )
        layout["annotations"].append(
            {
                "text": f"{label} {level:g}",
                "xref": f"{x_name} domain",
                "x": 1,
                "yref": y_name,
                "y": level,
                "xanchor": "right",
                "yanchor": "bottom",
                "showarrow": False,
                "font": {"size": 10, "color": color},
            }
        )


# ------------------------------------------------------------------------------------------ bars
@dataclass
class BarPanel:
    """One bar chart over shared categories (rounds or position buckets)."""

    title: str
    values: list[float | None]
    hover: list[str]
    color: str | list[str] = BLUE
    log: bool = False
    percent: bool = False
    count: bool = False  # token counts: ticks with thousands separators (1,000 · 10,000), never 0.5e+4
    empty: str = ""  # said in the panel when every value is 0 (an empty chart on a made-up axis says nothing)


def bars_figure(categories: Sequence[str], panels: Sequence[BarPanel], x_title: str) -> Figure:
    """Panels stacked vertically over the same categories (e.g. mean |δ|, then tokens) with a shared axis."""
    rows = len(panels)
    layout = base_layout(rows * 170 + 80, **grid(rows, 1, [p.title for p in panels], vgap=0.3 / rows))
    data = []
    for cell, panel in enumerate(panels):
        x_name, y_name = axis_names(cell)
        x_axis, y_axis = layout[_axis_key(x_name)], layout[_axis_key(y_name)]
        x_axis["type"] = "category"
        if cell:
            x_axis["matches"] = "x"
        if cell == rows - 1:
            x_axis["title"] = {"text": x_title, "standoff": 4}
        if panel.log:
            y_axis.update(type="log", dtick=1, tickformat="~s")  # decades only: 1, 10, 100, 1k, 10k
        elif panel.count:
            y_axis.update(tickformat=",~r", rangemode="tozero")
        if panel.percent:
            y_axis["tickformat"] = "~%"
        if panel.empty and not any(panel.values):
            y_axis.update(range=[0, 1], showticklabels=False)
            layout["annotations"].append(_panel_note(panel.empty, x_name, y_name))
        data.append(
            {
                "type": "bar",
                "x": list(categories),
                "y": panel.values,
                "text": panel.hover,
                "marker": {"color": panel.color},
                "xaxis": x_name,
                "yaxis": y_name,
                "hovertemplate": "%{text}<extra></extra>",
                "textposition": "none",
            }
        )
    return {"data": data, "layout": layout}


def _panel_note(text: str, x_name: str, y_name: str) -> dict[str, Any]:
    """A sentence in the middle of one subplot."""
    return {
        "text": escape(text),
        "xref": f"{x_name} domain",
        "yref": f"{y_name} domain",
        "x": 0.5,
        "y": 0.5,
        "showarrow": False,
        "font": {"size": 13, "color": GREY},
    }


# ------------------------------------------------------------------------------------------ heatmaps
def step_heatmap(
    row_labels: Sequence[str],
    column_steps: Sequence[int],
    values: Sequence[Sequence[float | None]],
    tokens: Sequence[Sequence[float]],
    row_title: str,
    steps_per_column: int,
) -> Figure:
    """Mean |δ| per (row label, step column); token counts on hover. Rows bottom-up in the order given."""
    span = "" if steps_per_column == 1 else f" (column of {steps_per_column} steps, from)"
    trace = {
        "type": "heatmap",
        "x": list(column_steps),
        "y": [escape(label) for label in row_labels],
        "z": [list(row) for row in values],
        "customdata": [list(row) for row in tokens],
        "colorscale": HEAT_SCALE,
        # over the data's own range: from 0 every cell of a run with a steady mismatch would be the same red
        "zmin": _robust_min(values),
        "zmax": _robust_max(values),
        "reversescale": True,  # plotly's YlOrRd runs dark to light; high mismatch should be dark red
        "colorbar": {"title": {"text": "mean |δ|", "side": "right"}, "thickness": 12},
        "hoverongaps": False,
        "hovertemplate": f"{row_title} %{{y}}<br>step{span} %{{x}}<br>mean |δ| %{{z:.4g}}<br>"
        "tokens %{customdata:,.0f}<extra></extra>",
        "xgap": 0,
        "ygap": 1,
    }
    height = max(220, min(560, 90 + 14 * len(row_labels)))
    layout = base_layout(
        height,
        xaxis=axis(title={"text": "step", "standoff": 4}, **step_ticks(column_steps)),
        yaxis=axis(title={"text": row_title}, type="category"),
    )
    layout["margin"]["t"] = 12
    return {"data": [trace], "layout": layout}


def _robust_min(values: Sequence[Sequence[float | None]]) -> float | None:
    """The 1st percentile of the cells (the colour scale's low end)."""
    cells = sorted(v for row in values for v in row if v is not None)
    return cells[int(0.01 * len(cells))] if cells else None


def _robust_max(values: Sequence[Sequence[float | None]]) -> float | None:
    """The 99th percentile of the cells: one outlier cell saturates instead of washing out all the others."""
    cells = sorted(v for row in values for v in row if v is not None)
    if not cells:
        return None
    return cells[min(len(cells) - 1, int(0.99 * len(cells)))] or cells[-1] or None


# ------------------------------------------------------------------------------------------ δ histogram
def delta_histogram_figure(edges: Sequence[float], counts: Sequence[float], catastrophic: float) -> Figure:
    """Bars per δ bin on a bin-index axis (bins may be log-spaced), log counts, catastrophic bins in red."""
    centers = [i + 0.5 for i in range(len(counts))]
    bad = [abs(edges[i]) >= catastrophic and abs(edges[i + 1]) >= catastrophic for i in range(len(counts))]
    hover = [
        f"δ in [{edges[i]:.3g}, {edges[i + 1]:.3g})<br>{int(counts[i]):,} tokens"
        + ("<br><b>catastrophic</b>" if bad[i] else "")
        for i in range(len(counts))
    ]
    tick_positions, tick_labels = _edge_ticks(edges)
    band = _band_positions(edges, catastrophic)
    shapes = [
        {
            "type": "rect",
            "xref": "x",
            "yref": "paper",
            "x0": x0,
            "x1": x1,
            "y0": 0,
            "y1": 1,
            "fillcolor": "rgba(207,34,46,0.08)",
            "line": {"width": 0},
            "layer": "below",
        }
        for x0, x1 in band
    ]
    layout = base_layout(
        340,
        bargap=0.05,
        shapes=shapes,
        xaxis=axis(
            tickmode="array",
            tickvals=tick_positions,
            ticktext=tick_labels,
            tickangle=0,
            range=[0, len(counts)],
            title={"text": "δ = trainer − rollout logprob (signed log scale)", "standoff": 4},
        ),
        yaxis=axis(type="log", dtick=1, tickformat="~s", title={"text": "tokens"}),
        annotations=[
            {
                "text": LOG_BINS_NOTE,
                "x": 0,
                "xref": "paper",
                "xanchor": "left",
                "y": 1.0,
                "yref": "paper",
                "yanchor": "bottom",
                "showarrow": False,
                "align": "left",
                "font": {"size": 11, "color": GREY},
            },
            *(
                {
                    "text": f"catastrophic |δ| > {catastrophic:g}",
                    # anchored at the plot's outer edge: the text runs inwards, never past the edge (at 800 px
                    # "catastrophic |δ| > 1" anchored at the band's inner edge was cut at the right)
                    "x": x0 if x0 == 0 else x1,
                    "xanchor": "left" if x0 == 0 else "right",
                    "y": 1,
                    "yref": "paper",
                    "yanchor": "top",
                    "showarrow": False,
                    "font": {"size": 11, "color": RED},
                }
                for x0, x1 in band[-1:]
            ),
        ],
    )
    trace = {
        "type": "bar",
        "x": centers,
        "y": [count if count > 0 else None for count in counts],
        "width": 0.92,
        "text": hover,
        "textposition": "none",
        "marker": {"color": [RED if is_bad else BLUE for is_bad in bad]},
        "hovertemplate": "%{text}<extra></extra>",
    }
    return {"data": [trace], "layout": layout}


LOG_BINS_NOTE = (
    "bins widen away from 0 (signed log scale): one population centred on 0 shows as two humps, one per sign"
)


def _edge_ticks(edges: Sequence[float]) -> tuple[list[float], list[str]]:
    """Ticks at edges that are powers of ten (every other decade when there are many), else ~10 evenly spaced.

    A central bin [−e, e] gets one tick "0" at its middle instead of two crowded ones.
    """
    exponents = {i: math.log10(abs(e)) for i, e in enumerate(edges) if e != 0}
    decades = [i for i, x in exponents.items() if abs(x - round(x)) < 1e-9]
    if len(decades) > 16:  # keep even exponents: symmetric ±1e-4, …, ±1, ±100
        decades = [i for i in decades if round(exponents[i]) % 2 == 0]
    if len(decades) < 3:
        chosen = list(range(0, len(edges), max(1, len(edges) // 10)))
        return [float(i) for i in chosen], [_edge_label(edges[i]) for i in chosen]
    ticks = {float(i): _edge_label(edges[i]) for i in decades}
    for i in range(len(edges) - 1):
        if edges[i] < 0 < edges[i + 1] and math.isclose(-edges[i], edges[i + 1]):
            ticks.pop(float(i), None)
            ticks.pop(float(i + 1), None)
            ticks[i + 0.5] = "0"
    positions = sorted(ticks)
    return positions, [ticks[p] for p in positions]


def _edge_label(value: float) -> str:
    """Two significant digits as every number of the report is written (bin edges are often powers of two:
    −3.9e-3, not −0.00390625), with a true minus sign."""
    return number(value, 2).replace("-", "−")


def _band_positions(edges: Sequence[float], catastrophic: float) -> list[tuple[float, float]]:
    """Bin-index intervals where |δ| > catastrophic: the two tails of the axis."""
    bands = []
    low = _index_of(edges, -catastrophic)
    high = _index_of(edges, catastrophic)
    if low is not None and low > 0:
        bands.append((0.0, low))
    if high is not None and high < len(edges) - 1:
        bands.append((high, float(len(edges) - 1)))
    return bands


def _index_of(edges: Sequence[float], value: float) -> float | None:
    """Fractional bin index of ``value`` (log-interpolated inside a same-sign bin)."""
    for i in range(len(edges) - 1):
        left, right = edges[i], edges[i + 1]
        if left <= value <= right:
            if left * right > 0:
                fraction = math.log(abs(value) / abs(left)) / math.log(abs(right) / abs(left))
            else:
                fraction = (value - left) / (right - left) if right > left else 0.0
            return i + fraction
    return None


# ------------------------------------------------------------------------------------------ presets
def presets_figure(
    names: Sequence[str],
    token_share: Sequence[float | None],
    seq_share: Sequence[float | None],
    ess: Sequence[float | None],
) -> Figure:
    """Two panels sharing the preset axis: share of tokens / sequences rejected, and effective sample size."""
    labels = [escape(name) for name in names]
    height = 120 + 22 * len(names)
    layout = base_layout(
        height,
        barmode="group",
        showlegend=True,
        legend={"orientation": "h", "x": 0, "y": 1.0, "yanchor": "bottom"},
        xaxis=axis(
            domain=[0, 0.55], tickformat="~%", title={"text": "share dropped", "standoff": 4}, rangemode="tozero"
        ),
        xaxis2=axis(domain=[0.64, 1], range=[0, 1.05], title={"text": "IS effective sample size", "standoff": 4}),
        yaxis=axis(type="category", autorange="reversed"),
        yaxis2=axis(type="category", autorange="reversed", anchor="x2", matches="y", showticklabels=False),
        shapes=[
            {
                "type": "line",
                "xref": "x2",
                "x0": 0.5,
                "x1": 0.5,
                "yref": "paper",
                "y0": 0,
                "y1": 1,
                "line": {"color": AMBER, "dash": "dot", "width": 1},
            },
        ],
    )
    layout["margin"].update(t=40, l=200)

    def bars(values: Sequence[float | None], name: str, color: str, x_name: str, y_name: str) -> dict[str, Any]:
        return {
            "type": "bar",
            "orientation": "h",
            "y": labels,
            "x": list(values),
            "name": name,
            "marker": {"color": color},
            "xaxis": x_name,
            "yaxis": y_name,
            "hovertemplate": f"%{{y}}<br>{name}: %{{x:.4g}}<extra></extra>",
        }

    data = [
        bars(token_share, "tokens dropped", RED, "x", "y"),
        bars(seq_share, "rows dropped", AMBER, "x", "y"),
        bars(ess, "ESS", BLUE, "x2", "y2"),
    ]
    return {"data": data, "layout": layout}


def sweep_figure(
    curves: Sequence[tuple[str, list[float], list[float]]],
    marks: Sequence[tuple[str, float, float]],
    ratios: Sequence[bool] = (),
) -> Figure:
    """Share rejected against threshold: one small chart per option (each on its own threshold scale), three per
    row; marks = (label, x, y) drawn on the chart whose option the label starts with. A ratio threshold U
    (``ratios[i]``: IS truncation, k1 bounds) is placed by ln U on a log axis, ticks labelled in U: its curve
    lives within a few percent of 1, where a plain axis out to the largest ratio draws a vertical line."""
    cols = min(3, len(curves)) or 1
    rows = math.ceil(len(curves) / cols)
    layout = base_layout(rows * 220 + 60, **grid(rows, cols, [escape(name) for name, _, _ in curves], 0.5 / rows))
    data: list[dict[str, Any]] = []
    for cell, (name, thresholds, shares) in enumerate(curves):
        x_name, y_name = axis_names(cell)
        own = [mark for mark in marks if mark[0].startswith(f"{name}:")]
        ratio = cell < len(ratios) and ratios[cell] and any(x > 1 for x in thresholds)
        if ratio:
            shares = [y for x, y in zip(thresholds, shares, strict=True) if x > 1]
            thresholds = [x for x in thresholds if x > 1]
            own = [mark for mark in own if mark[1] > 1]
            layout[_axis_key(x_name)].update(ratio_axis(thresholds))
        else:
            layout[_axis_key(x_name)].update(threshold_axis(thresholds))
        place = (lambda x: math.log(x)) if ratio else (lambda x: x)
        layout[_axis_key(y_name)].update(tickformat="~%", rangemode="tozero")
        if cell % cols == 0:
            layout[_axis_key(y_name)]["title"] = {"text": "share rejected"}
        if cell >= len(curves) - cols:
            layout[_axis_key(x_name)]["title"] = {"text": "threshold", "standoff": 4}
        color = PALETTE[cell % len(PALETTE)]
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "x": [place(x) for x in thresholds],
                "y": shares,
                "customdata": list(thresholds),
                "name": escape(name),
                "line": {"color": color, "width": 1.8},
                "xaxis": x_name,
                "yaxis": y_name,
                "hovertemplate": f"{escape(name)}<br>threshold %{{customdata:.4g}} rejects %{{y:.3%}}<extra></extra>",
            }
        )
        if own:
            data.append(
                {
                    "type": "scatter",
                    "mode": "markers",
                    "x": [place(x) for _, x, _ in own],
                    "y": [y for _, _, y in own],
                    "customdata": [x for _, x, _ in own],
                    "text": [escape(label) for label, _, _ in own],
                    "name": "verl default / targets",
                    "marker": {"symbol": "diamond", "size": 8, "color": "#1f2328"},
                    "xaxis": x_name,
                    "yaxis": y_name,
                    "hovertemplate": "%{text}<br>threshold %{customdata:.4g} rejects %{y:.3%}<extra></extra>",
                }
            )
    return {"data": data, "layout": layout}


RATIO_TICKS = (1.0001, 1.001, 1.01, 1.1, 2.0, 10.0, 100.0, 1e3, 1e4, 1e5)


def ratio_axis(thresholds: Sequence[float]) -> dict[str, Any]:
    """A log axis of ln U (every threshold > 1) with ticks at round ratios, labelled as the ratio itself."""
    low, high = math.log(min(thresholds)), math.log(max(thresholds))
    gap = max(0.3, math.log10(high / low) / 7)  # in decades of ln U: ticks never crowd at the high end
    ticks: list[float] = []
    for u in RATIO_TICKS:
        if low <= math.log(u) <= high and (not ticks or math.log10(math.log(u) / math.log(ticks[-1])) >= gap):
            ticks.append(u)
    ticks = ticks or [min(thresholds), max(thresholds)]
    return {
        "type": "log",
        "tickmode": "array",
        "tickvals": [math.log(u) for u in ticks],
        "ticktext": [f"{u:g}" for u in ticks],
    }


def threshold_axis(thresholds: Sequence[float]) -> dict[str, Any]:
    """Log with whole decades as ticks when the thresholds span more than two decades (plotly's default log
    ticks repeat "2" and "5" in every decade), else linear."""
    positive = [x for x in thresholds if x > 0]
    if len(positive) < len(thresholds) or not positive or max(positive) < 100 * min(positive):
        return {"type": "linear"}
    decades = math.log10(max(positive) / min(positive))
    return {"type": "log", "dtick": 1 if decades <= 6 else 2}


# ------------------------------------------------------------------------------------------ drift
def drift_figure(
    title: str, factors: Sequence[str], mix: Sequence[float], within: Sequence[float], change: float
) -> Figure:
    """One stacked bar per factor: its mix part (tokens moved between buckets) and its within part (each bucket's own
    mismatch moved), stacked so that each bar ends at the change (a dotted line), which every factor splits anew."""
    layout = base_layout(
        300,
        title={"text": title, "font": {"size": 13}, "x": 0, "xanchor": "left"},
        barmode="relative",
        showlegend=True,
        legend={"orientation": "h", "y": -0.25},
        xaxis=axis(type="category", title={"text": "factor", "standoff": 4}),
        yaxis=axis(title={"text": "change", "standoff": 4}),
        shapes=[
            {
                "type": "line",
                "xref": "paper",
                "x0": 0,
                "x1": 1,
                "y0": change,
                "y1": change,
                "line": {"color": GREY, "dash": "dot", "width": 1},
            }
        ],
    )
    data = [
        {
            "type": "bar",
            "name": name,
            "x": list(factors),
            "y": list(values),
            "marker": {"color": color},
            "text": [
                f"{escape(factor)}: {name} {number(value)}" for factor, value in zip(factors, values, strict=True)
            ],
            "hovertemplate": "%{text}<extra></extra>",
            "textposition": "none",
        }
        for name, values, color in (("mix", mix, BLUE), ("within", within, AMBER))
    ]
    return {"data": data, "layout": layout}
