"""Decoding: an opened file's row groups into blocks of whole rows (packed numpy arrays), for both layouts.

Memory: one record batch per file at a time (a row group is decoded at once by Parquet)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rollout_diag.errors import ColumnError, DataError, InputError, where
from rollout_diag.io.columns import TOKEN_SIDE_ROLES
from rollout_diag.io.formats.base import SKIP_COLUMN, SKIP_REASON, ParquetSource
from rollout_diag.io.opening import OpenFile, column_names, decoded, numeric_type, one_line
from rollout_diag.io.readlog import ReadLog
from rollout_diag.results import SkippedRow


class DumpReader(Protocol):
    """What decoding reads of the reader (io/reader.py ``DumpReader``): its options, and the log it writes to."""

    strict: bool
    chunk_tokens: int
    parts: dict[str, set[int]] | None  # row groups to read, by file path; None: every one
    selection: Callable[[pa.RecordBatch | pa.Table, np.ndarray], np.ndarray] | None  # rows to read, per batch
    log: ReadLog


@dataclass
class Block:
    """Rows of one file as flat numpy arrays, before validation."""

    file: str
    file_row: np.ndarray  # int64 [R]
    step: np.ndarray  # int64 [R]
    sample_id: list[str]
    lengths: np.ndarray  # int64 [R]
    trainer: np.ndarray  # float [T]
    rollout: np.ndarray  # float [T]
    mask: np.ndarray | None  # [T] or None (= all ones)
    token_ids: np.ndarray | None = None
    token_text: pa.Array | None = None  # flat strings [T]
    policy_version: np.ndarray | None = None  # int64 [R]
    names: Mapping[str, str] = field(default_factory=dict)  # role -> column, for skip records
    extra: dict[str, ExtraColumn] = field(default_factory=dict)  # extra column -> one value per row [R]
    token_rows: np.ndarray | None = None  # token layout: the file row of each token
    token_columns: dict[str, np.ndarray] = field(default_factory=dict)  # TOKEN_SIDE_ROLES present: role -> [T]
    skipped: list[SkippedRow] = field(default_factory=list)  # found while decoding; logged in row order


def may_hold(opened: OpenFile, group: pq.RowGroupMetaData, role: str, value: int | str) -> bool:
    """False only when the row group's min/max statistics of ``role``'s column exclude ``value``."""
    name = opened.columns.names[role]
    for index in range(group.num_columns):
        column = group.column(index)
        if column.path_in_schema != name:
            continue
        statistics = column.statistics
        if statistics is None or not statistics.has_min_max:
            return True
        low, high = statistics.min, statistics.max
        if isinstance(low, bytes) and isinstance(high, bytes):
            return low <= str(value).encode() <= high
        if isinstance(low, str) and isinstance(high, str):
            return low <= str(value) <= high
        if isinstance(low, int) and isinstance(high, int):
            try:
                number = int(value)
            except ValueError:  # an id that is not a number is in no integer column
                return False
            return low <= number <= high
        return True
    return True


# ---------------------------------------------------------------------------------- row groups
def row_groups(opened: OpenFile, columns: list[str], rows_per_batch, reader: DumpReader):
    """Yield (record batch, first file row) per batch; a row group that cannot be decoded is skipped."""
    metadata = opened.parquet.metadata
    path = opened.source.path
    first_row = 0
    allowed = None if reader.parts is None else reader.parts.get(path, set())
    for group in range(metadata.num_row_groups):
        group_rows = metadata.row_group(group).num_rows
        if allowed is not None and group not in allowed:  # another reader's part; rows still count
            first_row += group_rows
            continue
        done = 0
        try:
            # use_threads=False: with Arrow's thread pool some corrupt pages abort the whole process
            # (an uncaught C++ exception) instead of raising; one thread decodes as fast here (prefetch overlaps).
            for batch in opened.parquet.iter_batches(
                batch_size=rows_per_batch(), row_groups=[group], columns=columns, use_threads=False
            ):
                yield _whole_steps(opened, decoded(batch), first_row + done), first_row + done
                done += batch.num_rows
        except (OSError, pa.ArrowException) as exc:
            message = f"row group {group} cannot be decoded ({one_line(exc)})"
            if reader.strict or metadata.num_row_groups == 1:
                raise InputError(f"{path}: {message}; the file is corrupt or truncated.") from exc
            reader.log.warnings.append(
                f"{path}: {message}; rows {first_row + done}–{first_row + group_rows - 1} skipped."
            )
            for row in range(first_row + done, first_row + group_rows):
                reader.log.skip(SkippedRow(path, row, None, f"row group {group} cannot be decoded"), False)
        first_row += group_rows


def _whole_steps(opened: OpenFile, batch: pa.RecordBatch, first_row: int) -> pa.RecordBatch:
    """``batch`` with a float step column as int64 (nulls kept). Raises DataError naming the first row whose
    step is not a whole number (2.5, inf, NaN)."""
    role = "step"
    name = opened.columns.get(role)
    if name is None or role in opened.columns.from_partition or name not in batch.schema.names:
        return batch
    index = batch.schema.get_field_index(name)
    values = batch.column(index)
    if pa.types.is_floating(values.type):
        numbers = values.to_numpy(zero_copy_only=False).astype(np.float64)  # nulls become NaN
        valid = values.is_valid().to_numpy(zero_copy_only=False)
        whole = np.isfinite(numbers) & (np.floor(numbers) == numbers)
        bad = np.flatnonzero(valid & ~whole)
        if len(bad):
            row = int(bad[0])
            raise DataError(
                f"{where(opened.source.path, first_row + row, name)}step {float(numbers[row])!r} is not a whole number."
            )
        as_integers = pa.array(np.where(valid, numbers, 0).astype(np.int64), pa.int64(), mask=~valid)
        batch = batch.set_column(index, name, as_integers)
    return batch


def _extra_values(opened: OpenFile, batch: pa.RecordBatch | pa.Table, index=None) -> dict[str, ExtraColumn]:
    """Each extra column's values per row (with ``index``: of those batch positions): a numpy array for numbers
    without nulls, else the Arrow array behind :class:`_ArrowValues` (only the worst rows are ever looked at)."""
    values: dict[str, ExtraColumn] = {}
    for name in opened.extras:
        array = batch.column(name)
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        if index is not None:
            array = array.take(pa.array(index))
        if (
            pa.types.is_list(array.type)
            or pa.types.is_large_list(array.type)
            or pa.types.is_fixed_size_list(array.type)
        ):
            values[name] = row_means(array)  # a per-token list (entropy): its row mean
        elif numeric_type(array.type) and not array.null_count:
            values[name] = array.to_numpy(zero_copy_only=False)
        else:
            values[name] = _ArrowValues(array)
    return values


def row_means(array: pa.Array) -> np.ndarray:
    """float64 [rows]: the mean of each row's list of numbers over its non-null elements (NaN for a null or empty
    list, or one of nulls only)."""
    lengths = pc.fill_null(pc.list_value_length(array), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    numbers = pc.fill_null(pc.list_flatten(array).cast(pa.float64()), math.nan).to_numpy(zero_copy_only=False)
    rows = np.repeat(np.arange(len(lengths)), lengths)
    finite = np.isfinite(numbers)
    sums = np.bincount(rows[finite], weights=numbers[finite], minlength=len(lengths))
    counts = np.bincount(rows[finite], minlength=len(lengths))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), math.nan)


class _ArrowValues:
    """One extra column's values, turned into Python one row at a time: text is not decoded for every row of
    every chunk when a dozen rows are kept. Null is None; text that is not UTF-8 is shown with replacements."""

    def __init__(self, array: pa.Array) -> None:
        self.array = array

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, row: int) -> Any:
        value = self.array[row]
        try:
            return value.as_py()
        except UnicodeDecodeError:  # an extra column is for display: show what can be shown, as token text does
            return value.as_buffer().to_pybytes().decode("utf-8", errors="replace")

    def take(self, rows: np.ndarray) -> _ArrowValues:
        return _ArrowValues(self.array.take(pa.array(rows)))


ExtraColumn = np.ndarray | _ArrowValues  # one extra column's values, one per row of a block


def _scalar_roles(opened: OpenFile, batch: pa.RecordBatch, first_row: int, rows: int, index=None):
    """step and sample_id per row (partition values and defaults filled in); with ``index``, only of those
    rows (positions within ``batch``)."""
    columns = opened.columns
    step_name = columns.get("step")
    if step_name is None:
        step = np.zeros(rows, dtype=np.int64)
    elif "step" in columns.from_partition:
        value = opened.source.partition[step_name]
        if not isinstance(value, int):
            raise ColumnError(f"{opened.source.path}: partition {step_name}={value} is not an integer step.")
        step = np.full(rows, value, dtype=np.int64)
    else:
        array = batch.column(step_name)
        if index is not None:
            array = array.take(pa.array(index))
        step = array.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    sid_name = columns.get("sample_id")
    if sid_name is None:  # the row number in the file
        sample_id = [str(first_row + i) for i in (range(rows) if index is None else index)]
    elif "sample_id" in columns.from_partition:
        sample_id = [str(opened.source.partition[sid_name])] * rows
    else:
        array = batch.column(sid_name)
        if index is not None:
            array = array.take(pa.array(index))
        try:
            sample_id = [str(v) for v in array.to_pylist()]
        except UnicodeDecodeError as exc:
            raise InputError(
                f"{where(opened.source.path, column=sid_name)}sample ids are not valid UTF-8 ({exc.reason}) "
                f"in rows from {first_row}; the file is corrupt."
            ) from exc
    return step, sample_id


def _policy_versions(opened: OpenFile, batch, first_row: int, rows, index=None) -> np.ndarray | None:
    """The policy_version of each row (int64), or None without that column; a null is a DataError like a null step.
    ``rows``: file rows of the batch positions (None: all, in order); ``index``: positions to take."""
    name = opened.columns.get("policy_version")
    if name is None or "policy_version" in opened.columns.from_partition:
        return None
    array = batch.column(name)
    if index is not None:
        array = array.take(pa.array(index))
    if array.null_count:
        bad = int(np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False))[0])
        row = first_row + (bad if rows is None else int(rows[bad]))
        raise DataError(f"{where(opened.source.path, row, name)}policy_version is null.")
    return array.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def _list_lengths(array: pa.Array) -> np.ndarray:
    """Each row's list length, -1 for a null list (int32 for a list, int64 for a large list). Without nulls these are
    the differences of the offsets: one numpy call instead of three compute calls a column and batch."""
    if isinstance(array, pa.ListArray | pa.LargeListArray) and not array.null_count:
        return np.diff(array.offsets.to_numpy())
    return pc.list_value_length(array).fill_null(-1).to_numpy(zero_copy_only=False)


def _flat_numpy(array: pa.Array) -> np.ndarray:
    return array.to_numpy(zero_copy_only=False)


# ---------------------------------------------------------------------------------- sequence layout
def read_sequences(opened: OpenFile, reader: DumpReader) -> Iterator[tuple[Block, int]]:
    names = opened.columns.names
    # Aim each batch at ~chunk_tokens tokens, from the uncompressed size of the rollout column.
    tokens_per_row = _estimate_tokens_per_row(opened)
    state = {"rows": max(1, int(reader.chunk_tokens / max(tokens_per_row, 1.0)))}

    for batch, first_row in row_groups(opened, column_names(opened), lambda: state["rows"], reader):
        rows = batch.num_rows
        if rows == 0:
            continue
        lists = {role: batch.column(names[role]) for role in ("rollout", "trainer", "mask") if role in names}
        lengths = {role: _list_lengths(array) for role, array in lists.items()}
        keep = np.ones(rows, dtype=bool)
        if reader.selection is not None:  # rows left out here are neither decoded nor validated
            keep = reader.selection(batch, _batch_steps(opened, batch, rows))
            reader.log.rows_selected_out += int(rows - keep.sum())
            if not keep.any():
                continue
        skipped = _Skipped(opened.source.path, first_row, keep)
        skipped.null_steps(_step_nulls(opened, batch), names)
        skipped.unreadable(batch)
        skipped.null_lists(lengths, names)
        skipped.ragged(lengths, names, reader)
        block = _sequence_block(opened, batch, first_row, lengths["rollout"], keep, skipped.rows)
        if block.lengths.size:  # the next batch aimed at ~chunk_tokens tokens from the rows of this one
            state["rows"] = max(1, int(reader.chunk_tokens / max(float(block.lengths.mean()), 1.0)))
        yield block, rows


class _Skipped:
    """The rows of a batch left out as they are found (``keep`` cleared), each with its reason, in order."""

    def __init__(self, path: str, first_row: int, keep: np.ndarray) -> None:
        self.path = path
        self.first_row = first_row
        self.keep = keep
        self.rows: list[SkippedRow] = []

    def add(self, row: int | np.integer, column: str, reason: str) -> None:
        self.keep[row] = False
        self.rows.append(SkippedRow(self.path, self.first_row + int(row), column, reason))

    def null_steps(self, step_nulls: np.ndarray | None, names: Mapping[str, str]) -> None:
        if step_nulls is not None:
            for row in np.flatnonzero(step_nulls & self.keep):
                self.add(row, names["step"], "null step")

    def unreadable(self, batch: pa.RecordBatch) -> None:
        """Rows a trainer format could not read (io/formats/base.py)."""
        if SKIP_REASON not in batch.schema.names:
            return
        reasons = batch.column(SKIP_REASON)
        for row in np.flatnonzero(reasons.is_valid().to_numpy(zero_copy_only=False) & self.keep):
            self.add(row, batch.column(SKIP_COLUMN)[int(row)].as_py(), reasons[int(row)].as_py())

    def null_lists(self, lengths: dict[str, np.ndarray], names: Mapping[str, str]) -> None:
        for role, length in lengths.items():
            for row in np.flatnonzero(self.keep & (length < 0)):
                self.add(row, names[role], "null list")

    def ragged(self, lengths: dict[str, np.ndarray], names: Mapping[str, str], reader: DumpReader) -> None:
        """Rows whose trainer or mask list is not as long as the rollout's (the offsets noted in the log)."""
        reference = lengths["rollout"]
        for role in ("trainer", "mask"):
            if role not in lengths:
                continue
            ragged = np.flatnonzero(self.keep & (lengths[role] != reference))
            if len(ragged):
                offsets = lengths[role][ragged] - reference[ragged]
                reader.log.note_length_offsets(role, names[role], names["rollout"], offsets)
            for row in ragged:
                reason = (
                    f"list length {int(lengths[role][row])} differs from {names['rollout']}'s {int(reference[row])}"
                )
                self.add(row, names[role], reason)


