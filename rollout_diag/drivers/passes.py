"""One pass over the data: the analysis families, the passes (analysis, presets, sweep), the chunk loop, the
device and the progress callback. The local engine (``engine.py``, ``compare.py``) and the process/Ray driver
(``distributed.py``) both import this module; neither imports the other's internals, so there is no import circle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from numbers import Integral
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from rollout_diag.cores import available_cores
from rollout_diag.drivers.dump import DEFAULT_CHUNK_TOKENS, PRESET_CHUNK_TOKENS, Inputs, torch_may_use_a_gpu
from rollout_diag.engine import arrays
from rollout_diag.engine.arrays import device_kind
from rollout_diag.engine.choice import kernel_for
from rollout_diag.engine.quantities import PROBABILITY_QUANTITIES, SHARED_QUANTITIES
from rollout_diag.engine.stats import prepare, stats
from rollout_diag.errors import ConfigError, option_name
from rollout_diag.groups import GroupedAnalysis, GroupSpec
from rollout_diag.io.chunk import Chunk
from rollout_diag.io.formats import input_options
from rollout_diag.io.reader import DumpReader
from rollout_diag.metrics.association import TrainerColumnsTracker
from rollout_diag.metrics.base import StepAccumulator
from rollout_diag.metrics.dialects import DEFAULT as DEFAULT_DIALECT
from rollout_diag.metrics.dialects import DialectsAccumulator, dilution_warning
from rollout_diag.metrics.drift import DriftAccumulator, DriftWindows, parse_windows
from rollout_diag.metrics.families import FAMILIES
from rollout_diag.metrics.hints import HintEvidenceAccumulator
from rollout_diag.metrics.hints import prepare as prepare_hint_evidence
from rollout_diag.metrics.localize import DEFAULT_CATASTROPHIC, DEFAULT_TOP_K, PositionAccumulator, WorstTracker
from rollout_diag.metrics.offpolicy import OffPolicyAccumulator
from rollout_diag.metrics.prompts import PromptAccumulator
from rollout_diag.metrics.rounds import DEFAULT_MAX_ROUNDS, RoundAccumulator
from rollout_diag.paths import file_label, natural_key
from rollout_diag.presets import Preset
from rollout_diag.results import StepResult

if TYPE_CHECKING:  # the preset families are imported where a pass has presets
    import torch

    from rollout_diag.metrics.outcome import CorrectionAnalysis
    from rollout_diag.metrics.sweep import SweepAccumulator

Progress = Callable[[int, int], None]  # (file rows consumed, total file rows)
# What a reading call's ``progress`` takes: a callable, True (a line on stderr every few seconds) or None / False.
ProgressOption = Progress | bool | None


def progress_callback(progress: ProgressOption) -> Progress | None:
    """``True``: a line on stderr every few seconds (rollout_diag/progress.py: for a pipe, a CI log, a notebook);
    a callable as it is; ``None`` / ``False``: no progress."""
    if progress is True:
        from rollout_diag.progress import LineProgress

        return LineProgress()
    return progress or None


# Token quantities of the analysis families, prepared in the reader's thread (the costly exps among them).
ANALYSIS_QUANTITIES = (
    *SHARED_QUANTITIES,
    "k3",
    "skyrl_k3",
    "square",
    "clamped_log_ratio",
    "chi2_term",
    *PROBABILITY_QUANTITIES,
)
# §1 alone: what every preset reports beside its own metrics.
OFFPOLICY_QUANTITIES = (*SHARED_QUANTITIES, "k3", "square", "clamped_log_ratio", "chi2_term")
MAX_LISTED_EMPTY_ROWS = 20


def resolve_device(device: str | torch.device = "auto") -> str:
    """The device's name (``cpu``, ``cuda``, ``cuda:1``): ``auto`` picks CUDA when torch sees a GPU, else the CPU.
    ``cpu``, and ``auto`` with a build of torch that has neither CUDA nor ROCm, are decided without loading torch.
    Raises ConfigError for an unusable device."""
    if not isinstance(device, str):
        return str(device)
    if device == "cpu" or (device == "auto" and not torch_may_use_a_gpu()):
        return "cpu"
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        resolved = torch.device(device)
    except RuntimeError as exc:
        raise ConfigError(f"{option_name('device')}={device}: not a device (use auto, cpu or cuda).") from exc
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"{option_name('device')}={device}: torch sees no CUDA GPU.",
            hint=f"install a CUDA build of torch (see README) or use {option_name('device')}=cpu.",
        )
    return str(resolved)


@dataclass
class Analysis:
    """All analysis families, mergeable: the state a worker ships back and the driver folds together."""

    max_rounds: int = DEFAULT_MAX_ROUNDS
    catastrophic: float = DEFAULT_CATASTROPHIC
    top_k: int = DEFAULT_TOP_K
    offpolicy_only: bool = False  # only §1 (what every preset reports alongside its own metrics)
    # FAMILIES' accumulators by name, in their order
    family: dict[str, StepAccumulator] = field(init=False)
    worst: WorstTracker = field(init=False)
    empty_rows: list[tuple[int, str, str, int]] = field(default_factory=list)  # (step, sample_id, file, row)
    dialects: tuple[str, ...] = (DEFAULT_DIALECT,)  # frameworks whose own metric names to report (--dialect)
    dialect: DialectsAccumulator = field(init=False)
    hint_evidence: HintEvidenceAccumulator = field(default_factory=HintEvidenceAccumulator)
    prompts: PromptAccumulator = field(default_factory=PromptAccumulator)  # per prompt (metrics/prompts.py)
    by: tuple[GroupSpec, ...] = ()  # --by: the key families per group of rows (rollout_diag/groups.py)
    grouped: list[GroupedAnalysis] = field(init=False)
    # row mismatch against reward, advantage, entropy, length and GRPO groups (rollout_diag/metrics/association.py)
    trainer_columns: TrainerColumnsTracker = field(default_factory=TrainerColumnsTracker)
    # False: no hint evidence, worst rows or dialects are gathered (a run-level summary reads none of them: ``diff``;
    # on 200 000 one-row steps they held ~0.3 GB of per-step state)
    findings: bool = True
    # --drift-windows: the early and the late window of steps the result's ``drift`` compares ("A:B,C:D" or
    # ((A, B), (C, D)), inclusive); None: the first and the last 20 % of the steps
    drift_windows: DriftWindows | str | None = None
    drift: DriftAccumulator = field(default_factory=DriftAccumulator)  # response-length buckets, replicate groups
    # True: the per-prompt evidence is gathered without the findings too (``runs``' prompts matched across runs)
    prompt_evidence: bool = False

    def __post_init__(self) -> None:
        check_analysis_options(self.max_rounds, self.catastrophic, self.top_k)
        if isinstance(self.drift_windows, str):
            self.drift_windows = parse_windows(self.drift_windows)
        self.grouped = [GroupedAnalysis(spec, self.max_rounds, self.catastrophic) for spec in self.by]
        self.dialect = DialectsAccumulator(self.dialects)
        self.family = {family.name: family.make(self.max_rounds, self.catastrophic) for family in FAMILIES}
        self.worst = WorstTracker(self.top_k, self.catastrophic)
        self.prompts.keep_texts = self.prompt_evidence  # runs' matrix names its prompts (metrics/prompts.py)

    def prepare(self, chunk: Chunk) -> None:
        """The per-token quantities the families read and the hint evidence, built in the reader's pipeline
        (``run_chunks``)."""
        # without the debug family (offpolicy_only), the fused pass without its probabilities (3.5 ns a token less)
        prepare(chunk, OFFPOLICY_QUANTITIES if self.offpolicy_only else ANALYSIS_QUANTITIES, not self.offpolicy_only)
        prepare_hint_evidence(chunk)

    @property
    def families(self) -> tuple[StepAccumulator, ...]:
        """The families this pass feeds: every one, or those of the off-policy-only pass (the others stay empty)."""
        return tuple(self.family[f.name] for f in FAMILIES if f.offpolicy_pass or not self.offpolicy_only)

    # the families read by name (their tables and run state)
    @property
    def offpolicy(self) -> OffPolicyAccumulator:
        return cast(OffPolicyAccumulator, self.family["offpolicy"])

    @property
    def rounds(self) -> RoundAccumulator:
        return cast(RoundAccumulator, self.family["rounds"])

    @property
    def positions(self) -> PositionAccumulator:
        return cast(PositionAccumulator, self.family["positions"])

    def update(self, chunk: Chunk) -> None:
        for family in self.families:
            family.update(chunk)
        if self.findings:
            self.hint_evidence.update(chunk)  # compare-presets too: a pipeline bug withholds its recommendation
        if self.findings or self.prompt_evidence:
            self.prompts.update(chunk)
        if not self.offpolicy_only and self.findings:
            self.worst.update(chunk)
            self.dialect.update(chunk)
            self.drift.update(chunk)
            self.trainer_columns.update(chunk)
        for grouped in self.grouped:
            grouped.update(chunk)
        if len(self.empty_rows) < MAX_LISTED_EMPTY_ROWS:
            for row in arrays.flatnonzero(stats(chunk).row_count == 0).tolist()[:MAX_LISTED_EMPTY_ROWS]:
                self.empty_rows.append(
                    (int(chunk.step[row]), chunk.sample_id[row], chunk.file[row], chunk.file_row[row])
                )

    def merge(self, other: Analysis) -> None:
        for mine, theirs in zip(self.families, other.families, strict=True):
            mine.merge(theirs)
        self.worst.merge(other.worst)
        self.trainer_columns.merge(other.trainer_columns)
        self.dialect.merge(other.dialect)
        self.hint_evidence.merge(other.hint_evidence)
        self.drift.merge(other.drift)
        self.prompts.merge(other.prompts)
        for mine_grouped, their_grouped in zip(self.grouped, other.grouped, strict=True):
            mine_grouped.merge(their_grouped)
        # the first rows by (step, file, row), whichever worker found them
        self.empty_rows = sorted(self.empty_rows + other.empty_rows, key=empty_row_order)
        del self.empty_rows[MAX_LISTED_EMPTY_ROWS:]

    def step_results(self) -> list[StepResult]:
        # one family's per-step values at a time folded into each step's dict (200 000 steps: each family's
        # finalized dicts would otherwise all be alive at once)
        by_step: dict[int, dict[str, float]] = {step: {} for step in self.offpolicy.store.steps.tolist()}
        for family in self.families:
            for step, values in family.finalize_steps().items():
                by_step[step].update(values)
        dialects = {} if self.offpolicy_only else self.dialect.finalize_steps()
        table = self.offpolicy.store
        if not table.steps.shape[0]:
            return []
        counts = zip(
            *(table.dense[name].astype(np.int64).tolist() for name in ("rows", "tokens", "empty_rows")), strict=True
        )
        return [
            StepResult(step, rows, tokens, by_step[step], empty, dialects.get(step, {}))
            for step, (rows, tokens, empty) in zip(table.steps.tolist(), counts, strict=True)
        ]

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

    def warnings(self, steps: Sequence[StepResult], files: Sequence[str] = ()) -> list[str]:
        """Notes on steps and rows without a model token; a row's file is named by its label among ``files`` (the
        inputs: ``step=3/rank-0.parquet`` in a directory dump, where the name alone is every step's)."""
        notes = []
        no_token_steps = [s.step for s in steps if s.tokens == 0 and s.step is not None]
        if no_token_steps:
            notes.append(
                f"{len(no_token_steps)} step(s) have no model token (response_mask all 0) and no metrics: "
                f"steps {_list(no_token_steps)}."
            )
        empty = sum(s.empty_rows for s in steps)
        if empty:
            examples = ", ".join(
                f"step {step} sample '{sample}' ({file_label(file, files)} row {row})"
                for step, sample, file, row in self.empty_rows[:5]
            )
            note = (
                f"{empty} row(s) have no model token; as in verl they count in row means with R_i = 0 "
                f"(ppl 1, log-ppl diff 0): {examples}{', …' if empty > 5 else ''}."
            )
            # how far that moved verl's row means, in the same warning, when it is 1 % or more
            if not self.offpolicy_only and (moved := dilution_warning(empty, self.dialect.finalize_run())):
                note += f" {moved}"
            notes.append(note)
        return notes


