"""The compiled pass of the presets' token quantities (numba): one pass over a chunk's segments computes every
derived token quantity the chosen presets read (truncated and IcePop weights, clamped weights and statistics, bound
flags: ``engine/quantities.py`` ``Derived``) and reduces each per segment: the sum in numpy reduceat's order (the
first value, then numpy's pairwise sum of the rest), the maximum and minimum; with it the sweep's signed histogram
of c (``metrics/sweep.py``), and in a second pass the step groups' centred moments. Per segment the base quantities
(δ, c, w, k1, k2, k3) are laid out once in a scratch block the size of the longest segment, and each derived
quantity's op runs over them in a loop of its own. No token-sized temporary beyond c and w.

The IS weight w = exp(c) is read, not computed: it is numpy's exp of the c that :func:`clamped_tokens` writes, the
exp the torch engine takes on the CPU too (``arrays.host_exp``: the torch engine's ``token_is_weight``), so a weight
that lands on a truncation or IcePop bound falls on the same side in both engines, on any CPU (numba's exp, libm's,
and torch's differ from numpy's in the last bit for some values: about 5 % between torch's and numpy's without
AVX-512; docs/benchmarks.md). Everything else is computed here with the torch engine's float64 formulas, so each
per-token value is the torch engine's on the CPU, bit for bit; the histogram's bins are found from the exact edges of
the engines' formula (``metrics.sweep.exact_bin_edges``), not from a log10 of our own.
"""

from __future__ import annotations

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


@njit(**_FLAGS)
def gate_arguments(
    trainer_prob: np.ndarray,
    rollout_prob: np.ndarray,
    raw: np.ndarray,
    model: np.ndarray,
    length: np.ndarray,
):
    """The arguments of the probability gates' logs (``engine.formulas.gate_values``), from p = exp(a) and q = exp(r)
    at the raw tokens (numpy's exp): (1 − p')/(1 − q') with AReaL's clamp (KPOP_EPS) at every model token (float64
    [M], index ``model[s] + k``); and at the tokens where a clamp moves p or q (BKL_EPS, which every move under
    KPOP_EPS is one of), their model index and the other arguments [3, n]: p'/q' under KPOP_EPS (1.0 where that clamp
    moves neither), p'/q' and (1 − p')/(1 − q') under BKL_EPS. The caller takes numpy's log of each (elementwise, so
    each token's log is the torch engine's). The first loop, over every token, has no branch (vectorised) and marks
    the moved tokens in a byte each; the second reads those marks eight at a time."""
    segments = raw.shape[0]
    total = 0  # the model tokens' extent (a chunk's segments tile it)
    for s in range(segments):
        total = max(total, model[s] + length[s])
    complement = np.empty(size_class(total))[:total]
    moved = np.zeros(total + 8 - total % 8, np.uint8)  # 1 where a clamp moves p or q; read eight at a time
    n = 0
    for s in range(segments):
        r, m = uint64(raw[s]), uint64(model[s])
        for j in range(length[s]):  # no branch: vectorised
            i = uint64(j)
            p, q = trainer_prob[r + i], rollout_prob[r + i]
            p8, q8 = min(max(p, EPS_NARROW), 1.0 - EPS_NARROW), min(max(q, EPS_NARROW), 1.0 - EPS_NARROW)
            complement[m + i] = (1.0 - p8) / (1.0 - q8)
            flag = (p < EPS_WIDE) | (p > 1.0 - EPS_WIDE) | (q < EPS_WIDE) | (q > 1.0 - EPS_WIDE)  # NaN: not moved
            moved[m + i] = flag
            n += flag
    at, arguments = np.empty(n, np.int64), np.empty((3, n))
    words, s, n = moved.view(np.uint64), 0, 0
    for word in range(words.shape[0]):
        if words[word] == 0:
            continue
        for k in range(8 * word, 8 * word + 8):
            if moved[k] == 0:
                continue
            while model[s] + length[s] <= k:  # the segment of model token k
                s += 1
            r = raw[s] + k - model[s]
            p, q = trainer_prob[r], rollout_prob[r]
            p8, q8 = min(max(p, EPS_NARROW), 1.0 - EPS_NARROW), min(max(q, EPS_NARROW), 1.0 - EPS_NARROW)
            p6, q6 = min(max(p, EPS_WIDE), 1.0 - EPS_WIDE), min(max(q, EPS_WIDE), 1.0 - EPS_WIDE)
            at[n] = k
            arguments[0, n] = 1.0 if (p8 == p and q8 == q) else p8 / q8
            arguments[1, n] = p6 / q6
            arguments[2, n] = (1.0 - p6) / (1.0 - q6)
            n += 1
    return complement, at, arguments


