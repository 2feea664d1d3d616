"""Drive chunks through the accumulators, per step and per run, and assemble the result objects."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from numbers import Integral
from pathlib import Path

import numpy as np
import torch

from rollout_diag.decisions.check import CheckResult, Gate, check
from rollout_diag.decisions.diff import DEFAULT_LEVEL, DEFAULT_REPLICATES, DEFAULT_SEED, DiffResult, DiffSide, diff
from rollout_diag.dump import reads_dump
from rollout_diag.errors import ConfigError, DataError, option_name, where
from rollout_diag.hints import with_hints
from rollout_diag.io.chunk import Chunk
from rollout_diag.io.formats import input_options
from rollout_diag.io.reader import DEFAULT_CHUNK_TOKENS, DumpReader, ReadLog
from rollout_diag.metrics.base import StepAccumulator, row_mean
from rollout_diag.metrics.debug import DebugAccumulator
from rollout_diag.metrics.dialects import DEFAULT as DEFAULT_DIALECT
from rollout_diag.metrics.dialects import DialectsAccumulator, dilution_warning
from rollout_diag.metrics.dialects import resolve as resolve_dialects
from rollout_diag.metrics.hints import HintEvidenceAccumulator
from rollout_diag.metrics.localize import (
    DEFAULT_CATASTROPHIC,
    DEFAULT_TOP_K,
    PositionAccumulator,
    WorstTracker,
)
from rollout_diag.metrics.offpolicy import OffPolicyAccumulator
from rollout_diag.metrics.rollout_kl import RolloutKLAccumulator
from rollout_diag.metrics.rounds import DEFAULT_MAX_ROUNDS, RoundAccumulator
from rollout_diag.metrics.rowstats import RowStatsCollector
from rollout_diag.metrics.segments import SHARED_QUANTITIES, prepare, stats
from rollout_diag.metrics.sweep import DEFAULT_TARGETS, SweepAccumulator, sweep_tables
from rollout_diag.metrics.trends import ANOMALY_KEEP, find_anomalies, keep_largest, round_trend, step_trend
from rollout_diag.paths import file_label
from rollout_diag.presets import Preset
from rollout_diag.results import AnalysisResult, RowStats, RowTokens, SkippedRow, StepResult, SweepResult
from rollout_diag.verdicts import judge

Progress = Callable[[int, int], None]  # (file rows consumed, total file rows)
# Token quantities of the analysis families, prepared in the reader's thread (the costly exps among them).
ANALYSIS_QUANTITIES = (
    *SHARED_QUANTITIES,
    "k3",
    "skyrl_k3",
    "square",
    "clamped_log_ratio",
    "chi2_term",
    "trainer_prob",
    "rollout_prob",
    "prob_diff",
    "hint_clipped_abs",
    "hint_clipped_square",
    "hint_cross",
    "hint_rollout_square",
)
# Files, globs or directories (a DumpInputs carries the trainer format), or a DumpReader opened over them.
Inputs = str | Path | Sequence[str | Path] | DumpReader
MAX_LISTED_EMPTY_ROWS = 20


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``auto`` picks CUDA when torch sees a GPU, else the CPU. Raises ConfigError for an unusable device."""
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as exc:
        raise ConfigError(f"{option_name('device')}={device}: not a device (use auto, cpu or cuda).") from exc
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"{option_name('device')}={device}: torch sees no CUDA GPU.",
            hint=f"install a CUDA build of torch (see README) or use {option_name('device')}=cpu.",
        )
    return resolved


