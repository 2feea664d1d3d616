"""The ``runs`` command: N dumps, each a run with a name and its knobs, read once each (in parallel where cores
allow, each run's finished pass kept in ``state_dir``), then compared (``decisions/runs.py``)."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rollout_diag.cores import AUTO_MAX_WORKERS, AUTO_MIN_CORES, available_cores
from rollout_diag.decisions.diff import DEFAULT_LEVEL, DEFAULT_REPLICATES, DEFAULT_SEED
from rollout_diag.decisions.runs import RunInput, check_options, compare_runs
from rollout_diag.drivers.distributed import AUTO, Workers, check_workers, run_on_ray
from rollout_diag.drivers.dump import Dump
from rollout_diag.drivers.rowpass import row_pass
from rollout_diag.engine.arrays import device_kind
from rollout_diag.errors import ConfigError, option_name
from rollout_diag.presets import resolve_presets
from rollout_diag.results import AnalysisResult, PromptEvidence, RowStats, RunsResult

Said = Callable[[str], None]  # a line of progress ("base: read in 3.2 s")


@dataclass(frozen=True)
class RunSpec:
    """One run: its name, its dump, its knobs (name → value; a knob the dump's ``DumpWriter(config=...)`` recorded
    is taken from there unless given here)."""

    name: str
    inputs: Dump
    knobs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunState:
    """What one run's pass leaves for the comparison (picklable: ``state_dir`` keeps it): the run-level analysis
    (``RowPass.summary``), the per-row sums and the per-prompt evidence (bounded: ``metrics/prompts.py``)."""

    summary: AnalysisResult
    rows: RowStats
    prompts: PromptEvidence | None = None


def compare_dumps(
    runs: Sequence[RunSpec],
    *,
    baseline: str | None = None,
    presets: Sequence[str] = (),
    max_ratios: Mapping[str, float] | None = None,
    replicates: int = DEFAULT_REPLICATES,
    level: float = DEFAULT_LEVEL,
    seed: int = DEFAULT_SEED,
    workers: Workers = AUTO,
    backend: str = "process",
    state_dir: str | Path | None = None,
    metadata_knobs: bool = True,
    progress: Said | None = None,
) -> RunsResult:
    """Read every run once (``workers`` processes, or Ray tasks with ``backend="ray"``; a run whose inputs and
    reading options match a state in ``state_dir`` is not read again) and compare them: each run's key metrics
    with bootstrap intervals, verdict and onset step against ``baseline`` (default: the first run), each knob's
    effect, the ``max_ratios`` gates (see :func:`rollout_diag.decisions.runs.compare_runs`). ``metadata_knobs``:
    knobs the dumps' writers recorded count where a run does not give them. Raises RolloutDiagError for bad input
    or options."""
    check_workers(workers, backend)
    names = tuple(dict.fromkeys(presets))
    check_options([spec.name for spec in runs], baseline, names, max_ratios, replicates, level)
    if names:
        resolve_presets(names)  # an unknown preset fails before anything is read
    states = read_runs([spec.inputs for spec in runs], names, workers, backend, state_dir, progress, runs)
    inputs = []
    for spec, state in zip(runs, states, strict=True):
        knobs = dict(spec.knobs)
        if metadata_knobs:
            from rollout_diag.io.config import dump_config

            knobs = {**dump_config(spec.inputs.inputs), **knobs}
        inputs.append(RunInput(spec.name, knobs, state.summary, state.rows, state.prompts))
    return compare_runs(
        inputs,
        baseline=baseline,
        presets=names,
        max_ratios=max_ratios,
        replicates=replicates,
        level=level,
        seed=seed,
    )


def read_run(dump: Dump, presets: tuple[str, ...]) -> RunState:
    """One run's pass: the analysis (run level), the per-row sums with each row's catastrophic count and, per
    preset, its dropped tokens, and the per-prompt evidence. Raises RolloutDiagError for bad input."""
    done = row_pass(
        dump,
        presets=resolve_presets(presets) if presets else (),
        findings=False,
        catastrophic_rows=True,
        prompts=True,
    )
    assert done.analysis is not None
    state = RunState(done.summary(), done.row_stats(), done.analysis.prompts.evidence())
    done.release()
    return state


def read_runs(
    dumps: Sequence[Dump],
    presets: tuple[str, ...],
    workers: Workers,
    backend: str,
    state_dir: str | Path | None,
    progress: Said | None = None,
    specs: Sequence[RunSpec] | None = None,
) -> list[RunState]:
    """Each dump's :class:`RunState`, from ``state_dir`` where one was saved for the same inputs and options, else
    read (and saved there)."""
    from rollout_diag.io.statecache import load_state, save_state, state_key

    labels = [spec.name for spec in specs] if specs is not None else [str(d.inputs[0]) for d in dumps]
    keys = [None if state_dir is None else state_key(dump.inputs, _options(dump, presets)) for dump in dumps]
    states: list[RunState | None] = [None] * len(dumps)
    for index, key in enumerate(keys):
        if key is not None:
            states[index] = load_state(state_dir, key)  # type: ignore[arg-type]
            if states[index] is not None and progress is not None:
                progress(f"{labels[index]}: from {state_dir}")
    pending = [index for index, state in enumerate(states) if state is None]
    count = _workers(workers, len(pending))
    started = time.perf_counter()
    if count <= 1:
        for index in pending:
            states[index] = read_run(_one_process(dumps[index]), presets)
            if progress is not None:
                progress(f"{labels[index]}: read in {time.perf_counter() - started:.1f} s")
    else:
        jobs = [(_one_process(dumps[index]), presets) for index in pending]
        found = _run_ray(jobs) if backend == "ray" else _run_processes(jobs, count, dumps[0].device)
        for index, state in zip(pending, found, strict=True):
            states[index] = state
        if progress is not None:
            progress(f"{len(pending)} runs read on {count} processes in {time.perf_counter() - started:.1f} s")
    for index in pending:
        if keys[index] is not None:
            save_state(state_dir, keys[index], states[index])  # type: ignore[arg-type]
    return states  # type: ignore[return-value]


def _options(dump: Dump, presets: tuple[str, ...]) -> dict[str, Any]:
    """The reading options that change a run's state (the cache key's part besides the files)."""
    return {
        "presets": list(presets),
        "columns": dict(dump.columns),
        "input_format": dump.input_format,
        "strict": dump.strict,
    }


def _one_process(dump: Dump) -> Dump:
    """A run reads in one process (the runs are the parallel unit): the dump without its workers and backend."""
    return replace(dump, workers=AUTO, backend="process")


def _workers(workers: Workers, pending: int) -> int:
    """Processes for ``pending`` runs: a count is itself (at most the runs); ``auto`` one below AUTO_MIN_CORES cores,
    else one per core but the driver's, at most AUTO_MAX_WORKERS."""
    if pending <= 1:
        return pending
    if workers != AUTO:
        return min(int(workers), pending)
    cores = available_cores()
    return 1 if cores < AUTO_MIN_CORES else min(cores - 1, AUTO_MAX_WORKERS, pending)


