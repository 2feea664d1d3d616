"""Random chunks and layouts (hypothesis) for the kernels, the bundled samples, and two documents that must agree."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import strategies as st

from rollout_diag.io.chunk import Chunk

RTOL = 1e-12


SAMPLES = sorted((Path(__file__).resolve().parents[2] / "sample_data").glob("*.parquet"))


def chunk_of(lengths: list[int], mask: list[bool], steps: list[int], seed: int, scale: float = 0.5) -> Chunk:
    """A chunk as the reader builds it (values under mask 0 zeroed), δ spread over many binary exponents."""
    rng = np.random.default_rng(seed)
    tokens = sum(lengths)
    mask_array = np.array(mask, dtype=bool)
    trainer = -rng.exponential(1.0, tokens)
    delta = rng.normal(0.0, scale, tokens) * np.exp2(rng.integers(-24, 4, tokens))
    delta[rng.random(tokens) < 0.05] = 0.0
    rollout = trainer - delta
    # the hint patterns: exact zeros on one side, exact copies of the neighbour's value on either side
    pick = rng.random(tokens)
    rollout[pick < 0.04] = 0.0
    trainer[(pick >= 0.04) & (pick < 0.06)] = 0.0
    rollout = np.minimum(rollout, 0.0)
    copy = np.flatnonzero((pick >= 0.06) & (pick < 0.1))
    copy = copy[copy > 0]
    rollout[copy] = rollout[copy - 1]
    trainer[copy[: len(copy) // 2]] = trainer[copy[: len(copy) // 2] - 1]
    return Chunk(
        step=torch.tensor(steps, dtype=torch.int64),
        offsets=torch.tensor(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)),
        trainer=torch.from_numpy(np.where(mask_array, trainer, 0.0)),
        rollout=torch.from_numpy(np.where(mask_array, rollout, 0.0)),
        mask=torch.from_numpy(mask_array),
        sample_id=[str(i) for i in range(len(lengths))],
        file=["memory"] * len(lengths),
        file_row=list(range(len(lengths))),
    )


@st.composite
def layouts(draw):
    """Rows of 0–300 tokens (long rows cross numpy's 128-value pairwise blocks), multi-turn masks (runs of model
    and environment tokens), empty rows, 1–3 steps in any row order (non-contiguous step groups)."""
    rows = draw(st.integers(1, 8))
    lengths = draw(st.lists(st.integers(0, 300), min_size=rows, max_size=rows))
    mask: list[bool] = []
    for length in lengths:
        runs = draw(st.lists(st.integers(1, 40), min_size=1, max_size=6))
        value = draw(st.booleans())
        row: list[bool] = []
        while len(row) < length:
            for run in runs:
                row += [value] * run
                value = not value
        mask += row[:length]
    steps = draw(st.lists(st.integers(0, 2), min_size=rows, max_size=rows))
    return lengths, mask, steps, draw(st.integers(0, 10_000))


def assert_close(numba_value: float, torch_value: float, where: str) -> None:
    """Within 1e-12 relative; NaN matches NaN."""
    if math.isnan(torch_value):
        assert math.isnan(numba_value), where
    else:
        assert numba_value == pytest.approx(torch_value, rel=RTOL, abs=1e-300), where


def assert_same_document(
    numba_doc, torch_doc, where: str = "", close=assert_close, skipped=("elapsed_seconds", "engine")
) -> None:
    """Two JSON documents equal: every float as ``close(numba, torch, where)`` says (by default within 1e-12 relative,
    NaN matching NaN), every other value exact; the keys in ``skipped`` are not compared."""
    if isinstance(torch_doc, dict):
        assert isinstance(numba_doc, dict) and set(numba_doc) == set(torch_doc), where
        for key in torch_doc:
            if key not in skipped:
                assert_same_document(numba_doc[key], torch_doc[key], f"{where}/{key}", close, skipped)
    elif isinstance(torch_doc, list):
        assert isinstance(numba_doc, list) and len(numba_doc) == len(torch_doc), where
        for index, (mine, theirs) in enumerate(zip(numba_doc, torch_doc, strict=True)):
            assert_same_document(mine, theirs, f"{where}[{index}]", close, skipped)
    elif isinstance(torch_doc, float) and not isinstance(numba_doc, bool):
        close(numba_doc, torch_doc, where)
    else:
        assert numba_doc == torch_doc, where
