"""The compiled pass of the presets' token quantities (numba): one pass over a chunk's segments computes every
derived token quantity the chosen presets read (truncated and IcePop weights, clamped weights and statistics, bound
flags: ``engine/quantities.py`` ``Derived``) and reduces each per segment: the sum in numpy reduceat's order (the
first value, then numpy's pairwise sum of the rest), the maximum and minimum; with it the sweep's signed histogram
of c (``metrics/sweep.py``), and in a second pass the step groups' centred moments. Per segment the base quantities
(δ, c, w, k1, k2, k3, the gates) are laid out once in a scratch block the size of the longest segment, and each
derived quantity's op runs over them in a loop of its own. No token-sized temporary beyond c and w (and the gates'
values the centred pass reads, where a moment needs them).

The IS weight w = exp(c) is read, not computed: it is numpy's exp of the c that :func:`clamped_tokens` writes, the
exp the torch engine takes on the CPU too (``arrays.host_exp``: the torch engine's ``token_is_weight``), so a weight
that lands on a truncation or IcePop bound falls on the same side in both engines, on any CPU (numba's exp, libm's,
and torch's differ from numpy's in the last bit for some values: about 5 % between torch's and numpy's without
AVX-512; docs/benchmarks.md). The probability gates' p = exp(a), q = exp(r) and logs are this module's own
(:func:`_gate_exp`, :func:`_gate_log`: fdlibm's rational forms, within 1 ulp of libm's; no libm call, so the loop
runs on SIMD lanes), computed in the pass from the logprobs; the torch engine takes the same functions on the CPU
(:func:`gate_exp`, :func:`gate_log`; ``engine.formulas.gate_values``), so each gate is the same bits in both.
Everything else is computed here with the torch engine's float64 formulas, so each per-token value is the torch
engine's on the CPU, bit for bit; the histogram's bins are found from the exact edges of the engines' formula
(``metrics.sweep.exact_bin_edges``), not from a log10 of our own.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np
from numba import njit, types, uint64

from rollout_diag.engine.kernels.cpu import CLAMP, size_class
from rollout_diag.engine.quantities import BKL_EPS, KPOP_EPS, PRESET_BASES

# The token quantities a derived one is made from (``Derived.base``), by code.
KINDS = {name: code for code, name in enumerate(PRESET_BASES)}
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
_FLAGS: dict[str, Any] = {"cache": True, "nogil": True, "error_model": "numpy"}
BASES = len(PRESET_BASES)
KPOP, BKL, TV = KINDS["rs_kpop"], KINDS["rs_bkl"], KINDS["rs_tv"]
EPS_WIDE, EPS_NARROW = BKL_EPS, KPOP_EPS  # the gates' clamps: OpenRLHF's, AReaL's
CENTRED_LANES = 8  # the centred pass's sums side by side (``centred_pass``)

# The gates' exp and log (fdlibm 5.3's e_exp.c and e_log.c, their rational forms and constants), written without
# branches or libm calls so that a loop of them runs on SIMD lanes; no fused multiply-add (numba does not contract),
# so a value's result is the same bits in a vectorised loop and a scalar call. Within 1 ulp of libm's (glibc) over
# every float64 (tests/kernels/test_kernel_gates.py: dense grids, p -> 0 and p -> 1, logprob 0, -inf and huge
# negatives, subnormals); about 9 % of exps and 2-8 % of logs differ from numpy's in the last bit.
_INV_LN2 = 1.44269504088896338700e00
_LN2_HI = 6.93147180369123816490e-01  # ln 2 in two parts: n * _LN2_HI is exact for |n| < 2^11
_LN2_LO = 1.90821492927058770002e-10
_EXP_P = (1.66666666666666019037e-01, -2.77777777770155933842e-03, 6.61375632143793436117e-05,
          -1.65339022054652515390e-06, 4.13813679705723846039e-08)  # fmt: skip
_LOG_LG = (6.666666666666735130e-01, 3.999999999940941908e-01, 2.857142874366239149e-01, 2.222219843214978396e-01,
           1.818357216161805012e-01, 1.531383769920937332e-01, 1.479819860511658591e-01)  # fmt: skip
_TWO_54 = 18014398509481984.0  # 2^54: a subnormal log argument scaled into the normal range
_SMALLEST_NORMAL_BITS = 0x0010000000000000


@njit(**{**_FLAGS, "inline": "always"})
def _power_of_two(n: float) -> float:
    """2^n for an integral n in [-1022, 1023], from the exponent bits."""
    return np.int64((np.int64(n) + 1023) << 52).view(np.float64)


@njit(**{**_FLAGS, "inline": "always"})
def _gate_exp(x: float) -> float:
    """exp(x), fdlibm's way: x = k·ln2 + r (|r| ≤ ln2/2), exp(r) = 1 + 2r/(2 − R(r)) with R's rational
    approximation, then 2^k in two exact factors (the second rounds a subnormal result once). x is first brought into
    [-746, 710], where exp's result ends (0 below, inf above): -inf gives 0."""
    x = min(max(x, -746.0), 710.0)
    k = math.floor(x * _INV_LN2 + 0.5)
    high = x - k * _LN2_HI
    low = k * _LN2_LO
    r = high - low
    t = r * r
    c = r - t * (_EXP_P[0] + t * (_EXP_P[1] + t * (_EXP_P[2] + t * (_EXP_P[3] + t * _EXP_P[4]))))
    y = 1.0 - ((low - (r * c) / (2.0 - c)) - high)
    first = min(max(k, -1021.0), 1023.0)
    return y * _power_of_two(first) * _power_of_two(k - first)


