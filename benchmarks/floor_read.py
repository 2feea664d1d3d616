#!/usr/bin/env python3
"""The read floor the speed targets are stated against (issue 20): pyarrow reads the five columns analyze needs
(step, sample_id, both logprobs, mask) row group by row group, threaded, and does nothing else.

    python benchmarks/floor_read.py DUMP.parquet

Time it as a whole process beside ``rollout-diag analyze DUMP.parquet`` (e.g. with ``/usr/bin/time -v`` or
hyperfine, paired runs). ``iter_batches`` with its default batch size is slower and uses far more memory: it is
not the floor.
"""

from __future__ import annotations

import sys

import pyarrow.parquet as pq

COLUMNS = ["step", "sample_id", "rollout_log_probs", "old_log_probs", "response_mask"]


def read(path: str) -> int:
    """Rows read: every row group of ``path``, the five columns, with pyarrow's threads."""
    parquet = pq.ParquetFile(path)
    present = [name for name in COLUMNS if name in parquet.schema_arrow.names]
    rows = 0
    for group in range(parquet.num_row_groups):
        rows += parquet.read_row_group(group, columns=present, use_threads=True).num_rows
    return rows


if __name__ == "__main__":
    print(read(sys.argv[1]))
