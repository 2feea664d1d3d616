"""Scale-out: the same accumulators on several processes (or Ray tasks), merged into one state.

The driver splits the input with ``DumpReader.plan`` (row groups, or whole files in the token layout);
each worker reads its part, feeds a :class:`Pass` (the analysis, and for compare-presets the preset and
sweep accumulators) and ships the state back (float64 sums, counts, extrema, Chan moments, bounded top-K
lists: small and picklable). Merging is exact up to float64 summation order, so any number of workers
gives the same result as one pass.
"""

from __future__ import annotations

import logging
import multiprocessing
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from numbers import Integral
from typing import TYPE_CHECKING, Any, NamedTuple

from rollout_diag.cores import auto_cpu_workers
from rollout_diag.drivers.passes import Analysis, Pass, PassSpec, ProgressOption, progress_callback, run_chunks
from rollout_diag.engine.arrays import device_kind
from rollout_diag.engine.choice import kernel_for, selected_engine
from rollout_diag.errors import ConfigError, option_name
from rollout_diag.io.reader import DumpReader
from rollout_diag.io.readlog import ReadLog
from rollout_diag.io.sources import Source
from rollout_diag.memory import collect_from_here

if TYPE_CHECKING:
    import torch

BACKENDS = ("process", "ray")
MAX_WORKERS = 1024  # a Ray cluster may be large; more parts than this only adds overhead
AUTO = "auto"  # the default --workers: every core (see resolve_workers)
Workers = int | str  # a count, or AUTO


def resolve_workers(workers: Workers, reader: DumpReader, device: str | torch.device) -> int:
    """How many processes to run. A count is itself. ``auto``: one process on a GPU (the device is the engine);
    on the CPU ``cores.auto_cpu_workers``: one below ``cores.AUTO_MIN_CORES`` cores, otherwise one per core but the
    one the driver keeps, as many as the input splits into (``DumpReader.plan``: row groups, or files in the token
    layout), so a one-row-group file stays in one process (``check_workers`` first)."""
    if workers != AUTO:
        return int(workers)
    if device_kind(device) != "cpu":
        return 1
    return auto_cpu_workers(reader)


class PartJob(NamedTuple):
    """One worker's arguments to :func:`run_part`, in its order (a tuple, so processes and Ray pass it as is)."""

    inputs: Sequence[Source]
    columns: Mapping[str, str]
    part: Mapping[str, Sequence[int]]
    strict: bool
    chunk_tokens: int
    device: str
    spec: PassSpec
    engine: str | None


def run_part(
    inputs: Sequence[Source],
    columns: Mapping[str, str],
    part: Mapping[str, Sequence[int]],
    strict: bool,
    chunk_tokens: int,
    device: str,
    spec: PassSpec,
    engine: str | None = None,
) -> tuple[Pass, ReadLog]:
    """One worker: read ``part`` of the inputs and return the accumulated state and the read log.

    ``inputs`` are the files the driver resolved (never expanded again: a file name may hold glob characters)
    and ``columns`` the user's overrides, from which each file resolves its own columns as in one process;
    ``engine`` the driver's engine setting (a Ray worker started before the setting does not inherit it): every worker
    runs the engine one process would (its chunks are numpy, so ``auto`` takes no input size into account)."""
    from rollout_diag.engine.choice import use_engine

    reader = DumpReader(inputs, columns, strict=strict, chunk_tokens=chunk_tokens, parts=part)
    reader.select(spec.selection)
    state = spec.new()
    with use_engine(engine):
        if not kernel_for(device_kind(device)):  # torch runs here (numpy chunks load none: the numba engine)
            import torch

            torch.set_num_threads(1)  # the workers share the machine's cores
        run_chunks(reader, state.consumers(), device, prepare=state.prepare)
    return state, reader.log