@dataclass
class Analysis:
    """All analysis families, mergeable: the state a worker ships back and the driver folds together."""

    max_rounds: int = DEFAULT_MAX_ROUNDS
    catastrophic: float = DEFAULT_CATASTROPHIC
    top_k: int = DEFAULT_TOP_K
    offpolicy_only: bool = False  # only §1 (what every preset reports alongside its own metrics)
    offpolicy: OffPolicyAccumulator = field(default_factory=OffPolicyAccumulator)
    debug: DebugAccumulator = field(default_factory=DebugAccumulator)
    rollout_kl: RolloutKLAccumulator = field(default_factory=RolloutKLAccumulator)
    rounds: RoundAccumulator = field(init=False)
    positions: PositionAccumulator = field(init=False)
    worst: WorstTracker = field(init=False)
    empty_rows: list[tuple[int, str, str, int]] = field(default_factory=list)  # (step, sample_id, file, row)
    dialects: tuple[str, ...] = (DEFAULT_DIALECT,)  # frameworks whose own metric names to report (--dialect)
    dialect: DialectsAccumulator = field(init=False)
    hint_evidence: HintEvidenceAccumulator = field(default_factory=HintEvidenceAccumulator)

    def __post_init__(self) -> None:
        check_analysis_options(self.max_rounds, self.catastrophic, self.top_k)
        self.dialect = DialectsAccumulator(self.dialects)
        self.rounds = RoundAccumulator(self.max_rounds, self.catastrophic)
        self.positions = PositionAccumulator(self.catastrophic)
        self.worst = WorstTracker(self.top_k, self.catastrophic)

    def prepare(self, chunk: Chunk) -> None:
        """The per-token quantities the families read, built in the reader's thread (``run_chunks``)."""
        prepare(chunk, SHARED_QUANTITIES if self.offpolicy_only else ANALYSIS_QUANTITIES)

    @property
    def families(self) -> tuple[StepAccumulator, ...]:
        if self.offpolicy_only:
            return (self.offpolicy,)
        return (self.offpolicy, self.debug, self.rollout_kl, self.rounds, self.positions)

    def update(self, chunk: Chunk) -> None:
        for family in self.families:
            family.update(chunk)
        if not self.offpolicy_only:
            self.worst.update(chunk)
            self.dialect.update(chunk)
            self.hint_evidence.update(chunk)
        if len(self.empty_rows) < MAX_LISTED_EMPTY_ROWS:
            for row in torch.nonzero(stats(chunk).row_count == 0).flatten().tolist()[:MAX_LISTED_EMPTY_ROWS]:
                self.empty_rows.append(
                    (int(chunk.step[row]), chunk.sample_id[row], chunk.file[row], chunk.file_row[row])
                )

    def merge(self, other: Analysis) -> None:
        for mine, theirs in zip(self.families, other.families, strict=True):
            mine.merge(theirs)
        self.worst.merge(other.worst)
        self.dialect.merge(other.dialect)
        self.hint_evidence.merge(other.hint_evidence)
        # the first rows by (step, file, row), whichever worker found them
        self.empty_rows = sorted(self.empty_rows + other.empty_rows, key=lambda e: (e[0], e[2], e[3]))
        del self.empty_rows[MAX_LISTED_EMPTY_ROWS:]

    def step_results(self) -> list[StepResult]:
        per_family = [family.finalize_steps() for family in self.families]
        dialects = {} if self.offpolicy_only else self.dialect.finalize_steps()
        results = []
        for step, state in sorted(self.offpolicy.steps.items()):
            metrics: dict[str, float] = {}
            for finalized in per_family:
                metrics.update(finalized.get(step, {}))
            results.append(
                StepResult(
                    step,
                    int(state["rows"]),
                    int(state["tokens"]),
                    metrics,
                    int(state["empty_rows"]),
                    dialects.get(step, {}),
                )
            )
        return results

    def run_result(self) -> StepResult:
        state = self.offpolicy.run_state()
        metrics: dict[str, float] = {}
        for family in self.families:
            metrics.update(family.finalize_run())
        if state is None:
            return StepResult(None, 0, 0, metrics)
        dialects = {} if self.offpolicy_only else self.dialect.finalize_run()
        rows, tokens, empty = int(state["rows"]), int(state["tokens"]), int(state["empty_rows"])
        return StepResult(None, rows, tokens, metrics, empty, dialects)

    def warnings(self, steps: Sequence[StepResult]) -> list[str]:
        notes = []
        no_token_steps = [s.step for s in steps if s.tokens == 0]
        if no_token_steps:
            notes.append(
                f"{len(no_token_steps)} step(s) have no model token (response_mask all 0) and no metrics: "
                f"steps {_list(no_token_steps)}."
            )
        empty = sum(s.empty_rows for s in steps)
        if empty:
            examples = ", ".join(
                f"step {step} sample '{sample}' ({Path(file).name} row {row})"
                for step, sample, file, row in self.empty_rows[:5]
            )
            notes.append(
                f"{empty} row(s) have no model token; as in verl they count in row means with R_i = 0 "
                f"(ppl 1, log-ppl diff 0): {examples}{', …' if empty > 5 else ''}."
            )
            if not self.offpolicy_only and (moved := dilution_warning(empty, self.dialect.finalize_run())):
                notes.append(moved)
        return notes


