"""Small many-step runs: rows, chunks of steps and their state tables."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np

from helpers import tables
from helpers.dumps import seq_row
from rollout_diag.engine.state import Ragged, StateTable


def tiny_rows(steps: int, seed: int = 3) -> list[dict]:
    """One row of 4 tokens per step; odd steps have two rounds (an environment token inside); every 7th a
    catastrophic token."""
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(steps):
        rollout = np.float32(-rng.exponential(0.5, 4)).astype(np.float64)
        trainer = np.minimum(rollout + np.float32(rng.normal(0.0, 0.05, 4)), 0.0)
        if step % 7 == 0:
            trainer[1] = float(np.float32(rollout[1] - 2.0))
        mask = [1, 0, 1, 1] if step % 2 else [1, 1, 1, 1]
        rows.append(seq_row(step, f"s{step}", rollout.tolist(), trainer.tolist(), mask))
    return rows


# the families of helpers.tables that _chunk fills, in its order
REDUCTIONS = {
    name: tables.REDUCTIONS[name]
    for name in ("count", "high", "low", "spread", "pair", "buckets", "bucket_max", "bucket_moments", "rows")
}


def _moments(rng: random.Random, shape: tuple[int, ...]) -> np.ndarray:
    out = np.zeros((*shape, 6))
    for index in np.ndindex(*shape):
        n = rng.choice([0, 0, 1, 3])
        if n:
            out[index] = [
                n,
                rng.uniform(-2, 2),
                rng.uniform(0, 1),
                rng.uniform(0, 3),
                rng.uniform(0, 3),
                rng.uniform(-1, 1),
            ]
    return out


def _chunk(rng: random.Random) -> tuple[list[int], dict]:
    """A chunk's partial state: sorted distinct steps (negative ones too), mostly identity-valued buckets."""
    steps = sorted(rng.sample(range(-3, 9), rng.randint(1, 4)))
    groups = len(steps)

    def sparse(shape, fill, draw):
        out = np.full((groups, *shape), fill)
        for index in np.ndindex(groups, *shape):
            if rng.random() < 0.2:
                out[index] = draw()
        return out

    rows = rng.randint(0, 5)
    partial = {
        "count": np.array([float(rng.randint(0, 5)) for _ in steps]),
        "high": np.array([rng.choice([-math.inf, rng.uniform(-5, 5)]) for _ in steps]),
        "low": np.array([rng.choice([math.inf, rng.uniform(-5, 5)]) for _ in steps]),
        "spread": _moments(rng, (groups,)),
        "pair": np.array([[rng.uniform(-1, 1), 0.0] for _ in steps]),
        "buckets": sparse((20,), 0.0, lambda: rng.uniform(-3, 3)),
        "bucket_max": sparse((12,), -math.inf, lambda: rng.uniform(-3, 3)),
        "bucket_moments": _moments(rng, (groups, 10)),
        "rows": Ragged(
            np.array([[rng.random(), rng.random(), rng.random()] for _ in range(rows)]).reshape(rows, 3),
            np.array([rng.randrange(groups) for _ in range(rows)], dtype=np.int64),
        ),
    }
    return steps, partial


def _table(chunks: list[tuple[list[int], dict]]) -> StateTable:
    table = StateTable.empty(REDUCTIONS)
    for steps, partial in chunks:
        table = table.merged(StateTable.from_groups(REDUCTIONS, steps, partial))
    return table


SAMPLE = Path(__file__).resolve().parents[2] / "sample_data" / "textgenrnn_bf16_vs_fp32.parquet"
