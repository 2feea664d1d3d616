"""rollout-diag: offline diagnostics for training–inference logprob mismatch in RL for LLMs.

Public API: ``analyze`` (every mismatch metric per step and run), the result dataclasses, the
accumulators (mergeable float64 states a trainer can feed its own chunks), and the errors.
"""

from rollout_diag.engine import Analysis, analyze, inspect_row, threshold_sweep
from rollout_diag.errors import ColumnError, ConfigError, DataError, InputError, RolloutDiagError
from rollout_diag.io.chunk import Chunk
from rollout_diag.io.reader import DumpReader
from rollout_diag.io.writer import DumpWriter
from rollout_diag.metrics.debug import DebugAccumulator
from rollout_diag.metrics.offpolicy import OffPolicyAccumulator
from rollout_diag.metrics.rollout_kl import RolloutKLAccumulator
from rollout_diag.metrics.rounds import RoundAccumulator
from rollout_diag.results import AnalysisResult, SkippedRow, StepResult, Verdict

__version__ = "0.1.0"

__all__ = [
    "Analysis",
    "AnalysisResult",
    "Chunk",
    "ColumnError",
    "ConfigError",
    "DataError",
    "DebugAccumulator",
    "DumpReader",
    "DumpWriter",
    "InputError",
    "OffPolicyAccumulator",
    "RolloutDiagError",
    "RolloutKLAccumulator",
    "RoundAccumulator",
    "SkippedRow",
    "StepResult",
    "Verdict",
    "__version__",
    "analyze",
    "inspect_row",
    "threshold_sweep",
]
