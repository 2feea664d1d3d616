"""The probability gates' compiled pass (rollout_diag/engine/kernels/presets.py _fill_gates, _moved_gates) against the
torch engine's formula (engine/formulas.py gate_values) on the CPU: every token's kpop, bkl and tv bit for bit (both
take the compiled pass's own exp and log, kernels.presets.gate_exp and gate_log), the sweep's histograms of them
counted alike, and compare-presets' and sweep's documents equal in the two engines, near the clamps too; and that exp
and log within 1 ulp of libm's (Python's math module) over dense grids of every range they meet."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers.kernel import assert_same_document
from helpers.presets import make_chunk, write_dump

import rollout_diag as rd
from rollout_diag.engine.choice import use_engine
from rollout_diag.engine.stats import ChunkStats, KernelStats
from rollout_diag.metrics.sweep import exact_bin_edges, gate_histograms
from rollout_diag.presets import GATE_PRESETS


def gate_rows(seed: int, rows: int) -> list:
    """Rows with probabilities near 0 and 1 (either side of both clamps), near each other and far apart."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(rows):
        length = int(rng.integers(0, 50))
        rollout = -rng.choice([1e-9, 1e-7, 1e-5, 0.3, 2.0, 13.0, 14.5, 19.0, 30.0], length) * rng.uniform(
            0.5, 2, length
        )
        trainer = np.minimum(rollout + rng.normal(0, 1, length) * rng.choice([0.0, 1e-6, 0.05, 2.0], length), 0.0)
        mask = (rng.random(length) > 0.1).astype(np.float64)
        out.append((trainer, rollout, mask))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_compiled_gates_are_the_torch_engines_bit_for_bit(seed):
    records = [(step, row) for step in range(3) for row in gate_rows(seed + 11 * step, 7)]
    kernel_chunk, torch_chunk = make_chunk(records), make_chunk(records)
    kernel = KernelStats(kernel_chunk)
    kernel_chunk.cache["stats"] = kernel
    torch_chunk.cache["stats"] = reference = ChunkStats(torch_chunk)
    values = kernel.gate_values(exact_bin_edges())
    for index, name in enumerate(("rs_kpop", "rs_bkl", "rs_tv")):
        expected = reference.token(name)
        assert torch.equal(torch.from_numpy(values[index]), expected), name
        assert torch.equal(kernel.token(name), expected), name
    assert (values >= 0).all() and np.isfinite(values).all()
    assert torch.equal(
        torch.as_tensor(gate_histograms(kernel), dtype=torch.float64),
        torch.as_tensor(gate_histograms(reference), dtype=torch.float64),
    )


def test_compare_presets_and_sweep_of_the_gates_are_the_same_in_both_engines(tmp_path):
    path = tmp_path / "gates.parquet"
    write_dump(path, {step: gate_rows(40 + step, 9) for step in (0, 1, 4)})
    documents = []
    for engine in ("numba", "torch"):
        with use_engine(engine):
            compared = rd.compare_presets(path, list(GATE_PRESETS), device="cpu", chunk_tokens=53)
            swept = rd.threshold_sweep(path, device="cpu", chunk_tokens=53)
        documents.append((compared.to_json(), swept.to_json()))
    (compared_numba, swept_numba), (compared_torch, swept_torch) = documents
    assert_same_document(compared_numba, compared_torch)
    assert_same_document(swept_numba, swept_torch)
    assert {"token_kpop", "seq_mean_bkl"} <= {option["option"] for option in swept_numba["run"]}


def test_the_gates_of_tokens_a_clamp_moves_come_from_their_own_logs():
    """Moved tokens (p or q beyond a clamp) sit among unmoved ones in the preset pass's segments: each token's kpop and
    bkl are the torch engine's (as torch.equal compares them), whichever segment and place holds it."""
    from rollout_diag.engine.formulas import gate_values
    from rollout_diag.engine.kernels import presets as kernels

    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 30, 40)
    raw = np.concatenate([[0], np.cumsum(lengths + 3)[:-1]]).astype(np.int64)  # three unread raw tokens between
    model = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    size = int(raw[-1] + lengths[-1])
    rollout = -rng.choice([0.0, 1e-9, 1e-7, 0.3, 2.0, 14.0, 19.0, np.inf], size)
    trainer = np.minimum(rollout + rng.choice([0.0, 1e-8, 0.5], size) * rng.normal(size=size), 0.0)
    found, _ = kernels.gate_tokens(
        trainer, rollout, raw, model, lengths.astype(np.int64), np.zeros(40, np.int64), 1, np.zeros(0),
        np.zeros(0, np.int64),
    )  # fmt: skip
    places = np.concatenate([np.arange(r, r + n) for r, n in zip(raw, lengths, strict=True)])
    expected = torch.stack(gate_values(torch.from_numpy(trainer[places]), torch.from_numpy(rollout[places]))).numpy()
    p, q = np.exp(trainer[places]), np.exp(rollout[places])
    moved = (np.minimum(p, q) < 1e-6) | (np.maximum(p, q) > 1 - 1e-6)
    assert 0 < moved.sum() < moved.size
    assert np.array_equal(found, expected)  # equal values: bit for bit but a zero's sign