def _sequence_block(
    opened: OpenFile,
    batch: pa.RecordBatch,
    first_row: int,
    reference: np.ndarray,
    keep: np.ndarray,
    pending: list[SkippedRow],
) -> Block:
    """The kept rows of ``batch`` as a block (``reference``: each row's rollout list length)."""
    names = opened.columns.names
    rows = batch.num_rows
    index = None if keep.all() else np.flatnonzero(keep)
    step, sample_id = _scalar_roles(opened, batch, first_row, int(keep.sum()), index)
    if index is not None:
        batch = batch.take(pa.array(index))
    file_row = first_row + (np.arange(rows, dtype=np.int64) if index is None else index.astype(np.int64))
    lengths_kept = reference if index is None else reference[index]
    flat = {
        role: _flat_numpy(pc.list_flatten(batch.column(names[role])))
        for role in ("rollout", "trainer", "mask")
        if role in names
    }
    token_ids = _token_list(opened, batch, "token_ids", lengths_kept)
    text = _token_list(opened, batch, "tokens", lengths_kept)
    side = {role: _token_list(opened, batch, role, lengths_kept) for role in TOKEN_SIDE_ROLES}
    return Block(
        file=opened.source.path,
        file_row=file_row,
        step=step,
        sample_id=sample_id,
        lengths=lengths_kept.astype(np.int64, copy=False),
        trainer=flat["trainer"],
        rollout=flat["rollout"],
        mask=flat.get("mask"),
        token_ids=None if token_ids is None else _as_ids(_flat_numpy(token_ids)),
        token_text=text,
        policy_version=_policy_versions(opened, batch, first_row, index),
        names=names,
        extra=_extra_values(opened, batch),
        skipped=pending,
        token_columns={role: _side_values(role, values) for role, values in side.items() if values is not None},
    )


