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

import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from rollout_diag.errors import InputError
from rollout_diag.io.storage import identity, is_remote, open_file

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
class ParquetSource:
    """A Parquet file as the reader uses it: the footer read once (``metadata``, ``schema``, ``schema_arrow``) and a
    ``pyarrow.parquet.ParquetFile`` open only while row groups are read (``iter_batches`` opens it, :meth:`close`
    drops it once the file is read). Kept open, every file of a dump held a descriptor (a directory of more files
    than ``ulimit -n``, 1024 on many systems, failed) and the compressed column chunks of the row group it read last
    (~5 MiB a file of 100M tokens: +51 MiB at 1G tokens in ten files); ``ParquetFile.close`` keeps those."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._identity = _identity(path)  # the file the footer is of
        footer = self._open()
        try:
            self.metadata = footer.metadata
            self.schema = footer.schema
            self.schema_arrow = footer.schema_arrow
        finally:
            footer.close(force=True)
        self._file: Any = None

    def _open(self, metadata: Any = None) -> Any:
        """A ``ParquetFile`` on the file: a local path as itself; an object-storage one (io/storage.py) through its
        filesystem's random-access file, each row group's column chunks fetched in a few coalesced ranged reads."""
        import pyarrow.parquet as pq

        if not is_remote(self.path):
            return pq.ParquetFile(self.path, metadata=metadata)
        handle = open_file(self.path)
        try:
            return pq.ParquetFile(handle, metadata=metadata, pre_buffer=True)
        except BaseException:
            handle.close()
            raise

    def iter_batches(self, **options: Any) -> Iterator[pa.RecordBatch]:
        """``ParquetFile.iter_batches`` on the file, opened now if it is not (its footer is not read again). Raises
        InputError where the file was replaced or rewritten since its footer was read: the footer's offsets would
        point into other bytes (a file kept open used to read the old one)."""
        if self._file is None:
            if _identity(self.path) != self._identity:
                raise InputError(
                    f"{self.path}: the file changed while it was read (replaced or rewritten since its footer was "
                    "read); read it again once it is written."
                )
            self._file = self._open(self.metadata)
        return self._file.iter_batches(**options)

    def close(self) -> None:
        """Let the open file go, with the buffers of the row group it read last (reopened if read again)."""
        if self._file is not None:
            self._file.close(force=True)  # force: a remote file's handle was opened here, not by the ParquetFile
            self._file = None


def _identity(path: str) -> tuple[int, ...]:
    """(device, inode, size, mtime in ns) of ``path`` ((size, mtime) on object storage): another file, or the same
    rewritten, has another."""
    if is_remote(path):
        return identity(path)
    info = os.stat(path)
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


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

    def close(self) -> None:
        """Nothing to let go: each ``iter_batches`` opens the file for its own reading."""

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
def number_in(name: str, pattern: str) -> int | None:
    """The integer captured by ``pattern`` (one group) in ``name``, or None."""
    match = re.search(pattern, name)
    return int(match.group(1)) if match else None


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

    With ``fast``, blocks of lines are read by the compiled scanner (``io/jsonl/``) instead and only the
    lines it cannot vouch for go through ``parse`` (see :class:`FastLines`); the batches are the same, row for row. A
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
    """(lines as :func:`count_lines` counts them, whether the file holds a carriage return): one compiled pass over
    blocks read into reused buffers. It runs at open, before any row is read, so a large file is counted in ranges
    by one thread per core (reads and the compiled pass drop the GIL)."""
    from rollout_diag.cores import available_cores

    size = os.path.getsize(path)
    ranges = max(1, min(available_cores(), _COUNT_THREADS, size // _COUNT_RANGE_BYTES))
    if ranges == 1:
        newlines, returns, last = _count_range(path, 0, None)
        return newlines + (last not in (10, -1)), returns > 0
    cuts = [size * i // ranges for i in range(ranges)]
    bounds: list[tuple[int, int | None]] = list(zip(cuts, [*cuts[1:], None], strict=True))  # the last reads to the end
    results: list[Any] = [None] * ranges

    def count(i: int) -> None:
        try:
            results[i] = _count_range(path, *bounds[i])
        except BaseException as exc:  # raised in the caller's thread below
            results[i] = exc

    threads = [threading.Thread(target=count, args=(i,), name="rollout-diag-count") for i in range(1, ranges)]
    for thread in threads:
        thread.start()
    count(0)
    for thread in threads:
        thread.join()
    for result in results:
        if isinstance(result, BaseException):
            raise result
    newlines = sum(result[0] for result in results)
    returns = sum(result[1] for result in results)
    last = next((result[2] for result in reversed(results) if result[2] >= 0), -1)
    return newlines + (last not in (10, -1)), returns > 0


_COUNT_THREADS = 4  # threads counting a file's lines at open, at most (one per core up to this)
_COUNT_RANGE_BYTES = 8 << 20  # a file is counted in ranges of at least this many bytes
_COUNT_READ_BYTES = 1 << 20  # the counting reads (a buffer that stays in the core's cache)


def _count_range(path: str | Path, start: int, stop: int | None) -> tuple[int, int, int]:
    """(newlines, carriage returns, last byte or -1 when none) of the file's bytes ``[start, stop)`` (``stop`` None:
    to the file's end)."""
    from rollout_diag.io.jsonl import newlines_and_returns

    newlines, returns, last = 0, 0, -1
    buffer = bytearray(_COUNT_READ_BYTES)
    view = np.frombuffer(buffer, np.uint8)
    with open(path, "rb", buffering=0) as handle, memoryview(buffer) as window:
        handle.seek(start)
        left = -1 if stop is None else stop - start
        while left:
            got = handle.readinto(window if left < 0 or left >= len(buffer) else window[:left])
            if not got:
                break
            lines, carriage = newlines_and_returns(view, got)
            newlines, returns, last = newlines + lines, returns + carriage, buffer[got - 1]
            if left > 0:
                left -= got
    return newlines, returns, last


