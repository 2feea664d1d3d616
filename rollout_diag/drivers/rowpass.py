"""The row pass ``check`` and ``diff`` share: the analysis and the per-row statistics in one read, and results for any
step range."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from rollout_diag.drivers.dump import reads_dump
from rollout_diag.drivers.engine import build_result, check_analysed, data_warnings, read_fields, skipped_of, step_table
from rollout_diag.drivers.passes import (
    Analysis,
    Inputs,
    Progress,
    open_reader,
    resolve_device,
    run_chunks,
)
from rollout_diag.errors import DataError
from rollout_diag.groups import GroupLabels, GroupSpec, group_specs
from rollout_diag.io.reader import DEFAULT_CHUNK_TOKENS
from rollout_diag.io.readlog import ReadLog
from rollout_diag.memory import trim_heap
from rollout_diag.metrics.base import StepAccumulator
from rollout_diag.metrics.hints import HintEvidenceAccumulator
from rollout_diag.metrics.localize import FirstDifference, WorstTracker
from rollout_diag.metrics.prompts import PromptAccumulator
from rollout_diag.metrics.rowstats import RowStatsCollector
from rollout_diag.presets import Preset
from rollout_diag.results import AnalysisResult, RowStats
from rollout_diag.selection import StepRange

if TYPE_CHECKING:
    import torch  # annotations only: the driver's arithmetic runs in passes and metrics

    from rollout_diag.io.chunk import Chunk
    from rollout_diag.metrics.outcome import DropRule


@dataclass
class RowPass:
    """One pass of the analysis and the per-row statistics (``check``, ``diff``); results for any step range."""

    analysis: Analysis | None  # None once released (``release``)
    rows: RowStatsCollector
    log: ReadLog
    device: str
    strict: bool
    labels: GroupLabels | None = None  # --by: each row's group, to restrict the row statistics to a group
    first_difference: FirstDifference | None = None  # ``exact``: the first bitwise-differing model token

    def result(self, steps: StepRange | None = None) -> AnalysisResult:
        """The AnalysisResult of the steps in ``steps`` (all steps when None; worst rows/tokens only then)."""
        if self.analysis is None:
            raise RuntimeError("RowPass.result after release(): build every result before releasing the analysis")
        if not self.analysis.findings:
            raise RuntimeError("RowPass.result of a row_pass(findings=False): it gathered for summary() only")
        analysis = self.analysis if steps is None else _restricted(self.analysis, steps)
        return build_result(analysis, self.log, self.device, self.strict)

    def summary(self, steps: StepRange | None = None) -> AnalysisResult:
        """What ``diff`` reads of the steps in ``steps`` (all when None), without the per-step metrics and the findings
        ``result`` adds: the run's metrics, its rounds and positions tables, its ``--by`` groups, each step's rows,
        tokens and empty rows (a StepTable without metric columns), the data's warnings; no verdicts, step levels,
        anomalies, hints or worst rows (and, from a ``row_pass(findings=False)``, no dialect metrics). The same
        numbers as ``result(steps)``'s, at a fraction of its time and memory on many steps (200 000 one-row steps:
        the step table and the judgements were ~70 % of ``diff``'s time and most of its peak). Raises DataError as
        ``result`` does."""
        if self.analysis is None:
            raise RuntimeError("RowPass.summary after release(): build every result before releasing the analysis")
        analysis = self.analysis if steps is None else _restricted(self.analysis, steps)
        return summary_result(analysis, self.log, self.device, self.strict)

    def release(self) -> None:
        """Drop the analysis once every result is built (``diff`` keeps the runs' row statistics, not their
        analyses: 200 000 one-row steps hold ~1 GB of per-step state a run) and give the freed pages back."""
        self.analysis = None
        trim_heap()

    @cached_property
    def all_rows(self) -> RowStats:
        return self.rows.finalize()

    def row_stats(self, steps: StepRange | None = None) -> RowStats:
        rows = self.all_rows
        return rows if steps is None else rows.in_steps(*steps)

    def group_rows(self, column: str, value: Any, steps: StepRange | None = None) -> RowStats:
        """The per-row statistics of the rows in group ``value`` of the ``--by`` spec ``column`` (in ``steps``)."""
        rows = self.all_rows
        assert self.labels is not None, "row_pass(by=...) records the groups"
        rows = rows.select(self.labels.mask(column, value))
        return rows if steps is None else rows.in_steps(*steps)


def summary_result(analysis: Analysis, log: ReadLog, device: str, strict: bool) -> AnalysisResult:
    """``build_result``'s numbers without the step table's metric columns and without ``judge_analysis``: see
    ``RowPass.summary``."""
    steps = step_table(analysis, metrics=False)
    run = analysis.run_result()
    check_analysed(run, log)
    return AnalysisResult(
        **read_fields(log, device),
        run=run,
        steps=steps,
        rounds=analysis.rounds.finalize_table(),
        verdicts=[],
        positions=analysis.positions.position_table(),
        catastrophic_threshold=analysis.catastrophic,
        warnings=data_warnings(analysis, log, steps, strict),
        skipped=list(log.skipped),
        skipped_rows=log.skipped_rows,
        skipped_data=skipped_of(log, run),
        groups=[group for grouped in analysis.grouped for group in grouped.results(run.rows, run.tokens)],
    )


def _restricted(analysis: Analysis, steps: StepRange) -> Analysis:
    """A copy of ``analysis`` whose per-step families keep only the steps in the range (no worst rows/tokens and no
    prompt checks: those are ranked over the whole input)."""
    first, last = steps

    def keep(step: int) -> bool:
        return (first is None or step >= first) and (last is None or step <= last)

    def restricted(accumulator: StepAccumulator) -> StepAccumulator:
        steps_held = accumulator.store.steps
        inside = (steps_held >= (first if first is not None else steps_held.min(initial=0))) & (
            steps_held <= (last if last is not None else steps_held.max(initial=0))
        )
        return accumulator.restricted(inside)

    subset = copy.copy(analysis)
    subset.family = {name: restricted(family) for name, family in analysis.family.items()}
    evidence = restricted(analysis.hint_evidence)
    assert isinstance(evidence, HintEvidenceAccumulator)  # a shallow copy of it (StepAccumulator.restricted)
    subset.hint_evidence = evidence
    subset.worst = WorstTracker(analysis.top_k, analysis.catastrophic)
    subset.prompts = PromptAccumulator()  # ages and the worst 1 % are over the whole input, as the worst rows
    subset.grouped = []
    for grouped in analysis.grouped:
        subset.grouped.append(grouped.restricted(keep))
    subset.empty_rows = [entry for entry in analysis.empty_rows if keep(entry[0])]
    if not subset.offpolicy.steps:
        present = sorted(analysis.offpolicy.steps)
        shown = f"{present[0]}..{present[-1]}" if present else "none"
        raise DataError(f"no step in {range_label(steps)} (the input has steps {shown}).")
    return subset


def range_label(steps: StepRange) -> str:
    first, last = steps
    return f"steps {'' if first is None else first}:{'' if last is None else last}"


# The reading options a row pass takes from a Dump (``diff_runs`` refuses the others before it reads).
READING_OPTIONS = ("columns", "device", "strict", "chunk_tokens")


@reads_dump
def row_pass(
    inputs: Inputs,
    *,
    presets: Sequence[Preset] = (),
    rules: Mapping[str, DropRule] | None = None,
    columns: Mapping[str, str] | None = None,
    device: str | torch.device = "auto",
    strict: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    progress: Progress | None = None,
    by: Sequence[str | GroupSpec] = (),
    findings: bool = True,
    catastrophic_rows: bool = False,
    prompts: bool = False,
    exact: bool = False,
) -> RowPass:
    """Read ``inputs`` once into the analysis and the per-row statistics (with each preset's, and each of ``rules``',
    dropped tokens per row); ``by``: also the key families per group and each row's group. ``findings`` False: without
    what only ``result`` reads (hint evidence, worst rows, dialects): the pass serves ``summary`` alone.
    ``catastrophic_rows``: the row statistics also count each row's catastrophic tokens (``runs``' catastrophic
    share). ``prompts``: the per-prompt evidence is gathered even without ``findings`` (``runs``: prompts matched
    across runs). ``exact``: also the first model token whose two logprobs differ in any bit
    (``RowPass.first_difference``). Raises RolloutDiagError for bad input or options."""
    torch_device = resolve_device(device)
    reader = open_reader(inputs, columns, strict=strict, chunk_tokens=chunk_tokens)
    specs = group_specs(by, reader)
    analysis = Analysis(by=specs, findings=findings, prompt_evidence=prompts)
    rows = RowStatsCollector(presets, analysis.catastrophic if catastrophic_rows else None, rules)
    labels = GroupLabels(specs) if specs else None
    first = FirstDifference() if exact else None
    updates = [analysis.update, rows.update, *([labels.update] if labels else []), *([first.update] if first else [])]

    def prepare(chunk: Chunk) -> None:  # in the reader's prepare pool: the analysis's, then the presets' flags
        analysis.prepare(chunk)
        rows.prepare(chunk)

    run_chunks(reader, updates, torch_device, progress, prepare)
    return RowPass(analysis, rows, reader.log, torch_device, strict, labels, first)
