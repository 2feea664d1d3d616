"""The fused pass's extra work against what it replaced, bit for bit: its hint rows against a separate compiled hint
pass (``separate_hint_rows`` below, the reference), its δ histogram bins against ``metrics.localize.delta_bin``, and
the read-ahead's chunks against chunks that compute their own, over random dumps and chunkings."""

from __future__ import annotations

import math
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from helpers.kernel import chunk_of, layouts
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

from rollout_diag.drivers import passes
from rollout_diag.engine import quantities
from rollout_diag.engine.choice import use_engine
from rollout_diag.engine.kernels import compiled
from rollout_diag.engine.kernels import prepass as kernel_prepass
from rollout_diag.engine.kernels.cpu import _exact_zero, _k3_pair, _next_pair, _probability_bucket
from rollout_diag.engine.stats import KernelStats
from rollout_diag.metrics.localize import DELTA_BINS, delta_bin


def arrays(chunk):
    return chunk.trainer.numpy(), chunk.rollout.numpy(), chunk.mask.numpy(), chunk.offsets.numpy(), chunk.step.numpy()


def assert_bits_equal(mine: np.ndarray, theirs: np.ndarray, what: str) -> None:
    assert mine.shape == theirs.shape, what
    assert np.array_equal(mine.view(np.uint8), theirs.view(np.uint8)), what  # bit for bit: -0.0 and 0.0 differ


@njit(cache=False, nogil=True, error_model="numpy")
def separate_hint_rows(
    trainer: np.ndarray,
    rollout: np.ndarray,
    raw: np.ndarray,
    length: np.ndarray,
    row: np.ndarray,
    rounds: np.ndarray,
    rows: int,
    segment_group: np.ndarray,
    groups: int,
    clip: float,
    log_half: float,
    gap: float,
    log_edges: np.ndarray,
):
    """The token patterns of ``metrics.hints`` in one pass: per row the HINT_COLUMNS (float64 [R, 13]), per step group
    and rollout-probability bucket (the number of ``log_edges`` above r) [tokens, Σ|δ|, Σy, Σy², Σδ, Σk3] ([G, B, 6]),
    y = min(|δ|, clip). Sums run in token order, as the torch engine's index_add and bincount do. The engine takes
    these from ``kernels.cpu.segment_pass``, which does the same per token inside its fused traversal (leaves of a
    pairwise tree, values first on SIMD lanes); this pass, a plain loop over the segments, is the reference the fused
    one must equal bit for bit. The per-token patterns are the kernels' own inline helpers: what is checked here is
    the fusion (order, carry across leaves and segments); the patterns themselves are checked against a plain float64
    reference in tests/decisions/test_hints.py."""
    out = np.zeros((rows, 13))
    buckets = np.zeros((groups, log_edges.shape[0] + 1, 6))
    segments = raw.shape[0]
    prev_zero = False
    prev_counted = False
    for s in range(segments):
        i, g = row[s], segment_group[s]
        opens = s == 0 or row[s - 1] != i or rounds[s - 1] != rounds[s]
        continues = s + 1 < segments and row[s + 1] == i and rounds[s + 1] == rounds[s]
        row_ends = s + 1 == segments or row[s + 1] != i
        lo, n = raw[s], length[s]
        # the row's running sums of the per-token columns in registers over the segment (same additions, same order)
        zeros, zero_runs, shift_next, shift_prev, copied = out[i, 10], out[i, 11], out[i, 8], out[i, 9], out[i, 12]
        into = buckets[g]
        for k in range(n):
            t = lo + k
            a, r = trainer[t], rollout[t]
            ad = abs(a - r)
            y = min(ad, clip)
            y2 = y * y
            _probability_bucket(into, r, ad, y, a - r, _k3_pair(a - r)[0], log_edges)
            first = opens and k == 0
            if first:
                out[i, 0] += y
                out[i, 1] += y2
                prev_zero = False
            zeros, zero_runs, prev_zero, prev_counted = _exact_zero(
                a, r, log_half, zeros, zero_runs, prev_zero, prev_counted
            )
            if k == n - 1 and not continues:  # the round's last token
                out[i, 7] += ad
                if row_ends:
                    out[i, 2] = y
                    out[i, 3] = y2
                    if first:
                        out[i, 4] = 1.0
                        out[i, 5] = y
                        out[i, 6] = y2
                continue
            shift_next, shift_prev, copied = _next_pair(  # with the next token of the round
                a, r, trainer[t + 1], rollout[t + 1], gap, shift_next, shift_prev, copied
            )
        out[i, 10], out[i, 11], out[i, 8], out[i, 9], out[i, 12] = zeros, zero_runs, shift_next, shift_prev, copied
    return out, buckets


