"""``convert``: any readable input (a trainer format, or Parquet) to the canonical sequence layout.

The same batches the reader analyses are written out (verl's column names, ``schemas/dump.schema.json``),
zstd-compressed, one row group per step: a file, or with ``partition="step"`` a hive directory
``OUT/step=N/part-K.parquet`` (the step lives in the path). Logprobs are written as float64 lists, so no
value changes; invalid values (NaN, null, positive logprobs, bad masks) are written as they are, so that
``analyze`` skips the same rows on the converted file. Only rows a format could not read at all (a line
that is not JSON, a field of the wrong type) are left out, and reported. Per-row scalar columns that no role
takes (reward, advantage, a tag: every one, beyond the 16 ``analyze`` shows) are written under their own names
and types, and a ``policy_version`` column (by its role) as ``policy_version``; a file that lacks one another
file has gets nulls there.

Memory: one step's rows (a row group is written whole).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rollout_diag.errors import ConfigError, InputError, option_name, where
from rollout_diag.io.columns import parquet_options
from rollout_diag.io.decode import row_groups
from rollout_diag.io.formats.base import SKIP_COLUMN, SKIP_REASON
from rollout_diag.io.opening import OpenFile, column_names, extra_cap_warnings, one_line
from rollout_diag.io.outputs import check_outputs, commit, discard, temporary_beside
from rollout_diag.io.reader import DEFAULT_CHUNK_TOKENS, DumpReader
from rollout_diag.results import SkippedRow, repr_inputs, repr_text, short_repr

PARTITIONS = ("step",)
POLICY_VERSION = "policy_version"  # the canonical name of that role (schemas/dump.schema.json)
_TYPES = {
    "rollout": ("rollout_log_probs", pa.list_(pa.float64())),
    "trainer": ("old_log_probs", pa.list_(pa.float64())),
    "mask": ("response_mask", pa.list_(pa.int8())),
    "token_ids": ("token_ids", pa.list_(pa.int64())),
    "tokens": ("tokens", pa.list_(pa.string())),
}


@dataclass(frozen=True)
class ConvertResult:
    """What ``convert`` read and wrote."""

    inputs: list[str]
    format: str
    output: str
    files: list[str]  # the Parquet files written
    rows: int
    steps: list[int]
    warnings: list[str] = field(default_factory=list)
    skipped: list[SkippedRow] = field(default_factory=list)
    skipped_rows: int = 0

    def to_json(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {**asdict(self), "skipped": [asdict(s) for s in self.skipped]}

    def __repr__(self) -> str:
        return short_repr(
            "ConvertResult",
            f"{self.rows:,} rows of {len(self.steps):,} steps",
            f"{len(self.files):,} files written in {repr_text(self.output)}",
            f"format {self.format}, {self.skipped_rows:,} rows skipped",
            repr_inputs(self.inputs),
        )


class _StepWriter:
    """Collects one step's rows and writes them as one row group (or one hive file) when the step ends."""

    def __init__(self, output: Path, schema: pa.Schema, partition: str | None) -> None:
        self.output, self.schema, self.partition = output, schema, partition
        self.writer: pq.ParquetWriter | None = None
        self.step: int | None = None
        self.pending: list[pa.Table] = []
        self.files: list[str] = []
        self.rows = 0
        self.written: dict[int, int] = {}  # step -> row groups (or files) written for it

    def add(self, step: int, table: pa.Table) -> None:
        if step != self.step:
            self.flush()
            self.step = step
        self.pending.append(table)

    def flush(self) -> None:
        if self.step is None or not self.pending:
            return
        table = pa.concat_tables(self.pending)
        self.pending = []
        part = self.written.get(self.step, 0)
        self.written[self.step] = part + 1
        self.rows += table.num_rows
        if self.partition is None:
            if self.writer is None:
                self.writer = pq.ParquetWriter(self.output, self.schema, **parquet_options(self.schema, "zstd"))
                self.files.append(str(self.output))
            self.writer.write_table(table, row_group_size=max(table.num_rows, 1))
            return
        directory = self.output / f"{self.partition}={self.step}"
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"part-{part}.parquet"
        table = table.drop_columns(["step"])
        pq.write_table(table, path, row_group_size=max(table.num_rows, 1), **parquet_options(table.schema, "zstd"))
        self.files.append(str(path))

    def close(self) -> None:
        self.flush()
        if self.writer is not None:
            self.writer.close()

    def abandon(self) -> None:
        """Close the open file without writing what is pending (the run failed)."""
        self.pending = []
        if self.writer is not None:
            self.writer.close()


