"""Saved results read back: a ``--format json`` document as the result it holds."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rollout_diag.errors import ConfigError, InputError, option_name
from rollout_diag.results.analysis import AnalysisResult
from rollout_diag.results.comparison import ComparisonResult
from rollout_diag.results.runs import RunsResult

SavedResult = AnalysisResult | ComparisonResult | RunsResult  # what a saved ``--format json`` document reads back as


def result_from_json(document: Any) -> SavedResult:
    """The result a ``--format json`` document holds: ``runs``'s (``"kind": "runs"``), ``compare-presets``'s (it has
    ``presets``) or ``analyze``'s (``run`` and ``steps``). Raises InputError for anything else."""
    if isinstance(document, dict) and document.get("kind") == "runs":
        return RunsResult.from_json(document)
    if isinstance(document, dict) and "presets" in document:
        return ComparisonResult.from_json(document)
    if isinstance(document, dict) and "run" in document and "steps" in document:
        return AnalysisResult.from_json(document)
    raise InputError("not the --format json output of analyze, compare-presets or runs.")


def load_result(path: str | Path) -> SavedResult:
    """The result a saved ``--format json`` file holds (``analyze``, ``compare-presets`` or ``runs``). Raises
    InputError, one line naming the file, for an unreadable file or another document."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: not a readable JSON file ({exc}).") from exc
    try:
        return result_from_json(document)
    except InputError as exc:
        raise InputError(f"{path}: {exc.message}") from exc


def load_results(paths: Sequence[str | Path]) -> tuple[AnalysisResult | None, ComparisonResult | None]:
    """(analysis, comparison) from saved ``--format json`` files, at most one of each kind (a report draws one run).
    Raises InputError for an unreadable file or another document (a ``runs`` result: its report is ``runs
    --report``), ConfigError for two results of one kind."""
    analysis: tuple[str | Path, AnalysisResult] | None = None
    comparison: tuple[str | Path, ComparisonResult] | None = None
    for path in paths:
        result = load_result(path)
        if isinstance(result, RunsResult):
            raise InputError(f"{path}: a `runs` result; its report is drawn by `runs --report`, or write_runs_report.")
        earlier = analysis if isinstance(result, AnalysisResult) else comparison
        if earlier is not None:
            kind = "compare-presets" if isinstance(result, ComparisonResult) else "analyze"
            raise ConfigError(
                f"{option_name('from_json')}: {earlier[0]} and {path} are both {kind} results; give one of each."
            )
        if isinstance(result, AnalysisResult):
            analysis = (path, result)
        else:
            comparison = (path, result)
    return (None if analysis is None else analysis[1]), (None if comparison is None else comparison[1])
