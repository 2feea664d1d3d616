"""The compiled pass of the presets' derived token quantities (rollout_diag/engine/kernels/presets.py) against the torch
engine on the CPU: 1e-12 relative, counts exact, also where weights land on truncation, IcePop, mask and veto bounds
(the IS weight is numpy's exp on both engines on the CPU, so a token on a bound falls on the same side in both)."""

from __future__ import annotations

import math
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.kernel import assert_same_document
from helpers.presets import ALL_PRESETS, assert_metrics_close, make_chunk
from hypothesis import given, settings
from hypothesis import strategies as st

import rollout_diag as rd
from rollout_diag.engine.choice import use_engine
from rollout_diag.engine.formulas import DERIVED, gate_values
from rollout_diag.engine.kernels import compiled_presets
from rollout_diag.engine.stats import ChunkStats, KernelStats
from rollout_diag.metrics.outcome import CorrectionAnalysis

RTOL = 1e-12
# every ratio bound of the built-in and test presets, and their log (where δ sits for w = exp(c) to land on them)
BOUNDS = (2.0, 0.5, 5.0, 1.001, 0.999, 1e-4, 20.0, 1.5, 3.0, 0.2, 0.7, 1.3, 0.8, 1.25, 1.05, 0.3, 1000.0, 0.001)


@pytest.mark.parametrize("size", [1, 2, 7, 8, 9, 127, 128, 129, 130, 255, 256, 1000, 1031, 4096, 5000])
def test_pairwise_sum_is_numpys_reduceat_bit_for_bit(size):
    values = np.random.default_rng(size).normal(0, 1, size) * np.exp2(np.random.default_rng(1).integers(-30, 30, size))
    kernels = compiled_presets()
    rest = kernels._pairwise(values, 1, size - 1) if size > 1 else -0.0
    assert values[0] + rest == np.add.reduceat(values, [0])[0]