@njit(**{**_FLAGS, "inline": "always"})
def _gate_log(x: float) -> float:
    """log(x), fdlibm's way: x = 2^k·(1 + f) with √2/2 ≤ 1 + f < √2, s = f/(2 + f),
    log(1 + f) = f − s·(f − R(s²)) (or, for larger f, f − (f²/2 − s·(f²/2 + R))), R's rational approximation; both
    forms computed and one chosen, so there is no branch. A subnormal x is scaled by 2^54 first; 0 gives -inf, a
    negative x NaN, +inf and NaN themselves."""
    bits = np.float64(x).view(np.int64)
    subnormal = bits < _SMALLEST_NORMAL_BITS  # or zero, or negative: the selects at the end give those
    scaled = np.float64(x * _TWO_54).view(np.int64)
    bits = scaled if subnormal else bits
    high = np.int64(bits >> 32)
    k = (high >> 20) - 1023 - (54 if subnormal else 0)
    high &= 0x000FFFFF
    half = (high + 0x95F64) & 0x100000  # the mantissa's exponent: 1 + f or (1 + f)/2, whichever lies near 1
    k += half >> 20
    f = np.int64(((high | (half ^ 0x3FF00000)) << 32) | (bits & 0xFFFFFFFF)).view(np.float64) - 1.0
    s = f / (2.0 + f)
    scale = np.float64(k)
    z = s * s
    w = z * z
    r = z * (_LOG_LG[0] + w * (_LOG_LG[2] + w * (_LOG_LG[4] + w * _LOG_LG[6])))
    r += w * (_LOG_LG[1] + w * (_LOG_LG[3] + w * _LOG_LG[5]))
    half_square = 0.5 * f * f
    wide = scale * _LN2_HI - ((half_square - (s * (half_square + r) + scale * _LN2_LO)) - f)
    narrow = scale * _LN2_HI - ((s * (f - r) - scale * _LN2_LO) - f)
    out = wide if ((high - 0x6147A) | (0x6B851 - high)) > 0 else narrow
    out = out if x > 0.0 else (-np.inf if x == 0.0 else np.nan)
    return out if x < np.inf else x  # +inf; NaN (no comparison holds) stays NaN


@njit(**_FLAGS)
def gate_exp(values: np.ndarray) -> np.ndarray:
    """:func:`_gate_exp` of each value (float64 [n]): the torch engine's exp of the gates' p and q on the CPU."""
    out = np.empty_like(values)
    for k in range(values.shape[0]):
        out[k] = _gate_exp(values[k])
    return out


@njit(**_FLAGS)
def gate_log(values: np.ndarray) -> np.ndarray:
    """:func:`_gate_log` of each value (float64 [n]): the torch engine's log of the gates' ratios on the CPU."""
    out = np.empty_like(values)
    for k in range(values.shape[0]):
        out[k] = _gate_log(values[k])
    return out


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


@njit(**{**_FLAGS, "inline": "always"})
def _block_sum(values: np.ndarray, lo: int, n: int) -> float:
    """numpy's pairwise sum of at most 128 values (``values[lo:lo + n]``): 8 accumulators, then the rest in order;
    ``kernels.cpu._block``'s sum, indexed with unsigned integers (numba then drops the negative-index wrap of every
    read, and the eight chains run side by side: half the time per value, measured). Kept here rather than imported:
    numba's cache keys a kernel on its own file, so a kernel that inlines another file's function is not recompiled
    when that file changes."""
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


@njit(**_FLAGS)
def _pairwise(values: np.ndarray, lo: int, n: int) -> float:
    """numpy's pairwise sum of ``values[lo:lo + n]`` (blocks of 128, halves cut at a multiple of 8)."""
    return _pairwise_on(values, lo, n, np.empty((3, 64), np.int64), np.empty(64))


