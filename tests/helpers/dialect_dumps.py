"""Small parquet dumps for the dialect tests: steps of rows (trainer, rollout, mask, and optional per-row columns)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def write_dump(path: Path, steps: dict[int, list[dict]], row_group_size: int) -> None:
    """Rows as dicts of ``trainer``, ``rollout`` (float32 arrays), ``mask``; ``advantage`` and ``env`` (prime-rl's
    per-row columns, written together when any row has an advantage) and ``prompt_len`` (AReaL's masked_token_ratio)
    when a row has them."""
    records = [(step, index, row) for step, rows in steps.items() for index, row in enumerate(rows)]
    table = pa.table(
        {
            "step": pa.array([s for s, _, _ in records], pa.int64()),
            "sample_id": pa.array([f"{s}-{i}" for s, i, _ in records]),
            "rollout_log_probs": pa.array([r["rollout"].tolist() for *_, r in records], pa.list_(pa.float32())),
            "old_log_probs": pa.array([r["trainer"].tolist() for *_, r in records], pa.list_(pa.float32())),
            "response_mask": pa.array([r["mask"].tolist() for *_, r in records], pa.list_(pa.int8())),
            **(
                {
                    "advantages": pa.array([r.get("advantage") for *_, r in records], pa.float64()),
                    "env_name": pa.array([r.get("env") for *_, r in records], pa.string()),
                }
                if any("advantage" in r for *_, r in records)
                else {}
            ),
            **(
                {"prompt_len": pa.array([r.get("prompt_len") for *_, r in records], pa.int64())}
                if any("prompt_len" in r for *_, r in records)
                else {}
            ),
        }
    )
    pq.write_table(table, path, row_group_size=row_group_size)


def one_step(path: Path, rows: list[tuple[list[float], list[float], list[int]]]) -> Path:
    steps = {
        0: [
            {"trainer": np.array(a, np.float32), "rollout": np.array(r, np.float32), "mask": np.array(m, np.int8)}
            for a, r, m in rows
        ]
    }
    write_dump(path, steps, row_group_size=10)
    return path
