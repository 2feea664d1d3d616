"""Follow a dump directory while the trainer writes it (``rollout-diag watch``).

Each poll lists the directory (every trainer format ``analyze`` reads), reads each new file once into an
:class:`~rollout_diag.drivers.passes.Analysis` of its own and merges it into the run's: the accumulators are mergeable,
so the run state after the last file equals what ``analyze`` computes over the finished directory (rtol 1e-12).
What is kept per file is small (its steps, signature, reading log and a few side records; no token data), so
memory grows with steps, as ``analyze``'s own per-step state does, never with tokens.

- A file not readable yet (no Parquet footer, a JSONL file without its last newline or still growing, a
  truncated pickle) is retried at the next poll once it changes, and said once.
- A file rewritten (a resumed run) or removed takes its steps out of the run state; the other files of those
  steps are read again and merged back. The run's top-K lists are rebuilt from each file's own top-K (kept as
  summaries); a worst row that comes back needs its tokens, so the file holding it is read again for those.
- A rank file arriving late joins its step: its state is merged in, nothing else is read again.
- A step is *final* when the writer says so (``DumpWriter``'s ``_COMPLETE-rank-<R>`` markers from every rank,
  prime-rl's ``STABLE``), when a later step appears, or when the watch ends; each final step is reported once
  (again, with a higher ``revision``, if a late file or a rewrite changes it).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rollout_diag.drivers.dump import Dump
from rollout_diag.drivers.watcher import Watcher
from rollout_diag.drivers.watchreport import StepReport, WatchGone, WatchUpdate, verdict_of
from rollout_diag.errors import ConfigError, option_name

DEFAULT_INTERVAL = 2.0  # seconds between polls


# ----------------------------------------------------------------------------------------------- the loop
def watch(
    directory: str | Path | Dump,
    *,
    interval: float = DEFAULT_INTERVAL,
    exit_after_idle: float | None = None,
    exit_on_fail: bool = False,
    max_polls: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
    **options: Any,
) -> Iterator[WatchUpdate]:
    """Follow ``directory``: one :class:`WatchUpdate` per poll, every ``interval`` seconds, until the directory
    is deleted or moved (exit code 1), a gate fails with ``exit_on_fail`` (3), nothing new has arrived for
    ``exit_after_idle`` seconds (0, or 3 if a gate failed), or ``max_polls`` polls (same codes). The last update
    carries ``ended`` and ``exit_code``; every step still pending is reported final in it. ``directory`` and
    ``options``: those of :class:`Watcher` (a :class:`Dump` of the directory too); ``sleep`` waits between polls (a
    test passes its own). Raises RolloutDiagError for bad options or a gate naming an unknown metric."""
    if not (isinstance(interval, (int, float)) and interval > 0 and math.isfinite(interval)):
        raise ConfigError(f"{option_name('interval')}={interval}: must be a positive number of seconds.")
    if exit_after_idle is not None and not exit_after_idle >= 0:
        raise ConfigError(f"{option_name('exit_after_idle')}={exit_after_idle}: must be 0 or more seconds.")
    watcher = Watcher(directory, **options)
    polls = 0
    while True:
        polls += 1
        try:
            update = watcher.poll()
        except WatchGone as gone:
            yield _ended(watcher, str(gone), 1)
            return
        if watcher.failed_gates and exit_on_fail:
            update.ended, update.exit_code = "a gate failed; the watch ends (--exit-on-fail).", 3
            yield update
            return
        idle_end = exit_after_idle is not None and update.idle >= exit_after_idle and not update.changed
        if idle_end or (max_polls is not None and polls >= max_polls):
            yield update
            why = (
                f"nothing new for {update.idle:.0f} s; the watch ends."
                if idle_end
                else f"{polls} poll{'s' if polls > 1 else ''} done; the watch ends."
            )
            try:
                last = watcher.poll(final=True)
            except WatchGone as gone:
                yield _ended(watcher, str(gone), 1)
                return
            last.ended, last.exit_code = why, 3 if watcher.failed_gates else 0
            yield last
            return
        yield update
        sleep(interval)


def _ended(watcher: Watcher, why: str, code: int) -> WatchUpdate:
    result = watcher.result
    level, sentence = verdict_of(result)
    return WatchUpdate(
        result=result,
        level=level,
        sentence=sentence,
        steps=[],
        notes=[],
        alerts=[],
        idle=time.monotonic() - watcher.last_change,
        changed=False,
        pending_steps=[],
        ended=why,
        exit_code=code,
    )


__all__ = ["DEFAULT_INTERVAL", "StepReport", "WatchGone", "WatchUpdate", "Watcher", "verdict_of", "watch"]