def _side_values(role: str, values: pa.Array | np.ndarray) -> np.ndarray:
    """A per-token side column as numpy: ids as int64 (nulls -1), kept masses as float64 (nulls NaN)."""
    flat = _flat_numpy(values) if isinstance(values, pa.Array | pa.ChunkedArray) else values
    if role == "kept_mass":
        return np.asarray(flat, dtype=np.float64)
    return _as_ids(flat)


def _token_list(opened: OpenFile, batch: pa.RecordBatch, role: str, lengths: np.ndarray) -> pa.Array | None:
    """The flattened token ids or texts of the kept rows, where the file has them with a row's every token."""
    names = opened.columns.names
    if role not in names or role in opened.columns.from_partition:
        return None
    column = batch.column(names[role])
    if not np.array_equal(_list_lengths(column), lengths):
        return None
    return pc.list_flatten(column)


def _estimate_tokens_per_row(opened: OpenFile) -> float:
    if not isinstance(opened.parquet, ParquetSource):  # a trainer format's rows: no column statistics
        return 256.0
    metadata = opened.parquet.metadata
    if metadata.num_rows == 0 or metadata.num_row_groups == 0:
        return 256.0
    name = opened.columns.names["rollout"]
    group = metadata.row_group(0)
    for index in range(group.num_columns):
        column = group.column(index)
        if column.path_in_schema.split(".")[0] == name:
            bytes_per_value = 4.0
            return max(column.total_uncompressed_size / bytes_per_value / max(group.num_rows, 1), 1.0)
    return 256.0


