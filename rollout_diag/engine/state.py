"""Per-step state storage and its merge rules: a family's state per training step is a dict of float64 arrays, each
merged by the reduction the family declares (``sum``, ``max``, ``min``, ``moments``: Chan's pairwise update of count /
means / centred second moments, ``concat``: per-row values). ``StateTable`` keeps every step's state as columns keyed
by step (dense small fields, sparse wide ones, per-row values), merged, folded, sliced and read in blocks, vectorised
across steps. No metric is stated here."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

State = dict[str, np.ndarray]


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


# the elementwise reductions as ufuncs (their ``reduceat`` reduces runs in one call)
_UFUNCS: dict[str, np.ufunc] = {"sum": np.add, "max": np.maximum, "min": np.minimum}
_MERGE: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    **_UFUNCS,
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
    if reduction in _UFUNCS and values.ndim == 1:
        return _UFUNCS[reduction].reduceat(values, start) if values.shape[0] else values[:0]
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
        # theirs (held aside, StepStore.append in engine/store.py): mine as they are (arrays are never written in place)
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