@njit(**{**_FLAGS, "inline": "always"})
def _fill_gates(
    trainer: np.ndarray, rollout: np.ndarray, gates: tuple, start: int, first: int, size: int, bases: np.ndarray
) -> None:
    """kpop, bkl, tv (``bases`` rows KPOP, BKL, TV) of a segment's ``size`` tokens (raw index ``start + k``, model
    index ``first + k``; ``bases[0]`` holds δ): ``engine.formulas.gate_values`` operation for operation from
    ``gate_inputs``. Every token first as where no clamp moves p or q (then p' = p, q' = q, log(p'/q') = δ and
    BKL's complement is KPOP's: one loop without a branch), then the tokens a clamp moves, from their logs."""
    trainer_prob, rollout_prob, log_complement, at, logs = gates
    raw, model = uint64(start), uint64(first)
    for k in range(size):
        i = uint64(k)
        delta, p, q, lc = bases[0, i], trainer_prob[raw + i], rollout_prob[raw + i], log_complement[model + i]
        forward = p * delta + (1.0 - p) * lc
        reverse = -(q * delta + (1.0 - q) * lc)
        bases[KPOP, i] = max(max(forward, reverse), 0.0)
        bases[BKL, i] = max(reverse, 0.0)
        bases[TV, i] = abs(p - q)
    for j in range(np.searchsorted(at, first), at.shape[0]):
        k = at[j] - first
        if k >= size:
            break
        bases[KPOP, k], bases[BKL, k] = _moved_gates(
            bases[0, k], trainer_prob[start + k], rollout_prob[start + k], log_complement[first + k], logs, j
        )


@njit(**{**_FLAGS, "inline": "always"})
def _moved_gates(delta: float, p: float, q: float, lc8: float, logs: np.ndarray, j: int) -> tuple[float, float]:
    """(kpop, bkl) of a token whose p or q a clamp moves: ``logs[:, j]`` = log(p'/q') under KPOP_EPS (read where that
    clamp moves p or q, else δ), log(p'/q') and log((1 − p')/(1 − q')) under BKL_EPS (the latter read where it is not
    KPOP's complement)."""
    p8, q8 = min(max(p, EPS_NARROW), 1.0 - EPS_NARROW), min(max(q, EPS_NARROW), 1.0 - EPS_NARROW)
    p6, q6 = min(max(p, EPS_WIDE), 1.0 - EPS_WIDE), min(max(q, EPS_WIDE), 1.0 - EPS_WIDE)
    lr8 = delta if (p8 == p and q8 == q) else logs[0, j]
    lr6 = delta if (p6 == p and q6 == q) else logs[1, j]
    lc6 = lc8 if (p6 == p8 and q6 == q8) else logs[2, j]
    forward = p8 * lr8 + (1.0 - p8) * lc8
    reverse = -(q8 * lr8 + (1.0 - q8) * lc8)
    return max(max(forward, reverse), 0.0), max(-(q6 * lr6 + (1.0 - q6) * lc6), 0.0)


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
    gates: tuple,
    start: int,
    first: int,
    size: int,
    needed: np.ndarray,
    bases: np.ndarray,
) -> None:
    """The base quantities (KINDS rows of ``bases``) of a segment's ``size`` tokens (raw index ``start + k``, model
    index ``first + k``), with the torch engine's float64 formulas; w is read (numpy's exp), 1.0 without weights; the
    probability gates (kpop, bkl, tv), all three where one is needed, from ``gate_inputs`` (numpy's exps and logs, as
    the torch engine takes them on the CPU: ``_fill_gates``)."""
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
        _fill_gates(trainer, rollout, gates, start, first, size, bases)


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
    gates: tuple,
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
):
    """Every derived quantity q (``codes[q]`` = (kind, op), ``bounds[q]`` = (L, U)) of every segment's tokens, each
    token read once: per segment the sum (numpy reduceat's order), the maximum and the minimum (float64 [Q, S] each;
    a value quantity's max and min only where ``extremes[q]``, else left unset), and, with ``edges`` (empty: none),
    the sweep's signed histogram of c over each step group's model tokens (``segment_group[s]`` the group of segment
    s; int64 [groups, 2·BINS]: the run's sweep sums them, the per-step sweep keeps them) and, where ``gates`` holds the
    chunk's ``gate_inputs``, the histograms of the three gates' values (int64 [groups, 3·BINS], ``_count_gate_bins``).
    ``weight``: numpy's exp(c) at each model token (index ``model[s] + k``), or empty when no quantity reads w or k3;
    ``gates``: ``gate_inputs`` (``NO_GATES`` when no quantity reads a gate). Per segment the base
    quantities are laid out once, then each quantity's op runs over them in its own loop (the op is chosen once per
    segment, not per token)."""
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
    stack, left = np.empty((3, 64), np.int64), np.empty(64)
    needed = _needed(codes)
    histogram = edges.shape[0] > 0
    counts = np.zeros((groups, 2 * edges.shape[0]), np.int64)
    gate_histogram = histogram and gates[0].shape[0] == trainer.shape[0]
    gate_counts = np.zeros((groups, 3 * edges.shape[0] if gate_histogram else 0), np.int64)
    if gate_histogram:  # every gate's histogram: all three laid out
        needed[KPOP] = needed[BKL] = needed[TV] = True
    bits = bases.view(np.int64)
    padded, first = _padded(edges)
    for s in range(segments):
        size = length[s]
        _fill_bases(trainer, rollout, weight, gates, raw[s], model[s], size, needed, bases)
        if histogram:
            _count_signed_bins(bases[1], size, padded, table, counts[segment_group[s]])
        if gate_histogram:
            _count_gate_bins(bases, bits, size, padded, table, first, gate_counts[segment_group[s]])
        for q in range(quantities):
            op, lower, upper, kind = codes[q, 1], bounds[q, 0], bounds[q, 1], codes[q, 0]
            if op >= 3:  # a flag: its count is its sum in any order
                count = _flag_count(op, lower, upper, bases, kind, size)
                sums[q, s] = count
                maxima[q, s] = 1.0 if count > 0 else 0.0
                minima[q, s] = 1.0 if count == size else 0.0
                continue
            _fill_values(op, lower, upper, bases, kind, size, values)
            # one block (129 tokens at most) summed here, not through _pairwise_on: 16 ns a segment less (measured)
            rest = _block_sum(values, 1, size - 1) if size <= 129 else _pairwise_on(values, 1, size - 1, stack, left)
            sums[q, s] = values[0] + rest
            if extremes[q]:
                maxima[q, s], minima[q, s] = _extremes(values, size)
    return sums, maxima, minima, counts, gate_counts