# ---------------------------------------------------------------------------------- token layout
def read_tokens(opened: OpenFile, reader: DumpReader) -> Iterator[tuple[Block, int]]:
    """Group consecutive tokens of one (step, sample_id) into a row; the last group waits for the next batch.

    The batch after the current one is read before the current one is cut, so that the last sequence of a
    file travels with the rows before it: a file read in one batch gives one block, as in the sequence layout
    (the same chunks, hence the same float64 sums to the last bit).
    """
    finished: set[tuple[int, str]] = set()
    carry: pa.Table | None = None
    carry_first_row = 0
    batch_rows = lambda: reader.chunk_tokens  # noqa: E731 - one row per token
    batches = row_groups(opened, column_names(opened), batch_rows, reader)
    item = next(batches, None)
    while item is not None:
        batch, first_row = item
        item = next(batches, None)
        table = pa.Table.from_batches([batch])
        if carry is not None:  # the unfinished last sequence of the batch before (always adjacent: see below)
            table = pa.concat_tables([carry, table])
            first_row = carry_first_row
        carry = None
        if table.num_rows == 0:
            continue
        boundary = np.flatnonzero(_sequence_changes(opened, table)) + 1
        starts = np.concatenate([[0], boundary])
        ends = np.concatenate([boundary, [table.num_rows]])
        # The last run may go on in the next batch, unless there is none or rows between could not be decoded.
        last_continues = item is not None and item[1] == first_row + table.num_rows
        complete = len(starts) - 1 if last_continues else len(starts)
        if complete == 0:
            carry, carry_first_row = table, first_row
            continue
        cut = int(ends[complete - 1])
        head = table if cut == table.num_rows else table.slice(0, cut)
        yield (
            _selected(_token_block(opened, head, first_row, (ends - starts)[:complete], finished, reader), reader),
            cut,
        )
        if cut < table.num_rows:
            carry, carry_first_row = table.slice(cut), first_row + cut