def bound_rows(seed: int, rows: int) -> list:
    """Rows whose δ sits on the log of a bound, a few ulps either side, or far from every bound."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(rows):
        length = int(rng.integers(0, 40))
        bound = np.log(rng.choice(BOUNDS, length))
        delta = bound + rng.integers(-3, 4, length) * np.spacing(np.abs(bound) + 1e-300)
        far = rng.random(length) < 0.3
        delta[far] = rng.normal(0, 0.5, int(far.sum()))
        rollout = -rng.exponential(1.0, length) - 10.0
        trainer = rollout + delta
        mask = (rng.random(length) > 0.15).astype(np.float64)
        out.append((trainer, rollout, mask))
    return out


def write_bounds_dump(path: Path, seed: int, steps: tuple[int, ...], rows: int) -> Path:
    """A dump of ``bound_rows`` per step (step s from seed + s), logprobs rounded to float32 as a dump holds them."""
    from helpers.presets import write_dump

    rounded = {
        step: [
            (np.float32(a).astype(np.float64), np.float32(r).astype(np.float64), m)
            for a, r, m in bound_rows(seed + step, rows)
        ]
        for step in steps
    }
    write_dump(path, rounded)
    return path


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), steps=st.integers(1, 4))
def test_presets_on_the_bounds_equal_the_torch_engine(seed, steps):
    records = [(step, row) for step in range(steps) for row in bound_rows(seed + step, 6)]
    results = []
    for engine in (KernelStats, ChunkStats):
        chunk = make_chunk(records)
        chunk.cache["stats"] = engine(chunk)
        analysis = CorrectionAnalysis(ALL_PRESETS)
        analysis.update(chunk)
        results.append(analysis.finalize())
    numba, torch_engine = results
    for name, (steps_torch, run_torch) in torch_engine.items():
        steps_numba, run_numba = numba[name]
        assert_metrics_close(run_numba, run_torch, f"{name} run", RTOL)
        assert set(steps_numba) == set(steps_torch)
        for step, metrics in steps_torch.items():
            assert_metrics_close(steps_numba[step], metrics, f"{name} step {step}", RTOL)
            counted = [key for key in metrics if "fraction" in key or "rejected" in key or "kept" in key]
            assert all(steps_numba[step][key] == metrics[key] for key in counted), name


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_every_derived_quantity_reduces_as_the_torch_engine(seed):
    """Per segment: sums bit for bit (numpy reduceat's order, the same per-token values), maxima, minima, and counts."""
    records = [(step, row) for step in range(2) for row in bound_rows(seed + 7 * step, 5)]
    kernel_chunk, torch_chunk = make_chunk(records), make_chunk(records)
    kernel_chunk.cache["stats"] = kernel = KernelStats(kernel_chunk)
    torch_chunk.cache["stats"] = reference = ChunkStats(torch_chunk)
    analysis = CorrectionAnalysis(ALL_PRESETS)
    analysis.update(kernel_chunk)
    assert len(DERIVED) > 10
    for name in DERIVED:
        if name not in kernel._sums:
            continue
        assert torch.equal(kernel._sums[name], reference.segment_sum(name)), name
        assert torch.equal(kernel.segment_max(name), reference.segment_max(name)), name
        assert torch.equal(kernel.segment_min(name), reference.segment_min(name)), name


def test_compare_presets_on_bounds_equals_the_torch_engine(tmp_path):
    path = write_bounds_dump(tmp_path / "bounds.parquet", 100, (0, 2, 3), 9)
    with use_engine("numba"):
        numba_result = rd.compare_presets(path, ALL_PRESETS, device="cpu", chunk_tokens=61)
    with use_engine("torch"):
        torch_result = rd.compare_presets(path, ALL_PRESETS, device="cpu", chunk_tokens=61)
    assert_same_document(numba_result.to_json(), torch_result.to_json())
    assert math.isfinite(numba_result.presets[0].run.metrics["rollout_corr/rollout_is_mean"])


# ------------------------------------------------------------------ the sweep's histogram, counted in the preset pass
def torch_signed_counts(clamped: np.ndarray) -> np.ndarray:
    """The run sweep's histogram of c as the torch engine counts it (``signed_bins``, then a bincount)."""
    from rollout_diag.metrics.sweep import HISTOGRAM_BINS, signed_bins

    class Stats:  # signed_bins reads only the token quantity c
        def token(self, name):
            assert name == "clamped_log_ratio"
            return torch.from_numpy(clamped)

    return torch.bincount(signed_bins(Stats()), minlength=2 * HISTOGRAM_BINS).numpy()


def kernel_signed_counts(clamped: np.ndarray, segment: int = 97) -> np.ndarray:
    """The compiled pass's histogram of the same c (trainer = c, rollout = 0, in segments of ``segment`` tokens)."""
    from rollout_diag.metrics.sweep import exact_bin_edges

    kernels = compiled_presets()
    size = clamped.shape[0]
    starts = np.arange(0, size, segment, dtype=np.int64)
    length = np.minimum(segment, size - starts).astype(np.int64)
    edges, table = exact_bin_edges()
    none = np.zeros((0, 2), np.int64)
    one_group = np.zeros(len(starts), np.int64)
    _, _, _, counts, _ = kernels.preset_pass(
        clamped, np.zeros(size), np.zeros(0), starts, starts, length, one_group, 1, none, none.astype(np.float64),
        np.zeros(0, np.bool_), edges, table, kernels.KEEP_NONE, kernels.KEPT_NONE,
    )  # fmt: skip
    return counts[0]


def test_every_histogram_edge_is_where_the_engines_formula_changes_bin():
    """edges[k] is the first float64 |c| of bin k: the float below it is in bin k − 1 (bisection found the change),
    for numpy chunks and CPU tensors alike (both take numpy's log10 on the host)."""
    from rollout_diag.metrics.sweep import HISTOGRAM_BINS, exact_bin_edges, magnitude_bins

    edges, table = exact_bin_edges()
    assert edges.shape == (HISTOGRAM_BINS,) and np.all(np.diff(edges) > 0)
    inside = edges[1:]
    below = np.nextafter(inside, 0.0)
    for kind in (np.asarray, torch.from_numpy):
        assert np.array_equal(np.asarray(magnitude_bins(kind(inside))), np.arange(1, HISTOGRAM_BINS))
        assert np.array_equal(np.asarray(magnitude_bins(kind(below))), np.arange(0, HISTOGRAM_BINS - 1))
    # the edges are near 10^(k/32 − 12), where the formula's bins change in exact arithmetic
    exact = 10.0 ** (-12 + np.arange(1, HISTOGRAM_BINS) / 32)
    assert np.allclose(inside, exact, rtol=1e-12)
    assert table.min() >= 0 and table.max() < HISTOGRAM_BINS
    # what the compiled pass relies on: one step over an edge at most within a slice of |c|
    assert np.diff(table).max() == 1 and np.searchsorted(inside, 20.0, side="right") - table[-1] <= 1


def test_the_pass_bins_c_as_the_engines_formula_near_every_edge_and_everywhere():
    """Every float within 40 ulps of every edge, each sign, and c over every decade (0, −0.0, ±20, below 1e-12):
    the compiled pass's counts are the torch engine's on the CPU, bin for bin."""
    from rollout_diag.metrics.sweep import exact_bin_edges

    edges, _ = exact_bin_edges()
    steps = np.arange(-40, 41)
    near = edges[1:, None].view(np.int64) + steps[None, :]
    near = near.reshape(-1).view(np.float64)
    near = near[near <= 20.0]
    rng = np.random.default_rng(3)
    spread = 10.0 ** rng.uniform(-16, np.log10(20.0), 200_000)
    special = np.array([0.0, -0.0, 20.0, -20.0, 1e-12, -1e-12, 1e-300, 5e-324, 1.0, -1.0, 10.0, 0.1])
    magnitudes = np.concatenate([near, spread, special])
    values = np.concatenate([magnitudes, -magnitudes])
    rng.shuffle(values)
    assert np.array_equal(kernel_signed_counts(values), torch_signed_counts(values))
    assert np.array_equal(kernel_signed_counts(values, segment=1), torch_signed_counts(values))


def test_a_wrong_bin_would_show():
    """The comparison above sees one token moved to a neighbouring bin (the test is not vacuous)."""
    from rollout_diag.metrics.sweep import exact_bin_edges

    edges, _ = exact_bin_edges()
    at_edge = np.array([edges[100], np.nextafter(edges[100], 0.0)])
    counts = kernel_signed_counts(at_edge)
    assert counts[100] == 1 and counts[99] == 1
    moved = torch_signed_counts(np.array([edges[100], edges[100]]))
    assert not np.array_equal(counts, moved)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), chunk_tokens=st.sampled_from([7, 61, 1000]))
