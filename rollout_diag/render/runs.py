"""The ``runs`` tables: the first line (which knob mattered most), one row per run (knobs, verdict, key metrics,
onset step), one row per knob effect (ratio, interval, detectable), the ``--max-ratio`` gates, the prompts matched
across runs (each prompt's row mismatch in every run). Fitted to the terminal (``FitTable``): 80 columns hold
them."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rich.console import Group
from rich.text import Text

from rollout_diag.catalogue import CATASTROPHIC_TOKEN_SHARE, LOGPROB_ABS_DIFF, REJECTED_TOKEN_FRACTION, short_name
from rollout_diag.render.format import plain
from rollout_diag.render.table import Column, FitTable, Num

if TYPE_CHECKING:
    from rollout_diag.results import KnobEffect, RunsPrompts, RunsResult

LEVEL_STYLE = {"bad": "bold red", "watch": "yellow", "ok": "green", "n/a": "dim"}
# Column headers short enough for 80 columns (the "Names:" line spells each key)
HEADERS = {LOGPROB_ABS_DIFF.key: "mean |δ|", CATASTROPHIC_TOKEN_SHARE.key: "cat. share"}
PROMPT_ROWS = 10  # prompts in the terminal's matched-prompts table (the JSON and the report hold up to 50)
PROMPT_WIDTH = 24  # a prompt id longer than this is cut (the JSON has it whole)
NAMED_OUTLIERS = 5  # deterministic outliers named in the prompts line


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
    parts.extend(prompt_parts(result.prompts, [run.name for run in result.runs]))
    names = [f"{_header(m, presets)} = {m}" for m in result.metrics if _header(m, presets) != m]
    if names:
        parts.append(Text("Names: " + "; ".join(names) + ".", style="dim"))
    parts.extend(plain(f"warning: {warning}", style="yellow") for warning in result.warnings)
    return Group(*parts)


def prompt_parts(prompts: RunsPrompts | None, runs: list[str]) -> list:
    """The prompts matched across runs: one line without a prompt identity, without a prompt seen in two runs or
    without a deterministic outlier; else a line naming the outliers and the table of the matrix's first PROMPT_ROWS
    prompts (one column per run: its mean row mismatch, * where every row of it is in that run's worst 1 %)."""
    if prompts is None:
        return [
            Text(
                "Prompts: no prompt identity in the runs (no prompt_id column, no prompt tokens under mask 0 with "
                "token ids): nothing matched across runs.",
                style="dim",
            )
        ]
    if prompts.shared == 0:
        return [Text(f"Prompts ({prompts.identity}): no prompt recurs across runs; nothing matched.", style="dim")]
    said = f"Prompts ({prompts.identity}): {prompts.shared} seen in two runs or more ({prompts.in_every_run} in all)"
    if prompts.sampled_share < 1.0:
        said += f", {prompts.sampled_share:.3g} of them followed"
    listed = prompts.listed
    if listed:
        names = ", ".join(_cut(item.prompt) for item in listed[:NAMED_OUTLIERS])
        more = f" and {prompts.outliers - NAMED_OUTLIERS} more" if prompts.outliers > NAMED_OUTLIERS else ""
        said += (
            f"; {prompts.outliers} in the worst 1 % in every run they appear in (deterministic outliers): "
            f"{names}{more}."
        )
    else:  # clean: the line alone (the prompts × runs matrix in --format json and --report)
        said += (
            "; none in the worst 1 % in every run it appears in (each prompt's row mismatch per run: --format json)."
        )
        return [plain(said)]
    parts: list = [plain(said, style="bold red")]
    shown = [run for run in runs if run in prompts.runs]
    table = FitTable(
        "Prompts matched across runs: row mismatch",
        [Column("prompt", "left", key=True), *(Column(run) for run in shown)],
        caption="mean |log-ppl diff| of the prompt's rows in each run; *: every row in that run's worst 1 % "
        f"(score ≥ {', '.join(f'{w.run} {w.threshold:.3g}' for w in prompts.worst)}); "
        f"outliers first, then the most extreme elsewhere; {len(prompts.matrix)} in --format json.",
    )
    for item in prompts.matrix[:PROMPT_ROWS]:
        cells = [item.cell(run) for run in shown]
        table.add_row(
            _cut(item.prompt),
            *(
                None if cell is None else Num(cell.score_mean, suffix="*" if cell.worst else "", digits=3)
                for cell in cells
            ),
            style="bold" if item.listed else None,
        )
    parts.append(table)
    return parts


def _cut(text: str) -> str:
    return text if len(text) <= PROMPT_WIDTH else text[: PROMPT_WIDTH - 1] + "…"


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