def _list(values: Sequence[int], limit: int = 10) -> str:
    shown = ", ".join(str(v) for v in values[:limit])
    return shown + (f", … ({len(values)} in all)" if len(values) > limit else "")


def run_chunks(
    reader: DumpReader,
    consumers: Sequence[Callable[[Chunk], None]],
    device: torch.device,
    progress: Progress | None = None,
    prepare: Callable[[Chunk], None] = prepare,
) -> None:
    """Feed every chunk of ``reader`` to each consumer in turn; report progress in file rows. ``prepare`` runs on
    each chunk in the reader's thread first (segments and shared token quantities, ``metrics.segments.prepare``)."""
    total = reader.log.total_rows
    with _core_for_the_reader(device):
        for chunk, consumed in reader.chunks(device, prepare=prepare):
            for consume in consumers:
                consume(chunk)
            # The shared per-chunk values refer back to the chunk; clearing them frees its tensors now rather
            # than whenever the cyclic garbage collector runs (memory would grow with the file meanwhile).
            chunk.cache.clear()
            if progress is not None:
                progress(consumed, total)


@contextmanager
def _core_for_the_reader(device: torch.device) -> Iterator[None]:
    """On the CPU, torch's intra-op threads leave one core to the reader thread while chunks are computed.

    With every core taken by torch, the reader thread and OpenMP's spinning workers fight over them: on 2 cores
    under load, 2 intra-op threads were 2–6× slower than 1 (measured, docs/benchmarks.md)."""
    threads = torch.get_num_threads()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if torch.device(device).type != "cpu" or threads < cores:
        yield
        return
    torch.set_num_threads(max(1, cores - 1))
    try:
        yield
    finally:
        torch.set_num_threads(threads)


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
    progress: Progress | None = None,
    workers: int = 1,
    backend: str = "process",
    dialect: str | Sequence[str] = DEFAULT_DIALECT,
) -> AnalysisResult:
    """Every mismatch metric of METRICS.md §1, §5, §6, §7, per step and for the run, in one streaming pass.

    ``inputs``: Parquet files, globs or directories. ``columns``: role -> column overrides. ``workers`` > 1
    splits the input (by row groups, or by files in the token layout) over that many processes
    (``backend="process"``) or Ray tasks (``backend="ray"``) and merges their states: the same result.
    ``dialect``: frameworks (``verl``, ``prime-rl``, …, or ``all``) whose own metrics each step and the run also
    carry under the names those trainers log (``StepResult.dialects``; docs/dialects.md).
    Raises RolloutDiagError (InputError, ColumnError, DataError, ConfigError) for bad input or options.
    """
    check_analysis_options(max_rounds, catastrophic, top_k)
    from rollout_diag.distributed import check_workers

    check_workers(workers, backend)
    torch_device = resolve_device(device)
    reader = open_reader(inputs, columns, strict=strict, chunk_tokens=chunk_tokens)
    options = {
        "max_rounds": max_rounds,
        "catastrophic": catastrophic,
        "top_k": top_k,
        "dialects": resolve_dialects(dialect),
    }
    if workers > 1:
        from rollout_diag.distributed import analyze_parts

        analysis = analyze_parts(reader, workers, backend, torch_device, options, progress)
    else:
        analysis = Analysis(**options)
        run_chunks(reader, [analysis.update], torch_device, progress, analysis.prepare)
    return build_result(analysis, reader.log, torch_device, strict)


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
    run, steps = sweep_tables(sweep, checked)
    if not any(row["count"] for row in run):
        raise DataError(f"{', '.join(reader.log.files)}: no model token to sweep.")
    return SweepResult(
        inputs=list(reader.log.files),
        columns=dict(reader.log.columns),
        targets=list(checked),
        run=run,
        steps=steps,
        warnings=list(reader.log.warnings),
        skipped=list(reader.log.skipped),
        skipped_rows=reader.log.skipped_rows,
    )


DEFAULT_WINDOW = 100  # tokens shown by ``inspect --around`` without ``--window``


