#!/usr/bin/env python3
"""The cost of ``--by``: ``analyze`` with the key families per group against a plain ``analyze`` (target ≤ 1.3×).

    python benchmarks/bench_groups.py --tokens 5000000 --groups 10

Writes a synthetic dump (``sample_data/make_synthetic.py``) with an ``env_name`` column of ``--groups`` values
drawn per row (so groups interleave inside every step and chunk, the costly case), then times, in-process and
alternately, ``analyze(path)`` and ``analyze(path, by=["env_name"])`` ``--repeat`` times each; prints the medians,
their ratio and CPU seconds per million tokens (process CPU time, less noisy than wall time on a shared machine).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def make_dump(tokens: int, groups: int, folder: Path) -> Path:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    base = folder / "base.parquet"
    subprocess.run(
        [sys.executable, str(ROOT / "sample_data" / "make_synthetic.py"), "--tokens", str(tokens), "--out", str(base)],
        check=True,
        capture_output=True,
    )
    table = pq.read_table(base)
    rng = np.random.default_rng(0)
    names = [f"env{i}" for i in range(groups)]
    table = table.append_column("env_name", pa.array(rng.choice(names, table.num_rows)))
    path = folder / "grouped.parquet"
    pq.write_table(table, path, row_group_size=4096)
    return path


def timed(function) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    function()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=5_000_000)
    parser.add_argument("--groups", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from rollout_diag import analyze

    with tempfile.TemporaryDirectory() as folder:
        path = make_dump(args.tokens, args.groups, Path(folder))
        analyze(path, device="cpu")  # warm-up: imports, numba/torch first calls, page cache
        plain, grouped = [], []
        for _ in range(args.repeat):
            plain.append(timed(lambda: analyze(path, device="cpu")))
            grouped.append(timed(lambda: analyze(path, device="cpu", by=["env_name"])))
        result = analyze(path, device="cpu", by=["env_name"])
    tokens = result.run.tokens
    for name, runs in (("plain", plain), (f"--by env_name ({len(result.groups)} groups)", grouped)):
        wall = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[1] for r in runs)
        print(f"{name:32s} wall {wall:7.2f} s   cpu {cpu / tokens * 1e6:6.3f} s per M model tokens")
    ratio_wall = statistics.median(r[0] for r in grouped) / statistics.median(r[0] for r in plain)
    ratio_cpu = statistics.median(r[1] for r in grouped) / statistics.median(r[1] for r in plain)
    print(f"ratio (grouped / plain): wall {ratio_wall:.3f}×, cpu {ratio_cpu:.3f}×  (target ≤ 1.3×)")


if __name__ == "__main__":
    main()
