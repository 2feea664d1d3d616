"""The cores this process may run on: what ``--workers auto``, torch's intra-op threads and the reader's prepare pool
are sized by."""

from __future__ import annotations

import os
from typing import Any


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, where the OS tells)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# ``--workers auto`` splits only from this many cores: on 2 cores one process already keeps both busy (its reader
# thread and its compute), and --workers 2 measured no faster (docs/benchmarks.md)
AUTO_MIN_CORES = 3
# ... and uses at most this many processes: on a 16-core Xeon (the lent GPU machine, 50 M tokens, fresh processes)
# analyze took 2.12 / 3.06 s with 8 workers against 2.62 / 3.23 s with 15 (two runs each), and compare-presets 2.83 /
# 3.52 s against 2.95 / 3.12: past ~4 processes the driver's merge and each worker's start cost what more cores
# bring (docs/benchmarks.md, "Cores"), and every worker holds its own ~100 MB.
AUTO_MAX_WORKERS = 8


def auto_cpu_workers(reader: Any) -> int:
    """``--workers auto`` on the CPU: one process below AUTO_MIN_CORES cores; otherwise one per core but the one the
    driver keeps, at most AUTO_MAX_WORKERS, as many as the input splits into (``DumpReader.plan``). Without torch: the
    read-ahead decides with it before torch is loaded (``drivers/dump.py``)."""
    cores = available_cores()
    if cores < AUTO_MIN_CORES:
        return 1
    return max(1, len(reader.plan(min(cores - 1, AUTO_MAX_WORKERS))))
