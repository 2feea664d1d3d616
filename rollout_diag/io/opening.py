"""Opening one input file: its schema, which column plays which role, its layout (sequence or token), the extra
per-row columns it carries, and the warnings an opened file can earn before any row is read."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rollout_diag.errors import ColumnError, InputError, option_name, where
from rollout_diag.io.columns import ROLE_CANDIDATES, ColumnMap, resolve_columns
from rollout_diag.io.formats import FORMAT_NAMES, PARQUET, open_source
from rollout_diag.io.formats.base import SKIP_COLUMN, SKIP_REASON, ParquetSource, RowsFile
from rollout_diag.io.readlog import listed_names
from rollout_diag.io.sources import Source
from rollout_diag.io.storage import is_remote, open_file

# Per-row scalar columns no role takes (reward, advantage, …) ride along to the worst rows; a dump with hundreds of
# metadata columns would decode them all for every row, so only the first ones (in file order) are carried.
MAX_EXTRA_COLUMNS = 16


# Text columns averaging more than this per row (a prompt, a response) are not per-row labels: not carried.
MAX_EXTRA_TEXT_BYTES = 256


_PANDAS_INDEX = re.compile(r"__index_level_\d+__")  # what DataFrame.to_parquet adds for a non-default index


@dataclass(frozen=True)
class OpenFile:
    source: Source
    parquet: ParquetSource | RowsFile  # the members of a pyarrow ParquetFile the reader uses (io/formats/base.py)
    columns: ColumnMap
    layout: str
    mask_candidates: tuple[str, ...] = ()  # without a mask column: integer/bool '*mask*' columns of the layout's shape
    extras: tuple[str, ...] = ()  # per-row scalar columns carried to the worst rows (at most MAX_EXTRA_COLUMNS)
    extras_left_out: tuple[str, ...] = ()  # further such columns, beyond the cap
    extras_long: tuple[tuple[str, float], ...] = ()  # (text column, bytes per row) not carried: too long


# ------------------------------------------------------------------------------------------- opening
def _plain(data_type: pa.DataType) -> pa.DataType:
    """The value type of a dictionary type (what polars writes for Categorical / Enum), else the type itself."""
    return data_type.value_type if pa.types.is_dictionary(data_type) else data_type


def _kind(data_type: pa.DataType) -> tuple[bool, pa.DataType]:
    """(is a list type, element type), dictionary encoding looked through."""
    data_type = _plain(data_type)
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type) or pa.types.is_fixed_size_list(data_type):
        return True, _plain(data_type.value_type)
    return False, data_type


def _decoded_type(data_type: pa.DataType) -> pa.DataType | None:
    """The type to cast a dictionary-encoded column (or list of one) to; None when it is not encoded."""
    if pa.types.is_dictionary(data_type):
        return data_type.value_type
    if pa.types.is_list(data_type) and pa.types.is_dictionary(data_type.value_type):
        return pa.list_(data_type.value_type.value_type)
    if pa.types.is_large_list(data_type) and pa.types.is_dictionary(data_type.value_type):
        return pa.large_list(data_type.value_type.value_type)
    return None


def decoded(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with dictionary-encoded columns decoded, so both encodings read (and compare) the same."""
    casts = {i: _decoded_type(f.type) for i, f in enumerate(batch.schema)}
    if not any(casts.values()):
        return batch
    arrays = [column if casts[i] is None else column.cast(casts[i]) for i, column in enumerate(batch.columns)]
    return pa.RecordBatch.from_arrays(arrays, names=batch.schema.names)


def _type_name(data_type: pa.DataType) -> str:
    """Arrow type as a user writes it: list<string>, not list<element: string>."""
    is_list, element = _kind(data_type)
    return f"list<{_type_name(element)}>" if is_list else str(data_type)


def numeric_type(data_type: pa.DataType) -> bool:
    return pa.types.is_floating(data_type) or pa.types.is_integer(data_type) or pa.types.is_boolean(data_type)


_ELEMENT_CHECKS = {
    "rollout": (pa.types.is_floating, "float"),
    "trainer": (pa.types.is_floating, "float"),
    "mask": (numeric_type, "int, bool or float 0/1"),
    "token_ids": (pa.types.is_integer, "int"),
    "rollout_token_ids": (pa.types.is_integer, "int"),
    "kept_mass": (pa.types.is_floating, "float"),
    "tokens": (lambda t: pa.types.is_string(t) or pa.types.is_large_string(t), "string"),
}


