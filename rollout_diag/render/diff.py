"""The ``diff`` A/B tables: key metrics of both runs with B's change and its bootstrap interval, then the presets
whose share of dropped tokens moved. Fitted to the terminal like every table (``FitTable``): nothing is cut."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Group
from rich.text import Text

from rollout_diag.catalogue import short_name
from rollout_diag.formatting import change as change
from rollout_diag.render.format import number, percent, plain
from rollout_diag.render.table import Column, FitTable, Num

if TYPE_CHECKING:
    from rollout_diag.decisions.diff import DiffResult, DiffSide, MetricDiff

VERDICT_STYLE = {"better": "green", "worse": "bold red", "no detectable change": "", "n/a": "dim"}


def _a_and_b(metric: MetricDiff) -> tuple[Num, Num, str]:
    """A metric's cells A, B and B vs A."""
    return Num(metric.a), Num(metric.b), change(metric.a, metric.b)


def _interval(metric: MetricDiff) -> tuple[Num, Num, Text]:
    """A metric's cells low, high (its bootstrap interval of B − A) and verdict."""
    return (
        Num(metric.low, digits=3),
        Num(metric.high, digits=3),
        Text(metric.verdict, style=VERDICT_STYLE.get(metric.verdict, "")),
    )


def diff_tables(result: DiffResult) -> Group:
    """Which run is which, the key-metric table with intervals and verdicts, then the presets whose rejection
    share moved (or one line saying none did), the names' legend and any warnings."""
    level = f"{result.level:.0%}"
    metrics = FitTable(
        "Key metrics, B against A",
        [
            Column("metric", "left", key=True),
            Column("A"),
            Column("B"),
            Column("B vs A", "left"),
            Column("B − A"),
            Column(f"{level} low"),
            Column(f"{level} high"),
            Column("verdict", "left"),
        ],
        caption=f"{level} bootstrap interval of B − A over sequences ({result.replicates} resamples of rows within "
        f"steps, seed {result.seed}); lower is better for every metric.",
    )
    for metric in result.metrics:
        metrics.add_row(
            short_name(metric.metric), *_a_and_b(metric), Num(metric.difference, digits=3), *_interval(metric)
        )
    parts: list = [_side("A", result.a), _side("B", result.b), metrics]
    grouped = result.changed_preset_groups
    if grouped:
        shared = [f"{g[0].preset} also stands for {', '.join(p.preset for p in g[1:])}" for g in grouped if len(g) > 1]
        presets = FitTable(
            "Presets whose share of dropped tokens changed",
            [
                Column("preset", "left", key=True),
                Column("A"),
                Column("B"),
                Column("B − A"),
                Column(f"{level} low"),
                Column(f"{level} high"),
            ],
            caption="+N: N more presets with the same numbers share the row: " + "; ".join(shared) + "."
            if shared
            else None,
        )
        for group in grouped:
            preset = group[0]
            presets.add_row(
                preset.preset + (f" +{len(group) - 1}" if len(group) > 1 else ""),
                percent(preset.a),
                percent(preset.b),
                percent(preset.difference),
                percent(preset.low),
                percent(preset.high),
            )
        parts.append(presets)
    elif result.presets:
        parts.append(Text(f"No preset's share of dropped tokens changed by more than its {level} interval."))
    if result.groups:
        parts.extend(group_diff_tables(result))
    names = [f"{short_name(m.metric)} = {m.metric}" for m in result.metrics if short_name(m.metric) != m.metric]
    if names:
        parts.append(Text("Names: " + "; ".join(names) + ".", style="dim"))
    parts.extend(plain(f"warning: {warning}", style="yellow") for warning in result.warnings)
    return Group(*parts)


MAX_GROUPS_SHOWN = 12  # per --by spec, as analyze's group table; JSON keeps every group


def group_diff_tables(result: DiffResult) -> list:
    """``diff --by``: per --by spec, one row per group (the largest change of k3_kl first): its rows in A and B,
    k3_kl in both, B against A with the group's own interval, and how many key metrics got worse / better."""
    level = f"{result.level:.0%}"
    parts: list = []
    for column in dict.fromkeys(group.column for group in result.groups):
        groups = [group for group in result.groups if group.column == column]
        table = FitTable(
            f"By {column}, B against A (largest change of k3_kl first)",
            [
                Column(column, "left", key=True),
                Column("rows A"),
                Column("rows B"),
                Column("k3_kl A"),
                Column("k3_kl B"),
                Column("B vs A", "left"),
                Column(f"{level} low"),
                Column(f"{level} high"),
                Column("verdict", "left"),
                Column("key metrics worse / better", "left"),
            ],
            caption=f"{level} bootstrap interval of B − A over each group's rows alone (same resampling and seed).",
        )
        for group in groups[:MAX_GROUPS_SHOWN]:
            k3 = group.headline
            worse = sum(m.verdict == "worse" for m in group.metrics)
            better = sum(m.verdict == "better" for m in group.metrics)
            table.add_row(
                "(null)" if group.value is None else str(group.value),
                Num(group.rows_a),
                Num(group.rows_b),
                *_a_and_b(k3),
                *_interval(k3),
                f"{worse} / {better} of {len(group.metrics)}",
            )
        parts.append(table)
        if len(groups) > MAX_GROUPS_SHOWN:
            parts.append(Text(f"{len(groups) - MAX_GROUPS_SHOWN} more groups of {column} (all in --format json)."))
    return parts


def _side(name: str, side: DiffSide) -> Text:
    run = side.result.run
    line = Text(f"{name}: ", style="bold")
    line.append_text(plain(side.label))
    line.append(f" ({number(run.rows)} sequences, {number(run.tokens)} model tokens)")
    return line
