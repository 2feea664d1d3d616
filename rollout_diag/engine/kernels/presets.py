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
from rollout_diag.engine.quantities import PRESET_BASES

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
def model_values(values: np.ndarray, raw: np.ndarray, model: np.ndarray, length: np.ndarray):
    """``values`` (a raw array: logprobs) at every model token (float64 [M], index ``model[s] + k``)."""
    total = 0
    for s in range(raw.shape[0]):
        total += length[s]
    out = np.empty(size_class(total))[:total]
    for s in range(raw.shape[0]):
        r, m = uint64(raw[s]), uint64(model[s])
        for k in range(length[s]):
            out[m + uint64(k)] = values[r + uint64(k)]
    return out


@njit(**_FLAGS)
def gate_arguments(trainer_prob: np.ndarray, rollout_prob: np.ndarray, eps_wide: float, eps_narrow: float):
    """The arguments of the probability gates' logs (``engine.formulas.gate_values``), from p = exp(a) and q = exp(r)
    at every model token (numpy's exp): (1 − p')/(1 − q') with AReaL's clamp ``eps_narrow`` at every token [M]; and,
    only at the tokens where they are not that one's, the other arguments with their token index: p'/q' where a
    clamp moves p or q (``eps_narrow``, then ``eps_wide``), (1 − p')/(1 − q') under ``eps_wide``. The caller takes
    numpy's log of each (elementwise, so each token's log is the one the torch engine takes)."""
    size = trainer_prob.shape[0]
    complement = np.empty(size_class(size))[:size]
    ratio_narrow, ratio_wide, complement_wide = np.empty(size), np.empty(size), np.empty(size)
    at_narrow, at_wide, at_complement = np.empty(size, np.int64), np.empty(size, np.int64), np.empty(size, np.int64)
    n_narrow = n_wide = n_complement = 0
    for k in range(size):
        i = uint64(k)
        p, q = trainer_prob[i], rollout_prob[i]
        p8, q8 = min(max(p, eps_narrow), 1.0 - eps_narrow), min(max(q, eps_narrow), 1.0 - eps_narrow)
        complement[i] = (1.0 - p8) / (1.0 - q8)
        if not (p8 == p and q8 == q):
            ratio_narrow[n_narrow], at_narrow[n_narrow] = p8 / q8, k
            n_narrow += 1
        p6, q6 = min(max(p, eps_wide), 1.0 - eps_wide), min(max(q, eps_wide), 1.0 - eps_wide)
        if not (p6 == p and q6 == q):
            ratio_wide[n_wide], at_wide[n_wide] = p6 / q6, k
            n_wide += 1
        if not (p6 == p8 and q6 == q8):
            complement_wide[n_complement], at_complement[n_complement] = (1.0 - p6) / (1.0 - q6), k
            n_complement += 1
    return (
        complement,
        ratio_narrow[:n_narrow].copy(),
        at_narrow[:n_narrow].copy(),
        ratio_wide[:n_wide].copy(),
        at_wide[:n_wide].copy(),
        complement_wide[:n_complement].copy(),
        at_complement[:n_complement].copy(),
    )


