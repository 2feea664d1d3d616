"""Dumps whose mismatch moves between the early and the late steps for one planted reason (tests of the drift split).

Each token's δ is drawn with a scale that depends on what the scenario plants: the row's length class (short rows
match well, long rows less), the token's rollout probability (low-p tokens mismatch more), or the step alone. The
other properties stay put, so the planted factor is the only one whose mix (or, for ``within``, no factor's mix)
moves.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from helpers.dumps import seq_row, write_sequence_dump

STEPS = 10
ROWS_PER_STEP = 40
SHORT, LONG = 16, 256  # tokens of a short and a long row (log2 buckets 5 and 9)


def _row(rng: np.random.Generator, step: int, index: int, length: int, low_share: float, scale_of) -> dict:
    low = rng.random(length) < low_share
    rollout = np.where(low, -rng.uniform(5.0, 7.0, length), -rng.uniform(0.6, 1.0, length))
    delta = rng.normal(0.0, 1.0, length) * scale_of(low, length)
    trainer = np.minimum(rollout + delta, 0.0)  # a logprob ≤ 0 (δ > 0.6 is a 6σ draw at most)
    return seq_row(
        step,
        f"s{step}-{index}",
        np.float32(rollout).astype(np.float64).tolist(),
        np.float32(trainer).astype(np.float64).tolist(),
    )


def write_scenario(path: Path, scenario: str, seed: int = 0) -> Path:
    """A dump of STEPS steps: ``length`` (the share of long rows grows from 5 % to 95 %; long rows' tokens have 10× the
    δ of short rows'), ``probability`` (the share of low-probability tokens grows from 10 % to 50 %; their δ is 10×),
    ``within`` (every token's δ scale grows 3× over the steps, nothing else moves) or ``flat`` (nothing moves)."""
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(STEPS):
        progress = step / (STEPS - 1)
        long_share = 0.05 + 0.9 * progress if scenario == "length" else 0.5
        low_share = 0.1 + 0.4 * progress if scenario == "probability" else 0.2
        growth = 1.0 + 2.0 * progress if scenario == "within" else 1.0

        def scale_of(low: np.ndarray, length: int, growth: float = growth) -> np.ndarray:
            if scenario == "length":
                return np.full(low.shape, 0.1 if length == LONG else 0.01)
            if scenario == "probability":
                return np.where(low, 0.2, 0.02)
            return np.full(low.shape, 0.03 * growth)

        for index in range(ROWS_PER_STEP):
            length = LONG if index < round(long_share * ROWS_PER_STEP) else SHORT
            if scenario != "length":
                length = int(rng.integers(32, 96))
            rows.append(_row(rng, step, index, length, low_share, scale_of))
    return write_sequence_dump(path, rows)
