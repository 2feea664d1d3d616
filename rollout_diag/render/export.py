"""Flat text exports: JSON and CSV strings of result objects."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from typing import Any

from rollout_diag.results import StepResult


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
                *("" if v is None or math.isnan(v) else repr(v) for v in values),
            ]
        )
    return buffer.getvalue()