@njit(**_FLAGS)
def gate_finish(
    trainer: np.ndarray,
    rollout: np.ndarray,
    raw: np.ndarray,
    model: np.ndarray,
    length: np.ndarray,
    trainer_prob: np.ndarray,
    rollout_prob: np.ndarray,
    eps_wide: float,
    eps_narrow: float,
    log_complement: np.ndarray,
    log_ratio_narrow: np.ndarray,
    at_narrow: np.ndarray,
    log_ratio_wide: np.ndarray,
    at_wide: np.ndarray,
    log_complement_wide: np.ndarray,
    at_complement: np.ndarray,
    segment_group: np.ndarray,
    groups: int,
    edges: np.ndarray,
    table: np.ndarray,
):
    """kpop, bkl, tv at every model token (float64 [3, M]): ``engine.formulas.gate_values`` operation for operation
    from ``gate_arguments``' logs (δ = a − r where no clamp moves p or q); with ``edges`` (empty: none), each step
    group's histogram of each gate's value over the sweep's bins of |c| (int64 [groups, 3·BINS],
    ``metrics.sweep.gate_histograms``), found from the exact edges as the histogram of c is."""
    size = trainer_prob.shape[0]
    out = np.empty((3, size))
    narrow, wide, complement = 0, 0, 0
    for s in range(raw.shape[0]):
        r, m = uint64(raw[s]), uint64(model[s])
        for j in range(length[s]):
            k = m + uint64(j)
            delta = trainer[r + uint64(j)] - rollout[r + uint64(j)]
            p, q = trainer_prob[k], rollout_prob[k]
            p8, q8 = min(max(p, eps_narrow), 1.0 - eps_narrow), min(max(q, eps_narrow), 1.0 - eps_narrow)
            lr8 = delta
            if narrow < at_narrow.shape[0] and at_narrow[narrow] == k:
                lr8 = log_ratio_narrow[narrow]
                narrow += 1
            lc8 = log_complement[k]
            forward = p8 * lr8 + (1.0 - p8) * lc8
            reverse = -(q8 * lr8 + (1.0 - q8) * lc8)
            q6 = min(max(q, eps_wide), 1.0 - eps_wide)
            lr6 = delta
            if wide < at_wide.shape[0] and at_wide[wide] == k:
                lr6 = log_ratio_wide[wide]
                wide += 1
            lc6 = lc8
            if complement < at_complement.shape[0] and at_complement[complement] == k:
                lc6 = log_complement_wide[complement]
                complement += 1
            out[0, k] = max(max(forward, reverse), 0.0)
            out[1, k] = max(-(q6 * lr6 + (1.0 - q6) * lc6), 0.0)
            out[2, k] = abs(p - q)
    bins = edges.shape[0]
    counts = np.zeros((groups, 3 * bins), np.int64)
    if bins == 0:
        return out, counts
    padded = np.empty(bins + 1)  # the edges and +inf: the step over an edge reads no bound check
    for e in range(bins):
        padded[e] = edges[e]
    padded[bins] = np.inf
    first = (np.int64(edges[1:2].view(np.int64)[0]) >> SLICE_SHIFT) if bins > 1 else 0
    last = table.shape[0] - 1
    for gate in range(3):
        values = out[gate]
        bits = values.view(np.int64)
        offset = gate * bins
        for s in range(raw.shape[0]):
            row = counts[segment_group[s]]
            m = uint64(model[s])
            for j in range(length[s]):
                i = m + uint64(j)
                found = table[uint64(min(max(((bits[i] & ABS_BITS) >> SLICE_SHIFT) - first, 0), last))]
                found += abs(values[i]) >= padded[uint64(found + 1)]
                row[uint64(offset + found)] += 1
    return out, counts


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
    gates: np.ndarray,
    start: int,
    first: int,
    size: int,
    needed: np.ndarray,
    bases: np.ndarray,
) -> None:
    """The base quantities (KINDS rows of ``bases``) of a segment's ``size`` tokens (raw index ``start + k``, model
    index ``first + k``), with the torch engine's float64 formulas; w is read (numpy's exp), 1.0 without weights; the
    probability gates (kpop, bkl, tv) are read from ``gates`` [3, M] (``engine.formulas.gate_values``, numpy's exps
    and logs, as the torch engine takes them on the CPU)."""
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
    for kind in (KPOP, BKL, TV):
        if needed[kind]:
            row = gates[kind - KPOP]
            for k in range(size):
                i = uint64(k)
                bases[kind, i] = row[model + i]


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


@njit(**_FLAGS)
def preset_pass(
    trainer: np.ndarray,
    rollout: np.ndarray,
    weight: np.ndarray,
    gates: np.ndarray,
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
    s; int64 [groups, 2·BINS]: the run's sweep sums them, the per-step sweep keeps them). ``weight``: numpy's exp(c) at
    each model token (index ``model[s] + k``), or empty when no quantity reads w or k3. Per segment the base
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
    padded = np.empty(edges.shape[0] + 1)  # the edges and +inf: the step over an edge reads no bound check
    for e in range(edges.shape[0]):  # a loop, not a slice assignment: numba compiles ~2 s of broadcast checks for that
        padded[e] = edges[e]
    padded[edges.shape[0]] = np.inf
    for s in range(segments):
        size = length[s]
        _fill_bases(trainer, rollout, weight, gates, raw[s], model[s], size, needed, bases)
        if histogram:
            _count_signed_bins(bases[1], size, padded, table, counts[segment_group[s]])
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
    return sums, maxima, minima, counts


@njit(**_FLAGS)
def centred_pass(
    trainer: np.ndarray,
    rollout: np.ndarray,
    weight: np.ndarray,
    gates: np.ndarray,
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
# Every specialisation of each kernel (as ``kernels.cpu.SIGNATURES``): float64 values and weights, int64 layouts and
# codes, whatever the input's dtypes. :func:`compile_signatures` compiles them without data (a helper process does,
# ``kernels.expect_presets``).
SIGNATURES: dict[str, tuple[tuple[types.Type, ...], ...]] = {
    "clamped_tokens": ((_F, _F, _I, _I, _I),),
    "model_values": ((_F, _I, _I, _I),),
    "gate_arguments": ((_F, _F, types.float64, types.float64),),
    "gate_finish": (
        (_F, _F, _I, _I, _I, _F, _F, types.float64, types.float64, _F, _F, _I, _F, _I, _F, _I, _I, types.int64, _F, _I),
    ),
    "preset_pass": (
        (_F, _F, _F, _F2, _I, _I, _I, _I, types.int64, _c(types.int64, 2), _F2, _c(types.boolean), _F, _I),
    ),
    "centred_pass": ((_F, _F, _F, _F2, _I, _I, _I, _I, _c(types.int64, 2), _F2, _F2),),
}


def compile_signatures() -> None:
    """Compile (or load from numba's cache) every kernel of this module for its SIGNATURES, and drop the cache files
    of earlier versions of this source (``kernels.drop_stale_caches``)."""
    from rollout_diag.engine.kernels import drop_stale_caches

    drop_stale_caches(sys.modules[__name__])
    kernels = globals()
    for name, signatures in SIGNATURES.items():
        for signature in signatures:
            kernels[name].compile(signature)