def _run_processes(jobs: list[tuple[Dump, tuple[str, ...]]], workers: int, device: str) -> list[RunState]:
    method = "spawn" if device_kind(device) == "cuda" or (device == "auto" and _cuda()) else "fork"
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context(method)) as pool:
        return list(pool.map(read_run, *zip(*jobs, strict=True)))


def _cuda() -> bool:
    import sys

    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_available())


def _run_ray(jobs: list[tuple[Dump, tuple[str, ...]]]) -> list[RunState]:
    return run_on_ray(read_run, jobs)


# ------------------------------------------------------------------ naming runs and their knobs on a command line
def parse_run(text: str) -> tuple[str, str]:
    """``NAME=DUMP`` → (NAME, DUMP); a bare ``DUMP`` is named after its last path part. Raises ConfigError for an
    empty name or dump."""
    name, sep, path = text.partition("=")
    if not sep or "/" in name or not name:
        path = text
        name = Path(text.rstrip("/")).name or text
    if not path:
        raise ConfigError(f"run {text!r}: give NAME=DUMP (a file, directory or glob after the '=').")
    return name, path


def knob_columns(options: Sequence[str], names: Sequence[str]) -> dict[str, dict[str, str]]:
    """``--knob tp=8,8,4`` (one value per run, in the runs' order) → run name → knob → value. Raises ConfigError
    for a malformed option or a count of values other than the runs'."""
    knobs: dict[str, dict[str, str]] = {name: {} for name in names}
    for option in options:
        knob, sep, listed = option.partition("=")
        values = [value.strip() for value in listed.split(",")]
        if not sep or not knob.strip() or any(not value for value in values):
            raise ConfigError(f"{option_name('knob')} {option!r}: give NAME=V1,V2,… (one value per run).")
        if len(values) != len(names):
            raise ConfigError(
                f"{option_name('knob')} {option!r}: {len(values)} values for {len(names)} runs "
                f"({', '.join(names)}); give one per run, in that order."
            )
        for name, value in zip(names, values, strict=True):
            knobs[name][knob.strip()] = value
    return knobs


def load_knobs(path: str | Path, names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """A knobs file (TOML): one table per run, ``[base]`` then ``tp = 8``, ``r3 = "off"`` …. Raises ConfigError for
    an unreadable file, a table that is not a run, or a value that is not a scalar."""
    file = Path(path)
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            raise ConfigError(f"{file}: TOML needs Python 3.11 or tomli.", hint="pip install tomli") from None
    try:
        document = tomllib.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read the knobs file ({' '.join(str(exc).split())}).") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not TOML ({exc}).") from None
    knobs: dict[str, dict[str, Any]] = {}
    for run, table in document.items():
        if run not in names:
            raise ConfigError(f"{file}: table [{run}] names no run (runs: {', '.join(names)}).")
        if not isinstance(table, dict):
            raise ConfigError(f"{file}: [{run}] must be a table of knobs (tp = 8).")
        for knob, value in table.items():
            if isinstance(value, (dict, list)):
                raise ConfigError(f"{file}: [{run}] {knob} must be a number, a string or a boolean.")
        knobs[run] = dict(table)
    return knobs
