"""Saved results read back: a ``--format json`` document as the result it holds."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rollout_diag.errors import ConfigError, InputError, option_name
from rollout_diag.results.analysis import AnalysisResult
from rollout_diag.results.comparison import ComparisonResult


def result_from_json(document: Any) -> AnalysisResult | ComparisonResult:
    """The result a ``--format json`` document holds: ``compare-presets``'s (it has ``presets``) or ``analyze``'s
    (``run`` and ``steps``). Raises InputError for anything else."""
    if isinstance(document, dict) and "presets" in document:
        return ComparisonResult.from_json(document)
    if isinstance(document, dict) and "run" in document and "steps" in document:
        return AnalysisResult.from_json(document)
    raise InputError("not the --format json output of analyze or compare-presets.")


def load_results(paths: Sequence[str | Path]) -> tuple[AnalysisResult | None, ComparisonResult | None]:
    """(analysis, comparison) from saved ``--format json`` files, at most one of each kind (a report draws one run).
    Raises InputError for an unreadable file or another document, ConfigError for two results of one kind."""
    found: dict[type, tuple[str | Path, AnalysisResult | ComparisonResult]] = {}
    for path in paths:
        try:
            document = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InputError(f"{path}: not a readable JSON file ({exc}).") from exc
        try:
            result = result_from_json(document)
        except InputError as exc:
            raise InputError(f"{path}: {exc.message}") from exc
        if type(result) in found:
            kind = "compare-presets" if isinstance(result, ComparisonResult) else "analyze"
            raise ConfigError(
                f"{option_name('from_json')}: {found[type(result)][0]} and {path} are both {kind} results; "
                "give one of each."
            )
        found[type(result)] = (path, result)
    analysis = found.get(AnalysisResult, (None, None))[1]
    comparison = found.get(ComparisonResult, (None, None))[1]
    return analysis, comparison  # type: ignore[return-value]
