"""``--where PREDICATE`` and ``--steps FIRST:LAST``: which rows an analysis reads.

The reader calls a :class:`RowSelection` on every record batch before it turns the token lists into numpy and
torch arrays (``io/reader.py``): rows that do not match are dropped there and never decoded further, validated or
counted as skipped. The predicate is SQL as users write it (``reward > 0 AND env_name = 'math'``), over the per-row
columns of the dump (step, sample id, and the extra scalar columns such as env_name, reward, advantage), evaluated by
polars (``polars.sql_expr``); SQL's NULL rules hold: a row whose predicate is NULL does not match.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa

from rollout_diag.errors import ConfigError, option_name

if TYPE_CHECKING:
    import polars as pl  # imported when a predicate is evaluated: polars is loaded only for --where

StepRange = tuple[int | None, int | None]  # first..last step, inclusive; None = open end


@dataclass(frozen=True)
class RowSelection:
    """The rows an analysis keeps: those in ``steps`` (inclusive) for which ``where`` is true. Picklable (workers)."""

    where: str | None = None
    steps: StepRange | None = None

    def __bool__(self) -> bool:
        return self.where is not None or self.steps is not None

    def describe(self) -> dict[str, Any]:
        """What the result records (``AnalysisResult.selection``), without the row counts."""
        out: dict[str, Any] = {}
        if self.where is not None:
            out["where"] = self.where
        if self.steps is not None:
            out["steps"] = list(self.steps)
        return out

    def check(self, schema: pa.Schema, path: str, per_row: Sequence[str]) -> None:
        """Raises ConfigError (one line, naming the column) when the predicate names a column that is not one of
        ``per_row`` (of ``schema``), is not valid SQL, compares values of the wrong type, or is not a condition."""
        if self.where is None:
            return
        import polars as pl

        scalar = pa.schema([f for f in schema if f.name in set(per_row) and not _is_list(f.type)])
        expression = _expression(self.where)
        try:
            names = expression.meta.root_names()
        except pl.exceptions.PolarsError:
            names = []
        for name in names:
            if name not in scalar.names:
                kind = "one value per token, not per row" if name in schema.names else "no such per-row column"
                raise ConfigError(
                    f"{option_name('where')} {self.where!r}: {path}: column '{name}': {kind} "
                    f"(per-row columns: {', '.join(scalar.names) or 'none'})."
                )
        try:
            result = _frame(scalar.empty_table()).select(expression)
        except pl.exceptions.PolarsError as exc:
            types = ", ".join(f"column '{n}' is {scalar.field(n).type}" for n in dict.fromkeys(names))
            raise ConfigError(
                f"{option_name('where')} {self.where!r}: {path}: {_first_line(exc)}"
                + (f" ({types})." if types else ".")
            ) from None
        dtype = result.schema[result.columns[0]] if result.columns else None
        if dtype != pl.Boolean:
            raise ConfigError(
                f"{option_name('where')} {self.where!r}: not a condition (gives {dtype}, not true/false); "
                "compare a column, e.g. reward > 0."
            )

    def __call__(self, batch: pa.RecordBatch | pa.Table, step: np.ndarray) -> np.ndarray:
        """True for each row of ``batch`` (steps ``step``) that is selected."""
        keep = np.ones(len(step), dtype=bool)
        if self.steps is not None:
            first, last = self.steps
            if first is not None:
                keep &= step >= first
            if last is not None:
                keep &= step <= last
        if self.where is not None and keep.any():
            columns = [
                f.name for f in batch.schema if not pa.types.is_list(f.type) and not pa.types.is_large_list(f.type)
            ]
            frame = _frame(batch.select(columns))
            matched = frame.select(_expression(self.where)).to_series().fill_null(False).to_numpy()
            keep &= matched.astype(bool, copy=False)
        return keep


def _is_list(data_type: pa.DataType) -> bool:
    return pa.types.is_list(data_type) or pa.types.is_large_list(data_type) or pa.types.is_fixed_size_list(data_type)


def _frame(table: pa.Table | pa.RecordBatch) -> pl.DataFrame:
    """``table`` as a polars frame (``from_arrow`` gives a Series only for an array)."""
    import polars as pl

    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame), "a table or record batch converts to a DataFrame"
    return frame


def _expression(where: str) -> pl.Expr:
    import polars as pl

    try:
        return pl.sql_expr(where)
    except pl.exceptions.PolarsError as exc:
        raise ConfigError(f"{option_name('where')} {where!r}: not a SQL condition ({_first_line(exc)}).") from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0].rstrip(".")


def selection(where: str | None = None, steps: StepRange | Sequence[int | None] | None = None) -> RowSelection:
    """A RowSelection from the library arguments; raises ConfigError for a step range whose first is after its last."""
    if steps is not None:
        if len(steps) != 2:
            raise ConfigError(f"{option_name('steps')}={steps}: give (first, last), either may be None.")
        first, last = steps
        if first is not None and last is not None and first > last:
            raise ConfigError(f"{option_name('steps')}={first}:{last}: the first step is after the last.")
        steps = (first, last)
    if where is not None and not where.strip():
        raise ConfigError(f"{option_name('where')}: empty predicate.")
    return RowSelection(where, steps)


class _SelectedOut(Protocol):
    """What ``selection_summary`` reads of a read log (io's ReadLog, which this module may not import)."""

    @property
    def rows_selected_out(self) -> int: ...


def selection_summary(chosen: RowSelection | None, log: _SelectedOut, rows_kept: int) -> dict[str, Any]:
    """``AnalysisResult.selection``: the predicate and step range used, rows analysed and rows left out (sequences;
    a ReadLog's ``rows_selected_out``); empty without a selection."""
    if not chosen:
        return {}
    return {**chosen.describe(), "rows_kept": rows_kept, "rows_left_out": int(log.rows_selected_out)}


def no_rows_match(chosen: RowSelection | None, left_out: int) -> str:
    """The sentence for a selection that kept no row."""
    what = [] if chosen is None else [f"{k} {v!r}" for k, v in chosen.describe().items()]
    return f"no row matches {' and '.join(what) or 'the selection'} ({left_out} rows read, none kept)."


def parse_step_range(text: str | None, option: str) -> StepRange | None:
    """``first:last`` (inclusive, either end may be empty) or a single step; raises ConfigError."""
    if text is None:
        return None
    first, sep, last = text.partition(":")
    try:
        bounds = (
            (int(first) if first.strip() else None, int(last) if last.strip() else None) if sep else (int(text),) * 2
        )
    except ValueError:
        raise ConfigError(f"{option} {text}: expected FIRST:LAST steps, e.g. 0:99 (inclusive).") from None
    if bounds[0] is not None and bounds[1] is not None and bounds[0] > bounds[1]:
        raise ConfigError(f"{option} {text}: the first step is after the last.")
    return bounds