def open_input(
    source: Source, overrides: Mapping[str, str] | None, input_format: str = PARQUET, trust_pickle: bool = False
) -> OpenFile:
    parquet, schema = _open_rows(source, input_format, trust_pickle)
    columns = resolve_columns(source.path, schema.names, overrides, source.partition.keys())
    is_list, _ = _kind(schema.field(columns.names["rollout"]).type)
    layout = "sequence" if is_list else "token"
    _check_element_types(source.path, schema, columns, is_list)
    _check_integer_roles(source.path, schema, columns)
    columns = _checked_prompt_column(source.path, schema, columns, "prompt_id" in (overrides or {}))
    if layout == "token" and "sample_id" not in columns:
        raise ColumnError(
            f"{source.path}: token layout (one row per token) needs a sample_id column to group tokens into rows.",
            hint=f"name it with {option_name('columns')} sample_id=<name>.",
        )
    candidates = () if "mask" in columns else _mask_candidates(schema, columns, is_list)
    extras = _extra_columns(schema, columns)
    prompt = prompt_extra(columns)
    long_text = tuple(
        (name, size)
        for name in extras
        if name != prompt  # an id, however long, is read for its key
        and _text(_kind(schema.field(name).type)[1])
        and (size := _bytes_per_row(parquet, name)) is not None
        and size > MAX_EXTRA_TEXT_BYTES
    )
    extras = tuple(name for name in extras if name not in dict(long_text))
    return OpenFile(
        source=source,
        parquet=parquet,
        columns=columns,
        layout=layout,
        mask_candidates=candidates,
        # the cap never leaves the prompt id out: its key is read from there
        extras=extras[:MAX_EXTRA_COLUMNS] + tuple(name for name in extras[MAX_EXTRA_COLUMNS:] if name == prompt),
        extras_left_out=tuple(name for name in extras[MAX_EXTRA_COLUMNS:] if name != prompt),
        extras_long=long_text,
    )


def _open_rows(source: Source, input_format: str, trust_pickle: bool) -> tuple[Any, pa.Schema]:
    """The file opened as Parquet or its trainer format, and its schema; raises InputError saying what the file
    looks like instead (text, a Parquet file without its footer)."""
    try:
        parquet = open_source(source, input_format, trust_pickle)
        schema = parquet.schema_arrow
    except (OSError, pa.ArrowException, UnicodeDecodeError, ValueError) as exc:
        kind = "Parquet" if input_format == PARQUET else input_format
        unfinished = input_format == PARQUET and _unfinished_parquet(source.path)
        found = _text_kind(source.path) if input_format == PARQUET else None
        if found is not None:
            raise InputError(
                f"{source.path}: {found}, not Parquet. rollout-diag reads Parquet dumps and the trainer formats "
                f"{', '.join(FORMAT_NAMES[1:])}.",
                hint=f"write the dump as Parquet (pandas: df.to_parquet), or name its format with "
                f"{option_name('input_format')}; `rollout-diag convert` turns a trainer's own files into Parquet.",
            ) from exc
        raise InputError(
            f"{source.path}: not a readable {kind} file ({one_line(exc)}).",
            hint="it starts as Parquet but has no footer: was a DumpWriter killed before close()? Use the directory "
            "mode (DumpWriter('run/')): each step's file is complete once written."
            if unfinished
            else None,
        ) from exc
    return parquet, schema


def _check_element_types(path: str, schema: pa.Schema, columns: ColumnMap, is_list: bool) -> None:
    """Raises ColumnError for a role's column that is not of the layout's shape or its element type."""
    layout = "sequence" if is_list else "token"
    for role, (check, expected) in _ELEMENT_CHECKS.items():
        name = columns.get(role)
        if name is None or role in columns.from_partition:
            continue
        data_type = schema.field(name).type
        role_is_list, element = _kind(data_type)
        if role_is_list != is_list or not check(element):
            shape = f"list<{expected}>" if is_list else expected
            raise ColumnError(
                f"{where(path, column=name)}expected {shape} ({layout} layout), found {_type_name(data_type)}."
            )


def _check_integer_roles(path: str, schema: pa.Schema, columns: ColumnMap) -> None:
    """Raises ColumnError for a step or policy version column that is not of integers (a float step may be)."""
    for role in ("step", "policy_version"):
        name = columns.get(role)
        if name is not None and role not in columns.from_partition:
            data_type = schema.field(name).type
            # a float step is accepted (pandas writes an int column as float64 once it holds a NaN): every value
            # must be whole, which _whole_steps checks as it reads
            floating_step = role == "step" and pa.types.is_floating(_plain(data_type))
            if not (pa.types.is_integer(_plain(data_type)) or floating_step):
                raise ColumnError(f"{where(path, column=name)}expected an integer {role}, found {data_type}.")


