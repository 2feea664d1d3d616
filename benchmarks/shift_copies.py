#!/usr/bin/env python3
"""Write copies of a dump whose steps follow one another: copy i holds the source's rows with ``step + i·span`` (span:
the source's largest step + 1). Ten copies of the 100M dump are a 1G-token run of ten times the steps, read in order,
for the flat-memory benchmark (copies of one file would repeat steps 0…N in every file: another path of the reader).

    python benchmarks/shift_copies.py /work/bench/100m.parquet /work/bench/g1 --copies 10
    rollout-diag analyze /work/bench/g1

Each copy is ``copy-<i>.parquet`` (natural order: copy-10 after copy-9), written a row group at a time with the
source's row groups and codec (``DumpWriter``'s column encodings; the schema's metadata dropped), so memory stays at
one row group.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rollout_diag.io.columns import parquet_options


def shifted_copies(source: Path, out: Path, copies: int, step_column: str = "step") -> list[Path]:
    parquet = pq.ParquetFile(source)
    span = 1 + max(
        parquet.read_row_group(group, columns=[step_column]).column(0).to_numpy().max()
        for group in range(parquet.metadata.num_row_groups)
    )
    codec = parquet.metadata.row_group(0).column(0).compression.lower()
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for copy in range(copies):
        path = out / f"copy-{copy}.parquet"
        schema = parquet.schema_arrow.remove_metadata()  # a generator's ground truth is the source's, not the copy's
        with pq.ParquetWriter(path, schema, **parquet_options(schema, codec)) as writer:
            for group in range(parquet.metadata.num_row_groups):
                table = parquet.read_row_group(group)
                index = table.schema.get_field_index(step_column)
                steps = pc.add(table.column(index), pa.scalar(int(copy * span), table.schema.field(index).type))
                writer.write_table(table.set_column(index, step_column, steps).replace_schema_metadata(None))
        written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path, help="a Parquet dump with a step column")
    parser.add_argument("out", type=Path, help="the directory to write (copy-<i>.parquet)")
    parser.add_argument("--copies", type=int, default=10)
    parser.add_argument("--step-column", default="step")
    args = parser.parse_args()
    paths = shifted_copies(args.source, args.out, args.copies, args.step_column)
    print(f"{args.out}: {len(paths)} files")


if __name__ == "__main__":
    main()
