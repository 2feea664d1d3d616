"""The ``sweep`` command: the rejection threshold that drops each target share of tokens, per option and step."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from rollout_diag.drivers.dump import reads_dump
from rollout_diag.drivers.passes import Inputs, Progress, open_reader, resolve_device, run_chunks
from rollout_diag.engine.choice import expect_presets
from rollout_diag.engine.stats import prepare, stats
from rollout_diag.errors import ConfigError, DataError, option_name
from rollout_diag.io.reader import DEFAULT_CHUNK_TOKENS
from rollout_diag.metrics.correction import prepare_derived
from rollout_diag.metrics.sweep import DEFAULT_TARGETS, SweepAccumulator, sweep_tables
from rollout_diag.results import Converted, SweepOption, SweepResult, SweepStep

if TYPE_CHECKING:
    import torch  # annotations only: the driver's arithmetic runs in passes and metrics

    from rollout_diag.io.chunk import Chunk


def check_targets(targets: Sequence[float]) -> tuple[float, ...]:
    """Target rejection shares as floats in (0, 1); raises ConfigError."""
    checked = tuple(float(t) for t in targets)
    if not checked or any(not 0.0 < t < 1.0 for t in checked):
        raise ConfigError(
            f"{option_name('targets')}={','.join(map(str, targets))}: each target share must lie in (0, 1)."
        )
    return checked


def _prepare_histograms(chunk: Chunk) -> None:
    """The reader's prepare step for the per-step sweep: the shared quantities (``engine.stats.prepare``), then on
    the numba engine, from one compiled preset pass, each step group's signed histogram of c and k3's segment sums and
    extremes (the one ROW_FIELDS quantity the fused pass has not), so the accumulator makes no token-sized array."""
    prepare(chunk)
    prepare_derived(stats(chunk), ("rs_k3", "rs_kpop", "rs_bkl", "rs_tv"), histogram=True)


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
    expect_presets()  # the histograms' compiled pass: compiled ahead where the numba engine runs and its cache lacks it
    run_chunks(reader, [sweep.update], torch_device, progress, _prepare_histograms)
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
