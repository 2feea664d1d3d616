"""The cores this process may run on: what ``--workers auto``, torch's intra-op threads and the reader's prepare pool
are sized by."""

from __future__ import annotations

import os


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, where the OS tells)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
