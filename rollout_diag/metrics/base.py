"""Mergeable per-step accumulators over float64 sufficient statistics.

An accumulator keeps one *state* per training step: a dict of float64 numpy arrays, each merged by
the reduction its family declares (``sum``, ``max``, ``min``, or ``moments``: Chan's pairwise update of
count / means / centred second moments). ``update(chunk)`` computes the partial state of every step
group in the chunk with vectorised numpy or torch ops and merges it in; ``merge(other)`` folds in another
accumulator (another chunk range, another Ray worker). A run is every row as one batch, so the run
state is the merge of all step states. Metric values are derived only in ``finalize``.
"""

from __future__ import annotations

import copy
import importlib
import itertools
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import numpy as np

from rollout_diag import arrays
from rollout_diag.arrays import Array
from rollout_diag.catalogue import CLAMP, EPS
from rollout_diag.io.chunk import Chunk
from rollout_diag.results import KeyColumns, MetricColumns

State = dict[str, np.ndarray]


# ----------------------------------------------------------------------- segment reductions (numpy or torch)
def segment_sum(values: Array, index: Array, count: int) -> Array:
    """Sum ``values`` [n, ...] into ``count`` buckets by ``index`` [n] (float64)."""
    return arrays.index_add(arrays.zeros((count, *values.shape[1:]), values), index, arrays.float64(values))


def segment_max(values: Array, index: Array, count: int) -> Array:
    """Max per bucket; empty buckets get -inf (the identity of max)."""
    return arrays.scatter_max(arrays.full(count, -math.inf, values), index, arrays.float64(values))


def segment_min(values: Array, index: Array, count: int) -> Array:
    """Min per bucket; empty buckets get +inf (the identity of min)."""
    return arrays.scatter_min(arrays.full(count, math.inf, values), index, arrays.float64(values))


def segment_moments(x: Array, y: Array, index: Array, count: int) -> Array:
    """Per bucket [n, mean_x, mean_y, M2_x, M2_y, C_xy], two passes (means, then centred sums).

    Exact enough for values far from zero (probabilities near 1, IS weights near 1), where raw sums of
    squares would cancel.
    """
    n = segment_sum(arrays.ones(x.shape[0], x), index, count)
    safe_n = arrays.clamp(n, lower=1.0)
    mean_x = segment_sum(x, index, count) / safe_n
    mean_y = segment_sum(y, index, count) / safe_n
    dx = x - mean_x[index]
    dy = y - mean_y[index]
    m2_x = segment_sum(dx * dx, index, count)
    m2_y = segment_sum(dy * dy, index, count)
    c_xy = segment_sum(dx * dy, index, count)
    return arrays.stack([n, mean_x, mean_y, m2_x, m2_y, c_xy], axis=-1)


