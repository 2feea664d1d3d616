"""Progress where people look: a short line on stderr every few seconds, for a pipe, a CI log or a notebook (a
terminal gets the rich bar of ``cli/output.py`` instead). A callable ``(rows done, total rows)``, the ``progress=``
of every library call (``analyze(path, progress=True)`` builds one)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

DEFAULT_INTERVAL = 5.0  # seconds between lines: a CI log stays short, a long run shows it is alive


class LineProgress:
    """Prints ``rollout-diag: reading 1,234 / 5,678 rows (22 %), 10 s elapsed, about 35 s left`` at most every
    ``interval`` seconds (the first after ``interval``: short runs print nothing), and a last line when the input is
    done if any line was printed."""

    def __init__(
        self,
        stream: TextIO | None = None,
        interval: float = DEFAULT_INTERVAL,
        clock: Callable[[], float] | None = None,
        label: str = "reading",
    ) -> None:
        self.stream = stream
        self.interval = float(interval)
        self.clock = clock or time.monotonic  # seconds; tests pass a fake one
        self.label = label
        self.started = self.clock()
        self.last = self.started
        self.printed = 0

    def __call__(self, done: int, total: int) -> None:
        now = self.clock()
        finished = total > 0 and done >= total
        if now - self.last < self.interval and not (finished and self.printed):
            return
        if finished and self.printed and self.last == now:
            return
        self.last = now
        self.printed += 1
        print(self.line(done, total, now - self.started), file=self.stream or sys.stderr, flush=True)

    def line(self, done: int, total: int, elapsed: float) -> str:
        share = f" ({done / total:.0%})" if total > 0 else ""
        left = ""
        if 0 < done < total and elapsed > 0:
            left = f", about {_duration(elapsed * (total - done) / done)} left"
        return f"rollout-diag: {self.label} {done:,} / {total:,} rows{share}, {_duration(elapsed)} elapsed{left}"


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