def test_the_prepared_pass_gives_the_torch_engines_sweep_and_presets(tmp_path_factory, seed, chunk_tokens):
    """compare-presets with the preset pass in the prepare pool (weights, flags, moments and the run sweep's
    histogram folded into it) against the torch engine, on δ at and around every bound: the same document."""
    path = write_bounds_dump(tmp_path_factory.mktemp("prepared") / "bounds.parquet", seed, (0, 1, 3), 7)
    with use_engine("numba"):
        numba_result = rd.compare_presets(path, ALL_PRESETS, device="cpu", chunk_tokens=chunk_tokens, workers=1)
    with use_engine("torch"):
        torch_result = rd.compare_presets(path, ALL_PRESETS, device="cpu", chunk_tokens=chunk_tokens, workers=1)
    assert_same_document(numba_result.to_json(), torch_result.to_json())
    assert numba_result.to_json()["sweep"] == torch_result.to_json()["sweep"]  # histogram counts: exact


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000), chunk_tokens=st.sampled_from([7, 61, 1000]))
def test_the_per_step_sweep_counts_in_the_preset_pass_as_the_torch_engine(tmp_path_factory, seed, chunk_tokens):
    """``sweep``: on the numba engine the reader's prepare pool counts each step group's histogram of c (and k3's
    sums) in the compiled preset pass (``drivers.sweep._prepare_histograms``) and the accumulator builds no token value;
    the document is the torch engine's, which bins every token's c itself: counts, thresholds and shares exact."""
    from rollout_diag.engine import stats as segments

    path = write_bounds_dump(tmp_path_factory.mktemp("sweep") / "bounds.parquet", seed, (0, 1, 3, 4), 7)
    with use_engine("torch"):
        torch_result = rd.threshold_sweep(path, device="cpu", chunk_tokens=chunk_tokens)
    token = segments.ChunkStats.token

    def prepared_only(self, name):
        assert threading.current_thread() is not threading.main_thread(), f"{name} built by the accumulator"
        return token(self, name)

    segments.ChunkStats.token = prepared_only
    try:
        with use_engine("numba"):
            numba_result = rd.threshold_sweep(path, device="cpu", chunk_tokens=chunk_tokens)
    finally:
        segments.ChunkStats.token = token
    assert numba_result.to_json() == torch_result.to_json()