# ----------------------------------------------------------------------- merging (numpy, host)
def merge_moments(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Chan et al.'s pairwise merge of [n, mean_x, mean_y, M2_x, M2_y, C_xy] (works elementwise on [..., 6])."""
    if a.size == 6 and b.size == 6:  # one state (a step's, as chunks go on): the same operations on Python floats
        return np.array(_merge_one(a.reshape(6).tolist(), b.reshape(6).tolist()), dtype=np.float64).reshape(a.shape)
    n_a, n_b = a[..., 0], b[..., 0]
    n = n_a + n_b
    with np.errstate(invalid="ignore", divide="ignore"):
        weight_b = np.where(n > 0, n_b / np.where(n > 0, n, 1.0), 0.0)
        cross = np.where(n > 0, n_a * n_b / np.where(n > 0, n, 1.0), 0.0)
    d_x = b[..., 1] - a[..., 1]
    d_y = b[..., 2] - a[..., 2]
    out = np.empty_like(a)
    out[..., 0] = n
    out[..., 1] = a[..., 1] + d_x * weight_b
    out[..., 2] = a[..., 2] + d_y * weight_b
    out[..., 3] = a[..., 3] + b[..., 3] + d_x * d_x * cross
    out[..., 4] = a[..., 4] + b[..., 4] + d_y * d_y * cross
    out[..., 5] = a[..., 5] + b[..., 5] + d_x * d_y * cross
    return out


def _merge_one(a: list[float], b: list[float]) -> list[float]:
    """``merge_moments`` of one pair, operation for operation (IEEE float64 either way, so the same digits)."""
    n_a, mean_x, mean_y, m2_x, m2_y, c_xy = a
    n_b = b[0]
    n = n_a + n_b
    weight_b = n_b / n if n > 0 else 0.0
    cross = n_a * n_b / n if n > 0 else 0.0
    d_x = b[1] - mean_x
    d_y = b[2] - mean_y
    return [
        n,
        mean_x + d_x * weight_b,
        mean_y + d_y * weight_b,
        m2_x + b[3] + d_x * d_x * cross,
        m2_y + b[4] + d_y * d_y * cross,
        c_xy + b[5] + d_x * d_y * cross,
    ]


_MERGE = {
    "sum": np.add,
    "max": np.maximum,
    "min": np.minimum,
    "moments": merge_moments,
    "concat": lambda a, b: np.concatenate([a, b]),  # per-row values (grows with rows, never with tokens)
}


def merge_states(a: State, b: State, reductions: Mapping[str, str]) -> State:
    return {name: _MERGE[reductions[name]](a[name], b[name]) for name in reductions}


# ----------------------------------------------------------------------- per-step state as columns keyed by step
IDENTITY = {"sum": 0.0, "max": -math.inf, "min": math.inf, "moments": 0.0}
# A per-step array with more elements than this (round, position and histogram buckets) is stored sparse: only
# the buckets a step hit, as (step, bucket) -> value entries; a smaller one is a dense column [steps, ...].
SPARSE_MIN = 8
# The open part of an accumulator's table (StepAccumulator._append) is sealed off once it holds more steps than this.
OPEN_STEPS = 16
# The finished layers of an accumulator's table (StepAccumulator._begin_layer) are folded, whatever their size, once
# more than LAYERS of them span one step (a fold reduces that many states of the step one after another), or once there
# are more than HELD_LAYERS of them (the tables held, and the work of deciding when to fold).
LAYERS = 64
HELD_LAYERS = 1024


@dataclass(frozen=True)
class Ragged:
    """Per-row values of a chunk (``values`` [n, ...]) with the step group of each (``group`` [n]), merged by
    concatenation: what a ``concat`` reduction's ``_stats`` returns."""

    values: np.ndarray
    group: np.ndarray


@dataclass(frozen=True)
class Sparse:
    """A wide field's partial state given as entries, for a kernel that never makes the dense [G, ...] array:
    ``values[e]`` (shape ``tail``: (6,) for ``moments``, else ()) belongs to step group ``group[e]`` and flat bucket
    ``bucket[e]`` of a per-step array of ``shape``; each (group, bucket) at most once."""

    group: np.ndarray
    bucket: np.ndarray
    values: np.ndarray
    shape: tuple[int, ...]


def _reduce(reduction: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return _MERGE[reduction](a, b)


def _tail(reduction: str) -> tuple[int, ...]:
    return (6,) if reduction == "moments" else ()


def _hits(reduction: str, values: np.ndarray) -> np.ndarray:
    """Entries that differ from the identity of ``reduction`` (only those change a merge)."""
    if reduction == "moments":
        return values[..., 0] != 0
    return values != IDENTITY[reduction]


def _merge_entries(
    reduction: str,
    mine: tuple[np.ndarray, np.ndarray, np.ndarray],
    theirs: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two tables' (step, bucket, values) entries of one wide field as one, sorted by (step, bucket); a key both
    hold gets reduce(mine, theirs)."""
    step, bucket, values = mine
    their_step, their_bucket, their_values = theirs
    all_step = np.concatenate([step, their_step])
    all_bucket = np.concatenate([bucket, their_bucket])
    source = np.repeat(np.array([0, 1], np.int8), [step.shape[0], their_step.shape[0]])
    order = np.lexsort((source, all_bucket, all_step))
    all_step, all_bucket = all_step[order], all_bucket[order]
    all_values = np.concatenate([values, their_values])[order]
    same = (all_step[1:] == all_step[:-1]) & (all_bucket[1:] == all_bucket[:-1])
    first = np.flatnonzero(same)  # each key is unique per table: duplicates come in (mine, theirs) pairs
    all_values[first] = _reduce(reduction, all_values[first], all_values[first + 1])
    keep = np.ones(all_step.shape[0], dtype=bool)
    keep[first + 1] = False
    return all_step[keep], all_bucket[keep], all_values[keep]


def _tree_reduce(reduction: str, values: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Reduce the runs ``values[start[j]:start[j+1]]`` (in order, pairwise, vectorised over runs)."""
    length = np.diff(np.append(start, values.shape[0]))
    if reduction in ("sum", "max", "min") and values.ndim == 1:
        return _MERGE[reduction].reduceat(values, start) if values.shape[0] else values[:0]
    while values.shape[0] > length.shape[0]:
        run = np.repeat(np.arange(length.shape[0]), length)
        rank = np.arange(values.shape[0]) - np.repeat(start, length)
        left = np.flatnonzero((rank % 2 == 0) & (rank + 1 < length[run]))
        merged = values.copy()
        merged[left] = _reduce(reduction, values[left], values[left + 1])
        keep = rank % 2 == 0
        values = merged[keep]
        length = (length + 1) // 2
        start = np.concatenate([[0], np.cumsum(length)[:-1]]).astype(np.int64)
    return values


def _rows_by_step(blocks: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Per-row (step, values) blocks, in the order they came, as one block sorted by step (stable: a step's rows keep
    that order): how a ``concat`` field merges."""
    step = np.concatenate([block[0] for block in blocks])
    order = np.argsort(step, kind="stable")
    return step[order], np.concatenate([block[1] for block in blocks])[order]


def _run_starts(*keys: np.ndarray) -> np.ndarray:
    """Where each run of equal keys begins in entries sorted by ``keys`` (int64 [runs]; none without entries)."""
    count = keys[0].shape[0]
    if not count:
        return np.zeros(0, np.int64)
    differs = np.zeros(count - 1, dtype=bool)
    for key in keys:
        differs |= key[1:] != key[:-1]
    return np.flatnonzero(np.r_[True, differs])


def _fold_plan(start: np.ndarray, count: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """For runs beginning at ``start`` of ``count`` entries: per offset k ≥ 1, (the runs longer than k, their k-th
    entry), what ``_fold_runs`` reduces in turn."""
    length = np.diff(np.append(start, count))
    plan = []
    for offset in range(1, int(length.max(initial=1))):
        runs = np.flatnonzero(length > offset)
        plan.append((runs, start[runs] + offset))
    return plan


def _fold_runs(
    reduction: str, values: np.ndarray, start: np.ndarray, plan: list[tuple[np.ndarray, np.ndarray]]
) -> np.ndarray:
    """Each run of ``values`` reduced left to right, reduce(reduce(v0, v1), v2)…: the entries a chain of merges
    reduces, in its order and with its operations (elementwise, so the same digits), one offset at a time."""
    out = values[start]  # a new array: the tables' arrays are never written to
    for runs, entry in plan:
        out[runs] = _reduce(reduction, out[runs], values[entry])
    return out


@dataclass
class StateTable:
    """One family's per-step states as columns keyed by step: ``steps`` (sorted, unique); a dense column [S, ...]
    per small field; (step, bucket, value) entries sorted by (step, bucket) per wide field, only where a step
    hit the bucket; (step, row values) per ``concat`` field. Memory follows what the steps hold."""

    reductions: Mapping[str, str]
    shapes: dict[str, tuple[int, ...]]
    steps: np.ndarray
    dense: dict[str, np.ndarray]
    sparse: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]  # name -> (step, flat bucket, values)
    ragged: dict[str, tuple[np.ndarray, np.ndarray]]  # name -> (step, values), sorted by step (stable)

    @classmethod
    def empty(cls, reductions: Mapping[str, str]) -> StateTable:
        return cls(reductions, {}, np.zeros(0, np.int64), {}, {}, {})

    @classmethod
    def from_groups(cls, reductions: Mapping[str, str], steps: Sequence[int], partial: Mapping) -> StateTable:
        """The table of one chunk: ``partial[name]`` is [G, ...] (group g is ``steps[g]``), a Sparse (a wide field
        only) or a Ragged (``concat``)."""
        step_ids = np.asarray(steps, dtype=np.int64)
        table = cls(reductions, {}, step_ids, {}, {}, {})
        for name, reduction in reductions.items():
            value = partial[name]
            if reduction == "concat":
                values = np.asarray(value.values, dtype=np.float64)
                group = np.asarray(value.group, dtype=np.int64)
                order = np.argsort(group, kind="stable")
                table.shapes[name] = values.shape[1:]
                table.ragged[name] = (step_ids[group[order]], values[order])
                continue
            if isinstance(value, Sparse) and math.prod(value.shape) <= SPARSE_MIN:  # small: a dense column
                tail = _tail(reduction)
                dense = np.full(
                    (len(step_ids), math.prod(value.shape) // max(math.prod(tail), 1), *tail), IDENTITY[reduction]
                )
                dense[np.asarray(value.group, np.int64), np.asarray(value.bucket, np.int64)] = value.values
                value = dense.reshape(len(step_ids), *value.shape)
            if isinstance(value, Sparse):
                table.shapes[name] = tuple(value.shape)
                group, bucket = np.asarray(value.group, np.int64), np.asarray(value.bucket, np.int64)
                order = np.lexsort((bucket, group))
                values = np.asarray(value.values, dtype=np.float64)[order]
                hit = _hits(reduction, values)
                table.sparse[name] = (step_ids[group[order][hit]], bucket[order][hit], values[hit])
                continue
            array = np.asarray(value, dtype=np.float64).reshape(len(step_ids), *np.shape(value)[1:])
            shape = array.shape[1:]
            table.shapes[name] = shape
            if math.prod(shape) <= SPARSE_MIN:
                table.dense[name] = array
                continue
            tail = _tail(reduction)
            flat = array.reshape(len(step_ids), -1, *tail)
            group, bucket = np.nonzero(_hits(reduction, flat))
            table.sparse[name] = (step_ids[group], bucket.astype(np.int64), flat[group, bucket])
        return table

    # -- merging -----------------------------------------------------------------------------------
    def merged(self, other: StateTable) -> StateTable:
        """This table merged with ``other`` (each step's state: reduce(mine, theirs), as merge_states)."""
        if not other.steps.shape[0] and not other.ragged:
            return self
        if not self.shapes:
            return other
        if self.steps.shape[0] and other.steps.shape[0] and other.steps[0] == self.steps[-1]:
            return self._merged_touching(other)
        return self._merged_general(other)

    def _merged_general(self, other: StateTable) -> StateTable:
        """``merged`` for steps in any order (``self`` and ``other`` both hold fields)."""
        if self.steps.shape[0] and other.steps.shape[0] and other.steps[0] > self.steps[-1]:
            steps = np.concatenate([self.steps, other.steps])
            dense = {name: np.concatenate([self.dense[name], other.dense[name]]) for name in self.dense}
        else:
            steps = np.union1d(self.steps, other.steps)
            mine, theirs = np.searchsorted(steps, self.steps), np.searchsorted(steps, other.steps)
            common = np.isin(other.steps, self.steps)
            dense = {}
            for name, column in self.dense.items():
                reduction = self.reductions[name]
                out = np.empty((steps.shape[0], *column.shape[1:]))
                out[mine] = column
                incoming = other.dense[name]
                out[theirs[~common]] = incoming[~common]
                at = theirs[common]
                out[at] = _reduce(reduction, out[at], incoming[common])
                dense[name] = out
        sparse = {name: self._merge_sparse(name, other.sparse[name]) for name in self.sparse}
        ragged = {name: _rows_by_step([rows, other.ragged[name]]) for name, rows in self.ragged.items()}
        return StateTable(self.reductions, self.shapes, steps, dense, sparse, ragged)

    def _merged_touching(self, other: StateTable) -> StateTable:
        """``merged`` where ``other``'s first step is this table's last (a chunk going on with the open step): the
        one shared step is reduced (mine, theirs), every other step is copied; entries sorted by step make each
        field's shared step a slice, so no union, membership test or sort over the tables."""
        last = self.steps[-1]
        steps = np.concatenate([self.steps, other.steps[1:]])
        dense = {}
        for name, column in self.dense.items():
            incoming = other.dense[name]
            shared = _reduce(self.reductions[name], column[-1:], incoming[:1])
            dense[name] = np.concatenate([column[:-1], shared, incoming[1:]])
        sparse = {}
        for name, (step, bucket, values) in self.sparse.items():
            their_step, their_bucket, their_values = other.sparse[name]
            mine = int(np.searchsorted(step, last))  # my entries of the shared step: [mine:]
            theirs = int(np.searchsorted(their_step, last, side="right"))  # theirs: [:theirs]
            if mine == step.shape[0] or not theirs:  # the shared step has entries on one side only
                sparse[name] = (
                    np.concatenate([step, their_step]),
                    np.concatenate([bucket, their_bucket]),
                    np.concatenate([values, their_values]),
                )
                continue
            my_bucket, their_shared = bucket[mine:], their_bucket[:theirs]
            mine_count, their_count = my_bucket.shape[0], their_shared.shape[0]
            common = min(mine_count, their_count)
            if np.array_equal(my_bucket[:common], their_shared[:common]):
                # one side's buckets begin the other's (rounds and positions 0…k): those reduce, the rest follow
                reduced = _reduce(self.reductions[name], values[mine : mine + common], their_values[:common])
                if mine_count >= their_count:  # mine go on: the step's entries end where mine do
                    sparse[name] = (
                        np.concatenate([step, their_step[theirs:]]),
                        np.concatenate([bucket, their_bucket[theirs:]]),
                        np.concatenate([values[:mine], reduced, values[mine + common :], their_values[theirs:]]),
                    )
                else:
                    sparse[name] = (
                        np.concatenate([step[:mine], their_step]),
                        np.concatenate([bucket[:mine], their_bucket]),
                        np.concatenate([values[:mine], reduced, their_values[common:]]),
                    )
                continue
            shared_step, shared_bucket, shared_values = _merge_entries(
                self.reductions[name],
                (step[mine:], my_bucket, values[mine:]),
                (their_step[:theirs], their_shared, their_values[:theirs]),
            )
            sparse[name] = (
                np.concatenate([step[:mine], shared_step, their_step[theirs:]]),
                np.concatenate([bucket[:mine], shared_bucket, their_bucket[theirs:]]),
                np.concatenate([values[:mine], shared_values, their_values[theirs:]]),
            )
        # my rows of every step come before theirs: concatenated, the entries stay sorted by step (stable); none of
        # theirs (held aside, StepAccumulator._hold_rows): mine as they are (arrays are never written in place)
        ragged = {
            name: (step, values)
            if not other.ragged[name][0].shape[0]
            else (np.concatenate([step, other.ragged[name][0]]), np.concatenate([values, other.ragged[name][1]]))
            for name, (step, values) in self.ragged.items()
        }
        return StateTable(self.reductions, self.shapes, steps, dense, sparse, ragged)

    def _merge_sparse(self, name: str, theirs: tuple[np.ndarray, np.ndarray, np.ndarray]):
        step, bucket, values = self.sparse[name]
        their_step, their_bucket, their_values = theirs
        if not their_step.shape[0]:
            return step, bucket, values
        if step.shape[0] and their_step[0] > step[-1]:
            return (
                np.concatenate([step, their_step]),
                np.concatenate([bucket, their_bucket]),
                np.concatenate([values, their_values]),
            )
        return _merge_entries(self.reductions[name], (step, bucket, values), theirs)

    @classmethod
    def joined(cls, tables: Sequence[StateTable]) -> StateTable:
        """Tables whose steps follow each other (each table's first step after the previous one's last) as one."""
        parts = [table for table in tables if table.shapes]
        if len(parts) <= 1:
            return parts[0] if parts else tables[-1]
        first = parts[0]
        return cls(
            first.reductions,
            first.shapes,
            np.concatenate([table.steps for table in parts]),
            {name: np.concatenate([table.dense[name] for table in parts]) for name in first.dense},
            {
                name: tuple(np.concatenate([table.sparse[name][i] for table in parts]) for i in range(3))  # type: ignore[misc]
                for name in first.sparse
            },
            {
                name: tuple(np.concatenate([table.ragged[name][i] for table in parts]) for i in range(2))  # type: ignore[misc]
                for name in first.ragged
            },
        )

    @classmethod
    def folded(cls, tables: Sequence[StateTable]) -> StateTable:
        """``tables[0].merged(tables[1]).merged(tables[2])…`` in one pass, digit for digit: every table's entries
        sorted by key (the step; the step and bucket of a wide field), a key's entries in table order, and each key's
        run reduced left to right, reduce(reduce(first, second), third)…, the order the chain of merges takes. The
        chain copies the growing table once per table; this copies each entry once (and sorts them)."""
        parts = [table for table in tables if table.shapes and table.steps.shape[0]]
        if len(parts) <= 1:  # nothing to reduce (a table without steps adds no state to a merge)
            shaped = [table for table in tables if table.shapes]
            return parts[0] if parts else (shaped[0] if shaped else tables[0])
        first = parts[0]
        all_steps = np.concatenate([table.steps for table in parts])
        order = np.argsort(all_steps, kind="stable")  # a step's entries in table order
        all_steps = all_steps[order]
        start = _run_starts(all_steps)
        plan = _fold_plan(start, all_steps.shape[0])  # the same runs for every dense field
        dense = {
            name: _fold_runs(
                first.reductions[name], np.concatenate([table.dense[name] for table in parts])[order], start, plan
            )
            for name in first.dense
        }
        sparse = {}
        for name in first.sparse:
            step, bucket, values = (np.concatenate([table.sparse[name][i] for table in parts]) for i in range(3))
            source = np.repeat(np.arange(len(parts)), [table.sparse[name][0].shape[0] for table in parts])
            by_key = np.lexsort((source, bucket, step))
            step, bucket = step[by_key], bucket[by_key]
            runs = _run_starts(step, bucket)
            values = _fold_runs(first.reductions[name], values[by_key], runs, _fold_plan(runs, step.shape[0]))
            sparse[name] = (step[runs], bucket[runs], values)
        # concatenation: a step's rows in table order, each table's in its own order
        ragged = {name: _rows_by_step([table.ragged[name] for table in parts]) for name in first.ragged}
        return cls(first.reductions, first.shapes, all_steps[start], dense, sparse, ragged)

    def with_rows(self, blocks: Sequence[Mapping[str, tuple[np.ndarray, np.ndarray]]]) -> StateTable:
        """This table with per-row values (``ragged`` blocks, each (step, values) per field) after its own, in order,
        sorted by step (stable: a step's rows in the order they came, as merging the blocks' tables one by one keeps
        them)."""
        ragged = {name: _rows_by_step([rows, *(block[name] for block in blocks)]) for name, rows in self.ragged.items()}
        return StateTable(self.reductions, self.shapes, self.steps, self.dense, self.sparse, ragged)

    def subset(self, keep: np.ndarray) -> StateTable:
        """The table of the steps where ``keep`` (bool [S]) holds."""
        kept = np.flatnonzero(keep)
        if not kept.shape[0]:
            return self.sliced(0, 0)
        if kept[-1] - kept[0] + 1 == kept.shape[0]:  # one run of steps (a prefix, a suffix, a range)
            return self.sliced(int(kept[0]), int(kept[-1]) + 1)
        return self._subset_general(keep)

    def _subset_general(self, keep: np.ndarray) -> StateTable:
        """``subset`` for any choice of steps: each field's entries by membership of their step."""
        steps = self.steps[keep]
        dense = {name: column[keep] for name, column in self.dense.items()}
        sparse = {}
        for name, (step, bucket, values) in self.sparse.items():
            inside = np.isin(step, steps)
            sparse[name] = (step[inside], bucket[inside], values[inside])
        ragged = {}
        for name, (step, values) in self.ragged.items():
            inside = np.isin(step, steps)
            ragged[name] = (step[inside], values[inside])
        return StateTable(self.reductions, self.shapes, steps, dense, sparse, ragged)

    def sliced(self, begin: int, end: int) -> StateTable:
        """The table of the steps ``steps[begin:end]``: every field's entries are sorted by step, so each is a slice
        (bounds by ``searchsorted``) and no step is tested for membership."""
        count = self.steps.shape[0]
        end = min(max(end, begin), count)
        steps = self.steps[begin:end]
        dense = {name: column[begin:end] for name, column in self.dense.items()}

        def bounds(step: np.ndarray) -> tuple[int, int]:
            if begin >= end:
                return 0, 0
            lo = 0 if begin == 0 else int(np.searchsorted(step, self.steps[begin]))
            hi = step.shape[0] if end == count else int(np.searchsorted(step, self.steps[end]))
            return lo, hi

        sparse = {}
        for name, (step, bucket, values) in self.sparse.items():
            lo, hi = bounds(step)
            sparse[name] = (step[lo:hi], bucket[lo:hi], values[lo:hi])
        ragged = {}
        for name, (step, values) in self.ragged.items():
            lo, hi = bounds(step)
            ragged[name] = (step[lo:hi], values[lo:hi])
        return StateTable(self.reductions, self.shapes, steps, dense, sparse, ragged)

    def relabeled(self, rename: np.ndarray) -> StateTable:
        """The table with every step s renamed ``rename[s]`` (one-to-one; the steps index ``rename``), re-sorted by
        the new names: how ``--by`` keys (group, step) pairs by integers while it reads, then by the group's steps."""
        steps = rename[self.steps]
        order = np.argsort(steps, kind="stable")
        dense = {name: column[order] for name, column in self.dense.items()}
        sparse = {}
        for name, (step, bucket, values) in self.sparse.items():
            renamed = rename[step]
            by_key = np.lexsort((bucket, renamed))
            sparse[name] = (renamed[by_key], bucket[by_key], values[by_key])
        ragged = {}
        for name, (step, values) in self.ragged.items():
            renamed = rename[step]
            by_step = np.argsort(renamed, kind="stable")  # a step's rows keep their order
            ragged[name] = (renamed[by_step], values[by_step])
        return StateTable(self.reductions, self.shapes, steps[order], dense, sparse, ragged)

    # -- reading -----------------------------------------------------------------------------------
    def _blank(self, name: str, count: int | None = None) -> np.ndarray:
        shape = self.shapes[name] if count is None else (count, *self.shapes[name])
        return np.full(shape, IDENTITY[self.reductions[name]], dtype=np.float64)

    def blocks(
        self, block: int = 4096, names: Sequence[str] | None = None
    ) -> Iterator[tuple[list[int], dict[str, Any]]]:
        """(steps, columns) of up to ``block`` consecutive steps: each field (of ``names``; all when None) as one
        [B, ...] array (a list of B arrays for ``concat``), wide fields made dense for these steps only (memory stays
        small)."""
        if names is not None:
            fields = set(names)
            sparse = {name: entries for name, entries in self.sparse.items() if name in fields}
            narrowed = StateTable(
                {name: self.reductions[name] for name in names},
                self.shapes,
                self.steps,
                {name: column for name, column in self.dense.items() if name in fields},
                sparse,
                {name: entries for name, entries in self.ragged.items() if name in fields},
            )
            yield from narrowed.blocks(block)
            return
        bounds = {name: np.searchsorted(step, self.steps) for name, (step, _, _) in self.sparse.items()}
        ragged_bounds = {name: np.searchsorted(step, self.steps) for name, (step, _) in self.ragged.items()}
        steps = self.steps.tolist()
        for begin in range(0, len(steps), block):
            end = min(begin + block, len(steps))
            columns: dict[str, Any] = {name: column[begin:end] for name, column in self.dense.items()}
            for name, (step, bucket, values) in self.sparse.items():
                out = self._blank(name, end - begin).reshape(end - begin, -1, *_tail(self.reductions[name]))
                lo = bounds[name][begin]
                hi = bounds[name][end] if end < len(steps) else step.shape[0]
                row = np.searchsorted(self.steps, step[lo:hi]) - begin
                out[row, bucket[lo:hi]] = values[lo:hi]
                columns[name] = out.reshape(end - begin, *self.shapes[name])
            for name, (step, values) in self.ragged.items():
                last = ragged_bounds[name][end] if end < len(steps) else step.shape[0]
                cuts = np.append(ragged_bounds[name][begin:end], last).tolist()
                columns[name] = [values[lo:hi] for lo, hi in itertools.pairwise(cuts)]
            yield steps[begin:end], {name: columns[name] for name in self.reductions}

    def states(self, block: int = 4096) -> Iterator[tuple[int, State]]:
        """(step, state) in step order."""
        names = list(self.reductions)
        for steps, columns in self.blocks(block):
            for step, values in zip(steps, zip(*(list(columns[name]) for name in names), strict=True), strict=True):
                yield step, dict(zip(names, values, strict=True))

    def state(self, step: int) -> State:
        """One step's state (dense arrays); KeyError when the step is not in the table."""
        index = int(np.searchsorted(self.steps, step))
        if index >= self.steps.shape[0] or self.steps[index] != step:
            raise KeyError(step)
        state: State = {name: column[index] for name, column in self.dense.items()}
        for name, (steps, bucket, values) in self.sparse.items():
            lo, hi = np.searchsorted(steps, step, side="left"), np.searchsorted(steps, step, side="right")
            out = self._blank(name).reshape(-1, *_tail(self.reductions[name]))
            out[bucket[lo:hi]] = values[lo:hi]
            state[name] = out.reshape(self.shapes[name])
        for name, (steps, values) in self.ragged.items():
            lo, hi = np.searchsorted(steps, step, side="left"), np.searchsorted(steps, step, side="right")
            state[name] = values[lo:hi]
        return {name: state[name] for name in self.reductions}

    def total(self) -> State | None:
        """Every step's state merged (a run is every row as one batch); None without steps."""
        if not self.steps.shape[0]:
            return None
        out: State = {}
        for name, column in self.dense.items():
            reduction = self.reductions[name]
            out[name] = _tree_reduce(reduction, column, np.zeros(1, np.int64))[0]
        for name, (step, bucket, values) in self.sparse.items():
            reduction = self.reductions[name]
            flat = self._blank(name).reshape(-1, *_tail(reduction))
            if step.shape[0]:
                order = np.lexsort((step, bucket))
                sorted_bucket = bucket[order]
                start = np.flatnonzero(np.r_[True, sorted_bucket[1:] != sorted_bucket[:-1]])
                flat[sorted_bucket[start]] = _tree_reduce(reduction, values[order], start)
            out[name] = flat.reshape(self.shapes[name])
        for name, (_, values) in self.ragged.items():
            out[name] = values
        return {name: out[name] for name in self.reductions}

    def nbytes(self) -> int:
        """Bytes held by the arrays of the table."""
        arrays = [self.steps, *self.dense.values()]
        arrays += [a for entries in self.sparse.values() for a in entries]
        arrays += [a for entries in self.ragged.values() for a in entries]
        return sum(a.nbytes for a in arrays)


class _Layer(NamedTuple):
    """A finished layer of an accumulator's table (StepAccumulator._begin_layer): its parts, in step order, and what
    deciding when to fold weighs (the bytes its arrays hold, its first and last step)."""

    pieces: tuple[StateTable, ...]
    nbytes: int
    first: int
    last: int

    @classmethod
    def of(cls, pieces: Sequence[StateTable]) -> _Layer:
        spanned = [piece.steps for piece in pieces if piece.steps.shape[0]]
        return cls(tuple(pieces), sum(piece.nbytes() for piece in pieces), int(spanned[0][0]), int(spanned[-1][-1]))


def _depth(layers: Sequence[_Layer]) -> int:
    """The most layers whose spans (first to last step) hold one step: at most this many states of a step reduce one
    after another in a fold. The most spans hold some span's first step x: those that begin at or before x, less those
    that end before it."""
    first = np.sort(np.array([layer.first for layer in layers], dtype=np.int64))
    last = np.sort(np.array([layer.last for layer in layers], dtype=np.int64))
    return int((np.searchsorted(first, first, side="right") - np.searchsorted(last, first, side="left")).max())


class StepStates(MutableMapping):
    """``accumulator.steps``: step -> state, a view of the accumulator's table (each state built on access)."""

    def __init__(self, owner: StepAccumulator) -> None:
        self.owner = owner

    def __getitem__(self, step: int) -> State:
        return self.owner.store.state(step)

    def __contains__(self, step: object) -> bool:
        steps = self.owner.store.steps
        index = int(np.searchsorted(steps, step))  # type: ignore[arg-type]
        return index < steps.shape[0] and steps[index] == step

    def __iter__(self) -> Iterator[int]:
        return iter(self.owner.store.steps.tolist())

    def __len__(self) -> int:
        return int(self.owner.store.steps.shape[0])

    def items(self):  # in step order, without a lookup per step
        return list(self.owner.store.states())

    def __setitem__(self, step: int, state: State) -> None:
        """Replace one step's state."""
        if step in self:
            del self[step]
        partial = {name: np.asarray(state[name], dtype=np.float64)[None] for name in self.owner.REDUCTIONS}
        for name, reduction in self.owner.REDUCTIONS.items():
            if reduction == "concat":
                values = np.asarray(state[name], dtype=np.float64)
                partial[name] = Ragged(values, np.zeros(values.shape[0], np.int64))
        incoming = StateTable.from_groups(self.owner.REDUCTIONS, [step], partial)
        self.owner.store = self.owner.store.merged(incoming)

    def __delitem__(self, step: int) -> None:
        if step not in self:
            raise KeyError(step)
        self.owner.store = self.owner.store.subset(self.owner.store.steps != step)


def groups_of_dicts(rows: Sequence[Mapping[str, Any]]) -> list[KeyColumns]:
    """Per-step dicts as key groups: the steps that report the same keys in the same order share one group (values
    in a float64 column when all are floats, else as given)."""
    by_keys: dict[tuple[str, ...], list[int]] = {}
    for index, row in enumerate(rows):
        if row:
            by_keys.setdefault(tuple(row), []).append(index)
    groups: list[KeyColumns] = []
    for names, members in by_keys.items():
        present = np.zeros(len(rows), dtype=bool)
        present[members] = True
        values = {}
        for name in names:
            found = [rows[i][name] for i in members]
            floats = all(type(v) is float for v in found)
            column = np.zeros(len(rows)) if floats else np.empty(len(rows), dtype=object)
            column[members] = found
            values[_METRIC_NAMES.setdefault(name, name)] = column
        groups.append((present, values))
    return groups


def _joined(parts: Sequence[Sequence[KeyColumns]], sizes: Sequence[int], count: int) -> list[KeyColumns]:
    """Blocks of steps' key groups (block b: ``sizes[b]`` steps) as groups over all the steps. Blocks that give the
    same keys group for group (a family's ``_finalize_columns``) are concatenated; otherwise each block's groups
    stand alone, padded with steps that do not report them (a step belongs to one block: its keys and their order
    are unchanged)."""
    if not parts:
        return []
    shape = [tuple(values) for _, values in parts[0]]
    if all([tuple(values) for _, values in part] == shape for part in parts):
        return [
            (
                np.concatenate([part[g][0] for part in parts]),
                {name: np.concatenate([part[g][1][name] for part in parts]) for name in shape[g]},
            )
            for g in range(len(shape))
        ]
    out: list[KeyColumns] = []
    begin = 0
    for size, part in zip(sizes, parts, strict=True):
        for present, values in part:
            wide_present = np.zeros(count, dtype=bool)
            wide_present[begin : begin + size] = present
            wide = {}
            for name, column in values.items():
                padded = np.zeros(count, dtype=column.dtype)
                padded[begin : begin + size] = column
                wide[name] = padded
            out.append((wide_present, wide))
        begin += size
    return out


def _owned(column: np.ndarray) -> np.ndarray:
    """``column`` as an array of its own where it is a strided view (a column ``[:, k]`` of a block's dense [B, buckets]
    state): kept as a view it would hold the whole block alive until the blocks are joined (a round family's
    densified sparse fields, 65 buckets of 200 000 one-row steps: ~0.4 GB). A broadcast scalar or a contiguous view
    (a slice of the table's own dense column, alive anyway) is kept as it is."""
    if column.base is None or column.flags.c_contiguous or 0 in column.strides:
        return column
    return column.copy()


def _widened(groups: Sequence[KeyColumns], at: np.ndarray | None, count: int) -> list[KeyColumns]:
    """Groups over a table's own steps placed at positions ``at`` of ``count`` steps (None: as they are; a position
    of ``count``: a step left out)."""
    if at is None:
        return list(groups)
    out: list[KeyColumns] = []
    for present, values in groups:
        wide_present = np.zeros(count + 1, dtype=bool)
        wide_present[at] = present
        wide = {}
        for name, column in values.items():
            padded = np.zeros(count + 1, dtype=column.dtype)
            padded[at] = column
            wide[name] = padded[:count]
        out.append((wide_present[:count], wide))
    return out


_METRIC_NAMES: dict[str, str] = {}  # one string per metric name (see StepAccumulator.finalize_steps)
Columns = dict[str, Any]  # a block of steps: field -> [B, ...] (a list of B arrays for ``concat``)
# (steps that report the keys: bool [B], key -> value [B] or a scalar)
KeyGroup = tuple[np.ndarray, dict[str, Any]]


class StepAccumulator(ABC):
    """Base of every metric family. Subclasses declare ``REDUCTIONS`` and write ``_stats``/``_finalize``.

    The per-step states live in one :class:`StateTable` (``store``); ``steps`` is a step -> state view of it."""

    REDUCTIONS: ClassVar[dict[str, str]] = {}
    # True where a family's chunk state depends on the chunk alone (no option): every accumulator of that very class
    # fed the same chunk (analyze's §1 and §5, and verl's dialect reporting them again) shares one table of it
    CHUNK_ONLY: ClassVar[bool] = False

    def __init__(self) -> None:
        self.store = StateTable.empty(self.REDUCTIONS)

    # The table is kept as sealed parts (steps no later chunk can reach, in order) and an open one (the latest steps):
    # a chunk merges into the open part only, so a chunk costs what it holds, not what the table holds; the parts are
    # joined (concatenated: no arithmetic, so no digit changes) when the table is read.
    #
    # A chunk that goes back in steps (per-rank files each holding every step, the same file read twice) reaches steps
    # the parts have sealed. Merged into the whole table, it would cost what the table holds, chunk after chunk (the
    # ragged fields' rows concatenated and sorted each time): quadratic over such a run. Instead it starts a *layer*:
    # the parts so far become a finished layer, kept as they are, and the chunk starts the parts anew. The table is the
    # finished layers and the parts folded in order (StateTable.folded: one pass, each entry copied once), when it is
    # read or when the finished layers grow (_begin_layer).
    #
    # Digits: a chain of merges, chunk after chunk, reduces each step's (and bucket's) partial states left to right,
    # in the order the chunks came: reduce(reduce(c1, c2), c3)… The first layer merges as the chain does (a chunk going
    # on with the open step is reduced into it); a later layer never merges (a chunk that goes on with its open step
    # starts a layer too), so each of its steps holds one chunk's state, and the fold, left to right over the layers,
    # reduces exactly what the chain would, in its order: the same table, bit for bit, however the chunks come (but a
    # NaN's sign: which of two NaNs a merge keeps is numpy's choice by SIMD lane, so it follows the lengths of the
    # arrays merged; NaN reads and prints as NaN either way).
    # Layers that merged within themselves would be cheaper to hold, but would reduce a step split over two chunks as
    # reduce(earlier, reduce(c1, c2)) and change the last digits of a re-read input.
    @property
    def store(self) -> StateTable:
        layers = self.__dict__.get("_layers")
        if layers:
            self.__dict__["_store"] = StateTable.folded(self._pieces(rows=False))
            self.__dict__["_layers"], self.__dict__["_sealed"] = [], []
        sealed = self.__dict__.get("_sealed")
        if sealed:
            self.__dict__["_store"] = StateTable.joined([*sealed, self.__dict__["_store"]])
            self.__dict__["_sealed"] = []
        rows = self.__dict__.get("_rows")
        if rows:
            self.__dict__["_store"] = self.__dict__["_store"].with_rows(rows)
            self.__dict__["_rows"] = []
        return self.__dict__["_store"]

    @store.setter
    def store(self, table: StateTable) -> None:
        self.__dict__["_store"] = table
        # new lists, never cleared in place: a shallow copy (``restricted``) may share the old ones
        self.__dict__["_sealed"], self.__dict__["_layers"], self.__dict__["_rows"] = [], [], []

    def _pieces(self, rows: bool = True) -> list[StateTable]:
        """The tables the accumulator's table is kept in, in order (each finished layer's, then the sealed parts, then
        the open part): folded, they are the table; appended in turn (``_append``) to an empty accumulator, they
        give it the same table, digit for digit (a layer's parts follow each other; a layer's first part starts at or
        before the previous part's last step, so it starts a layer there too, or goes on with the open step of a first
        layer, which reduces it as the fold would). With per-row values held aside (``_hold_rows``) and ``rows``, the
        table itself, with them: they belong to no piece."""
        if rows and self.__dict__.get("_rows"):
            return [self.store]
        finished = [piece for layer in self.__dict__.get("_layers", ()) for piece in layer.pieces]
        return [*finished, *self.__dict__.get("_sealed", []), self.__dict__["_store"]]

    # Per-row values (``concat`` fields: the sweep's row statistics) are held aside, a chunk's block at a time, and
    # joined to the table when it is read. Merged with the table, a chunk going on with the open step copied every row
    # of that step so far: the run's sweep (RunSweepAccumulator: every chunk into one step) or a dump of one big step
    # copied all the rows read, chunk after chunk (quadratic: ~35 MiB a G tokens copied per chunk at 1G, and a block
    # of a new size each time for the heap to place). Joining is concatenation, a step's rows in the order they came:
    # the table is the same, byte for byte.
    def _hold_rows(self, incoming: StateTable) -> StateTable:
        """``incoming`` without its per-row values, which are held aside until the table is read."""
        self.__dict__["_rows"] = [*self.__dict__.get("_rows", []), incoming.ragged]  # a new list: copies may share
        empty = {name: (step[:0], values[:0]) for name, (step, values) in incoming.ragged.items()}
        return StateTable(incoming.reductions, incoming.shapes, incoming.steps, incoming.dense, incoming.sparse, empty)

    def _append(self, incoming: StateTable) -> None:
        """Merge a chunk's table: into the open part when its steps start at or after the open part's last step
        (the same merge, on fewer steps), else (it goes back in steps) as a new layer; in a later layer, one that goes
        on with the open part's last step starts a layer too (see ``store``). Its per-row values are held aside."""
        if incoming.ragged and self.__dict__["_store"].shapes:
            incoming = self._hold_rows(incoming)
        open_part: StateTable = self.__dict__["_store"]
        layers = self.__dict__.get("_layers")
        if layers and not incoming.steps.shape[0]:
            return  # no steps, no state: merged, it would copy the table to the same entries
        last = open_part.steps[-1] if open_part.steps.shape[0] else None
        if last is None or not incoming.steps.shape[0]:  # an empty table (a later layer never is: it starts a chunk)
            self.store = self.store.merged(incoming)
            return
        if incoming.steps[0] < last or (layers and incoming.steps[0] == last):
            self._begin_layer(incoming)
            return
        if incoming.steps[0] > last:
            sealed, self.__dict__["_store"] = open_part, incoming
        else:  # the chunk goes on with the open part's last step: only that step merges
            count = open_part.steps.shape[0]
            if count <= OPEN_STEPS:  # a few steps: merged as they are (copying them costs less than cutting them off)
                self.__dict__["_store"] = open_part.merged(incoming)
                return
            sealed = open_part.sliced(0, count - 1)
            self.__dict__["_store"] = open_part.sliced(count - 1, count).merged(incoming)
        self.__dict__["_sealed"] = [*self.__dict__.get("_sealed", []), sealed]  # a new list: copies may share the old

    def _begin_layer(self, incoming: StateTable) -> None:
        """Finish the current layer (its sealed parts and open part, kept as they are) and start one with ``incoming``.

        The finished layers are folded into one when those after the first hold as many bytes as the first: each fold
        then copies at most about twice what the layers after the first bring in, so over a run each entry is copied
        a few times (the first layer at least doubles from fold to fold), and the layers held stay within about the
        table's size. They are folded too when more than ``LAYERS`` of them span one step (many small layers, each
        going back over the others: a fold reduces that many states in turn) or when there are more than
        ``HELD_LAYERS``, so such an input folds the whole table once per ``LAYERS`` chunks at most, where it merged
        each chunk into the whole table. Folding the layers so far, whenever, reduces each step's states in the same
        order: when it happens changes no digit."""
        layers = [
            *self.__dict__.get("_layers", []),
            _Layer.of([*self.__dict__.get("_sealed", []), self.__dict__["_store"]]),
        ]
        if len(layers) > 1 and (
            sum(layer.nbytes for layer in layers[1:]) >= layers[0].nbytes
            or len(layers) > HELD_LAYERS
            or (len(layers) > LAYERS and _depth(layers) > LAYERS)
        ):
            layers = [_Layer.of([StateTable.folded([piece for layer in layers for piece in layer.pieces])])]
        self.__dict__["_layers"] = layers  # a new list: copies may share the old
        self.__dict__["_sealed"], self.__dict__["_store"] = [], incoming

    @property
    def steps(self) -> StepStates:
        return StepStates(self)

    # -- to write in a family --------------------------------------------------------------------
    @abstractmethod
    def _stats(self, chunk: Chunk) -> dict[str, Array | Ragged]:
        """Partial state of each step group of ``chunk``: name -> array or tensor [G, ...] (a Ragged for
        ``concat``)."""

    @abstractmethod
    def _finalize(self, state: State) -> dict[str, float]:
        """Metric values from one merged state (a step's, or the run's)."""

    # -- shared machinery ------------------------------------------------------------------------
    def update(self, chunk: Chunk) -> None:
        family = type(self)
        key = ("chunk table", family) if family.__dict__.get("CHUNK_ONLY", False) else None
        incoming = None if key is None else chunk.cache.get(key)
        if incoming is None:
            partial = {
                name: arrays.host(value) if arrays.is_tensor(value) else value
                for name, value in self._stats(chunk).items()
            }
            incoming = StateTable.from_groups(self.REDUCTIONS, chunk.groups.steps, partial)
            if key is not None:  # tables are never changed in place: merges build new arrays
                chunk.cache[key] = incoming
        self._append(incoming)

    def merge(self, other: StepAccumulator) -> None:
        self.store = self.store.merged(other.store)

    def run_state(self) -> State | None:
        return self.store.total()

    def _finalize_columns(self, columns: Columns) -> list[KeyGroup] | None:
        """``_finalize`` of a block of steps at once, where a family writes it (None: ``_finalize`` step by step).
        ``columns``: each field as [B, ...]; returns key groups in ``_finalize``'s key order, each (steps that
        report these keys: bool [B], key -> value [B]). Same float64 operations, so the same digits."""
        return None

    def finalize_steps(self) -> dict[int, dict[str, float]]:
        # every step's metric names built once: a family builds its keys per call, and 200 000 steps would
        # hold 200 000 copies of each name
        keys = _METRIC_NAMES
        out: dict[int, dict[str, float]] = {}
        for steps, columns in self.store.blocks():
            groups = self._finalize_columns(columns)
            if groups is None:
                names = list(columns)
                for step, values in zip(steps, zip(*(list(columns[n]) for n in names), strict=True), strict=True):
                    finalized = self._finalize(dict(zip(names, values, strict=True)))
                    out[step] = {keys.setdefault(name, name): value for name, value in finalized.items()}
                continue
            rows: list[dict[str, float]] = [{} for _ in steps]
            for reports, values in groups:
                index = np.flatnonzero(reports)
                if not index.size or not values:
                    continue
                names = [keys.setdefault(name, name) for name in values]
                count = len(steps)
                matrix = np.column_stack(
                    [np.broadcast_to(np.asarray(v, np.float64), (count,))[index] for v in values.values()]
                )
                for position, row in zip(index.tolist(), matrix.tolist(), strict=True):
                    rows[position].update(zip(names, row, strict=True))
            out.update(zip(steps, rows, strict=True))
        return out

    def finalize_columns(self, steps: np.ndarray | None = None) -> MetricColumns:
        """``finalize_steps`` as columns over ``steps`` (sorted, holding every step of the table; the table's steps
        when None): the same values, the same keys in the same order per step, no dict per step."""
        own = self.store.steps
        count = own.shape[0] if steps is None else steps.shape[0]
        same = steps is None or (steps.shape == own.shape and bool(np.array_equal(steps, own)))
        at = None if same else np.searchsorted(steps, own)  # type: ignore[arg-type]
        if at is not None:  # a step ``steps`` lacks (a restricted analysis beside an unrestricted dialect) is left out
            inside = at < count
            inside[inside] = steps[at[inside]] == own[inside]
            at = np.where(inside, at, count)
        parts: list[list[KeyColumns]] = []
        sizes: list[int] = []
        for block_steps, columns in self.store.blocks():
            groups = self._finalize_columns(columns)
            size = len(block_steps)
            sizes.append(size)
            if groups is None:  # step by step, grouped by the keys each step reports
                names = list(columns)
                finalized = [
                    self._finalize(dict(zip(names, values, strict=True)))
                    for values in zip(*(list(columns[n]) for n in names), strict=True)
                ]
                parts.append(groups_of_dicts(finalized))
                continue
            parts.append(
                [
                    (
                        _owned(np.asarray(reports, dtype=bool)),
                        {
                            _METRIC_NAMES.setdefault(name, name): _owned(
                                np.broadcast_to(np.asarray(value, np.float64), (size,))
                            )
                            for name, value in values.items()
                        },
                    )
                    for reports, values in groups
                ]
            )
            del groups, columns  # the block's dense state goes before the next block is made
        return MetricColumns(_widened(_joined(parts, sizes, own.shape[0]), at, count), count)

    def finalize_run(self) -> dict[str, float]:
        state = self.run_state()
        return {} if state is None else self._finalize(state)

    def restricted(self, keep: np.ndarray) -> StepAccumulator:
        """A shallow copy holding only the steps where ``keep`` (bool, one per step in order) holds."""
        subset = copy.copy(self)
        subset.store = self.store.subset(keep)
        return subset


def row_mean(row_sum: Array, row_count: Array) -> Array:
    """R_i[x] = Σ_t m·x / (n_i + 1e-8): verl's masked mean (empty rows give 0)."""
    return row_sum / (arrays.float64(row_count) + EPS)


def sequence_share(rows_dropped: float, valid_rows: float) -> float:
    """The one definition of "share of sequences" a rule drops (preset table, sweep): over rows with at least one
    model token, since an empty row has nothing to keep or drop; 0.0 when no row has one."""
    return rows_dropped / valid_rows if valid_rows > 0 else 0.0


def _numpy_has_svml() -> bool:
    """Whether numpy runs its SVML float64 loops (exp, expm1) on this CPU: they need AVX-512 (Skylake-X class).

    Measured (docs/benchmarks.md): with AVX-512, numpy's float64 exp and expm1 are 2.4× torch's; on an AVX2-only
    CPU numpy falls back to libm, its exp is 2.7× slower than torch's (Sleef) and its expm1 about equal."""
    for module in ("numpy._core._multiarray_umath", "numpy.core._multiarray_umath"):  # numpy 2.x, 1.x
        try:
            features = importlib.import_module(module).__cpu_features__
        except (ImportError, AttributeError):
            continue
        return bool(features.get("AVX512_SKX", False))
    return False


def _host_or_torch(numpy_function, torch_name: str, numpy_on_cpu: bool = True) -> Callable[[Array], Array]:
    """An elementwise function: numpy's loop on numpy arrays (the numba engine), and on CPU tensors when
    ``numpy_on_cpu``; torch's kernel ``torch_name`` on other tensors. The two agree within 1 ulp
    (tests/test_metrics.py); which one runs depends only on the CPU and the engine, never on timing, so a machine
    gives the same digits run after run."""

    def apply(values: Array) -> Array:
        if not arrays.is_tensor(values):
            with np.errstate(over="ignore", invalid="ignore"):  # inf / NaN as torch gives them, without a warning
                return numpy_function(values)
        if numpy_on_cpu and values.device.type == "cpu":
            import torch

            with np.errstate(over="ignore", invalid="ignore"):
                return torch.from_numpy(numpy_function(values.contiguous().numpy()))
        return getattr(values, torch_name)()

    return apply


NUMPY_SVML = _numpy_has_svml()
token_exp = _host_or_torch(np.exp, "exp", numpy_on_cpu=NUMPY_SVML)  # per-token exp of a whole chunk
token_expm1 = _host_or_torch(np.expm1, "expm1")  # numpy's: faster with SVML, about equal without


def clamp20(values: Array) -> Array:
    return arrays.clamp(values, -CLAMP, CLAMP)


def as_float(value: np.ndarray | float) -> float:
    if isinstance(value, float):  # a step's scalar field is a numpy float64 (a float): no array round trip
        return float(value)
    return float(np.asarray(value).reshape(()))


# ----------------------------------------------------------------------- finalize helpers (every family)
def population_std(moments: np.ndarray) -> float:
    """§2/§3 ``_std``: the population std of c over model tokens when N > 1, else 0, from [N, mean, ·, M2, ·, ·].

    sqrt(M2 / N) from centred moments, so constant c gives exactly 0. verl writes T[c²] − T[c]², whose 1e-8
    guards add N·mean²·ε / (N+ε)² to the variance: sqrt(ε/N)·|mean| (5.5e-6 for 330 tokens of weight 1) where
    the spread is 0. We leave that artefact out: the variances differ by exactly that term, never more.
    """
    count, m2 = float(moments[0]), float(moments[3])
    if count <= 1:
        return 0.0
    return math.sqrt(max(m2, 0.0) / count)


def effective_sample_size(moments: np.ndarray) -> float:
    """§2 ESS = 1 / T[(c / (T[c] + ε))²] = (T[c] + ε)² · (N + ε) / Σc², from [N, mean, ·, M2, ·, ·].

    All-zero weights (IcePop rejecting every token) give 1/0: inf (verl raises there).
    """
    count, mean, m2 = float(moments[0]), float(moments[1]), float(moments[3])
    sum_squares = m2 + count * mean * mean
    if sum_squares <= 0:
        return math.inf
    token_mean = count * mean / (count + EPS)
    return (token_mean + EPS) ** 2 * (count + EPS) / sum_squares


def sample_std(moments: np.ndarray) -> float:
    """Notation: unbiased (n−1) std over rows; 0 with fewer than 2 values."""
    count, m2 = float(moments[0]), float(moments[3])
    return math.sqrt(max(m2, 0.0) / (count - 1)) if count >= 2 else 0.0
