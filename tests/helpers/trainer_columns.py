"""Dumps whose rows carry the trainer's own columns (reward, advantage, entropy, a GRPO group id) with a planted row
mismatch, for the trainer-column relations (rollout_diag/metrics/association.py) and their report section."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def write_rows(path: Path, mismatch: list[float], **columns: list) -> Path:
    """One row per value of ``mismatch``: 3 model tokens, trainer −1, rollout −1 − m, so row |log-ppl diff| = m
    exactly; ``columns``: extra per-row columns (reward, advantage, uid, …); ``step`` defaults to 0."""
    rows = []
    for index, shift in enumerate(mismatch):
        row = {
            "step": 0,
            "sample_id": f"s{index}",
            "rollout_log_probs": [-1.0 - shift] * 3,
            "old_log_probs": [-1.0] * 3,
            "response_mask": [1, 1, 1],
        }
        row.update({name: values[index] for name, values in columns.items()})
        rows.append(row)
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=7)
    return path


def planted(tmp_path: Path, rows: int = 600, seed: int = 0) -> Path:
    """Row mismatch that rises with reward (ρ ≈ 0.8), advantage = reward, an unrelated entropy; groups of 6."""
    generator = np.random.default_rng(seed)
    reward = generator.normal(size=rows)
    mismatch = np.exp(reward + 0.6 * generator.normal(size=rows)) * 1e-3
    return write_rows(
        tmp_path / "planted.parquet",
        mismatch.tolist(),
        reward=reward.tolist(),
        advantage=reward.tolist(),
        entropy=generator.uniform(0, 2, rows).tolist(),
        group_id=[f"g{i // 6}" for i in range(rows)],
    )
