"""The per-chunk engines: token quantities computed once per chunk, and their sums over *segments*.

A segment is a maximal run of model tokens that share a row, a multi-turn round and a log2 position
bucket. Every additive statistic of every family (per row, per step, per round, per position bucket) is a
sum of segment sums, and segments are contiguous, so one sequential reduction per quantity
(``reduceat``) replaces a scatter over millions of tokens. There are about rows × (rounds + log2 length)
segments: thousands, not millions.

Quantities are cached on the chunk (``chunk.cache``), so families and presets share one computation.
"""

from __future__ import annotations

from rollout_diag.engine.choice import kernel_for
from rollout_diag.engine.chunkstats import (
    ChunkArrays,
    ChunkStats,
    ModelTokenArrays,
    PerToken,
    RegroupedStats,
    StepGroupArrays,
    TokenCaches,
    named,
    position_bucket,
    reduce_runs,
)
from rollout_diag.engine.kernelstats import KernelStats
from rollout_diag.engine.quantities import SHARED_QUANTITIES

__all__ = [
    "ChunkArrays",
    "ChunkStats",
    "KernelStats",
    "ModelTokenArrays",
    "PerToken",
    "RegroupedStats",
    "StepGroupArrays",
    "TokenCaches",
    "named",
    "position_bucket",
    "prepare",
    "reduce_runs",
    "stats",
]


def stats(chunk: ChunkArrays) -> ChunkStats:
    """The shared per-chunk computation (created on first use): the numba kernels' for a CPU chunk unless the
    torch engine is chosen (``engine/kernels/``; the reader's choice for the whole input, ``Chunk.engine``), the
    device-generic torch engine otherwise."""
    found = chunk.cache.get("stats")
    if found is None:
        numba = chunk.engine == "numba" if chunk.engine is not None else kernel_for(chunk.device_type)
        engine = KernelStats if numba else ChunkStats
        found = chunk.cache["stats"] = engine(chunk)
    return found


def prepare(chunk: ChunkArrays, quantities: tuple[str, ...] = SHARED_QUANTITIES, probabilities: bool = True) -> None:
    """Build ahead of the families what they read first: model tokens, segments, rows, step groups, and the given
    token quantities with their segment sums. The reader runs this in its thread, so on a machine with two cores
    or more it overlaps the previous chunk's arithmetic instead of adding to it. ``probabilities=False``: the
    families read none of PROBABILITIES (no debug family), so the numba engine's fused pass leaves them out (their
    reductions, if read after all, are then computed from the tokens, as for a quantity outside the pass)."""
    stats(chunk).prepare(quantities, probabilities)
