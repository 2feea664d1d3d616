"""The numba engine's compiled per-chunk passes run on a chunk's numpy arrays, without torch: what the reader
computes for the chunks it reads ahead while the command still loads torch (``io/reader.py`` ``read_ahead``).

``KernelStats`` (``engine/kernelstats.py``) and the hint evidence (``metrics/hints.py``) use a chunk's
:class:`KernelPrepass` where it has one instead of running the same kernels on the same arrays again; a chunk without
one computes them when first read. The constants of those calls live in ``engine/quantities.py``, so both sides make
exactly one call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rollout_diag.engine.kernels import compiled
from rollout_diag.engine.quantities import (
    COPY_GAP,
    EXPONENT_MAX,
    EXPONENT_MIN,
    LOG_HALF,
    MOMENT_PAIRS,
    PROBABILITY_EDGES,
)

_LOG_EDGES = np.array([math.log(edge) for edge in PROBABILITY_EDGES])  # as metrics.hints.probability_bucket


@dataclass(frozen=True, eq=False)
class KernelPrepass:
    """One chunk's compiled passes: step groups, segment layout, the fused pass and the hint rows (numpy)."""

    steps: tuple[int, ...]  # the chunk's steps, ascending (``Chunk.groups.steps``)
    row_group: np.ndarray  # int64 [R]: each row's index into ``steps``
    layout: tuple[np.ndarray, ...]  # kernels.cpu.segment_layout: (raw start, model start, length, row, bucket, round)
    # kernels.cpu.segment_pass: sums, maxima, minima, moments, δ histogram, counts
    reductions: tuple[np.ndarray, ...]
    hints: tuple[np.ndarray, ...]  # the fused pass's hint rows: per row, buckets, turn sums, later rounds' sums


def step_groups(step: np.ndarray) -> tuple[tuple[int, ...], np.ndarray]:
    """(sorted distinct steps, each row's index among them): what ``torch.unique(sorted=True, return_inverse=True)``
    gives ``Chunk.groups``."""
    steps, row_group = np.unique(step, return_inverse=True)
    return tuple(steps.tolist()), row_group.astype(np.int64, copy=False).reshape(-1)


def layout(mask: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, ...]:
    return compiled().segment_layout(mask, np.ascontiguousarray(offsets))


def reductions(
    trainer: np.ndarray,
    rollout: np.ndarray,
    segments: tuple[np.ndarray, ...],
    rows: int,
    segment_group: np.ndarray,
    groups: int,
    probabilities: bool = True,
    float32: bool = False,
) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """The fused pass, the hint patterns with it (each token read once): ((sums, maxima, minima) [Q, S], moments of
    MOMENT_PAIRS [G, P, 6], δ histogram [G, B], COUNTS [N, S]) and the hint rows: per row the HINT_COLUMNS [R, 13],
    per step group and probability bucket [G, B, 6], the turn sums [G·2·TURN_OFFSETS, 3] and the later rounds' [3, G].
    Without ``probabilities`` the probability quantities' sums and extremes are 0 and there are no moments ([G, 0, 6]);
    ``float32``: the logprobs' bits are compared as float32 (``Chunk.float32``) (``kernels.cpu.segment_pass``)."""
    kernels = compiled()
    wanted = MOMENT_PAIRS if probabilities else ()
    pairs = np.array([[kernels.COLUMN[x], kernels.COLUMN[y]] for x, y in wanted], dtype=np.int64).reshape(-1, 2)
    raw, _, length, row, _, rounds = segments
    *fused, per_row, buckets, turns, later = kernels.segment_pass(
        trainer,
        rollout,
        raw,
        length,
        segment_group,
        groups,
        pairs,
        EXPONENT_MIN,
        EXPONENT_MAX - EXPONENT_MIN,
        row,
        rounds,
        rows,
        LOG_HALF,
        COPY_GAP,
        _LOG_EDGES,
        probabilities,
        float32,
    )
    return tuple(fused), (per_row, buckets, turns, later)


def prepass(
    step: np.ndarray,
    offsets: np.ndarray,
    trainer: np.ndarray,
    rollout: np.ndarray,
    mask: np.ndarray,
    float32: bool = False,
):
    """A chunk's :class:`KernelPrepass` from its arrays: ``trainer`` / ``rollout`` float64 with environment tokens
    zeroed and ``mask`` bool, as the reader's validation scan leaves them (``Chunk.trainer`` etc. as numpy);
    ``float32``: either column was float32 (``Chunk.float32``)."""
    steps, row_group = step_groups(step)
    segments = layout(mask, offsets)
    segment_group = row_group[segments[3]]
    fused, hints = reductions(trainer, rollout, segments, len(step), segment_group, len(steps), float32=float32)
    return KernelPrepass(steps=steps, row_group=row_group, layout=segments, reductions=fused, hints=hints)


def warm_up() -> None:
    """Load numba and the compiled passes (from numba's cache, or compiled now) by running :func:`prepass` on a tiny
    chunk: what the reader's first chunk would otherwise wait for."""
    mask = np.array([True, False, True])
    values = np.array([-0.5, 0.0, -1.0])
    prepass(np.zeros(2, dtype=np.int64), np.array([0, 2, 3], dtype=np.int64), values, values.copy(), mask)