def _batch_steps(opened: OpenFile, table: pa.Table | pa.RecordBatch, rows: int) -> np.ndarray:
    """Each row's step, for a row selection (a null step reads as a neighbour's: the row is skipped later anyway)."""
    name = opened.columns.get("step")
    if name is None:
        return np.zeros(rows, dtype=np.int64)
    if "step" in opened.columns.from_partition:
        value = opened.source.partition[name]
        return np.full(rows, value if isinstance(value, int) else 0, dtype=np.int64)
    return _filled_step(table.column(name)).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def _selected(block: Block, reader: DumpReader) -> Block:
    """Token layout: the block's rows (sequences) that the row selection keeps, judged on their per-row values."""
    if reader.selection is None or not len(block.lengths):
        return block
    columns = {
        name: pa.array(values) if isinstance(values, np.ndarray) else values.array
        for name, values in block.extra.items()
    }
    for role, values in (("step", block.step), ("sample_id", block.sample_id)):
        name = block.names.get(role)
        if name is not None and name not in columns:
            columns[name] = pa.array(values)
    keep = reader.selection(pa.table(columns) if columns else pa.table({"_": np.zeros(len(block.lengths))}), block.step)
    reader.log.rows_selected_out += int(len(keep) - keep.sum())
    return block if keep.all() else drop_rows(block, np.flatnonzero(~keep))