# ------------------------------------------------------------------ the fast JSON-lines path
@dataclass(frozen=True)
class ParsedLines:
    """The lines of a block the compiled scanner read (``io/jsonl/``), one row each.

    ``columns``: the :attr:`FastLines.schema` fields by name (a field absent from a line, or written as
    ``null``, is null there, as pyarrow's JSON reader gives it); ``lines``: each row's file row (0-based, the
    row ``parse`` would be given); ``written_null[name]``: per row, whether the field was written as ``null``
    (not absent: Python's json then sees the key).
    """

    columns: dict[str, pa.Array]
    lines: np.ndarray
    written_null: dict[str, np.ndarray]

    @property
    def rows(self) -> int:
        return len(self.lines)

    def present(self, name: str) -> np.ndarray:
        """Per row: whether field ``name`` holds a value (neither absent nor null)."""
        return self.columns[name].is_valid().to_numpy(zero_copy_only=False)

    def filtered(self, keep: np.ndarray) -> ParsedLines:
        """The rows flagged in ``keep``."""
        if keep.all():
            return self
        selected = pa.array(keep)
        return ParsedLines(
            {name: column.filter(selected) for name, column in self.columns.items()},
            self.lines[keep],
            {name: flags[keep] for name, flags in self.written_null.items()},
        )


@dataclass(frozen=True)
class FastLines:
    """How a JSON-lines format reads well-formed lines in bulk: the compiled scanner of
    ``io/jsonl/`` (measured against pyarrow's and polars' JSON readers in docs/benchmarks.md).

    ``schema``: the fields the format uses, typed (``int64``, ``string``, lists or lists of lists of
    ``float64``/``int64``/``bool``); a line where one holds a value of another JSON type goes to ``parse``.
    ``convert(parsed, step)`` turns the :class:`ParsedLines` into ``(canonical batch of the rows it accepts,
    accepted mask)``; it accepts a row only where it is sure ``parse`` would give the same row, and every
    other line goes through ``parse``.

    The scanner itself leaves to ``parse`` every line where Python's json might read otherwise (see its
    docstring): ``NaN``/``Infinity``/``-Infinity`` it reads as Python does. A block that is not UTF-8
    raises UnicodeDecodeError, as reading the file as text does.
    """

    schema: pa.Schema
    convert: Callable[[ParsedLines, int], tuple[pa.RecordBatch, np.ndarray]]


