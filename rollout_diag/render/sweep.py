"""Rich table for the threshold sweep."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.text import Text

from rollout_diag.decisions.sweep import UNIT, default_sentences
from rollout_diag.render.format import percent, plain
from rollout_diag.render.table import Column, FitTable, Num
from rollout_diag.results import SweepOption


def sweep_table(run: Sequence[SweepOption], targets: Sequence[float]) -> FitTable:
    columns = [
        Column("option", "left", key=True),
        Column("of", "left"),
        Column("verl default", "left"),
        Column("rejects at default"),
        *(Column(f"for ≤ {percent(target)}") for target in targets),
    ]
    table = FitTable("Threshold sweep (whole run): the threshold that rejects at most each target share", columns)
    for row in run:
        cells: list[str | Num] = [
            row.option,
            UNIT[row.level],
            row.verl_default or "–",
            percent(row.default_share) if row.verl_default else "–",
        ]
        for entry in row.thresholds:
            cells.append(threshold_cell(row, entry.target, entry.threshold, entry.share))
        table.add_row(*cells)
    return table


def below_one(row: SweepOption, target: float) -> bool:
    """True when the target share is less than one of the option's tokens or sequences: no threshold rejects
    so little (the sweep's threshold there is the largest value, which rejects nothing)."""
    return target * row.count < 1


def threshold_cell(row: SweepOption, target: float, threshold: float, share: float) -> Num | str:
    if below_one(row, target):
        return f"– (< 1 {UNIT[row.level].removesuffix('s')})"
    return Num(threshold, suffix=f" ({percent(share)})")


def render_sweep(run: Sequence[SweepOption], targets: Sequence[float]) -> RenderableType:
    notes = [plain(f"• {line}") for line in default_sentences(run)]
    footer = Text(
        "Thresholds are in verl's units: a ratio U for k1 options (L = 1/U) and IS, the statistic's bound for k2/k3 "
        "and the probability gates kpop, bkl, tv (docs/gates.md). Sequence options are exact; token options come from "
        "a histogram of clamp20(δ) (of the gate's value for the gates; 32 bins per decade): "
        "they never reject more than the target and lie at most one bin above the exact threshold.",
        style="dim",
    )
    return Group(sweep_table(run, targets), *notes, footer)
