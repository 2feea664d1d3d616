"""The report's ``--by`` section: per grouping, a bar per group (k3_kl, coloured by its verdict), the key metric per
step for each group, and the table of groups (worst first, capped with a "+N more" note)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby

from rollout_diag import catalogue
from rollout_diag.catalogue import short_name
from rollout_diag.formatting import GROUPS_SHOWN, group_label, number, percent, selection_sentence
from rollout_diag.report import figures
from rollout_diag.report.markup import Column, Markup, badge, escape, note, table
from rollout_diag.report.sections import Canvas, Section
from rollout_diag.results import AnalysisResult, GroupResult

GROUP_METRICS = (
    catalogue.K3_KL.key,
    catalogue.CHI2_TOKEN.key,
    catalogue.LOG_PPL_ABS_DIFF.key,
    catalogue.PROBS_DIFF_MEAN.key,
)
LEVEL_COLOR = {"bad": figures.RED, "watch": figures.AMBER, "ok": figures.GREEN}
LINES_SHOWN = 8  # groups drawn over steps: more lines than this are unreadable (the table lists them all)


def groups_section(result: AnalysisResult, canvas: Canvas) -> Section | None:
    """None without ``--by``."""
    if not result.groups:
        return None
    parts: list[str] = [
        Markup(
            '<p class="lead">Key metrics per group of rows (<code>--by</code>): each group as if its rows alone '
            "were the dump; the worst group first. Bars: k3_kl of the run, coloured by the group's verdict.</p>"
        )
    ]
    for index, (column, members) in enumerate(groupby(result.groups, key=lambda g: g.column)):
        parts.append(_grouping(index, column, list(members), canvas))
    return Section("groups", "Which group diverges?", "".join(parts))


def _grouping(index: int, column: str, groups: Sequence[GroupResult], canvas: Canvas) -> str:
    shown = list(groups[:GROUPS_SHOWN])
    labels = [f"{group_label(g.value)}" for g in shown]
    key = catalogue.K3_KL.key
    bar = figures.BarPanel(
        title=f"{short_name(key)} by {column}",
        values=[g.metrics.get(key) for g in shown],
        hover=[
            escape(
                f"{label}: k3_kl {number(g.metrics.get(key))}, {percent(g.token_share)} of tokens, {g.verdict['level']}"
            )
            for label, g in zip(labels, shown, strict=True)
        ],
        color=[LEVEL_COLOR.get(g.verdict.get("level", ""), figures.GREY) for g in shown],
    )
    body = [
        f"<h3>{escape(column)}</h3>",
        canvas.plot(
            f"groups-{index}-bars", figures.bars_figure([escape(label) for label in labels], [bar], escape(column))
        ),
    ]
    lines = [
        (escape(label), [s.step for s in g.steps], [s.metrics.get(key) for s in g.steps])
        for label, g in zip(labels[:LINES_SHOWN], shown[:LINES_SHOWN], strict=True)
    ]
    if any(len(steps) > 1 for _, steps, _ in lines):
        panel = figures.TrendPanel(title=f"{short_name(key)} per step, by {escape(column)}", lines=lines, legend=True)
        body.append(canvas.plot(f"groups-{index}-steps", figures.trends_figure([panel])))
    columns = [
        Column(column),
        Column("rows", True),
        Column("tokens", True),
        Column("verdict"),
        *(Column(short_name(k), True, k) for k in GROUP_METRICS),
        Column("worst round", True),
    ]
    rows = [
        (
            label,
            f"{number(g.rows)} ({percent(g.row_share)})",
            f"{number(g.tokens)} ({percent(g.token_share)})",
            badge(g.verdict.get("level", "n/a")),
            *(g.metrics.get(k) for k in GROUP_METRICS),
            "—" if g.most_divergent_round is None else g.most_divergent_round,
        )
        for label, g in zip(labels, shown, strict=True)
    ]
    body.append(table(columns, rows))
    if len(groups) > len(shown):
        body.append(
            note(f"+{len(groups) - len(shown)} more group(s) of {column} not shown; every group is in the JSON.")
        )
    return "".join(body)


def selection_section(result: AnalysisResult) -> Section:
    """Which rows the page is about (``--where`` / ``--steps``), and how many were kept."""
    line = selection_sentence(result.selection)
    return Section("selection", "Rows analysed", f'<p class="lead">{escape(line)}</p>')
