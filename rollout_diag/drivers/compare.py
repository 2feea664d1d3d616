"""Every rollout-correction preset on one dump, side by side, in one streaming pass (issue 4).

``compare_presets`` reads the dump once: per chunk the off-policy family (METRICS.md §1) and one shared
:class:`~rollout_diag.engine.stats.ChunkStats` feeding every preset's §2/§3/§8 accumulators
(and, if asked, the per-row decision file of :mod:`rollout_diag.drivers.exports`). The results are
:class:`~rollout_diag.results.ComparisonResult`; the intrusive rule is :mod:`rollout_diag.decisions.intrusive`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout_diag.decisions.intrusive import INTRUSIVE_MIN_ESS, INTRUSIVE_REJECTED_FRACTION, intrusive_reasons
from rollout_diag.decisions.recommend import judge_comparison
from rollout_diag.drivers.distributed import AUTO, Workers, check_workers, resolve_workers, run_parts
from rollout_diag.drivers.dump import PRESET_CHUNK_TOKENS, reads_dump
from rollout_diag.drivers.engine import build_result
from rollout_diag.drivers.exports import DecisionWriter
from rollout_diag.drivers.passes import (
    Inputs,
    PassSpec,
    ProgressOption,
    open_reader,
    resolve_device,
    run_chunks,
)
from rollout_diag.drivers.sweep import check_targets
from rollout_diag.drivers.tokens import Tokenizer, with_token_text
from rollout_diag.errors import ConfigError, option_name
from rollout_diag.groups import GroupSpec, group_specs
from rollout_diag.io.tokenizer import load_tokenizer
from rollout_diag.memory import trim_heap
from rollout_diag.metrics.outcome import PresetSteps, with_metrics
from rollout_diag.metrics.sweep import DEFAULT_TARGETS, SweepAccumulator
from rollout_diag.presets import Preset, resolve_presets
from rollout_diag.results import AnalysisResult, ComparisonResult, PresetResult, SweepOption
from rollout_diag.selection import RowSelection, StepRange, selection

if TYPE_CHECKING:
    import torch  # annotations only: the driver's arithmetic runs in passes and metrics


@reads_dump
def compare_presets(
    inputs: Inputs,
    presets: Sequence[str | Preset] | None = None,
    *,
    columns: Mapping[str, str] | None = None,
    device: str | torch.device = "auto",
    strict: bool = False,
    chunk_tokens: int = PRESET_CHUNK_TOKENS,
    progress: ProgressOption = None,
    export_decisions_to: str | Path | None = None,
    targets: Sequence[float] = DEFAULT_TARGETS,
    intrusive_rejected_fraction: float = INTRUSIVE_REJECTED_FRACTION,
    intrusive_min_ess: float = INTRUSIVE_MIN_ESS,
    workers: Workers = AUTO,
    backend: str = "process",
    by: Sequence[str | GroupSpec] = (),
    where: str | None = None,
    steps: StepRange | None = None,
) -> ComparisonResult:
    """Every chosen preset's §1, §2/§3 (or §8) and ``summary/`` metrics per step and for the run, and the
    threshold sweep (``sweep``: the run-level table of rollout_diag.metrics.sweep), in one pass.

    ``presets``: names, groups (``all``, ``verl``, ``legacy``) or Preset objects; None = every built-in
    preset. ``export_decisions_to``: also write the per-row decisions (see :func:`export_decisions`). ``by``,
    ``where``, ``steps``: as for ``analyze`` (``ComparisonResult.groups`` holds the key metrics per group).
    Raises RolloutDiagError (InputError, ColumnError, DataError, ConfigError) for bad input or options.
    """
    _, comparison = _one_pass(
        inputs,
        presets,
        {"offpolicy_only": True, "by": by},
        columns=columns,
        device=device,
        strict=strict,
        chunk_tokens=chunk_tokens,
        progress=progress,
        export_decisions_to=export_decisions_to,
        targets=targets,
        intrusive=(intrusive_rejected_fraction, intrusive_min_ess),
        workers=workers,
        backend=backend,
        selection=selection(where, steps),
    )
    return comparison


@reads_dump
def analyze_and_compare(
    inputs: Inputs,
    presets: Sequence[str | Preset] | None = None,
    *,
    columns: Mapping[str, str] | None = None,
    device: str | torch.device = "auto",
    strict: bool = False,
    chunk_tokens: int = PRESET_CHUNK_TOKENS,
    progress: ProgressOption = None,
    targets: Sequence[float] = DEFAULT_TARGETS,
    workers: Workers = AUTO,
    backend: str = "process",
    analysis_options: Mapping[str, Any] | None = None,
    intrusive_rejected_fraction: float = INTRUSIVE_REJECTED_FRACTION,
    intrusive_min_ess: float = INTRUSIVE_MIN_ESS,
    dialect: str | Sequence[str] = "verl",
    by: Sequence[str | GroupSpec] = (),
    where: str | None = None,
    steps: StepRange | None = None,
    tokenizer: Tokenizer = None,
) -> tuple[AnalysisResult, ComparisonResult]:
    """``analyze`` and ``compare_presets`` in one pass over the data (what ``rollout-diag report`` shows).

    ``analysis_options``: ``analyze``'s knobs (``max_rounds``, ``catastrophic``, ``top_k``) for the analysis part;
    ``dialect`` as for ``analyze`` (the report shows a section for dialects other than verl); ``tokenizer`` as for
    ``analyze`` (the analysis's worst tokens and drawn rows as text).
    """
    from rollout_diag.metrics.dialects import resolve

    decoder = load_tokenizer(tokenizer)  # a missing tokenizer fails before the reading
    analysis, comparison = _one_pass(
        inputs,
        presets,
        {**(analysis_options or {}), "dialects": resolve(dialect), "by": by},
        columns=columns,
        device=device,
        strict=strict,
        chunk_tokens=chunk_tokens,
        progress=progress,
        export_decisions_to=None,
        targets=targets,
        intrusive=(intrusive_rejected_fraction, intrusive_min_ess),
        workers=workers,
        backend=backend,
        selection=selection(where, steps),
    )
    return with_token_text(analysis, decoder), comparison


def _one_pass(
    inputs: Inputs,
    presets: Sequence[str | Preset] | None,
    options: Mapping[str, Any],
    *,
    columns: Mapping[str, str] | None,
    device: str | torch.device,
    strict: bool,
    chunk_tokens: int,
    progress: ProgressOption,
    export_decisions_to: str | Path | None,
    targets: Sequence[float],
    intrusive: tuple[float, float],
    workers: Workers = AUTO,
    backend: str = "process",
    selection: RowSelection | None = None,
) -> tuple[AnalysisResult, ComparisonResult]:
    """analysis (with ``options``) + every preset + the sweep over the data, serially or on workers."""
    check_workers(workers, backend)
    chosen = resolve_presets(presets)
    checked_targets = check_targets(targets)
    torch_device = resolve_device(device)
    reader = open_reader(inputs, columns, strict=strict, chunk_tokens=chunk_tokens)
    reader.select(selection)
    options = {**options, "by": group_specs(options.get("by", ()), reader)}
    spec = PassSpec(options, chosen, selection=reader.selection)
    if workers == AUTO and export_decisions_to is not None:
        workers = 1  # the decisions file is written from one process
    workers = resolve_workers(workers, reader, torch_device)
    if workers > 1:
        if export_decisions_to is not None:
            raise ConfigError(
                f"{option_name('export_decisions_to')} writes one file from one process: leave out "
                f"{option_name('workers')}."
            )
        state = run_parts(reader, workers, backend, torch_device, spec, progress)
    else:
        state = spec.new()
        writer = None if export_decisions_to is None else DecisionWriter(export_decisions_to, chosen)
        consumers = state.consumers()
        if writer is not None:
            consumers.append(writer.write)
        with writer or contextlib.nullcontext():
            run_chunks(reader, consumers, torch_device, progress, state.prepare)
        del consumers  # their bound methods hold the analysis
    sweep, corrections = state.sweep, state.corrections
    assert sweep is not None and corrections is not None  # a pass with presets holds both
    corrections.settle()  # the presets' per-step states become columns before the analysis is built (peak memory)
    base = build_result(state.analysis, reader.log, torch_device, strict, reader.selection)
    # the analysis's per-step state is spent (200 000 one-row steps: ~0.4 GB): its pages go back before the presets'
    # results, the recommendation and the output are made
    state.analysis = None  # type: ignore[assignment]
    trim_heap()
    results = []
    run_metrics = corrections.finalize_run()
    for preset in chosen:
        run = with_metrics(base.run, run_metrics[preset.name])
        results.append(
            PresetResult(
                name=preset.name,
                config=preset.config(),
                mode=preset.mode,
                steps=PresetSteps(base.steps, corrections, preset.name),
                run=run,
                intrusive_reasons=intrusive_reasons(run.metrics, *intrusive),
            )
        )
    comparison = ComparisonResult(
        inputs=base.inputs,
        columns=base.columns,
        presets=results,
        warnings=base.warnings,
        skipped=base.skipped,
        skipped_rows=base.skipped_rows,
        skipped_data=base.skipped_data,
        layout=base.layout,
        device=base.device,
        sweep=[SweepOption.from_json(row) for row in _run_sweep(sweep, checked_targets)],
        intrusive_rejected_fraction=intrusive[0],
        intrusive_min_ess=intrusive[1],
        groups=base.groups,
        selection=base.selection,
    )
    return base, judge_comparison(comparison, base)


def _run_sweep(sweep: SweepAccumulator, targets: tuple[float, ...]) -> list[dict[str, Any]]:
    """The run's sweep table with curves (sweep_tables' first table, without the per-step ones)."""
    state = sweep.run_state()
    return [] if state is None else sweep.table(state, targets, curve=True)
