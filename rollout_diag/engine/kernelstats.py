"""The numba engine: ``KernelStats``, the ``ChunkStats`` whose token quantities and segment reductions come from the
compiled passes (``engine/kernels/``: the fused pass, the presets' passes, the prepass) in one sweep over a chunk's
model tokens, bit for bit what the device-generic engine computes where both compute a value."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Hashable, Iterable
from functools import cached_property

import numpy as np

from rollout_diag.engine import arrays
from rollout_diag.engine.arrays import Array
from rollout_diag.engine.chunkstats import ChunkStats, PerToken, named
from rollout_diag.engine.formulas import (
    DERIVED,
    clamp20,
    token_exp,
    token_expm1,
)
from rollout_diag.engine.kernels import compiled, compiled_presets
from rollout_diag.engine.kernels import prepass as kernel_prepass
from rollout_diag.engine.quantities import (
    COUNTS,
    EXPONENT_MAX,
    EXPONENT_MIN,
    GATE_BASES,
    GATE_HISTOGRAM,
    MOMENT_PAIRS,
    PROBABILITIES,
    SHARED_QUANTITIES,
    TURN_OFFSETS,
)


def _layout_column(index: int) -> cached_property[Array]:
    """Column ``index`` of ``KernelStats._layout`` as the chunk's kind of array, computed once per chunk."""

    def column(self: KernelStats) -> Array:
        return self._out(self._layout[index])

    return cached_property(column)


