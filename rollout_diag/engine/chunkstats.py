"""The device-generic per-chunk engine (numpy on the CPU, torch on any device): token quantities computed once per
chunk and their reductions over segments, rows and step groups (``ChunkStats``); what the families read of a chunk
(the ``ChunkArrays`` protocols); ``RegroupedStats``, a chunk's rows seen in other step groups. The numba engine
(``engine/kernelstats.py``) overrides the reductions its compiled passes compute; ``engine/stats.py`` picks one."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from itertools import pairwise
from typing import Any, Protocol

import numpy as np

from rollout_diag.engine import arrays
from rollout_diag.engine.arrays import Array, segment_max, segment_min, segment_moments
from rollout_diag.engine.formulas import (
    TOKEN_QUANTITIES,
    row_mean,
)
from rollout_diag.engine.kernels import prepass as kernel_prepass
from rollout_diag.engine.quantities import (
    SHARED_QUANTITIES,
)


class ModelTokenArrays(Protocol):
    """A chunk's model tokens (mask 1), in row order (``io/chunk.py`` ``ModelTokens``)."""

    @property
    def trainer(self) -> Array: ...
    @property
    def rollout(self) -> Array: ...
    @property
    def log_ratio(self) -> Array: ...
    @property
    def row(self) -> Array: ...
    @property
    def position(self) -> Array: ...


class StepGroupArrays(Protocol):
    """The steps of a chunk and each row's step group (``io/chunk.py`` ``StepGroups``)."""

    @property
    def steps(self) -> tuple[int, ...]: ...
    @property
    def row_group(self) -> Array: ...
    @property
    def count(self) -> int: ...


class ChunkArrays(Protocol):
    """What the engines read of a chunk (``io/chunk.py`` ``Chunk`` is one): its arrays, never how it is built."""

    trainer: Array
    rollout: Array
    mask: Array
    offsets: Array
    cache: dict
    engine: str | None
    prepass: kernel_prepass.KernelPrepass | None
    float32: bool  # either logprob column was float32: ``mismatched`` compares bits as float32

    @property
    def rows(self) -> int: ...
    @property
    def device_type(self) -> str: ...
    @property
    def model(self) -> ModelTokenArrays: ...
    @property
    def groups(self) -> StepGroupArrays: ...


@dataclass(frozen=True, eq=False)  # compared by identity: its values are tensors
class PerToken:
    """A value at every model token: ``values`` [M], or, when ``by_row``, one value per row [R] that every model
    token of the row shares (sequence-level weights, statistics and keep flags), kept at row size so reductions
    over tokens cost O(rows): Σ over a row's tokens = n_i·v_i. ChunkStats reduces either kind. ``name``: the
    token quantity these values are, if they are one; its cached segment sums and extrema then serve every
    reduction (a derived value, ``map``, has none)."""

    values: Array
    by_row: bool = False
    name: str | None = None

    @classmethod
    def quantity(cls, s: ChunkStats, name: str) -> PerToken:
        """A token quantity of the engine as a PerToken that keeps its name."""
        return cls(s.token(name), name=name)

    def map(self, function: Callable[[Array], Array]) -> PerToken:
        return PerToken(function(self.values), self.by_row)


def position_bucket(position: Array) -> Array:
    """0 → 0, 1 → 1, 2–3 → 2, 4–7 → 3, …: the binary exponent (floor(log2 p) + 1 for p ≥ 1)."""
    return arrays.frexp_exponent(position)


@dataclass
class TokenCaches:
    """A chunk's token values and segment reductions by quantity name: what views of the chunk share."""

    tokens: dict[str, Array] = field(default_factory=dict)
    sums: dict[str, Array] = field(default_factory=dict)  # segment sums; "row:name": row sums
    maxima: dict[str, Array] = field(default_factory=dict)
    minima: dict[str, Array] = field(default_factory=dict)


# ChunkStats values that do not depend on how rows are grouped: a regrouped view reuses them.
ROW_LEVEL = (
    "segment_starts",
    "segment_length",
    "segment_row",
    "segment_bucket",
    "segment_round",
    "rounds_per_row",
    "row_count",
    "row_tokens",
    "valid_rows",
    "_filled_rows",
)