def convert(
    inputs: str | Path | Sequence[str | Path],
    output: str | Path,
    *,
    partition: str | None = None,
    columns: Mapping[str, str] | None = None,
    strict: bool = False,
    input_format: str | None = None,
    trust_pickle: bool | None = None,
    overwrite: bool = False,
) -> ConvertResult:
    """Write ``inputs`` to ``output`` in the canonical sequence layout; returns what was written.

    Raises ConfigError for a bad partition or an existing output (unless ``overwrite``), InputError for
    unreadable input (and, under ``strict``, DataError for the first unreadable row).
    """
    if partition is not None and partition not in PARTITIONS:
        raise ConfigError(f"{option_name('partition')}={partition}: only 'step' is supported.")
    output = Path(output)
    paths = [str(inputs)] if isinstance(inputs, (str, Path)) else [str(path) for path in inputs]
    _check_output(output, paths, overwrite)
    reader = DumpReader(
        paths,
        columns,
        strict=strict,
        chunk_tokens=DEFAULT_CHUNK_TOKENS,
        input_format=input_format,
        trust_pickle=trust_pickle,
    )
    if reader.log.layout != "sequence":
        raise InputError(
            f"{reader.log.files[0]}: token layout (one row per token); convert writes sequence-layout sources.",
            hint="analyse token-layout Parquet directly: it is already a layout rollout-diag reads.",
        )
    if output.parent != Path(""):
        output.parent.mkdir(parents=True, exist_ok=True)
    schema, clashes = _schema(reader.files)
    # written beside OUT and renamed over it when complete: a failed run leaves OUT (if any) as it was
    temporary = temporary_beside(output, directory=partition is not None)
    writer = _StepWriter(temporary, schema, partition)
    try:
        _write_steps(reader, schema, writer)
        writer.close()
        if writer.writer is None and partition is None:  # no row at all: still an (empty) Parquet file
            pq.write_table(schema.empty_table(), temporary, compression="zstd")
        commit(temporary, output)
    except BaseException:
        writer.abandon()
        discard(temporary)
        raise
    written = [str(output / Path(path).relative_to(temporary)) if partition else str(output) for path in writer.files]
    return ConvertResult(
        inputs=list(reader.log.files),
        format=reader.log.format,
        output=str(output),
        files=written,
        rows=writer.rows,
        steps=sorted(writer.written),
        warnings=_warnings(reader, writer, clashes),
        skipped=list(reader.log.skipped),
        skipped_rows=reader.log.skipped_rows,
    )


def _check_output(output: Path, paths: list[str], overwrite: bool) -> None:
    """Raises ConfigError for an output that would replace an input, or that exists (unless ``overwrite``)."""
    # before anything is read or written: --overwrite must never replace (or delete) an input
    check_outputs({option_name("output"): output}, paths, directories=(option_name("output"),))
    if os.path.lexists(output) and not overwrite:
        raise ConfigError(
            f"{output}: already exists.", hint=f"choose another path, or pass {option_name('overwrite')}."
        )


