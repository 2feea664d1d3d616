"""Result objects: plain, frozen, JSON-able. The contract every renderer (terminal, JSON, CSV, HTML) reads."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class SkippedRow:
    """A row left out of the analysis, and why. ``row`` counts from 0 within ``file``."""

    file: str
    row: int | None
    column: str | None
    reason: str

    def describe(self) -> str:
        parts = [self.file]
        if self.row is not None:
            parts.append(f"row {self.row}")
        if self.column is not None:
            parts.append(f"column '{self.column}'")
        return f"{', '.join(parts)}: {self.reason}"


@dataclass(frozen=True)
class Verdict:
    """How a key metric looks: ``ok`` below ``watch``, ``watch`` below ``bad``, else ``bad``."""

    metric: str
    value: float | None
    level: str  # "ok" | "watch" | "bad" | "n/a"
    watch: float
    bad: float
    meaning: str


@dataclass(frozen=True)
class StepResult:
    """One training step (= one verl batch), or the whole run when ``step`` is None."""

    step: int | None
    rows: int
    tokens: int
    metrics: dict[str, float]
    empty_rows: int = 0


@dataclass(frozen=True)
class AnalysisResult:
    """Everything ``analyze`` found; ``to_json()`` is the documented JSON (schemas/result.schema.json)."""

    inputs: list[str]
    columns: dict[str, str]
    layout: str
    device: str
    run: StepResult
    steps: list[StepResult]
    rounds: list[dict[str, Any]]
    verdicts: list[Verdict]
    warnings: list[str] = field(default_factory=list)
    skipped: list[SkippedRow] = field(default_factory=list)
    skipped_rows: int = 0

    def to_json(self) -> dict[str, Any]:
        def step_json(result: StepResult) -> dict[str, Any]:
            out: dict[str, Any] = {"rows": result.rows, "tokens": result.tokens, "empty_rows": result.empty_rows}
            if result.step is not None:
                out = {"step": result.step, **out}
            out["metrics"] = {name: json_number(value) for name, value in result.metrics.items()}
            return out

        return {
            "schema_version": SCHEMA_VERSION,
            "inputs": list(self.inputs),
            "columns": dict(self.columns),
            "layout": self.layout,
            "device": self.device,
            "run": step_json(self.run),
            "steps": [step_json(step) for step in self.steps],
            "rounds": [{key: json_number(value) for key, value in row.items()} for row in self.rounds],
            "verdicts": [{**asdict(v), "value": json_number(v.value)} for v in self.verdicts],
            "warnings": list(self.warnings),
            "skipped": [asdict(s) for s in self.skipped],
            "skipped_rows": self.skipped_rows,
        }


def json_number(value: Any) -> Any:
    """NaN and ±inf have no JSON spelling: they become null (the schema allows it for metrics)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
