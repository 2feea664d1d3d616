"""Padded batches the way trainers hold them."""

from __future__ import annotations

import numpy as np
import torch


def padded_batch(
    seed: int = 0,
    *,
    rows: int = 12,
    width: int = 40,
    dtype: torch.dtype = torch.float32,
    empty_row: bool = True,
    side: str = "right",
):
    """A [B, L] batch as a trainer holds it: multi-turn masks (environment runs of mask 0), padding after
    (or before, ``side="left"``) each row with fill values that must never count, one row without a
    model token. Returns (old_log_probs, rollout_log_probs, response_mask, lengths, rows as lists)."""
    rng = np.random.default_rng(seed)
    old = np.full((rows, width), -99.0)  # padding fill: would wreck any metric it entered
    rollout = np.full((rows, width), 3.0)  # positive: the reader would reject a row that kept it
    mask = np.zeros((rows, width), dtype=np.int64)
    lengths = rng.integers(1, width + 1, rows)
    plain = []
    for row in range(rows):
        n = int(lengths[row])
        trainer = -rng.exponential(1.0, n)
        inference = np.minimum(trainer + rng.normal(0.0, 0.3, n), 0.0)
        row_mask = (rng.random(n) > 0.25).astype(np.int64)
        row_mask[int(rng.integers(0, n))] = 1
        if empty_row and row == 3:
            row_mask[:] = 0
        # the values the tensor dtype can hold, so the float64 reference sees what the trainer holds
        trainer = torch.tensor(trainer).to(dtype).double().numpy()
        inference = torch.tensor(inference).to(dtype).double().numpy()
        span = slice(0, n) if side == "right" else slice(width - n, width)
        old[row, span], rollout[row, span], mask[row, span] = trainer, inference, row_mask
        plain.append((trainer.tolist(), inference.tolist(), row_mask.tolist()))
    as_tensor = lambda values: torch.tensor(values).to(dtype)  # noqa: E731
    return as_tensor(old), as_tensor(rollout), torch.tensor(mask), torch.tensor(lengths), plain
