"""The fused pass's own exp and expm1 (rollout_diag/kernels/cpu.py: no libm calls, so that they run on SIMD lanes)
against libm's (Python's math module): within 1 ulp (exp) and 2 ulp (expm1) over every range a logprob, a δ or 2c
reaches, signed zeros, subnormal results, under- and overflow; and the two-loop evaluation of a leaf's five
exponentials (one polynomial for both expm1, the tokens beyond ln2/2 redone) equals the scalar functions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from numba import njit

from rollout_diag.kernels import compiled


@pytest.fixture(scope="module")
def kernels():
    return compiled()


@pytest.fixture(scope="module")
def apply(kernels):
    exp, expm1 = kernels._exp, kernels._expm1

    @njit
    def run(values: np.ndarray, which: int) -> np.ndarray:
        out = np.empty_like(values)
        for i in range(values.shape[0]):
            out[i] = exp(values[i]) if which == 0 else expm1(values[i])
        return out

    return run


def ulps(mine: np.ndarray, libm: np.ndarray) -> np.ndarray:
    """Distance in units in the last place (same-signed finite values and ±0: adjacent floats are adjacent integers)."""
    assert np.array_equal(np.signbit(mine), np.signbit(libm)) or not np.any(mine), "a sign differs"
    return np.abs(mine.view(np.int64) - libm.view(np.int64))


RANGES = {
    "δ near 0": (-1.0, 1.0),
    "tiny δ": (-1e-6, 1e-6),
    "2c": (-40.0, 40.0),
    "logprobs": (-745.0, 0.0),
    "subnormal exp": (-760.0, -700.0),
    "far below": (-1e4, -700.0),
    "near overflow": (700.0, 709.7),
}


@pytest.mark.parametrize("bounds", RANGES.values(), ids=RANGES.keys())
@pytest.mark.parametrize(("which", "libm", "most"), [(0, math.exp, 1), (1, math.expm1, 2)], ids=["exp", "expm1"])
def test_within_an_ulp_or_two_of_libm(apply, bounds, which, libm, most):
    values = np.random.default_rng(7).uniform(*bounds, 200_000)
    mine = apply(values, which)
    reference = np.array([libm(v) for v in values])
    distance = ulps(mine, reference)
    assert distance.max() <= most, values[distance.argmax()]


@pytest.mark.parametrize(
    ("value", "exp", "expm1"),
    [
        (0.0, 1.0, 0.0),
        (-0.0, 1.0, -0.0),
        (1e-300, 1.0, 1e-300),
        (-5e-324, 1.0, -5e-324),
        (-746.0, 0.0, -1.0),
        (-1e300, 0.0, -1.0),
        (math.log(2.0), 2.0, 1.0),
        (709.78, math.exp(709.78), math.expm1(709.78)),
    ],
)
def test_special_values(apply, value, exp, expm1):
    assert apply(np.array([value]), 0)[0] == exp
    found = apply(np.array([value]), 1)[0]
    assert found == expm1 and math.copysign(1.0, found) == math.copysign(1.0, expm1)


def test_a_leaf_s_exponentials_are_the_scalar_functions(kernels, apply):
    """A leaf mixing |δ| ≤ ln2/2 (the shared polynomial) with wider δ (redone one by one): exp(a), exp(r), exp(2c) and
    the wide tokens' expm1 are the scalar functions bit for bit, the narrow tokens' expm1 within 2 ulp of libm's, and
    the kernels' scalar quantity (``_value``) gives each token the leaf's values."""
    rng = np.random.default_rng(3)
    size = 128
    rollout = -rng.exponential(2.0, size)
    delta = np.where(rng.random(size) < 0.3, rng.normal(0, 3, size), rng.normal(0, 0.05, size))
    delta[:4] = [0.0, -0.0, 0.34657359027997264, -0.3465735902799727]  # zeros, and each side of ln2/2
    trainer = rollout + delta
    out = np.empty((5, size))
    kernels._exponentials(trainer, rollout, 0, size, out)
    d = trainer - rollout
    clamped = np.clip(d, -20.0, 20.0)
    assert np.array_equal(out[0], apply(trainer, 0)) and np.array_equal(out[1], apply(rollout, 0))
    assert np.array_equal(out[3], apply(clamped * 2.0, 0))
    wide = np.abs(d) > math.log(2.0) / 2
    assert 10 < wide.sum() < size - 10
    assert np.array_equal(out[2][wide], (apply(d, 1) - d)[wide])
    assert np.array_equal(out[4][wide], (apply(-d, 1) + d)[wide])
    # expm1(±δ) ∓ δ subtracts exactly (Sterbenz: |δ| ≤ ln2/2), so each differs from libm's by at most 2 ulp of expm1
    # the scalar quantity (what the centred sums and the top-K scan read) takes the very same values
    columns = {9: out[0], 10: out[1], 4: out[2], 5: out[3], 16: out[4], 11: np.abs(out[0] - out[1])}
    for q, values in columns.items():
        scalar = np.array([kernels._value(q, a, r) for a, r in zip(trainer, rollout, strict=True)])
        assert np.array_equal(scalar, values), q
    narrow = d[~wide]
    for mine, sign in ((out[2][~wide], 1.0), (out[4][~wide], -1.0)):
        libm = np.array([math.expm1(sign * v) for v in narrow])
        assert np.all(np.abs(mine - (libm - sign * narrow)) <= 2 * np.spacing(np.abs(libm)))
