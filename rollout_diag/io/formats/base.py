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
    extra: dict[str, Any] | None = None  # per-row values of the format's own extra fields (RowsFile ``extra``)

    @classmethod
    def unreadable(cls, step: int, sample_id: str, reason: str, column: str | None = None) -> Row:
        return cls(step=step, sample_id=sample_id, skip_reason=reason, skip_column=column)


def _lists(values: list[Any], value_type: pa.DataType) -> pa.Array:
    return pa.array(values, type=pa.list_(value_type))


def with_extra(extra: pa.Schema | None) -> pa.Schema:
    """The canonical schema, followed by a format's own per-row fields (scalars the reader carries as extras)."""
    return CANONICAL_SCHEMA if extra is None else pa.schema([*CANONICAL_SCHEMA, *extra])


def rows_to_batch(rows: Sequence[Row], extra: pa.Schema | None = None) -> pa.RecordBatch:
    """Pack rows into one canonical record batch (with the ``extra`` fields, from each row's ``extra``); a row whose
    values Arrow cannot take becomes unreadable."""
    try:
        return _pack(rows, extra)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        # One bad row spoils the whole conversion: convert row by row to name the bad ones.
        return _pack([_checked(row) for row in rows], extra)


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


def _pack(rows: Sequence[Row], extra: pa.Schema | None = None) -> pa.RecordBatch:
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
    for field in extra or ():
        values = [None if row.extra is None else row.extra.get(field.name) for row in rows]
        columns.append(pa.array(values, field.type))
    return pa.RecordBatch.from_arrays(columns, schema=with_extra(extra))


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

    def __init__(
        self,
        path: str,
        rows: int,
        read: Callable[[], Iterable[Row]],
        batches: Callable[[int], Iterable[pa.RecordBatch]] | None = None,
        extra: pa.Schema | None = None,
    ) -> None:
        self.path = path
        self.extra = extra  # the format's own per-row fields after the canonical ones
        self.schema_arrow = with_extra(extra)
        self.metadata = _Metadata(rows)
        self._read = read
        self._batches = batches  # a faster way to the same canonical batches (``batches(size)``), when there is one

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
        if self._batches is not None:
            for batch in self._batches(size):
                yield _select(batch, columns)
            return
        pending: list[Row] = []
        for row in self._read():
            pending.append(row)
            if len(pending) >= size:
                yield _select(rows_to_batch(pending, self.extra), columns)
                pending = []
        if pending:
            yield _select(rows_to_batch(pending, self.extra), columns)


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


def jsonl_file(
    path: str,
    step: int,
    parse: Callable[[str, int, int], Row],
    fast: FastLines | None = None,
    extra: pa.Schema | None = None,
) -> RowsFile:
    """A JSON-lines dump: ``parse(line, line_index, step)`` turns one line into a row (the reference).

    With ``fast``, blocks of lines are read by Arrow's JSON reader instead and only the lines it cannot
    vouch for go through ``parse`` (see :class:`FastLines`); the batches are the same, row for row. A
    file with a carriage return is read line by line as text (Python's universal newlines split there).
    """
    lines, carriage_returns = _scan_lines(path)

    def rows() -> Iterator[Row]:
        with open(path, encoding="utf-8") as handle:
            for line_index, line in enumerate(handle):
                yield parse(line, line_index, step)

    if carriage_returns:  # count the lines text reading yields (a lone \r ends one too)
        with open(path, encoding="utf-8", errors="replace") as handle:
            lines = sum(1 for _ in handle)
    if fast is None or carriage_returns:
        return RowsFile(path, lines, rows, extra=extra)
    return RowsFile(path, lines, rows, lambda size: _fast_batches(path, step, parse, fast, size, extra), extra)


def _scan_lines(path: str | Path) -> tuple[int, bool]:
    """(lines as :func:`count_lines` counts them, whether the file holds a carriage return)."""
    lines, carriage_returns = 0, False
    last = b"\n"
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            lines += block.count(b"\n")
            carriage_returns = carriage_returns or b"\r" in block
            last = block[-1:]
    return lines + (last != b"\n"), carriage_returns


