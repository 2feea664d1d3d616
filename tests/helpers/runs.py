"""Runs for ``rollout-diag runs`` tests: dumps whose knobs plant known effects on δ.

Every token's δ = rollout − trainer is σ·scale·z with z ~ N(0, 1) (trainer logprobs far enough below 0 that the
rollout side stays ≤ 0), so the planted run-level values are known in closed form: mean |δ| = σ·scale·√(2/π) and
k3_kl = E[exp δ − δ − 1] = exp(σ²·scale²/2) − 1 (a normal's moment generating function). ``late_scale`` multiplies
δ again from step ``late_from`` on. Every row has ``length`` model tokens, so each step weighs the same.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from tests.helpers.dumps import seq_row, write_sequence_dump

SIGMA = 0.05


def write_run(
    path: Path,
    seed: int,
    *,
    scale: float = 1.0,
    late_scale: float = 1.0,
    late_from: int | None = None,
    steps: int = 20,
    rows_per_step: int = 32,
    length: int = 64,
) -> Path:
    """One run's dump (one Parquet file, one row group per 4 steps); returns the path."""
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(steps):
        factor = scale * (late_scale if late_from is not None and step >= late_from else 1.0)
        for index in range(rows_per_step):
            trainer = -1.0 - rng.exponential(1.0, length)
            rollout = trainer + SIGMA * factor * rng.standard_normal(length)
            rows.append(
                seq_row(
                    step,
                    f"s{step}-{index}",
                    np.float32(np.minimum(rollout, 0.0)).astype(np.float64).tolist(),
                    np.float32(trainer).astype(np.float64).tolist(),
                )
            )
    return write_sequence_dump(path, rows, row_group_size=4 * rows_per_step)


def k3_of(scale: float) -> float:
    """E[k3] at δ ~ N(0, (σ·scale)²)."""
    return math.expm1((SIGMA * scale) ** 2 / 2.0)