@njit(**{**_FLAGS, "inline": "always"})
def _pairwise_on(values: np.ndarray, lo: int, n: int, stack: np.ndarray, left: np.ndarray) -> float:
    """``_pairwise`` with its recursion on an explicit stack the caller allocates once (numba's cache cannot hold a
    recursive function): ``stack`` int64 [3, 64] (start, size, stage of each level), ``left`` float64 [64]."""
    if n <= 128:
        return _block_sum(values, lo, n)
    starts, sizes, stage = stack[0], stack[1], stack[2]  # stage 0: nothing done, 1: left half under way, 2: right
    starts[0], sizes[0], stage[0] = lo, n, 0
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
        result = _block_sum(values, starts[top], sizes[top])
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
def clamped_tokens(trainer: np.ndarray, rollout: np.ndarray, raw: np.ndarray, model: np.ndarray, length: np.ndarray):
    """c = clamp20(δ) at every model token (float64 [M], index ``model[s] + k``): what numpy's exp turns into the IS
    weights (the torch engine's ``clamped_log_ratio``, value for value), without model-token arrays of δ."""
    total = 0
    for s in range(raw.shape[0]):
        total += length[s]
    out = np.empty(size_class(total))[:total]
    for s in range(raw.shape[0]):
        r, m = uint64(raw[s]), uint64(model[s])  # unsigned: no negative-index wrap per read
        for k in range(length[s]):
            i = uint64(k)
            out[m + i] = min(max(trainer[r + i] - rollout[r + i], -CLAMP), CLAMP)
    return out