# ------------------------------------------------------------------ the fast JSON-lines path
@dataclass(frozen=True)
class FastLines:
    """How a JSON-lines format reads well-formed lines in bulk with ``pyarrow.json`` (measured faster than
    polars' NDJSON reader and than Python's json here; docs/benchmarks.md).

    ``schema``: the fields the format uses, typed strictly (a value of another JSON type fails the whole
    block, which then goes line by line). ``convert(table, lines, line_indexes, step)`` turns the parsed
    rows into ``(canonical batch of the rows it accepts, accepted mask)``; it accepts a row only where it
    is sure ``parse`` would give the same row, and every other line goes through ``parse``.

    Lines never given to Arrow, because there its reading differs from Python's json: blank lines and lines
    not starting with ``{`` (Python's messages), lines holding ``NaN`` / ``Infinity`` (bare non-finite
    literals, which Python reads), and blocks that are not UTF-8 (raise UnicodeDecodeError, as text does).
    """

    schema: pa.Schema
    convert: Callable[[pa.Table, list[bytes], list[int], int], tuple[pa.RecordBatch, np.ndarray]]


BLOCK_BYTES = 16 << 20  # a block of lines stops growing here even when the reader asks for more rows
_NON_FINITE = (b"NaN", b"Infinity")  # "-Infinity" contains "Infinity"


@dataclass
class _Block:
    lines: list[bytes]
    first: int  # file row of lines[0]
    chosen: list[int]  # the lines given to Arrow
    table: Any = None  # what Arrow read of them (a pyarrow Table, or None when it could not)


def _blocks(path: str, size: int) -> Iterator[_Block]:
    first = 0
    lines: list[bytes] = []
    held = 0
    with open(path, "rb") as handle:
        for line in handle:
            lines.append(line)
            held += len(line)
            if len(lines) >= size or held >= BLOCK_BYTES:
                yield _Block(lines, first, [])
                first += len(lines)
                lines, held = [], 0
    if lines:
        yield _Block(lines, first, [])


def _fast_batches(
    path: str, step: int, parse: Callable[[str, int, int], Row], fast: FastLines, size: int, extra: pa.Schema | None
) -> Iterator[pa.RecordBatch]:
    """Blocks of lines, each parsed by Arrow in a thread while the one before is converted and used."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout-diag-jsonl") as pool:
        ahead = None
        for block in _blocks(path, size):
            parsed = pool.submit(_parse_block, block, fast.schema)
            if ahead is not None:
                yield _finish_block(ahead.result(), step, parse, fast, extra)
            ahead = parsed
        if ahead is not None:
            yield _finish_block(ahead.result(), step, parse, fast, extra)


def _parse_block(block: _Block, schema: pa.Schema) -> _Block:
    """Choose the lines Arrow may read and read them (``block.table``); raises UnicodeDecodeError as text does."""
    import pyarrow.json as pj

    lines = block.lines
    data = b"".join(lines)
    if not data.isascii():
        data.decode("utf-8")  # raises UnicodeDecodeError where reading as text would
    avoid = _lines_holding(data, lines, _NON_FINITE)
    block.chosen = [i for i, line in enumerate(lines) if i not in avoid and line.lstrip()[:1] == b"{"]
    if not block.chosen:
        return block
    text = data if len(block.chosen) == len(lines) else b"".join(_ended(lines[i]) for i in block.chosen)
    longest = max(len(lines[i]) for i in block.chosen)
    try:
        table = pj.read_json(
            pa.BufferReader(text),
            read_options=pj.ReadOptions(block_size=max(1 << 20, 2 * longest + 2)),
            parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
        )
    except pa.ArrowException:
        return block  # one line Arrow cannot read spoils the block: every line goes through parse
    if table.num_rows == len(block.chosen):  # else a line held two objects: Python says "Extra data"
        block.table = table
    return block


def _finish_block(
    block: _Block, step: int, parse: Callable[[str, int, int], Row], fast: FastLines, extra: pa.Schema | None
) -> pa.RecordBatch:
    lines, first = block.lines, block.first
    if block.table is None:
        return rows_to_batch([parse(line.decode("utf-8"), first + i, step) for i, line in enumerate(lines)], extra)
    fast_batch, ok = fast.convert(
        block.table, [lines[i] for i in block.chosen], [first + i for i in block.chosen], step
    )
    accepted = np.asarray(block.chosen, dtype=np.int64)[ok]
    taken = np.zeros(len(lines), dtype=bool)
    taken[accepted] = True
    slow = np.flatnonzero(~taken)
    if not len(slow):
        return fast_batch
    slow_batch = rows_to_batch([parse(lines[int(i)].decode("utf-8"), first + int(i), step) for i in slow], extra)
    if not len(accepted):
        return slow_batch
    table = pa.Table.from_batches([fast_batch, slow_batch])
    order = np.argsort(np.concatenate([accepted, slow]), kind="stable")
    return table.take(order).combine_chunks().to_batches()[0]


def _ended(line: bytes) -> bytes:
    return line if line.endswith(b"\n") else line + b"\n"


def _lines_holding(data: bytes, lines: list[bytes], needles: Sequence[bytes]) -> set[int]:
    """Indexes of the lines in which any of ``needles`` occurs (``data`` is the lines joined)."""
    found: set[int] = set()
    starts: np.ndarray | None = None
    for needle in needles:
        at = data.find(needle)
        while at >= 0:
            if starts is None:
                starts = np.cumsum([0, *map(len, lines)])
            line = int(np.searchsorted(starts, at, side="right")) - 1
            found.add(line)
            at = data.find(needle, int(starts[line + 1]))  # next line: one look per line at most
    return found


# ------------------------------------------------------------------ helpers for FastLines.convert
def list_lengths(array: pa.Array) -> np.ndarray:
    """Per-row lengths of a list array, -1 where the list is null."""
    import pyarrow.compute as pc

    return pc.list_value_length(array).fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)


def row_count(array: pa.ListArray, flags: np.ndarray) -> np.ndarray:
    """Per row of a list array: how many of its items are flagged (``flags`` runs over ``array.values``)."""
    offsets = array.offsets.to_numpy()
    if not flags.any():
        return np.zeros(len(offsets) - 1, dtype=np.int64)
    counts = np.concatenate([[0], np.cumsum(flags, dtype=np.int64)])
    return counts[offsets[1:]] - counts[offsets[:-1]]


def row_any(array: pa.ListArray, flags: np.ndarray) -> np.ndarray:
    """Per row of a list array: whether any of its items is flagged (``flags`` runs over ``array.values``)."""
    return row_count(array, flags) > 0


def prefixes(array: pa.ListArray, keep: np.ndarray, nulls: np.ndarray | None = None) -> pa.ListArray:
    """Each row's first ``keep`` items (all of them where it holds fewer); rows flagged in ``nulls`` null."""
    offsets = array.offsets.to_numpy().astype(np.int64)
    starts = offsets[:-1]
    kept = np.minimum(offsets[1:] - starts, keep)
    if nulls is not None:
        kept = np.where(nulls, 0, kept)
    new = np.concatenate([[0], np.cumsum(kept)]).astype(np.int32)
    index = np.repeat(starts - new[:-1], kept) + np.arange(int(new[-1]))
    mask = None if nulls is None else pa.array(nulls, pa.bool_())
    return pa.ListArray.from_arrays(pa.array(new, pa.int32()), array.values.take(pa.array(index)), mask=mask)


