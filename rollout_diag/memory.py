"""How the process's C heap gives memory back, and when Python's cyclic garbage collector runs: both set by the
command line (``rollout_diag.process``, once per command), never by the library (a notebook that imports rollout_diag
keeps its own allocator and collector settings)."""

from __future__ import annotations

import ctypes
import gc
import sys

# glibc serves a block from this size up with its own mmap, returned to the system when freed. Left to itself it
# raises that bound to the largest block freed so far (up to 32 MB), after which a chunk's and a finalize's arrays of
# a few MB come from the heap and stay resident once freed: 200 000 one-row steps peaked 15 % higher (1.64 against
# 1.42 GB for `analyze`, docs/benchmarks.md). A fixed bound also fixes the heap's trim threshold at its default.
# Each fresh mmap costs page faults, though: on long rows (100M tokens; the JSON-lines importers' 16 MiB blocks) the
# fixed bound cost +0.9 s of system time and +20 % wall, so it is set only where many short rows make the per-step
# state the larger part of the memory (``many_short_rows``).
MMAP_THRESHOLD = 128 * 1024
MANY_ROWS = 1 << 16  # from this many rows …
SHORT_ROW_TOKENS = 64  # … of fewer tokens than this on average
# Everywhere else the opposite: glibc's dynamic bound starts at 128 KiB and rises only as large blocks are freed, so
# the first chunks' arrays are fresh mmaps, and the heap hands freed pages back once 2× the bound lies free at its top,
# to fault them in again for the next chunk. Fixed at 32 MiB (the dynamic bound's ceiling) with a 256 MiB trim
# threshold, a chunk's arrays reuse the pages the chunk before freed: on 100M tokens `analyze` system time 0.54 ->
# 0.45 s, wall 0.970 paired (peak +41 MiB), `compare-presets` 0.976 (issue 20 session 11, docs/benchmarks.md). The
# trim threshold bounds only the free pages at the heap's top: freed arrays of as many sizes as chunks left holes
# that later arrays did not fit, and the heap grew with the input (compare-presets: 596 MiB at 100M tokens, 734–940
# at 1G), so the kernels allocate chunk-sized arrays in a few sizes (``kernels.cpu.size_class``; 682–720 at 1G).
KEEP_MMAP_THRESHOLD = 32 << 20
KEEP_TRIM_THRESHOLD = 256 << 20
_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
_M_MMAP_THRESHOLD = -3


def many_short_rows(size: tuple[int, int] | None) -> bool:
    """Whether an input of ``size`` (tokens, rows; None: not known) has MANY_ROWS rows or more, of fewer than
    SHORT_ROW_TOKENS tokens on average."""
    if size is None:
        return False
    tokens, rows = size
    return rows >= MANY_ROWS and tokens < SHORT_ROW_TOKENS * rows


def return_large_blocks() -> bool:
    """Fix glibc's mmap threshold at MMAP_THRESHOLD (True when set; False off glibc, where nothing is changed)."""
    return _mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def keep_large_blocks() -> bool:
    """Fix glibc's mmap threshold at KEEP_MMAP_THRESHOLD and its trim threshold at KEEP_TRIM_THRESHOLD: freed chunk
    arrays stay in the heap for the next chunk (True when both are set; False off glibc)."""
    return _mallopt(_M_MMAP_THRESHOLD, KEEP_MMAP_THRESHOLD) and _mallopt(_M_TRIM_THRESHOLD, KEEP_TRIM_THRESHOLD)


def _mallopt(parameter: int, value: int) -> bool:
    """glibc's ``mallopt(parameter, value)``: True where it was set; False off glibc, where nothing is changed."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library the interpreter runs on
    except (OSError, AttributeError):  # musl and other C libraries have no mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(parameter, value))


def trim_heap() -> bool:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim``): after many small arrays are freed
    (a chunk's per-step state holds columns of a few kB each, below the mmap bound) their pages stay resident and
    cannot serve the next large arrays. True where it ran; False off glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    malloc_trim.argtypes, malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    malloc_trim(0)
    return True


# The cyclic collector, left to itself, runs through every object the imports made (torch's, numba's and pyarrow's
# modules: some 200 000) whenever enough new ones pile up while they load: 0.24 s of the bundled sample's `analyze`
# (about 2.9 s), 0.94 s on 200 000 one-row steps (gc.callbacks; docs/benchmarks.md). The command line switches it off
# while a command loads (``defer_collection``); the reader switches it back on where the chunks begin
# (``collect_from_here``), the modules by then moved out of its reach (``gc.freeze``), so that whatever cycles the
# reading makes are collected as before at a fraction of the cost.
_deferred = False  # collection is off, by defer_collection, until collect_from_here
_frozen = False  # collect_from_here froze the objects made before it


def defer_collection() -> bool:
    """Switch the cyclic garbage collector off until :func:`collect_from_here` (True where this call switched it
    off; False where it was off already, which is then left alone). For the command line's process only."""
    global _deferred
    if _deferred or not gc.isenabled():
        return False
    gc.disable()
    _deferred = True
    return True


def collect_from_here() -> bool:
    """Where the chunks begin: after :func:`defer_collection`, move every object made so far out of the collector's
    reach (``gc.freeze``) and switch it back on (True). Otherwise (the library's own use) nothing changes (False)."""
    global _deferred, _frozen
    if not _deferred:
        return False
    _deferred = False
    gc.freeze()
    _frozen = True
    gc.enable()
    return True


def end_deferral() -> None:
    """Undo :func:`defer_collection` and :func:`collect_from_here` at the command's end: the frozen objects back
    within the collector's reach and collection on (a process that runs several commands, a test's, collects
    between them as before)."""
    global _deferred, _frozen
    if _frozen:
        gc.unfreeze()
        _frozen = False
    if _deferred:
        _deferred = False
        gc.enable()
