"""What every saved result's document holds: its schema version, provenance first, what reading skipped last."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from rollout_diag.errors import InputError
from rollout_diag.results.shapes import found

SCHEMA_VERSION = 2  # 2: compare-presets writes its per-step metrics as columns (1: a step object each)


def schema_version(document: dict[str, Any]) -> int:
    """The document's ``schema_version`` (1 where it has none); raises InputError for one that is no whole number or
    newer than this build reads."""
    version = document.get("schema_version", 1)
    if isinstance(version, bool) or not isinstance(version, int):
        raise InputError(f"field 'schema_version': expected a whole number, found {found(version)}.")
    if version > SCHEMA_VERSION:
        raise InputError(
            f"result has schema_version {version}, this rollout-diag reads up to {SCHEMA_VERSION}: upgrade"
        )
    return version


def result_document(result: Any, **body: Any) -> dict[str, Any]:
    """A sweep or comparison result's JSON: provenance first, its own ``body``, then what reading skipped."""
    return {
        "schema_version": SCHEMA_VERSION,
        "inputs": list(result.inputs),
        "columns": dict(result.columns),
        **body,
        "warnings": list(result.warnings),
        "skipped": [asdict(s) for s in result.skipped],
        "skipped_rows": result.skipped_rows,
    }