def canonical_batch(
    step: pa.Array,
    sample_id: list[str],
    rollout: pa.Array,
    trainer: pa.Array,
    mask: pa.Array,
    token_ids: pa.Array,
    extra: Sequence[pa.Array] = (),
    extra_schema: pa.Schema | None = None,
) -> pa.RecordBatch:
    """A canonical batch of rows that were all read (no skip reasons), then the format's ``extra`` fields."""
    nulls = pa.nulls(len(sample_id), pa.string())
    columns = [step, pa.array(sample_id, pa.string()), rollout, trainer, mask, token_ids, nulls, nulls, *extra]
    schema = with_extra(extra_schema)
    return pa.RecordBatch.from_arrays(
        [column.cast(field.type) for column, field in zip(columns, schema, strict=True)], schema=schema
    )


def null_flags(values: pa.Array) -> np.ndarray:
    """Per value: whether it is null."""
    if not values.null_count:
        return np.zeros(len(values), dtype=bool)
    return values.is_null().to_numpy(zero_copy_only=False)


def only_items(array: pa.ListArray) -> pa.Array:
    """The one item of each row of a list array whose rows all hold one (null rows give null)."""
    import pyarrow.compute as pc

    return array.flatten() if not array.null_count else pc.list_element(array, 0)


def unsafe_numbers(values: pa.Array) -> np.ndarray:
    """Per value: where Arrow's number may differ from what Python's json and ``pa.array`` give.

    An integer literal beyond 2**53 fails ``pa.array(..., float64)`` (Arrow's JSON reader rounds it) and
    ``-0`` is 0.0 through Python (-0.0 through Arrow): values of such magnitude and every -0.0 are flagged.
    """
    numbers = values.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
    with np.errstate(invalid="ignore"):
        return (np.abs(numbers) >= 2.0**53) | ((numbers == 0) & np.signbit(numbers))


def field_named(line: bytes, name: str) -> bool:
    """Whether ``"name"`` occurs in the line (a null field is then explicit, not missing; strings that
    happen to hold the name, and any ``\\u`` escape, count too: they only send the line through ``parse``)."""
    return f'"{name}"'.encode() in line or b"\\u" in line
