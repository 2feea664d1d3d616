"""The contract: what every command returns, as typed results that read back from their JSON.

- ``rows.py``: a step's metrics, the typed rows and findings (worst rows and tokens, anomalies, trends, hints, the
  overall verdict) and what reading skipped;
- ``columns.py``: the column store (steps held as float64 columns, read back as ``StepResult`` lists and dicts);
- ``analysis.py``, ``comparison.py``, ``sweep.py``: each command's result and its JSON;
- ``shapes.py``: an item's JSON and reading it back, field by field (``JsonItem``, ``json_as``);
- ``document.py``, ``loading.py``: a saved document's common fields, reading one back;
- ``reprs.py``: one-line reprs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rollout_diag.lazy import lazy_getattr

if TYPE_CHECKING:  # the names as mypy and readers see them; at run time each loads when first read (__getattr__)
    from rollout_diag.formatting import ExtraValue
    from rollout_diag.results.analysis import AnalysisResult, GroupResult, extra_names, json_row
    from rollout_diag.results.association import ColumnAssociation, GroupWorstRows, TrainerColumns
    from rollout_diag.results.columns import (
        Column,
        ColumnSource,
        Converted,
        ItemSequence,
        KeyColumns,
        MetricColumns,
        ReadSequence,
        RowMetrics,
        Rows,
        StepTable,
        metric_column,
        run_rows,
        step_ids,
    )
    from rollout_diag.results.comparison import (
        FIRST_SECTION,
        ComparisonResult,
        PresetResult,
        PresetTable,
        Recommendation,
    )
    from rollout_diag.results.document import SCHEMA_VERSION
    from rollout_diag.results.loading import SavedResult, load_result, load_results, result_from_json
    from rollout_diag.results.prompts import (
        ExtremePrompt,
        MatchedCell,
        MatchedPrompt,
        PromptCells,
        PromptEvidence,
        PromptFindings,
        RunsPrompts,
        RunWorst,
        prompt_label,
    )
    from rollout_diag.results.reprs import repr_inputs, repr_text, short_repr
    from rollout_diag.results.rows import (
        FILL_VALUES_KEPT,
        UNORDERED,
        Anomaly,
        DialectLayout,
        DivergentRound,
        Evidence,
        FillCount,
        Hint,
        HintRow,
        OverallVerdict,
        RowPlace,
        RowRef,
        RowStats,
        RowTokens,
        SkippedData,
        SkippedRow,
        StepResult,
        Sums,
        Trend,
        Verdict,
        WorstRow,
        WorstToken,
        repr_sizes,
        share_text,
    )
    from rollout_diag.results.runs import KnobEffect, RatioGate, RunMetric, RunsResult, RunSteps, RunSummary
    from rollout_diag.results.shapes import each, item_to_json, json_as, json_number
    from rollout_diag.results.sweep import SweepOption, SweepPoint, SweepResult, SweepStep, SweepTarget

# the module that defines each public name: a command loads only the result modules it reads (analyze neither
# the sweep's, the comparison's nor the runs' results, nor reading documents back)
_MODULES: dict[str, tuple[str, ...]] = {
    "rollout_diag.formatting": ("ExtraValue",),
    "rollout_diag.results.analysis": ("AnalysisResult", "GroupResult", "extra_names", "json_row"),
    "rollout_diag.results.association": ("ColumnAssociation", "GroupWorstRows", "TrainerColumns"),
    "rollout_diag.results.columns": (
        "Column",
        "ColumnSource",
        "Converted",
        "ItemSequence",
        "KeyColumns",
        "MetricColumns",
        "ReadSequence",
        "RowMetrics",
        "Rows",
        "StepTable",
        "metric_column",
        "run_rows",
        "step_ids",
    ),
    "rollout_diag.results.comparison": (
        "FIRST_SECTION",
        "ComparisonResult",
        "PresetResult",
        "PresetTable",
        "Recommendation",
    ),
    "rollout_diag.results.document": ("SCHEMA_VERSION",),
    "rollout_diag.results.loading": ("SavedResult", "load_result", "load_results", "result_from_json"),
    "rollout_diag.results.prompts": (
        "ExtremePrompt",
        "MatchedCell",
        "MatchedPrompt",
        "PromptCells",
        "PromptEvidence",
        "PromptFindings",
        "RunsPrompts",
        "RunWorst",
        "prompt_label",
    ),
    "rollout_diag.results.reprs": ("repr_inputs", "repr_text", "short_repr"),
    "rollout_diag.results.rows": (
        "FILL_VALUES_KEPT",
        "UNORDERED",
        "Anomaly",
        "DialectLayout",
        "DivergentRound",
        "Evidence",
        "FillCount",
        "Hint",
        "HintRow",
        "OverallVerdict",
        "RowPlace",
        "RowRef",
        "RowStats",
        "RowTokens",
        "SkippedData",
        "SkippedRow",
        "StepResult",
        "Sums",
        "Trend",
        "Verdict",
        "WorstRow",
        "WorstToken",
        "repr_sizes",
        "share_text",
    ),
    "rollout_diag.results.runs": ("KnobEffect", "RatioGate", "RunMetric", "RunsResult", "RunSteps", "RunSummary"),
    "rollout_diag.results.shapes": ("each", "item_to_json", "json_as", "json_number"),
    "rollout_diag.results.sweep": ("SweepOption", "SweepPoint", "SweepResult", "SweepStep", "SweepTarget"),
}
_EXPORTS = {name: module for module, names in _MODULES.items() for name in names}

__all__ = [
    "FILL_VALUES_KEPT",
    "FIRST_SECTION",
    "SCHEMA_VERSION",
    "UNORDERED",
    "AnalysisResult",
    "Anomaly",
    "Column",
    "ColumnAssociation",
    "ColumnSource",
    "ComparisonResult",
    "Converted",
    "DialectLayout",
    "DivergentRound",
    "Evidence",
    "ExtraValue",
    "ExtremePrompt",
    "FillCount",
    "GroupResult",
    "GroupWorstRows",
    "Hint",
    "HintRow",
    "ItemSequence",
    "KeyColumns",
    "KnobEffect",
    "MatchedCell",
    "MatchedPrompt",
    "MetricColumns",
    "OverallVerdict",
    "PresetResult",
    "PresetTable",
    "PromptCells",
    "PromptEvidence",
    "PromptFindings",
    "RatioGate",
    "ReadSequence",
    "Recommendation",
    "RowMetrics",
    "RowPlace",
    "RowRef",
    "RowStats",
    "RowTokens",
    "Rows",
    "RunMetric",
    "RunSteps",
    "RunSummary",
    "RunWorst",
    "RunsPrompts",
    "RunsResult",
    "SavedResult",
    "SkippedData",
    "SkippedRow",
    "StepResult",
    "StepTable",
    "Sums",
    "SweepOption",
    "SweepPoint",
    "SweepResult",
    "SweepStep",
    "SweepTarget",
    "TrainerColumns",
    "Trend",
    "Verdict",
    "WorstRow",
    "WorstToken",
    "each",
    "extra_names",
    "item_to_json",
    "json_as",
    "json_number",
    "json_row",
    "load_result",
    "load_results",
    "metric_column",
    "prompt_label",
    "repr_inputs",
    "repr_sizes",
    "repr_text",
    "result_from_json",
    "run_rows",
    "share_text",
    "short_repr",
    "step_ids",
]


__getattr__ = lazy_getattr("rollout_diag.results", _EXPORTS, globals())


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
