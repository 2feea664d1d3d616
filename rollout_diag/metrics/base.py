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
import math
from abc import ABC, abstractmethod
from collections.abc import ItemsView, Iterator, Mapping, MutableMapping, Sequence
from typing import Any, ClassVar

import numpy as np

from rollout_diag.engine import arrays
from rollout_diag.engine.arrays import Array
from rollout_diag.engine.state import Ragged, State, StateTable
from rollout_diag.engine.store import StepStore
from rollout_diag.io.chunk import Chunk
from rollout_diag.results import KeyColumns, MetricColumns


class StepStates(MutableMapping[int, State]):
    """``accumulator.steps``: step -> state, a view of the accumulator's table (each state built on access)."""

    def __init__(self, owner: StepAccumulator) -> None:
        self.owner = owner

    def __getitem__(self, step: int) -> State:
        return self.owner.store.state(step)

    def __contains__(self, step: object) -> bool:
        if not isinstance(step, (int, np.integer)):  # steps are whole numbers
            return False
        steps = self.owner.store.steps
        index = int(np.searchsorted(steps, step))
        return index < steps.shape[0] and steps[index] == step

    def __iter__(self) -> Iterator[int]:
        return iter(self.owner.store.steps.tolist())

    def __len__(self) -> int:
        return int(self.owner.store.steps.shape[0])

    def items(self) -> ItemsView[int, State]:
        return _StepItems(self)

    def __setitem__(self, step: int, state: State) -> None:
        """Replace one step's state."""
        if step in self:
            del self[step]
        partial: dict[str, np.ndarray | Ragged] = {
            name: np.asarray(state[name], dtype=np.float64)[None] for name in self.owner.REDUCTIONS
        }
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