class ChunkStats:
    """Token quantities, their segment sums and maxima, and row / step group reductions of a chunk: the one
    per-chunk engine every family reads (analysis families by quantity name, correction families also with
    :class:`PerToken` values and memoised per-preset values, ``memo``)."""

    def __init__(self, chunk: ChunkArrays, caches: TokenCaches | None = None) -> None:
        self.chunk = chunk
        self.caches = TokenCaches() if caches is None else caches
        self._tokens = self.caches.tokens
        self._sums = self.caches.sums
        self._maxima = self.caches.maxima
        self._minima = self.caches.minima
        self._memo: dict[Hashable, Any] = {}
        self._bounds: dict[str, float] = {}  # catastrophic token quantities: name -> |δ| bound
        self._within: dict[str, tuple[str, float]] = {}  # quantity where |δ| ≤ bound: name -> (quantity, bound)

    def prepare_derived(
        self,
        names: Iterable[str],
        moments: Iterable[str] = (),
        histogram: tuple[Hashable, np.ndarray, np.ndarray] | None = None,
    ) -> None:
        """Compute ahead the derived quantities' reductions (``KernelStats``); the torch engine computes each where
        it is read."""

    def prepare(self, quantities: tuple[str, ...] = SHARED_QUANTITIES, probabilities: bool = True) -> None:
        """Segments, rows, step groups and the segment sums of ``quantities`` (module ``prepare``)."""
        self.prepare_layout()
        for name in quantities:
            self.segment_sum(name)

    def prepare_layout(self) -> None:
        """Segments, rows and step groups, computed now."""
        cached = ("segment_length", "segment_row", "segment_bucket", "segment_round", "segment_group", "row_count")
        for name in (*cached, "group_token_ranges"):
            getattr(self, name)

    def regrouped(self, view: ChunkArrays) -> ChunkStats:
        """The torch engine's stats of ``view``, this chunk's rows in other step groups: token values, segment
        reductions and row-level values shared with this chunk's stats (computed once for both), step groups its
        own."""
        computed = {name: self.__dict__[name] for name in ROW_LEVEL if name in self.__dict__}  # cached already
        return RegroupedStats(view, self.caches, computed)

    def memo(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """``compute()`` once per chunk and key: values derived from a preset's config (weights, keep flags) that
        every accumulator of the pass shares."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    # -- tokens ----------------------------------------------------------------------------------
    def token(self, name: str) -> Array:
        value = self._tokens.get(name)
        if value is None:
            bound = self._bounds.get(name)
            if name in self._within:
                quantity, limit = self._within[name]
                value = arrays.where(self.token("abs_log_ratio") <= limit, self.token(quantity), 0.0)
            elif bound is None:
                value = TOKEN_QUANTITIES[name](self)
            else:
                value = arrays.float64(self.token("abs_log_ratio") > bound)
            self._tokens[name] = value
        return value

    def catastrophic(self, threshold: float) -> str:
        """Name of the token quantity 1.0 where |δ| > threshold (registered on first use, computed when read)."""
        name = f"catastrophic>{threshold!r}"
        self._bounds[name] = float(threshold)
        return name

    def within(self, quantity: str, threshold: float) -> str:
        """Name of the token quantity ``quantity`` (``k3`` or ``chi2_term``) at tokens with |δ| ≤ threshold, 0 at the
        catastrophic ones (registered on first use, computed when read)."""
        name = f"{quantity}|δ|≤{threshold!r}"
        self._within[name] = (quantity, float(threshold))
        return name

    def delta_histogram(self, delta_bin: Callable[[Array], Array], bins: int) -> Array:
        """Counts [G, bins] of δ by ``delta_bin`` (metrics.localize) in each step group."""
        return self.group_bincount(delta_bin(self.token("log_ratio")), bins)

    @cached_property
    def model_tokens(self) -> int:
        """M: model tokens of the chunk."""
        return arrays.size(self.chunk.model.row)

    def largest_tokens(self, name: str, floor: float) -> tuple[Array | None, Array]:
        """(model-token indices, ascending; values) of the tokens whose quantity ``name`` is ≥ ``floor``; with a
        floor of −inf, (None, every token's value)."""
        values = self.token(name)
        if floor == -math.inf:
            return None, values
        index = arrays.flatnonzero(values >= floor)
        return index, values[index]

    def token_locations(self, tokens: list[int]) -> list[tuple[int, int]]:
        """(row, position within the row) of each given model token."""
        model = self.chunk.model
        return [(int(model.row[token]), int(model.position[token])) for token in tokens]

    # -- segments --------------------------------------------------------------------------------
    @cached_property
    def segment_starts(self) -> Array:
        """Index (into model tokens) of each segment's first token (int64 [S])."""
        model = self.chunk.model
        position, row = model.position, model.row
        if arrays.size(position) == 0:
            return arrays.zeros(0, position, "int64")
        if self.chunk.device_type == "cpu":  # the same with numpy, 3× faster on the CPU
            p, r = arrays.host(position), arrays.host(row)
            opens = np.empty(len(p), dtype=bool)
            opens[0] = True
            np.not_equal(r[1:], r[:-1], out=opens[1:])
            opens[1:] |= p[1:] != p[:-1] + 1
            opens |= (p & (p - 1)) == 0
            return arrays.like(np.flatnonzero(opens), position)
        import torch  # a GPU chunk

        new = torch.ones_like(position, dtype=torch.bool)
        # A new segment where the row changes, a token was skipped (a new round), or p is a power of two.
        new[1:] = (row[1:] != row[:-1]) | (position[1:] != position[:-1] + 1)
        new |= (position & (position - 1)) == 0
        return torch.nonzero(new, as_tuple=True)[0]

    @cached_property
    def segment_length(self) -> Array:
        starts = self.segment_starts
        ends = arrays.concat([starts[1:], arrays.full(1, self.model_tokens, starts, "int64")])
        return ends - self.segment_starts

    @cached_property
    def segment_row(self) -> Array:
        return self.chunk.model.row[self.segment_starts]

    @cached_property
    def segment_bucket(self) -> Array:
        return position_bucket(self.chunk.model.position[self.segment_starts])

    @cached_property
    def segment_round(self) -> Array:
        """Round index of each segment: rounds started so far in its row, minus one."""
        model = self.chunk.model
        starts = self.segment_starts
        if arrays.size(starts) == 0:
            return starts.copy() if not arrays.is_tensor(starts) else starts.clone()
        first_in_row = arrays.ones(arrays.size(starts), starts, "bool")
        first_in_row[1:] = self.segment_row[1:] != self.segment_row[:-1]
        gap = arrays.ones(arrays.size(starts), starts, "bool")
        gap[1:] = model.position[starts[1:]] != model.position[starts[1:] - 1] + 1
        starts_round = arrays.astype(first_in_row | gap, "int64")
        started = arrays.cumsum(starts_round)
        row_base = arrays.zeros(self.chunk.rows, starts, "int64")
        row_base[self.segment_row[first_in_row]] = started[first_in_row] - 1
        return started - 1 - row_base[self.segment_row]

    @cached_property
    def rounds_per_row(self) -> Array:
        """Number of rounds (runs of model tokens) in each row (int64 [R]; 0 without model tokens)."""
        out = arrays.full(self.chunk.rows, -1, self.segment_round, "int64")
        return arrays.scatter_max(out, self.segment_row, self.segment_round) + 1

    @cached_property
    def segment_group(self) -> Array:
        return self.chunk.groups.row_group[self.segment_row]

    def segment_sum(self, name: str) -> Array:
        """Σ of a token quantity over each segment (float64 [S])."""
        found = self._sums.get(name)
        if found is None:
            found = self._sums[name] = _reduce(self.token(name), self.segment_starts, self.segment_length, "sum")
        return found

    def segment_max(self, name: str) -> Array:
        found = self._maxima.get(name)
        if found is None:
            found = self._maxima[name] = _reduce(self.token(name), self.segment_starts, self.segment_length, "max")
        return found

    def segment_min(self, name: str) -> Array:
        found = self._minima.get(name)
        if found is None:
            found = self._minima[name] = _reduce(self.token(name), self.segment_starts, self.segment_length, "min")
        return found

    # -- rows and step groups ----------------------------------------------------------------------
    @cached_property
    def row_count(self) -> Array:
        """n_i: model tokens of each row (float64 [R])."""
        out = arrays.zeros(self.chunk.rows, self.segment_length)
        return arrays.index_add(out, self.segment_row, arrays.float64(self.segment_length))

    def row_sum(self, name: str | PerToken) -> Array:
        """Σ over each row's model tokens (float64 [R]; 0 for a row without model tokens) of a token quantity (by
        name, cached) or a PerToken value (a bool one gives exact counts)."""
        name = named(name)
        if isinstance(name, PerToken):
            return self.row_count * name.values if name.by_row else self._row_reduce(name.values, "sum")
        key = f"row:{name}"
        found = self._sums.get(key)
        if found is None:
            sums = self.segment_sum(name)
            found = self._sums[key] = arrays.index_add(arrays.zeros(self.chunk.rows, sums), self.segment_row, sums)
        return found

    def row_max(self, name: str) -> Array:
        """Max over each row's model tokens (-inf for a row without model tokens), kept: the worst rows and the
        exact counts' bands both read |δ|'s."""
        key = f"row:{name}"
        found = self._maxima.get(key)
        if found is None:
            maxima = self.segment_max(name)
            found = arrays.scatter_max(arrays.full(self.chunk.rows, -math.inf, maxima), self.segment_row, maxima)
            self._maxima[key] = found
        return found

    def group_sum_rows(self, row_values: Array) -> Array:
        """Σ of per-row values over each step group of the chunk (float64 [G])."""
        groups = self.chunk.groups
        out = arrays.zeros(groups.count, row_values)
        return arrays.index_add(out, groups.row_group, arrays.float64(row_values))

    def group_sum(self, name: str | PerToken) -> Array:
        """Σ of a token quantity (by name) or a PerToken value over each step group's model tokens (float64 [G])."""
        name = named(name)
        if isinstance(name, PerToken) and not name.by_row:
            return self._group_token_reduce(name.values, "sum")
        return self.group_sum_rows(self.row_sum(name))

    def bucket_sum(self, segment_values: Array, bucket: Array, buckets: int) -> Array:
        """Σ of per-segment values into [G, buckets] by (step group, bucket)."""
        groups = self.chunk.groups.count
        index, values = self._bucket_index(bucket, buckets), arrays.float64(segment_values)
        if not arrays.is_tensor(values):
            # index_add's sums (each bucket's values added in order from +0.0), without its zeroed copy and checks of
            # [G·buckets]: with 4 000 one-row steps a chunk, 65 buckets, those took ~2 ms a call
            return np.bincount(index, weights=values, minlength=groups * buckets).reshape(groups, buckets)
        out = arrays.zeros(groups * buckets, values)
        arrays.index_add(out, index, values)
        return out.reshape(groups, buckets)

    def count_sums(self, names: Iterable[str], bucket: Array | None = None, buckets: int = 1) -> dict[str, Array]:
        """Σ of exact token counts (``engine/quantities.py`` COUNTS) over each step group ([G]) or, with ``bucket`` (a
        segment's), each (step group, bucket) ([G, buckets]): a count's sums are integers, exact in any order, so each
        is what ``group_sum`` or ``bucket_sum`` gives for it alone (a tensor chunk's: all in one reduction)."""
        names = tuple(names)
        groups = self.chunk.groups.count
        index = self.segment_group if bucket is None else self._bucket_index(bucket, buckets)
        shape = (groups,) if bucket is None else (groups, buckets)
        if not arrays.is_tensor(index):  # each count's runs summed by reduceat: a bincount a count took ~10× as long
            order, starts, targets = self._runs_of(index, groups * buckets)
            out = {}
            for name in names:
                values = arrays.float64(self.segment_sum(name))
                sums = np.zeros(groups * buckets)
                if starts.shape[0]:
                    sums[targets] = np.add.reduceat(values if order is None else values[order], starts)
                out[name] = sums.reshape(shape)
            return out
        values = arrays.stack([arrays.float64(self.segment_sum(name)) for name in names], axis=1)  # [S, N]
        sums = arrays.zeros((groups * buckets, len(names)), values).index_add_(0, index, values)
        return {name: sums[:, column].reshape(shape) for column, name in enumerate(names)}

    def bucket_max(self, segment_values: Array, bucket: Array, buckets: int) -> Array:
        groups = self.chunk.groups.count
        out = arrays.full(groups * buckets, -math.inf, segment_values)
        arrays.scatter_max(out, self._bucket_index(bucket, buckets), segment_values)
        return out.reshape(groups, buckets)

    def _runs_of(self, index: np.ndarray, length: int) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
        """``arrays.index_runs`` of a (step group[, bucket]) index, kept for the latest index: a family reduces
        several values by one index."""
        found = self._memo.get("index runs")
        if found is not None and found[0] is index:
            return found[1]
        runs = arrays.index_runs(index, length)
        self._memo["index runs"] = (index, runs)
        return runs

    def _bucket_index(self, bucket: Array, buckets: int) -> Array:
        """(step group, bucket) of each segment as one index; kept for the latest ``bucket`` tensor, since a family
        sums several quantities by the same buckets."""
        found = self._memo.get(("bucket index", buckets))
        if found is not None and found[0] is bucket:
            return found[1]
        index = self.segment_group * buckets + bucket
        self._memo[("bucket index", buckets)] = (bucket, index)
        return index

    def group_max(self, name: str | PerToken) -> Array:
        """Max of a token quantity (by name) or a PerToken value over each step group's model tokens (-inf where a
        group has no model token)."""
        name = named(name)
        if isinstance(name, PerToken):
            if name.by_row:
                return self.group_max_rows(name.values, self.valid_rows)
            return self._group_token_reduce(name.values, "max")
        maxima = self.segment_max(name)
        return arrays.scatter_max(arrays.full(self.chunk.groups.count, -math.inf, maxima), self.segment_group, maxima)

    def group_moments(self, x_name: str | PerToken, y_name: str | None = None) -> Array:
        """Per step group [n, mean_x, mean_y, M2_x, M2_y, C_xy] over model tokens: means first, then centred sums.
        ``x_name`` is a token quantity or a PerToken value; without ``y_name`` the y slots are 0.

        Centring before squaring keeps variances of values far from zero (probabilities, IS weights) exact. Where
        each step group is one contiguous run of tokens (the usual case) the centred sums are dot products over
        slices: no per-token temporaries beyond the centred values themselves; a per-row value costs O(rows).
        """
        x_name = named(x_name)
        n = self.group_tokens
        safe_n = arrays.clamp(n, lower=1.0)
        mean_x = self.group_sum(x_name) / safe_n
        if isinstance(x_name, PerToken) and x_name.by_row:  # Σ_i n_i·(v_i − mean)², over rows
            centred = x_name.values - mean_x[self.chunk.groups.row_group]
            m2_x = self.group_sum_rows(self.row_count * centred * centred)
            zeros = arrays.zeros(arrays.size(n), n)
            return arrays.stack([n, mean_x, zeros, m2_x, zeros, zeros], axis=-1)
        single = y_name is None
        mean_y = arrays.zeros(arrays.size(n), n) if y_name is None else self.group_sum(y_name) / safe_n
        x = x_name.values if isinstance(x_name, PerToken) else self.token(x_name)
        same = y_name == x_name
        y = x if same or y_name is None else self.token(y_name)
        ranges = self.group_token_ranges
        if ranges is not None:
            sums = np.zeros((self.chunk.groups.count, 3))
            for group, (lo, hi) in enumerate(ranges):
                if hi == lo:
                    continue
                dx = x[lo:hi] - mean_x[group]
                sums[group, 0] = arrays.dot(dx, dx)
                if single:
                    continue
                dy = dx if same else y[lo:hi] - mean_y[group]
                sums[group, 1] = sums[group, 0] if same else arrays.dot(dy, dy)
                sums[group, 2] = sums[group, 0] if same else arrays.dot(dx, dy)
            on_device = arrays.like(sums, n)
            m2_x, m2_y, c_xy = on_device[:, 0], on_device[:, 1], on_device[:, 2]
        else:
            dx = x - mean_x[self.token_group]
            m2_x = self._group_token_sum(dx * dx)
            if single:
                m2_y = c_xy = arrays.zeros(arrays.size(n), n)
            else:
                dy = dx if same else y - mean_y[self.token_group]
                m2_y = m2_x if same else self._group_token_sum(dy * dy)
                c_xy = m2_x if same else self._group_token_sum(dx * dy)
        return arrays.stack([n, mean_x, mean_y, m2_x, m2_y, c_xy], axis=-1)

    # -- rows and step groups of PerToken values (the correction families) ----------------------------
    @cached_property
    def row_tokens(self) -> Array:
        """n_i as int64 [R]."""
        return arrays.astype(self.row_count, "int64")

    @cached_property
    def valid_rows(self) -> Array:
        """Rows with at least one model token, n_i > 0 (bool [R])."""
        return self.row_count > 0

    @cached_property
    def group_tokens(self) -> Array:
        """N: model tokens of each step group (float64 [G])."""
        return self.group_sum_rows(self.row_count)

    @cached_property
    def group_rows(self) -> Array:
        """Rows of each step group (float64 [G])."""
        return self.group_sum_rows(arrays.ones(self.chunk.rows, self.row_count))

    @cached_property
    def group_valid_rows(self) -> Array:
        """Rows with a model token in each step group (float64 [G])."""
        return self.group_sum_rows(self.valid_rows)

    def row_mean(self, quantity: str | PerToken) -> Array:
        """R_i[x] = S_i[x] / (n_i + 1e-8) (Notation; 0 for an empty row)."""
        return row_mean(self.row_sum(quantity), self.row_count)

    def rows_with(self, flags: PerToken) -> Array:
        """Rows with at least one flagged model token (bool [R])."""
        if flags.by_row:
            return flags.values & self.valid_rows
        return self._row_reduce(flags.values, "sum") > 0

    def both(self, first: PerToken, second: PerToken) -> PerToken:
        """Token-wise AND of two flags (a per-row flag when both are)."""
        if first.by_row == second.by_row:
            return PerToken(first.values & second.values, first.by_row)
        row_flags, token_flags = (first, second) if first.by_row else (second, first)
        return PerToken(self.broadcast_rows(row_flags.values) & token_flags.values)

    def broadcast_rows(self, row_values: Array) -> Array:
        """Each row's value at each of its model tokens [M]: rows are contiguous runs of model tokens, so a repeat
        (numpy's on the CPU: a block copy per row, no per-token index) rather than a gather."""
        if self.chunk.device_type == "cpu":
            return arrays.like(np.repeat(arrays.host(row_values), arrays.host(self.row_tokens)), row_values)
        return arrays.repeat(row_values, self.row_tokens, arrays.size(self.chunk.model.row))

    def group_min(self, quantity: str | PerToken) -> Array:
        """Min of a token quantity (by name) or a PerToken value over each step group's model tokens (+inf where a
        group has none)."""
        quantity = named(quantity)
        if isinstance(quantity, str):
            minima = self.segment_min(quantity)
            return arrays.scatter_min(
                arrays.full(self.chunk.groups.count, math.inf, minima), self.segment_group, minima
            )
        if quantity.by_row:
            return self.group_min_rows(quantity.values, self.valid_rows)
        return self._group_token_reduce(quantity.values, "min")

    def group_max_rows(self, row_values: Array, rows: Array | None = None) -> Array:
        """Max of per-row values over each step group's rows, or over the rows flagged in ``rows`` (−inf where none)."""
        values = row_values if rows is None else arrays.where(rows, row_values, -math.inf)
        return segment_max(values, self.chunk.groups.row_group, self.chunk.groups.count)

    def group_min_rows(self, row_values: Array, rows: Array | None = None) -> Array:
        values = row_values if rows is None else arrays.where(rows, row_values, math.inf)
        return segment_min(values, self.chunk.groups.row_group, self.chunk.groups.count)

    def group_moments_rows(self, row_values: Array, rows: Array | None = None) -> Array:
        """[n, mean, 0, M2, 0, 0] of per-row values over each step group's rows, or over the rows in ``rows``."""
        group = self.chunk.groups.row_group
        if rows is not None:
            row_values, group = row_values[rows], group[rows]
        zeros = arrays.zeros(arrays.size(row_values), row_values)
        return segment_moments(row_values, zeros, group, self.chunk.groups.count)

    @cached_property
    def _filled_rows(self) -> tuple[Array | None, Array, Array]:
        """(rows with a model token, None when every row has one; their first model token; their lengths)."""
        lengths = self.row_tokens
        starts = arrays.cumsum(lengths) - lengths
        filled = lengths > 0
        if bool(filled.all()):
            return None, starts, lengths
        return filled, starts[filled], lengths[filled]

    def _row_reduce(self, values: Array, how: str) -> Array:
        """sum / max / min of a model-token tensor over each row; an empty row gets the identity (0, −inf, +inf)."""
        filled, starts, lengths = self._filled_rows
        reduced = _reduce(values, starts, lengths, how)
        if filled is None:
            return reduced
        out = arrays.full(self.chunk.rows, _IDENTITY[how], reduced)
        out[filled] = reduced
        return out

    def _group_token_reduce(self, values: Array, how: str) -> Array:
        """sum / max / min of a model-token tensor over each step group: slice by slice where groups are contiguous
        runs of tokens, else through rows. A bool tensor sums to exact counts."""
        ranges = self.group_token_ranges
        if ranges is None:
            per_row = self._row_reduce(values, how)
            if how == "sum":
                return self.group_sum_rows(per_row)
            return self.group_max_rows(per_row) if how == "max" else self.group_min_rows(per_row)
        out = arrays.full(self.chunk.groups.count, _IDENTITY[how], values)
        for group, (lo, hi) in enumerate(ranges):
            if hi > lo:
                out[group] = _reduce_slice(values[lo:hi], how)
        return out

    def _group_token_sum(self, values: Array) -> Array:
        per_segment = _reduce(values, self.segment_starts, self.segment_length, "sum")
        out = arrays.zeros(self.chunk.groups.count, per_segment)
        return arrays.index_add(out, self.segment_group, per_segment)

    def group_bincount(self, bins: Array, size: int, weights: Array | None = None) -> Array:
        """Histogram [G, size] of per-model-token bin indices in [0, size) by step group: token counts, or Σ of
        ``weights`` (float64). Contiguous step groups are counted slice by slice, without a per-token group index."""
        groups = self.chunk.groups.count
        ranges = self.group_token_ranges

        if groups == 1:
            return arrays.bincount(bins, weights, size).reshape(1, size)
        if ranges is not None:
            return arrays.stack(
                [arrays.bincount(bins[lo:hi], None if weights is None else weights[lo:hi], size) for lo, hi in ranges]
            )
        return arrays.bincount(self.token_group * size + bins, weights, groups * size).reshape(groups, size)

    @cached_property
    def group_token_ranges(self) -> list[tuple[int, int]] | None:
        """[lo, hi) model-token range of each step group when every group is one contiguous run of rows, else None."""
        groups = self.chunk.groups
        if groups.count == 1:
            return [(0, self.model_tokens)]
        row_group = groups.row_group
        changes = arrays.flatnonzero(row_group[1:] != row_group[:-1]) + 1
        if arrays.size(changes) != groups.count - 1:
            return None
        ends = arrays.astype(arrays.cumsum(self.row_count), "int64")
        first_rows = arrays.concat([arrays.zeros(1, changes, "int64"), changes])
        last = arrays.full(1, self.chunk.rows, changes, "int64")
        bounds = arrays.concat([arrays.zeros(1, ends, "int64"), ends])[arrays.concat([first_rows, last])]
        ranges: list[tuple[int, int]] = [(0, 0)] * groups.count
        order = row_group[first_rows].tolist()
        edges = bounds.tolist()
        for run, group in enumerate(order):
            ranges[group] = (edges[run], edges[run + 1])
        return ranges

    @cached_property
    def token_group(self) -> Array:
        """Step group of every model token (only built for the rare chunk that spans several steps)."""
        return self.chunk.groups.row_group[self.chunk.model.row]


def named(quantity: str | PerToken) -> str | PerToken:
    """A PerToken that is a token quantity, by its name (so its cached reductions serve); anything else as it is."""
    if isinstance(quantity, PerToken) and quantity.name is not None:
        return quantity.name
    return quantity


_NUMPY_REDUCERS = {"sum": np.add, "max": np.maximum, "min": np.minimum}
_IDENTITY = {"sum": 0.0, "max": -np.inf, "min": np.inf}


def _reduce(values: Array, starts: Array, lengths: Array, how: str) -> Array:
    """sum / max / min over contiguous non-empty segments: numpy's sequential reduceat on the CPU (5× faster
    than torch.segment_reduce there), segment_reduce on GPUs."""
    if arrays.size(starts) == 0:
        return arrays.zeros(0, values)
    if not arrays.is_tensor(values) or values.device.type == "cpu":
        host, first = arrays.host(values), arrays.host(starts)
        if arrays.is_bool(values) and how == "sum":  # exact counts, summed over bytes (no float64 copy)
            counts = np.add.reduceat(host.view(np.uint8), first, dtype=np.int64)
            return arrays.like(counts.astype(np.float64), values)
        return arrays.like(_NUMPY_REDUCERS[how].reduceat(host.astype(np.float64, copy=False), first), values)
    import torch  # a GPU chunk

    return torch.segment_reduce(values.to(torch.float64), how, lengths=lengths)


def _reduce_slice(values: Array, how: str) -> Array | float:
    """sum / max / min of a non-empty run of values (float64: 0-dim for a tensor); a bool run sums to an exact
    count."""
    if not arrays.is_tensor(values):
        if how == "sum":
            return float(np.count_nonzero(values)) if values.dtype == np.bool_ else float(values.sum(dtype=np.float64))
        return float(values.max() if how == "max" else values.min())
    import torch

    if how == "sum":
        if values.dtype == torch.bool and values.device.type == "cpu":
            return torch.tensor(float(np.count_nonzero(values.numpy())), dtype=torch.float64)
        return values.sum().to(torch.float64)
    return (values.max() if how == "max" else values.min()).to(torch.float64)


def reduce_runs(values: Array, lengths: Array, how: str) -> Array:
    """sum / max / min of consecutive runs of ``values`` (e.g. rows of model tokens) with the given lengths;
    an empty run gets the identity (0, −inf, +inf)."""
    out = arrays.full(arrays.size(lengths), _IDENTITY[how], values)
    filled = lengths > 0
    if bool(filled.any()):
        starts = arrays.cumsum(lengths) - lengths
        out[filled] = _reduce(values, starts[filled], lengths[filled], how)
    return out


class RegroupedStats(ChunkStats):
    """ChunkStats of a view that regroups a chunk's rows (``ChunkStats.regrouped``; ``--by``, groups.py). Groups
    interleave within a chunk, so the centred sums of ``group_moments`` are taken over each group's tokens gathered
    into one contiguous run (rows in order), as analysing the group alone does, instead of through a per-token group
    index (2 gathers and 2 temporaries per quantity)."""

    def __init__(self, chunk: ChunkArrays, caches: TokenCaches, row_level: Mapping[str, Any]) -> None:
        """``row_level``: the row-level cached properties the regrouped chunk's stats computed already (shared)."""
        super().__init__(chunk, caches)
        for name, value in row_level.items():
            setattr(self, name, value)  # a cached_property takes an assigned value as its cache

    @cached_property
    def _runs(self) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """(model-token order that makes each group one run, rows in order; [lo, hi) of each group in it)."""
        row_group = arrays.host(self.chunk.groups.row_group)
        lengths = arrays.host(self.row_tokens)
        starts = np.cumsum(lengths) - lengths
        rows = np.argsort(row_group, kind="stable")
        run_lengths = lengths[rows]
        run_starts = np.cumsum(run_lengths) - run_lengths
        order = np.repeat(starts[rows] - run_starts, run_lengths) + np.arange(int(run_lengths.sum()))
        per_group = np.bincount(row_group, weights=lengths, minlength=self.chunk.groups.count).astype(np.int64)
        edges = np.concatenate([[0], np.cumsum(per_group)]).tolist()
        return order, list(pairwise(edges))

    def group_moments(self, x_name: str | PerToken, y_name: str | None = None) -> Array:
        x_name = named(x_name)
        if not isinstance(x_name, str) or self.chunk.device_type != "cpu":
            return super().group_moments(x_name, y_name)
        order, ranges = self._runs
        n = self.group_tokens
        safe_n = arrays.clamp(n, lower=1.0)
        mean_x = (self.group_sum(x_name) / safe_n).tolist()
        single, same = y_name is None, y_name == x_name
        mean_y = [0.0] * len(mean_x) if y_name is None else (self.group_sum(y_name) / safe_n).tolist()
        x = arrays.host(self.token(x_name))[order]
        y = x if y_name is None or same else arrays.host(self.token(y_name))[order]
        kind = self.chunk.trainer  # the dot products of the chunk's kind of array: numpy's, or torch's on tensors
        sums = np.zeros((len(ranges), 3), dtype=np.float64)
        for group, (lo, hi) in enumerate(ranges):
            if hi == lo:
                continue
            dx = arrays.like(x[lo:hi], kind) - mean_x[group]
            sums[group, 0] = arrays.dot(dx, dx)
            if single:
                continue
            if same:
                sums[group, 1] = sums[group, 2] = sums[group, 0]
                continue
            dy = arrays.like(y[lo:hi], kind) - mean_y[group]
            sums[group, 1] = arrays.dot(dy, dy)
            sums[group, 2] = arrays.dot(dx, dy)
        m2 = arrays.like(sums, n)
        means_x, means_y = (arrays.like(np.array(means, dtype=np.float64), n) for means in (mean_x, mean_y))
        return arrays.stack([n, means_x, means_y, m2[:, 0], m2[:, 1], m2[:, 2]], axis=-1)
