#!/usr/bin/env python3
"""CPU time per token of the correction families (every preset's §2/§3/§8 accumulators, the drop rules and the
threshold sweep) on chunks already read, one thread: what compare-presets adds to analyze's arithmetic.

    python sample_data/make_synthetic.py --tokens 10000000 --out /tmp/perchunk/10m.parquet
    python benchmarks/bench_correction_cpu.py /tmp/perchunk/10m.parquet

Chunks are read once; before each timed pass every chunk's cache is cleared and the analysis's shared token
quantities are prepared again (as the reader thread does in a real pass), outside the timing. Time is
``time.process_time`` (CPU seconds of this process, so a busy machine inflates it less than wall time); the
minimum of ``--repeat`` passes is printed, in ns per model token, for the verl presets, the default presets (every
built-in one but the probability gates), the default presets with the gates (``--preset all``) and the sweep.
"""

from __future__ import annotations

import argparse
import time

import torch

from rollout_diag.drivers.passes import ANALYSIS_QUANTITIES
from rollout_diag.engine.stats import prepare, stats
from rollout_diag.io.reader import DumpReader
from rollout_diag.metrics.outcome import CorrectionAnalysis
from rollout_diag.metrics.sweep import SweepAccumulator
from rollout_diag.presets import get_presets


def cpu_seconds(chunks: list, make, repeat: int) -> float:
    """Min over ``repeat`` passes of the CPU seconds ``make().update`` takes over every chunk."""
    best = float("inf")
    for _ in range(repeat):
        accumulator = make()
        spent = 0.0
        for chunk in chunks:
            chunk.cache.clear()
            prepare(chunk, ANALYSIS_QUANTITIES)
            start = time.process_time()
            accumulator.update(chunk)
            spent += time.process_time() - start
        best = min(best, spent)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dump")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--chunk-tokens", type=int, default=None, help="the reader's default when left out")
    args = parser.parse_args()
    torch.set_num_threads(1)
    options = {} if args.chunk_tokens is None else {"chunk_tokens": args.chunk_tokens}
    chunks = [chunk for chunk, _ in DumpReader([args.dump], **options).chunks("cpu")]
    tokens = sum(int(stats(chunk).row_count.sum()) for chunk in chunks)
    contenders = {
        "verl presets (19)": lambda: CorrectionAnalysis(get_presets(["verl"])),
        "default presets": lambda: CorrectionAnalysis(get_presets(None)),
        "default + gates": lambda: CorrectionAnalysis(get_presets(["all"])),
        "sweep": SweepAccumulator,
    }
    print(f"{tokens:,} model tokens in {len(chunks)} chunks, 1 thread, min of {args.repeat}")
    for name, make in contenders.items():
        seconds = cpu_seconds(chunks, make, args.repeat)
        print(f"{name:<20} {seconds:7.3f} s CPU  {seconds / tokens * 1e9:7.1f} ns/token")


if __name__ == "__main__":
    main()