# ------------------------------------------------------------------ the gates' own exp and log against libm's
def ulps(mine: np.ndarray, libm: np.ndarray) -> np.ndarray:
    """Distance in units in the last place of same-signed values (adjacent floats are adjacent integers); equal
    infinities and NaNs 0."""
    same = (mine == libm) | (np.isnan(mine) & np.isnan(libm))
    assert np.array_equal(np.signbit(mine)[~same], np.signbit(libm)[~same]), "a sign differs"
    return np.where(same, 0, np.abs(mine.view(np.int64) - libm.view(np.int64)))


EXP_RANGES = {
    "logprobs near 0": (-1e-3, 0.0),
    "p near 1 - 1e-6": (-2e-6, -5e-7),
    "logprobs": (-40.0, 0.0),
    "p near 1e-8": (-19.0, -17.5),
    "p to the smallest normal": (-708.0, -40.0),
    "subnormal results": (-745.2, -708.0),
    "huge negatives": (-1e300, -745.2),
    "positive (tolerated logprobs)": (0.0, 1e-3),
    "up to overflow": (0.0, 709.78),
}


@pytest.mark.parametrize("bounds", EXP_RANGES.values(), ids=EXP_RANGES.keys())
def test_the_gates_exp_is_within_an_ulp_of_libm(bounds):
    from rollout_diag.engine.kernels import compiled_presets

    values = np.linspace(*bounds, 400_001)  # a dense grid, ends included
    libm = np.array([math.exp(v) for v in values])
    distance = ulps(compiled_presets().gate_exp(values), libm)
    assert distance.max() <= 1, values[distance.argmax()]


def test_the_gates_exp_of_special_values():
    from rollout_diag.engine.kernels import compiled_presets

    values = np.array([0.0, -0.0, -5e-324, 1e-300, -np.inf, -1e308, -746.0, 709.79, np.inf, math.log(2.0), np.nan])
    found = compiled_presets().gate_exp(values)
    assert found[:-1].tolist() == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, math.inf, math.inf, 2.0]
    assert np.isnan(found[-1])


LOG_RANGES = {
    "complements near 1": (1.0 - 1e-6, 1.0 + 1e-6),
    "ratios": (0.5, 2.0),
    "the clamps' extremes": (1e-8, 1e-6),
    "large ratios": (1e6, 1e8),
    "the whole exponent range": (-1074.0, 1023.0),  # log2 of the values, a grid of exponents
    "subnormals": (5e-324, 2.3e-308),
}


@pytest.mark.parametrize("name", LOG_RANGES)
def test_the_gates_log_is_within_an_ulp_of_libm(name):
    from rollout_diag.engine.kernels import compiled_presets

    low, high = LOG_RANGES[name]
    values = np.linspace(low, high, 400_001)
    if name == "the whole exponent range":
        values = np.exp2(values) * np.random.default_rng(3).uniform(1.0, 2.0, values.size)
        values = values[np.isfinite(values) & (values > 0)]
    libm = np.array([math.log(v) for v in values])
    distance = ulps(compiled_presets().gate_log(values), libm)
    assert distance.max() <= 1, values[distance.argmax()]


def test_the_gates_log_of_special_values():
    from rollout_diag.engine.kernels import compiled_presets

    values = np.array([1.0, 0.0, -0.0, np.inf, -1.0, -np.inf, np.nan, 2.0, 5e-324])
    found = compiled_presets().gate_log(values)
    assert found[:2].tolist() == [0.0, -math.inf] and found[2] == -math.inf and found[3] == math.inf
    assert np.isnan(found[4:7]).all()
    assert found[7] == math.log(2.0) and found[8] == math.log(5e-324)
