"""The report's "Mismatch against the trainer's columns" section: per trainer column (reward, advantage, entropy,
response length) a scatter of row |log-ppl diff| against it (a binned 2-D histogram for a large sample), its Spearman
ρ with the 95 % interval, and the GRPO group rule; the sentences of what stands out come from results/wording.py."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from rollout_diag.formatting import number
from rollout_diag.report import figures
from rollout_diag.report.markup import Column, Markup, escape, note, table
from rollout_diag.report.sections import Canvas, Section
from rollout_diag.results import AnalysisResult, ColumnAssociation
from rollout_diag.results.wording import trainer_column_lines

PANEL_HEIGHT = 300


def trainer_columns_section(result: AnalysisResult, canvas: Canvas) -> Section | None:
    """None when the dump carries no trainer column."""
    found = result.trainer_columns
    if found is None:
        return None
    sample = (
        f"every one of the {found.rows:,} rows"
        if found.sampled_rows >= found.rows
        else f"a sample of {found.sampled_rows:,} of {found.rows:,} rows (by a hash of file and row, seed {found.seed})"
    )
    parts = [
        Markup(
            '<p class="lead">How row mismatch (|log-ppl diff|, what the worst-rows table ranks by) goes with the '
            f"trainer's own columns, over {escape(sample)}: Spearman's rank correlation with a 95 % interval.</p>"
        )
    ]
    lines = trainer_column_lines(found)
    if lines:
        parts.append(Markup('<ul class="findings">' + "".join(f"<li>{escape(line)}</li>" for line in lines) + "</ul>"))
    rows = [
        (
            escape(item.column),
            number(item.rows),
            number(item.spearman, 3),
            f"{number(item.ci_low, 3)} to {number(item.ci_high, 3)}",
            "stands out" if item.significant else "–",
        )
        for item in found.correlations
    ]
    if rows:
        parts.append(
            table(
                [Column("column"), Column("rows", True), Column("Spearman ρ", True), Column("95 %"), Column("")],
                rows,
            )
        )
    for index, item in enumerate(found.correlations):
        figure = _figure(item)
        if figure is not None:
            parts.append(canvas.plot(f"trainer-columns-{index}", figure))
    groups = found.groups
    if groups is not None:
        if groups.overflow:
            parts.append(note(f"More {groups.column} groups than can be tracked: no group count."))
        else:
            parts.append(
                note(
                    f"{groups.column} groups (within a step) of 2+ rows whose {groups.ranked_by} differs: "
                    f"{groups.groups:,} of {groups.groups_seen:,}; the worst row is the highest-{groups.ranked_by} "
                    f"one in {groups.worst_is_best:,} (chance: {number(groups.expected, 3)}, one-sided p "
                    f"{number(groups.p_value, 2)})."
                )
            )
    return Section("trainer-columns", "Mismatch against the trainer's columns", "".join(parts))


def _figure(item: ColumnAssociation) -> figures.Figure | None:
    title = f"row |log-ppl diff| against {escape(item.column)} (ρ {number(item.spearman, 3)})"
    if item.points is not None and item.points["x"]:
        trace: dict[str, Any] = {
            "type": "scattergl",
            "mode": "markers",
            "x": item.points["x"],
            "y": item.points["y"],
            "marker": {"size": 5, "color": figures.BLUE, "opacity": 0.6},
            "hovertemplate": f"{escape(item.column)} %{{x:.4g}}<br>|log-ppl diff| %{{y:.4g}}<extra></extra>",
        }
        y_axis = figures.axis(title={"text": "row |log-ppl diff|"}, type="log")
    elif item.histogram is not None:
        x_edges, y_edges = item.histogram["x_edges"], item.histogram["y_edges"]
        trace = {
            "type": "heatmap",
            "x": [(a + b) / 2 for a, b in pairwise(x_edges)],
            "y": [(a * b) ** 0.5 for a, b in pairwise(y_edges)],
            "z": [[count or None for count in row] for row in item.histogram["counts"]],
            "colorscale": figures.HEAT_SCALE,
            "reversescale": True,
            "colorbar": {"title": {"text": "rows", "side": "right"}, "thickness": 12},
            "hoverongaps": False,
            "hovertemplate": f"{escape(item.column)} ≈ %{{x:.4g}}<br>|log-ppl diff| ≈ %{{y:.3g}}<br>"
            "%{z:,} rows<extra></extra>",
        }
        y_axis = figures.axis(title={"text": "row |log-ppl diff|"}, type="log")
    else:
        return None
    layout = figures.base_layout(
        PANEL_HEIGHT,
        title={"text": title, "font": {"size": 13}},
        xaxis=figures.axis(title={"text": escape(item.column)}),
        yaxis=y_axis,
    )
    return {"data": [trace], "layout": layout}