@reads_dump
def inspect_row(
    inputs: Inputs,
    sample_id: str | None = None,
    *,
    step: int | None = None,
    row: str | None = None,
    around: int | None = None,
    window: int | None = None,
    columns: Mapping[str, str] | None = None,
    device: str | torch.device = "auto",
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> RowTokens:
    """The tokens of one row: the one at ``row`` ("FILE:ROW", as the tables print it), or with ``sample_id`` (and
    ``step``), or else the worst row by |log-ppl diff| of ``step`` (of the run without it).

    Only the row groups that can hold the row are read (row-group statistics on step and sample id). ``around``
    and ``window`` list only ``window`` tokens centred on position ``around`` (``window`` alone: centred on the
    largest |δ|); the result's ``start`` and ``row_length`` say where they sit. Raises DataError when no row (or
    more than one, without ``step``) matches, InputError / ConfigError for a bad ``row`` or window.
    """
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
                    return _row_window(chunk, index, around, window)
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
                    best, found = (float(score[index]), key), _row_window(chunk, index, around, window)
        if found is None:
            in_step = "" if step is None else f" in step {step}"
            raise DataError(f"{', '.join(reader.log.files)}: no row with a model token{in_step} to inspect.")
        return found
    matches: list[RowTokens] = []
    for chunk, _ in reader.chunks(torch_device):
        for index, candidate in enumerate(chunk.sample_id):
            if candidate == sample_id and (step is None or int(chunk.step[index]) == step):
                matches.append(_row_window(chunk, index, around, window))
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


def _row_window(chunk: Chunk, index: int, around: int | None, window: int | None) -> RowTokens:
    """Row ``index`` of ``chunk``, all of it or the window of ``window`` tokens centred on ``around``."""
    begin, end = int(chunk.offsets[index]), int(chunk.offsets[index + 1])
    length = end - begin
    if around is None and window is None:
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


def open_reader(
    inputs: Inputs,
    columns: Mapping[str, str] | None,
    *,
    strict: bool,
    chunk_tokens: int,
) -> DumpReader:
    """A reader over ``inputs``; an already opened (and not yet read) DumpReader is used as it is, when it was
    opened with the same options (the CLI opens the files before loading torch, so a bad file fails at once)."""
    if isinstance(inputs, DumpReader):
        given = {"columns": dict(columns or {}), "strict": strict, "chunk_tokens": chunk_tokens}
        opened = {"columns": inputs.overrides, "strict": inputs.strict, "chunk_tokens": inputs.chunk_tokens}
        if given != opened or inputs.log.finished:
            raise ConfigError(f"an open DumpReader was passed with other options than {given}, or already read.")
        return inputs
    paths = [str(inputs)] if isinstance(inputs, (str, Path)) else [str(p) for p in inputs]
    input_format, trust_pickle = input_options(inputs)  # what a DumpInputs carries (io/formats)
    return DumpReader(
        paths, columns, strict=strict, chunk_tokens=chunk_tokens, input_format=input_format, trust_pickle=trust_pickle
    )


def _first(log: ReadLog) -> SkippedRow | None:
    return log.skipped[0] if log.skipped else None


def build_result(analysis: Analysis, log: ReadLog, device: torch.device, strict: bool) -> AnalysisResult:
    """Finalize ``analysis`` into an AnalysisResult; raises DataError when nothing could be analysed."""
    steps = analysis.step_results()
    run = analysis.run_result()
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
    warnings = list(log.warnings) + analysis.warnings(steps)
    if strict and any(s.tokens == 0 for s in steps):
        raise DataError(f"{', '.join(log.files)}: {analysis.warnings(steps)[0]}")
    if log.skipped_rows:
        warnings.append(f"{log.skipped_rows} row(s) skipped as invalid; each is listed with its file, row and column.")
    rounds = analysis.rounds.finalize_table()
    trends = [t for t in (round_trend(rounds), step_trend(steps)) if t is not None]
    anomalies, anomalies_cut = keep_largest(find_anomalies(steps))
    if anomalies_cut:
        warnings.append(
            f"{len(anomalies) + anomalies_cut} anomaly flags: the {ANOMALY_KEEP} largest are kept, {anomalies_cut} cut."
        )
    result = AnalysisResult(
        inputs=list(log.files),
        columns=dict(log.columns),
        layout=log.layout,
        format=log.format,
        device=str(device),
        run=run,
        steps=steps,
        rounds=rounds,
        verdicts=judge(run.metrics),
        positions=analysis.positions.position_rows(),
        worst_rows=analysis.worst.worst_rows(),
        worst_tokens=analysis.worst.worst_tokens(),
        worst_row_tokens=analysis.worst.worst_row_tokens(),
        delta_histogram=analysis.positions.delta_histogram(),
        anomalies=anomalies,
        trends=trends,
        catastrophic_threshold=analysis.catastrophic,
        warnings=warnings,
        skipped=list(log.skipped),
        skipped_rows=log.skipped_rows,
        anomalies_cut=anomalies_cut,
    )
    return result if analysis.offpolicy_only else with_hints(result, analysis.hint_evidence.evidence())


MAX_ROUNDS_LIMIT = 4096  # per-round state is allocated per round index: a bound keeps memory bounded
MAX_TOP_K = 1000  # the top rows keep every token: a bound keeps memory and output readable


def check_analysis_options(max_rounds: int, catastrophic: float, top_k: int) -> None:
    """Raises ConfigError (one line, naming the option) unless every analysis option is in its range."""
    if isinstance(max_rounds, bool) or not isinstance(max_rounds, Integral) or not 1 <= max_rounds <= MAX_ROUNDS_LIMIT:
        raise ConfigError(
            f"{option_name('max_rounds')}={max_rounds}: must be a whole number from 1 to {MAX_ROUNDS_LIMIT}."
        )
    if not 0 < catastrophic < float("inf"):
        raise ConfigError(f"{option_name('catastrophic')}={catastrophic}: must be a positive, finite |δ| threshold.")
    if isinstance(top_k, bool) or not isinstance(top_k, Integral) or not 1 <= top_k <= MAX_TOP_K:
        raise ConfigError(f"{option_name('top_k')}={top_k}: must be a whole number from 1 to {MAX_TOP_K}.")


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

    def result(self, steps: StepRange | None = None) -> AnalysisResult:
        """The AnalysisResult of the steps in ``steps`` (all steps when None; worst rows/tokens only then)."""
        analysis = self.analysis if steps is None else _restricted(self.analysis, steps)
        return build_result(analysis, self.log, self.device, self.strict)

    def row_stats(self, steps: StepRange | None = None) -> RowStats:
        rows = self.rows.finalize()
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
            family = copy.copy(value)
            family.steps = {step: state for step, state in value.steps.items() if keep(step)}
            setattr(subset, name, family)
    subset.worst = WorstTracker(analysis.top_k, analysis.catastrophic)
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
) -> RowPass:
    """Read ``inputs`` once into the analysis and the per-row statistics (with each preset's dropped tokens per
    row). Raises RolloutDiagError for bad input or options."""
    torch_device = resolve_device(device)
    reader = open_reader(inputs, columns, strict=strict, chunk_tokens=chunk_tokens)
    analysis = Analysis()
    rows = RowStatsCollector(presets)
    run_chunks(reader, [analysis.update, rows.update], torch_device, progress, analysis.prepare)
    return RowPass(analysis, rows, reader.log, torch_device, strict)


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
) -> CheckResult:
    """Every gate (see :mod:`rollout_diag.decisions.check`) on the run and, with ``per_step``, on every step.
    Raises RolloutDiagError for bad input, an unknown metric or no gate."""
    if not gates:
        raise ConfigError(
            "no gate given.",
            hint=f"add {option_name('max')} NAME=VALUE, {option_name('min')} NAME=VALUE or "
            f"{option_name('gates')} FILE|default.",
        )
    done = row_pass(inputs, columns=columns, device=device, strict=strict, chunk_tokens=chunk_tokens, progress=progress)
    return check(done.result(), gates, per_step=per_step, rows=done.row_stats())


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
) -> DiffResult:
    """Run A against run B (two dumps; or one dump, ``inputs_b`` None, split by ``steps_a`` / ``steps_b``): every
    key metric, its bootstrap interval of B − A over sequences and a verdict; per preset the change in dropped
    tokens. Raises RolloutDiagError for bad input or options."""
    from rollout_diag.compare import resolve_presets

    chosen = resolve_presets(presets)
    options = {"columns": columns, "device": device, "strict": strict, "chunk_tokens": chunk_tokens}
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
    else:
        sides = []
        for inputs, steps in ((inputs_a, steps_a), (inputs_b, steps_b)):
            done = row_pass(inputs, presets=chosen, progress=progress, **options)
            label = _label(done.log.files) + ("" if steps is None else f" {_range(steps)}")
            sides.append(DiffSide(label, done.result(steps), done.row_stats(steps)))
    return diff(sides[0], sides[1], replicates=replicates, level=level, seed=seed)


def _label(files: Sequence[str]) -> str:
    names = [Path(name).name for name in files]
    return names[0] + (f" and {len(names) - 1} more" if len(names) > 1 else "") if names else "(no file)"