def _step_nulls(opened: OpenFile, table: pa.Table | pa.RecordBatch) -> np.ndarray | None:
    """bool [n]: rows whose step is null; None when there is none (or no step column)."""
    name = opened.columns.get("step")
    if name is None or "step" in opened.columns.from_partition or not table.column(name).null_count:
        return None
    return table.column(name).is_null().to_numpy(zero_copy_only=False)


def _filled_step(values: pa.Array) -> pa.Array:
    """Null steps take a neighbour's value, so that a null inside a sequence does not cut it in two (the
    sequence is then skipped as a whole, with the null's row)."""
    return pc.fill_null_backward(pc.fill_null_forward(values)).fill_null(0)


def _sequence_changes(opened: OpenFile, table: pa.Table) -> np.ndarray:
    """bool [n − 1]: token i + 1 starts another (step, sample_id) than token i. Compared in Arrow, so
    millions of sample ids are never turned into Python strings."""
    changes = np.zeros(max(table.num_rows - 1, 0), dtype=bool)
    columns = opened.columns
    for role in ("step", "sample_id"):
        name = columns.get(role)
        if name is None or role in columns.from_partition or table.num_rows < 2:
            continue
        values = table.column(name).combine_chunks()
        if role == "step" and values.null_count:
            values = _filled_step(values)
        differs = pc.not_equal(values.slice(1), values.slice(0, table.num_rows - 1))
        changes |= differs.fill_null(True).to_numpy(zero_copy_only=False)  # a null starts a run: caught there
    return changes


