"""rollout-diag: offline diagnostics for training–inference logprob mismatch in RL for LLMs.

Public API: ``analyze`` (every mismatch metric per step and run), the result dataclasses, the
accumulators (mergeable float64 states a trainer can feed its own chunks), and the errors.

Names load on first use (PEP 562): ``import rollout_diag`` and the CLI's ``--help`` or an error message do
not pay for importing torch, pyarrow or plotly.
"""

from __future__ import annotations

# export registers a result's views (to_polars, to_pandas, _repr_html_) in rollout_diag/views.py, where the results'
# methods find them: results import nothing of export. Light: the views' modules load when a view is asked for.
from rollout_diag import export  # noqa: F401
from rollout_diag.lazy import lazy_getattr

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    "ComparisonResult": "rollout_diag.results",
    "PresetResult": "rollout_diag.results",
    "OverallVerdict": "rollout_diag.results",
    "analyze_and_compare": "rollout_diag.drivers.compare",
    "compare_presets": "rollout_diag.drivers.compare",
    "export_decisions": "rollout_diag.drivers.exports",
    "Dump": "rollout_diag.drivers.dump",
    "Analysis": "rollout_diag.drivers.passes",
    "analyze": "rollout_diag.drivers.engine",
    "inspect_row": "rollout_diag.drivers.inspect",
    "threshold_sweep": "rollout_diag.drivers.sweep",
    "ColumnError": "rollout_diag.errors",
    "ConfigError": "rollout_diag.errors",
    "DataError": "rollout_diag.errors",
    "InputError": "rollout_diag.errors",
    "RolloutDiagError": "rollout_diag.errors",
    "find_hints": "rollout_diag.decisions.hints",
    "Chunk": "rollout_diag.io.chunk",
    "ConvertResult": "rollout_diag.io.convert",
    "convert": "rollout_diag.drivers.convert",
    "DumpInputs": "rollout_diag.io.formats",
    "FORMAT_NAMES": "rollout_diag.io.formats",
    "DumpReader": "rollout_diag.io.reader",
    "DumpWriter": "rollout_diag.io.writer",
    "DebugAccumulator": "rollout_diag.metrics.debug",
    "HintEvidenceAccumulator": "rollout_diag.metrics.hints",
    "OffPolicyAccumulator": "rollout_diag.metrics.offpolicy",
    "RolloutKLAccumulator": "rollout_diag.metrics.rollout_kl",
    "RoundAccumulator": "rollout_diag.metrics.rounds",
    "PRESETS": "rollout_diag.presets",
    "Preset": "rollout_diag.presets",
    "get_presets": "rollout_diag.presets",
    "load_presets_file": "rollout_diag.presets",
    "preset_from_options": "rollout_diag.presets",
    "choose_presets": "rollout_diag.presets",
    "write_report": "rollout_diag.report",
    "AnalysisResult": "rollout_diag.results",
    "Hint": "rollout_diag.results",
    "SkippedRow": "rollout_diag.results",
    "StepResult": "rollout_diag.results",
    "SweepResult": "rollout_diag.results",
    "Verdict": "rollout_diag.results",
    "BatchMetrics": "rollout_diag.trainers",
    "compute_metrics": "rollout_diag.trainers",
    "from_skyrl_batch": "rollout_diag.trainers",
    "from_verl_batch": "rollout_diag.trainers",
    # decisions: check gates, diff A/B, the preset recommendation
    "check_run": "rollout_diag.drivers.check",
    "diff_runs": "rollout_diag.drivers.diff",
    "CheckResult": "rollout_diag.decisions.check",
    "Gate": "rollout_diag.decisions.check",
    "DiffResult": "rollout_diag.decisions.diff",
    # runs: many runs with their knobs (an ablation matrix)
    "compare_dumps": "rollout_diag.drivers.runs",
    "RunSpec": "rollout_diag.drivers.runs",
    "RunsResult": "rollout_diag.results",
    "write_runs_report": "rollout_diag.report.runs",
    "Recommendation": "rollout_diag.decisions.recommend",
    "recommend": "rollout_diag.decisions.recommend",
    "RowStats": "rollout_diag.results",
    "load_result": "rollout_diag.results",
    "load_results": "rollout_diag.results",
    "result_from_json": "rollout_diag.results",
    # the sweep's typed rows, and the intrusive rule
    "SweepOption": "rollout_diag.results",
    "SweepStep": "rollout_diag.results",
    "intrusive_reasons": "rollout_diag.decisions.intrusive",
    # watch: follow a dump directory while the trainer writes it
    "watch": "rollout_diag.drivers.watch",
    "Watcher": "rollout_diag.drivers.watch",
    "WatchUpdate": "rollout_diag.drivers.watch",
}

__all__ = sorted([*_EXPORTS, "__version__"])


__getattr__ = lazy_getattr("rollout_diag", _EXPORTS, globals())


def __dir__() -> list[str]:
    return __all__
