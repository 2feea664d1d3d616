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
    from rollout_diag.decisions.diff import DiffResult, DiffSide

VERDICT_STYLE = {"better": "green", "worse": "bold red", "no detectable change": "", "n/a": "dim"}


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
            short_name(metric.metric),
            Num(metric.a),
            Num(metric.b),
            change(metric.a, metric.b),
            Num(metric.difference, digits=3),
            Num(metric.low, digits=3),
            Num(metric.high, digits=3),
            Text(metric.verdict, style=VERDICT_STYLE.get(metric.verdict, "")),
        )
    parts: list = [_side("A", result.a), _side("B", result.b), metrics]
    changed = result.changed_presets
    if changed:
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
        )
        for preset in changed:
            presets.add_row(
                preset.preset,
                percent(preset.a),
                percent(preset.b),
                percent(preset.difference),
                percent(preset.low),
                percent(preset.high),
            )
        parts.append(presets)
    elif result.presets:
        parts.append(Text(f"No preset's share of dropped tokens changed by more than its {level} interval."))
    names = [f"{short_name(m.metric)} = {m.metric}" for m in result.metrics if short_name(m.metric) != m.metric]
    if names:
        parts.append(Text("Names: " + "; ".join(names) + ".", style="dim"))
    parts.extend(plain(f"warning: {warning}", style="yellow") for warning in result.warnings)
    return Group(*parts)


def _side(name: str, side: DiffSide) -> Text:
    run = side.result.run
    line = Text(f"{name}: ", style="bold")
    line.append_text(plain(side.label))
    line.append(f" ({number(run.rows)} sequences, {number(run.tokens)} model tokens)")
    return line