def _checked_prompt_column(path: str, schema: pa.Schema, columns: ColumnMap, named: bool) -> ColumnMap:
    """``columns``, without a prompt_id column found by its built-in name that is not one integer or text value per
    row (a dump that read before the role existed still reads); raises ColumnError for such a column the user named
    (``named``): a list (a ragged or per-token column), floats, structs."""
    name = columns.get("prompt_id")
    if name is None or "prompt_id" in columns.from_partition:
        return columns
    data_type = schema.field(name).type
    is_list, element = _kind(data_type)
    if is_list or not (pa.types.is_integer(element) or _text(element)):
        if not named:
            kept = {role: column for role, column in columns.names.items() if role != "prompt_id"}
            return ColumnMap(names=kept, from_partition=columns.from_partition)
        raise ColumnError(
            f"{where(path, column=name)}expected one integer or string prompt id per row, found "
            f"{_type_name(data_type)}.",
            hint=f"name another column with {option_name('columns')} prompt_id=<name>.",
        )
    return columns


def _mask_candidates(schema: pa.Schema, columns: ColumnMap, is_list: bool) -> tuple[str, ...]:
    """Columns no role took whose name holds "mask" and that could be one (of the layout's shape, int or bool)."""
    taken = set(columns.names.values())
    return tuple(
        field.name
        for field in schema
        if field.name not in taken
        and "mask" in field.name.lower()
        and _kind(field.type)[0] == is_list
        and (pa.types.is_integer(_kind(field.type)[1]) or pa.types.is_boolean(_kind(field.type)[1]))
    )


def _text_kind(path: str) -> str | None:
    """What a file that is not Parquet looks like from its first bytes: "a JSON-lines file whose name says no trainer
    format", "a CSV file", "a text file"; None for binary (a corrupt or truncated file says more)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(4096)
    except OSError:
        return None
    if not head or head.startswith(b"PAR1") or b"\x00" in head:
        return None
    try:
        first = head.decode("utf-8").lstrip("\ufeff").splitlines()[0].strip()
    except (UnicodeDecodeError, IndexError):
        return None
    if first.startswith(("{", "[")):
        return "a JSON-lines file whose name says no trainer format"
    if "," in first or "\t" in first:
        return "a CSV file" if "," in first else "a tab-separated text file"
    return "a text file"


def _unfinished_parquet(path: str) -> bool:
    """Whether ``path`` starts with Parquet's magic bytes but does not end with them: a writer that never closed."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(4)
            handle.seek(0, os.SEEK_END)
            if handle.tell() < 8:
                return head == b"PAR1"
            handle.seek(-4, os.SEEK_END)
            return head == b"PAR1" and handle.read(4) != b"PAR1"
    except OSError:
        return False


def _bytes_per_row(parquet: ParquetSource, name: str) -> float | None:
    """Uncompressed bytes per row of column ``name`` in the first row group; None when the file does not say."""
    metadata = parquet.metadata
    if metadata.num_row_groups == 0:
        return None
    group = metadata.row_group(0)
    for index in range(group.num_columns):
        column = group.column(index)
        if column.path_in_schema == name:
            return column.total_uncompressed_size / max(group.num_rows, 1)
    return None


def _text(data_type: pa.DataType) -> bool:
    return pa.types.is_string(data_type) or pa.types.is_large_string(data_type)


# Per-token lists of numbers carried as a per-row extra column: the row's mean over the list (the trainer's entropy).
ROW_MEAN_LISTS = ("entropy", "entropies", "token_entropy")


def prompt_extra(columns: ColumnMap) -> str | None:
    """The prompt_id column when it rides among the extra columns (read from there: ``io/reader.py``); None when the
    dump has none, it is a partition key, or another role reads the same column (then read by that role)."""
    name = columns.get("prompt_id")
    if name is None or "prompt_id" in columns.from_partition:
        return None
    others = {column for role, column in columns.names.items() if role != "prompt_id"}
    return None if name in others else name


def _extra_columns(schema: pa.Schema, columns: ColumnMap) -> tuple[str, ...]:
    """Scalar number, bool or string columns that no role takes, in file order: per-row values like reward or
    advantage (in the token layout, per token: a row takes its first token's); and a list of numbers named in
    ROW_MEAN_LISTS, carried as its row mean. Other lists and other types are not."""
    taken = set(columns.names.values()) - {prompt_extra(columns)} | {SKIP_REASON, SKIP_COLUMN}
    extras = []
    for column in schema:
        if column.name in taken or _PANDAS_INDEX.fullmatch(column.name):
            continue
        is_list, data_type = _kind(column.type)
        scalar = not is_list and (numeric_type(data_type) or _text(data_type))
        if scalar or (is_list and numeric_type(data_type) and column.name in ROW_MEAN_LISTS):
            extras.append(column.name)
    return tuple(extras)


