"""Rebuild an AnalysisResult from its JSON form (``analyze --format json``): the inverse of ``to_json()``."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from rollout_diag import results
from rollout_diag.errors import InputError
from rollout_diag.results import AnalysisResult, SkippedRow, StepResult, Verdict

# List fields of AnalysisResult whose items are dataclasses; looked up by name so fields added later still load.
_ITEM_TYPES = {
    "verdicts": "Verdict",
    "skipped": "SkippedRow",
    "worst_rows": "WorstRow",
    "worst_tokens": "WorstToken",
    "worst_row_tokens": "RowTokens",
    "anomalies": "Anomaly",
    "trends": "Trend",
    "hints": "Hint",
}


def result_from_json(document: dict[str, Any]) -> AnalysisResult:
    """The AnalysisResult that ``to_json()`` wrote ``document`` from (JSON null metrics come back as NaN).

    Raises InputError when the document is not an ``analyze`` result of a schema version this build reads.
    """
    if not isinstance(document, dict) or "run" not in document or "steps" not in document:
        raise InputError("not an `analyze --format json` result: expected keys 'run' and 'steps'")
    version = document.get("schema_version")
    if version is not None and version > results.SCHEMA_VERSION:
        raise InputError(
            f"result has schema_version {version}, this rollout-diag reads up to {results.SCHEMA_VERSION}: upgrade"
        )
    values: dict[str, Any] = {}
    for spec in dataclasses.fields(AnalysisResult):
        if spec.name not in document:
            continue
        raw = document[spec.name]
        if spec.name in ("run", "steps"):
            values[spec.name] = (
                StepResult.from_json(raw) if spec.name == "run" else [StepResult.from_json(step) for step in raw]
            )
        elif spec.name in _ITEM_TYPES:
            values[spec.name] = _items(_ITEM_TYPES[spec.name], raw)
        elif spec.name in ("rounds", "positions"):
            values[spec.name] = [{key: _nan_for_null(value, key) for key, value in row.items()} for row in raw]
        else:
            values[spec.name] = raw
    missing = [f.name for f in dataclasses.fields(AnalysisResult) if _required(f) and f.name not in values]
    if missing:
        raise InputError(f"result JSON lacks {', '.join(missing)}")
    return AnalysisResult(**values)


def _required(spec: dataclasses.Field) -> bool:
    return spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING


def _items(type_name: str, raw: list[dict[str, Any]]) -> list[Any]:
    item_type = {"Verdict": Verdict, "SkippedRow": SkippedRow}.get(type_name) or getattr(results, type_name, None)
    if item_type is None:  # an older results.py without this type: keep the plain dicts
        return list(raw)
    names = {spec.name for spec in dataclasses.fields(item_type)}
    return [item_type(**{key: value for key, value in item.items() if key in names}) for item in raw]


def _nan_for_null(value: Any, key: str) -> Any:
    # Integers-or-labels stay as they are; a null float metric was NaN before to_json().
    if value is None and key not in ("step", "bucket", "label"):
        return math.nan
    return value