@pytest.mark.parametrize("presets", ["built-in", "all"])
def test_the_prepare_pool_builds_every_token_value_and_the_caller_none(monkeypatch, presets):
    """After ``Pass.prepare`` (the reader's pool) the built-in presets' and the sweep's update build no token tensor:
    the derived quantities, w, the moments and the histogram are all prepared; with every preset (a custom one
    combines a token k3 option with IcePop, counted token by token) the caller builds what that needs. Either way
    the result is the unprepared pass's."""
    from helpers.presets import random_step

    from rollout_diag.drivers.passes import PassSpec
    from rollout_diag.engine.stats import stats
    from rollout_diag.presets import resolve_presets

    chosen = resolve_presets(None) if presets == "built-in" else ALL_PRESETS
    rng = np.random.default_rng(8)
    records = [(step, row) for step in (0, 1) for row in random_step(rng, 12)]
    documents = []
    for prepared in (True, False):
        chunk = make_chunk(records)
        chunk.cache["stats"] = KernelStats(chunk)
        state = PassSpec({"offpolicy_only": True}, chosen).new()
        if prepared:
            state.prepare(chunk)
            built = []
            original = ChunkStats.token

            def watched(self, name, original=original, built=built):
                if name not in self._tokens:
                    built.append(name)
                return original(self, name)

            monkeypatch.setattr(ChunkStats, "token", watched)
        state.corrections.update(chunk)
        state.sweep.update(chunk)
        if prepared:
            monkeypatch.undo()
            if presets == "built-in":
                assert built == [], built
                assert "model" not in chunk.__dict__  # no model-token tensors (δ, rows, positions) either
                assert stats(chunk)._tokens.keys() == {"token_is_weight"}
            else:
                assert "rs_k3" in built
        documents.append((state.corrections.finalize(), state.sweep.run_state()))
    (prepared_metrics, prepared_sweep), (plain_metrics, plain_sweep) = documents
    assert prepared_metrics == plain_metrics
    assert prepared_sweep.keys() == plain_sweep.keys()
    for name in ("positive", "negative", "tokens"):
        assert np.array_equal(prepared_sweep[name], plain_sweep[name])


def test_a_quantity_read_for_its_moments_only_still_reduces_as_the_torch_engine():
    """The pass skips the extremes of a quantity asked for its moments only; read anyway, they are the torch
    engine's (not the scratch the pass left)."""
    from rollout_diag.engine.formulas import derived
    from rollout_diag.metrics.correction import derived_moments, prepare_derived

    records = [(step, row) for step in range(2) for row in bound_rows(21 + step, 5)]
    kernel_chunk, torch_chunk = make_chunk(records), make_chunk(records)
    kernel_chunk.cache["stats"] = kernel = KernelStats(kernel_chunk)
    torch_chunk.cache["stats"] = reference = ChunkStats(torch_chunk)
    name = derived("token_is_weight", "clamp", 0.7, 1.3)
    prepare_derived(kernel, [], [name])
    assert name in kernel._sums and name not in kernel._maxima
    assert torch.equal(kernel.segment_sum(name), reference.segment_sum(name))
    assert torch.equal(kernel.segment_max(name), reference.segment_max(name))
    assert torch.equal(kernel.segment_min(name), reference.segment_min(name))
    assert torch.allclose(derived_moments(kernel, name), derived_moments(reference, name), rtol=1e-12, atol=0)