@njit(**{**_FLAGS, "inline": "always"})
def _fill_gates(
    trainer: np.ndarray, rollout: np.ndarray, start: int, size: int, bases: np.ndarray, moved: np.ndarray
) -> None:
    """kpop, bkl, tv (``bases`` rows KPOP, BKL, TV) of a segment's ``size`` tokens (raw index ``start + k``;
    ``bases[0]`` holds δ): ``engine.formulas.gate_values`` operation for operation, with this module's exp and log.
    Every token first as where no clamp moves p or q (then p' = p, q' = q, log(p'/q') = δ and BKL's complement is
    KPOP's: one loop without a branch, on SIMD lanes, marking in ``moved`` (uint8, at least ``size`` + 8) the tokens a
    clamp moves), then those tokens again, found eight marks at a time (``_moved_gates``)."""
    # the segment's rows as views: the loop then reads and writes 1-D arrays only, which LLVM vectorises (indexing
    # the 2-D block and the raw arrays at an offset, it did not: 2.5 against 1.2 ns an exp, measured)
    trainer_row, rollout_row = trainer[start : start + size], rollout[start : start + size]
    kpop, bkl, tv = bases[KPOP], bases[BKL], bases[TV]
    count = 0
    for k in range(size):
        a, r = trainer_row[k], rollout_row[k]
        delta = a - r
        p, q = _gate_exp(a), _gate_exp(r)
        p8, q8 = min(max(p, EPS_NARROW), 1.0 - EPS_NARROW), min(max(q, EPS_NARROW), 1.0 - EPS_NARROW)
        log_complement = _gate_log((1.0 - p8) / (1.0 - q8))
        forward = p * delta + (1.0 - p) * log_complement
        reverse = -(q * delta + (1.0 - q) * log_complement)
        kpop[k] = max(max(forward, reverse), 0.0)
        bkl[k] = max(reverse, 0.0)
        tv[k] = abs(p - q)
        flag = (p < EPS_WIDE) | (p > 1.0 - EPS_WIDE) | (q < EPS_WIDE) | (q > 1.0 - EPS_WIDE)  # NaN: not moved
        moved[k] = flag
        count += flag
    if count == 0:
        return
    words = moved.view(np.uint64)
    for word in range((size + 7) // 8):
        if words[word] == 0:
            continue
        for k in range(8 * word, min(8 * word + 8, size)):
            if moved[k] != 0:
                bases[KPOP, k], bases[BKL, k] = _moved_gates(bases[0, k], trainer[start + k], rollout[start + k])
        words[word] = 0  # the marks cleared for the next segment (the last word's beyond ``size`` never set)


@njit(**{**_FLAGS, "inline": "always"})
def _moved_gates(delta: float, trainer: float, rollout: float) -> tuple[float, float]:
    """(kpop, bkl) of a token whose p or q a clamp moves (``engine.formulas._binary_kl_pair`` under KPOP_EPS and
    BKL_EPS): log(p'/q') where a clamp moves p or q, else δ; BKL's complement where it is not KPOP's."""
    p, q = _gate_exp(trainer), _gate_exp(rollout)
    p8, q8 = min(max(p, EPS_NARROW), 1.0 - EPS_NARROW), min(max(q, EPS_NARROW), 1.0 - EPS_NARROW)
    p6, q6 = min(max(p, EPS_WIDE), 1.0 - EPS_WIDE), min(max(q, EPS_WIDE), 1.0 - EPS_WIDE)
    lc8 = _gate_log((1.0 - p8) / (1.0 - q8))
    lr8 = delta if (p8 == p and q8 == q) else _gate_log(p8 / q8)
    lr6 = delta if (p6 == p and q6 == q) else _gate_log(p6 / q6)
    lc6 = lc8 if (p6 == p8 and q6 == q8) else _gate_log((1.0 - p6) / (1.0 - q6))
    forward = p8 * lr8 + (1.0 - p8) * lc8
    reverse = -(q8 * lr8 + (1.0 - q8) * lc8)
    return max(max(forward, reverse), 0.0), max(-(q6 * lr6 + (1.0 - q6) * lc6), 0.0)


@njit(**{**_FLAGS, "inline": "always"})
def _marks(longest: int) -> np.ndarray:
    """The ``moved`` marks of :func:`_fill_gates` for segments of at most ``longest`` tokens, all clear."""
    return np.zeros(longest + 8 - longest % 8, np.uint8)


@njit(**{**_FLAGS, "inline": "always"})
def _needed(codes: np.ndarray) -> np.ndarray:
    """Which base quantities (KINDS) the derived quantities ``codes`` read."""
    needed = np.zeros(BASES, np.bool_)
    for q in range(codes.shape[0]):
        needed[codes[q, 0]] = True
    return needed


@njit(**{**_FLAGS, "inline": "always"})
def _fill_bases(
    trainer: np.ndarray,
    rollout: np.ndarray,
    weight: np.ndarray,
    start: int,
    first: int,
    size: int,
    needed: np.ndarray,
    bases: np.ndarray,
    moved: np.ndarray,
) -> None:
    """The base quantities (KINDS rows of ``bases``) of a segment's ``size`` tokens (raw index ``start + k``, model
    index ``first + k``), with the torch engine's float64 formulas; w is read (numpy's exp), 1.0 without weights; the
    probability gates (kpop, bkl, tv), all three where one is needed, with this module's exp and log
    (``_fill_gates``; ``moved``: its marks)."""
    has_weight = weight.shape[0] > 0
    raw, model = uint64(start), uint64(first)  # unsigned: no negative-index wrap per read
    for k in range(size):
        i = uint64(k)
        d = trainer[raw + i] - rollout[raw + i]
        bases[0, i] = d
        bases[1, i] = min(max(d, -CLAMP), CLAMP)
    if needed[2] or needed[5]:
        for k in range(size):
            i = uint64(k)
            bases[2, i] = weight[model + i] if has_weight else 1.0
    _fill_statistics(size, needed, bases)
    if needed[KPOP] or needed[BKL] or needed[TV]:
        _fill_gates(trainer, rollout, start, size, bases, moved)


@njit(**{**_FLAGS, "inline": "always"})
def _fill_statistics(size: int, needed: np.ndarray, bases: np.ndarray) -> None:
    """§3's k1 = −c, k2 = ½·c², k3 = (w − 1) − c (``bases`` rows 3–5, where needed) from c and w (rows 1, 2)."""
    if needed[3]:
        for k in range(size):
            bases[3, k] = -bases[1, k]
    if needed[4]:
        for k in range(size):
            c = bases[1, k]
            bases[4, k] = 0.5 * c * c
    if needed[5]:
        for k in range(size):
            bases[5, k] = (bases[2, k] - 1.0) - bases[1, k]


@njit(**{**_FLAGS, "inline": "always"})
def _flag_count(op: int, lower: float, upper: float, bases: np.ndarray, kind: int, size: int) -> int:
    """Tokens of ``bases[kind, :size]`` that flag ``op`` marks (``_derived`` = 1.0), the op chosen once per segment.
    The row is indexed in ``bases`` rather than taken as a view: a view per quantity and segment cost its reference
    counting (with the call-site block sum below, 343 against 472 ns of fixed cost a segment of 8 tokens)."""
    count = 0
    if op == 3:
        for k in range(size):
            count += bases[kind, k] > upper
    elif op == 4:
        for k in range(size):
            count += bases[kind, k] < lower
    elif op == 5:
        for k in range(size):
            count += not (bases[kind, k] >= lower and bases[kind, k] <= upper)
    elif op == 6:
        for k in range(size):
            count += bases[kind, k] < lower or bases[kind, k] > upper
    else:
        for k in range(size):
            count += not (bases[kind, k] <= upper)
    return count


@njit(**{**_FLAGS, "inline": "always"})
def _fill_values(op: int, lower: float, upper: float, bases: np.ndarray, kind: int, size: int, out: np.ndarray) -> None:
    """``_derived(op, …)`` of ``bases[kind, :size]`` into ``out`` (a weight or a clamped value: ops 0–2; a clamp to
    [−inf, inf] copies the base value bit for bit)."""
    if op == 0:
        for k in range(size):
            out[k] = min(bases[kind, k], upper)
    elif op == 1:
        for k in range(size):
            v = bases[kind, k]
            out[k] = v if (v >= lower and v <= upper) else 0.0
    else:
        for k in range(size):
            out[k] = min(max(bases[kind, k], lower), upper)


@njit(**{**_FLAGS, "inline": "always"})
def _extremes(values: np.ndarray, size: int) -> tuple[float, float]:
    """(max, min) of ``values[:size]`` (size ≥ 1), the value numpy's reduceat finds scanning in order: of equal
    values (+0.0 and −0.0 compare equal) the first. Four contiguous quarters are scanned side by side (four
    independent chains, not one) and their results taken in order, the later one only where strictly larger
    (smaller), which keeps the first of equal values as the scan in order does."""
    quarter = size // 4
    if quarter < 2:
        largest, smallest = values[0], values[0]
        for k in range(1, size):
            largest = max(largest, values[k])
            smallest = min(smallest, values[k])
        return largest, smallest
    a0, a1, a2, a3 = values[0], values[quarter], values[2 * quarter], values[3 * quarter]
    b0, b1, b2, b3 = a0, a1, a2, a3
    for k in range(1, quarter):
        v0, v1, v2, v3 = values[k], values[quarter + k], values[2 * quarter + k], values[3 * quarter + k]
        a0 = v0 if v0 > a0 else a0
        a1 = v1 if v1 > a1 else a1
        a2 = v2 if v2 > a2 else a2
        a3 = v3 if v3 > a3 else a3
        b0 = v0 if v0 < b0 else b0
        b1 = v1 if v1 < b1 else b1
        b2 = v2 if v2 < b2 else b2
        b3 = v3 if v3 < b3 else b3
    for k in range(4 * quarter, size):  # the tail, after the last quarter
        v = values[k]
        a3 = v if v > a3 else a3
        b3 = v if v < b3 else b3
    largest = a1 if a1 > a0 else a0
    largest = a2 if a2 > largest else largest
    largest = a3 if a3 > largest else largest
    smallest = b1 if b1 < b0 else b0
    smallest = b2 if b2 < smallest else smallest
    smallest = b3 if b3 < smallest else smallest
    return largest, smallest


ABS_BITS = 0x7FFFFFFFFFFFFFFF  # the bits of |x| of a float64 x: all but the sign
SLICE_SHIFT = 52 - 6  # a float64's bits >> SLICE_SHIFT: its exponent and the top 6 bits of its mantissa


@njit(**{**_FLAGS, "inline": "always"})
def _count_signed_bins(
    clamped: np.ndarray, size: int, edges: np.ndarray, table: np.ndarray, counts: np.ndarray
) -> None:
    """Counts into ``counts`` the sweep's histogram bin of each c in ``clamped[:size]`` (``metrics.sweep.signed_bins``:
    |c|'s bin, plus BINS where c ≤ 0), found from ``edges`` (edges[k], 1 ≤ k < BINS: the smallest |c| the engines'
    formula puts in bin k or above; edges[BINS] = +inf) instead of a log10: ``table`` holds the bin of the lower end
    of each slice of |c| that shares a float64 exponent and the top 6 bits of the mantissa, from edges[1]'s slice on.
    A slice is narrower than a bin, so at most one edge lies inside it (``exact_bin_edges`` checks it): one step over
    it, taken without a branch (a branch there is mispredicted for the tokens near an edge), finds the bin; a loop for
    further edges, which never ran, cost 0.75 ns a token. Indexed with unsigned integers (no negative-index wrap
    per read)."""
    bins = edges.shape[0] - 1
    first = (np.int64(edges[1:2].view(np.int64)[0]) >> SLICE_SHIFT) if bins > 1 else 0
    last = table.shape[0] - 1
    bits = clamped.view(np.int64)
    for k in range(size):
        i = uint64(k)
        value = clamped[i]
        found = table[uint64(min(max(((bits[i] & ABS_BITS) >> SLICE_SHIFT) - first, 0), last))]
        magnitude = abs(value)
        found += magnitude >= edges[uint64(found + 1)]
        counts[uint64(found + bins if value <= 0.0 else found)] += 1


@njit(**{**_FLAGS, "inline": "always"})
def _count_gate_bins(
    bases: np.ndarray, bits: np.ndarray, size: int, edges: np.ndarray, table: np.ndarray, first: int, counts: np.ndarray
) -> None:
    """Counts into ``counts`` (one step group's [3·BINS]) the sweep's bin of |value| (``metrics.sweep.magnitude_bins``)
    of each gate (``bases`` rows KPOP, BKL, TV) of a segment's ``size`` tokens, found from ``edges`` and ``table`` as
    ``_count_signed_bins`` finds c's (``bits``: ``bases`` as int64; ``first``: edges[1]'s slice), a token's three
    gates in one loop."""
    bins = edges.shape[0] - 1
    for k in range(size):
        i = uint64(k)
        found_kpop = _bin_of(bases[KPOP, i], bits[KPOP, i], edges, table, first)
        found_bkl = _bin_of(bases[BKL, i], bits[BKL, i], edges, table, first)
        found_tv = _bin_of(bases[TV, i], bits[TV, i], edges, table, first)
        counts[uint64(found_kpop)] += 1
        counts[uint64(bins + found_bkl)] += 1
        counts[uint64(2 * bins + found_tv)] += 1


@njit(**{**_FLAGS, "inline": "always"})
def _bin_of(value: float, bits: int, edges: np.ndarray, table: np.ndarray, first: int) -> int:
    """The sweep's bin of |value| (``bits``: its float64 bits) from ``edges`` and ``table`` (``_count_signed_bins``)."""
    found = table[uint64(min(max(((bits & ABS_BITS) >> SLICE_SHIFT) - first, 0), table.shape[0] - 1))]
    return found + (abs(value) >= edges[uint64(found + 1)])


@njit(**{**_FLAGS, "inline": "always"})
def _padded(edges: np.ndarray) -> tuple[np.ndarray, int]:
    """The histogram's ``edges`` and +inf (the step over an edge reads no bound check), and the table's first slice
    (edges[1]'s float64 bits >> SLICE_SHIFT)."""
    padded = np.empty(edges.shape[0] + 1)
    for e in range(edges.shape[0]):  # a loop, not a slice assignment: numba compiles ~2 s of broadcast checks for that
        padded[e] = edges[e]
    padded[edges.shape[0]] = np.inf
    first = (np.int64(edges[1:2].view(np.int64)[0]) >> SLICE_SHIFT) if edges.shape[0] > 1 else 0
    return padded, first


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
    extremes: np.ndarray,
    edges: np.ndarray,
    table: np.ndarray,
    keep: np.ndarray,
    kept: np.ndarray,
):
    """Every derived quantity q (``codes[q]`` = (kind, op), ``bounds[q]`` = (L, U)) of every segment's tokens, each
    token read once: per segment the sum (numpy reduceat's order), the maximum and the minimum (float64 [Q, S] each;
    a value quantity's max and min only where ``extremes[q]``, else left unset), and, with ``edges`` (empty: none),
    the sweep's signed histogram of c over each step group's model tokens (``segment_group[s]`` the group of segment
    s; int64 [groups, 2·BINS]: the run's sweep sums them, the per-step sweep keeps them) and, where a quantity reads
    a gate, the histograms of the three gates' values (int64 [groups, 3·BINS], ``_count_gate_bins``).
    ``weight``: numpy's exp(c) at each model token (index ``model[s] + k``), or empty when no quantity reads w or k3.
    ``keep`` (bool [3]): the gates (kpop, bkl, tv) whose values the centred pass reads, written into their rows of
    ``kept`` (float64 [3, ≥ M], at model index ``model[s] + k``; the caller's, reused chunk after chunk: a fresh array
    a chunk cost its pages' faults, 0.6 s of system time at 100 M tokens), so that pass reads them where they lie
    instead of taking the exps and logs again. Per segment the base quantities are laid out once, then each
    quantity's op runs over them in its own loop (the op is chosen once per segment, not per token); a clamp that
    moves no value of the segment takes the reductions of its base's clamp to ±inf, where that came first."""
    quantities = codes.shape[0]
    segments = raw.shape[0]
    sums = np.empty((quantities, segments))
    maxima = np.empty((quantities, segments))
    minima = np.empty((quantities, segments))
    longest = 1
    for s in range(segments):
        longest = max(longest, length[s])
    bases = np.empty((BASES, longest))
    values = np.empty(longest)
    moved = _marks(longest)
    stack, left = np.empty((3, 64), np.int64), np.empty(64)
    needed = _needed(codes)
    histogram = edges.shape[0] > 0
    counts = np.zeros((groups, 2 * edges.shape[0]), np.int64)
    gate_histogram = histogram and (needed[KPOP] or needed[BKL] or needed[TV])
    gate_counts = np.zeros((groups, 3 * edges.shape[0] if gate_histogram else 0), np.int64)
    if gate_histogram or keep[0] or keep[1] or keep[2]:  # every gate's histogram: all three laid out
        needed[KPOP] = needed[BKL] = needed[TV] = True
    bits = bases.view(np.int64)
    padded, first = _padded(edges)
    whole = np.empty(BASES, np.int64)  # per segment: the quantity that reduced a base's own values (clamp to ±inf)
    for s in range(segments):
        size = length[s]
        _fill_bases(trainer, rollout, weight, raw[s], model[s], size, needed, bases, moved)
        _copy_kept(bases, model[s], size, keep, kept)
        if histogram:
            _count_signed_bins(bases[1], size, padded, table, counts[segment_group[s]])
        if gate_histogram:
            _count_gate_bins(bases, bits, size, padded, table, first, gate_counts[segment_group[s]])
        whole[:] = -1
        for q in range(quantities):
            op, lower, upper, kind = codes[q, 1], bounds[q, 0], bounds[q, 1], codes[q, 0]
            if op >= 3:  # a flag: its count is its sum in any order
                count = _flag_count(op, lower, upper, bases, kind, size)
                sums[q, s] = count
                maxima[q, s] = 1.0 if count > 0 else 0.0
                minima[q, s] = 1.0 if count == size else 0.0
                continue
            found = whole[kind]
            if op == 2 and found >= 0 and minima[found, s] >= lower and maxima[found, s] <= upper:
                # a clamp that moves no value of this segment (its base's extremes within the bounds; NaN compares
                # false): min(max(v, L), U) is v bit for bit there (numba's max and min keep the first of equal
                # values), so its reductions are the base's, already taken
                sums[q, s], maxima[q, s], minima[q, s] = sums[found, s], maxima[found, s], minima[found, s]
                continue
            _fill_values(op, lower, upper, bases, kind, size, values)
            # one block (129 tokens at most) summed here, not through _pairwise_on: 16 ns a segment less (measured)
            rest = _block_sum(values, 1, size - 1) if size <= 129 else _pairwise_on(values, 1, size - 1, stack, left)
            sums[q, s] = values[0] + rest
            if extremes[q]:
                maxima[q, s], minima[q, s] = _extremes(values, size)
                if op == 2 and lower == -np.inf and upper == np.inf:  # the base's own values: reused above
                    whole[kind] = q
    return sums, maxima, minima, counts, gate_counts