# per-token columns: what makes a file a dump
TOKEN_ROLES = ("rollout", "trainer", "mask", "token_ids", "tokens", "rollout_token_ids", "kept_mass")


def normalised(path: Any) -> str:
    return os.path.normpath(str(path))


def no_token_column(path: str, overrides: Mapping[str, str]) -> bool:
    """Whether the Parquet file at ``path`` has none of the per-token columns (built-in names or the user's)."""
    try:
        names = set(_schema(path).names)
    except (OSError, pa.ArrowException, InputError):
        return False
    wanted = {name for role in TOKEN_ROLES for name in ROLE_CANDIDATES[role]}
    wanted |= {name for role, name in overrides.items() if role in TOKEN_ROLES}
    return not names & wanted


def _schema(path: str) -> pa.Schema:
    if not is_remote(path):
        return pq.read_schema(path)
    with open_file(path) as handle:
        return pq.read_schema(handle)


def listed_columns(path: str, limit: int = 6) -> str:
    names = _schema(path).names
    shown = ", ".join(names[:limit]) + (f", … ({len(names)} in all)" if len(names) > limit else "")
    return f"columns: {shown}" if names else "no columns"


def one_line(exc: BaseException) -> str:
    text = " ".join("".join(c if c.isprintable() else " " for c in str(exc)).split())
    return text[:200] + ("…" if len(text) > 200 else "")


def float16_warnings(files: Sequence[OpenFile]) -> list[str]:
    """One warning per rollout or trainer column stored as float16: quantised logprobs put a floor under |δ|."""
    found: dict[tuple[str, str], list[str]] = {}
    for opened in files:
        for role in ("rollout", "trainer"):
            name = opened.columns.names[role]
            if pa.types.is_float16(_kind(opened.parquet.schema_arrow.field(name).type)[1]):
                found.setdefault((role, name), []).append(opened.source.path)
    warnings = []
    for (role, name), paths in found.items():
        where_ = paths[0] if len(paths) == 1 else f"{len(paths)} files ({listed_names(paths)})"
        warnings.append(
            f"{where_}: column '{name}' ({role} logprobs) is float16 (quantised): each value is rounded by up to "
            "about 2^-11·|logprob| (0.0005 at -1, 0.002 at -5), so |δ| of that size is rounding, not mismatch; dump "
            "float32 (bf16 and fp16 logprobs fit in it exactly)."
        )
    return warnings


def extra_cap_warnings(files: Sequence[OpenFile]) -> list[str]:
    """One line for all files with long text columns, one for all with more extra columns than are carried."""
    warnings = []
    long_text = [opened for opened in files if opened.extras_long]
    if long_text:
        sizes: dict[str, float] = {}
        for opened in long_text:
            for name, size in opened.extras_long:
                sizes[name] = max(size, sizes.get(name, 0.0))
        listed = ", ".join(f"{name} (~{size:,.0f} bytes a row)" for name, size in list(sizes.items())[:10])
        warnings.append(
            f"{listed_names([opened.source.path for opened in long_text])}: text columns {listed} are longer than a "
            f"per-row label ({MAX_EXTRA_TEXT_BYTES} bytes); the worst rows do not carry them."
        )
    capped = [opened for opened in files if opened.extras_left_out]
    if capped:
        left_out = list(dict.fromkeys(name for opened in capped for name in opened.extras_left_out))
        shown = ", ".join(left_out[:10]) + (f" and {len(left_out) - 10} more" if len(left_out) > 10 else "")
        warnings.append(
            f"{listed_names([opened.source.path for opened in capped])}: more than {MAX_EXTRA_COLUMNS} per-row extra "
            f"columns; the worst rows carry the first {MAX_EXTRA_COLUMNS} in file order and leave out {shown}."
        )
    return warnings


def describe_columns(columns: ColumnMap) -> str:
    """``role=column, …``: which column plays each role."""
    return ", ".join(f"{role}={name}" for role, name in columns.names.items())


def column_names(opened: OpenFile) -> list[str]:
    roles = [name for role, name in opened.columns.names.items() if role not in opened.columns.from_partition]
    return roles + list(opened.extras)
