"""The compiled pass of the presets' token quantities (numba): one pass over a chunk's segments computes every
derived token quantity the chosen presets read (truncated and IcePop weights, clamped weights and statistics, bound
flags: ``metrics/correction.py`` ``Derived``) in registers, and reduces each per segment: the sum in numpy
reduceat's order (the first value, then numpy's pairwise sum of the rest), the maximum and minimum, and, where asked,
the step group's centred moments. No token-sized temporary.

The IS weight w = exp(c) is read, not computed: it is torch's exp (the torch engine's ``token_is_weight``), so a weight
that lands on a truncation or IcePop bound falls on the side verl's torch puts it (libm's exp, numba's, differs from
torch's in the last bit for about 5 % of values: measured, docs/benchmarks.md). Everything else is computed here with
the torch engine's float64 formulas, so each per-token value is the torch engine's, bit for bit.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rollout_diag.kernels.cpu import CLAMP, _block

# The token quantities a derived one is made from (``Derived.base``), by code.
KINDS = {"log_ratio": 0, "clamped_log_ratio": 1, "token_is_weight": 2, "rs_k1": 3, "rs_k2": 4, "rs_k3": 5}
# What a derived quantity does to its base value v (``Derived.op``), by code; flags are 1.0 / 0.0.
OPS = {
    "tis": 0,  # min(v, U)
    "icepop": 1,  # v inside [L, U], else 0
    "clamp": 2,  # min(max(v, L), U)
    "above": 3,  # v > U
    "below": 4,  # v < L
    "outside": 5,  # not (L ≤ v ≤ U)
    "beyond": 6,  # v < L or v > U
    "not_at_most": 7,  # not (v ≤ U)
}
_FLAGS = {"cache": True, "nogil": True, "error_model": "numpy"}


@njit(**{**_FLAGS, "inline": "always"})
def _bases(d: float, w: float, out: np.ndarray) -> None:
    """The base quantities of a token (KINDS order) with δ = ``d`` and IS weight ``w`` (torch's exp(c))."""
    c = min(max(d, -CLAMP), CLAMP)
    out[0] = d
    out[1] = c
    out[2] = w
    out[3] = -c
    out[4] = 0.5 * c * c
    out[5] = (w - 1.0) - c


@njit(**{**_FLAGS, "inline": "always"})
def _derived(op: int, lower: float, upper: float, v: float) -> float:
    """Derived quantity ``op`` of base value ``v``."""
    if op == 0:
        return min(v, upper)
    if op == 1:
        return v if (v >= lower and v <= upper) else 0.0
    if op == 2:
        return min(max(v, lower), upper)
    if op == 3:
        return 1.0 if v > upper else 0.0
    if op == 4:
        return 1.0 if v < lower else 0.0
    if op == 5:
        return 0.0 if (v >= lower and v <= upper) else 1.0
    if op == 6:
        return 1.0 if (v < lower or v > upper) else 0.0
    return 0.0 if v <= upper else 1.0


@njit(**_FLAGS)
def _pairwise(values: np.ndarray, lo: int, n: int) -> float:
    """numpy's pairwise sum of ``values[lo:lo + n]`` (blocks of 128, halves cut at a multiple of 8), its recursion on
    an explicit stack (numba's cache cannot hold a recursive function)."""
    if n <= 128:
        return _block(values, lo, n)
    starts = np.empty(64, np.int64)
    sizes = np.empty(64, np.int64)
    stage = np.zeros(64, np.int64)  # 0: nothing done, 1: left half under way, 2: right half under way
    left = np.empty(64)
    starts[0], sizes[0] = lo, n
    depth = 1
    result = 0.0
    while depth > 0:
        top = depth - 1
        if sizes[top] > 128:
            stage[top] = 1
            half = sizes[top] // 2
            half -= half % 8
            starts[depth], sizes[depth], stage[depth] = starts[top], half, 0
            depth += 1
            continue
        result = _block(values, starts[top], sizes[top])
        depth -= 1
        while depth > 0:  # hand the finished sum up the tree
            parent = depth - 1
            if stage[parent] == 1:
                left[parent] = result
                stage[parent] = 2
                half = sizes[parent] // 2
                half -= half % 8
                starts[depth], sizes[depth], stage[depth] = starts[parent] + half, sizes[parent] - half, 0
                depth += 1
                break
            result = left[parent] + result
            depth -= 1
    return result


@njit(**_FLAGS)
def preset_pass(
    trainer: np.ndarray,
    rollout: np.ndarray,
    weight: np.ndarray,
    raw: np.ndarray,
    model: np.ndarray,
    length: np.ndarray,
    segment_group: np.ndarray,
    groups: int,
    codes: np.ndarray,
    bounds: np.ndarray,
):
    """Every derived quantity q (``codes[q]`` = (kind, op), ``bounds[q]`` = (L, U)) of every segment's tokens, each
    token read once: per segment the sum (numpy reduceat's order), the maximum and the minimum (float64 [Q, S] each).
    ``weight``: torch's exp(c) at each model token (index ``model[s] + k``), or empty when no quantity reads w or k3."""
    quantities = codes.shape[0]
    segments = raw.shape[0]
    sums = np.empty((quantities, segments))
    maxima = np.empty((quantities, segments))
    minima = np.empty((quantities, segments))
    longest = 1
    for s in range(segments):
        longest = max(longest, length[s])
    scratch = np.empty((quantities, longest))
    counts = np.zeros(quantities, np.int64)
    base = np.empty(6)
    has_weight = weight.shape[0] > 0
    for s in range(segments):
        size = length[s]
        counts[:] = 0
        for k in range(size):
            t = raw[s] + k
            _bases(trainer[t] - rollout[t], weight[model[s] + k] if has_weight else 1.0, base)
            for q in range(quantities):
                op = codes[q, 1]
                value = _derived(op, bounds[q, 0], bounds[q, 1], base[codes[q, 0]])
                if op >= 3:  # a flag: its count is its sum in any order
                    counts[q] += value > 0.0
                else:
                    scratch[q, k] = value
        for q in range(quantities):
            if codes[q, 1] >= 3:
                sums[q, s] = counts[q]
                maxima[q, s] = 1.0 if counts[q] > 0 else 0.0
                minima[q, s] = 1.0 if counts[q] == size else 0.0
                continue
            row = scratch[q]
            rest = _pairwise(row, 1, size - 1) if size > 1 else -0.0
            sums[q, s] = row[0] + rest
            largest, smallest = row[0], row[0]
            for k in range(1, size):
                largest = max(largest, row[k])
                smallest = min(smallest, row[k])
            maxima[q, s], minima[q, s] = largest, smallest
    return sums, maxima, minima


@njit(**_FLAGS)
def centred_pass(
    trainer: np.ndarray,
    rollout: np.ndarray,
    weight: np.ndarray,
    raw: np.ndarray,
    model: np.ndarray,
    length: np.ndarray,
    segment_group: np.ndarray,
    codes: np.ndarray,
    bounds: np.ndarray,
    means: np.ndarray,
):
    """Σ (x − mean)² per step group of each derived quantity (float64 [G, Q]), the group's ``means`` [G, Q] taken
    first (the torch engine's two passes: a constant quantity gives exactly 0)."""
    quantities = codes.shape[0]
    out = np.zeros(means.shape)
    base = np.empty(6)
    has_weight = weight.shape[0] > 0
    for s in range(raw.shape[0]):
        g = segment_group[s]
        for k in range(length[s]):
            t = raw[s] + k
            _bases(trainer[t] - rollout[t], weight[model[s] + k] if has_weight else 1.0, base)
            for q in range(quantities):
                centred = _derived(codes[q, 1], bounds[q, 0], bounds[q, 1], base[codes[q, 0]]) - means[g, q]
                out[g, q] += centred * centred
    return out
