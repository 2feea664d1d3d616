"""The compiled CPU kernels (numba) behind the ``numba`` engine (``engine/choice.py`` says which engine runs):
``cpu.py`` (validation scan, segment layout, the fused analysis pass, hint sums), ``presets.py`` (the preset pass's
compiled twin of ``engine/formulas.py``'s derived token quantities, the sweep's histograms), ``prepass.py`` (the
passes the reader runs while the command still loads). Each reads its quantities' names from
``engine/quantities.py``.

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
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

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
    from rollout_diag.engine.kernels import cpu as module  # numba and the kernels' definitions: nothing compiles yet

    if not _has_cache(module, module.SIGNATURES, every=False):
        print(
            f"{COMPILE_NOTICE} (about {COMPILE_SECONDS} s; cached in {directory}).",
            file=sys.stderr,
            flush=True,
        )
        from rollout_diag.engine.kernels import presets

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
        from rollout_diag.engine.kernels import presets

        if _has_cache(presets, presets.SIGNATURES):
            return
        # the package as this process imports it, first: numba keys its cache on the source file's path
        root = str(Path(os.path.abspath(__file__)).parents[2])
        command = f"import sys; sys.path.insert(0, {root!r}); from rollout_diag.engine.kernels import presets; " + (
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
    from rollout_diag.engine.kernels import presets as module

    return module
