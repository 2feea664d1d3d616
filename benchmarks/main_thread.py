#!/usr/bin/env python3
"""CPU of the thread that updates the analysis families (``Analysis.update``), per family, in isolation.

    python benchmarks/main_thread.py DUMP.parquet [--tokens 20e6] [--repeats 3]
    valgrind --tool=callgrind --instr-atstart=no python benchmarks/main_thread.py DUMP.parquet --instructions

Reads and prepares the first ``--tokens`` tokens' chunks first (the reader and its prepare pool, numpy chunks as
``analyze`` runs them), then feeds them to a fresh ``Analysis`` ``--repeats`` times, each chunk's caches put back to
what the prepare stage left, and sums per chunk the least thread CPU (``time.thread_time``) of the repeats: on a shared
machine the least is the figure other processes disturb least. Prints ns per file token for ``Analysis.update`` and
for each family's update (nested updates counted once). ``--instructions``: under callgrind, counts only the repeats
(instrumentation switched on and off around them with ``callgrind_control``; one untimed feed first): instructions do
not move with the machine's load. Give it a dump read whole (``--tokens`` above its size), so that no reader thread is
still decoding while they are counted.
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import subprocess
import time

from rollout_diag.drivers import passes
from rollout_diag.drivers.engine import DEFAULT_CHUNK_TOKENS
from rollout_diag.io.chunk import Chunk
from rollout_diag.metrics import base, hints, localize
from rollout_diag.metrics.dialects import verl

spent: collections.Counter[str] = collections.Counter()
running: set[str] = set()


def timed(owner: type, method: str, label: str | None = None) -> None:
    """Count the thread CPU of ``owner.method`` under its class name (or ``label``), outermost call only."""
    original = owner.__dict__[method]

    @functools.wraps(original)
    def wrapper(self, *args, **kwargs):
        key = label or f"{type(self).__name__}.{method}"
        if key in running:
            return original(self, *args, **kwargs)
        running.add(key)
        started = time.thread_time_ns()
        try:
            return original(self, *args, **kwargs)
        finally:
            spent[key] += time.thread_time_ns() - started
            running.discard(key)

    setattr(owner, method, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dump")
    parser.add_argument("--tokens", type=float, default=20e6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--instructions", action="store_true", help="count the repeats' instructions (callgrind)")
    options = parser.parse_args()
    prepared = passes.Analysis()
    reader = passes.open_reader(options.dump, None, strict=False, chunk_tokens=DEFAULT_CHUNK_TOKENS)
    chunks, tokens = [], 0
    for chunk, _ in reader.chunks("cpu", prepare=prepared.prepare, numpy=True):
        stats = chunk.cache["stats"]
        kept = {key: dict(value) if isinstance(value, dict) else value for key, value in vars(stats).items()}
        chunks.append((chunk, dict(chunk.cache), kept))
        tokens += int(chunk.offsets[-1])
        if tokens >= options.tokens:
            break
    if options.instructions:
        feed(chunks)  # the first feed's lazy imports and caches are not counted
        callgrind("on")
        for _ in range(options.repeats):
            feed(chunks)
        callgrind("off")
        print(f"{len(chunks)} chunks, {tokens} tokens, {options.repeats} feeds counted (callgrind's output)")
        return
    timed(base.StepAccumulator, "update")
    timed(base.StepAccumulator, "append_table", "StateTable bookkeeping (append_table)")
    timed(hints.HintEvidenceAccumulator, "update")
    timed(localize.WorstTracker, "update")
    timed(verl.VerlAccumulator, "update")
    least = [float("inf")] * len(chunks)
    parts: list[dict[str, int]] = [{} for _ in chunks]
    for _ in range(options.repeats):
        analysis = passes.Analysis()
        for index, (chunk, cache, kept) in enumerate(chunks):
            restore(chunk, cache, kept)
            spent.clear()
            started = time.thread_time_ns()
            analysis.update(chunk)
            least[index] = min(least[index], time.thread_time_ns() - started)
            for key, value in spent.items():
                parts[index][key] = min(parts[index].get(key, value), value)
    total = sum(least)
    head = f"{len(chunks)} chunks, {tokens} tokens, least of {options.repeats}"
    print(f"{head}: Analysis.update {total / tokens:.2f} ns/token")
    by_family: collections.Counter[str] = collections.Counter()
    for part in parts:
        by_family.update(part)
    for key, value in by_family.most_common():
        print(f"  {key:40s} {value / tokens:6.2f} ns/token")


def restore(chunk: Chunk, cache: dict, kept: dict) -> None:
    """The chunk's caches as the prepare stage left them."""
    stats = cache["stats"]
    vars(stats).clear()
    vars(stats).update({key: dict(value) if isinstance(value, dict) else value for key, value in kept.items()})
    chunk.cache.clear()
    chunk.cache.update(cache)


def feed(chunks: list[tuple[Chunk, dict, dict]]) -> None:
    analysis = passes.Analysis()
    for chunk, cache, kept in chunks:
        restore(chunk, cache, kept)
        analysis.update(chunk)


def callgrind(state: str) -> None:
    subprocess.run(["callgrind_control", "-i", state, str(os.getpid())], check=True, capture_output=True)


if __name__ == "__main__":
    main()
