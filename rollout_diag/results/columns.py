"""The column store: per-step values held as float64 columns (or object columns where a family's values are not
floats) and read back as the lists and dicts they stand for (``StepTable``, ``Rows``, ``RowMetrics``), and the
document's columns (``Column``) that the JSON writer formats a column at a time."""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Callable, Hashable, ItemsView, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar, overload

import numpy as np

from rollout_diag.catalogue import K3_KL
from rollout_diag.results.rows import StepResult, json_number

# ----------------------------------------------------------------------- per-step values as columns
# One group of keys a set of steps reports together: (steps that report them: bool [S], key -> values [S]); the values
# are a float64 array (each read back as a Python float) or an object array (values kept as the family gave them).
KeyColumns = tuple[np.ndarray, dict[str, np.ndarray]]


class MetricColumns:
    """Per-step ``name -> value`` dicts held as columns: key groups in order. Step ``i``'s dict is the groups that
    report at ``i``, folded in order as ``dict.update`` would (a key keeps its first place and takes its last
    value); ``order`` (name -> rank) then moves the ranked names first, by rank (a framework's declared order)."""

    __slots__ = ("_rows", "_sorted", "groups", "order", "reports", "where")

    def __init__(self, groups: Iterable[KeyColumns], count: int, order: Mapping[str, int] | None = None) -> None:
        kept = []
        self._rows: list[tuple[np.ndarray, tuple[str, ...], np.ndarray | None]] = []
        for present, values in groups:
            if not values:
                continue
            present = np.asarray(present, dtype=bool)
            names = tuple(values)
            matrix = None
            if all(np.asarray(column).dtype == np.float64 for column in values.values()):
                # a float group as one [S, keys] matrix: a step's row is one read (tolist), its columns are views
                matrix = np.empty((present.shape[0], len(names)))
                for index, column in enumerate(values.values()):
                    matrix[:, index] = column
                values = {name: matrix[:, index] for index, name in enumerate(names)}
            kept.append((present, dict(values)))
            self._rows.append((present, names, matrix))
        self.groups: tuple[KeyColumns, ...] = tuple(kept)
        self.order = dict(order) if order else None
        self._sorted: dict[tuple[str, ...], list[str]] = {}
        self.where: dict[str, tuple[int, ...]] = {}  # name -> the groups holding it, in order
        for index, (_, values) in enumerate(self.groups):
            for name in values:
                self.where[name] = (*self.where.get(name, ()), index)
        reports = np.zeros(count, dtype=bool)
        for present, _ in self.groups:
            reports |= present
        self.reports = reports  # steps with at least one value

    def __reduce__(self):
        return (MetricColumns, (self.groups, self.reports.shape[0], self.order))

    def row(self, index: int) -> dict[str, Any]:
        """Step ``index``'s values as a plain dict."""
        out: dict[str, Any] = {}
        for (present, names, matrix), (_, values) in zip(self._rows, self.groups, strict=True):
            if not present[index]:
                continue
            if matrix is not None:
                out.update(zip(names, matrix[index].tolist(), strict=True))
            else:
                out.update((name, _scalar(column, index)) for name, column in values.items())
        if self.order is not None and out:
            keys = tuple(out)  # the order depends only on the keys: sorted once per set of keys
            if (ordered := self._sorted.get(keys)) is None:
                rank, last = self.order, len(self.order)
                ordered = self._sorted[keys] = sorted(keys, key=lambda name: rank.get(name, last))
            out = {name: out[name] for name in ordered}
        return out

    def value(self, name: str, index: int) -> Any:
        """Step ``index``'s value of ``name``; KeyError when it has none."""
        for group in reversed(self.where.get(name, ())):
            present, values = self.groups[group]
            if present[index]:
                return _scalar(values[name], index)
        raise KeyError(name)

    def column(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps that report ``name``: bool [S], its values [S] as float64, NaN where absent)."""
        present = np.zeros(self.reports.shape[0], dtype=bool)
        values = np.full(self.reports.shape[0], math.nan)
        for group in self.where.get(name, ()):
            reports, columns = self.groups[group]
            values[reports] = np.asarray(columns[name][reports], dtype=np.float64)
            present |= reports
        return present, values


def _scalar(column: np.ndarray, index: int) -> Any:
    return float(column[index]) if column.dtype == np.float64 else column[index]


class RowMetrics(Mapping[str, Any]):
    """One step's values, read from its MetricColumns on access (no dict per step is kept). Equal to the dict it
    stands for (NaN to NaN too); pickles and copies as that dict."""

    __slots__ = ("columns", "index")

    def __init__(self, columns: MetricColumns, index: int) -> None:
        self.columns, self.index = columns, index

    def __getitem__(self, name: str) -> Any:
        return self.columns.value(name, self.index)

    def __contains__(self, name: object) -> bool:
        groups = self.columns.where.get(name, ()) if isinstance(name, str) else ()
        return any(self.columns.groups[g][0][self.index] for g in groups)

    def __iter__(self) -> Iterator[str]:
        return iter(self.columns.row(self.index))

    def __len__(self) -> int:
        return len(self.columns.row(self.index))

    def items(self) -> ItemsView[str, Any]:  # one fold, not a lookup per key
        return self.columns.row(self.index).items()

    def values(self):
        return self.columns.row(self.index).values()

    def __eq__(self, other: object) -> bool:
        # as dict equality, but a NaN equals a NaN (a dict only compares its own NaN objects equal, and each read
        # of a column makes a new one)
        if not isinstance(other, Mapping):
            return NotImplemented
        mine, theirs = self.columns.row(self.index), dict(other.items())
        return mine.keys() == theirs.keys() and all(
            value == theirs[name] or (value != value and theirs[name] != theirs[name]) for name, value in mine.items()
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self.columns.row(self.index))

    def __reduce__(self):
        return (dict, (self.columns.row(self.index),))


Item = TypeVar("Item")


class ReadSequence(Sequence[Item]):
    """A sequence whose items are made when read (none kept): equal to the list it stands for (item by item, so a
    list of the same items compares equal either way round), unhashable as a list, pickled as that list."""

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self):
        return (list, (list(self),))


class ItemSequence(ReadSequence[Item]):
    """A ReadSequence whose item ``i`` is made by ``item(i)`` (0 ≤ i < len, negative indices counted from the end
    first); a slice is the list of its items."""

    @abstractmethod
    def item(self, index: int) -> Item:
        """The item at ``index`` (0 ≤ index < len(self))."""

    @overload
    def __getitem__(self, index: int) -> Item: ...
    @overload
    def __getitem__(self, index: slice) -> list[Item]: ...
    def __getitem__(self, index: int | slice) -> Item | list[Item]:
        if isinstance(index, slice):
            return [self.item(i) for i in range(len(self))[index]]
        return self.item(range(len(self))[index])


class StepTable(ReadSequence[StepResult]):
    """``AnalysisResult.steps`` as columns: the step ids, their rows, tokens and empty rows, the metric values and each
    framework's dialect values; ``table[i]`` is a StepResult read from the columns (nothing per step is kept, so
    200 000 steps cost their numbers, not 200 000 dicts). Equal to the list of StepResults it stands for."""

    def __init__(
        self,
        steps: np.ndarray,
        rows: np.ndarray,
        tokens: np.ndarray,
        empty_rows: np.ndarray,
        metrics: MetricColumns,
        dialects: Mapping[str, MetricColumns] | None = None,
    ) -> None:
        self.step_ids = np.asarray(steps, dtype=np.int64)
        self.rows, self.tokens, self.empty_rows = (
            np.asarray(column, dtype=np.int64) for column in (rows, tokens, empty_rows)
        )
        self.metrics = metrics
        self.dialects = dict(dialects or {})
        self._built: list[StepResult] | None = None

    def __len__(self) -> int:
        return int(self.step_ids.shape[0])

    @overload
    def __getitem__(self, index: int) -> StepResult: ...
    @overload
    def __getitem__(self, index: slice) -> list[StepResult]: ...
    def __getitem__(self, index: int | slice) -> StepResult | list[StepResult]:
        return self._steps()[index]

    def __iter__(self) -> Iterator[StepResult]:
        return iter(self._steps())

    def _steps(self) -> list[StepResult]:
        # built once, so that a step is the same object each time it is read (renderers key steps by identity);
        # each holds views into the columns, not dicts
        if self._built is None:
            reports = [(name, columns, columns.reports.tolist()) for name, columns in self.dialects.items()]
            counts = (self.step_ids.tolist(), self.rows.tolist(), self.tokens.tolist(), self.empty_rows.tolist())
            self._built = [
                StepResult(
                    step,
                    rows,
                    tokens,
                    RowMetrics(self.metrics, index),  # type: ignore[arg-type]
                    empty,
                    {name: RowMetrics(columns, index) for name, columns, at in reports if at[index]},  # type: ignore[misc]
                )
                for index, (step, rows, tokens, empty) in enumerate(zip(*counts, strict=True))
            ]
        return self._built

    def column(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps that report metric ``name``: bool [S], its values [S] as float64, NaN where absent)."""
        return self.metrics.column(name)

    def float_column(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        """``column(name)`` where every group holding ``name`` is float64 (each value is then exactly the float a step
        reads); None where one is not (read those steps' values one by one)."""
        holders = self.metrics.where.get(name, ())
        if any(np.asarray(self.metrics.groups[group][1][name]).dtype != np.float64 for group in holders):
            return None
        return self.metrics.column(name)

    def step(self, index: int) -> StepResult:
        """``table[index]`` without building every step: the built step once the table has been read whole, else
        one made alone (equal to it, not the same object)."""
        if self._built is not None:
            return self._built[index]
        return self.step_alone(range(len(self))[index])

    def step_alone(self, index: int) -> StepResult:
        """Step ``index`` (0 to ``len - 1``) made alone from the columns, equal to ``table[index]``."""
        return StepResult(
            int(self.step_ids[index]),
            int(self.rows[index]),
            int(self.tokens[index]),
            RowMetrics(self.metrics, index),  # type: ignore[arg-type]
            int(self.empty_rows[index]),
            {name: RowMetrics(columns, index) for name, columns in self.dialects.items() if columns.reports[index]},  # type: ignore[misc]
        )

    def __repr__(self) -> str:
        return f"StepTable({len(self)} steps)"

    def __reduce__(self):
        return (StepTable, (self.step_ids, self.rows, self.tokens, self.empty_rows, self.metrics, self.dialects))


class Rows(ItemSequence[dict[str, Any]]):
    """A list of table rows (dicts with the same keys) held as columns: ``head`` (plain dicts) first, then one row per
    entry of the columns, each value a Python int, float, str or None as the dict it stands for would hold. Rows are
    built when read, none is kept (a 200 000-step run has 600 000 position rows). Equal to that list of dicts."""

    def __init__(self, head: Sequence[dict[str, Any]], columns: Mapping[str, np.ndarray]) -> None:
        self.head = list(head)
        self.names = tuple(columns)
        self.columns = tuple(np.asarray(column) for column in columns.values())
        self.held = int(self.columns[0].shape[0]) if self.columns else 0  # the rows held as columns, after the head

    def __len__(self) -> int:
        return len(self.head) + self.held

    def item(self, index: int) -> dict[str, Any]:
        if index < len(self.head):
            return dict(self.head[index])
        at = index - len(self.head)
        return dict(zip(self.names, (column[at : at + 1].tolist()[0] for column in self.columns), strict=True))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for row in self.head:
            yield dict(row)
        for begin in range(0, self.held, 65_536):  # a block of rows at a time: Python values made in bulk
            values = [column[begin : begin + 65_536].tolist() for column in self.columns]
            for held_row in zip(*values, strict=True):
                yield dict(zip(self.names, held_row, strict=True))

    def __repr__(self) -> str:
        return f"Rows({len(self)} rows)"


def run_rows(positions: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of the whole run (``step`` None) of a positions or rounds table, in order. Rows held as columns:
    their run rows are the head's (a per-step row's step, an integer column, is never None), so no per-step row is
    made."""
    if isinstance(positions, Rows) and "step" in positions.names:
        step = positions.columns[positions.names.index("step")]
        if step.dtype.kind in "iu":
            return [row for row in positions.head if row.get("step") is None]
    return [row for row in positions if row.get("step") is None]


class Converted(ItemSequence[Item]):
    """``[convert(item) for item in items]``, each made when read and none kept: per-step results of a 200 000-step
    run (the sweep's 13 options × targets a step) as objects only while a renderer reads them. Equal to that list."""

    def __init__(self, items: Sequence[Any], convert: Callable[[Any], Item]) -> None:
        self.items, self.convert = items, convert

    def __len__(self) -> int:
        return len(self.items)

    def item(self, index: int) -> Item:
        return self.convert(self.items[index])

    def __iter__(self) -> Iterator[Item]:
        return (self.convert(item) for item in self.items)

    def __repr__(self) -> str:
        return f"Converted({len(self)} items)"


def metric_column(steps: Sequence[StepResult], name: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps that report metric ``name``: bool [S], its values as float64, NaN where absent), from a StepTable's
    columns or step by step from a list."""
    if isinstance(steps, StepTable):
        return steps.column(name)
    present = np.array([name in step.metrics for step in steps], dtype=bool)
    values = np.array([step.metrics.get(name, math.nan) for step in steps], dtype=np.float64)
    return present, values


def step_ids(steps: Sequence[StepResult]) -> np.ndarray:
    """The step of each entry of ``steps`` (0 for the run's None), as int64."""
    if isinstance(steps, StepTable):
        return steps.step_ids
    return np.array([step.step or 0 for step in steps], dtype=np.int64)


def repr_worst_step(steps: Sequence[StepResult]) -> str:
    """The step with the largest k3_kl (the one a user looks at first), or "" with fewer than two scored steps."""
    key = K3_KL.key
    present, values = metric_column(steps, key)
    scored = present & ~np.isnan(values)
    if int(scored.sum()) < 2:
        return ""
    index = int(np.flatnonzero(scored)[np.argmax(values[scored])])
    return f"worst step {int(step_ids(steps)[index])} (k3_kl {values[index]:.4g})"


# ------------------------------------------------------------- compare-presets' per-step columns (schema version 2)
# A column's source: (each step's position in ``values``, None where it is the step's own index, -1 where the source
# has no entry for the step; the entries that hold a value, None: all; the values).
ColumnSource = tuple["np.ndarray | None", "np.ndarray | None", np.ndarray]


class Column:
    """One column of a per-step block of the ``compare-presets`` document: a value per step, assembled when read from
    ``sources`` in order (a later source's value wins, as a step's key groups fold). ``identity`` names what the
    column is read from (equal identities, equal columns; None: not named), so that a writer formats once a column
    that several presets share."""

    __slots__ = ("count", "identity", "sources")

    def __init__(self, count: int, sources: Sequence[ColumnSource], identity: Hashable | None = None) -> None:
        self.count, self.sources, self.identity = count, tuple(sources), identity

    def read(self) -> tuple[np.ndarray, np.ndarray]:
        """(steps with a value: bool [S], the values [S]): float64 (NaN where absent) where every source is float64,
        a source's own dtype where it is the only one and covers every step (the int64 step counts), else object
        (each value as the source holds it, None where absent)."""
        if len(self.sources) == 1 and self.sources[0][0] is None and self.sources[0][1] is None:
            return np.ones(self.count, dtype=bool), np.asarray(self.sources[0][2])
        floats = all(np.asarray(values).dtype == np.float64 for _, _, values in self.sources)
        out = np.full(self.count, math.nan) if floats else np.full(self.count, None, dtype=object)
        present = np.zeros(self.count, dtype=bool)
        for at, reports, values in self.sources:
            values = np.asarray(values)
            if at is None:
                here = np.ones(self.count, dtype=bool) if reports is None else np.array(reports, dtype=bool)
                out[here] = values[here]
            else:
                here = at >= 0
                positions = at[here]
                if reports is not None:
                    keep = np.asarray(reports, dtype=bool)[positions]
                    here[here] = keep
                    positions = positions[keep]
                out[here] = values[positions]
            present |= here
        return present, out


def column_json(column: Column) -> list[Any]:
    """``column`` as the document's list: each value as ``json_number`` gives it (null for NaN and ±inf), null where
    the step has no value."""
    present, values = column.read()
    if values.dtype == np.float64:
        out = values.tolist()
        for index in np.flatnonzero(~(present & np.isfinite(values))).tolist():
            out[index] = None
        return out
    out = values.tolist()
    return [json_number(value) if here else None for value, here in zip(out, present.tolist(), strict=True)]


def table_columns(metrics: MetricColumns, count: int, names: Iterable[str] | None = None) -> dict[str, Column]:
    """The keys of ``metrics`` (``names`` of them, in their order; default: every key, in the order its groups list
    them) as document columns, each folded from the groups that hold it."""
    return {
        name: Column(
            count,
            [(None, metrics.groups[group][0], metrics.groups[group][1][name]) for group in metrics.where[name]],
            tuple((id(metrics.groups[group][0]), id(metrics.groups[group][1][name])) for group in metrics.where[name]),
        )
        for name in (metrics.where if names is None else names)
    }