@njit(**_FLAGS)
def gate_tokens(
    trainer: np.ndarray,
    rollout: np.ndarray,
    raw: np.ndarray,
    model: np.ndarray,
    length: np.ndarray,
    gates: tuple,
    segment_group: np.ndarray,
    groups: int,
    edges: np.ndarray,
    table: np.ndarray,
):
    """kpop, bkl, tv at every model token (float64 [3, M], index ``model[s] + k``) from ``gate_inputs``, as the preset
    pass lays them out; with ``edges`` (empty: none), each step group's histograms of them (int64 [groups, 3·BINS])."""
    total, longest = 0, 1
    for s in range(raw.shape[0]):
        total = max(total, model[s] + length[s])
        longest = max(longest, length[s])
    out = np.empty((3, total))
    bases = np.empty((BASES, longest))
    bits = bases.view(np.int64)
    needed = np.zeros(BASES, np.bool_)
    needed[KPOP] = needed[BKL] = needed[TV] = True
    histogram = edges.shape[0] > 0
    counts = np.zeros((groups, 3 * edges.shape[0]), np.int64)
    padded, first = _padded(edges)
    for s in range(raw.shape[0]):
        size, m = length[s], model[s]
        _fill_bases(trainer, rollout, trainer[:0], gates, raw[s], m, size, needed, bases)
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
    gates: tuple,
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
    one by one in token order, whatever the segments. Four quantities' sums run side by side (independent chains),
    each token's derived value computed where it is added (no array of values); only the base quantities the
    quantities read are laid out, and w, when it is all they read, is read where it lies."""
    quantities = codes.shape[0]
    out = np.zeros(means.shape)
    longest = 1
    for s in range(raw.shape[0]):
        longest = max(longest, length[s])
    needed = _needed(codes)
    weight_only = weight.shape[0] > 0
    for kind in range(BASES):
        weight_only = weight_only and (kind == 2 or not needed[kind])
    bases = np.empty((BASES, 1 if weight_only else longest))
    for s in range(raw.shape[0]):
        g, size, first = segment_group[s], length[s], model[s]
        if not weight_only:
            _fill_bases(trainer, rollout, weight, gates, raw[s], first, size, needed, bases)
        for lane in range(0, quantities, 4):
            count = min(4, quantities - lane)
            q0, q1, q2, q3 = lane, lane + min(1, count - 1), lane + min(2, count - 1), lane + min(3, count - 1)
            o0, o1, o2, o3 = codes[q0, 1], codes[q1, 1], codes[q2, 1], codes[q3, 1]
            l0, l1, l2, l3 = bounds[q0, 0], bounds[q1, 0], bounds[q2, 0], bounds[q3, 0]
            u0, u1, u2, u3 = bounds[q0, 1], bounds[q1, 1], bounds[q2, 1], bounds[q3, 1]
            m0, m1, m2, m3 = means[g, q0], means[g, q1], means[g, q2], means[g, q3]
            t0, t1, t2, t3 = out[g, q0], out[g, q1], out[g, q2], out[g, q3]
            if weight_only:
                row0 = row1 = row2 = row3 = weight[first : first + size]
            else:
                row0, row1, row2, row3 = (
                    bases[codes[q0, 0]],
                    bases[codes[q1, 0]],
                    bases[codes[q2, 0]],
                    bases[codes[q3, 0]],
                )
            for k in range(size):
                i = uint64(k)
                c0 = _derived(o0, l0, u0, row0[i]) - m0
                c1 = _derived(o1, l1, u1, row1[i]) - m1
                c2 = _derived(o2, l2, u2, row2[i]) - m2
                c3 = _derived(o3, l3, u3, row3[i]) - m3
                t0 += c0 * c0
                t1 += c1 * c1
                t2 += c2 * c2
                t3 += c3 * c3
            # a quantity repeated to fill the four lanes is written once, from its first lane
            out[g, q3] = t3
            out[g, q2] = t2
            out[g, q1] = t1
            out[g, q0] = t0
    return out


def _c(dtype: types.Type, ndim: int = 1) -> types.Array:
    return types.Array(dtype, ndim, "C")


_F, _I, _F2 = _c(types.float64), _c(types.int64), _c(types.float64, 2)
_GATES = types.Tuple((_F, _F, _F, _I, _F2))  # gate_inputs: p, q (raw), log complement (model), moved tokens, their logs
# Every specialisation of each kernel (as ``kernels.cpu.SIGNATURES``): float64 values and weights, int64 layouts and
# codes, whatever the input's dtypes. :func:`compile_signatures` compiles them without data (a helper process does,
# ``kernels.expect_presets``).
SIGNATURES: dict[str, tuple[tuple[types.Type, ...], ...]] = {
    "clamped_tokens": ((_F, _F, _I, _I, _I),),
    "gate_arguments": ((_F, _F, _I, _I, _I),),
    "gate_tokens": ((_F, _F, _I, _I, _I, _GATES, _I, types.int64, _F, _I),),
    "preset_pass": (
        (_F, _F, _F, _GATES, _I, _I, _I, _I, types.int64, _c(types.int64, 2), _F2, _c(types.boolean), _F, _I),
    ),
    "centred_pass": ((_F, _F, _F, _GATES, _I, _I, _I, _I, _c(types.int64, 2), _F2, _F2),),
}


def gate_inputs(
    trainer: np.ndarray, rollout: np.ndarray, raw: np.ndarray, model: np.ndarray, length: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What the probability gates read (``_fill_gates``), once a chunk: p = exp(a) and q = exp(r) at the raw tokens,
    numpy's exps (elementwise: the torch engine's of the model tokens, bit for bit); numpy's log of
    ``gate_arguments``' complement at every model token, and the moved tokens' model indices and logs [3, n]."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # raw tokens outside the mask are not read
        trainer_prob = np.exp(trainer, out=np.empty(_host_size_class(trainer.shape[0]))[: trainer.shape[0]])
        rollout_prob = np.exp(rollout, out=np.empty(_host_size_class(rollout.shape[0]))[: rollout.shape[0]])
        complement, at, arguments = gate_arguments(trainer_prob, rollout_prob, raw, model, length)
        np.log(complement, out=complement)
        np.log(arguments, out=arguments)
    return trainer_prob, rollout_prob, complement, at, arguments


def _host_size_class(n: int) -> int:
    """``kernels.cpu.size_class`` in Python (its ``_bits`` is ``int.bit_length``): calling the compiled one from
    Python would compile it a specialisation of its own."""
    if n < 65536:
        return n
    step = 1 << (n.bit_length() - 4)
    return (n + step - 1) // step * step


# The gates' inputs where no quantity reads a gate (``preset_pass``, ``centred_pass``).
NO_GATES = (np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0, np.int64), np.zeros((3, 0)))


def compile_signatures() -> None:
    """Compile (or load from numba's cache) every kernel of this module for its SIGNATURES, and drop the cache files
    of earlier versions of this source (``kernels.drop_stale_caches``)."""
    from rollout_diag.engine.kernels import drop_stale_caches

    drop_stale_caches(sys.modules[__name__])
    kernels = globals()
    for name, signatures in SIGNATURES.items():
        for signature in signatures:
            kernels[name].compile(signature)