@njit(**{**_FLAGS, "inline": "always"})
def _copy_kept(bases: np.ndarray, first: int, size: int, keep: np.ndarray, kept: np.ndarray) -> None:
    """The ``keep`` gates' values of a segment (``bases`` rows KPOP, BKL, TV) into their rows of ``kept``, at model
    index ``first + k``."""
    for gate in range(3):
        if keep[gate]:
            source, target = bases[KPOP + gate], kept[gate, first : first + size]
            for k in range(size):
                target[k] = source[k]


@njit(**_FLAGS)
def gate_tokens(
    trainer: np.ndarray,
    rollout: np.ndarray,
    raw: np.ndarray,
    model: np.ndarray,
    length: np.ndarray,
    segment_group: np.ndarray,
    groups: int,
    edges: np.ndarray,
    table: np.ndarray,
):
    """kpop, bkl, tv at every model token (float64 [3, M], index ``model[s] + k``), as the preset pass lays them out;
    with ``edges`` (empty: none), each step group's histograms of them (int64 [groups, 3·BINS])."""
    total, longest = 0, 1
    for s in range(raw.shape[0]):
        total = max(total, model[s] + length[s])
        longest = max(longest, length[s])
    out = np.empty((3, total))
    bases = np.empty((BASES, longest))
    moved = _marks(longest)
    bits = bases.view(np.int64)
    needed = np.zeros(BASES, np.bool_)
    needed[KPOP] = needed[BKL] = needed[TV] = True
    histogram = edges.shape[0] > 0
    counts = np.zeros((groups, 3 * edges.shape[0]), np.int64)
    padded, first = _padded(edges)
    for s in range(raw.shape[0]):
        size, m = length[s], model[s]
        _fill_bases(trainer, rollout, trainer[:0], raw[s], m, size, needed, bases, moved)
        for gate in range(3):
            for k in range(size):
                out[gate, m + k] = bases[KPOP + gate, k]
        if histogram:
            _count_gate_bins(bases, bits, size, padded, table, first, counts[segment_group[s]])
    return out, counts


