"""The ``analyze`` command: the analysis pass over a dump, and ``build_result``, the AnalysisResult assembly that
every command ending in an analysis (compare-presets, check, diff, watch) shares."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from rollout_diag.decisions.analysis import judge_analysis
from rollout_diag.decisions.skipped import skipped_data
from rollout_diag.drivers.distributed import AUTO, Workers, analyze_parts, check_workers, resolve_workers
from rollout_diag.drivers.drift import drift_of
from rollout_diag.drivers.dump import reads_dump
from rollout_diag.drivers.passes import (
    Analysis,
    Inputs,
    ProgressOption,
    check_analysis_options,
    open_reader,
    resolve_device,
    run_chunks,
)
from rollout_diag.drivers.tokens import Tokenizer, with_token_text
from rollout_diag.errors import DataError, where
from rollout_diag.groups import GroupSpec, group_specs
from rollout_diag.io.reader import DEFAULT_CHUNK_TOKENS
from rollout_diag.io.readlog import ReadLog
from rollout_diag.io.tokenizer import load_tokenizer
from rollout_diag.memory import trim_heap
from rollout_diag.metrics.base import KeyGroup, StepAccumulator
from rollout_diag.metrics.dialects import DEFAULT as DEFAULT_DIALECT
from rollout_diag.metrics.dialects import resolve as resolve_dialects
from rollout_diag.metrics.drift import DriftWindows, parse_windows
from rollout_diag.metrics.localize import DEFAULT_CATASTROPHIC, DEFAULT_TOP_K
from rollout_diag.metrics.rounds import DEFAULT_MAX_ROUNDS
from rollout_diag.results import (
    AnalysisResult,
    MetricColumns,
    SkippedData,
    SkippedRow,
    StepResult,
    StepTable,
    TrainerColumns,
)
from rollout_diag.selection import StepRange, no_rows_match, selection, selection_summary

if TYPE_CHECKING:
    import torch  # annotations only: the driver's arithmetic runs in passes and metrics


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
    progress: ProgressOption = None,
    workers: Workers = AUTO,
    backend: str = "process",
    dialect: str | Sequence[str] = DEFAULT_DIALECT,
    by: Sequence[str | GroupSpec] = (),
    where: str | None = None,
    steps: StepRange | None = None,
    drift_windows: DriftWindows | str | None = None,
    tokenizer: Tokenizer = None,
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
    that match are read (``AnalysisResult.selection`` says which and how many). ``drift_windows``: the early and
    the late window of steps whose change ``AnalysisResult.drift`` splits by factor (``"0:9,90:99"`` or ((0, 9), (90,
    99)), inclusive; None: the first and the last 20 % of the steps; docs/drift.md). ``tokenizer``: a
    ``tokenizer.json``, a model directory or a model name in the local Hugging Face cache: the worst tokens and the
    rows the report draws carry each token id's text (``rollout_diag/io/tokenizer.py``; needs ``tokenizers``).
    ``progress``: a callable ``(rows done, total rows)``, or True for a line on stderr every few seconds (a notebook,
    a CI log).
    Raises RolloutDiagError (InputError, ColumnError, DataError, ConfigError) for bad input or options.
    """
    check_analysis_options(max_rounds, catastrophic, top_k)
    check_workers(workers, backend)
    if isinstance(drift_windows, str):  # a bad range fails before the reading
        drift_windows = parse_windows(drift_windows)
    decoder = load_tokenizer(tokenizer)  # a missing tokenizer fails before the reading
    torch_device = resolve_device(device)
    reader = open_reader(inputs, columns, strict=strict, chunk_tokens=chunk_tokens)
    reader.select(selection(where, steps))
    options: dict[str, Any] = {  # Analysis's keyword arguments
        "max_rounds": max_rounds,
        "catastrophic": catastrophic,
        "top_k": top_k,
        "dialects": resolve_dialects(dialect),
        "by": group_specs(by, reader),
        "drift_windows": drift_windows,
    }
    workers = resolve_workers(workers, reader, torch_device)
    if workers > 1:
        analysis = analyze_parts(reader, workers, backend, torch_device, options, progress)
    else:
        analysis = Analysis(**options)
        run_chunks(reader, [analysis.update], torch_device, progress, analysis.prepare)
    result = build_result(analysis, reader.log, torch_device, strict, reader.selection)
    # the per-step states are spent: their many small arrays' pages go back before the result is rendered or
    # written (200 000 one-row steps: ~0.55 GB; a no-op beside a large result)
    del analysis
    trim_heap()
    return with_token_text(result, decoder)


def _first(log: ReadLog) -> SkippedRow | None:
    return log.skipped[0] if log.skipped else None