def empty_row_order(entry: tuple[int, str, str, int]) -> tuple[int, tuple, int]:
    """Sort key of an empty row's (step, sample_id, file, row): by step, then file in natural order (a directory's
    reading order: ``step=2/`` before ``step=10/``, ``rank-9`` before ``rank-10``), then row."""
    return entry[0], natural_key(entry[2]), entry[3]


def _list(values: Sequence[int], limit: int = 10) -> str:
    shown = ", ".join(str(v) for v in values[:limit])
    return shown + (f", … ({len(values)} in all)" if len(values) > limit else "")


# The chunk size on a GPU where the call kept its CPU default. The torch engine's cost on CUDA is mostly per chunk
# (kernel launches; ~450-800 host copies of the families' per-segment results), not per token: on an H100 the
# analysis families computed 30 M tokens/s in 1 M-token chunks, 73 M in 4 M, 161 M in 8 M and 249 M in 16 M ones,
# with a peak of 7.0 GiB of device memory for analyze at 16 M against 6.9 GiB at 1 M (docs/benchmarks.md, "The GPU").
# A size the caller chose (not one of the CPU defaults) is kept.
GPU_CHUNK_TOKENS = 1 << 24
CPU_CHUNK_DEFAULTS = (DEFAULT_CHUNK_TOKENS, PRESET_CHUNK_TOKENS)