@njit(**_FLAGS)
def centred_pass(
    trainer: np.ndarray,
    rollout: np.ndarray,
    weight: np.ndarray,
    keep: np.ndarray,
    kept: np.ndarray,
    raw: np.ndarray,
    model: np.ndarray,
    length: np.ndarray,
    segment_group: np.ndarray,
    codes: np.ndarray,
    bounds: np.ndarray,
    means: np.ndarray,
):
    """Σ (x − mean)² per step group of each derived quantity (float64 [G, Q]), the group's ``means`` [G, Q] taken
    first (the torch engine's two passes: a constant quantity gives exactly 0). Each group's sum adds its tokens
    one by one in token order, whatever the segments. Per segment, each quantity's squares (x − mean)² are written
    into a row of a scratch block in a loop of their own (the op chosen once, on SIMD lanes), then up to eight
    quantities' sums run side by side over those rows (independent chains; four where four or fewer are left), so
    a token costs a pass over the rows however many quantities there are, not one pass per four. w and the gates the
    preset pass kept (``keep``: which rows of ``kept`` hold kpop, bkl, tv at every model token) are read where they
    lie, and only the other base quantities the quantities read are laid out (none, when w and kept gates are all
    they read)."""
    quantities = codes.shape[0]
    out = np.zeros(means.shape)
    longest = 1
    for s in range(raw.shape[0]):
        longest = max(longest, length[s])
    needed = _needed(codes)
    lying = np.zeros(BASES, np.bool_)  # the kinds read where they lie: w, the kept gates
    lying[2] = weight.shape[0] > 0
    lying[KPOP], lying[BKL], lying[TV] = keep[0], keep[1], keep[2]
    laid_out = False
    for kind in range(BASES):
        laid_out = laid_out or (needed[kind] and not lying[kind])
        needed[kind] = needed[kind] and not lying[kind]
    bases = np.empty((BASES, longest if laid_out else 1))
    moved = _marks(longest if laid_out else 1)
    squares = np.zeros((CENTRED_LANES, longest))  # rows beyond a pass's quantities: added to sums never written
    for s in range(raw.shape[0]):
        g, size, first = segment_group[s], length[s], model[s]
        if laid_out:
            _fill_bases(trainer, rollout, weight, raw[s], first, size, needed, bases, moved)
        for lane in range(0, quantities, CENTRED_LANES):
            count = min(CENTRED_LANES, quantities - lane)
            for j in range(count):
                q = lane + j
                row = _row(codes[q, 0], lying, weight, kept, bases, first, size)
                _fill_squares(codes[q, 1], bounds[q, 0], bounds[q, 1], means[g, q], row, size, squares, j)
            _add_squares(squares, size, out[g], lane, count)
    return out


