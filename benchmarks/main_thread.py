#!/usr/bin/env python3
"""CPU of the thread that updates the analysis families (``Analysis.update``), per family, in isolation.

    python benchmarks/main_thread.py DUMP.parquet [--tokens 20e6] [--repeats 3]

Reads and prepares the first ``--tokens`` tokens' chunks first (the reader and its prepare pool, as ``analyze`` runs
them), then feeds them to a fresh ``Analysis`` ``--repeats`` times, each chunk's caches put back to what the prepare
stage left, and sums per chunk the least thread CPU (``time.thread_time``) of the repeats: on a shared machine the
least is the figure other processes disturb least. torch runs one intra-op thread, as ``run_chunks`` sets it on 2
cores. Prints ns per file token for ``Analysis.update`` and for each family's update (nested updates counted once).
"""

from __future__ import annotations

import argparse
import collections
import functools
import time

import torch

from rollout_diag.drivers import passes
from rollout_diag.drivers.engine import DEFAULT_CHUNK_TOKENS
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
    options = parser.parse_args()
    torch.set_num_threads(1)
    prepared = passes.Analysis()
    reader = passes.open_reader(options.dump, None, strict=False, chunk_tokens=DEFAULT_CHUNK_TOKENS)
    chunks, tokens = [], 0
    for chunk, _ in reader.chunks(torch.device("cpu"), prepare=prepared.prepare):
        stats = chunk.cache["stats"]
        kept = {key: dict(value) if isinstance(value, dict) else value for key, value in vars(stats).items()}
        chunks.append((chunk, dict(chunk.cache), kept))
        tokens += int(chunk.offsets[-1])
        if tokens >= options.tokens:
            break
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
            stats = cache["stats"]
            vars(stats).clear()
            vars(stats).update({key: dict(value) if isinstance(value, dict) else value for key, value in kept.items()})
            chunk.cache.clear()
            chunk.cache.update(cache)
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


if __name__ == "__main__":
    main()