def fused_and_separate(trainer, rollout, mask, offsets, step):
    """The fused pass's (reductions, hint rows) of a chunk's arrays, its hint rows checked bit for bit against the
    separate pass's."""
    steps, row_group = kernel_prepass.step_groups(step)
    segments = kernel_prepass.layout(mask, offsets)
    segment_group = row_group[segments[3]]
    fused, hints = kernel_prepass.reductions(trainer, rollout, segments, len(step), segment_group, len(steps))
    raw, _, length, row, _, rounds = segments
    constants = (quantities.CLIP, kernel_prepass.LOG_HALF, kernel_prepass.COPY_GAP, kernel_prepass._LOG_EDGES)
    separate = separate_hint_rows(
        trainer, rollout, raw, length, row, rounds, len(step), segment_group, len(steps), *constants
    )
    for name, mine, theirs in zip(("per row", "probability buckets"), hints[:2], separate, strict=True):
        assert_bits_equal(mine, theirs, name)
    return fused, hints


@settings(max_examples=80, deadline=None)
@given(layouts())
def test_the_fused_hint_rows_are_the_separate_passs_bit_for_bit(layout):
    fused, _ = fused_and_separate(*arrays(chunk_of(*layout)))
    assert len(fused) == 6


@pytest.mark.parametrize("seed", range(4))
def test_the_fused_hint_rows_follow_every_pattern(seed):
    """Long rows (pairwise trees of several levels, where a round crosses leaves and segments), exact zeros in runs
    and exact copies: every HINT_COLUMNS column is hit and equals the separate pass's."""
    rng = np.random.default_rng(seed)
    lengths = [int(n) for n in rng.integers(1, 3000, 12)]
    mask = []
    for length in lengths:
        row = []
        while len(row) < length:
            row += [bool(rng.random() < 0.8)] * int(rng.integers(1, 700))
        mask += row[:length]
    lengths.append(5)  # a row whose last round is one token (its last token is also a round's first)
    mask += [True, True, False, False, True]
    chunk = chunk_of(lengths, mask, sorted(rng.integers(0, 3, len(lengths)).tolist()), seed)
    trainer, rollout, mask_array, offsets, step = arrays(chunk)
    runs = np.flatnonzero(mask_array)[::97]  # runs of exact zeros on the rollout side
    for start in runs:
        rollout[start : start + 3] = np.where(mask_array[start : start + 3], 0.0, rollout[start : start + 3])
    _, hints = fused_and_separate(trainer, rollout, mask_array, offsets, step)
    per_row = hints[0]
    assert (per_row != 0).any(axis=0).all(), "a hint column never hit"


def test_the_fused_pass_clips_as_the_hint_constants_say():
    assert compiled().CLIP == quantities.CLIP


EDGE_VALUES = [
    0.0,
    -0.0,
    5e-324,  # the smallest subnormal
    -2.2250738585072014e-308,  # the smallest normal
    2.0**-21,
    2.0**-20,
    -(2.0**-20),
    math.nextafter(2.0**-20, 0.0),
    0.75,
    1.0,
    -1.0,
    math.nextafter(1.0, 2.0),
    127.9,
    128.0,
    -128.0,
    1e300,
    -1e300,
]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=50))
def test_the_fused_histogram_bins_are_delta_bins(values):
    delta = np.array(EDGE_VALUES + values)
    bins = np.array([compiled()._delta_bin(value, -20, 27) for value in delta.tolist()])
    np.testing.assert_array_equal(bins, delta_bin(torch.from_numpy(delta)).numpy())
    assert bins.min() >= 0 and bins.max() < DELTA_BINS