BLOCK_BYTES = 16 << 20  # a block of lines (one batch) ends within this many bytes even when more rows are asked
PART_BYTES = 1 << 20  # a block's lines are scanned in parts of at least about this many bytes, by one thread per core
_PARTS_PER_THREAD = 2  # parts of a block at most, per scanning thread (each part costs Python work per field)
_SCAN_THREADS = 4  # threads scanning at most (one per core up to this)
_BUFFERS = 3  # read buffers in turn: the block being read, the one being scanned, the one being converted
_SPARE_BUFFERS: list[list[bytearray]] = []  # sets of read buffers kept between files (their pages stay taken)
_SPARE_SETS = 2  # sets kept at most (files read at once by different threads take one each)
_SCANNERS: dict[int, Any] = {}


@dataclass
class _Block:
    data: bytes | bytearray  # the bytes read, holding the block's lines (and maybe other blocks'); may run past them
    ends: np.ndarray  # int64 positions in data: line i is data[ends[i]:ends[i + 1]]
    first: int  # file row of the first line
    ascii: bool  # whether all of data is ASCII (else the block's lines are checked to be UTF-8)
    scanned: Any = None  # what the scanner read (a io.jsonl.Scanned), or None when it was not run

    @property
    def lines(self) -> int:
        return len(self.ends) - 1

    def line(self, index: int) -> bytes | bytearray:
        return self.data[int(self.ends[index]) : int(self.ends[index + 1])]


def _blocks(path: str, size: int, buffers: list[bytearray]) -> Iterator[_Block]:
    """The file's lines in file order, in blocks of at most ``size`` lines and about :data:`BLOCK_BYTES` (a longer
    line: one block). Every block ends at a newline (or at the file's end).

    The bytes are read into ``buffers`` in turn (no fresh pages, no joining of a line cut by a read: its start is
    moved to the front of the next buffer; a buffer too short is replaced in the list by a longer one), so a block's
    ``data`` is overwritten once the generator has gone on ``len(buffers)`` reads: the caller must be done with a
    block by then (``_fast_batches`` keeps one block ahead of three buffers)."""
    from rollout_diag.io.jsonl import line_ends

    first = 0
    turn = 0
    carried = b""  # the bytes after the last newline read so far (a line cut by a read)
    with open(path, "rb", buffering=0) as handle:
        while True:
            slot = turn % len(buffers)
            turn += 1
            data = buffers[slot]
            data[: len(carried)] = carried  # the buffers have room for a cut line of up to a slack (else it grows)
            filled = checked = len(carried)
            ascii = carried.isascii()
            while True:  # reads of BLOCK_BYTES (so the blocks, and the batches, are the same whatever the buffers)
                wanted = filled + BLOCK_BYTES
                if len(data) < wanted:  # not resized in place: an old view of it may still be alive
                    grown = bytearray(wanted)
                    grown[:filled] = data[:filled]
                    data = buffers[slot] = grown
                filled = _fill(handle, data, filled, wanted)
                ends, ascii_read = line_ends(_readonly(data), checked, filled)
                ascii = ascii and ascii_read
                if len(ends) or filled < wanted:  # a newline, or the file's end
                    break
                checked = filled
            if not len(ends):  # the file's end
                if filled:  # a last line without a newline
                    last = bytes(data[:filled])
                    yield _Block(last, np.array([0, filled], dtype=np.int64), first, last.isascii())
                return
            starts = np.empty(len(ends) + 1, dtype=np.int64)
            starts[0] = 0
            starts[1:] = ends
            for at in range(0, len(ends), size):
                upto = min(at + size, len(ends))
                yield _Block(data, starts[at : upto + 1], first, ascii)
                first += upto - at
            carried = bytes(data[int(ends[-1]) : filled])


