#!/usr/bin/env python3
"""``runs`` over N runs against the sum of N single ``analyze`` calls, and its peak RSS (issue 43).

    python benchmarks/bench_runs.py --runs 8 --tokens 2000000          # 8 runs of 2 M tokens (the lead: 10000000)

Writes N dumps (``--dir``, reused when present) whose δ scale differs by run (knob ``scale``) and one knob without
effect (``tp``); times, each in a fresh process of the CLI: ``analyze -f json`` of every run (their sum), then
``runs`` of all N (``-f json``, ``--workers`` as given, default auto) and, with ``--state-dir``, ``runs`` again from
the saved states. Peak RSS is each process's own (``wait4``: with --workers > 1, not its worker processes').
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
LENGTH = 512  # model tokens per row
ROWS_PER_STEP = 64


def write_dump(path: Path, tokens: int, seed: int, scale: float) -> None:
    """A sequence-layout dump of ``tokens`` model tokens: δ ~ N(0, (0.05·scale)²), 64 rows of 512 tokens a step,
    one row group per step."""
    rng = np.random.default_rng(seed)
    rows = max(1, tokens // LENGTH)
    writer = None
    for first in range(0, rows, ROWS_PER_STEP):
        count = min(ROWS_PER_STEP, rows - first)
        trainer = (-0.5 - rng.exponential(1.0, (count, LENGTH))).astype(np.float32)
        rollout = np.minimum(trainer + 0.05 * scale * rng.standard_normal((count, LENGTH)), 0.0).astype(np.float32)
        offsets = pa.array(np.arange(0, (count + 1) * LENGTH, LENGTH, dtype=np.int32))
        table = pa.table(
            {
                "step": pa.array(np.full(count, first // ROWS_PER_STEP, dtype=np.int64)),
                "sample_id": pa.array([f"r{first + i}" for i in range(count)]),
                "rollout_log_probs": pa.ListArray.from_arrays(offsets, pa.array(rollout.ravel())),
                "old_log_probs": pa.ListArray.from_arrays(offsets, pa.array(trainer.ravel())),
                "response_mask": pa.ListArray.from_arrays(offsets, pa.array(np.ones(count * LENGTH, dtype=np.int8))),
            }
        )
        if writer is None:
            writer = pq.ParquetWriter(path, table.schema, compression="zstd")
        writer.write_table(table)
    assert writer is not None
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=2_000_000, help="model tokens per run")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "rollout_diag_bench_runs")
    parser.add_argument("--workers", default="auto")
    args = parser.parse_args()
    folder = args.dir / f"{args.runs}x{args.tokens}"
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(args.runs):
        path = folder / f"run{index}.parquet"
        if not path.exists():
            write_dump(path, args.tokens, seed=index, scale=1.0 + (index % 4) * 0.5)
        paths.append(path)
    scales = ",".join(str(1.0 + (index % 4) * 0.5) for index in range(args.runs))
    tps = ",".join("8" if index < args.runs // 2 else "4" for index in range(args.runs))  # crossed with scale
    run_measured("analyze", str(paths[0]), "-f", "json")  # compile the kernels once, outside the timings

    singles = []
    for path in paths:
        seconds, peak = run_measured("analyze", str(path), "-f", "json")
        singles.append((seconds, peak))
    total = sum(seconds for seconds, _ in singles)
    print(f"analyze × {args.runs}: {total:.2f} s in all, peak RSS {max(p for _, p in singles) / 2**20:.0f} MiB each")
    named = [f"run{index}={path}" for index, path in enumerate(paths)]
    knobs = ["--knob", f"scale={scales}", "--knob", f"tp={tps}", "--workers", args.workers, "-f", "json"]
    seconds, peak = run_measured("runs", *named, *knobs)
    print(f"runs of {args.runs}: {seconds:.2f} s ({seconds / total:.2f}× the sum), peak RSS {peak / 2**20:.0f} MiB")
    with tempfile.TemporaryDirectory() as state:
        run_measured("runs", *named, *knobs, "--state-dir", state)
        again, peak_again = run_measured("runs", *named, *knobs, "--state-dir", state)
    print(f"runs again from --state-dir: {again:.2f} s, peak RSS {peak_again / 2**20:.0f} MiB")


def run_measured(*args: str) -> tuple[float, int]:
    """(seconds, peak RSS in bytes) of one CLI process."""
    command = [sys.executable, "-c", "from rollout_diag.cli import main; main()", *args]
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode not in (0, 3):
        raise SystemExit(f"{' '.join(args[:2])}…: exit {process.returncode}\n{process.stderr.read().decode()}")
    return seconds, usage.ru_maxrss * 1024  # Linux: KiB


if __name__ == "__main__":
    main()