class KernelStats(ChunkStats):
    """The numba engine (CPU chunks): segments, and the segment sums / maxima / minima of every kernel quantity
    (``kernels/cpu.QUANTITIES``), catastrophic counts, centred moments and the δ histogram come from compiled passes
    over the chunk's raw arrays; model-token tensors are built only for what reads them (``token``), and a
    quantity outside the kernel's is reduced by the torch engine's code. The same values as :class:`ChunkStats`,
    as arrays of the chunk's kind (numpy; CPU tensors where the caller reads tensors, ``DumpReader.chunks``)."""

    # False: the fused pass leaves out PROBABILITIES (``prepare``), whose reductions then come from the tokens
    probabilities = True
    # True once the fused pass has run (or been taken from the reader's): its choice of quantities is then made
    fused_ran = False

    def prepare(self, quantities: tuple[str, ...] = SHARED_QUANTITIES, probabilities: bool = True) -> None:
        """The layout and the fused pass (without PROBABILITIES unless ``probabilities``, if it has not run yet); a
        quantity outside it is computed where a family reads it."""
        if not probabilities and not self.fused_ran:
            self.probabilities = False
        self.prepare_layout()
        self._reductions  # noqa: B018

    def _out(self, values: np.ndarray) -> Array:
        """A kernel's numpy result as the chunk's kind of array (zero-copy)."""
        return arrays.like(values, self.chunk.trainer)

    @cached_property
    def _raw(self) -> tuple[np.ndarray, np.ndarray]:
        chunk = self.chunk
        return np.ascontiguousarray(arrays.host(chunk.trainer)), np.ascontiguousarray(arrays.host(chunk.rollout))

    @cached_property
    def _ahead(self) -> kernel_prepass.KernelPrepass | None:
        """The chunk's compiled passes run by the reader before torch was loaded (kernels/prepass.py), if it has them
        and its step groups are theirs (a view that regroups the rows, groups.py, computes its own)."""
        found = self.chunk.prepass
        return found if found is not None and self.chunk.groups.steps is found.steps else None

    @cached_property
    def _layout(self) -> tuple[np.ndarray, ...]:
        """(raw start, model start, length, row, bucket, round) of each segment, int64 [S] each."""
        if self._ahead is not None:
            return self._ahead.layout
        return kernel_prepass.layout(arrays.host(self.chunk.mask), arrays.host(self.chunk.offsets))

    @cached_property
    def _fused(self) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
        """The fused pass (the reader's, where it ran it ahead): its reductions and the hint rows
        (``kernels/prepass.py`` ``reductions``)."""
        self.fused_ran = True
        if self._ahead is not None:
            return self._ahead.reductions, self._ahead.hints
        trainer, rollout = self._raw
        return kernel_prepass.reductions(
            trainer,
            rollout,
            self._layout,
            self.chunk.rows,
            arrays.host(self.segment_group),
            self.chunk.groups.count,
            self.probabilities,
            self.chunk.float32,
        )

    def _in_pass(self, name: str) -> bool:
        """Whether the fused pass computed quantity ``name``'s reductions (any but PROBABILITIES left out)."""
        return self.probabilities or self._ahead is not None or name not in PROBABILITIES

    @property
    def _reductions(self) -> tuple[np.ndarray, ...]:
        """The fused pass: (sums, maxima, minima) [Q, S], moments of MOMENT_PAIRS [G, P, 6], δ histogram [G, B],
        COUNTS [N, S]."""
        return self._fused[0]

    @cached_property
    def model_tokens(self) -> int:
        return int(self._layout[2].sum())

    # the segments' columns of the layout (model start, length, row, bucket, round), each cached as ChunkStats' are
    segment_starts = _layout_column(1)
    segment_length = _layout_column(2)
    segment_row = _layout_column(3)
    segment_bucket = _layout_column(4)
    segment_round = _layout_column(5)

    def largest_tokens(self, name: str, floor: float) -> tuple[Array | None, Array]:
        if name != "abs_log_ratio" or floor == -math.inf:
            return super().largest_tokens(name, floor)
        trainer, rollout = self._raw
        raw, model, length, *_ = self._layout
        largest = arrays.host(self.segment_max("abs_log_ratio"))
        index, values = compiled().tokens_at_least(trainer, rollout, raw, model, length, largest, floor)
        return self._out(index), self._out(values)

    def round_openings(self) -> tuple[Array, Array]:
        """metrics.hints' turn sums, from the fused pass: [G, 2·TURN_OFFSETS, 3] [tokens, Σy, Σy²] of the first
        TURN_OFFSETS model tokens of each round by offset (round 0, then later rounds), y = min(|δ|, CLIP), and the
        later rounds' [3, G] tokens, Σy and Σy² (``kernels.cpu.segment_pass``)."""
        turns, later = self._fused[1][2:]
        return self._out(turns.reshape(self.chunk.groups.count, 2 * TURN_OFFSETS, 3)), self._out(later)

    def token_locations(self, tokens: list[int]) -> list[tuple[int, int]]:
        raw, model, _, row, *_ = self._layout
        index = np.asarray(tokens, dtype=np.int64)
        segment = np.searchsorted(model, index, side="right") - 1
        rows = row[segment]
        positions = raw[segment] + (index - model[segment]) - arrays.host(self.chunk.offsets)[rows]
        return list(zip(rows.tolist(), positions.tolist(), strict=True))

    def _kernel_sum(self, name: str) -> Array | None:
        if name == "rs_k1":  # Σ(−c) = −Σc exactly: negation is exact at every step of the sum
            found = self._kernel_sum("clamped_log_ratio")
            return None if found is None else -found
        if name in COUNTS:
            return self._out(self._reductions[5][COUNTS.index(name)])
        column = compiled().COLUMN.get(name) if self._in_pass(name) else None
        return None if column is None else self._out(self._reductions[0][column])

    def _kernel_extreme(self, name: str, largest: bool) -> Array | None:
        if name == "rs_k1":  # max(−c) = −min(c), min(−c) = −max(c)
            found = self._kernel_extreme("clamped_log_ratio", not largest)
            return None if found is None else -found
        column = compiled().EXTREME.get(name) if self._in_pass(name) else None
        return None if column is None else self._out(self._reductions[1 if largest else 2][column])

    def segment_sum(self, name: str) -> Array:
        found = self._sums.get(name)
        if found is None:
            bound = self._bounds.get(name)
            within = self._within.get(name)
            if within is not None and within[0] in ("k3", "chi2_term"):
                self._sums.update(self._kept_sums(within[1]))
                found = self._sums[name]
            elif bound is not None:
                trainer, rollout = self._raw
                raw, _, length, *_ = self._layout
                largest = arrays.host(self.segment_max("abs_log_ratio"))
                found = self._out(compiled().segment_count_above(trainer, rollout, raw, length, largest, bound))
            else:
                found = self._kernel_sum(name)
                if found is None:
                    return super().segment_sum(name)
            self._sums[name] = found
        return found

    def _kept_sums(self, bound: float) -> dict[str, Array]:
        """Segment sums of k3 and of the χ² term over the tokens with |δ| ≤ bound. A segment without a catastrophic
        token keeps the fused pass's sums; the few segments with one are summed again from their tokens, with the
        torch engine's formulas and reduceat's order, so both engines give the same digits."""
        k3, chi2 = (arrays.host(self.segment_sum(name)).copy() for name in ("k3", "chi2_term"))
        affected = np.flatnonzero(arrays.host(self.segment_sum(self.catastrophic(bound))) > 0)
        if affected.size:
            trainer, rollout = self._raw
            raw, _, length, *_ = self._layout
            lengths = length[affected]
            firsts = np.cumsum(lengths) - lengths  # each affected segment's first token in the gathered run
            index = np.repeat(raw[affected] - firsts, lengths) + np.arange(int(lengths.sum()))
            delta = self._out(trainer[index] - rollout[index])  # the chunk's kind: the exps the torch engine takes
            kept = abs(delta) <= bound
            k3_terms = arrays.host(arrays.where(kept, token_expm1(delta) - delta, 0.0))
            chi2_terms = arrays.host(arrays.where(kept, token_exp(clamp20(delta) * 2.0), 0.0))
            k3[affected] = np.add.reduceat(k3_terms, firsts)
            chi2[affected] = np.add.reduceat(chi2_terms, firsts)
        return {self.within("k3", bound): self._out(k3), self.within("chi2_term", bound): self._out(chi2)}

    def segment_max(self, name: str) -> Array:
        return self._segment_extreme(name, self._maxima, True, super().segment_max)

    def segment_min(self, name: str) -> Array:
        return self._segment_extreme(name, self._minima, False, super().segment_min)

    def _segment_extreme(
        self, name: str, cache: dict[str, Array], largest: bool, reduced: Callable[[str], Array]
    ) -> Array:
        """The fused pass's segment maxima (``largest``) or minima of ``name``, kept in ``cache``; a quantity outside
        the pass: ``reduced``, the torch engine's reduction (which caches its own)."""
        found = cache.get(name)
        if found is None:
            found = self._kernel_extreme(name, largest)
            if found is None:
                return reduced(name)
            cache[name] = found
        return found

    def group_moments(self, x_name: str | PerToken, y_name: str | None = None) -> Array:
        x_name = named(x_name)
        columns = compiled().COLUMN
        if not isinstance(x_name, str) or x_name not in columns or (y_name is not None and y_name not in columns):
            return super().group_moments(x_name, y_name)
        if (x_name, y_name) in MOMENT_PAIRS and self._in_pass(x_name):  # from the fused pass
            return self._out(self._reductions[3][:, MOMENT_PAIRS.index((x_name, y_name))].copy())
        n = self.group_tokens
        safe_n = arrays.clamp(n, lower=1.0)
        mean_x = self.group_sum(x_name) / safe_n
        mean_y = arrays.zeros(arrays.size(n), n) if y_name is None else self.group_sum(y_name) / safe_n
        trainer, rollout = self._raw
        raw, _, length, *_ = self._layout
        centred = compiled().group_centred(
            trainer,
            rollout,
            raw,
            length,
            arrays.host(self.segment_group),
            self.chunk.groups.count,
            columns[x_name],
            -1 if y_name is None else columns[y_name],
            arrays.host(mean_x),
            arrays.host(mean_y),
        )
        centred = self._out(centred)
        return arrays.stack([n, mean_x, mean_y, centred[:, 0], centred[:, 1], centred[:, 2]], axis=-1)

    def hint_rows(self) -> tuple[dict[str, Array], Array]:
        """The token patterns of metrics.hints (``kernels.cpu.HINT_COLUMNS``, per row) and the rollout-probability
        buckets [G, B, 6] of [tokens, Σ|δ|, Σy, Σy², Σδ, Σk3], from the fused pass with the hint constants of
        ``kernels/prepass.py``."""
        per_row, buckets, *_ = self._fused[1]
        columns = self._out(per_row)
        names = compiled().HINT_COLUMNS
        return {name: columns[:, index] for index, name in enumerate(names)}, self._out(buckets)

    def prepare_derived(
        self,
        names: Iterable[str],
        moments: Iterable[str] = (),
        histogram: tuple[Hashable, np.ndarray, np.ndarray] | None = None,
    ) -> None:
        """Segment sums, maxima and minima of the derived quantities ``names`` (and the step groups' moments of
        ``moments``, memoised as ``("derived_moments", name)``) from one compiled pass, cached where the reductions by
        name read them (quantities already there are skipped); with ``histogram`` (memo key, exact bin edges, their
        table), the signed histograms of c per step group from the same pass, memoised under that key. Reads the
        chunk's raw arrays and segments only (no model-token tensor but w), so the reader's prepare pool can run it."""
        named, moment_names = set(names), set(moments)
        wanted = [name for name in dict.fromkeys([*names, *moments]) if name not in self._sums]
        histogram = None if histogram is None or histogram[0] in self._memo else histogram
        if not wanted and histogram is None:
            return
        kernels = compiled_presets()
        quantities = [DERIVED[name] for name in wanted]
        codes = np.array([[kernels.KINDS[q.base], kernels.OPS[q.op]] for q in quantities], dtype=np.int64).reshape(
            -1, 2
        )
        bounds = np.array([[q.lower, q.upper] for q in quantities], dtype=np.float64).reshape(-1, 2)
        needs_weight = any(q.base in ("token_is_weight", "rs_k3") for q in quantities)
        weight = arrays.host(self.token_weights()) if needs_weight else np.zeros(0)
        needs_gates = any(q.base in GATE_BASES for q in quantities)
        trainer, rollout = self._raw
        raw, model, length, *_ = self._layout
        segment_group, groups = arrays.host(self.segment_group), self.chunk.groups.count
        edges, table = (np.zeros(0), np.zeros(0, np.int64)) if histogram is None else histogram[1:]
        # a quantity asked for its moments only needs no extremes (one read anyway is reduced as the torch engine does)
        extremes = np.array([name in named for name in wanted], dtype=np.bool_)
        # the gates whose values the centred pass reads: kept by this pass, not computed again there
        read = {DERIVED[name].base for name in wanted if name in moment_names}
        keep = np.array([gate in read for gate in GATE_BASES])
        kept = _kept_rows(int((model + length).max(initial=0))) if keep.any() else kernels.KEPT_NONE
        sums, maxima, minima, counts, gate_counts = kernels.preset_pass(
            trainer, rollout, weight, raw, model, length, segment_group, groups, codes, bounds, extremes, edges,
            table, keep, kept,
        )  # fmt: skip
        if histogram is not None:
            self.memo(histogram[0], lambda: counts)
            if needs_gates:  # the three gates' histograms, from the same pass
                self.memo(GATE_HISTOGRAM, lambda: self._out(gate_counts))
        for index, name in enumerate(wanted):
            self._sums[name] = self._out(sums[index])
            if extremes[index]:
                self._maxima[name] = self._out(maxima[index])
                self._minima[name] = self._out(minima[index])
        centred = [index for index, name in enumerate(wanted) if name in moment_names]
        if not centred:
            return
        # the torch engine's moments (ChunkStats.group_moments): group means from the sums by name, then centred squares
        n = self.group_tokens
        means = arrays.stack([self.group_sum(wanted[index]) / arrays.clamp(n, lower=1.0) for index in centred], axis=1)
        segment_group = arrays.host(self.segment_group)
        m2 = self._out(
            kernels.centred_pass(
                trainer,
                rollout,
                weight,
                keep,
                kept,
                raw,
                model,
                length,
                segment_group,
                codes[centred],
                bounds[centred],
                arrays.host(means),
            )
        )
        zeros = arrays.zeros(arrays.size(n), n)
        for place, index in enumerate(centred):
            moments = arrays.stack([n, means[:, place], zeros, m2[:, place], zeros, zeros], axis=-1)
            self.memo(("derived_moments", wanted[index]), _constant(moments))

    def token(self, name: str) -> Array:
        if name in GATE_BASES and name not in self._tokens:  # the three gates are computed together, once a chunk
            self._tokens[name] = self._out(self.gate_values()[GATE_BASES.index(name)])
        return super().token(name)

    def gate_values(self, histogram: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        """The probability gates (kpop, bkl, tv) at every model token, float64 [3, M] on the host:
        ``engine.formulas.gate_values`` operation for operation, compiled (``kernels.presets.gate_tokens``, with the
        exp and log the torch engine takes on the CPU: bit for bit), as the preset pass lays them out; with
        ``histogram`` (the sweep's exact bin edges and table), the step groups' histograms of each gate's value too,
        memoised under ``GATE_HISTOGRAM`` (``metrics.sweep.gate_histograms``). The preset pass reads the gates
        without this array (``prepare_derived``)."""
        found = self._memo.get("gate_values")
        if found is not None and (histogram is None or GATE_HISTOGRAM in self._memo):
            return found
        trainer, rollout = self._raw
        raw, model, length, *_ = self._layout
        edges, table = (np.zeros(0), np.zeros(0, np.int64)) if histogram is None else histogram
        found, counts = compiled_presets().gate_tokens(
            trainer, rollout, raw, model, length, arrays.host(self.segment_group), self.chunk.groups.count, edges,
            table,
        )  # fmt: skip
        self._memo["gate_values"] = found
        if histogram is not None:
            self._memo[GATE_HISTOGRAM] = self._out(counts)
        return found

    def token_weights(self) -> Array:
        """w = exp(c) at every model token (``token_is_weight``, cached there, of the chunk's kind), numpy's exp as
        the torch engine takes it on the CPU (``arrays.host_exp``), of the c the compiled pass writes from the raw
        arrays: no model-token arrays of δ or c are built. numpy's exp is elementwise (a value's weight does not depend
        on where it sits in the array: tests/kernels/test_kernel_presets.py), so these are the torch engine's CPU
        weights bit for bit."""
        found = self._tokens.get("token_is_weight")
        if found is None:
            trainer, rollout = self._raw
            raw, model, length, *_ = self._layout
            clamped = compiled_presets().clamped_tokens(trainer, rollout, raw, model, length)
            with np.errstate(over="ignore", invalid="ignore"):  # c is clamped to ±20: nothing overflows; NaN stays NaN
                np.exp(clamped, out=clamped)
            found = self._tokens["token_is_weight"] = self._out(clamped)
        return found

    def delta_histogram(self, delta_bin: Callable[[Array], Array], bins: int) -> Array:
        if bins != 2 * (EXPONENT_MAX - EXPONENT_MIN) + 1 or delta_bin.__module__ != "rollout_diag.metrics.localize":
            return super().delta_histogram(delta_bin, bins)
        return self._out(self._reductions[4])


_SCRATCH = threading.local()  # per thread: the preset pass's kept gate rows, reused chunk after chunk


def _kept_rows(tokens: int) -> np.ndarray:
    """float64 [3, ≥ tokens]: where the preset pass writes the gates' values the centred pass reads, right after it
    in the same ``prepare_derived`` call. One array per thread, grown as needed and then reused: a fresh one each
    chunk cost its pages' faults (0.6 s of system time at 100 M tokens); only the rows a pass keeps are touched."""
    rows = getattr(_SCRATCH, "kept_rows", None)
    if rows is None or rows.shape[1] < tokens:
        rows = _SCRATCH.kept_rows = np.empty((3, tokens + tokens // 8))
    return rows


def _constant(value: Array) -> Callable[[], Array]:
    """A ``memo`` computation that returns ``value`` (already computed)."""
    return lambda: value