def write_dump(path, rng: np.random.Generator, rows: int) -> None:
    lengths = rng.integers(0, 400, rows)
    mask = [(rng.random(n) < 0.85).astype(np.int8) for n in lengths]
    trainer = [-rng.exponential(1.0, n) for n in lengths]
    rollout = [t - rng.normal(0.0, 0.05, len(t)) for t in trainer]
    rollout = [np.minimum(r, 0.0) for r in rollout]
    for r in rollout[::5]:
        r[: len(r) // 7] = 0.0  # exact zeros
    table = pa.table(
        {
            "step": np.sort(rng.integers(0, 4, rows)),
            "sample_id": [f"s{i}" for i in range(rows)],
            "old_log_probs": trainer,
            "rollout_log_probs": rollout,
            "response_mask": mask,
        }
    )
    pq.write_table(table, path, row_group_size=max(1, rows // 3))


@settings(max_examples=8, deadline=None)
@given(st.integers(0, 10_000), st.integers(20, 120), st.sampled_from([257, 1000, 4096]))
def test_the_fused_hints_in_the_analysis_do_not_depend_on_chunking_or_read_ahead(tmp_path_factory, seed, rows, size):
    """The hint evidence the analysis keeps from the fused pass: chunks read ahead (the reader's prepass) and chunks
    that run it themselves give the same states, at any chunk size (rtol 1e-12; counts exact)."""
    path = tmp_path_factory.mktemp("dump") / "d.parquet"
    write_dump(path, np.random.default_rng(seed), rows)
    states = []
    for chunk_tokens, read_ahead in ((size, False), (size, True), (1 << 20, False)):
        analysis = passes.Analysis()
        reader = passes.open_reader(str(path), None, strict=False, chunk_tokens=chunk_tokens)
        with use_engine("numba"):
            if read_ahead:
                reader.read_ahead(4)
                deadline = time.monotonic() + 60
                while len(reader._ahead.items) < 2 and time.monotonic() < deadline:
                    time.sleep(0.01)
            ahead = 0
            for chunk, _ in reader.chunks(torch.device("cpu"), prepare=analysis.prepare):
                assert isinstance(chunk.cache["stats"], KernelStats)
                ahead += chunk.prepass is not None
                analysis.update(chunk)
                chunk.cache.clear()
        assert (ahead > 0) == read_ahead
        states.append(analysis.hint_evidence.run_state())
    for name, value in states[0].items():
        assert_bits_equal(np.atleast_1d(states[1][name]), np.atleast_1d(value), name)  # read ahead or not: same bits
        np.testing.assert_allclose(states[2][name], value, rtol=1e-12, atol=0, err_msg=name)


def turn_sums_of_both_engines(chunk):
    """``metrics.hints._turn_sums`` of ``chunk`` by the numba engine (the fused pass's) and by the torch
    engine (tensors), each name's values as float64 numpy."""
    from dataclasses import replace

    from rollout_diag.engine.stats import ChunkStats
    from rollout_diag.metrics.hints import _turn_sums

    numpy_chunk = replace(
        chunk, **{name: getattr(chunk, name).numpy() for name in ("step", "offsets", "trainer", "rollout", "mask")}
    )
    numba = _turn_sums(numpy_chunk, KernelStats(numpy_chunk))
    torch_engine = _turn_sums(chunk, ChunkStats(chunk))
    assert set(numba) == set(torch_engine)
    return {name: (np.asarray(numba[name], dtype=np.float64), torch_engine[name].numpy()) for name in numba}


@settings(max_examples=80, deadline=None)
@given(layouts())
def test_the_compiled_turn_sums_are_the_torch_engines_bit_for_bit(layout):
    """Rounds of any length (shorter than TURN_OFFSETS too, over several segments), rows without model tokens, steps in
    any row order: the fused pass adds each round's first tokens as the torch engine's bincounts do, in their order."""
    for name, (numba, torch_engine) in turn_sums_of_both_engines(chunk_of(*layout)).items():
        assert_bits_equal(numba, torch_engine, name)


def test_the_compiled_turn_sums_keep_a_nan_as_numpys_minimum_does():
    chunk = chunk_of([6, 4], [True] * 3 + [False] + [True] * 6, [0, 1], seed=3)
    chunk.trainer[1] = math.nan
    chunk.trainer[8] = 7.0  # |δ| above the clip
    sums = turn_sums_of_both_engines(chunk)
    assert math.isnan(sums["turn_offsets"][0][0, 1, 1])
    for name, (numba, torch_engine) in sums.items():
        assert_bits_equal(numba, torch_engine, name)
