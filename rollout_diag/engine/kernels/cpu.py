"""The compiled CPU kernels (numba): one pass over a chunk's raw arrays builds its segments and the per-segment
sums, maxima and minima of every kernel token quantity, computed in registers (no token-sized temporaries).

Each quantity is the same float64 formula the torch engine writes (``engine/quantities.py``), and each segment
sum adds in the same order as numpy's ``add.reduceat`` (the first value, then numpy's pairwise summation of the
rest), so the two engines give the same segment sums wherever the per-token values agree (they can differ only
where an exponential does: the kernels' own exp and expm1, below, within 1 and 2 ulp of the C library's; torch's and
numpy's within 1).

Imported lazily: numba compiles on first use, or loads the compiled kernels from its cache (see ``__init__``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit, types, uint64

from rollout_diag.engine.quantities import BANDS, CLIP, COUNTS, EXTREME_BOUNDS, EXTREMES, QUANTITIES, TURN_OFFSETS

CLAMP = 20.0  # = catalogue.CLAMP (clamp20)
# The kernel quantities (their segment sums; maxima and minima of EXTREMES), in the order of the pass's output rows.
COLUMN = {name: index for index, name in enumerate(QUANTITIES)}
EXTREME = {name: index for index, name in enumerate(EXTREMES)}
_Q = len(QUANTITIES)
_E = len(EXTREMES)
_N = len(COUNTS)
_Y, _Y2 = COLUMN["hint_clipped_abs"], COLUMN["hint_clipped_square"]
_ABOVE_LOW, _ABOVE_HIGH = EXTREME_BOUNDS  # ln 2, ln 5
_BAND_NARROW, _BAND_MIDDLE, _BAND_WIDE = BANDS  # 1e-3, 1e-2, 1e-1
_FLAGS: dict[str, Any] = {"cache": True, "nogil": True, "error_model": "numpy"}
_INLINE: dict[str, Any] = {**_FLAGS, "inline": "always"}


# exp and expm1 without libm calls, so that a loop of them runs on SIMD lanes (numba calls libm once per value: the
# five calls a token were 56 % of the fused pass's time, measured by putting a multiply in their place).
# x = n·ln2 + t (Cody–Waite: n·LN2_HI is exact for |n| < 2^11), expm1(t) = t + t²·Σ t^(k−2)/k! (k ≤ 13, |t| ≤ ln2/2:
# the first term left out is below 10^-17 of the value), and 2^n from the exponent bits. Against glibc: exp within
# 1 ulp from −10^4 to overflow, expm1 within 2 for |δ| ≤ ln2/2 (torch's and numpy's are each within 1 ulp of
# glibc's); the torch engine's are the reference the tests compare with (1e-12 relative;
# tests/kernels/test_kernel_exp.py).
_INV_LN2 = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01  # the upper bits of ln 2 (fdlibm's split)
_LN2_LO = 1.90821492927058770002e-10
_HALF_LN2 = 0.34657359027997264
_C = tuple(1.0 / math.factorial(k) for k in range(2, 14))  # 1/2!, …, 1/13!


@njit(**_INLINE)
def _expm1_reduced(t: float) -> float:
    """expm1(t) for |t| ≤ ln2/2 (Horner's rule in t, the lowest term last)."""
    q = _C[11]
    q = q * t + _C[10]
    q = q * t + _C[9]
    q = q * t + _C[8]
    q = q * t + _C[7]
    q = q * t + _C[6]
    q = q * t + _C[5]
    q = q * t + _C[4]
    q = q * t + _C[3]
    q = q * t + _C[2]
    q = q * t + _C[1]
    q = q * t + _C[0]
    return t + (t * t) * q


@njit(**_INLINE)
def _reduce(x: float) -> tuple[float, float]:
    """(n, t) with x = n·ln2 + t, |t| ≤ ln2/2 (x first brought into [−746, 710], where exp's result ends)."""
    x = min(max(x, -746.0), 710.0)
    n = math.floor(x * _INV_LN2 + 0.5)
    return n, (x - n * _LN2_HI) - n * _LN2_LO


@njit(**_INLINE)
def _power_of_two(n: float) -> float:
    """2^n for an integral n in [−1022, 1023], from the exponent bits."""
    return np.int64((np.int64(n) + 1023) << 52).view(np.float64)


@njit(**_INLINE)
def _scaled(value: float, n: float) -> float:
    """value · 2^n rounded once, in two factors: the product with the first (2^-1021 … 2^1023) exact, as ``value``
    lies in [0.7, 1.5] and the product stays normal; the second what is left of n (a subnormal result, where the one
    rounding happens, or one near overflow)."""
    first = min(max(n, -1021.0), 1023.0)
    return value * _power_of_two(first) * _power_of_two(n - first)


@njit(**_INLINE)
def _exp(x: float) -> float:
    n, t = _reduce(x)
    return _scaled(1.0 + _expm1_reduced(t), n)


# Compiled once and called where one token at a time needs it (the scalar quantity): inlined there too it added
# seconds to the first compile.
@njit(**_FLAGS)
def _exp_scalar(x: float) -> float:
    return _exp(x)


@njit(**_INLINE)
def _expm1_pair(d: float) -> tuple[float, float]:
    """(expm1(δ), expm1(−δ)) for |δ| ≤ ln2/2, from one polynomial: expm1(±δ) = ±δ + δ²·(E(δ²) ± δ·O(δ²)), E and O
    the even and odd halves of :func:`_expm1_reduced`'s."""
    d2 = d * d
    even = _C[10]
    even = even * d2 + _C[8]
    even = even * d2 + _C[6]
    even = even * d2 + _C[4]
    even = even * d2 + _C[2]
    even = even * d2 + _C[0]
    odd = _C[11]
    odd = odd * d2 + _C[9]
    odd = odd * d2 + _C[7]
    odd = odd * d2 + _C[5]
    odd = odd * d2 + _C[3]
    odd = odd * d2 + _C[1]
    return d + d2 * (even + d * odd), -d + d2 * (even - d * odd)


@njit(**_INLINE)
def _k3_pair(d: float) -> tuple[float, float]:
    """(expm1(δ) − δ, expm1(−δ) + δ) of one token as the fused pass computes them: from one polynomial for
    |δ| ≤ ln2/2; beyond, expm1(±δ) = exp(±δ) − 1 (the subtraction exact where exp(±δ) is within [1/2, 2], and k3 no
    smaller than 0.05 there: within 1e-14 of it)."""
    if abs(d) > _HALF_LN2:
        return (_exp(d) - 1.0) - d, (_exp(-d) - 1.0) + d
    up, down = _expm1_pair(d)
    return up - d, down + d


@njit(**_INLINE)
def _compared_bits(value: float, float32: bool) -> np.int64:
    """The bits of a logprob as compared for ``mismatched``: its float64 bits, or, with ``float32``, those of its
    float32 rounding widened to float64 (exact and one to one, so equal bits ⇔ equal float32 bits)."""
    compared = np.float64(np.float32(value)) if float32 else value
    return np.float64(compared).view(np.int64)


@njit(**_INLINE)
def _quantities(
    trainer: np.ndarray,
    rollout: np.ndarray,
    start: int,
    size: int,
    out: np.ndarray,
    probabilities: bool,
    float32: bool,
) -> tuple[int, int, int, int, int, int]:
    """Every kernel quantity (QUANTITIES, in order) of tokens [start, start + size) into ``out[:, k]``, with the torch
    engine's formulas but the exponentials of this module. A loop without branches or calls, so it runs on SIMD lanes;
    it takes both expm1 from one polynomial (:func:`_expm1_pair`), right for |δ| ≤ ln2/2 (nearly every token: 3·10^-5
    of them beyond in the synthetic dumps), and a second loop redoes the tokens beyond, if any (:func:`_k3_pair`).
    Without ``probabilities`` p_a, p_r and |p_a − p_r| are left 0 and their two exps are not taken (3.5 of the fused
    pass's ~20 ns a token; the flag's branch in the loop costs the pass with them ~0.6). Returns the tokens' COUNTS
    (integers, in order), counted in a second loop over what the first wrote (in the first, their six counters cost
    the loop ~2 ns a token: 26.2 against 24.5 ns a token for the fused pass, in-process on a 10 M-token dump)."""
    wide = 0
    mismatched, above_low, above_high, within_narrow, within_middle, within_wide = 0, 0, 0, 0, 0, 0
    for k in range(size):
        a, r = trainer[start + k], rollout[start + k]
        d = a - r
        ad = abs(d)
        c = min(max(d, -CLAMP), CLAMP)
        y = min(ad, CLIP)
        up, down = _expm1_pair(d)
        if probabilities:
            pa = _exp(a)
            pr = _exp(r)
        else:
            pa = 0.0
            pr = 0.0
        out[0, k] = a
        out[1, k] = r
        out[2, k] = d
        out[3, k] = ad
        out[4, k] = up - d
        out[5, k] = _exp(c * 2.0)
        out[6, k] = d * d
        out[7, k] = c
        out[8, k] = 0.5 * c * c
        out[9, k] = pa
        out[10, k] = pr
        out[11, k] = abs(pa - pr)
        out[12, k] = y
        out[13, k] = y * y
        out[14, k] = d * r
        out[15, k] = r * r
        out[16, k] = down + d
        wide += ad > _HALF_LN2
    for k in range(size):  # the counts: a loop of their own (the docstring)
        mismatched += _compared_bits(out[0, k], float32) != _compared_bits(out[1, k], float32)
        ad = out[3, k]
        above_low += ad > _ABOVE_LOW
        above_high += ad > _ABOVE_HIGH
        within_narrow += ad <= _BAND_NARROW
        within_middle += ad <= _BAND_MIDDLE
        within_wide += ad <= _BAND_WIDE
    if wide:
        for k in range(size):
            d = trainer[start + k] - rollout[start + k]
            if abs(d) > _HALF_LN2:
                out[4, k], out[16, k] = _k3_pair(d)
    return mismatched, above_low, above_high, within_narrow, within_middle, within_wide


@njit(**_INLINE)
def _block(values: np.ndarray, lo: int, n: int) -> float:
    """numpy's pairwise sum of at most 128 values: 8 accumulators, then the rest in order. Indexed with unsigned
    integers: numba then drops the negative-index wrap of every read and the eight chains run side by side (half the
    time per value; ``kernels/presets.py`` keeps its own copy, as numba's cache keys a kernel on its own file)."""
    if n < 8:
        total = -0.0
        for i in range(lo, lo + n):
            total += values[i]
        return total
    j = uint64(lo)
    end = uint64(lo + n - n % 8)
    r0, r1, r2, r3 = values[j], values[j + uint64(1)], values[j + uint64(2)], values[j + uint64(3)]
    r4, r5, r6, r7 = values[j + uint64(4)], values[j + uint64(5)], values[j + uint64(6)], values[j + uint64(7)]
    j += uint64(8)
    while j < end:
        r0 += values[j]
        r1 += values[j + uint64(1)]
        r2 += values[j + uint64(2)]
        r3 += values[j + uint64(3)]
        r4 += values[j + uint64(4)]
        r5 += values[j + uint64(5)]
        r6 += values[j + uint64(6)]
        r7 += values[j + uint64(7)]
        j += uint64(8)
    total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    for i in range(lo + n - n % 8, lo + n):
        total += values[i]
    return total


@njit(**_INLINE)
def _bad_logprob(value: float, positive_max: float) -> bool:
    """NaN, ±inf or above ``positive_max``; written without branches, so the scan's loop has none."""
    return (value != value) | (value > positive_max) | (value == -np.inf)


@njit(**_FLAGS)
def checked_model_values(trainer: np.ndarray, rollout: np.ndarray, mask: np.ndarray, positive_max: float):
    """A block's logprobs as float64 with environment tokens (mask 0) zeroed, its model-token mask (bool), and
    whether it is clean: every mask value 0 or 1, both logprobs of every model token finite and ≤ ``positive_max``
    (the tolerance as the values' own dtype rounds it: a float32 value compares as the numpy comparison of
    ``io.validate.validate_block`` does). It only flags: a block that is not clean goes through ``validate_block``,
    which finds the rows and says what is wrong where."""
    tokens = trainer.shape[0]
    out_trainer = np.empty(size_class(tokens))[:tokens]
    out_rollout = np.empty(size_class(tokens))[:tokens]
    model = np.empty(size_class(tokens), np.bool_)[:tokens]
    bad = False
    for t in range(tokens):
        m = mask[t]
        kept = m == 1
        a = np.float64(trainer[t]) if kept else 0.0
        r = np.float64(rollout[t]) if kept else 0.0
        bad |= ((m != 0) & ~kept) | _bad_logprob(a, positive_max) | _bad_logprob(r, positive_max)
        out_trainer[t] = a
        out_rollout[t] = r
        model[t] = kept
    return out_trainer, out_rollout, model, not bad


@njit(**_FLAGS)
def checked_values(trainer: np.ndarray, rollout: np.ndarray, positive_max: float):
    """``checked_model_values`` of a block without a mask column (every token a model token): float64 copies and
    whether every logprob is finite and ≤ ``positive_max``."""
    tokens = trainer.shape[0]
    out_trainer = np.empty(size_class(tokens))[:tokens]
    out_rollout = np.empty(size_class(tokens))[:tokens]
    bad = False
    for t in range(tokens):
        a, r = np.float64(trainer[t]), np.float64(rollout[t])
        bad |= _bad_logprob(a, positive_max) | _bad_logprob(r, positive_max)
        out_trainer[t] = a
        out_rollout[t] = r
    return out_trainer, out_rollout, not bad


_ALL_TRUE = np.uint64(0x0101010101010101)  # eight bytes of a bool array, each True


@njit(**_INLINE)
def size_class(n: int) -> int:
    """``n`` rounded up to one of eight sizes per doubling (at most 12.5 % more), from 65 536 up: the length a kernel
    allocates for a chunk-sized array of ``n`` values, returning the first ``n``. Chunks differ in their token count
    (rows, row groups and steps cut them), so their arrays came in as many sizes as chunks, and the C heap, which keeps
    freed arrays for the next ones (``rollout_diag.memory``), could not fit one into another: its free space grew with
    the input (1G tokens of compare-presets peaked at 734–940 MiB over five runs, 100M at 596). In a few sizes each
    freed array fits a later one: 682–720 MiB over five runs, ~1 % less wall time (issue 20 session 12)."""
    if n < 65536:
        return n
    step = 1 << (_bits(n) - 4)
    return (n + step - 1) // step * step


@njit(**_INLINE)
def _bits(p: int) -> int:
    """0 → 0, 1 → 1, 2–3 → 2, 4–7 → 3, …: the position bucket of position ``p``."""
    b = 0
    while (p >> b) > 0:
        b += 1
    return b


@njit(**_FLAGS)
def segment_layout(mask: np.ndarray, offsets: np.ndarray):
    """The segments of a chunk: maximal runs of model tokens (mask 1) in one row, one round (run without a skipped
    token) and one log2 position bucket. Returns int64 arrays [S]: raw start (index into the chunk's tokens), model
    start (index into its model tokens), length, row, position bucket, round.

    One scan of the mask finds the runs of model tokens; the rest is work per run: a run [p0, p1) of a row's
    positions is one round, cut where a position is a power of two (a new bucket)."""
    rows = offsets.shape[0] - 1
    # runs: at most one per row plus one per environment token (untouched pages of np.empty cost nothing)
    run_start = np.empty(size_class(mask.shape[0] + 1), np.int64)
    run_end = np.empty(size_class(mask.shape[0] + 1), np.int64)
    run_row = np.empty(size_class(mask.shape[0] + 1), np.int64)
    runs = 0
    count = 0
    # a run's inside read eight mask bytes at a time (0.56 → 0.27 ns a token on 10m's chunks, the same segments)
    words = mask[: mask.shape[0] // 8 * 8].view(np.uint64)
    for i in range(rows):
        lo, hi = offsets[i], offsets[i + 1]
        t = lo
        while t < hi:
            if not mask[t]:
                t += 1
                continue
            end = t + 1
            while end < hi and end & 7 and mask[end]:  # up to a word's start
                end += 1
            while end + 8 <= hi and end & 7 == 0 and words[end >> 3] == _ALL_TRUE:  # whole words of True
                end += 8
            while end < hi and mask[end]:  # the rest, byte by byte
                end += 1
            run_start[runs], run_end[runs], run_row[runs] = t, end, i
            runs += 1
            # the run's first position, and every power of two after it and before its end, opens a segment
            count += 1 + max(_bits(end - lo - 1) - _bits(t - lo), 0)
            t = end
    raw = np.empty(size_class(count), np.int64)[:count]
    model = np.empty(size_class(count), np.int64)[:count]
    length = np.empty(size_class(count), np.int64)[:count]
    row = np.empty(size_class(count), np.int64)[:count]
    bucket = np.empty(size_class(count), np.int64)[:count]
    rounds = np.empty(size_class(count), np.int64)[:count]
    s = 0
    seen = 0
    current_round = -1
    for k in range(runs):
        i = run_row[k]
        current_round = 0 if k == 0 or run_row[k - 1] != i else current_round + 1
        lo = offsets[i]
        p, p_end = run_start[k] - lo, run_end[k] - lo
        while p < p_end:
            b = _bits(p)
            cut = min(p_end, 1 << b) if p > 0 else 1  # the next power of two after p
            raw[s] = lo + p
            model[s] = seen
            length[s] = cut - p
            row[s] = i
            bucket[s] = b
            rounds[s] = current_round
            seen += cut - p
            s += 1
            p = cut
    return raw, model, length, row, bucket, rounds


@njit(**_INLINE)
def _delta_bin(d: float, exponent_min: int, levels: int) -> int:
    """The δ histogram's bin of ``d`` (``metrics.localize.delta_bin``) without a call to frexp: frexp's exponent is the
    IEEE-754 exponent field − 1022 (0 and subnormals give at most −1022, below any ``exponent_min``: the centre, as
    frexp's), and the sign bit picks the side."""
    bits = np.float64(d).view(np.int64)
    magnitude = min(max(((bits >> 52) & 0x7FF) - 1022 - exponent_min, 0), levels)
    return levels - magnitude if bits < 0 else levels + magnitude


@njit(**_INLINE)
def _probability_bucket(
    into: np.ndarray, r: float, ad: float, y: float, d: float, k3: float, log_edges: np.ndarray
) -> None:
    """A model token counted into ``into`` (one step group's [B, 6]): [tokens, Σ|δ|, Σy, Σy², Σδ, Σk3] of its
    rollout-probability bucket, the number of ``log_edges`` above r."""
    b = 0
    for e in range(log_edges.shape[0]):
        if r < log_edges[e]:
            b += 1
    into[b, 0] += 1.0
    into[b, 1] += ad
    into[b, 2] += y
    into[b, 3] += y * y
    into[b, 4] += d
    into[b, 5] += k3


@njit(**_INLINE)
def _exact_zero(
    a: float, r: float, log_half: float, zeros: float, zero_runs: float, prev_zero: bool, prev_counted: bool
):
    """The exact-zero pattern at one token (a logprob of exactly 0 where the other side says p < 0.5): (zeros,
    zero_runs, zero, counted) after it, from the running counts and whether the round's previous token was one (and
    counted in a run)."""
    zero = (r == 0.0 and a < log_half) or (a == 0.0 and r < log_half)
    counted = False
    if zero:
        zeros += 1.0
        if prev_zero:
            if not prev_counted:
                zero_runs += 1.0
            zero_runs += 1.0
            counted = True
    return zeros, zero_runs, zero, counted


@njit(**_INLINE)
def _next_pair(
    a: float, r: float, a1: float, r1: float, gap: float, shift_next: float, shift_prev: float, copied: float
):
    """A token (a, r) and the next one of its round (a1, r1): the shift sums and the exact-copy count after the pair."""
    shift_next += abs(a1 - r)
    shift_prev += abs(a - r1)
    if (r1 == r and r1 != 0.0 and abs(a1 - a) > gap) or (a1 == a and a1 != 0.0 and abs(r1 - r) > gap):
        copied += 1.0
    return shift_next, shift_prev, copied


@njit(**_INLINE)
def _leaf(
    trainer,
    rollout,
    start,
    size,
    group,
    scratch,
    sums,
    extremes,
    pairs,
    moments,
    histogram,
    exponent_min,
    levels,
    hints,
    pair_end,
):
    """Tokens [start, start + size) of one segment (size ≤ 128): their values into ``scratch``, each quantity's sum
    in numpy's block order into ``sums``, extremes into ``extremes``; the block's centred moments merged into the
    step group's (Chan) and its δ counted into the group's histogram; each token's hint patterns (the per-token work of
    the hint rows) into ``hints``: probability buckets and the row's running sums (a token before ``pair_end`` has
    a next one in its round). The values come first, from a loop of their own on SIMD lanes (:func:`_quantities`); the
    per-token loop after it holds what branches or runs in token order. The extremes of EXTREMES ([max, min] rows of
    ``extremes``) are kept in registers over the loop: updated in memory, each token's max and min waited on the
    previous token's store (0.6–1.2 of ~20 ns a token, measured); the same comparisons in the same order."""
    probability, running, log_edges, log_half, gap, probabilities, float32, tally = hints
    zeros, zero_runs, shift_next, shift_prev, copied = running[0], running[1], running[2], running[3], running[4]
    prev_zero, prev_counted = running[5] != 0.0, running[6] != 0.0
    into = probability[group]
    counted = _quantities(trainer, rollout, start, size, scratch, probabilities, float32)
    for c in range(_N):  # the segment's COUNTS: exact integers, in any order
        tally[c] += counted[c]
    max_ad, max_c, max_k2, max_diff = extremes[0, 0], extremes[0, 1], extremes[0, 2], extremes[0, 3]
    min_ad, min_c, min_k2, min_diff = extremes[1, 0], extremes[1, 1], extremes[1, 2], extremes[1, 3]
    for k in range(size):
        t = start + k
        a, r = trainer[t], rollout[t]
        ad, c, half_square, diff = scratch[3, k], scratch[7, k], scratch[8, k], scratch[11, k]
        max_ad, min_ad = max(max_ad, ad), min(min_ad, ad)
        max_c, min_c = max(max_c, c), min(min_c, c)
        max_k2, min_k2 = max(max_k2, half_square), min(min_k2, half_square)
        max_diff, min_diff = max(max_diff, diff), min(min_diff, diff)
        histogram[group, _delta_bin(scratch[2, k], exponent_min, levels)] += 1.0
        # the hint patterns (the reference pass's per-token work, the same additions in order) on |δ|, y as written
        _probability_bucket(into, r, ad, scratch[12, k], scratch[2, k], scratch[4, k], log_edges)
        if a == 0.0 or r == 0.0:  # a candidate for the exact-zero pattern (the common token skips its tests)
            zeros, zero_runs, prev_zero, prev_counted = _exact_zero(
                a, r, log_half, zeros, zero_runs, prev_zero, prev_counted
            )
        else:
            prev_zero, prev_counted = False, False
        if t < pair_end:  # the next token of the round
            shift_next, shift_prev, copied = _next_pair(
                a, r, trainer[t + 1], rollout[t + 1], gap, shift_next, shift_prev, copied
            )
    extremes[0, 0], extremes[0, 1], extremes[0, 2], extremes[0, 3] = max_ad, max_c, max_k2, max_diff
    extremes[1, 0], extremes[1, 1], extremes[1, 2], extremes[1, 3] = min_ad, min_c, min_k2, min_diff
    running[0], running[1], running[2], running[3], running[4] = zeros, zero_runs, shift_next, shift_prev, copied
    running[5], running[6] = 1.0 if prev_zero else 0.0, 1.0 if prev_counted else 0.0
    for q in range(_Q):
        sums[q] = _block(scratch[q], 0, size)
    for p in range(pairs.shape[0]):
        column_x, column_y = pairs[p, 0], pairs[p, 1]
        x, y = scratch[column_x], scratch[column_y]
        mean_x = sums[column_x] / size  # the block sum just taken: _block(x, 0, size)
        mean_y = sums[column_y] / size
        m2_x, m2_y, c_xy = 0.0, 0.0, 0.0
        if column_x == column_y:  # a quantity's own spread: M2_y and C_xy add the very terms of M2_x
            for k in range(size):
                dx = x[k] - mean_x
                m2_x += dx * dx
            m2_y, c_xy = m2_x, m2_x
        else:
            for k in range(size):
                dx, dy = x[k] - mean_x, y[k] - mean_y
                m2_x += dx * dx
                m2_y += dy * dy
                c_xy += dx * dy
        into = moments[group, p]
        n_a = into[0]
        n = n_a + size
        delta_x, delta_y = mean_x - into[1], mean_y - into[2]
        cross = n_a * size / n
        into[0] = n
        into[1] += delta_x * size / n
        into[2] += delta_y * size / n
        into[3] += m2_x + delta_x * delta_x * cross
        into[4] += m2_y + delta_y * delta_y * cross
        into[5] += c_xy + delta_x * delta_y * cross


@njit(**_FLAGS)
def segment_pass(
    trainer: np.ndarray,
    rollout: np.ndarray,
    raw: np.ndarray,
    length: np.ndarray,
    segment_group: np.ndarray,
    groups: int,
    pairs: np.ndarray,
    exponent_min: int,
    levels: int,
    row: np.ndarray,
    rounds: np.ndarray,
    rows: int,
    log_half: float,
    gap: float,
    log_edges: np.ndarray,
    probabilities: bool,
    float32: bool,
):
    """The fused pass over every segment's tokens, each read once. Returns per segment and kernel quantity the sum
    (numpy reduceat's order: the first value plus numpy's pairwise sum of the rest; float64 [Q, S]), per segment
    the max and min of each of EXTREMES (float64 [E, S] each);
    per step group and quantity pair (``pairs`` [P, 2] of column indices) [n, mean_x, mean_y, M2_x, M2_y, C_xy]
    ([G, P, 6], blocks merged by Chan's update); per step group the δ histogram of ``metrics.localize.delta_bin``
    ([G, 2·levels + 1]); and the hint rows (tests/kernels/test_kernel_fused_hints.py holds a separate pass, their
    reference): per row the HINT_COLUMNS [R, 13], per step group and rollout-probability bucket [tokens, Σ|δ|, Σy, Σy²,
    Σδ, Σk3] [G, B, 6], each value the same additions in the same order (the leaves follow the tokens in order). Without
    ``probabilities`` (a pass whose families read none of them: ``compare-presets``, §1, the catastrophic tokens and
    the hint evidence) the columns of trainer_prob, rollout_prob and prob_diff (and prob_diff's extremes) are 0
    (:func:`_quantities`), and ``pairs`` is then empty: the moment pairs are the debug family's probabilities
    (``kernels.prepass.MOMENT_PAIRS``). Then per segment its COUNTS (float64 [N, S], exact), the logprobs compared as
    float32 where ``float32`` (either column was float32 in the dump). Last, metrics.hints' turn sums: per step group
    [tokens, Σy, Σy²] of the first TURN_OFFSETS model tokens of each round by offset, round 0's then later rounds'
    ([G·2·TURN_OFFSETS, 3]), and the later rounds' (round ≥ 1) tokens and segment sums of y and y² ([3, G]), y =
    min(|δ|, CLIP) with NaN kept (np.minimum's); added in the order of the torch engine's bincounts (rounds, then
    offsets; segments), so the same bits. They are read here, where the round's first tokens are in cache: gathered
    afterwards from a chunk's arrays they cost ~1 ms a chunk of cache and TLB misses.

    One function with the flag read at run time: two entry points with it a constant (the body inlined into each)
    saved that 0.6 ns a token but took 6.7 s each to compile against 4.6 s, and compare-presets compiled both."""
    segments = raw.shape[0]
    sums = np.empty((_Q, segments))
    maxima = np.empty((_E, segments))
    minima = np.empty((_E, segments))
    moments = np.zeros((groups, pairs.shape[0], 6))
    histogram = np.zeros((groups, 2 * levels + 1))
    per_row = np.zeros((rows, 13))
    probability = np.zeros((groups, log_edges.shape[0] + 1, 6))
    # the row's running hint sums (HINT_COLUMNS 10, 11, 8, 9, 12) and the exact-zero run's state, carried leaf to leaf
    running = np.zeros(7)
    counts = np.empty((_N, segments))
    tally = np.zeros(_N)
    turns = np.zeros((groups * 2 * TURN_OFFSETS, 3))
    later = np.zeros((3, groups))
    into_round = 0  # the round's model tokens before this segment
    hints = (probability, running, log_edges, log_half, gap, probabilities, float32, tally)
    scratch = np.empty((_Q, 128))
    block = np.empty(_Q)
    first = np.empty(_Q)
    extremes = np.empty((2, _E))
    starts = np.empty(64, np.int64)
    sizes = np.empty(64, np.int64)
    stage = np.empty(64, np.int64)  # 0: nothing done, 1: left half under way, 2: right half under way
    left = np.empty((64, _Q))
    for s in range(segments):
        g, i = segment_group[s], row[s]
        opens = s == 0 or row[s - 1] != i or rounds[s - 1] != rounds[s]
        continues = s + 1 < segments and row[s + 1] == i and rounds[s + 1] == rounds[s]
        lo, n = raw[s], length[s]
        if opens:  # the round's first token
            y = min(abs(trainer[lo] - rollout[lo]), CLIP)
            per_row[i, 0] += y
            per_row[i, 1] += y * y
            running[5] = 0.0
            into_round = 0
        late = rounds[s] >= 1
        turn = (g * 2 + (1 if late else 0)) * TURN_OFFSETS + into_round
        for k in range(min(n, TURN_OFFSETS - into_round)):  # the round's first tokens, by offset
            value = abs(trainer[lo + k] - rollout[lo + k])
            y = CLIP if value > CLIP else value
            turns[turn + k, 0] += 1.0
            turns[turn + k, 1] += y
            turns[turn + k, 2] += y * y
        into_round += n
        running[0], running[1], running[2] = per_row[i, 10], per_row[i, 11], per_row[i, 8]
        running[3], running[4] = per_row[i, 9], per_row[i, 12]
        pair_end = lo + n if continues else lo + n - 1
        extremes[0, :] = -np.inf
        extremes[1, :] = np.inf
        for c in range(_N):
            tally[c] = 0.0
        # the segment's first token (a leaf of its own, into ``first``), then numpy's pairwise tree over the rest (into
        # ``block``), its recursion on an explicit stack; one call site of the leaf (inlined: each site compiles anew)
        head = True
        rest = n - 1
        depth = 0
        if rest > 0:
            starts[0], sizes[0], stage[0] = lo + 1, rest, 0
            depth = 1
        else:
            block[:] = -0.0
        while head or depth > 0:
            if head:
                leaf_start, leaf_size, into = lo, 1, first
            else:
                top = depth - 1
                leaf_size = sizes[top]
                if leaf_size > 128:
                    stage[top] = 1
                    half = leaf_size // 2
                    half -= half % 8
                    starts[depth], sizes[depth], stage[depth] = starts[top], half, 0
                    depth += 1
                    continue
                leaf_start, into = starts[top], block
            _leaf(
                trainer,
                rollout,
                leaf_start,
                leaf_size,
                g,
                scratch,
                into,
                extremes,
                pairs,
                moments,
                histogram,
                exponent_min,
                levels,
                hints,
                pair_end,
            )
            if head:
                head = False
                continue
            depth -= 1
            while depth > 0:  # hand the finished sums up the tree
                parent = depth - 1
                if stage[parent] == 1:
                    for q in range(_Q):  # a loop, not ``left[parent, :] = block``: that compiled a 2 s error path
                        left[parent, q] = block[q]
                    stage[parent] = 2
                    half = sizes[parent] // 2
                    half -= half % 8
                    starts[depth], sizes[depth], stage[depth] = starts[parent] + half, sizes[parent] - half, 0
                    depth += 1
                    break
                for q in range(_Q):
                    block[q] = left[parent, q] + block[q]
                depth -= 1
        for q in range(_Q):
            sums[q, s] = first[q] + block[q]
        for e in range(_E):
            maxima[e, s] = extremes[0, e]
            minima[e, s] = extremes[1, e]
        for c in range(_N):
            counts[c, s] = tally[c]
        if late:
            later[0, g] += np.float64(n)
            later[1, g] += sums[_Y, s]
            later[2, g] += sums[_Y2, s]
        per_row[i, 10], per_row[i, 11], per_row[i, 8] = running[0], running[1], running[2]
        per_row[i, 9], per_row[i, 12] = running[3], running[4]
        if not continues:  # the round's last token
            last = lo + n - 1
            ad = abs(trainer[last] - rollout[last])
            per_row[i, 7] += ad
            if s + 1 == segments or row[s + 1] != i:  # the row's last token
                y = min(ad, CLIP)
                per_row[i, 2] = y
                per_row[i, 3] = y * y
                if opens and n == 1:  # also its round's first
                    per_row[i, 4] = 1.0
                    per_row[i, 5] = y
                    per_row[i, 6] = y * y
    return sums, maxima, minima, moments, histogram, counts, per_row, probability, turns, later


@njit(**_FLAGS)
def segment_count_above(
    trainer: np.ndarray, rollout: np.ndarray, raw: np.ndarray, length: np.ndarray, largest: np.ndarray, bound: float
):
    """Per segment: model tokens with |a − r| > bound (float64 [S], exact counts). ``largest``: each segment's max
    |a − r| (the fused pass's): a segment whose max is not above the bound is not read."""
    out = np.zeros(raw.shape[0])
    for s in range(raw.shape[0]):
        if not largest[s] > bound:
            continue
        lo = raw[s]
        count = 0
        for t in range(lo, lo + length[s]):
            if abs(trainer[t] - rollout[t]) > bound:
                count += 1
        out[s] = count
    return out


@njit(**_FLAGS)
def _value(q: int, a: float, r: float) -> float:
    """Kernel quantity ``q`` (a column of QUANTITIES) of one model token, as :func:`_quantities` computes it."""
    d = a - r
    c = min(max(d, -CLAMP), CLAMP)
    y = min(abs(d), CLIP)
    if q == 0:
        return a
    if q == 1:
        return r
    if q == 2:
        return d
    if q == 3:
        return abs(d)
    if q == 4:
        return _k3_pair(d)[0]
    if q == 5:
        return _exp_scalar(c * 2.0)
    if q == 6:
        return d * d
    if q == 7:
        return c
    if q == 8:
        return 0.5 * c * c
    if q == 9:
        return _exp_scalar(a)
    if q == 10:
        return _exp_scalar(r)
    if q == 11:
        return abs(_exp_scalar(a) - _exp_scalar(r))
    if q == 12:
        return y
    if q == 13:
        return y * y
    if q == 14:
        return d * r
    if q == 15:
        return r * r
    return _k3_pair(d)[1]


@njit(**_FLAGS)
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


# Columns of the hint rows (segment_pass's ``hints`` per row).
HINT_COLUMNS = (
    "first_y",  # Σ y over the first token of each round
    "first_y2",
    "last_y",  # y of the row's last model token
    "last_y2",
    "both",  # 1 where the row's last round is one token (its last token is also a round's first)
    "both_y",
    "both_y2",
    "round_last_abs",  # Σ |δ| over the last token of each round
    "shift_next",  # Σ |a[k+1] − r[k]| over adjacent pairs of a round
    "shift_prev",  # Σ |a[k] − r[k+1]|
    "dummy_zero",  # exact zeros where the other side says p < 0.5
    "dummy_zero_run",  # those of them next to another in the same round
    "copied",  # exact copies of the neighbour's value where the other side moves by more than ``gap``
)


@njit(**_FLAGS)
def tokens_at_least(
    trainer: np.ndarray,
    rollout: np.ndarray,
    raw: np.ndarray,
    model: np.ndarray,
    length: np.ndarray,
    largest: np.ndarray,
    floor: float,
):
    """Model-token indices (ascending) and |δ| of the tokens with |a − r| ≥ floor: the worst-token prefilter.
    ``largest``: each segment's max |a − r| (the fused pass's): a segment whose max is below the floor is not read."""
    count = 0
    for s in range(raw.shape[0]):
        if not largest[s] >= floor:
            continue
        for t in range(raw[s], raw[s] + length[s]):
            if abs(trainer[t] - rollout[t]) >= floor:
                count += 1
    index = np.empty(count, np.int64)
    values = np.empty(count)
    found = 0
    for s in range(raw.shape[0]):
        if not largest[s] >= floor:
            continue
        lo = raw[s]
        for t in range(lo, lo + length[s]):
            value = abs(trainer[t] - rollout[t])
            if value >= floor:
                index[found] = model[s] + (t - lo)
                values[found] = value
                found += 1
    return index, values


def _c(dtype: types.Type, ndim: int = 1, readonly: bool = False) -> types.Array:
    return types.Array(dtype, ndim, "C", readonly=readonly)


_F, _I = _c(types.float64), _c(types.int64)
# Every specialisation of each kernel (numba compiles one per distinct set of argument types, dtypes, layouts and
# read-only flags, a full compile each): the call sites hand the kernels these types only (the scan's inputs as
# read-only views, an integer mask wider than a byte as int64), and tests/kernels/test_compile.py runs the commands and
# fails on any other. The scan has one per logprob dtype and mask width; everything after it reads its float64
# output and int64 layouts.
_SEGMENT_PASS = (
    (
        *(_F, _F, _I, _I, _I, types.int64, _c(types.int64, 2), types.int64, types.int64),  # the segment sums
        *(_I, _I, types.int64, types.float64, types.float64, _F),  # the hint rows
        types.boolean,
        types.boolean,
    ),
)
SIGNATURES: dict[str, tuple[tuple[types.Type, ...], ...]] = {
    "checked_model_values": tuple(
        (_c(value, readonly=True), _c(value, readonly=True), _c(mask, readonly=True), types.float64)
        for value in (types.float32, types.float64)
        for mask in (types.uint8, types.int64)
    ),
    "checked_values": tuple(
        (_c(value, readonly=True), _c(value, readonly=True), types.float64) for value in (types.float32, types.float64)
    ),
    "segment_layout": ((_c(types.boolean), _I),),
    "segment_pass": _SEGMENT_PASS,
    "segment_count_above": ((_F, _F, _I, _I, _F, types.float64),),
    "_value": ((types.int64, types.float64, types.float64),),
    "_exp_scalar": ((types.float64,),),
    "group_centred": ((_F, _F, _I, _I, _I, types.int64, types.int64, types.int64, _F, _F),),
    "tokens_at_least": ((_F, _F, _I, _I, _I, _F, types.float64),),
}
