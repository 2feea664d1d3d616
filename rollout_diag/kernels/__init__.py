"""Which engine computes each chunk's token statistics, and the compiled CPU kernels (numba) behind one of them.

Two engines give the same metrics (tests/test_kernel.py requires 1e-12 relative, exact counts):

- ``numba``: the compiled CPU kernels of ``kernels/cpu.py``: one pass over a chunk's raw arrays builds its segments
  and every per-segment sum, maximum and minimum in registers. CPU only.
- (``kernels/presets.py`` is the preset pass's compiled twin of ``engine/formulas.py``'s derived token quantities, and
  ``io/jsonl.py`` the byte scanner of the JSON-lines importers: compiled CPU code, whatever the engine.)
- ``torch``: the device-generic engine of ``engine/stats.py`` (vectorised torch / numpy over token tensors);
  what runs on CUDA.
- ``auto`` (default): numba for a chunk on the CPU, torch on a GPU. The commands whose families take numpy chunks
  (every family does, through ``rollout_diag.engine.arrays``: ``analyze``, ``check``, ``compare-presets``, ``report``,
  ``sweep``, ``diff``, ``watch``, ``inspect``) then never import torch on the CPU, and run the kernels whatever the
  input's size (their reader asks without a size): loading numba and the cached kernels costs less than importing
  torch. A reading of tensor chunks (``DumpReader.chunks`` without ``numpy``, a caller that wants tensors and loads
  torch anyway) runs torch on the CPU for an input of fewer than
  ``SMALL_INPUT_TOKENS`` tokens in fewer than ``SMALL_INPUT_ROWS`` rows (read from the Parquet footers before the
  first chunk), where loading numba and its cached kernels (~0.8 s of CPU) costs more than the kernels save
  (measured in docs/benchmarks.md: the two break even near 4M tokens; the torch engine's cost per step is higher,
  so many short rows, each perhaps its own step, go to the kernels).

The choice is a process setting (``ROLLOUT_DIAG_ENGINE``, or :func:`use_engine` around a call, or
``Dump(engine=…)``), so worker processes inherit it.

Compiled kernels are cached (numba ``cache=True``) next to this module, or, where the package directory is not
writable, under ``$XDG_CACHE_HOME/rollout-diag/numba`` (``~/.cache/…``); a run that compiles says so once on stderr,
and removes the files an earlier version of the kernels left (:func:`drop_stale_caches`).
numba compiles one function at a time in a process, so where a run will need the preset kernels too
(:func:`expect_presets`) and they are not cached, a helper process compiles them into the cache on another core while
this one compiles the analysis kernels (:func:`compiled_presets` waits for it).
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

from rollout_diag.errors import ConfigError, option_name

ENGINES = ("auto", "numba", "torch")
ENVIRONMENT = "ROLLOUT_DIAG_ENGINE"
# ``auto`` below this many input tokens and rows on the CPU is torch (see above); the variable sets another token
# bound (0: never).
SMALL_INPUT_ENVIRONMENT = "ROLLOUT_DIAG_SMALL_INPUT_TOKENS"
SMALL_INPUT_TOKENS = 1 << 22
SMALL_INPUT_ROWS = 1 << 12
InputSize = tuple[int, int]  # (tokens, rows) of a reader's whole input
# What a first run (empty cache) spends compiling the kernels a command needs, on 2 cores (docs/benchmarks.md, issue 20
# session 9: ~10 s of CPU for the analysis kernels; the preset kernels' ~10 s in the helper process alongside)
COMPILE_SECONDS = 10
COMPILE_NOTICE = "rollout-diag: compiling the CPU kernels once"  # the start of the line a first run says it with
# The longest the preset kernels' helper may take before this process compiles them itself.
AHEAD_TIMEOUT = 600.0
_loaded: list[ModuleType] = []
_expected: list[bool] = []  # True once a pass has said it will run the preset kernels
_decided: list[bool] = []  # True once the question of a helper process for them is settled
_ahead: list[subprocess.Popen] = []  # the helper process compiling them
_lock = threading.Lock()
_waiting = threading.Lock()


def check_engine(engine: str) -> str:
    """``engine`` if it names an engine, else a ConfigError naming the option."""
    if engine not in ENGINES:
        raise ConfigError(f"{option_name('engine')}={engine}: not an engine (use {', '.join(ENGINES)}).")
    return engine


def selected_engine() -> str:
    """The engine this process uses (``auto`` unless set)."""
    engine = os.environ.get(ENVIRONMENT) or "auto"
    if engine not in ENGINES:
        raise ConfigError(f"{ENVIRONMENT}={engine}: not an engine (use {', '.join(ENGINES)}).")
    return engine


@contextmanager
def use_engine(engine: str | None) -> Iterator[None]:
    """Run the body with ``engine`` (None: leave the setting as it is)."""
    if engine is None:
        yield
        return
    check_engine(engine)
    before = os.environ.get(ENVIRONMENT)
    os.environ[ENVIRONMENT] = engine
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENVIRONMENT, None)
        else:
            os.environ[ENVIRONMENT] = before


def kernel_for(device_type: str, input_size: InputSize | None = None) -> bool:
    """Whether a chunk on ``device_type`` is computed by the numba kernels. ``input_size``: (tokens, rows) of the
    whole input the chunk comes from, where a reader knows them and its chunks are tensors (``auto`` on the
    CPU is torch below :func:`small_input_tokens` tokens and SMALL_INPUT_ROWS rows); None: no size rule (numpy
    chunks, which load no torch; the trainer-side API, whose chunk's size is not a run's)."""
    engine = selected_engine()
    if engine == "numba" and device_type != "cpu":
        raise ConfigError(
            f"{option_name('engine')}=numba runs on the CPU; the chunks are on {device_type}.",
            hint=f"use {option_name('engine')}=torch (or auto) with a GPU, or {option_name('device')}=cpu.",
        )
    if engine == "auto" and input_size is not None:
        tokens, rows = input_size
        if tokens < small_input_tokens() and rows < SMALL_INPUT_ROWS:
            return False
    return device_type == "cpu" and engine != "torch"


def small_input_tokens() -> int:
    """The input size below which ``auto`` runs the torch engine on the CPU (``SMALL_INPUT_TOKENS`` unless
    ``ROLLOUT_DIAG_SMALL_INPUT_TOKENS`` says otherwise)."""
    configured = os.environ.get(SMALL_INPUT_ENVIRONMENT)
    if not configured:
        return SMALL_INPUT_TOKENS
    try:
        value = int(configured)
    except ValueError:
        value = -1
    if value < 0:
        raise ConfigError(f"{SMALL_INPUT_ENVIRONMENT}={configured}: must be a whole number of tokens, 0 or more.")
    return value


def cache_directory() -> Path:
    """Where numba keeps the compiled kernels: beside this module when writable, else a user-wide directory."""
    configured = os.environ.get("NUMBA_CACHE_DIR")
    if configured:
        return Path(configured)
    here = Path(__file__).resolve().parent
    pycache = here / "__pycache__"
    if os.access(pycache if pycache.exists() else here, os.W_OK):
        return pycache
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rollout-diag" / "numba"


def compiled() -> ModuleType:
    """The compiled kernels (``kernels/cpu.py``), imported on first use; a first compile is announced on stderr."""
    if _loaded:
        return _loaded[0]
    directory = cache_directory()
    if not os.environ.get("NUMBA_CACHE_DIR") and directory.name != "__pycache__":
        os.environ["NUMBA_CACHE_DIR"] = str(directory)  # numba reads its configuration when imported …
        if "numba" in sys.modules:  # … or when told to read it again
            sys.modules["numba"].core.config.reload_config()
    from rollout_diag.kernels import cpu as module  # numba and the kernels' definitions: nothing compiles yet

    if not _has_cache(module, module.SIGNATURES, every=False):
        print(
            f"{COMPILE_NOTICE} (about {COMPILE_SECONDS} s; cached in {directory}).",
            file=sys.stderr,
            flush=True,
        )
        from rollout_diag.kernels import presets

        for kernels in (module, presets):  # an upgrade's first run: the last version's files go
            drop_stale_caches(kernels)

    with _lock:
        if not _loaded:
            _loaded.append(module)
    if _expected:
        _compile_presets_ahead()
    return _loaded[0]


def drop_stale_caches(module: ModuleType) -> int:
    """Remove the cache files of ``module``'s kernels that this source can no longer load; returns how many. numba
    names them by the function's line (``cpu.segment_pass-512.py311.nbi`` and its ``.0.nbc``), so every version of
    the source that moved a kernel left its compiled code behind, ~8 MB a version (an upgrade, an edit). Files of
    another Python's tag are kept (two interpreters may share an editable checkout's cache)."""
    current: set[str] = set()
    directory = None
    for value in vars(module).values():
        cache = getattr(value, "_cache", None)
        index = getattr(getattr(cache, "_cache_file", None), "_index_name", None)
        if isinstance(index, str) and index.endswith(".nbi"):
            current.add(index[: -len(".nbi")])
            directory = getattr(cache, "_cache_path", directory)
    if not current or directory is None:
        return 0
    tag = "." + next(iter(current)).rsplit(".", 1)[1]  # ".py311"
    prefix = module.__name__.rsplit(".", 1)[-1] + "."  # "cpu."
    dropped = 0
    for path in Path(directory).glob(prefix + "*"):
        name = path.name
        if name.endswith(".nbi"):
            stem = name[: -len(".nbi")]
        elif name.endswith(".nbc") and name.count(".") >= 3:
            stem = name.rsplit(".", 2)[0]  # cpu.segment_pass-512.py311 of cpu.segment_pass-512.py311.0.nbc
        else:
            continue
        if stem.endswith(tag) and stem not in current:
            with contextlib.suppress(OSError):  # another process removed it first, or a read-only cache
                path.unlink()
                dropped += 1
    return dropped


def _has_cache(module: ModuleType, kernels: Iterable[str], every: bool = True) -> bool:
    """Whether numba's cache holds each (``every=False``: any) of ``module``'s ``kernels`` compiled from the source as
    it is now, by numba's own test: an index whose stamp is the source's (its text's hash in numba 0.68, its mtime and
    size in 0.60). So a source only touched (a reinstall, a checkout) counts as cached where numba loads it; an earlier
    test of mtimes alone announced a compile and started the preset kernels' helper on every run after that, though
    numba compiled nothing (+0.4 s a run of compare-presets, waiting for the helper). False where numba's cache is not
    laid out as it expects (an announced first run)."""
    found = []
    for name in kernels:
        cache_file = getattr(getattr(getattr(module, name), "_cache", None), "_cache_file", None)
        load_index = getattr(cache_file, "_load_index", None)  # {} for an index missing, of another numba, or stale
        try:
            found.append(load_index is not None and bool(load_index()))
        except Exception:  # an index numba cannot read: it compiles anew
            found.append(False)
    return all(found) if every else any(found)


def expect_presets() -> None:
    """Say that this process will run the preset kernels (``kernels/presets.py``). Once it also runs the numba engine
    (:func:`compiled`), and where they are not cached, a helper process compiles them into the cache meanwhile, on
    another core (none on one core, or in a worker process: its parent's helper does it)."""
    with _lock:
        if _expected:
            return
        _expected.append(True)
    if _loaded:
        _compile_presets_ahead()


def _compile_presets_ahead() -> None:
    from rollout_diag.cores import available_cores

    with _lock:
        if _decided:
            return
        _decided.append(True)
        if available_cores() < 2 or multiprocessing.parent_process() is not None:
            return
        from rollout_diag.kernels import presets

        if _has_cache(presets, presets.SIGNATURES):
            return
        # the package as this process imports it, first: numba keys its cache on the source file's path
        root = str(Path(os.path.abspath(__file__)).parents[2])
        command = f"import sys; sys.path.insert(0, {root!r}); from rollout_diag.kernels import presets; " + (
            "presets.compile_signatures()"
        )
        process = subprocess.Popen(
            [sys.executable, "-c", command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _ahead.append(process)
        atexit.register(process.kill)  # a run that ends first leaves no compile behind (numba writes atomically)


def compiled_presets() -> ModuleType:
    """The compiled pass of the presets' token quantities (``kernels/presets.py``), imported on first use, after
    :func:`compiled` (which sets up the cache directory and announces a first compile), and once the helper process
    compiling them (:func:`expect_presets`), if one runs, has written them into the cache."""
    compiled()
    with _waiting:
        while _ahead:
            try:
                _ahead[0].wait(AHEAD_TIMEOUT)
            except subprocess.TimeoutExpired:  # then this process compiles what it needs itself
                _ahead[0].kill()
            _ahead.pop()
    from rollout_diag.kernels import presets as module

    return module