def step_table(analysis: Analysis, metrics: bool = True) -> StepTable:
    """Every step's result as columns (``Analysis.step_results``'s values, keys and key order, without a dict per
    step): the families' metrics in family order, then the dialects. ``metrics`` False: each step's rows, tokens and
    empty rows alone (what ``diff``'s run-level summary reads, ``rowpass.summary_result``)."""
    table = analysis.offpolicy.store
    steps = table.steps
    count = steps.shape[0]
    rows, tokens, empty = (
        table.dense[name].reshape(count) if count else np.zeros(0) for name in ("rows", "tokens", "empty_rows")
    )
    if not metrics:
        return StepTable(steps, rows, tokens, empty, MetricColumns((), count))
    # one family finalized at a time, as MetricColumns takes its groups in: each family's columns are dropped once
    # copied into the table's matrices, so the families' columns never coexist with the whole table
    columns = MetricColumns(_family_groups(analysis.families, steps), count)
    dialects = {} if analysis.offpolicy_only else analysis.dialect.finalize_columns(steps)
    return StepTable(steps, rows, tokens, empty, columns, dialects)


def _family_groups(families: Sequence[StepAccumulator], steps: np.ndarray) -> Iterator[KeyGroup]:
    """The families' key groups over ``steps``, in family order, each family finalized only when the previous one's
    groups have been taken (a generator: read once)."""
    for family in families:
        groups = list(family.finalize_columns(steps).groups)
        while groups:
            yield groups.pop(0)


def step_counts(steps: StepTable) -> list[StepResult]:
    """Each step's rows, tokens and empty rows, without its metrics."""
    counts = zip(
        steps.step_ids.tolist(), steps.rows.tolist(), steps.tokens.tolist(), steps.empty_rows.tolist(), strict=True
    )
    return [StepResult(step, rows, tokens, {}, empty) for step, rows, tokens, empty in counts]


def check_analysed(run: StepResult, log: ReadLog, selection_of: Any = None) -> None:
    """Raise DataError when the run (``Analysis.run_result``) holds nothing to report: every row selected out or
    skipped, or no model token."""
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


def data_warnings(analysis: Analysis, log: ReadLog, steps: StepTable, strict: bool) -> list[str]:
    """The reading's warnings and the data's (steps without a model token, rows without one, skipped rows); with
    ``strict``, DataError for a step without a model token. ``Analysis.warnings`` reads only the steps' counts, and
    has nothing to say unless a step has no token or a row is empty: only then are the counts made per step."""
    warnings = list(log.warnings)
    no_token = bool((steps.tokens == 0).any())
    if no_token or bool(steps.empty_rows.any()):
        notes = analysis.warnings(step_counts(steps), log.files)
        if strict and no_token:
            raise DataError(f"{', '.join(log.files)}: {notes[0]}")
        warnings += notes
    if log.skipped_rows:
        warnings.append(f"{log.skipped_rows} row(s) skipped as invalid; each is listed with its file, row and column.")
    return warnings


def skipped_of(log: ReadLog, run: StepResult) -> SkippedData:
    """What reading skipped of the rows and model tokens read (the run's analysed ones and the skipped ones), by
    reason."""
    return skipped_data(
        run.rows,
        run.tokens,
        log.skipped_rows,
        log.skipped_tokens,
        log.skip_reasons,
        log.skipped[0] if log.skipped else None,
    )


def read_fields(log: ReadLog, device: str) -> dict[str, Any]:
    """The fields of an AnalysisResult that say what was read, and where it was computed."""
    return {
        "inputs": list(log.files),
        "columns": dict(log.columns),
        "layout": log.layout,
        "format": log.format,
        "device": str(device),
    }


def trainer_columns_of(analysis: Analysis) -> TrainerColumns | None:
    """Row mismatch against the dump's trainer columns (None without any, or where no findings were gathered)."""
    numbers = analysis.trainer_columns.finalize() if analysis.findings and not analysis.offpolicy_only else None
    return None if numbers is None else TrainerColumns.from_json(numbers)


def build_result(
    analysis: Analysis, log: ReadLog, device: str, strict: bool, selection_of: Any = None
) -> AnalysisResult:
    """Finalize ``analysis`` into an AnalysisResult; raises DataError when nothing could be analysed.
    ``selection_of``: the RowSelection the rows were read with (``reader.selection``), recorded in the result."""
    # the hint evidence first: reading it joins its per-step table's parts (a copy while they live), cheapest before
    # the step table and the result exist (200 000 one-row steps: the peak of compare-presets was here)
    evidence = analysis.hint_evidence.evidence()
    prompts = analysis.prompts.evidence()
    steps = step_table(analysis)
    run = analysis.run_result()
    check_analysed(run, log, selection_of)
    warnings = data_warnings(analysis, log, steps, strict)
    rounds = analysis.rounds.finalize_table()
    result = AnalysisResult(
        **read_fields(log, device),
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
        skipped_data=skipped_of(log, run),
        groups=[group for grouped in analysis.grouped for group in grouped.results(run.rows, run.tokens)],
        selection=selection_summary(selection_of, log, run.rows),
        drift=drift_of(analysis),
        trainer_columns=trainer_columns_of(analysis),
    )
    unmasked = (sum(c[0] for c in log.unmasked.values()), sum(c[1] for c in log.unmasked.values()))
    return judge_analysis(result, replace(evidence, unmasked=unmasked, fills=dict(log.fills)), prompts)