def _write_steps(reader: DumpReader, schema: pa.Schema, writer: _StepWriter) -> None:
    """Every file's rows in canonical form, handed to ``writer`` a run of one step at a time."""
    for opened in reader.files:
        names = column_names(opened) + [name for name in _all_extras(opened) if name not in opened.extras]
        for batch, first_row in row_groups(opened, names, lambda: 4096, reader):
            table = _canonical(opened, batch, first_row, reader, schema)
            steps = table.column("step").to_numpy()
            starts = np.concatenate([[0], np.flatnonzero(steps[1:] != steps[:-1]) + 1, [len(steps)]])
            for start, end in itertools.pairwise(starts):
                writer.add(int(steps[start]), table.slice(int(start), int(end - start)))


def _warnings(reader: DumpReader, writer: _StepWriter, clashes: list[str]) -> list[str]:
    """The reader's warnings that apply to a conversion, the name clashes, and steps written in several places."""
    repeated = sorted(step for step, parts in writer.written.items() if parts > 1)
    # the reader's notes on extra columns its tables leave out do not apply: convert writes every one
    not_shown = set(extra_cap_warnings(reader.files))
    warnings = [line for line in reader.log.warnings if line not in not_shown] + clashes
    if repeated:
        warnings.append(
            f"step(s) {', '.join(map(str, repeated[:10]))} appear in more than one place in the input order: "
            "each such step spans several row groups (files)."
        )
    return warnings


def _all_extras(opened: OpenFile) -> list[str]:
    """Every per-row scalar column no role takes, in file order: those ``analyze`` carries, those beyond its cap
    of 16, and long text it leaves out of its tables."""
    return [*opened.extras, *opened.extras_left_out, *(name for name, _ in opened.extras_long)]


def _schema(files: list[OpenFile]) -> tuple[pa.Schema, list[str]]:
    """The output schema: the canonical columns present in any file, then policy_version, then every extra column
    in order of appearance (with the first file's type); and one warning per extra column left out because the
    canonical layout uses its name for a role."""
    fields = [pa.field("step", pa.int64()), pa.field("sample_id", pa.string())]
    roles = {role for opened in files for role in opened.columns.names}
    fields += [pa.field(name, data_type) for role, (name, data_type) in _TYPES.items() if role in roles]
    if "policy_version" in roles:
        fields.append(pa.field(POLICY_VERSION, pa.int64()))
    canonical = {field.name for field in fields}
    extras: dict[str, pa.Field] = {}
    clashes: dict[str, list[str]] = {}
    for opened in files:
        for name in _all_extras(opened):
            if name in canonical:
                clashes.setdefault(name, []).append(opened.source.path)
            elif name not in extras:
                extras[name] = pa.field(name, opened.parquet.schema_arrow.field(name).type)
    warnings = [
        f"{_listed(paths)}: column '{name}' is not written: the canonical layout uses that name for a role."
        for name, paths in clashes.items()
    ]
    return pa.schema([*fields, *extras.values()]), warnings


def _listed(paths: list[str]) -> str:
    return ", ".join(paths[:3]) + (f" (and {len(paths) - 3} more)" if len(paths) > 3 else "")


def _canonical(opened: OpenFile, batch: pa.RecordBatch, first_row: int, reader: DumpReader, schema: pa.Schema):
    """The batch under canonical names and types; rows the format could not read are logged and dropped."""
    path = opened.source.path
    batch, rows = _readable(opened, batch, first_row, reader)
    arrays: dict[str, pa.Array] = {
        "step": _steps(opened, batch, first_row, rows),
        "sample_id": _sample_ids(opened, batch, first_row, rows),
        **_roles(opened, batch, schema),
    }
    if POLICY_VERSION in schema.names:
        arrays[POLICY_VERSION] = _policy_versions(opened, batch, schema)
    mine = set(_all_extras(opened))
    for output in schema:
        if output.name not in arrays:
            arrays[output.name] = _column(batch, output.name if output.name in mine else None, output, path)
    return pa.table([arrays[name] for name in schema.names], schema=schema)


