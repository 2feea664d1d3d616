"""rollout-diag: offline diagnostics for training–inference logprob mismatch in RL for LLMs.

Public API: ``analyze`` (every mismatch metric per step and run), the result dataclasses, the
accumulators (mergeable float64 states a trainer can feed its own chunks), and the errors.
"""

from typing import Any

from rollout_diag.compare import (
    ComparisonResult,
    PresetResult,
    analyze_and_compare,
    compare_presets,
    export_decisions,
)
from rollout_diag.engine import Analysis, analyze, inspect_row, threshold_sweep
from rollout_diag.errors import ColumnError, ConfigError, DataError, InputError, RolloutDiagError
from rollout_diag.io.chunk import Chunk
from rollout_diag.io.reader import DumpReader
from rollout_diag.io.writer import DumpWriter
from rollout_diag.metrics.debug import DebugAccumulator
from rollout_diag.metrics.offpolicy import OffPolicyAccumulator
from rollout_diag.metrics.rollout_kl import RolloutKLAccumulator
from rollout_diag.metrics.rounds import RoundAccumulator
from rollout_diag.presets import PRESETS, Preset, get_presets, load_presets_file, preset_from_options
from rollout_diag.results import AnalysisResult, SkippedRow, StepResult, SweepResult, Verdict


def write_report(*args: Any, **kwargs: Any) -> Any:
    """Write the self-contained HTML report; see :func:`rollout_diag.report.write_report` (plotly loads lazily)."""
    from rollout_diag.report import write_report as write

    return write(*args, **kwargs)


__version__ = "0.1.0"

__all__ = [
    "PRESETS",
    "Analysis",
    "AnalysisResult",
    "Chunk",
    "ColumnError",
    "ComparisonResult",
    "ConfigError",
    "DataError",
    "DebugAccumulator",
    "DumpReader",
    "DumpWriter",
    "InputError",
    "OffPolicyAccumulator",
    "Preset",
    "PresetResult",
    "RolloutDiagError",
    "RolloutKLAccumulator",
    "RoundAccumulator",
    "SkippedRow",
    "StepResult",
    "SweepResult",
    "Verdict",
    "__version__",
    "analyze",
    "analyze_and_compare",
    "compare_presets",
    "export_decisions",
    "get_presets",
    "inspect_row",
    "load_presets_file",
    "preset_from_options",
    "threshold_sweep",
    "write_report",
]