def _token_block(
    opened: OpenFile,
    table: pa.Table,
    first_row: int,
    run_lengths: np.ndarray,
    finished: set[tuple[int, str]],
    reader: DumpReader,
) -> Block:
    path = opened.source.path
    names = opened.columns.names
    run_starts = np.concatenate([[0], np.cumsum(run_lengths)[:-1]]).astype(np.int64)
    run_id = np.repeat(np.arange(len(run_lengths)), run_lengths)
    skipped: list[SkippedRow] = []
    step_nulls = _step_nulls(opened, table)
    null_runs = np.zeros(0, dtype=np.int64)
    if step_nulls is not None:
        step_index = table.schema.get_field_index(names["step"])
        table = table.set_column(step_index, names["step"], _filled_step(table.column(step_index).combine_chunks()))
        null_tokens = np.flatnonzero(step_nulls)
        null_runs, first_null = np.unique(run_id[null_tokens], return_index=True)
        skipped += [SkippedRow(path, first_row + int(null_tokens[i]), names["step"], "null step") for i in first_null]
    step, sample_id = _scalar_roles(opened, table, first_row, len(run_starts), index=run_starts)
    for i, key in enumerate(zip(step.tolist(), sample_id, strict=True)):
        if i in null_runs:
            continue
        if key in finished:
            raise InputError(
                f"{where(path, first_row + int(run_starts[i]), names['sample_id'])}tokens of sample '{key[1]}' "
                f"(step {key[0]}) appear again after other samples.",
                hint="token layout needs each sequence's tokens together: sort the dump by step, sample_id, position.",
            )
        finished.add(key)

    def column(role: str) -> np.ndarray | None:
        name = names.get(role)
        if name is None or role in opened.columns.from_partition:
            return None
        return _flat_numpy(table.column(name).combine_chunks())

    trainer, rollout = (_flat_numpy(table.column(names[role]).combine_chunks()) for role in ("trainer", "rollout"))
    mask = column("mask")
    token_ids = column("token_ids")
    side = {role: values for role in TOKEN_SIDE_ROLES if (values := column(role)) is not None}
    text = None
    if "tokens" in names and "tokens" not in opened.columns.from_partition:
        text = table.column(names["tokens"]).combine_chunks()
    token_rows = first_row + np.arange(table.num_rows, dtype=np.int64)
    position = column("position")
    duplicate_rows = np.zeros(0, dtype=np.int64)
    if position is not None:
        # Order tokens by position within each row; duplicates make a row unusable.
        order = np.lexsort((position, run_id))
        ordered, ordered_run = position[order], run_id[order]
        duplicate_rows = np.unique(
            ordered_run[1:][(ordered[1:] == ordered[:-1]) & (ordered_run[1:] == ordered_run[:-1])]
        )
        if not np.array_equal(order, np.arange(len(order))):
            trainer, rollout, token_rows = trainer[order], rollout[order], token_rows[order]
            mask = None if mask is None else mask[order]
            token_ids = None if token_ids is None else token_ids[order]
            side = {role: values[order] for role, values in side.items()}
            text = None if text is None else text.take(pa.array(order))
    block = Block(
        file=path,
        file_row=first_row + run_starts,
        step=step,
        sample_id=sample_id,
        lengths=run_lengths.astype(np.int64),
        trainer=trainer,
        rollout=rollout,
        mask=mask,
        token_ids=_as_ids(token_ids),
        token_columns={role: _side_values(role, values) for role, values in side.items()},
        token_text=text,
        policy_version=_policy_versions(opened, table, first_row, run_starts, index=run_starts),
        names=names,
        extra=_extra_values(opened, table, index=run_starts),
        token_rows=token_rows,
        skipped=skipped
        + [
            SkippedRow(path, first_row + int(run_starts[row]), names["position"], "duplicate token position")
            for row in np.setdiff1d(duplicate_rows, null_runs)
        ],
    )
    bad_rows = np.union1d(duplicate_rows, null_runs)
    return drop_rows(block, bad_rows) if bad_rows.size else block