def test_numpy_exp_is_elementwise_so_the_prepared_weights_are_the_torch_engines():
    """The prepared w is numpy's exp of c computed in place over the chunk's model tokens in one array; the torch
    engine takes numpy's exp of its CPU tensor (``arrays.host_exp``) over other arrays (a row's, a segment's): a
    value's exp must not depend on where it sits in the array (vector body or tail, alignment, in place or not), or
    the engines could disagree."""
    from rollout_diag.engine import arrays

    rng = np.random.default_rng(0)
    clamped = np.clip(rng.normal(0, 2, 100_003), -20, 20)
    whole = clamped.copy()
    np.exp(whole, out=whole)
    assert np.array_equal(np.exp(clamped), whole)
    assert np.array_equal(arrays.host_exp(torch.from_numpy(clamped)).numpy(), whole)
    for start in range(0, 17):
        for stop in (start + 1, start + 7, start + 1001, 100_003):
            part = arrays.host_exp(torch.from_numpy(clamped[start:stop].copy())).numpy()
            assert np.array_equal(part, whole[start:stop])
            assert np.array_equal(np.exp(clamped[start:stop]), whole[start:stop])  # unaligned views too


def test_a_chunks_stats_are_freed_without_the_cyclic_collector():
    """Once the pass clears a chunk's cache, its ChunkStats (and every token tensor it holds) is freed at once by
    reference counting: nothing the presets memoise refers back to it (a cycle kept each chunk alive until the
    cyclic collector ran, and memory grew with the file)."""
    import gc
    import weakref

    from rollout_diag.drivers.passes import PassSpec
    from rollout_diag.engine.stats import stats

    records = [(step, row) for step in range(2) for row in bound_rows(5 + step, 6)]
    state = PassSpec({"offpolicy_only": True}, ALL_PRESETS).new()
    gc.disable()
    try:
        for engine in (KernelStats, ChunkStats):
            chunk = make_chunk(records)
            chunk.cache["stats"] = engine(chunk)
            state.prepare(chunk)
            for consume in state.consumers():
                consume(chunk)
            alive = weakref.ref(stats(chunk))
            chunk.cache.clear()  # as run_chunks does after the consumers
            del chunk
            assert alive() is None, engine.__name__
    finally:
        gc.enable()


