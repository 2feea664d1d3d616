"""Flat text exports: JSON and CSV strings of result objects."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from typing import Any

from rollout_diag.results import StepResult, SweepResult


def to_json_text(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, allow_nan=False) + "\n"


def steps_csv(steps: Sequence[StepResult], leading: dict[str, Any] | None = None) -> str:
    """One line per step: step, rows, tokens, then every metric (union of names, first-seen order)."""
    names: dict[str, None] = {}
    for step in steps:
        names.update(dict.fromkeys(step.metrics))
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    lead = dict(leading or {})
    writer.writerow([*lead, "step", "rows", "tokens", *names])
    for step in steps:
        values = [step.metrics.get(name) for name in names]
        writer.writerow(
            [
                *lead.values(),
                step.step,
                step.rows,
                step.tokens,
                *(plain_number(v) for v in values),
            ]
        )
    return buffer.getvalue()


def analysis_csv(result: Any) -> str:
    """``analyze --format csv``: one line per step, then a line for the whole run (step ``run``)."""
    text = steps_csv([*result.steps, result.run])
    head, _, last = text.rstrip("\n").rpartition("\n")
    return f"{head}\nrun{last}\n"  # the run's step cell is empty: name it, as compare-presets' CSV does


def plain_number(value: Any) -> str:
    """A CSV cell: the float's shortest round-trip digits (never ``np.float64(…)``); empty for None/NaN."""
    if value is None or value == "":
        return ""
    if isinstance(value, (bool, int)) and not isinstance(value, float):
        return str(int(value))
    number = float(value)
    return "" if math.isnan(number) else repr(number)


def sweep_csv(result: SweepResult) -> str:
    """One line per step (and 'run') × option × target: the threshold and the share it rejects."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["step", "option", "level", "target", "threshold", "share", "verl_default", "default_share"])
    tables = [("run", result.run)] + [(entry.step, entry.options) for entry in result.steps]
    for step, options in tables:
        for row in options:
            for entry in row.thresholds:
                writer.writerow(
                    [
                        step,
                        row.option,
                        row.level,
                        plain_number(entry.target),
                        plain_number(entry.threshold),
                        plain_number(entry.share),
                        row.verl_default or "",
                        plain_number(row.default_share) if row.verl_default else "",
                    ]
                )
    return buffer.getvalue()


def comparison_csv(result: Any) -> str:
    """One line per preset × step (and a 'run' line per preset): name, mode, then every metric."""
    names: dict[str, None] = {}
    for preset in result.presets:
        for step in [*preset.steps, preset.run]:
            names.update(dict.fromkeys(step.metrics))
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["preset", "mode", "step", "rows", "tokens", *names])
    for preset in result.presets:
        for step in [*preset.steps, preset.run]:
            values = [step.metrics.get(name) for name in names]
            writer.writerow(
                [
                    preset.name,
                    preset.mode,
                    "run" if step.step is None else step.step,
                    step.rows,
                    step.tokens,
                    *(plain_number(v) for v in values),
                ]
            )
    return buffer.getvalue()
