#!/usr/bin/env python3
"""Split a sequence-layout dump into a directory of one small file per step and rank, as a trainer's ranks write it
(``DumpWriter``'s directory mode: ``step=N/rank-R.parquet``): the input for timing directory reads against the
one-file read of the same rows.

    python benchmarks/split_dump.py /work/bench/100m.parquet /work/bench/w100 --ranks 8
    rollout-diag analyze /work/bench/w100

Each rank takes every ``ranks``-th row of a step, written with ``DumpWriter``'s Parquet options
(``rollout_diag.io.columns.parquet_options``: zstd, logprobs without a dictionary). The source is read a row group at
a time (bounded memory); a step that spans row groups gives each rank one file per row group it touches
(``rank-R.gG.parquet``). The schema's key-value metadata is dropped: a generator's metadata copied into every file
would make each footer hundreds of KB, which no trainer writes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rollout_diag.io.columns import parquet_options


def split(source: Path, out: Path, ranks: int, step_column: str = "step", compression: str = "zstd") -> int:
    """Write the directory; returns the number of files written."""
    parquet = pq.ParquetFile(source)
    written = 0
    for group in range(parquet.metadata.num_row_groups):
        table = parquet.read_row_group(group).replace_schema_metadata(None)
        for step in pc.unique(table[step_column]).to_pylist():
            part = table.filter(pc.equal(table[step_column], step))
            directory = out / f"step={step}"
            directory.mkdir(parents=True, exist_ok=True)
            for rank in range(ranks):
                rows = np.arange(rank, part.num_rows, ranks)
                if len(rows):
                    options = parquet_options(part.schema, compression)
                    pq.write_table(part.take(rows), directory / f"rank-{rank}.g{group}.parquet", **options)
                    written += 1
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path, help="a sequence-layout Parquet dump")
    parser.add_argument("out", type=Path, help="the directory to write (step=N/rank-R.gG.parquet)")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--step-column", default="step")
    parser.add_argument("--compression", default="zstd", help="Parquet codec (DumpWriter's default: zstd)")
    args = parser.parse_args()
    files = split(args.source, args.out, args.ranks, args.step_column, args.compression)
    print(f"{args.out}: {files} files")


if __name__ == "__main__":
    main()
