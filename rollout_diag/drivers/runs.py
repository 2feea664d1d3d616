"""The ``runs`` command: N dumps, each a run with a name and its knobs, read once each (in parallel where cores
allow, each run's finished pass kept in ``state_dir``), then compared (``decisions/runs.py``)."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollout_diag.cores import AUTO_MAX_WORKERS, AUTO_MIN_CORES, available_cores
from rollout_diag.decisions.diff import DEFAULT_LEVEL, DEFAULT_REPLICATES, DEFAULT_SEED
from rollout_diag.decisions.runs import RunInput, RunState, check_options, compare_runs
from rollout_diag.drivers.distributed import AUTO, Workers, check_workers, run_on_ray
from rollout_diag.drivers.dump import Dump, call_options
from rollout_diag.drivers.rowpass import READING_OPTIONS, row_pass
from rollout_diag.engine.arrays import device_kind
from rollout_diag.errors import ConfigError, option_name
from rollout_diag.presets import resolve_presets
from rollout_diag.results import RunsResult

Said = Callable[[str], None]  # a line of progress ("base: read in 3.2 s")


@dataclass(frozen=True)
class RunSpec:
    """One run: its name, its dump (a :class:`Dump`; file names, a glob or a directory are read as ``Dump(inputs)``),
    its knobs (name → value; a knob the dump's ``DumpWriter(config=...)`` recorded is taken from there unless given
    here)."""

    name: str
    inputs: Dump
    knobs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.inputs, Dump):  # file names, as every reading call takes them
            object.__setattr__(self, "inputs", Dump(self.inputs))


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
    for spec in runs:
        _check_one_process(spec)
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
        inputs.append(RunInput(state.summary, state.rows, state.prompts, name=spec.name, knobs=knobs))
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
    from rollout_diag.io.statecache import save_state, state_key

    labels = [spec.name for spec in specs] if specs is not None else [str(dump.inputs[0]) for dump in dumps]
    # the keys before anything is read: a file that changes while it is read is read again next time
    keys = [None if state_dir is None else state_key(dump.inputs, _options(dump, presets)) for dump in dumps]
    saved = [_saved_state(state_dir, key) for key in keys]
    for label, state in zip(labels, saved, strict=True):
        if state is not None and progress is not None:
            progress(f"{label}: from {state_dir}")
    pending = [index for index, state in enumerate(saved) if state is None]
    read = _read_pending([dumps[i] for i in pending], [labels[i] for i in pending], presets, workers, backend, progress)
    states = dict(zip(pending, read, strict=True))
    for index, state in states.items():
        key = keys[index]
        if state_dir is not None and key is not None:
            save_state(state_dir, key, state)
    return [states[index] if state is None else state for index, state in enumerate(saved)]


def _saved_state(state_dir: str | Path | None, key: str | None) -> RunState | None:
    from rollout_diag.io.statecache import load_state

    return None if state_dir is None or key is None else load_state(state_dir, key)


def _read_pending(
    dumps: list[Dump],
    labels: list[str],
    presets: tuple[str, ...],
    workers: Workers,
    backend: str,
    progress: Said | None,
) -> list[RunState]:
    """The states of ``dumps``, in order: read here one after another, or on ``workers`` processes (Ray tasks)."""
    count = _workers(workers, len(dumps))
    started = time.perf_counter()
    if count > 1:
        jobs = [(dump, presets) for dump in dumps]
        found = run_on_ray(read_run, jobs) if backend == "ray" else _run_processes(jobs, count, dumps[0].device)
        if progress is not None:
            progress(f"{len(dumps)} runs read on {count} processes in {time.perf_counter() - started:.1f} s")
        return found
    states = []
    for dump, label in zip(dumps, labels, strict=True):
        states.append(read_run(dump, presets))
        if progress is not None:
            progress(f"{label}: read in {time.perf_counter() - started:.1f} s")
    return states


def _check_one_process(spec: RunSpec) -> None:
    """Raises ConfigError for a run's Dump with an option a run's pass cannot honour: each run reads in one process
    (``workers`` of :func:`compare_dumps` reads several runs at once), so the Dump's workers and backend stay unset."""
    try:
        call_options(spec.inputs, "compare_dumps", READING_OPTIONS)
    except ConfigError as exc:
        raise ConfigError(
            f"run {spec.name!r}: {exc.message}",
            hint=f"each run reads in one process; {option_name('workers')} of compare_dumps reads runs in parallel.",
        ) from None


def _options(dump: Dump, presets: tuple[str, ...]) -> dict[str, Any]:
    """The reading options that change a run's state (the cache key's part besides the files)."""
    return {
        "presets": list(presets),
        "columns": dict(dump.columns),
        "input_format": dump.input_format,
        "strict": dump.strict,
    }


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
