"""What every trainer format turns its files into: record batches of the canonical sequence layout.

A format reads its own files and yields :class:`Row` objects; :class:`RowsFile` packs them into Arrow
record batches of :data:`CANONICAL_SCHEMA` (the sequence layout of ``schemas/dump.schema.json``, verl's
column names) and offers them through the few ``pyarrow.parquet.ParquetFile`` members the reader uses
(``schema_arrow``, ``metadata``, ``iter_batches``). So validation, chunking and every bad-value message
stay in ``io/reader.py``, shared with Parquet.

A row the format cannot read at all (a line that is not JSON, a field of the wrong type) is still
yielded, with ``skip_reason`` set: the reader records it with its file row and leaves it out, so the row
numbers of the other rows stay the file's own (for JSONL, row N is line N + 1).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

SKIP_REASON = "_skip_reason"  # canonical batches only: why a row could not be read (null = readable)
SKIP_COLUMN = "_skip_column"  # the source field the reason is about

CANONICAL_SCHEMA = pa.schema(
    [
        ("step", pa.int64()),
        ("sample_id", pa.string()),
        ("rollout_log_probs", pa.list_(pa.float64())),
        ("old_log_probs", pa.list_(pa.float64())),
        ("response_mask", pa.list_(pa.int8())),
        ("token_ids", pa.list_(pa.int64())),
        (SKIP_REASON, pa.string()),
        (SKIP_COLUMN, pa.string()),
    ]
)
DATA_COLUMNS = [name for name in CANONICAL_SCHEMA.names if not name.startswith("_")]
BATCH_ROWS = 1024  # rows per record batch when the reader asks for more than a file holds


@dataclass
class Row:
    """One sequence as a format read it. Logprob sequences may hold None (non-finite in the source)."""

    step: int
    sample_id: str
    rollout: Sequence[float | None] | np.ndarray | None = None
    trainer: Sequence[float | None] | np.ndarray | None = None
    mask: Sequence[int] | np.ndarray | None = None
    token_ids: Sequence[int] | np.ndarray | None = None
    skip_reason: str | None = None
    skip_column: str | None = None

    @classmethod
    def unreadable(cls, step: int, sample_id: str, reason: str, column: str | None = None) -> Row:
        return cls(step=step, sample_id=sample_id, skip_reason=reason, skip_column=column)


def _lists(values: list[Any], value_type: pa.DataType) -> pa.Array:
    return pa.array(values, type=pa.list_(value_type))


def rows_to_batch(rows: Sequence[Row]) -> pa.RecordBatch:
    """Pack rows into one canonical record batch; a row whose values Arrow cannot take becomes unreadable."""
    try:
        return _pack(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        # One bad row spoils the whole conversion: convert row by row to name the bad ones.
        return _pack([_checked(row) for row in rows])


def _checked(row: Row) -> Row:
    if row.skip_reason is not None:
        return row
    for field, value_type in (
        ("rollout", pa.float64()),
        ("trainer", pa.float64()),
        ("mask", pa.int8()),
        ("token_ids", pa.int64()),
    ):
        try:
            _lists([getattr(row, field)], value_type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
            reason = f"{field} values are not {'numbers' if field in ('rollout', 'trainer') else 'integers'}"
            return Row.unreadable(row.step, row.sample_id, f"{reason} ({_short(exc)})", field)
    return row


def _pack(rows: Sequence[Row]) -> pa.RecordBatch:
    readable = [row.skip_reason is None for row in rows]
    columns = [
        pa.array([row.step for row in rows], pa.int64()),
        pa.array([row.sample_id for row in rows], pa.string()),
        _lists([row.rollout if ok else None for row, ok in zip(rows, readable, strict=True)], pa.float64()),
        _lists([row.trainer if ok else None for row, ok in zip(rows, readable, strict=True)], pa.float64()),
        _lists([row.mask if ok else None for row, ok in zip(rows, readable, strict=True)], pa.int8()),
        _lists([row.token_ids if ok else None for row, ok in zip(rows, readable, strict=True)], pa.int64()),
        pa.array([row.skip_reason for row in rows], pa.string()),
        pa.array([row.skip_column for row in rows], pa.string()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=CANONICAL_SCHEMA)


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:120] + ("…" if len(text) > 120 else "")


# ------------------------------------------------------------------ the ParquetFile-like face
@dataclass(frozen=True)
class _RowGroup:
    num_rows: int
    num_columns: int = 0  # no column statistics: the reader then assumes a typical row length


@dataclass(frozen=True)
class _Metadata:
    num_rows: int

    @property
    def num_row_groups(self) -> int:
        return 1

    def row_group(self, index: int) -> _RowGroup:
        return _RowGroup(self.num_rows)


class RowsFile:
    """One source file as one row group of canonical record batches, read lazily and in bounded memory.

    ``rows`` is the number of rows ``read`` will yield (known up front: the reader reports progress
    against it and splits work by it); ``read`` yields them in file order each time it is called.
    """

    def __init__(self, path: str, rows: int, read: Callable[[], Iterable[Row]]) -> None:
        self.path = path
        self.schema_arrow = CANONICAL_SCHEMA
        self.metadata = _Metadata(rows)
        self._read = read

    def iter_batches(
        self,
        batch_size: int = BATCH_ROWS,
        row_groups: Sequence[int] | None = None,
        columns: Sequence[str] | None = None,
        use_threads: bool = False,
    ) -> Iterator[pa.RecordBatch]:
        """Canonical record batches of at most ``batch_size`` rows (``columns`` selects, skip fields kept)."""
        if row_groups is not None and 0 not in row_groups:
            return
        size = max(int(batch_size), 1)
        pending: list[Row] = []
        for row in self._read():
            pending.append(row)
            if len(pending) >= size:
                yield _select(rows_to_batch(pending), columns)
                pending = []
        if pending:
            yield _select(rows_to_batch(pending), columns)


def _select(batch: pa.RecordBatch, columns: Sequence[str] | None) -> pa.RecordBatch:
    if columns is None:
        return batch
    wanted = [name for name in batch.schema.names if name in set(columns) or name.startswith("_")]
    return batch.select(wanted)


# ------------------------------------------------------------------ helpers shared by formats
_NUMBER = re.compile(r"(\d+)")


def number_in(name: str, pattern: str) -> int | None:
    """The integer captured by ``pattern`` (one group) in ``name``, or None."""
    match = re.search(pattern, name)
    return int(match.group(1)) if match else None


def natural_key(path: str | Path) -> list[Any]:
    """Sort key that puts step_2 before step_10."""
    return [int(part) if part.isdigit() else part for part in _NUMBER.split(str(path))]


def count_lines(path: str | Path) -> int:
    """Lines in a text file (a last line without a newline counts), read in blocks of 1 MiB."""
    lines = 0
    last = b"\n"
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            lines += block.count(b"\n")
            last = block[-1:]
    return lines + (last != b"\n")


def jsonl_file(path: str, step: int, parse: Callable[[str, int, int], Row]) -> RowsFile:
    """A JSON-lines dump read line by line: ``parse(line, line_index, step)`` turns each line into a row."""

    def rows() -> Iterator[Row]:
        with open(path, encoding="utf-8") as handle:
            for line_index, line in enumerate(handle):
                yield parse(line, line_index, step)

    return RowsFile(path, count_lines(path), rows)