def _readable(
    opened: OpenFile, batch: pa.RecordBatch, first_row: int, reader: DumpReader
) -> tuple[pa.RecordBatch, np.ndarray]:
    """The rows of ``batch`` the format could read, and their numbers in it; the others logged as skipped."""
    rows = np.arange(batch.num_rows, dtype=np.int64)
    if SKIP_REASON not in batch.schema.names:
        return batch, rows
    reasons = batch.column(SKIP_REASON)
    unreadable = reasons.is_valid().to_numpy(zero_copy_only=False)
    for row in np.flatnonzero(unreadable):
        reason, column = reasons[int(row)].as_py(), batch.column(SKIP_COLUMN)[int(row)].as_py()
        reader.log.skip(SkippedRow(opened.source.path, first_row + int(row), column, reason), reader.strict)
    rows = rows[~unreadable]
    return batch.take(pa.array(rows)), rows


def _steps(opened: OpenFile, batch: pa.RecordBatch, first_row: int, rows: np.ndarray) -> pa.Array:
    """The step column: 0 without one, the partition's, or the file's (raises InputError for a null step)."""
    names, count = opened.columns.names, batch.num_rows
    if "step" not in names:
        return pa.array(np.zeros(count, dtype=np.int64))
    if "step" in opened.columns.from_partition:
        return pa.array(np.full(count, int(opened.source.partition[names["step"]]), dtype=np.int64))
    step = batch.column(names["step"])
    if step.null_count:
        bad = int(np.flatnonzero(step.is_null().to_numpy(zero_copy_only=False))[0])
        raise InputError(f"{where(opened.source.path, first_row + int(rows[bad]), names['step'])}step is null.")
    return step.cast(pa.int64())


def _sample_ids(opened: OpenFile, batch: pa.RecordBatch, first_row: int, rows: np.ndarray) -> pa.Array:
    """The sample id column: the row number without one, the partition's, or the file's as strings."""
    names = opened.columns.names
    if "sample_id" not in names:
        return pa.array([str(first_row + int(row)) for row in rows], pa.string())
    if "sample_id" in opened.columns.from_partition:
        return pa.array([str(opened.source.partition[names["sample_id"]])] * batch.num_rows, pa.string())
    return pc.cast(batch.column(names["sample_id"]), pa.string())


def _roles(opened: OpenFile, batch: pa.RecordBatch, schema: pa.Schema) -> dict[str, pa.Array]:
    """The columns of the roles the output holds, cast to their canonical types (nulls where this file has none)."""
    names, from_partition = opened.columns.names, opened.columns.from_partition
    arrays: dict[str, pa.Array] = {}
    for role, (name, data_type) in _TYPES.items():
        if name not in schema.names:
            continue
        if role not in names or role in from_partition:
            arrays[name] = pa.nulls(batch.num_rows, data_type)
            continue
        try:
            arrays[name] = batch.column(names[role]).cast(data_type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise InputError(
                f"{where(opened.source.path, column=names[role])}cannot be written as {data_type} ({exc}).",
                hint="analyse this file directly; convert needs 0/1 masks and numeric logprobs.",
            ) from exc
    return arrays


def _policy_versions(opened: OpenFile, batch: pa.RecordBatch, schema: pa.Schema) -> pa.Array:
    """The policy version column: the partition's, or the file's cast to the output's type."""
    names = opened.columns.names
    if "policy_version" in opened.columns.from_partition:
        version = int(opened.source.partition[names["policy_version"]])
        return pa.array(np.full(batch.num_rows, version, dtype=np.int64))
    return _column(batch, names.get("policy_version"), schema.field(POLICY_VERSION), opened.source.path)


def _column(batch: pa.RecordBatch, name: str | None, output: pa.Field, path: str) -> pa.Array:
    """Column ``name`` of ``batch`` cast to the output field's type; nulls where this file has no such column."""
    if name is None:
        return pa.nulls(batch.num_rows, output.type)
    try:
        return batch.column(name).cast(output.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise InputError(
            f"{where(path, column=name)}cannot be written as {output.type}, the type of '{output.name}' in the "
            f"first file that has it ({one_line(exc)}).",
            hint="convert the files whose types differ separately.",
        ) from exc
