"""Random rows, their dump and the float64 reference's metrics, and how close the library must come."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers.reference import (
    count_metrics,
    debug_metrics,
    offpolicy_metrics,
    rollout_kl_metrics,
    round_count_metrics,
    round_metrics,
)

RTOL = 1e-9  # library sums in another order than the reference; both are float64


def random_rows(rng: np.random.Generator, count: int, max_len: int = 40) -> list[dict]:
    """Rows with multi-round masks, some empty rows, some heavy-tailed mismatch; values exactly float32."""
    rows = []
    for index in range(count):
        length = int(rng.integers(0, max_len))
        mask = np.ones(length, dtype=np.int8)
        for _ in range(int(rng.integers(0, 4))):  # environment segments cut the row into rounds
            start = int(rng.integers(0, max(length, 1)))
            mask[start : start + int(rng.integers(1, 6))] = 0
        if rng.random() < 0.1:
            mask[:] = 0  # a row with no model token
        rollout = -rng.exponential(1.0, length)
        delta = rng.normal(0, 0.05, length) + (rng.random(length) < 0.03) * rng.normal(0, 3, length)
        trainer = np.minimum(rollout + delta, 0.0)
        rows.append(
            {
                "sample_id": f"s{index}",
                "rollout": rollout.astype(np.float32),
                "trainer": trainer.astype(np.float32),
                "mask": mask,
            }
        )
    return rows


def write_dump(path, steps: dict[int, list[dict]], row_group_size: int | None = None) -> None:
    records = [(step, row) for step, rows in steps.items() for row in rows]
    table = pa.table(
        {
            "step": pa.array([s for s, _ in records], pa.int64()),
            "sample_id": pa.array([f"{s}-{r['sample_id']}" for s, r in records]),
            "rollout_log_probs": pa.array([r["rollout"].tolist() for _, r in records], pa.list_(pa.float32())),
            "old_log_probs": pa.array([r["trainer"].tolist() for _, r in records], pa.list_(pa.float32())),
            "response_mask": pa.array([r["mask"].tolist() for _, r in records], pa.list_(pa.int8())),
        }
    )
    pq.write_table(table, path, row_group_size=row_group_size)


def as_reference_rows(rows: list[dict]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    return [
        (r["trainer"].astype(np.float64), r["rollout"].astype(np.float64), r["mask"].astype(np.float64)) for r in rows
    ]


def reference_metrics(rows: list[dict]) -> dict[str, float]:
    ref_rows = as_reference_rows(rows)
    return {
        **offpolicy_metrics(ref_rows),
        **debug_metrics(ref_rows),
        **rollout_kl_metrics(ref_rows),
        **round_metrics(ref_rows, max_rounds=3),
        **round_count_metrics(ref_rows, max_rounds=3),
        # the dump is float32 (write_dump): its logprobs compare as float32; diag/ keys are left to their own tests
        **{k: v for k, v in count_metrics(ref_rows, float32=True).items() if not k.startswith("diag/")},
    }


def assert_metrics_match(actual: dict[str, float], expected: dict[str, float]) -> None:
    # Diagnostics of our own (diag/…) have no reference here; they are tested in tests/metrics/test_localize.py.
    ours = {k: v for k, v in actual.items() if not k.startswith("diag/")}
    assert set(ours) == set(expected)
    for name, value in expected.items():
        if math.isnan(value):
            assert math.isnan(ours[name]), name
        else:
            assert ours[name] == pytest.approx(value, rel=RTOL, abs=1e-12), name