def _fill(handle: Any, data: bytearray, filled: int, wanted: int) -> int:
    """Read from ``handle`` into ``data[filled:wanted]`` until that is full or the file ends; returns the bytes held."""
    with memoryview(data) as view:
        while filled < wanted and (got := handle.readinto(view[filled:wanted])):
            filled += got
    return filled


def _readonly(data: bytes | bytearray) -> np.ndarray:
    """``data`` as a read-only uint8 array: one type for the compiled passes whether a block is bytes or a buffer."""
    array = np.frombuffer(data, np.uint8)
    array.flags.writeable = False
    return array


def _fast_batches(
    path: str, step: int, parse: Callable[[str, int, int], Row], fast: FastLines, size: int, extra: pa.Schema | None
) -> Iterator[pa.RecordBatch]:
    """Blocks of lines in file order, each scanned in parts (split at line ends) by a pool of threads, one per core
    (the compiled scanner drops the GIL), while the block before is converted and used. The blocks, so the batches,
    are the same whatever the threads and parts: a part changes only who reads which lines."""
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    from rollout_diag.cores import available_cores
    from rollout_diag.io.jsonl import Scanner

    scanner = _SCANNERS.get(id(fast))
    if scanner is None:
        scanner = _SCANNERS[id(fast)] = Scanner(fast.schema)
    workers = max(1, min(available_cores(), _SCAN_THREADS))
    buffers = _take_buffers()
    try:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rollout-diag-jsonl") as pool:
            ahead: deque = deque()
            for block in _blocks(path, size, buffers):
                parts = _parts(block.ends, _PARTS_PER_THREAD * workers)
                ahead.append((block, parts, [pool.submit(_scan_part, block, a, b, scanner) for a, b in parts]))
                if len(ahead) > 1:
                    yield _finish_block(_joined(*ahead.popleft()), step, parse, fast, extra)
            while ahead:
                yield _finish_block(_joined(*ahead.popleft()), step, parse, fast, extra)
    finally:  # after the pool has shut down: no scan reads the buffers any more
        _give_back_buffers(buffers)


def _take_buffers() -> list[bytearray]:
    """A set of :data:`_BUFFERS` read buffers for one file: a spare one (its pages already taken) or a new one."""
    while _SPARE_BUFFERS:
        try:
            buffers = _SPARE_BUFFERS.pop()
        except IndexError:  # another thread took the last one
            break
        if all(len(buffer) == _buffer_bytes() for buffer in buffers):  # not from before BLOCK_BYTES changed
            return buffers
    return [bytearray(_buffer_bytes()) for _ in range(_BUFFERS)]


def _buffer_bytes() -> int:
    """A read buffer's size: a read of :data:`BLOCK_BYTES` after a cut line of up to an eighth of that."""
    return BLOCK_BYTES + BLOCK_BYTES // 8 + 1


def _give_back_buffers(buffers: list[bytearray]) -> None:
    """Keep a file's read buffers for the next file, unless enough are kept or one grew for a long line."""
    if len(_SPARE_BUFFERS) < _SPARE_SETS and all(len(buffer) == _buffer_bytes() for buffer in buffers):
        _SPARE_BUFFERS.append(buffers)