@njit(**{**_FLAGS, "inline": "always"})
def _fill_squares(
    op: int, lower: float, upper: float, mean: float, row: np.ndarray, size: int, squares: np.ndarray, j: int
) -> None:
    """(x − mean)² of each of a segment's ``size`` values ``row`` (x = ``_derived(op, …)`` of the value) into row
    ``j`` of ``squares``, the op chosen once."""
    if op == 0:
        for k in range(size):
            c = min(row[k], upper) - mean
            squares[j, k] = c * c
    elif op == 1:
        for k in range(size):
            v = row[k]
            c = (v if (v >= lower and v <= upper) else 0.0) - mean
            squares[j, k] = c * c
    elif op == 2:
        for k in range(size):
            c = min(max(row[k], lower), upper) - mean
            squares[j, k] = c * c
    else:
        for k in range(size):
            c = _derived(op, lower, upper, row[k]) - mean
            squares[j, k] = c * c


@njit(**{**_FLAGS, "inline": "always"})
def _add_squares(squares: np.ndarray, size: int, sums: np.ndarray, lane: int, count: int) -> None:
    """Adds row j of ``squares`` (its first ``size`` values, in token order) to ``sums[lane + j]`` for the ``count``
    rows j (at most eight) that hold a quantity: one chain per row, side by side, four rows where four or fewer hold
    one (eight chains cost 1.09 against 0.83 ns a token for four, in a loop by themselves)."""
    low = _four_sums(sums, lane, count, 0)
    high = _four_sums(sums, lane, count, 4)
    if count <= 4:
        for k in range(size):
            low = _add_four(squares, uint64(k), 0, low)
    else:
        for k in range(size):
            i = uint64(k)
            low = _add_four(squares, i, 0, low)
            high = _add_four(squares, i, 4, high)
    for j in range(4):
        if j < count:
            sums[lane + j] = low[j]
        if 4 + j < count:
            sums[lane + 4 + j] = high[j]


