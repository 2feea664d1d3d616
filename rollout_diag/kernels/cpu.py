"""The compiled CPU kernels (numba): one pass over a chunk's raw arrays builds its segments and the per-segment
sums, maxima and minima of every kernel token quantity, computed in registers (no token-sized temporaries).

Each quantity is the same float64 formula the torch engine writes (``metrics/segments.py``), and each segment
sum adds in the same order as numpy's ``add.reduceat`` (the first value, then numpy's pairwise summation of the
rest), so the two engines give the same segment sums wherever the per-token values agree (they can differ by an
ulp only where the two engines' ``exp`` do).

Imported lazily: numba compiles on first use, or loads the compiled kernels from its cache (see ``__init__``).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

CLAMP = 20.0  # = catalogue.CLAMP (clamp20)
CLIP = 1.0  # = metrics.hints.CLIP
# The kernel quantities, in the order of the kernel's output columns.
QUANTITIES = (
    "trainer",
    "rollout",
    "log_ratio",
    "abs_log_ratio",
    "k3",
    "chi2_term",
    "square",
    "skyrl_k3",
    "clamped_log_ratio",
    "rs_k2",
    "trainer_prob",
    "rollout_prob",
    "prob_diff",
    "rs_k1",
    "hint_clipped_abs",
    "hint_clipped_square",
    "hint_cross",
    "hint_rollout_square",
)
COLUMN = {name: index for index, name in enumerate(QUANTITIES)}
_Q = len(QUANTITIES)


@njit(cache=True, nogil=True)
def _values(a: float, r: float, out: np.ndarray, k: int) -> None:
    """Every kernel quantity of one model token (a = trainer, r = rollout logprob) into ``out[:, k]``."""
    d = a - r
    ad = abs(d)
    c = min(max(d, -CLAMP), CLAMP)
    pa = math.exp(a)
    pr = math.exp(r)
    y = min(ad, CLIP)
    out[0, k] = a
    out[1, k] = r
    out[2, k] = d
    out[3, k] = ad
    out[4, k] = math.expm1(d) - d
    out[5, k] = math.exp(c * 2.0)
    out[6, k] = d * d
    out[7, k] = math.expm1(-d) + d
    out[8, k] = c
    out[9, k] = 0.5 * c * c
    out[10, k] = pa
    out[11, k] = pr
    out[12, k] = abs(pa - pr)
    out[13, k] = -c
    out[14, k] = y
    out[15, k] = y * y
    out[16, k] = d * r
    out[17, k] = r * r


@njit(cache=True, nogil=True)
def _block(values: np.ndarray, lo: int, n: int) -> float:
    """numpy's pairwise sum of at most 128 values: 8 accumulators, then the rest in order."""
    if n < 8:
        total = -0.0
        for i in range(lo, lo + n):
            total += values[i]
        return total
    r0, r1, r2, r3 = values[lo], values[lo + 1], values[lo + 2], values[lo + 3]
    r4, r5, r6, r7 = values[lo + 4], values[lo + 5], values[lo + 6], values[lo + 7]
    i = 8
    while i < n - n % 8:
        j = lo + i
        r0 += values[j]
        r1 += values[j + 1]
        r2 += values[j + 2]
        r3 += values[j + 3]
        r4 += values[j + 4]
        r5 += values[j + 5]
        r6 += values[j + 6]
        r7 += values[j + 7]
        i += 8
    total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        total += values[lo + i]
        i += 1
    return total


@njit(cache=True, nogil=True)
def _pairwise(values: np.ndarray, lo: int, n: int) -> float:
    """numpy's pairwise sum of values[lo:lo + n], in its order: blocks of up to 128 values, and above that the sum
    of the two halves (the first a multiple of 8 long). The recursion runs on an explicit stack (numba's cache does
    not keep recursive functions)."""
    if n <= 128:
        return _block(values, lo, n)
    starts = np.empty(64, np.int64)
    sizes = np.empty(64, np.int64)
    stage = np.empty(64, np.int64)  # 0: nothing done, 1: left half under way, 2: right half under way
    left = np.empty(64)
    starts[0], sizes[0], stage[0] = lo, n, 0
    depth = 1
    while True:
        top = depth - 1
        size = sizes[top]
        if size > 128:
            stage[top] = 1
            half = size // 2
            half -= half % 8
            starts[depth], sizes[depth], stage[depth] = starts[top], half, 0
            depth += 1
            continue
        total = _block(values, starts[top], size)
        depth -= 1
        while True:  # hand the finished sum up
            if depth == 0:
                return total
            parent = depth - 1
            if stage[parent] == 1:
                left[parent] = total
                stage[parent] = 2
                half = sizes[parent] // 2
                half -= half % 8
                starts[depth], sizes[depth], stage[depth] = starts[parent] + half, sizes[parent] - half, 0
                depth += 1
                break
            total = left[parent] + total
            depth -= 1