class _StepItems(ItemsView[int, State]):
    """``StepStates.items()``: (step, state) in step order, read from the table block by block (no lookup per step)."""

    _mapping: StepStates

    def __iter__(self) -> Iterator[tuple[int, State]]:
        return self._mapping.owner.store.states()


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
    same keys group for group (a family's ``finalize_block``) are concatenated; otherwise each block's groups
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

    The per-step states live in one :class:`StepStore` (``step_store``), read whole as a :class:`StateTable`
    (``store``); ``steps`` is a step -> state view of it."""

    REDUCTIONS: ClassVar[dict[str, str]] = {}
    # True where a family's chunk state depends on the chunk alone (no option): every accumulator of that very class
    # fed the same chunk (analyze's §1 and §5, and verl's dialect reporting them again) shares one table of it (a
    # subclass with options of its own sets it back to False)
    CHUNK_ONLY: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A family (a class with its ``_stats``) must write its formula: ``finalize_block`` or ``_finalize``; one
        that writes neither is refused where it is defined, not at its first finalize."""
        super().__init_subclass__(**kwargs)
        family = not getattr(cls._stats, "__isabstractmethod__", False)
        block_written = cls.finalize_block is not StepAccumulator.finalize_block
        if family and not block_written and cls._finalize is StepAccumulator._finalize:
            raise TypeError(f"{cls.__name__} writes neither finalize_block nor _finalize: a family needs one")

    def __init__(self) -> None:
        self.step_store = StepStore(StateTable.empty(self.REDUCTIONS))

    @property
    def store(self) -> StateTable:
        """The per-step table, whole (``StepStore.table``)."""
        return self.step_store.table

    @store.setter
    def store(self, table: StateTable) -> None:
        self.step_store = StepStore(table)  # a store of its own: a shallow copy (``restricted``) keeps the old one

    def append_table(self, incoming: StateTable) -> None:
        """Merge a chunk's table (``StepStore.append``: the open part, or a new layer for a chunk that goes back)."""
        store = copy.copy(self.step_store)  # a shallow copy of this accumulator keeps the table it had
        store.append(incoming)
        self.step_store = store

    @property
    def steps(self) -> StepStates:
        return StepStates(self)

    # -- to write in a family --------------------------------------------------------------------
    @abstractmethod
    def _stats(self, chunk: Chunk) -> dict[str, Array | Ragged]:
        """Partial state of each step group of ``chunk``: name -> array or tensor [G, ...] (a Ragged for
        ``concat``)."""

    def _finalize(self, state: State) -> dict[str, float]:
        """Metric values from one merged state (a step's, or the run's): ``finalize_block`` over a block of one step,
        so the steps and the run share one formula (a family without ``finalize_block`` writes this instead)."""
        groups = self.finalize_block({name: np.asarray(value)[None] for name, value in state.items()})
        if groups is None:
            raise TypeError(f"{type(self).__name__}.finalize_block gave None: it writes no _finalize to fall back on")
        out: dict[str, float] = {}
        for reports, values in groups:
            if np.asarray(reports).reshape(-1)[0]:
                out.update({name: float(np.asarray(value).reshape(-1)[0]) for name, value in values.items()})
        return out

    # -- shared machinery ------------------------------------------------------------------------
    def update(self, chunk: Chunk) -> None:
        family = type(self)
        key = ("chunk table", family) if family.CHUNK_ONLY else None
        incoming = None if key is None else chunk.cache.get(key)
        if incoming is None:
            partial = {
                name: arrays.host(value) if arrays.is_tensor(value) else value
                for name, value in self._stats(chunk).items()
            }
            incoming = StateTable.from_groups(self.REDUCTIONS, chunk.groups.steps, partial)
            if key is not None:  # tables are never changed in place: merges build new arrays
                chunk.cache[key] = incoming
        self.append_table(incoming)

    def merge(self, other: StepAccumulator) -> None:
        self.store = self.store.merged(other.store)

    def step_accumulators(self) -> tuple[StepAccumulator, ...]:
        """The per-step accumulators this one is (a composite family lists its parts)."""
        return (self,)

    def run_state(self) -> State | None:
        return self.store.total()

    def finalize_block(self, columns: Columns) -> list[KeyGroup] | None:
        """A family's one formula: metric values of a block of steps at once (one step, or the run's state, is a block
        of one: ``_finalize``); None where a family writes ``_finalize`` instead, step by step. ``columns``: each field
        as [B, ...]; returns key groups in key order, each (steps that report these keys: bool [B], key -> value [B] or
        a scalar)."""
        return None

    def finalize_steps(self) -> dict[int, dict[str, float]]:
        # every step's metric names built once: a family builds its keys per call, and 200 000 steps would
        # hold 200 000 copies of each name
        keys = _METRIC_NAMES
        out: dict[int, dict[str, float]] = {}
        for steps, columns in self.store.blocks():
            groups = self.finalize_block(columns)
            if groups is None:
                names = list(columns)
                for step, state in zip(steps, zip(*(list(columns[n]) for n in names), strict=True), strict=True):
                    finalized = self._finalize(dict(zip(names, state, strict=True)))
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
        at = None
        if steps is not None and not (steps.shape == own.shape and bool(np.array_equal(steps, own))):
            # a step ``steps`` lacks (a restricted analysis beside an unrestricted dialect) is left out
            at = np.searchsorted(steps, own)
            inside = at < count
            inside[inside] = steps[at[inside]] == own[inside]
            at = np.where(inside, at, count)
        parts: list[list[KeyColumns]] = []
        sizes: list[int] = []
        for block_steps, columns in self.store.blocks():
            groups = self.finalize_block(columns)
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


def sequence_share(rows_dropped: float, valid_rows: float) -> float:
    """The one definition of "share of sequences" a rule drops (preset table, sweep): over rows with at least one
    model token, since an empty row has nothing to keep or drop; 0.0 when no row has one."""
    return rows_dropped / valid_rows if valid_rows > 0 else 0.0


def as_float(value: np.ndarray | float) -> float:
    if isinstance(value, float):  # a step's scalar field is a numpy float64 (a float): no array round trip
        return float(value)
    return float(np.asarray(value).reshape(()))


# ----------------------------------------------------------------------- finalize helpers (every family)
def sample_std(moments: np.ndarray) -> float:
    """Notation: unbiased (n−1) std over rows; 0 with fewer than 2 values."""
    count, m2 = float(moments[0]), float(moments[3])
    return math.sqrt(max(m2, 0.0) / (count - 1)) if count >= 2 else 0.0
