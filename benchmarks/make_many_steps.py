#!/usr/bin/env python3
"""Write a dump of many tiny steps: the shape of a token-layout dump whose step column is wrong (every row its
own step), the case where per-step state, not tokens, decides time and memory.

    python benchmarks/make_many_steps.py --steps 200000 --rows-per-step 1 --tokens-per-row 4 --out /tmp/many.parquet

Sequence layout (``step``, ``sample_id``, ``rollout_log_probs``, ``old_log_probs``, ``response_mask``), seeded.
Rows alternate single-turn (mask all 1) and two-round masks (an environment token inside); every 97th row has a
token with |δ| = 2 (catastrophic at the default threshold 1.0). Row groups of ``--row-group`` rows.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def table(first_step: int, steps: int, rows_per_step: int, tokens_per_row: int, rng: np.random.Generator) -> pa.Table:
    """Rows of steps ``first_step`` .. ``first_step + steps - 1``, ``rows_per_step`` rows each."""
    rows = steps * rows_per_step
    tokens = rows * tokens_per_row
    row_index = np.arange(rows) + first_step * rows_per_step
    rollout = -np.exp(rng.normal(-3.0, 1.5, tokens)).clip(1e-6, 30.0)
    trainer = np.minimum(rollout + rng.normal(0.0, 0.02, tokens), 0.0)
    catastrophic = np.flatnonzero(row_index % 97 == 0) * tokens_per_row
    trainer[catastrophic] = np.minimum(rollout[catastrophic] - 2.0, 0.0)
    mask = np.ones((rows, tokens_per_row), dtype=np.int8)
    if tokens_per_row >= 3:
        mask[row_index % 2 == 1, tokens_per_row // 2] = 0  # two rounds: model, environment, model
    mask = mask.ravel()
    rollout[mask == 0] = 0.0
    offsets = pa.array(np.arange(rows + 1, dtype=np.int32) * tokens_per_row)

    def lists(values: np.ndarray, kind: pa.DataType) -> pa.Array:
        return pa.ListArray.from_arrays(offsets, pa.array(values, type=kind))

    return pa.table(
        {
            "step": pa.array(np.repeat(np.arange(first_step, first_step + steps), rows_per_step), pa.int64()),
            "sample_id": pa.array([f"s{i}" for i in row_index.tolist()], pa.string()),
            "rollout_log_probs": lists(rollout.astype(np.float32), pa.float32()),
            "old_log_probs": lists(trainer.astype(np.float32), pa.float32()),
            "response_mask": lists(mask, pa.int8()),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--rows-per-step", type=int, default=1)
    parser.add_argument("--tokens-per-row", type=int, default=4)
    parser.add_argument("--row-group", type=int, default=65_536, help="rows per Parquet row group")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    steps_per_group = max(1, args.row_group // args.rows_per_step)
    first = table(0, min(steps_per_group, args.steps), args.rows_per_step, args.tokens_per_row, rng)
    with pq.ParquetWriter(args.out, first.schema) as writer:
        writer.write_table(first)
        for start in range(steps_per_group, args.steps, steps_per_group):
            count = min(steps_per_group, args.steps - start)
            writer.write_table(table(start, count, args.rows_per_step, args.tokens_per_row, rng))
    print(f"{args.out}: {args.steps} steps × {args.rows_per_step} rows × {args.tokens_per_row} tokens")


if __name__ == "__main__":
    main()
