"""The ``runs`` tables: the first line (which knob mattered most), one row per run (knobs, verdict, key metrics,
onset step), one row per knob effect (ratio, interval, detectable), the ``--max-ratio`` gates. Fitted to the terminal
(``FitTable``): 80 columns hold them."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rich.console import Group
from rich.text import Text

from rollout_diag.catalogue import CATASTROPHIC_TOKEN_SHARE, LOGPROB_ABS_DIFF, REJECTED_TOKEN_FRACTION, short_name
from rollout_diag.render.format import plain
from rollout_diag.render.table import Column, FitTable, Num

if TYPE_CHECKING:
    from rollout_diag.results import KnobEffect, RunsResult

LEVEL_STYLE = {"bad": "bold red", "watch": "yellow", "ok": "green", "n/a": "dim"}
# Column headers short enough for 80 columns (the "Names:" line spells each key)
HEADERS = {LOGPROB_ABS_DIFF.key: "mean |δ|", CATASTROPHIC_TOKEN_SHARE.key: "cat. share"}


def _header(metric: str, presets: list[str] | None = None) -> str:
    """The column header of ``metric``: a preset's dropped-token share is "drops" (numbered past one preset)."""
    if metric.startswith(REJECTED_TOKEN_FRACTION.key + "["):
        if presets is None or len(presets) == 1:
            return "drops"
        return f"drops{presets.index(metric) + 1}"
    return HEADERS.get(metric, short_name(metric))


def runs_tables(result: RunsResult) -> Group:
    """The answer line, the runs table, the knob effects table, the gates (if any), the names and warnings."""
    level = f"{result.level:.0%}"
    parts: list = [Text(result.answer, style="bold")]
    presets = [m for m in result.metrics if m.startswith(REJECTED_TOKEN_FRACTION.key + "[")]
    shown = [*result.metrics[:3], *presets]  # k3_kl, mean |δ|, catastrophic share, --preset: the rest in JSON
    knobs = "; ".join(f"{run.name}: " + " ".join(f"{k}={v}" for k, v in run.knobs.items()) for run in result.runs)
    if any(run.knobs != {"run": run.name} for run in result.runs):  # else each run is its own knob: said above
        parts.append(plain(f"Knobs: {knobs}."))
    runs = FitTable(
        f"Runs (baseline {result.baseline})",
        [
            Column("run", "left", key=True),
            Column("verdict", "left"),
            *(Column(_header(metric, presets)) for metric in shown),
            Column("onset"),
        ],
        caption=f"onset: first step where {short_name(result.onset_metric)} departs from the baseline's beyond "
        f"noise ({level}, 3 steps in a row); intervals per run in --format json.",
    )
    for run in result.runs:
        runs.add_row(
            run.name,
            Text(run.verdict, style=LEVEL_STYLE.get(run.verdict, "")),
            *(Num(run.metric(metric).value, digits=3) for metric in shown),
            "base" if run.name == result.baseline else ("-" if run.onset_step is None else str(run.onset_step)),
        )
    parts.append(runs)
    rated = [effect for effect in result.effects if effect.ratio is not None]
    if rated:
        effects = FitTable(
            "Knob effects (ratio to the baseline's level)",
            [
                Column("knob", "left", key=True),
                Column("metric", "left"),
                Column("ratio"),
                Column(f"{level} interval", "left"),
                Column("effect", "left"),
            ],
            caption=f"{level} bootstrap interval over rows ({result.replicates} resamples within steps, seed "
            f"{result.seed}); pair: two runs differing in that knob alone; fit: least squares on log(metric).",
        )
        for effect in rated:
            effects.add_row(
                f"{effect.knob} {effect.from_}→{effect.to}",
                _header(effect.metric, presets),
                Num(effect.ratio, digits=3),
                _interval(effect),
                _effect_word(effect),
            )
        parts.append(effects)
    unrated = list(dict.fromkeys(_header(e.metric, presets) for e in result.effects if e.ratio is None))
    if unrated:
        parts.append(Text(f"No ratio where a run's value is 0: {', '.join(unrated)} (see --format json).", style="dim"))
    if result.gates:
        gates = FitTable(
            "Gates: run / baseline",
            [
                Column("run", "left", key=True),
                Column("metric", "left"),
                Column("ratio"),
                Column("limit"),
                Column("result", "left"),
            ],
        )
        for gate in result.gates:
            gates.add_row(
                gate.run,
                _header(gate.metric, presets),
                Num(gate.ratio, digits=3),
                Num(gate.limit, digits=3),
                Text("pass", style="green") if gate.passed else Text("FAIL", style="bold red"),
            )
        parts.append(gates)
    names = [f"{_header(m, presets)} = {m}" for m in result.metrics if _header(m, presets) != m]
    if names:
        parts.append(Text("Names: " + "; ".join(names) + ".", style="dim"))
    parts.extend(plain(f"warning: {warning}", style="yellow") for warning in result.warnings)
    return Group(*parts)


def _interval(effect: KnobEffect) -> str:
    if not (math.isfinite(effect.low) and math.isfinite(effect.high)):
        return "n/a"
    return f"{effect.low:.3g}–{effect.high:.3g}"


def _effect_word(effect: KnobEffect) -> Text:
    assert effect.ratio is not None
    if not effect.detectable:
        return Text("no detectable effect", style="dim")
    if effect.ratio < 1.0:
        return Text(f"cut {1.0 / effect.ratio:.3g}×", style="green")
    return Text(f"raised {effect.ratio:.3g}×", style="bold red")