def run_chunks(
    reader: DumpReader,
    consumers: Sequence[Callable[[Chunk], None]],
    device: str,
    progress: ProgressOption = None,
    prepare: Callable[[Chunk], None] = prepare,
) -> None:
    """Feed every chunk of ``reader`` to each consumer in turn; report progress in file rows. ``prepare`` runs on
    each chunk in the reader's thread first (segments and shared token quantities, ``engine.stats.prepare``).
    The consumers take numpy chunks (every family does, through ``rollout_diag.engine.arrays``): the numba engine's
    chunks are numpy and torch is not loaded (``DumpReader.chunks``); the torch engine's are tensors."""
    total = reader.log.total_rows
    progress = progress_callback(progress)
    if device_kind(device) == "cuda" and reader.chunk_tokens in CPU_CHUNK_DEFAULTS and not reader.reads_ahead:
        reader.resize(GPU_CHUNK_TOKENS)
    with _core_for_the_reader(device, kernel_for(device_kind(device))):
        for chunk, consumed in reader.chunks(device, prepare=prepare, numpy=True):
            for consume in consumers:
                consume(chunk)
            # The shared per-chunk values refer back to the chunk; clearing them frees its tensors now rather
            # than whenever the cyclic garbage collector runs (memory would grow with the file meanwhile).
            chunk.cache.clear()
            if progress is not None:
                progress(consumed, total)


