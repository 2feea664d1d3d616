"""The compiled segment layout (engine/kernels/cpu.py ``segment_layout``) against a plain Python one written
from its definition: segments are maximal runs of model tokens (mask 1) within a row, cut where the row position
reaches a power of two (a new position bucket); a row's rounds are its runs. The kernel reads a run's inside eight
mask bytes at a time, so the cases here put run ends on, before and after word boundaries, rows that start off a
word, and runs of hundreds of tokens."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_diag.engine.kernels import compiled


def reference_layout(mask: list[bool], offsets: list[int]) -> list[tuple[int, int, int, int, int, int]]:
    """(raw start, model start, length, row, bucket, round) of each segment, token by token."""
    segments: list[list[int]] = []
    model = 0
    for row in range(len(offsets) - 1):
        lo, hi = offsets[row], offsets[row + 1]
        rounds = -1
        for t in range(lo, hi):
            if not mask[t]:
                continue
            position = t - lo
            bucket = position.bit_length()  # 0 → 0, 1 → 1, 2–3 → 2, 4–7 → 3, …
            opens_run = t == lo or not mask[t - 1]
            rounds += opens_run
            if opens_run or bucket != segments[-1][4]:
                segments.append([t, model, 0, row, bucket, rounds])
            segments[-1][2] += 1
            model += 1
    return [tuple(segment) for segment in segments]


def compiled_layout(mask: list[bool], offsets: list[int]) -> list[tuple[int, ...]]:
    arrays = compiled().segment_layout(np.array(mask, dtype=np.bool_), np.array(offsets, dtype=np.int64))
    return list(zip(*(column.tolist() for column in arrays), strict=True))


@st.composite
def masks(draw):
    """Rows of 0–400 tokens made of runs of 1–300 tokens (long runs cross many eight-byte words)."""
    lengths = draw(st.lists(st.integers(0, 400), min_size=1, max_size=6))
    mask: list[bool] = []
    for length in lengths:
        value = draw(st.booleans())
        row: list[bool] = []
        while len(row) < length:
            row += [value] * draw(st.integers(1, 300))
            value = not value
        mask += row[:length]
    return mask, [0, *np.cumsum(lengths).tolist()]


@settings(max_examples=200, deadline=None)
@given(masks())
def test_layout_equals_the_definition(case):
    mask, offsets = case
    assert compiled_layout(mask, offsets) == reference_layout(mask, offsets)


def test_runs_ending_on_and_beside_word_boundaries():
    # a row starting at token 3 (off a word), runs whose last token is at 7, 8, 15, 16, 17 and the row's end
    for end in (5, 8, 9, 16, 17, 23, 24, 25, 64):
        mask = [False] * 3 + [True] * end + [False] + [True] * 40
        offsets = [0, 1, len(mask)]  # row 0: one environment token; row 1 starts at token 1
        assert compiled_layout(mask, offsets) == reference_layout(mask, offsets), end


def test_every_token_a_model_token():
    mask = [True] * 1000
    offsets = [0, 1, 9, 10, 500, 1000]
    assert compiled_layout(mask, offsets) == reference_layout(mask, offsets)