def run_parts(
    reader: DumpReader,
    workers: int,
    backend: str,
    device: str,
    spec: PassSpec,
    progress: ProgressOption = None,
) -> Pass:
    """Run :func:`run_part` on every part of ``reader.plan(workers)`` and merge the states into one; the
    workers' read logs are merged into ``reader.log``."""
    check_workers(workers, backend)
    # The parent reads no chunk itself: the command line's collector back on here, before the workers fork (each then
    # shares the frozen modules' pages rather than copying them as its collector visits them, rollout_diag.memory).
    collect_from_here()
    jobs = [
        PartJob(
            reader.worker_inputs(),
            reader.overrides,
            part,
            reader.strict,
            reader.chunk_tokens,
            device,
            spec,
            selected_engine(),
        )
        for part in reader.plan(workers)
    ]
    results = _run_ray(jobs) if backend == "ray" else _run_processes(jobs, workers, device)
    merged = spec.new()
    total = reader.log.total_rows
    progress = progress_callback(progress)
    for done, (state, log) in enumerate(results, start=1):
        merged.merge(state)
        reader.log.merge(log)
        if progress is not None:
            progress(total * done // len(jobs), total)
    reader.log.finish()
    return merged


def check_workers(workers: Workers, backend: str) -> None:
    """Raises ConfigError unless ``workers`` is AUTO or 1 ≤ ``workers`` ≤ MAX_WORKERS and ``backend`` is one of
    BACKENDS."""
    if workers != AUTO and (
        isinstance(workers, bool) or not isinstance(workers, Integral) or not 1 <= workers <= MAX_WORKERS
    ):
        what = f"a whole number from 1 to {MAX_WORKERS}"
        what = what if isinstance(workers, Integral) else f"{AUTO} or {what}"
        raise ConfigError(f"{option_name('workers')}={workers}: must be {what}.")
    if backend not in BACKENDS:
        raise ConfigError(f"{option_name('backend')}={backend}: choose {' or '.join(BACKENDS)}.")


def analyze_parts(
    reader: DumpReader,
    workers: int,
    backend: str,
    device: str,
    options: Mapping[str, Any],
    progress: ProgressOption = None,
) -> Analysis:
    """``analyze`` on ``workers`` processes or Ray tasks: the merged Analysis."""
    return run_parts(reader, workers, backend, device, PassSpec(options, selection=reader.selection), progress).analysis


def _run_processes(jobs: list[PartJob], workers: int, device: str) -> list[tuple[Pass, ReadLog]]:
    # fork starts in milliseconds with torch already imported; CUDA cannot be forked, so GPUs spawn; nor can polars
    # once its thread pool runs (a forked child hangs on its first polars call), so --where (polars) spawns too
    where = any(getattr(job.spec.selection, "where", None) for job in jobs)
    method = "spawn" if device_kind(device) == "cuda" or where else "fork"
    context = multiprocessing.get_context(method)
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=context) as pool:
        return list(pool.map(run_part, *zip(*jobs, strict=True)))


def _run_ray(jobs: list[PartJob]) -> list[tuple[Pass, ReadLog]]:
    return run_on_ray(run_part, jobs)


def run_on_ray(function: Callable[..., Any], jobs: Sequence[Sequence[Any]]) -> list[Any]:
    """``function(*job)`` for every job as Ray tasks (Ray started here unless it runs), the results in the jobs'
    order; raises ConfigError without Ray, or the first failed task's own error."""
    try:
        import ray
    except ImportError:
        raise ConfigError(
            f"{option_name('backend')}=ray needs Ray.",
            hint=f"pip install 'rollout-diag[ray]', or use {option_name('backend')}=process.",
        ) from None
    if not ray.is_initialized():
        ray.init(ignore_reinit_error=True, log_to_driver=False, logging_level=logging.ERROR)
    remote: Any = ray.remote(function)  # Ray types a remote function by its arity; the jobs are tuples
    pending = [remote.remote(*job) for job in jobs]
    results, failure = [], None
    # Every task runs to its end, as the process backend's pool does: no ray.cancel, which can race a task's completion
    # and abort the driver inside Ray ("Check failed: it != submissible_tasks_.end()", seen in CI with Ray 2.60; see
    # ray-project/ray#54798). Every result is fetched, so that Ray has no unretrieved error to print at exit.
    for ref in pending:
        try:
            results.append(ray.get(ref))
        except Exception as exc:  # a task's error, re-raised below as its cause: the first in plan order
            failure = failure or exc
    if failure is not None:
        # RayTaskError's text is the worker's traceback; the error the task raised is its ``cause``.
        cause = getattr(failure, "cause", None)
        raise (cause if isinstance(cause, BaseException) else failure) from None
    return results