@njit(**{**_FLAGS, "inline": "always"})
def _four_sums(sums: np.ndarray, lane: int, count: int, row: int) -> tuple[float, float, float, float]:
    """The running sums of rows ``row`` to ``row + 3`` (a row beyond ``count`` reads the last one's: never stored)."""
    last = lane + count - 1
    return (
        sums[min(lane + row, last)],
        sums[min(lane + row + 1, last)],
        sums[min(lane + row + 2, last)],
        sums[min(lane + row + 3, last)],
    )


@njit(**{**_FLAGS, "inline": "always"})
def _add_four(
    squares: np.ndarray, i: Any, row: int, sums: tuple[float, float, float, float]
) -> tuple[float, float, float, float]:
    """``sums`` plus token ``i``'s values of rows ``row`` to ``row + 3`` of ``squares``."""
    return (
        sums[0] + squares[row, i],
        sums[1] + squares[row + 1, i],
        sums[2] + squares[row + 2, i],
        sums[3] + squares[row + 3, i],
    )


@njit(**{**_FLAGS, "inline": "always"})
def _row(
    kind: int, lying: np.ndarray, weight: np.ndarray, kept: np.ndarray, bases: np.ndarray, first: int, size: int
) -> np.ndarray:
    """A segment's values of base quantity ``kind``: where they lie (w, a kept gate), else its ``bases`` row."""
    if not lying[kind]:
        return bases[kind]
    if kind == 2:
        return weight[first : first + size]
    return kept[kind - KPOP, first : first + size]


def _c(dtype: types.Type, ndim: int = 1) -> types.Array:
    return types.Array(dtype, ndim, "C")


_F, _I, _F2, _B = _c(types.float64), _c(types.int64), _c(types.float64, 2), _c(types.boolean)
# Every specialisation of each kernel (as ``kernels.cpu.SIGNATURES``): float64 values and weights, int64 layouts and
# codes, whatever the input's dtypes. :func:`compile_signatures` compiles them without data (a helper process does,
# ``kernels.expect_presets``).
SIGNATURES: dict[str, tuple[tuple[types.Type, ...], ...]] = {
    "clamped_tokens": ((_F, _F, _I, _I, _I),),
    "gate_exp": ((_F,),),
    "gate_log": ((_F,),),
    "gate_tokens": ((_F, _F, _I, _I, _I, _I, types.int64, _F, _I),),
    "preset_pass": ((_F, _F, _F, _I, _I, _I, _I, types.int64, _c(types.int64, 2), _F2, _B, _F, _I, _B, _F2),),
    "centred_pass": ((_F, _F, _F, _B, _F2, _I, _I, _I, _I, _c(types.int64, 2), _F2, _F2),),
}
# The preset pass's ``keep`` where the centred pass reads no gate, and its ``kept`` then.
KEEP_NONE = np.zeros(3, np.bool_)
KEPT_NONE = np.zeros((3, 0))


def compile_signatures() -> None:
    """Compile (or load from numba's cache) every kernel of this module for its SIGNATURES, and drop the cache files
    of earlier versions of this source (``kernels.drop_stale_caches``)."""
    from rollout_diag.engine.kernels import drop_stale_caches

    drop_stale_caches(sys.modules[__name__])
    kernels = globals()
    for name, signatures in SIGNATURES.items():
        for signature in signatures:
            kernels[name].compile(signature)
