"""The fused pass's own exp and expm1 (engine/kernels/cpu.py: no libm calls, so that they run on SIMD lanes)
against libm's (Python's math module): exp within 1 ulp over every range a logprob, a δ or 2c reaches (subnormal
results, under- and overflow), k3 = expm1(δ) − δ and expm1(−δ) + δ within 2 ulp of expm1 for |δ| ≤ ln2/2 and 1e-14
of k3 beyond; and a leaf's values (one loop on SIMD lanes, the wide δ redone) equal the scalar functions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from numba import njit

from rollout_diag.engine.kernels import compiled
from rollout_diag.engine.quantities import BANDS as COUNT_BANDS
from rollout_diag.engine.quantities import PROBABILITIES


@pytest.fixture(scope="module")
def kernels():
    return compiled()


@pytest.fixture(scope="module")
def apply(kernels):
    exp, k3_pair = kernels._exp, kernels._k3_pair

    @njit
    def run(values: np.ndarray, which: int) -> np.ndarray:
        out = np.empty_like(values)
        for i in range(values.shape[0]):
            out[i] = exp(values[i]) if which == 0 else k3_pair(values[i])[which - 1]
        return out

    return run


def ulps(mine: np.ndarray, libm: np.ndarray) -> np.ndarray:
    """Distance in units in the last place (same-signed finite values: adjacent floats are adjacent integers)."""
    assert np.array_equal(np.signbit(mine), np.signbit(libm)), "a sign differs"
    return np.abs(mine.view(np.int64) - libm.view(np.int64))


RANGES = {
    "δ near 0": (-1.0, 1.0),
    "tiny": (-1e-6, 1e-6),
    "2c": (-40.0, 40.0),
    "logprobs": (-745.0, 0.0),
    "subnormal results": (-760.0, -700.0),
    "far below": (-1e4, -700.0),
    "near overflow": (700.0, 709.78),
}


@pytest.mark.parametrize("bounds", RANGES.values(), ids=RANGES.keys())
def test_exp_within_an_ulp_of_libm(apply, bounds):
    values = np.random.default_rng(7).uniform(*bounds, 200_000)
    distance = ulps(apply(values, 0), np.array([math.exp(v) for v in values]))
    assert distance.max() <= 1, values[distance.argmax()]


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0.0, 1.0), (-0.0, 1.0), (1e-300, 1.0), (-5e-324, 1.0), (-746.0, 0.0), (-1e300, 0.0), (math.log(2.0), 2.0)],
)
def test_exp_special_values(apply, value, expected):
    assert apply(np.array([value]), 0)[0] == expected
    assert apply(np.array([709.79]), 0)[0] == math.inf  # past the largest double, as libm's


BANDS = {"tiny": 1e-6, "bf16-sized": 1e-2, "to ln2/2": math.log(2.0) / 2, "wide": 3.0, "clamped": 60.0}


@pytest.mark.parametrize("spread", BANDS.values(), ids=BANDS.keys())
def test_k3_against_libm(apply, spread):
    """expm1(±δ) ∓ δ subtracts exactly for |δ| ≤ ln2/2 (Sterbenz), so there each is within 2 ulp of libm's expm1;
    beyond, k3 is at least 0.05 and exp(±δ) − 1 within 1e-14 of it."""
    delta = np.random.default_rng(11).uniform(-spread, spread, 100_000)
    narrow = np.abs(delta) <= math.log(2.0) / 2
    for which, sign in ((1, 1.0), (2, -1.0)):
        libm_expm1 = np.array([math.expm1(sign * d) for d in delta])
        libm = libm_expm1 - sign * delta
        mine = apply(delta, which)
        assert np.all(np.abs(mine - libm)[narrow] <= 2 * np.spacing(np.abs(libm_expm1[narrow])))
        assert np.all(np.abs(mine - libm)[~narrow] <= 1e-14 * np.abs(libm[~narrow]))
    zeros = apply(np.array([0.0, -0.0]), 1), apply(np.array([0.0, -0.0]), 2)
    assert all(np.all(z == 0.0) for z in zeros)


def test_a_leaf_s_values_are_the_scalar_functions(kernels, apply):
    """A leaf mixing |δ| ≤ ln2/2 (the shared polynomial, on SIMD lanes) with wider δ (redone one by one): each
    exponential is the scalar function's bit for bit, and every quantity the kernels' scalar one (``_value``, what the
    centred sums and the top-K scan read)."""
    rng = np.random.default_rng(3)
    size = 128
    rollout = -rng.exponential(2.0, size)
    delta = np.where(rng.random(size) < 0.3, rng.normal(0, 3, size), rng.normal(0, 0.05, size))
    delta[:4] = [0.0, -0.0, 0.34657359027997264, -0.3465735902799727]  # zeros, and each side of ln2/2
    trainer = rollout + delta
    out = np.full((len(kernels.QUANTITIES), size), np.nan)
    lean = out.copy()
    counts = kernels._quantities(trainer, rollout, 0, size, out, True, False)
    # without the probabilities: 0, the rest as they were
    assert kernels._quantities(trainer, rollout, 0, size, lean, False, False) == counts
    magnitude = np.abs(trainer - rollout)
    bands = (magnitude <= band for band in COUNT_BANDS)
    expected = (trainer != rollout, magnitude > np.log(2), magnitude > np.log(5), *bands)
    assert counts == tuple(int(np.count_nonzero(flags)) for flags in expected)  # the COUNTS, in order
    for name, column in kernels.COLUMN.items():
        expected = np.zeros(size) if name in PROBABILITIES else out[column]
        assert np.array_equal(lean[column], expected), name
    d = trainer - rollout
    column = kernels.COLUMN
    assert np.array_equal(out[column["trainer_prob"]], apply(trainer, 0))
    assert np.array_equal(out[column["rollout_prob"]], apply(rollout, 0))
    assert np.array_equal(out[column["chi2_term"]], apply(np.clip(d, -20.0, 20.0) * 2.0, 0))
    wide = np.abs(d) > math.log(2.0) / 2
    assert 10 < wide.sum() < size - 10
    assert np.array_equal(out[column["k3"]], apply(d, 1)) and np.array_equal(out[column["skyrl_k3"]], apply(d, 2))
    for q in range(len(kernels.QUANTITIES)):
        scalar = np.array([kernels._value(q, a, r) for a, r in zip(trainer, rollout, strict=True)])
        assert np.array_equal(scalar, out[q]), kernels.QUANTITIES[q]