@pytest.mark.parametrize("size", [1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 64, 129, 1000])
def test_extremes_side_by_side_are_the_scan_in_order(size):
    """The pass's max / min (four quarters side by side) are those of one scan in order, bit for bit: of equal
    values the first, so +0.0 / −0.0 and repeated values come out as the scan finds them."""
    from numba import njit

    kernels = compiled_presets()

    @njit(cache=False)
    def extremes(values, size):
        return kernels._extremes(values, size)

    rng = np.random.default_rng(size)
    for trial in range(30):
        values = rng.choice(np.array([0.0, -0.0, 1.0, -1.0, 2.5, -2.5]), size) if trial % 2 else rng.normal(0, 1, size)
        largest, smallest = values[0], values[0]
        for value in values[1:]:
            largest = value if value > largest else largest
            smallest = value if value < smallest else smallest
        found = extremes(values, size)
        assert np.array_equal(np.array(found).view(np.int64), np.array([largest, smallest]).view(np.int64))


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), quantities=st.integers(1, 9), weight_only=st.booleans(), gates_and_w=st.booleans())
def test_centred_sums_add_each_groups_tokens_in_order(seed, quantities, weight_only, gates_and_w):
    """Σ (x − mean)² of each (group, quantity), four quantities side by side: bit for bit the sum that adds the
    group's tokens one by one in token order; also where every quantity reads w alone (then read where it lies,
    no base quantity laid out), where w and the gates are all they read (w read where it lies, δ and the gates laid
    out, or the gates the preset pass kept read where they lie too), and with model tokens at other places than the
    raw ones."""
    kernels = compiled_presets()
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 40, 12)
    raw = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    model = raw + np.arange(12, dtype=np.int64)  # the model tokens' places: a gap before each segment
    total = int(lengths.sum())
    rollout = -rng.exponential(1.0, total)
    trainer = rollout + rng.normal(0, 0.3, total)
    weight = np.full(total + 12, np.nan)
    for s in range(12):
        weight[model[s] : model[s] + lengths[s]] = np.exp(np.clip(trainer - rollout, -20, 20))[
            raw[s] : raw[s] + lengths[s]
        ]
    length = lengths.astype(np.int64)
    every_gate = np.stack(gate_values(trainer, rollout))
    group = np.sort(rng.integers(0, 3, 12)).astype(np.int64)
    ops = ["tis", "icepop", "clamp", "above", "outside"]
    kinds = [2 if weight_only else rng.integers(0, 9) for _ in range(quantities)]
    if gates_and_w and not weight_only:  # w and the gates only: w read where it lies, δ and the gates laid out
        kinds = [[2, kernels.KPOP, kernels.BKL, kernels.TV][q % 4] for q in range(max(2, quantities))]
        quantities = len(kinds)
    codes = np.array([[kind, kernels.OPS[ops[rng.integers(0, 5)]]] for kind in kinds])
    bounds = np.array([[0.5, 2.0]] * quantities)
    means = rng.normal(1.0, 0.1, (3, quantities))
    out = kernels.centred_pass(
        trainer, rollout, weight, kernels.KEEP_NONE, kernels.KEPT_NONE, raw, model, length, group, codes, bounds, means
    )
    if not weight_only:  # the gates the preset pass kept, read where they lie: the same sums
        keep = np.array([gate in kinds for gate in (kernels.KPOP, kernels.BKL, kernels.TV)])
        empty = np.zeros((0, 2), np.int64)
        kept = np.full((3, total + 20), np.nan)  # longer than the model tokens' extent, as a reused one is
        kernels.preset_pass(
            trainer, rollout, weight, raw, model, length, group, 3, empty, empty.astype(np.float64),
            np.zeros(0, np.bool_), np.zeros(0), np.zeros(0, np.int64), keep, kept,
        )  # fmt: skip
        assert [bool(np.isnan(row).all()) for row in kept] == (~keep).tolist()
        read = kernels.centred_pass(
            trainer, rollout, weight, keep, kept, raw, model, length, group, codes, bounds, means
        )  # fmt: skip
        assert np.array_equal(read, out)
    expected = np.zeros((3, quantities))
    base = np.empty(9)
    for s in range(12):
        for k in range(lengths[s]):
            t, w = raw[s] + k, weight[model[s] + k]
            d = trainer[t] - rollout[t]
            c = min(max(d, -20.0), 20.0)
            base[:] = [d, c, w, -c, 0.5 * c * c, (w - 1.0) - c, *every_gate[:, t]]
            for q in range(quantities):
                value = kernels._derived(codes[q, 1], bounds[q, 0], bounds[q, 1], base[codes[q, 0]])
                centred = value - means[group[s], q]
                expected[group[s], q] += centred * centred
    assert np.array_equal(out, expected)


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000), chunk_tokens=st.sampled_from([7, 61, 1000]))
def test_the_row_pass_counts_rejections_from_the_prepared_flags(tmp_path_factory, seed, chunk_tokens):
    """``check`` and ``diff``'s per-row statistics: each preset's rejected tokens per row from the flags the compiled
    pass prepared (``RowStatsCollector.prepare``), as compare-presets counts them, equal the count of every token the
    preset's keep rule drops (the definition, token by token), on δ at and around every bound."""
    from rollout_diag.drivers.rowpass import row_pass
    from rollout_diag.engine.stats import stats
    from rollout_diag.metrics import rowstats

    path = write_bounds_dump(tmp_path_factory.mktemp("rows") / "bounds.parquet", seed, (0, 1, 3), 7)
    expected: dict[str, list[np.ndarray]] = {}
    update = rowstats.RowStatsCollector.update

    def counted_by_definition(self, chunk):
        s = stats(chunk)
        for name, outcome in self.rules.items():
            dropped = outcome.kept_tokens(s).map(lambda keep: ~np.asarray(keep, dtype=bool))
            expected.setdefault(name, []).append(np.asarray(s.row_sum(dropped)))
        update(self, chunk)

    rowstats.RowStatsCollector.update = counted_by_definition
    try:
        with use_engine("numba"):
            rows = row_pass(path, presets=ALL_PRESETS, device="cpu", chunk_tokens=chunk_tokens).rows.finalize()
    finally:
        rowstats.RowStatsCollector.update = update
    assert set(rows.rejected) == set(expected) == {preset.name for preset in ALL_PRESETS}
    for name, counts in rows.rejected.items():
        assert counts.tolist() == np.concatenate(expected[name]).tolist(), name
    assert any(counts.any() for counts in rows.rejected.values())