def _parts(ends: np.ndarray, most: int) -> list[tuple[int, int]]:
    """The block's lines as at most ``most`` ranges ``[a, b)`` of about the same bytes, at least about
    :data:`PART_BYTES` each, in order, cut only at line ends."""
    lines = len(ends) - 1
    total = int(ends[-1] - ends[0])
    count = max(1, min(lines, most, total // max(PART_BYTES, 1)))
    if count <= 1:
        return [(0, lines)]
    targets = ends[0] + (np.arange(1, count, dtype=np.int64) * total) // count
    cuts = np.unique(np.searchsorted(ends, targets))  # the first line starting at or after each target
    bounds = [0, *(int(c) for c in cuts if 0 < c < lines), lines]
    return list(pairwise(bounds))


def _scan_part(block: _Block, a: int, b: int, scanner: Any) -> Any:
    """Read lines ``[a, b)`` of the block with the scanner. The first part checks the whole block is UTF-8 (raising
    UnicodeDecodeError as reading the file as text does)."""
    if a == 0 and not block.ascii:
        block.data[int(block.ends[0]) : int(block.ends[-1])].decode("utf-8")  # raises where reading as text would
    return scanner.scan(block.data, block.ends[a : b + 1])


def _joined(block: _Block, parts: list[tuple[int, int]], futures: list) -> _Block:
    """The block with what its parts read, put together in line order (``block.scanned``)."""
    from rollout_diag.io.jsonl import Scanned

    scanned = [future.result() for future in futures]  # in order: raises what a part raised
    if len(scanned) == 1:
        block.scanned = scanned[0]
        return block
    block.scanned = Scanned(
        np.concatenate([part.rows + a for part, (a, _) in zip(scanned, parts, strict=True)]),
        pa.concat_tables([part.table for part in scanned]),
        np.concatenate([part.written_null for part in scanned]),
    )
    return block


def _finish_block(
    block: _Block, step: int, parse: Callable[[str, int, int], Row], fast: FastLines, extra: pa.Schema | None
) -> pa.RecordBatch:
    first = block.first
    scanned = block.scanned
    if scanned is None or not len(scanned.rows):
        return rows_to_batch([parse(block.line(i).decode("utf-8"), first + i, step) for i in range(block.lines)], extra)
    columns = {name: _one_array(scanned.table.column(name)) for name in fast.schema.names}
    written_null = {name: scanned.written_null[:, k] for k, name in enumerate(fast.schema.names)}
    fast_batch, ok = fast.convert(ParsedLines(columns, first + scanned.rows, written_null), step)
    accepted = scanned.rows[ok]
    taken = np.zeros(block.lines, dtype=bool)
    taken[accepted] = True
    slow = np.flatnonzero(~taken)
    if not len(slow):
        return fast_batch
    slow_batch = rows_to_batch([parse(block.line(int(i)).decode("utf-8"), first + int(i), step) for i in slow], extra)
    if not len(accepted):
        return slow_batch
    table = pa.Table.from_batches([fast_batch, slow_batch])
    order = np.argsort(np.concatenate([accepted, slow]), kind="stable")
    return table.take(order).combine_chunks().to_batches()[0]


def _one_array(column: pa.ChunkedArray) -> pa.Array:
    """The column as one array (the scanner's columns are one chunk: no copy then)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


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
    if flags.all():  # every item (a weight stream written as nulls): each row's length
        return np.diff(offsets).astype(np.int64)
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
    mask = None if nulls is None else pa.array(nulls, pa.bool_())
    values = array.values
    total = int(new[-1])
    if total == int(offsets[-1] - offsets[0]) and np.array_equal(new[:-1], starts - offsets[0]):  # nothing cut
        taken = values.slice(int(offsets[0]), total)
    elif not values.null_count and len(kept) * _ROW_COPY_ITEMS <= total and pa.types.is_primitive(values.type):
        # long rows: a copy of each row's kept run (a memcpy each, into Arrow's pool, whose memory is reused: a
        # fresh numpy array this large is mapped afresh, a page fault per page), not an index per item and a take
        runs = [values.slice(a, k) for a, k in zip(starts.tolist(), kept.tolist(), strict=True) if k]
        taken = pa.concat_arrays(runs) if runs else values.slice(0, 0)
    else:
        index = np.repeat(starts - new[:-1], kept) + np.arange(total)
        taken = values.take(pa.array(index))
    return pa.ListArray.from_arrays(pa.array(new, pa.int32()), taken, mask=mask)


_ROW_COPY_ITEMS = 64  # prefixes copies row by row where the rows keep this many items on average


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
    if values.null_count == len(values):
        return np.ones(len(values), dtype=bool)
    return values.is_null().to_numpy(zero_copy_only=False)


def only_items(array: pa.ListArray) -> pa.Array:
    """The one item of each row of a list array whose rows all hold one (null rows give null)."""
    import pyarrow.compute as pc

    return array.flatten() if not array.null_count else pc.list_element(array, 0)