@contextmanager
def _core_for_the_reader(device: str, without_torch: bool) -> Iterator[None]:
    """On the CPU, torch's intra-op threads leave one core to the reader thread while chunks are computed (nothing
    to do ``without_torch``: numpy chunks of the numba engine, where torch is not loaded).

    With every core taken by torch, the reader thread and OpenMP's spinning workers fight over them: on 2 cores
    under load, 2 intra-op threads were 2–6× slower than 1 (measured, docs/benchmarks.md)."""
    if without_torch or device_kind(device) != "cpu":
        yield
        return
    import torch

    threads = torch.get_num_threads()
    cores = available_cores()
    if threads < cores:
        yield
        return
    torch.set_num_threads(max(1, cores - 1))
    try:
        yield
    finally:
        torch.set_num_threads(threads)


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


@dataclass(frozen=True)
class PassSpec:
    """What one pass accumulates: analysis options, and (compare-presets) the presets and the sweep."""

    options: Mapping[str, Any]
    presets: Sequence[Preset] | None = None
    selection: Any = None  # the rows to read (rollout_diag/selection.py RowSelection), None: all

    def new(self) -> Pass:
        if self.presets is None:
            return Pass(Analysis(**self.options))
        from rollout_diag.metrics.outcome import CorrectionAnalysis
        from rollout_diag.metrics.sweep import RunSweepAccumulator

        # compare-presets shows the run's sweep only: one run-level state, not one per step
        # the gates' sweep options where a gate preset is compared (their values cost about 25 % more CPU)
        gates = any(preset.gated for preset in self.presets)
        return Pass(Analysis(**self.options), CorrectionAnalysis(self.presets), RunSweepAccumulator(gates))


@dataclass
class Pass:
    """The accumulators of one pass over (part of) the data."""

    analysis: Analysis
    corrections: CorrectionAnalysis | None = None
    sweep: SweepAccumulator | None = None

    def consumers(self) -> list[Callable[[Chunk], None]]:
        return [accumulator.update for accumulator in (self.analysis, self.corrections, self.sweep) if accumulator]

    def prepare(self, chunk: Chunk) -> None:
        """Built in the reader's prepare pool: the analysis's quantities, and with presets their compiled pass (and
        the run sweep's histogram of c), so the thread that runs the accumulators does no per-token work."""
        self.analysis.prepare(chunk)
        if self.corrections is not None:
            from rollout_diag.metrics.sweep import RunSweepAccumulator

            self.corrections.prepare(chunk, histogram=isinstance(self.sweep, RunSweepAccumulator))

    def merge(self, other: Pass) -> None:
        self.analysis.merge(other.analysis)
        if self.corrections is not None and other.corrections is not None:
            self.corrections.merge(other.corrections)
        if self.sweep is not None and other.sweep is not None:
            self.sweep.merge(other.sweep)
