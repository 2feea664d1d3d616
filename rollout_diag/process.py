"""How the command line tunes its own process, in one place: OpenBLAS's threads before numpy loads, the cyclic
collector and the C heap's bounds while a command reads (``rollout_diag.memory``), and the end without the
interpreter's teardown. Each is called once per command, by ``rollout_diag.cli`` only: a notebook or a trainer that
imports rollout_diag keeps its own settings."""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Callable
from contextlib import suppress
from typing import NoReturn, TypeVar

D = TypeVar("D")


def one_blas_thread() -> None:
    """OpenBLAS's helper threads busy-wait after its start-up, ~0.09 s of a second core per process (the sample's
    analyze 0.72 -> 0.66 s wall on 2 cores; docs/benchmarks.md): the commands ask BLAS for nothing that threads pay
    for, and one thread makes its dot products independent of the core count. OpenBLAS reads the variable once,
    when numpy loads it: called before anything loads numpy; a value the user set is kept."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def open_for_reading(opening: Callable[[], D], size: Callable[[D], tuple[int, int] | None]) -> D:
    """``opening()`` (the command's dump opened: its files found, footers read), with the process tuned for the
    reading that follows: no cyclic collection while pyarrow, torch and numba load (the reader switches it back on
    where the chunks begin, ``memory.collect_from_here``; :func:`command_ended` undoes it whatever happens), and the
    C heap's bounds by the input's ``size(dump)`` (tokens, rows): where the per-step state dominates (many short
    rows), freed arrays go back to the system; elsewhere a chunk's arrays reuse the pages of the chunk before."""
    from rollout_diag import memory  # ctypes and gc: loaded only by a command that reads

    memory.defer_collection()
    opened = opening()
    if memory.many_short_rows(size(opened)):
        memory.return_large_blocks()
    else:
        memory.keep_large_blocks()
    return opened


def command_ended() -> None:
    """At a command's end, whatever happened: the collector as it was before :func:`open_for_reading` (a process that
    runs several commands, a test's, collects between them as before). Nothing to undo where none was read."""
    memory = sys.modules.get("rollout_diag.memory")
    if memory is not None:
        memory.end_deferral()


def exit_now(code: int | str | None) -> NoReturn:
    """End the process with ``code`` (SystemExit's: None is 0, text is printed and is 1) once a command is done,
    without the interpreter's teardown: its modules' and objects' dismantling and final collection of every object
    torch, numba and pyarrow made take 0.16 s after `analyze` of 100M tokens and 0.43 s after `compare-presets`
    (docs/benchmarks.md), all of it after the answer is out. What the teardown would still do for the user is done
    first: the atexit functions (a preset kernels' compile left running is stopped, the logging and multiprocessing
    shutdowns, Ray's) and the flush of stdout and stderr. Where a thread that is not a daemon is still alive (some
    writer's), the interpreter's own exit, which waits for it, is taken instead."""
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    main_thread = threading.main_thread()
    if any(thread.is_alive() and not thread.daemon and thread is not main_thread for thread in threading.enumerate()):
        sys.exit(code)
    atexit._run_exitfuncs()  # noqa: SLF001  (what the interpreter's exit runs first: the atexit module's own hook)
    for stream in (sys.stdout, sys.stderr):
        with suppress(OSError, ValueError):  # a reader that closed the pipe (`| head`), or a stream already closed
            stream.flush()
    os._exit(code)