def drop_rows(block: Block, rows: np.ndarray) -> Block:
    """The block without ``rows`` (possibly empty); its pending skip records stay with it."""
    keep_row = np.ones(len(block.lengths), dtype=bool)
    keep_row[rows] = False
    keep_token = np.repeat(keep_row, block.lengths)
    kept = np.flatnonzero(keep_row)
    return Block(
        file=block.file,
        file_row=block.file_row[kept],
        step=block.step[kept],
        sample_id=[block.sample_id[i] for i in kept],
        lengths=block.lengths[kept],
        trainer=block.trainer[keep_token],
        rollout=block.rollout[keep_token],
        mask=None if block.mask is None else block.mask[keep_token],
        token_ids=None if block.token_ids is None else block.token_ids[keep_token],
        token_text=None if block.token_text is None else block.token_text.take(pa.array(np.flatnonzero(keep_token))),
        policy_version=None if block.policy_version is None else block.policy_version[kept],
        names=block.names,
        extra={name: _take(values, kept) for name, values in block.extra.items()},
        token_rows=None if block.token_rows is None else block.token_rows[keep_token],
        skipped=block.skipped,
        token_columns={role: values[keep_token] for role, values in block.token_columns.items()},
    )


def _take(values: ExtraColumn, rows: np.ndarray) -> ExtraColumn:
    return values[rows] if isinstance(values, np.ndarray) else values.take(rows)


@overload
def _as_ids(values: np.ndarray) -> np.ndarray: ...


@overload
def _as_ids(values: None) -> None: ...


def _as_ids(values: np.ndarray | None) -> np.ndarray | None:
    """Token ids as int64; nulls (read as NaN) become -1."""
    if values is None:
        return None
    if values.dtype.kind == "f":
        values = np.where(np.isnan(values), -1, values)
    return values.astype(np.int64, copy=False)


# ---------------------------------------------------------------------------------- steps per block
# A chunk's per-step partial state is allocated for every step it holds (rounds and positions: ~6 KB a step), so a
# block of 128K one-row steps cost ~1 GB in partials alone. Blocks are cut so that one holds at most this many
# steps: only at a change of step, so each step's rows in a block stay together and are summed in the same order.
MAX_BLOCK_STEPS = 4096


def split_steps(block: Block, max_steps: int = MAX_BLOCK_STEPS) -> list[Block]:
    """``block`` as consecutive blocks of at most ``max_steps`` runs of one step each (the block itself when it holds
    no more). Each skip record found while decoding goes with the piece whose rows surround it."""
    changes = np.flatnonzero(block.step[1:] != block.step[:-1]) + 1  # where a run of one step begins
    if changes.shape[0] < max_steps:
        return [block]
    cuts = [0, *changes[max_steps - 1 :: max_steps].tolist(), len(block.lengths)]
    offsets = np.zeros(len(block.lengths) + 1, dtype=np.int64)
    np.cumsum(block.lengths, out=offsets[1:])
    starts = block.file_row[cuts[1:-1]]
    owner = np.searchsorted(starts, [-1 if skip.row is None else skip.row for skip in block.skipped], side="right")
    owner = owner.tolist()
    pieces = []
    for piece, (begin, end) in enumerate(itertools.pairwise(cuts)):
        rows = np.arange(begin, end)
        first, last = int(offsets[begin]), int(offsets[end])
        pieces.append(
            Block(
                file=block.file,
                file_row=block.file_row[begin:end],
                step=block.step[begin:end],
                sample_id=block.sample_id[begin:end],
                lengths=block.lengths[begin:end],
                trainer=block.trainer[first:last],
                rollout=block.rollout[first:last],
                mask=None if block.mask is None else block.mask[first:last],
                token_ids=None if block.token_ids is None else block.token_ids[first:last],
                token_text=None if block.token_text is None else block.token_text.slice(first, last - first),
                policy_version=None if block.policy_version is None else block.policy_version[begin:end],
                names=block.names,
                extra={name: _take(values, rows) for name, values in block.extra.items()},
                token_rows=None if block.token_rows is None else block.token_rows[first:last],
                token_columns={role: values[first:last] for role, values in block.token_columns.items()},
                skipped=[skip for skip, at in zip(block.skipped, owner, strict=True) if at == piece],
            )
        )
    return pieces
