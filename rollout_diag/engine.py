"""Drive chunks through the accumulators, per step and per run, and assemble the result objects."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from numbers import Integral
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rollout_diag.decisions.analysis import judge_analysis
from rollout_diag.decisions.check import CheckResult, Gate, check
from rollout_diag.decisions.diff import (
    DEFAULT_LEVEL,
    DEFAULT_REPLICATES,
    DEFAULT_SEED,
    DiffResult,
    DiffSide,
    GroupSide,
    diff,
    diff_group,
    sort_group_diffs,
)
from rollout_diag.distributed import AUTO, Workers, analyze_parts, check_workers, resolve_workers
from rollout_diag.dump import reads_dump
from rollout_diag.errors import ConfigError, DataError, option_name, where
from rollout_diag.groups import GroupLabels, GroupSpec, group_name, group_specs
from rollout_diag.io.chunk import Chunk
from rollout_diag.io.reader import DEFAULT_CHUNK_TOKENS, ReadLog
from rollout_diag.metrics.base import StepAccumulator, row_mean
from rollout_diag.metrics.dialects import DEFAULT as DEFAULT_DIALECT
from rollout_diag.metrics.dialects import resolve as resolve_dialects
from rollout_diag.metrics.localize import (
    DEFAULT_CATASTROPHIC,
    DEFAULT_TOP_K,
    WorstTracker,
)
from rollout_diag.metrics.rounds import DEFAULT_MAX_ROUNDS
from rollout_diag.metrics.rowstats import RowStatsCollector
from rollout_diag.metrics.segments import stats
from rollout_diag.metrics.sweep import DEFAULT_TARGETS, SweepAccumulator, sweep_tables
from rollout_diag.passes import (
    Analysis,
    Inputs,
    Progress,
    check_analysis_options,
    open_reader,
    resolve_device,
    run_chunks,
)
from rollout_diag.paths import file_label
from rollout_diag.presets import Preset, resolve_presets
from rollout_diag.results import (
    AnalysisResult,
    Converted,
    MetricColumns,
    RowStats,
    RowTokens,
    SkippedRow,
    StepResult,
    StepTable,
    SweepOption,
    SweepResult,
    SweepStep,
)
from rollout_diag.selection import no_rows_match, selection, selection_summary


@reads_dump
def analyze(
    inputs: Inputs,
    *,
    columns: Mapping[str, str] | None = None,
    device: str | torch.device = "auto",
    strict: bool = False,
    max_rounds: int = DEFAULT_MAX_ROUNDS,
    catastrophic: float = DEFAULT_CATASTROPHIC,
    top_k: int = DEFAULT_TOP_K,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    progress: Progress | bool | None = None,
    workers: Workers = AUTO,
    backend: str = "process",
    dialect: str | Sequence[str] = DEFAULT_DIALECT,
    by: Sequence[str | GroupSpec] = (),
    where: str | None = None,
    steps: StepRange | None = None,
) -> AnalysisResult:
    """Every mismatch metric of METRICS.md §1, §5, §6, §7, per step and for the run, in one streaming pass.

    ``inputs``: Parquet files, globs or directories. ``columns``: role -> column overrides. ``workers`` > 1
    splits the input (by row groups, or by files in the token layout) over that many processes
    (``backend="process"``) or Ray tasks (``backend="ray"``) and merges their states: the same result; ``auto``
    (the default) uses every core where the input splits (``distributed.resolve_workers``), 1 one process.
    ``dialect``: frameworks (``verl``, ``prime-rl``, …, or ``all``) whose own metrics each step and the run also
    carry under the names those trainers log (``StepResult.dialects``; docs/dialects.md).
    ``by``: per-row columns (``env_name``, ``reward:sign``, ``response_length:bins=100,1000``; README "Which
    environment diverges?") whose groups of rows each get the key metrics, per step and for the run
    (``AnalysisResult.groups``), in the same pass. ``where``: a SQL condition over per-row columns (``"reward > 0
    AND env_name = 'math'"``) and ``steps``: (first, last) inclusive, either None for an open end: only the rows
    that match are read (``AnalysisResult.selection`` says which and how many). ``progress``: a callable
    ``(rows done, total rows)``, or True for a line on stderr every few seconds (a notebook, a CI log).
    Raises RolloutDiagError (InputError, ColumnError, DataError, ConfigError) for bad input or options.
    """
    check_analysis_options(max_rounds, catastrophic, top_k)
    check_workers(workers, backend)
    torch_device = resolve_device(device)
    reader = open_reader(inputs, columns, strict=strict, chunk_tokens=chunk_tokens)
    reader.select(selection(where, steps))
    options = {
        "max_rounds": max_rounds,
        "catastrophic": catastrophic,
        "top_k": top_k,
        "dialects": resolve_dialects(dialect),
        "by": group_specs(by, reader),
    }
    workers = resolve_workers(workers, reader, torch_device)
    if workers > 1:
        analysis = analyze_parts(reader, workers, backend, torch_device, options, progress)
    else:
        analysis = Analysis(**options)
        run_chunks(reader, [analysis.update], torch_device, progress, analysis.prepare)
    return build_result(analysis, reader.log, torch_device, strict, reader.selection)


def check_targets(targets: Sequence[float]) -> tuple[float, ...]:
    """Target rejection shares as floats in (0, 1); raises ConfigError."""
    checked = tuple(float(t) for t in targets)
    if not checked or any(not 0.0 < t < 1.0 for t in checked):
        raise ConfigError(
            f"{option_name('targets')}={','.join(map(str, targets))}: each target share must lie in (0, 1)."
        )
    return checked


@reads_dump
def threshold_sweep(
    inputs: Inputs,
    *,
    targets: Sequence[float] = DEFAULT_TARGETS,
    columns: Mapping[str, str] | None = None,
    device: str | torch.device = "auto",
    strict: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    progress: Progress | None = None,
) -> SweepResult:
    """For every rejection option and IS truncation: the threshold that rejects each target share, per step
    and for the run, the share verl's default threshold rejects, and the share-vs-threshold curve."""
    checked = check_targets(targets)
    torch_device = resolve_device(device)
    reader = open_reader(inputs, columns, strict=strict, chunk_tokens=chunk_tokens)
    sweep = SweepAccumulator()
    run_chunks(reader, [sweep.update], torch_device, progress)
    run_rows, step_rows = sweep_tables(sweep, checked)
    run = [SweepOption.from_json(row) for row in run_rows]
    if not any(option.count for option in run):
        raise DataError(f"{', '.join(reader.log.files)}: no model token to sweep.")
    return SweepResult(
        inputs=list(reader.log.files),
        columns=dict(reader.log.columns),
        targets=list(checked),
        run=run,
        steps=Converted(step_rows, SweepStep.from_json),  # each step's objects made when read (200 000 steps)
        warnings=list(reader.log.warnings),
        skipped=list(reader.log.skipped),
        skipped_rows=reader.log.skipped_rows,
    )


DEFAULT_WINDOW = 100  # tokens shown by ``inspect --around`` without ``--window``
LONG_ROW = 1000  # a longer row is shown as DEFAULT_WINDOW tokens around its largest |δ| unless the whole is asked for


@reads_dump
def inspect_row(
    inputs: Inputs,
    sample_id: str | None = None,
    *,
    step: int | None = None,
    row: str | None = None,
    around: int | None = None,
    window: int | None = None,
    whole_row: bool = False,
    columns: Mapping[str, str] | None = None,
    device: str | torch.device = "auto",
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> RowTokens:
    """The tokens of one row: the one at ``row`` ("FILE:ROW", as the tables print it), or with ``sample_id`` (and
    ``step``), or else the worst row by |log-ppl diff| of ``step`` (of the run without it).

    Only the row groups that can hold the row are read (row-group statistics on step and sample id). ``around``
    and ``window`` list only ``window`` tokens centred on position ``around`` (``window`` alone: centred on the
    largest |δ|); the result's ``start`` and ``row_length`` say where they sit. Without them a row longer than
    ``LONG_ROW`` tokens is listed as ``DEFAULT_WINDOW`` tokens around its largest |δ| (a 2 M-token row would take
    minutes and gigabytes to list), unless ``whole_row``. Raises DataError when no row (or more than one, without
    ``step``) matches, InputError / ConfigError for a bad ``row`` or window.
    """
    if whole_row and (around is not None or window is not None):
        raise ConfigError(
            f"{option_name('whole_row')} lists the whole row: leave out {option_name('around')} and "
            f"{option_name('window')}."
        )
    if around is not None and (isinstance(around, bool) or not isinstance(around, Integral) or around < 0):
        raise ConfigError(f"{option_name('around')}={around}: must be a token position (0 or more).")
    if window is not None and (isinstance(window, bool) or not isinstance(window, Integral) or window < 1):
        raise ConfigError(f"{option_name('window')}={window}: must be a positive number of tokens.")
    torch_device = resolve_device(device)
    reader = open_reader(inputs, columns, strict=False, chunk_tokens=chunk_tokens)
    if row is not None:
        if sample_id is not None or step is not None:
            raise ConfigError(
                f"{option_name('row')} names one row already: leave out {option_name('sample_id')} and "
                f"{option_name('step')}."
            )
        path, file_row = reader.narrow_to_row(row)
        for chunk, _ in reader.chunks(torch_device):
            for index, (file, candidate) in enumerate(zip(chunk.file, chunk.file_row, strict=True)):
                if file == path and candidate == file_row:
                    return _row_window(chunk, index, around, window, whole_row)
        skipped = next((r for r in reader.log.skipped if r.file == path and r.row == file_row), None)
        why = f"it was skipped: {skipped.reason}" if skipped else "it is not the first row of a sequence"
        raise DataError(f"{where(path, file_row)}no row to inspect ({why}).")
    reader.narrow(step, sample_id)
    sample_column = f"column '{reader.log.columns.get('sample_id', 'sample_id')}'"
    where_ = f"{', '.join(reader.log.files)}: {sample_column}"
    if sample_id is None:  # the worst row by |log-ppl diff| (as analyze ranks them), of the step or the run
        best: tuple[float, tuple] | None = None
        found = None
        for chunk, _ in reader.chunks(torch_device):
            s = stats(chunk)
            n = s.row_count
            score = (row_mean(s.row_sum("rollout"), n) - row_mean(s.row_sum("trainer"), n)).abs().cpu().numpy()
            eligible = (n > 0).cpu().numpy()
            if step is not None:
                eligible &= chunk.step.cpu().numpy() == step
            for index in np.flatnonzero(eligible).tolist():
                key = (int(chunk.step[index]), chunk.sample_id[index], chunk.file[index], chunk.file_row[index])
                if best is None or (-score[index], key) < (-best[0], best[1]):
                    best, found = (float(score[index]), key), _row_window(chunk, index, around, window, whole_row)
        if found is None:
            in_step = "" if step is None else f" in step {step}"
            raise DataError(f"{', '.join(reader.log.files)}: no row with a model token{in_step} to inspect.")
        return found
    matches: list[RowTokens] = []
    for chunk, _ in reader.chunks(torch_device):
        for index, candidate in enumerate(chunk.sample_id):
            if candidate == sample_id and (step is None or int(chunk.step[index]) == step):
                matches.append(_row_window(chunk, index, around, window, whole_row))
    if not matches:
        in_step = "" if step is None else f" in step {step}"
        raise DataError(f"{where_}: no row with sample id '{sample_id}'{in_step}.")
    if len(matches) > 1:
        steps = ", ".join(str(r.step) for r in matches[:10])
        places = ", ".join(f"{file_label(r.file, reader.log.files)}:{r.row}" for r in matches[:10])
        raise DataError(
            f"{where_}: sample id '{sample_id}' names {len(matches)} rows (steps {steps}) at {places}.",
            hint=f"pick one with {option_name('step')}."
            if step is None
            else f"pick one with {option_name('row')} FILE:ROW.",
        )
    return matches[0]


def _row_window(chunk: Chunk, index: int, around: int | None, window: int | None, whole_row: bool = False) -> RowTokens:
    """Row ``index`` of ``chunk``: all of it, or the window of ``window`` tokens centred on ``around`` (by default,
    for a row longer than LONG_ROW, DEFAULT_WINDOW tokens around the largest |δ|)."""
    begin, end = int(chunk.offsets[index]), int(chunk.offsets[index + 1])
    length = end - begin
    if whole_row or (around is None and window is None and length <= LONG_ROW):
        first, last = 0, length
    else:
        if around is None:  # centred on the largest |δ| among model tokens
            delta = (chunk.trainer[begin:end] - chunk.rollout[begin:end]).abs()
            delta = torch.where(chunk.mask[begin:end], delta, torch.full_like(delta, -1.0))
            around = int(torch.argmax(delta)) if length else 0
        elif around >= length:
            raise DataError(
                f"{where(chunk.file[index], chunk.file_row[index])}{option_name('around')}={around}: the "
                f"row has {length} tokens "
                f"(positions 0 to {length - 1})."
            )
        size = DEFAULT_WINDOW if window is None else int(window)
        first = max(0, min(around - size // 2, length - size))
        last = min(length, first + size)
    span = slice(begin + first, begin + last)
    return RowTokens(
        step=int(chunk.step[index]),
        sample_id=chunk.sample_id[index],
        file=chunk.file[index],
        row=chunk.file_row[index],
        mask=chunk.mask[span].to(torch.int8).tolist(),
        trainer_logprob=chunk.trainer[span].tolist(),
        rollout_logprob=chunk.rollout[span].tolist(),
        token_id=None if chunk.token_ids is None else chunk.token_ids[span].tolist(),
        token=None if chunk.token_text is None else [chunk.token_text(index, p) for p in range(first, last)],
        start=first,
        row_length=None if (first, last) == (0, length) else length,
        extra=chunk.row_extra(index),
    )


def _first(log: ReadLog) -> SkippedRow | None:
    return log.skipped[0] if log.skipped else None


def step_table(analysis: Analysis) -> StepTable:
    """Every step's result as columns (``Analysis.step_results``'s values, keys and key order, without a dict per
    step): the families' metrics in family order, then the dialects."""
    table = analysis.offpolicy.store
    steps = table.steps
    groups = [group for family in analysis.families for group in family.finalize_columns(steps).groups]
    dialects = {} if analysis.offpolicy_only else analysis.dialect.finalize_columns(steps)
    count = steps.shape[0]
    rows, tokens, empty = (
        table.dense[name].reshape(count) if count else np.zeros(0) for name in ("rows", "tokens", "empty_rows")
    )
    return StepTable(steps, rows, tokens, empty, MetricColumns(groups, count), dialects)


def step_counts(steps: StepTable) -> list[StepResult]:
    """Each step's rows, tokens and empty rows, without its metrics."""
    counts = zip(
        steps.step_ids.tolist(), steps.rows.tolist(), steps.tokens.tolist(), steps.empty_rows.tolist(), strict=True
    )
    return [StepResult(step, rows, tokens, {}, empty) for step, rows, tokens, empty in counts]


def build_result(
    analysis: Analysis, log: ReadLog, device: torch.device, strict: bool, selection_of: Any = None
) -> AnalysisResult:
    """Finalize ``analysis`` into an AnalysisResult; raises DataError when nothing could be analysed.
    ``selection_of``: the RowSelection the rows were read with (``reader.selection``), recorded in the result."""
    steps = step_table(analysis)
    run = analysis.run_result()
    if run.rows == 0 and log.rows_selected_out:
        raise DataError(f"{', '.join(log.files)}: {no_rows_match(selection_of, log.rows_selected_out)}")
    if run.rows == 0:
        raise DataError(
            f"{', '.join(log.files)}: every row was skipped ({log.skipped_rows} rows); the first: "
            + (f"{where(None, first.row, first.column)}{first.reason}." if (first := _first(log)) else "none.")
        )
    if run.tokens == 0:
        raise DataError(
            f"{', '.join(log.files)}: column '{log.columns.get('mask', 'response_mask')}': no model token "
            f"(mask 1) in any of the {run.rows} rows; nothing to measure."
        )
    counts = step_counts(steps)  # the warnings read only these: no metrics per step
    warnings = list(log.warnings) + analysis.warnings(counts)
    if strict and bool((steps.tokens == 0).any()):
        raise DataError(f"{', '.join(log.files)}: {analysis.warnings(counts)[0]}")
    if log.skipped_rows:
        warnings.append(f"{log.skipped_rows} row(s) skipped as invalid; each is listed with its file, row and column.")
    rounds = analysis.rounds.finalize_table()
    result = AnalysisResult(
        inputs=list(log.files),
        columns=dict(log.columns),
        layout=log.layout,
        format=log.format,
        device=str(device),
        run=run,
        steps=steps,
        rounds=rounds,
        verdicts=[],
        positions=analysis.positions.position_table(),
        worst_rows=analysis.worst.worst_rows(),
        worst_tokens=analysis.worst.worst_tokens(),
        worst_row_tokens=analysis.worst.worst_row_tokens(),
        delta_histogram=analysis.positions.delta_histogram(),
        catastrophic_threshold=analysis.catastrophic,
        warnings=warnings,
        skipped=list(log.skipped),
        skipped_rows=log.skipped_rows,
        groups=[group for grouped in analysis.grouped for group in grouped.results(run.rows, run.tokens)],
        selection=selection_summary(selection_of, log, run.rows),
    )
    unmasked = (sum(c[0] for c in log.unmasked.values()), sum(c[1] for c in log.unmasked.values()))
    evidence = replace(analysis.hint_evidence.evidence(), unmasked=unmasked)
    return judge_analysis(result, evidence)


# ----------------------------------------------------------------------- decisions: check and diff
StepRange = tuple[int | None, int | None]  # first..last step, inclusive; None = open end


@dataclass
class RowPass:
    """One pass of the analysis and the per-row statistics (``check``, ``diff``); results for any step range."""

    analysis: Analysis
    rows: RowStatsCollector
    log: ReadLog
    device: torch.device
    strict: bool
    labels: GroupLabels | None = None  # --by: each row's group, to restrict the row statistics to a group

    def result(self, steps: StepRange | None = None) -> AnalysisResult:
        """The AnalysisResult of the steps in ``steps`` (all steps when None; worst rows/tokens only then)."""
        analysis = self.analysis if steps is None else _restricted(self.analysis, steps)
        return build_result(analysis, self.log, self.device, self.strict)

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


def _restricted(analysis: Analysis, steps: StepRange) -> Analysis:
    """A copy of ``analysis`` whose per-step families keep only the steps in the range (no worst rows/tokens:
    those are ranked over the whole input)."""
    first, last = steps

    def keep(step: int) -> bool:
        return (first is None or step >= first) and (last is None or step <= last)

    subset = copy.copy(analysis)
    for name, value in vars(analysis).items():
        if isinstance(value, StepAccumulator):
            steps_held = value.store.steps
            inside = (steps_held >= (first if first is not None else steps_held.min(initial=0))) & (
                steps_held <= (last if last is not None else steps_held.max(initial=0))
            )
            setattr(subset, name, value.restricted(inside))
    subset.worst = WorstTracker(analysis.top_k, analysis.catastrophic)
    subset.grouped = []
    for grouped in analysis.grouped:  # families keyed by the number of each (group, step) pair
        part = copy.copy(grouped)
        numbers = np.array([number for key, number in grouped.ids.items() if keep(key[1])], dtype=np.int64)
        for name, value in vars(grouped).items():
            if isinstance(value, StepAccumulator):
                setattr(part, name, value.restricted(np.isin(value.store.steps, numbers)))
        subset.grouped.append(part)
    subset.empty_rows = [entry for entry in analysis.empty_rows if keep(entry[0])]
    if not subset.offpolicy.steps:
        present = sorted(analysis.offpolicy.steps)
        shown = f"{present[0]}..{present[-1]}" if present else "none"
        raise DataError(f"no step in {_range(steps)} (the input has steps {shown}).")
    return subset


def _range(steps: StepRange) -> str:
    first, last = steps
    return f"steps {'' if first is None else first}:{'' if last is None else last}"


def row_pass(
    inputs: Inputs,
    *,
    presets: Sequence[Preset] = (),
    columns: Mapping[str, str] | None = None,
    device: str | torch.device = "auto",
    strict: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    progress: Progress | None = None,
    by: Sequence[str | GroupSpec] = (),
) -> RowPass:
    """Read ``inputs`` once into the analysis and the per-row statistics (with each preset's dropped tokens per
    row); ``by``: also the key families per group and each row's group. Raises RolloutDiagError for bad input or
    options."""
    torch_device = resolve_device(device)
    reader = open_reader(inputs, columns, strict=strict, chunk_tokens=chunk_tokens)
    specs = group_specs(by, reader)
    analysis = Analysis(by=specs)
    rows = RowStatsCollector(presets)
    labels = GroupLabels(specs) if specs else None
    updates = [analysis.update, rows.update, *([labels.update] if labels else [])]
    run_chunks(reader, updates, torch_device, progress, analysis.prepare)
    return RowPass(analysis, rows, reader.log, torch_device, strict, labels)


@reads_dump
def check_run(
    inputs: Inputs,
    gates: Sequence[Gate],
    *,
    per_step: bool = False,
    columns: Mapping[str, str] | None = None,
    device: str | torch.device = "auto",
    strict: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    progress: Progress | None = None,
    by: Sequence[str | GroupSpec] = (),
) -> CheckResult:
    """Every gate (see :mod:`rollout_diag.decisions.check`) on the run and, with ``per_step``, on every step;
    ``by`` (``env_name``, ``reward:sign``, …): on each group's run metrics (and steps) too, the group named in
    each such outcome. Raises RolloutDiagError for bad input, an unknown metric or no gate."""
    if not gates:
        raise ConfigError(
            "no gate given.",
            hint=f"add {option_name('max')} NAME=VALUE, {option_name('min')} NAME=VALUE or "
            f"{option_name('gates')} FILE|default.",
        )
    done = row_pass(
        inputs, columns=columns, device=device, strict=strict, chunk_tokens=chunk_tokens, progress=progress, by=by
    )
    result = done.result()
    groups = [
        (group_name(group.column, group.value), group, done.group_rows(group.column, group.value))
        for group in result.groups
    ]
    return check(result, gates, per_step=per_step, rows=done.row_stats(), groups=groups)


def parse_step_range(text: str | None, option: str) -> StepRange | None:
    """``first:last`` (inclusive, either end may be empty) or a single step; raises ConfigError."""
    if text is None:
        return None
    first, sep, last = text.partition(":")
    try:
        bounds = (
            (int(first) if first.strip() else None, int(last) if last.strip() else None) if sep else (int(text),) * 2
        )
    except ValueError:
        raise ConfigError(f"{option} {text}: expected FIRST:LAST steps, e.g. 0:99 (inclusive).") from None
    if bounds[0] is not None and bounds[1] is not None and bounds[0] > bounds[1]:
        raise ConfigError(f"{option} {text}: the first step is after the last.")
    return bounds


def diff_runs(
    inputs_a: str | Path | Sequence[str | Path],
    inputs_b: str | Path | Sequence[str | Path] | None = None,
    *,
    steps_a: StepRange | None = None,
    steps_b: StepRange | None = None,
    presets: Sequence[str | Preset] | None = None,
    replicates: int = DEFAULT_REPLICATES,
    level: float = DEFAULT_LEVEL,
    seed: int = DEFAULT_SEED,
    columns: Mapping[str, str] | None = None,
    device: str | torch.device = "auto",
    strict: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    progress: Progress | None = None,
    by: Sequence[str | GroupSpec] = (),
) -> DiffResult:
    """Run A against run B (two dumps; or one dump, ``inputs_b`` None, split by ``steps_a`` / ``steps_b``): every
    key metric, its bootstrap interval of B − A over sequences and a verdict; per preset the change in dropped
    tokens. ``by`` (``env_name``, ``reward:sign``, …): also each group of rows present in A or B, its key metrics
    in A and B and the interval of B − A over its rows alone (``DiffResult.groups``, largest change first).
    Raises RolloutDiagError for bad input or options."""
    chosen = resolve_presets(presets)
    options = {"columns": columns, "device": device, "strict": strict, "chunk_tokens": chunk_tokens, "by": by}
    if inputs_b is None:
        if steps_a is None or steps_b is None:
            raise ConfigError(
                f"one dump: give the two step ranges, {option_name('steps_a')} and "
                f"{option_name('steps_b')} (e.g. 0:99 and 100:199)."
            )
        done = row_pass(inputs_a, presets=chosen, progress=progress, **options)
        sides = [
            DiffSide(f"{_label(done.log.files)} {_range(r)}", done.result(r), done.row_stats(r))
            for r in (steps_a, steps_b)
        ]
        passes = [(done, steps_a), (done, steps_b)]
    else:
        sides, passes = [], []
        for inputs, steps in ((inputs_a, steps_a), (inputs_b, steps_b)):
            done = row_pass(inputs, presets=chosen, progress=progress, **options)
            label = _label(done.log.files) + ("" if steps is None else f" {_range(steps)}")
            sides.append(DiffSide(label, done.result(steps), done.row_stats(steps)))
            passes.append((done, steps))
    result = diff(sides[0], sides[1], replicates=replicates, level=level, seed=seed)
    if not by:
        return result
    found = [{(g.column, _key(g.value)): g for g in side.result.groups} for side in sides]
    values: dict[tuple[str, Any], Any] = {}
    for present in found:
        for key, group in present.items():
            values.setdefault(key, group.value)
    groups = []
    for (column, key), value in values.items():
        parts = []
        for (done, steps), present in zip(passes, found, strict=True):
            group = present.get((column, key))
            rows = done.group_rows(column, value, steps)
            parts.append(GroupSide({} if group is None else group.metrics, rows, 0 if group is None else group.tokens))
        groups.append(diff_group(column, value, *parts, replicates=replicates, level=level, seed=seed))
    return replace(result, groups=sort_group_diffs(groups))


def _key(value: Any) -> tuple[str, Any]:
    """A group value as a dict key that tells 1 from True and "1" (None: the null group)."""
    return (type(value).__name__, value)


def _label(files: Sequence[str]) -> str:
    names = [Path(name).name for name in files]
    return names[0] + (f" and {len(names) - 1} more" if len(names) > 1 else "") if names else "(no file)"
