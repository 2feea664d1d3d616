"""The chunk's model-token view: the CPU (numpy) and device (torch) constructions agree exactly."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_diag.io.chunk import Chunk, _model_tokens_numpy, _model_tokens_torch


def chunk_of(lengths: list[int], mask: list[bool], seed: int) -> Chunk:
    rng = np.random.default_rng(seed)
    tokens = sum(lengths)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return Chunk(
        step=torch.zeros(len(lengths), dtype=torch.int64),
        offsets=torch.from_numpy(offsets),
        trainer=torch.from_numpy(-rng.exponential(size=tokens)),
        rollout=torch.from_numpy(-rng.exponential(size=tokens)),
        mask=torch.tensor(mask, dtype=torch.bool),
        sample_id=[str(i) for i in range(len(lengths))],
        file=["f"] * len(lengths),
        file_row=list(range(len(lengths))),
    )


@st.composite
def layouts(draw):
    lengths = draw(st.lists(st.integers(0, 12), min_size=1, max_size=8))
    mask = draw(st.lists(st.booleans(), min_size=sum(lengths), max_size=sum(lengths)))
    return lengths, mask, draw(st.integers(0, 1000))


@settings(max_examples=200, deadline=None)
@given(layouts())
def test_numpy_and_torch_model_tokens_agree(layout):
    chunk = chunk_of(*layout)
    fast, reference = _model_tokens_numpy(chunk), _model_tokens_torch(chunk)
    for name in ("trainer", "rollout", "log_ratio", "row", "position"):
        assert np.array_equal(getattr(fast, name), getattr(reference, name).numpy()), name


def test_model_tokens_by_hand():
    # rows of 3, 0 and 4 tokens; mask 1 0 1 | – | 0 1 1 0: model tokens at positions 0, 2 of row 0, 1, 2 of row 2
    chunk = chunk_of([3, 0, 4], [True, False, True, False, True, True, False], seed=1)
    model = _model_tokens_numpy(chunk)
    assert model.row.tolist() == [0, 0, 2, 2]
    assert model.position.tolist() == [0, 2, 1, 2]
    assert model.trainer.tolist() == chunk.trainer[[0, 2, 4, 5]].tolist()