@njit(cache=True, nogil=True)
def segment_layout(mask: np.ndarray, offsets: np.ndarray):
    """The segments of a chunk: maximal runs of model tokens (mask 1) in one row, one round (run without a skipped
    token) and one log2 position bucket. Returns int64 arrays [S]: raw start (index into the chunk's tokens), model
    start (index into its model tokens), length, row, position bucket, round."""
    rows = offsets.shape[0] - 1
    count = 0
    for i in range(rows):
        lo = offsets[i]
        previous = -2
        for t in range(lo, offsets[i + 1]):
            if mask[t]:
                p = t - lo
                if p != previous + 1 or (p & (p - 1)) == 0:
                    count += 1
                previous = p
    raw = np.empty(count, np.int64)
    model = np.empty(count, np.int64)
    length = np.zeros(count, np.int64)
    row = np.empty(count, np.int64)
    bucket = np.empty(count, np.int64)
    rounds = np.empty(count, np.int64)
    s = -1
    seen = 0
    for i in range(rows):
        lo = offsets[i]
        previous = -2
        current_round = -1
        for t in range(lo, offsets[i + 1]):
            if mask[t]:
                p = t - lo
                gap = p != previous + 1
                if gap or (p & (p - 1)) == 0:
                    s += 1
                    if gap:
                        current_round += 1
                    raw[s] = t
                    model[s] = seen
                    row[s] = i
                    b = 0
                    while (p >> b) > 0:
                        b += 1
                    bucket[s] = b
                    rounds[s] = current_round
                length[s] += 1
                seen += 1
                previous = p
    return raw, model, length, row, bucket, rounds


@njit(cache=True, nogil=True)
def segment_reductions(trainer: np.ndarray, rollout: np.ndarray, raw: np.ndarray, length: np.ndarray):
    """Per segment and kernel quantity: sum (numpy reduceat's order), max and min. float64 [Q, S] each."""
    segments = raw.shape[0]
    sums = np.empty((_Q, segments))
    maxima = np.empty((_Q, segments))
    minima = np.empty((_Q, segments))
    longest = 0
    for s in range(segments):
        longest = max(longest, length[s])
    scratch = np.empty((_Q, longest))
    for s in range(segments):
        lo, n = raw[s], length[s]
        for k in range(n):
            _values(trainer[lo + k], rollout[lo + k], scratch, k)
        for q in range(_Q):
            column = scratch[q]
            first = column[0]
            high, low = first, first
            for k in range(1, n):
                v = column[k]
                if v > high:
                    high = v
                if v < low:
                    low = v
            sums[q, s] = first + _pairwise(column, 1, n - 1)
            maxima[q, s] = high
            minima[q, s] = low
    return sums, maxima, minima


@njit(cache=True, nogil=True)
def segment_count_above(trainer: np.ndarray, rollout: np.ndarray, raw: np.ndarray, length: np.ndarray, bound: float):
    """Per segment: model tokens with |a − r| > bound (float64 [S], exact counts)."""
    out = np.zeros(raw.shape[0])
    for s in range(raw.shape[0]):
        lo = raw[s]
        count = 0
        for t in range(lo, lo + length[s]):
            if abs(trainer[t] - rollout[t]) > bound:
                count += 1
        out[s] = count
    return out


@njit(cache=True, nogil=True)
def _value(q: int, a: float, r: float) -> float:
    d = a - r
    if q == 0:
        return a
    if q == 1:
        return r
    if q == 2:
        return d
    if q == 3:
        return abs(d)
    if q == 4:
        return math.expm1(d) - d
    c = min(max(d, -CLAMP), CLAMP)
    if q == 5:
        return math.exp(c * 2.0)
    if q == 6:
        return d * d
    if q == 7:
        return math.expm1(-d) + d
    if q == 8:
        return c
    if q == 9:
        return 0.5 * c * c
    if q == 10:
        return math.exp(a)
    if q == 11:
        return math.exp(r)
    if q == 12:
        return abs(math.exp(a) - math.exp(r))
    if q == 13:
        return -c
    y = min(abs(d), CLIP)
    if q == 14:
        return y
    if q == 15:
        return y * y
    if q == 16:
        return d * r
    return r * r


@njit(cache=True, nogil=True)
def group_centred(
    trainer: np.ndarray,
    rollout: np.ndarray,
    raw: np.ndarray,
    length: np.ndarray,
    group: np.ndarray,
    groups: int,
    x: int,
    y: int,
    mean_x: np.ndarray,
    mean_y: np.ndarray,
):
    """Per step group [M2_x, M2_y, C_xy]: centred sums of quantities x and y (y < 0: none) about the given means."""
    out = np.zeros((groups, 3))
    for s in range(raw.shape[0]):
        g = group[s]
        mx, my = mean_x[g], mean_y[g] if y >= 0 else 0.0
        sxx, syy, sxy = 0.0, 0.0, 0.0
        lo = raw[s]
        for t in range(lo, lo + length[s]):
            a, r = trainer[t], rollout[t]
            dx = _value(x, a, r) - mx
            sxx += dx * dx
            if y >= 0:
                dy = dx if y == x else _value(y, a, r) - my
                syy += dy * dy
                sxy += dx * dy
        out[g, 0] += sxx
        out[g, 1] += syy
        out[g, 2] += sxy
    return out


@njit(cache=True, nogil=True)
def group_delta_histogram(
    trainer: np.ndarray,
    rollout: np.ndarray,
    raw: np.ndarray,
    length: np.ndarray,
    group: np.ndarray,
    groups: int,
    exponent_min: int,
    levels: int,
):
    """Per step group, counts of δ by the bins of ``metrics.localize.delta_bin`` (float64 [G, 2·levels + 1])."""
    out = np.zeros((groups, 2 * levels + 1))
    for s in range(raw.shape[0]):
        g = group[s]
        lo = raw[s]
        for t in range(lo, lo + length[s]):
            d = trainer[t] - rollout[t]
            magnitude = 0
            if d != 0.0:
                magnitude = min(max(math.frexp(d)[1] - exponent_min, 0), levels)
            out[g, levels - magnitude if d < 0.0 else levels + magnitude] += 1.0
    return out
