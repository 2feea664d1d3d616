"""Stream Parquet dumps into validated chunks of whole rows.

Two layouts are read, detected from the type of the rollout column:
- sequence: one row per sequence, list columns (what verl/SkyRL dump);
- token: one row per token, scalar columns plus ``sample_id`` (and ``position``); consecutive tokens of
  one (step, sample_id) form a sequence.
Both become the same packed blocks, validated the same way, so they give identical results.

Memory: one record batch per file at a time (a row group is decoded at once by Parquet), plus at most
``prefetch`` decoded blocks waiting; nothing is kept across chunks but small counters.
"""

from __future__ import annotations

import hashlib
import math
import os
import queue
import re
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Integral
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rollout_diag.errors import ColumnError, ConfigError, DataError, InputError, RolloutDiagError, option_name, where
from rollout_diag.io.columns import ROLE_CANDIDATES, ColumnMap, resolve_columns
from rollout_diag.io.formats import PARQUET, DumpInputs, input_options, open_source, resolve
from rollout_diag.io.formats.base import SKIP_COLUMN, SKIP_REASON
from rollout_diag.io.sources import Source
from rollout_diag.paths import names_file
from rollout_diag.results import SkippedRow

if TYPE_CHECKING:  # torch is imported when the first chunk is built: opening files and their errors come first
    import torch

    from rollout_diag.io.chunk import Chunk

MAX_POSITIVE_LOGPROB = 1e-6  # logprobs above this are not logprobs (float noise of log(1) stays below)
MAX_SKIP_RECORDS = 1000  # skipped rows listed one by one; beyond this only counted
# Without a mask, tokens whose rollout logprob is exactly 0.0 (p = 1) while the trainer's is below log 0.5 look
# like environment tokens: engines write 0.0 where they produced no logprob, and a token the engine really gave
# p = 1 is not one the trainer gives p < 0.5 (confident tokens have both near 0, so they do not count).
ZERO_ROLLOUT_TRAINER_BELOW = math.log(0.5)
ZERO_ROLLOUT_SHARE = 0.01  # ... and when at least this share of the tokens are such, say so
DEFAULT_CHUNK_TOKENS = 1 << 19  # ~512K tokens: 4 MB per float64 quantity; larger chunks are no faster, only bigger
# Per-row scalar columns no role takes (reward, advantage, …) ride along to the worst rows; a dump with hundreds of
# metadata columns would decode them all for every row, so only the first ones (in file order) are carried.
MAX_EXTRA_COLUMNS = 16
# Text columns averaging more than this per row (a prompt, a response) are not per-row labels: not carried.
MAX_EXTRA_TEXT_BYTES = 256
_PANDAS_INDEX = re.compile(r"__index_level_\d+__")  # what DataFrame.to_parquet adds for a non-default index


@dataclass
class ReadLog:
    """What reading found besides data: which columns played which role, skipped rows, warnings."""

    files: list[str] = field(default_factory=list)
    columns: dict[str, str] = field(default_factory=dict)
    layout: str = ""
    format: str = PARQUET  # the trainer format the files were read as (io/formats)
    skipped: list[SkippedRow] = field(default_factory=list)
    skipped_rows: int = 0
    warnings: list[str] = field(default_factory=list)
    total_rows: int = 0  # rows in the files (token layout: tokens), known before reading
    # Files without a mask column: [tokens analysed, of them rollout logprob 0.0 where the trainer's is < log 0.5].
    unmasked: dict[str, list[int]] = field(default_factory=dict)
    mask_candidates: dict[str, list[str]] = field(default_factory=dict)  # file -> '*mask*' columns no role took
    # A 64-bit hash of (step, sample_id) per analysed row (files with a sample id only), and where the row is:
    # (index into ``files``, file row). 16 bytes a row; exact up to hash collisions (2^-64 per pair).
    row_keys: list[np.ndarray] = field(default_factory=list, repr=False)
    row_places: list[np.ndarray] = field(default_factory=list, repr=False)
    # Rows skipped for a list longer or shorter than the rollout's: (role, column, rollout column) -> {length
    # difference: rows}. One difference in every row is a layout mistake worth naming (a prompt prefix).
    length_offsets: dict[tuple[str, str, str], dict[int, int]] = field(default_factory=dict)
    finished: bool = False
    rows_selected_out: int = 0  # rows a row selection (--where, --steps) left out: not decoded, not skipped

    def merge(self, other: ReadLog) -> None:
        """Fold in the log of a worker that read other row groups of the same inputs."""
        self.skipped = sorted([*self.skipped, *other.skipped], key=lambda r: (r.file, -1 if r.row is None else r.row))
        del self.skipped[MAX_SKIP_RECORDS:]
        self.skipped_rows += other.skipped_rows
        self.warnings.extend(w for w in other.warnings if w not in self.warnings)
        for file, (tokens, zeros) in other.unmasked.items():
            counts = self.unmasked.setdefault(file, [0, 0])
            counts[0] += tokens
            counts[1] += zeros
        self.row_keys += other.row_keys
        self.row_places += other.row_places
        for key, offsets in other.length_offsets.items():
            mine = self.length_offsets.setdefault(key, {})
            for offset, rows in offsets.items():
                mine[offset] = mine.get(offset, 0) + rows
        self.rows_selected_out += other.rows_selected_out

    def finish(self) -> None:
        """Add the warnings that need every row seen (missing mask, duplicate rows); once, after the last merge."""
        if self.finished:
            return
        self.finished = True
        self.warnings.extend(_mask_warnings(self) + _duplicate_warnings(self))
        self.row_keys, self.row_places = [], []
        for note, rows in _length_offset_notes(self):
            if rows == self.total_rows == self.skipped_rows:  # nothing left to analyse: the note is the error
                first = self.skipped[0]
                raise DataError(
                    f"{', '.join(self.files)}: every row was skipped ({rows} rows): {note} every row; the first: "
                    f"{where(None, first.row, first.column)}{first.reason}.",
                    hint="dump the same tokens on both sides (the response's), or cut the extra tokens off first.",
                )
            self.warnings.append(f"{note} each of the {rows} rows skipped for it: cut them off to analyse those rows.")

    def note_length_offsets(self, role: str, column: str, rollout: str, offsets: np.ndarray) -> None:
        """Count rows skipped because ``column`` (of ``role``) is longer (offset > 0) than the rollout's list."""
        counts = self.length_offsets.setdefault((role, column, rollout), {})
        values, rows = np.unique(offsets, return_counts=True)
        for offset, count in zip(values.tolist(), rows.tolist(), strict=True):
            counts[offset] = counts.get(offset, 0) + count

    def skip(self, record: SkippedRow, strict: bool) -> None:
        if strict:
            raise DataError(
                f"{where(record.file, record.row, record.column)}{record.reason}",
                hint=f"drop {option_name('strict')} to analyse the other rows and list the skipped ones.",
            )
        self.skipped_rows += 1
        if len(self.skipped) < MAX_SKIP_RECORDS:
            self.skipped.append(record)


def _length_offset_notes(log: ReadLog) -> list[tuple[str, int]]:
    """(note, rows) for each column whose rows skipped as ragged all differ from the rollout's by one k ≠ 0 (at
    least 2 rows): "the trainer side (old_log_probs) has 7 more tokens than rollout_log_probs in"."""
    notes = []
    for (role, column, rollout), offsets in log.length_offsets.items():
        if len(offsets) != 1:
            continue
        ((offset, rows),) = offsets.items()
        if rows < 2 or offset == 0:
            continue
        side = "the trainer side" if role == "trainer" else f"the {role}"
        count = abs(offset)
        more = f"{count} {'more' if offset > 0 else 'fewer'} token{'s' if count != 1 else ''}"
        guess = " (a prompt prefix?)" if offset > 0 else " (a cut response?)"
        notes.append((f"{side} ({column}) has {more} than {rollout}{guess} in", rows))
    return notes


def _mask_warnings(log: ReadLog) -> list[str]:
    if not log.unmasked:
        return []
    tokens = sum(counts[0] for counts in log.unmasked.values())
    zeros = sum(counts[1] for counts in log.unmasked.values())
    files = sorted(log.unmasked, key=log.files.index) if set(log.unmasked) <= set(log.files) else list(log.unmasked)
    which = "" if len(files) == len(log.files) else f" in {_names(files)}"
    notes = [
        f"no mask column{which}: all {tokens} tokens treated as model tokens "
        "(looked for response_mask, loss_mask, token_loss_mask)."
    ]
    if tokens and zeros >= ZERO_ROLLOUT_SHARE * tokens:
        candidates = sorted({name for file in files for name in log.mask_candidates.get(file, [])})
        name = candidates[0] if len(candidates) == 1 else "<name>"
        notes.append(
            f"{zeros} of those {tokens} tokens ({100 * zeros / tokens:.3g} %) have a rollout logprob of exactly 0.0 "
            "where the trainer's is below log 0.5: these look like environment tokens (tool output, prompt) that "
            f"a mask would leave out; name the mask column with --column mask={name}"
            + (f" (columns that may be one: {', '.join(candidates)})." if candidates else ".")
        )
    return notes


def _duplicate_warnings(log: ReadLog) -> list[str]:
    if not log.row_keys:
        return []
    keys = np.concatenate(log.row_keys)
    places = np.concatenate(log.row_places)
    order = np.lexsort((places[:, 1], places[:, 0], keys))  # by key, then by file and row
    keys, places = keys[order], places[order]
    same_as_next = keys[1:] == keys[:-1]
    if not same_as_next.any():
        return []
    in_group = np.zeros(len(keys), dtype=bool)
    in_group[1:] |= same_as_next
    in_group[:-1] |= same_as_next
    groups = int(np.count_nonzero(same_as_next & ~np.concatenate([[False], same_as_next[:-1]])))
    # the example: the duplicated key whose first row comes first in the input
    starts = np.flatnonzero(in_group & ~np.concatenate([[False], same_as_next]))
    first = min(starts, key=lambda i: (places[i, 0], places[i, 1]))
    example = [
        f"{log.files[int(places[i, 0])]}:{int(places[i, 1])}"
        for i in range(first, min(first + 3, len(keys)))
        if keys[i] == keys[first]
    ]
    return [
        f"duplicate (step, sample_id): {int(in_group.sum())} rows share their (step, sample_id) with another row "
        f"({groups} keys), e.g. rows {' and '.join(example)}; each row is analysed as a sequence of its own. "
        "Two dumps of one run, or an id per prompt (verl's uid is shared by the n responses of a prompt)? "
        "Give each row its own id; inspect one with --row FILE:ROW."
    ]


def _names(files: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(files[:limit])
    return shown + (f" and {len(files) - limit} more files" if len(files) > limit else "")


def _row_keys(steps: np.ndarray, sample_ids: Sequence[str]) -> np.ndarray:
    """uint64 [R]: a hash of each (step, sample_id), the same in every process (unlike Python's hash)."""
    return np.fromiter(
        (
            int.from_bytes(
                hashlib.blake2b(f"{step}\x1f{sample_id}".encode("utf-8", "surrogatepass"), digest_size=8).digest(),
                "little",
            )
            for step, sample_id in zip(steps.tolist(), sample_ids, strict=True)
        ),
        dtype=np.uint64,
        count=len(sample_ids),
    )


@dataclass
class _Block:
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
    skipped: list[SkippedRow] = field(default_factory=list)  # found while decoding; logged in row order


@dataclass(frozen=True)
class _OpenFile:
    source: Source
    parquet: pq.ParquetFile  # or a format's RowsFile, which offers the same members (io/formats/base.py)
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


def _decoded(batch: pa.RecordBatch) -> pa.RecordBatch:
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


def _numeric(data_type: pa.DataType) -> bool:
    return pa.types.is_floating(data_type) or pa.types.is_integer(data_type) or pa.types.is_boolean(data_type)


_ELEMENT_CHECKS = {
    "rollout": (pa.types.is_floating, "float"),
    "trainer": (pa.types.is_floating, "float"),
    "mask": (_numeric, "int, bool or float 0/1"),
    "token_ids": (pa.types.is_integer, "int"),
    "tokens": (lambda t: pa.types.is_string(t) or pa.types.is_large_string(t), "string"),
}


def _open(
    source: Source, overrides: Mapping[str, str] | None, input_format: str = PARQUET, trust_pickle: bool = False
) -> _OpenFile:
    try:
        parquet = open_source(source, input_format, trust_pickle)
        schema = parquet.schema_arrow
    except (OSError, pa.ArrowException, UnicodeDecodeError, ValueError) as exc:
        kind = "Parquet" if input_format == PARQUET else input_format
        unfinished = input_format == PARQUET and _unfinished_parquet(source.path)
        raise InputError(
            f"{source.path}: not a readable {kind} file ({_one_line(exc)}).",
            hint="it starts as Parquet but has no footer: was a DumpWriter killed before close()? Use the directory "
            "mode (DumpWriter('run/')): each step's file is complete once written."
            if unfinished
            else None,
        ) from exc
    columns = resolve_columns(source.path, schema.names, overrides, source.partition.keys())
    is_list, _ = _kind(schema.field(columns.names["rollout"]).type)
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
                f"{where(source.path, column=name)}expected {shape} ({layout} layout), found {_type_name(data_type)}."
            )
    for role in ("step", "policy_version"):
        name = columns.get(role)
        if name is not None and role not in columns.from_partition:
            data_type = schema.field(name).type
            # a float step is accepted (pandas writes an int column as float64 once it holds a NaN): every value
            # must be whole, which _whole_steps checks as it reads
            floating_step = role == "step" and pa.types.is_floating(_plain(data_type))
            if not (pa.types.is_integer(_plain(data_type)) or floating_step):
                raise ColumnError(f"{where(source.path, column=name)}expected an integer {role}, found {data_type}.")
    if layout == "token" and "sample_id" not in columns:
        raise ColumnError(
            f"{source.path}: token layout (one row per token) needs a sample_id column to group tokens into rows.",
            hint=f"name it with {option_name('columns')} sample_id=<name>.",
        )
    candidates: tuple[str, ...] = ()
    if "mask" not in columns:
        taken = set(columns.names.values())
        candidates = tuple(
            field.name
            for field in schema
            if field.name not in taken
            and "mask" in field.name.lower()
            and _kind(field.type)[0] == is_list
            and (pa.types.is_integer(_kind(field.type)[1]) or pa.types.is_boolean(_kind(field.type)[1]))
        )
    extras = _extra_columns(schema, columns)
    long_text = tuple(
        (name, size)
        for name in extras
        if _text(_kind(schema.field(name).type)[1])
        and (size := _bytes_per_row(parquet, name)) is not None
        and size > MAX_EXTRA_TEXT_BYTES
    )
    extras = tuple(name for name in extras if name not in dict(long_text))
    return _OpenFile(
        source=source,
        parquet=parquet,
        columns=columns,
        layout=layout,
        mask_candidates=candidates,
        extras=extras[:MAX_EXTRA_COLUMNS],
        extras_left_out=extras[MAX_EXTRA_COLUMNS:],
        extras_long=long_text,
    )


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


def _bytes_per_row(parquet: pq.ParquetFile, name: str) -> float | None:
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


def _extra_columns(schema: pa.Schema, columns: ColumnMap) -> tuple[str, ...]:
    """Scalar number, bool or string columns that no role takes, in file order: per-row values like reward or
    advantage (in the token layout, per token: a row takes its first token's). Lists and other types are not."""
    taken = set(columns.names.values()) | {SKIP_REASON, SKIP_COLUMN}
    extras = []
    for column in schema:
        if column.name in taken or _PANDAS_INDEX.fullmatch(column.name):
            continue
        is_list, data_type = _kind(column.type)
        if not is_list and (_numeric(data_type) or _text(data_type)):
            extras.append(column.name)
    return tuple(extras)


TOKEN_ROLES = ("rollout", "trainer", "mask", "token_ids", "tokens")  # per-token columns: what makes a file a dump


def _normalised(path: Any) -> str:
    return os.path.normpath(str(path))


def _no_token_column(path: str, overrides: Mapping[str, str]) -> bool:
    """Whether the Parquet file at ``path`` has none of the per-token columns (built-in names or the user's)."""
    try:
        names = set(pq.read_schema(path).names)
    except (OSError, pa.ArrowException):
        return False
    wanted = {name for role in TOKEN_ROLES for name in ROLE_CANDIDATES[role]}
    wanted |= {name for role, name in overrides.items() if role in TOKEN_ROLES}
    return not names & wanted


def _listed_columns(path: str, limit: int = 6) -> str:
    names = pq.read_schema(path).names
    shown = ", ".join(names[:limit]) + (f", … ({len(names)} in all)" if len(names) > limit else "")
    return f"columns: {shown}" if names else "no columns"


def _one_line(exc: BaseException) -> str:
    text = " ".join("".join(c if c.isprintable() else " " for c in str(exc)).split())
    return text[:200] + ("…" if len(text) > 200 else "")


# --------------------------------------------------------------------------------------- the reader
class DumpReader:
    """Opens every input up front (so a bad file fails before any work), then streams chunks."""

    def __init__(
        self,
        inputs: str | Sequence[str] | Sequence[Source],
        columns: Mapping[str, str] | None = None,
        *,
        strict: bool = False,
        chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
        parts: Mapping[str, Sequence[int]] | None = None,
        input_format: str | None = None,
        trust_pickle: bool | None = None,
    ) -> None:
        """``inputs``: files, globs and directories, or the :class:`Source` list another reader resolved (then
        nothing is expanded again). ``columns``: the user's role -> column overrides; each file resolves its own
        columns from them. ``parts``: read only these row groups of these files (by path), as :meth:`plan`
        splits them. ``input_format``: a name of ``io.formats.FORMAT_NAMES`` (default: what ``inputs`` carries,
        else detected); ``trust_pickle`` lifts the pickle allowlist (``io/formats/safe_pickle.py``).
        Raises InputError / ColumnError for unreadable input, ConfigError for a bad chunk size."""
        if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, Integral) or chunk_tokens < 1:
            raise ConfigError(
                f"{option_name('chunk_tokens')}={chunk_tokens}: must be a positive whole number of tokens."
            )
        carried_format, carried_trust = input_options(inputs)
        self.trust_pickle = carried_trust if trust_pickle is None else trust_pickle
        self.strict = strict
        self.chunk_tokens = int(chunk_tokens)
        self.overrides = dict(columns or {})
        self.parts = None if parts is None else {path: set(groups) for path, groups in parts.items()}
        self.log = ReadLog()
        # Called per record batch with (batch, steps) -> bool per row: the rows to read (rollout_diag/selection.py).
        self.selection: Callable[[pa.RecordBatch | pa.Table, np.ndarray], np.ndarray] | None = None
        given = [inputs] if isinstance(inputs, str) else list(inputs)
        if given and all(isinstance(item, Source) for item in given):
            self.sources = given
            self.log.format = input_format or carried_format or PARQUET
        else:
            self.log.format, self.sources = resolve(given, input_format or carried_format, self.log.warnings)
        self.files = self._open_sources(given)
        first = self.files[0]
        self.log.files = [f.source.path for f in self.files]
        # where each analysed row's (step, sample_id) key comes from: (file index, whether ids are real)
        self._file_index = {f.source.path: (i, "sample_id" in f.columns) for i, f in enumerate(self.files)}
        self.log.mask_candidates = {f.source.path: list(f.mask_candidates) for f in self.files}
        self.log.columns = {
            role: (f"{name} (partition)" if role in first.columns.from_partition else name)
            for role, name in first.columns.names.items()
        }
        layouts = {f.layout for f in self.files}
        if len(layouts) > 1:
            first_of = {f.layout: f.source.path for f in reversed(self.files)}
            raise InputError(
                f"{first_of['token']}: token layout (one row per token), but {first_of['sequence']} has the "
                "sequence layout (one row per sequence); analyse them separately."
            )
        self.log.layout = first.layout
        for opened in self.files[1:]:
            if dict(opened.columns.names) != dict(first.columns.names):
                self.log.warnings.append(
                    f"{opened.source.path}: columns differ from the first file's "
                    f"({_describe(opened.columns)} vs {_describe(first.columns)})."
                )
        self.log.total_rows = sum(f.parquet.metadata.num_rows for f in self.files)
        if self.log.total_rows == 0:
            raise InputError(f"{', '.join(self.log.files)}: no rows in the input.")
        for opened in self.files:
            if opened.parquet.metadata.num_rows == 0:
                self.log.warnings.append(f"{opened.source.path}: file has no rows.")
        self.log.warnings.extend(_extra_cap_warnings(self.files))
        self.log.warnings.extend(_float16_warnings(self.files))

    def _open_sources(self, given: Sequence[Any]) -> list[_OpenFile]:
        """Open every source. A Parquet file found in a directory or by a glob that has none of a dump's per-token
        columns (training statistics beside the run) is left out with a warning naming it; a file named on its own,
        or one with some of those columns but not all, is an error."""
        named = {_normalised(item) for item in given if not isinstance(item, Source)}
        opened: list[_OpenFile] = []
        kept: list[Source] = []
        first_error: ColumnError | None = None
        for source in self.sources:
            try:
                opened.append(_open(source, self.overrides, self.log.format, self.trust_pickle))
                kept.append(source)
            except ColumnError as exc:
                stray = self.log.format == PARQUET and _normalised(source.path) not in named
                if not stray or not _no_token_column(source.path, self.overrides):
                    raise
                first_error = first_error or exc
                self.log.warnings.append(
                    f"{source.path}: skipped: not part of the dump (no logprob, mask or token column; "
                    f"{_listed_columns(source.path)})."
                )
        if not opened:
            raise first_error  # type: ignore[misc]  # every file was stray: say why the first one is not a dump
        self.sources = kept
        return opened

    def select(self, selection: Callable[[pa.RecordBatch | pa.Table, np.ndarray], np.ndarray] | None) -> None:
        """Read only the rows ``selection(batch, steps)`` keeps; it may first ``check(schema, path)`` every file's
        per-row columns (a bad predicate fails before any reading)."""
        if selection is not None and hasattr(selection, "check"):
            for opened in self.files:  # what a predicate may name: the per-row values, never a token's
                roles = ("step", "sample_id", "policy_version")
                per_row = [
                    opened.columns.names[r]
                    for r in roles
                    if r in opened.columns.names and r not in opened.columns.from_partition
                ]
                per_row += [n for n in opened.extras if n not in per_row]
                selection.check(opened.parquet.schema_arrow, opened.source.path, per_row)
        self.selection = selection or None

    def row_columns(self) -> list[str]:
        """The per-row scalar columns carried in ``Chunk.extra`` (any file's, policy_version first): what ``--by``
        can group by."""
        names: dict[str, None] = {}
        for opened in self.files:
            version = opened.columns.get("policy_version")
            if version is not None and "policy_version" not in opened.columns.from_partition:
                names[version] = None
            names.update(dict.fromkeys(opened.extras))
        return list(names)

    def narrow(self, step: int | None = None, sample_id: str | None = None) -> None:
        """Read only the row groups that may hold rows of ``step`` / ``sample_id``, judged by the Parquet
        row-group statistics (a group without statistics is read) and hive partition values."""
        parts: dict[str, list[int]] = {}
        for opened in self.files:
            partition = opened.source.partition
            wanted = {"step": step, "sample_id": sample_id}
            if any(
                value is not None
                and role in opened.columns.from_partition
                and str(partition[opened.columns.names[role]]) != str(value)
                for role, value in wanted.items()
            ):
                continue
            metadata = opened.parquet.metadata
            groups = [
                group
                for group in range(metadata.num_row_groups)
                if all(
                    _may_hold(opened, metadata.row_group(group), role, value)
                    for role, value in wanted.items()
                    if value is not None and role in opened.columns and role not in opened.columns.from_partition
                )
            ]
            if groups:
                parts[opened.source.path] = groups
        self.parts = {path: set(groups) for path, groups in parts.items()}

    def narrow_to_row(self, place: str) -> tuple[str, int]:
        """Read only the row group holding ``FILE:ROW`` (token layout: and those after it, where the sequence may
        go on); returns (file path, row). FILE is a path as given or resolved, or a file name unique in the input.
        Raises InputError when no file, or more than one, matches, or the file has no such row."""
        name, sep, number = place.rpartition(":")
        if not sep or not name or not number.strip().isdigit():
            raise InputError(
                f"{option_name('row')}={place}: expected FILE:ROW, e.g. part-0.parquet:12 (as the tables print it)."
            )
        row = int(number)
        matches = [
            f
            for f in self.files
            if f.source.path == name
            or names_file(name, f.source.path)  # as the tables label it: step=3/rank-0.parquet
            or Path(f.source.path).resolve() == Path(name).resolve()
        ]
        if len({f.source.path for f in matches}) != 1:
            found = "no input file" if not matches else f"{len(matches)} input files"
            raise InputError(
                f"{option_name('row')}={place}: {found} named {name} (inputs: {', '.join(self.log.files[:5])})."
            )
        opened = matches[0]
        metadata = opened.parquet.metadata
        if not 0 <= row < metadata.num_rows:
            raise InputError(
                f"{option_name('row')}={place}: {opened.source.path} has rows 0 to {metadata.num_rows - 1}."
            )
        first = 0
        for group in range(metadata.num_row_groups):
            first += metadata.row_group(group).num_rows
            if row < first:
                break
        last = group if opened.layout == "sequence" else metadata.num_row_groups - 1
        self.parts = {opened.source.path: set(range(group, last + 1))}
        return opened.source.path, row

    def worker_inputs(self) -> DumpInputs:
        """The files to hand a worker's reader, with the format they were read as (never re-detected)."""
        return DumpInputs(self.sources, self.log.format, self.trust_pickle)

    def plan(self, workers: int) -> list[dict[str, list[int]]]:
        """Split the input into at most ``workers`` parts of about equal rows, for parallel readers.

        Sequence layout splits at row-group boundaries (rows never span row groups); token layout at file
        boundaries (a sequence's tokens may span row groups of one file).
        """
        units: list[tuple[str, int, int]] = []  # (path, row group or -1 for the whole file, rows)
        for opened in self.files:
            metadata = opened.parquet.metadata
            if opened.layout == "sequence":
                units += [
                    (opened.source.path, g, metadata.row_group(g).num_rows) for g in range(metadata.num_row_groups)
                ]
            else:
                units.append((opened.source.path, -1, metadata.num_rows))
        total = sum(rows for *_, rows in units)
        parts: list[dict[str, list[int]]] = [{}]
        filled = 0
        for path, group, rows in units:
            if filled >= total * len(parts) / workers and len(parts) < workers:
                parts.append({})
            groups = parts[-1].setdefault(path, [])
            metadata = next(f.parquet.metadata for f in self.files if f.source.path == path)
            groups.extend(range(metadata.num_row_groups) if group < 0 else [group])
            filled += rows
        return [part for part in parts if part]

    def chunks(
        self,
        device: torch.device | str = "cpu",
        prefetch: int = 1,
        prepare: Callable[[Chunk], None] | None = None,
    ) -> Iterator[tuple[Chunk, int]]:
        """Yield (chunk, file rows consumed so far) on ``device``.

        With ``prefetch`` > 0 a reader thread decodes, validates and builds chunks ahead, and a pool of threads (one
        per core but one; one in a worker process, which reads a part beside other workers) runs ``prepare(chunk)``
        (e.g. the per-chunk arithmetic every metric shares) on the next chunks, so reading, that arithmetic and the
        caller's work on an earlier chunk overlap (pyarrow, the compiled kernels and torch release the GIL). Chunks
        come out in file order whatever the pool's size.
        """
        import torch

        device = torch.device(device)
        if prefetch <= 0:
            yield from self._built_chunks(device, prepare)
        elif prepare is None:
            yield from _prefetched(self._built_chunks(device, None), prefetch)
        else:
            workers = _prepare_workers() if self.parts is None else 1
            built = _prefetched(self._built_chunks(device, None), max(prefetch, workers))
            yield from _prepared(built, prepare, workers)
        if self.parts is None:  # the whole input was read here (a worker's part is finished by the driver)
            self.log.finish()

    def _built_chunks(
        self, device: torch.device, prepare: Callable[[Chunk], None] | None
    ) -> Iterator[tuple[Chunk, int]]:
        for block, consumed in self._blocks():
            chunk = self._validated_chunk(block, device)
            if chunk is not None:
                if prepare is not None:
                    prepare(chunk)
                yield chunk, consumed

    # -- decoding --------------------------------------------------------------------------------
    def _blocks(self) -> Iterator[tuple[_Block, int]]:
        consumed = 0
        for opened in self.files:
            if self.parts is not None and opened.source.path not in self.parts:
                continue
            reader = _read_sequences if opened.layout == "sequence" else _read_tokens
            try:
                for block, rows in reader(opened, self):
                    consumed += rows
                    yield block, consumed
            except (UnicodeDecodeError, pa.ArrowException, OSError) as exc:
                # Decoding errors outside a row group's read (text columns, metadata) mean a corrupt file.
                raise InputError(
                    f"{opened.source.path}: cannot be decoded, the file is corrupt ({_one_line(exc)})."
                ) from exc

    def _validated_chunk(self, block: _Block, device: torch.device) -> Chunk | None:
        import torch

        from rollout_diag.io.chunk import Chunk

        scanned = None if block.skipped else _scanned(block, device)
        if scanned is None:  # the exact check, which finds and records the bad rows
            block = _validate(block, self.log, self.strict)
            if block is None:
                return None
        file_index, has_ids = self._file_index[block.file]
        if block.mask is None:
            counts = self.log.unmasked.setdefault(block.file, [0, 0])
            counts[0] += len(block.rollout)
            counts[1] += int(np.count_nonzero((block.rollout == 0.0) & (block.trainer < ZERO_ROLLOUT_TRAINER_BELOW)))
        if has_ids:
            self.log.row_keys.append(_row_keys(block.step, block.sample_id))
            self.log.row_places.append(np.stack([np.full(len(block.file_row), file_index), block.file_row], axis=1))
        if scanned is not None:
            trainer, rollout, mask = scanned
        else:
            # torch.tensor copies: Arrow's buffers are read-only, and the fill below writes in place.
            trainer = torch.tensor(block.trainer, dtype=torch.float64, device=device)
            rollout = torch.tensor(block.rollout, dtype=torch.float64, device=device)
            if block.mask is None:
                mask = torch.ones(len(block.trainer), dtype=torch.bool, device=device)
            else:
                mask = torch.tensor(block.mask == 1, device=device)
            # Environment tokens never enter a metric; zero them so NaN fill values there cannot leak in.
            trainer.masked_fill_(~mask, 0.0)
            rollout.masked_fill_(~mask, 0.0)
        offsets = np.zeros(len(block.lengths) + 1, dtype=np.int64)
        np.cumsum(block.lengths, out=offsets[1:])
        text = block.token_text
        return Chunk(
            step=torch.tensor(block.step, dtype=torch.int64, device=device),
            offsets=torch.from_numpy(offsets).to(device),
            trainer=trainer,
            rollout=rollout,
            mask=mask,
            sample_id=block.sample_id,
            file=[block.file] * len(block.lengths),
            file_row=block.file_row.tolist(),
            token_ids=None if block.token_ids is None else torch.tensor(block.token_ids, device=device),
            token_text=None if text is None else _text_lookup(text, offsets),
            policy_version=None if block.policy_version is None else torch.tensor(block.policy_version, device=device),
            extra=_chunk_extra(block),
        )


def _scanned(block: _Block, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(trainer, rollout, mask) tensors of a clean block from one compiled scan that converts, zeroes environment
    tokens and flags bad values at once (the numba engine's CPU chunks; ``kernels.cpu.checked_model_values``), the
    same tensors ``_validated_chunk`` builds otherwise. None where the scan does not apply (another device or
    engine, a dtype it is not compiled for) or where it flags anything: ``_validate`` then finds the rows and
    records them with its messages, exactly as without the scan."""
    import torch

    from rollout_diag.kernels import compiled, kernel_for

    trainer, rollout, mask = block.trainer, block.rollout, block.mask
    if device.type != "cpu" or not kernel_for("cpu") or not len(block.lengths):
        return None
    if trainer.dtype != rollout.dtype or trainer.dtype not in (np.float32, np.float64):
        return None
    if mask is not None and mask.dtype.kind not in "biu":
        return None
    kernels = compiled()
    # numpy compares a float32 array with the tolerance rounded to float32; as float64 that bound is exact
    limit = float(trainer.dtype.type(MAX_POSITIVE_LOGPROB))
    trainer, rollout = np.ascontiguousarray(trainer), np.ascontiguousarray(rollout)
    if mask is None:
        trainer, rollout, clean = kernels.checked_values(trainer, rollout, limit)
        model = np.ones(len(trainer), dtype=bool)
    else:
        if mask.dtype.itemsize == 1:  # bool, int8 and uint8 share one compiled scan (-1 reads 255: flagged)
            mask = mask.view(np.uint8)
        trainer, rollout, model, clean = kernels.checked_model_values(
            trainer, rollout, np.ascontiguousarray(mask), limit
        )
    if not clean:
        return None
    return torch.from_numpy(trainer), torch.from_numpy(rollout), torch.from_numpy(model)


def _chunk_extra(block: _Block) -> dict[str, ExtraColumn]:
    """The block's extra columns, its policy_version column first: read by its role, it is carried once, here."""
    if block.policy_version is None:
        return block.extra
    return {block.names["policy_version"]: block.policy_version, **block.extra}


def _may_hold(opened: _OpenFile, group: pq.RowGroupMetaData, role: str, value: int | str) -> bool:
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
        if isinstance(low, bytes | str) and isinstance(high, bytes | str):
            text = str(value).encode() if isinstance(low, bytes) else str(value)
            return low <= text <= high
        if isinstance(low, int) and isinstance(high, int):
            try:
                number = int(value)
            except ValueError:  # an id that is not a number is in no integer column
                return False
            return low <= number <= high
        return True
    return True


def _float16_warnings(files: Sequence[_OpenFile]) -> list[str]:
    """One warning per rollout or trainer column stored as float16: quantised logprobs put a floor under |δ|."""
    found: dict[tuple[str, str], list[str]] = {}
    for opened in files:
        for role in ("rollout", "trainer"):
            name = opened.columns.names[role]
            if pa.types.is_float16(_kind(opened.parquet.schema_arrow.field(name).type)[1]):
                found.setdefault((role, name), []).append(opened.source.path)
    warnings = []
    for (role, name), paths in found.items():
        where_ = paths[0] if len(paths) == 1 else f"{len(paths)} files ({_names(paths)})"
        warnings.append(
            f"{where_}: column '{name}' ({role} logprobs) is float16 (quantised): each value is rounded by up to "
            "about 2^-11·|logprob| (0.0005 at -1, 0.002 at -5), so |δ| of that size is rounding, not mismatch; dump "
            "float32 (bf16 and fp16 logprobs fit in it exactly)."
        )
    return warnings


def _extra_cap_warnings(files: Sequence[_OpenFile]) -> list[str]:
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
            f"{_names([opened.source.path for opened in long_text])}: text columns {listed} are longer than a "
            f"per-row label ({MAX_EXTRA_TEXT_BYTES} bytes); the worst rows do not carry them."
        )
    capped = [opened for opened in files if opened.extras_left_out]
    if capped:
        left_out = list(dict.fromkeys(name for opened in capped for name in opened.extras_left_out))
        shown = ", ".join(left_out[:10]) + (f" and {len(left_out) - 10} more" if len(left_out) > 10 else "")
        warnings.append(
            f"{_names([opened.source.path for opened in capped])}: more than {MAX_EXTRA_COLUMNS} per-row extra "
            f"columns; the worst rows carry the first {MAX_EXTRA_COLUMNS} in file order and leave out {shown}."
        )
    return warnings


def _describe(columns: ColumnMap) -> str:
    return ", ".join(f"{role}={name}" for role, name in columns.names.items())


def _text_lookup(text: pa.Array, offsets: np.ndarray):
    def lookup(row: int, position: int) -> str | None:
        value = text[int(offsets[row]) + position]
        try:
            return value.as_py()
        except UnicodeDecodeError:  # token text is for display: show what can be shown
            return value.as_buffer().to_pybytes().decode("utf-8", errors="replace")

    return lookup


def _prefetched(blocks: Iterator, depth: int) -> Iterator:
    """Run ``blocks`` in a thread (Parquet decoding releases the GIL), ``depth`` items ahead. A consumer that stops
    early closes ``blocks`` too (an earlier stage of a pipeline stops its own thread)."""
    items: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def produce() -> None:
        try:
            for item in blocks:
                while not stop.is_set():
                    try:
                        items.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    break
            else:
                items.put(done)
        except BaseException as exc:  # handed to the consumer, raised there
            items.put(exc)
        finally:
            close = getattr(blocks, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, name="rollout-diag-reader", daemon=True)
    thread.start()
    try:
        while True:
            item = items.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()


def _prepare_workers() -> int:
    """Threads that prepare chunks: one per core but one (the reader's), at least one."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores - 1)


def _prepared(
    chunks: Iterator[tuple[Chunk, int]], prepare: Callable[[Chunk], None], workers: int
) -> Iterator[tuple[Chunk, int]]:
    """The items of ``chunks`` in order, each after ``prepare(chunk)``, which a pool of ``workers`` threads runs on
    the chunks after the one handed out (each chunk is prepared on its own: the pool changes no digit)."""
    from concurrent.futures import Future, ThreadPoolExecutor

    pending: deque[tuple[Future, tuple[Chunk, int]]] = deque()
    pool = ThreadPoolExecutor(workers, thread_name_prefix="rollout-diag-prepare")
    try:
        for item in chunks:
            pending.append((pool.submit(prepare, item[0]), item))
            if len(pending) > workers:  # a chunk in every worker's hands and one more waiting
                future, ready = pending.popleft()
                future.result()  # raises what prepare raised
                yield ready
        while pending:
            future, ready = pending.popleft()
            future.result()
            yield ready
    finally:
        for future, _ in pending:
            future.cancel()
        pool.shutdown(wait=True)
        close = getattr(chunks, "close", None)
        if close is not None:  # stops the reader's thread when the caller stops early
            close()


# ---------------------------------------------------------------------------------- row groups
def _row_groups(opened: _OpenFile, columns: list[str], rows_per_batch, reader: DumpReader):
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
                yield _whole_steps(opened, _decoded(batch), first_row + done), first_row + done
                done += batch.num_rows
        except (OSError, pa.ArrowException) as exc:
            message = f"row group {group} cannot be decoded ({_one_line(exc)})"
            if reader.strict or metadata.num_row_groups == 1:
                raise InputError(f"{path}: {message}; the file is corrupt or truncated.") from exc
            reader.log.warnings.append(
                f"{path}: {message}; rows {first_row + done}–{first_row + group_rows - 1} skipped."
            )
            for row in range(first_row + done, first_row + group_rows):
                reader.log.skip(SkippedRow(path, row, None, f"row group {group} cannot be decoded"), False)
        first_row += group_rows


def _whole_steps(opened: _OpenFile, batch: pa.RecordBatch, first_row: int) -> pa.RecordBatch:
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


def _column_names(opened: _OpenFile) -> list[str]:
    roles = [name for role, name in opened.columns.names.items() if role not in opened.columns.from_partition]
    return roles + list(opened.extras)


def _extra_values(opened: _OpenFile, batch: pa.RecordBatch | pa.Table, index=None) -> dict[str, ExtraColumn]:
    """Each extra column's values per row (with ``index``: of those batch positions): a numpy array for numbers
    without nulls, else the Arrow array behind :class:`_ArrowValues` (only the worst rows are ever looked at)."""
    values: dict[str, ExtraColumn] = {}
    for name in opened.extras:
        array = batch.column(name)
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        if index is not None:
            array = array.take(pa.array(index))
        if _numeric(array.type) and not array.null_count:
            values[name] = array.to_numpy(zero_copy_only=False)
        else:
            values[name] = _ArrowValues(array)
    return values


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


def _scalar_roles(opened: _OpenFile, batch: pa.RecordBatch, first_row: int, rows: int, index=None):
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


def _policy_versions(opened: _OpenFile, batch, first_row: int, rows, index=None) -> np.ndarray | None:
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


def _flat_numpy(array: pa.Array) -> np.ndarray:
    return array.to_numpy(zero_copy_only=False)


# ---------------------------------------------------------------------------------- sequence layout
def _read_sequences(opened: _OpenFile, reader: DumpReader) -> Iterator[tuple[_Block, int]]:
    path = opened.source.path
    names = opened.columns.names
    # Aim each batch at ~chunk_tokens tokens, from the uncompressed size of the rollout column.
    tokens_per_row = _estimate_tokens_per_row(opened)
    state = {"rows": max(1, int(reader.chunk_tokens / max(tokens_per_row, 1.0)))}

    for batch, first_row in _row_groups(opened, _column_names(opened), lambda: state["rows"], reader):
        rows = batch.num_rows
        if rows == 0:
            continue
        lists = {role: batch.column(names[role]) for role in ("rollout", "trainer", "mask") if role in names}
        lengths = {
            role: pc.list_value_length(array).fill_null(-1).to_numpy(zero_copy_only=False)
            for role, array in lists.items()
        }
        keep = np.ones(rows, dtype=bool)
        if reader.selection is not None:  # rows left out here are neither decoded nor validated
            keep = reader.selection(batch, _batch_steps(opened, batch, rows))
            reader.log.rows_selected_out += int(rows - keep.sum())
            if not keep.any():
                continue
        pending: list[SkippedRow] = []
        step_nulls = _step_nulls(opened, batch)
        if step_nulls is not None:
            for row in np.flatnonzero(step_nulls & keep):
                keep[row] = False
                pending.append(SkippedRow(path, first_row + int(row), names["step"], "null step"))
        if SKIP_REASON in batch.schema.names:  # rows a trainer format could not read (io/formats/base.py)
            reasons = batch.column(SKIP_REASON)
            for row in np.flatnonzero(reasons.is_valid().to_numpy(zero_copy_only=False) & keep):
                keep[row] = False
                column = batch.column(SKIP_COLUMN)[int(row)].as_py()
                pending.append(SkippedRow(path, first_row + int(row), column, reasons[int(row)].as_py()))
        for role, length in lengths.items():
            for row in np.flatnonzero(keep & (length < 0)):
                keep[row] = False
                pending.append(SkippedRow(path, first_row + int(row), names[role], "null list"))
        reference = lengths["rollout"]
        for role in ("trainer", "mask"):
            if role not in lengths:
                continue
            ragged = np.flatnonzero(keep & (lengths[role] != reference))
            if len(ragged):
                offsets = lengths[role][ragged] - reference[ragged]
                reader.log.note_length_offsets(role, names[role], names["rollout"], offsets)
            for row in ragged:
                keep[row] = False
                pending.append(
                    SkippedRow(
                        path,
                        first_row + int(row),
                        names[role],
                        f"list length {int(lengths[role][row])} differs from {names['rollout']}'s "
                        f"{int(reference[row])}",
                    )
                )
        index = None if keep.all() else np.flatnonzero(keep)
        step, sample_id = _scalar_roles(opened, batch, first_row, int(keep.sum()), index)
        if index is not None:
            batch = batch.take(pa.array(index))
        file_row = first_row + (np.arange(rows, dtype=np.int64) if index is None else index.astype(np.int64))
        lengths_kept = reference if index is None else reference[index]
        flat = {role: _flat_numpy(pc.list_flatten(batch.column(names[role]))) for role in lists}
        token_ids = text = None
        if "token_ids" in names and "token_ids" not in opened.columns.from_partition:
            ids = batch.column(names["token_ids"])
            if np.array_equal(pc.list_value_length(ids).fill_null(-1).to_numpy(zero_copy_only=False), lengths_kept):
                token_ids = _as_ids(_flat_numpy(pc.list_flatten(ids)))
        if "tokens" in names and "tokens" not in opened.columns.from_partition:
            tokens = batch.column(names["tokens"])
            if np.array_equal(pc.list_value_length(tokens).fill_null(-1).to_numpy(zero_copy_only=False), lengths_kept):
                text = pc.list_flatten(tokens)
        yield (
            _Block(
                file=path,
                file_row=file_row,
                step=step,
                sample_id=sample_id,
                lengths=lengths_kept.astype(np.int64, copy=False),
                trainer=flat["trainer"],
                rollout=flat["rollout"],
                mask=flat.get("mask"),
                token_ids=token_ids,
                token_text=text,
                policy_version=_policy_versions(opened, batch, first_row, index),
                names=names,
                extra=_extra_values(opened, batch),
                skipped=pending,
            ),
            rows,
        )
        if lengths_kept.size:
            state["rows"] = max(1, int(reader.chunk_tokens / max(float(lengths_kept.mean()), 1.0)))


def _estimate_tokens_per_row(opened: _OpenFile) -> float:
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
def _read_tokens(opened: _OpenFile, reader: DumpReader) -> Iterator[tuple[_Block, int]]:
    """Group consecutive tokens of one (step, sample_id) into a row; the last group waits for the next batch.

    The batch after the current one is read before the current one is cut, so that the last sequence of a
    file travels with the rows before it: a file read in one batch gives one block, as in the sequence layout
    (the same chunks, hence the same float64 sums to the last bit).
    """
    finished: set[tuple[int, str]] = set()
    carry: pa.Table | None = None
    carry_first_row = 0
    batch_rows = lambda: reader.chunk_tokens  # noqa: E731 - one row per token
    batches = _row_groups(opened, _column_names(opened), batch_rows, reader)
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


def _batch_steps(opened: _OpenFile, table: pa.Table | pa.RecordBatch, rows: int) -> np.ndarray:
    """Each row's step, for a row selection (a null step reads as a neighbour's: the row is skipped later anyway)."""
    name = opened.columns.get("step")
    if name is None:
        return np.zeros(rows, dtype=np.int64)
    if "step" in opened.columns.from_partition:
        value = opened.source.partition[name]
        return np.full(rows, value if isinstance(value, int) else 0, dtype=np.int64)
    return _filled_step(table.column(name)).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def _selected(block: _Block, reader: DumpReader) -> _Block:
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
    return block if keep.all() else _drop_rows(block, np.flatnonzero(~keep))


def _step_nulls(opened: _OpenFile, table: pa.Table | pa.RecordBatch) -> np.ndarray | None:
    """bool [n]: rows whose step is null; None when there is none (or no step column)."""
    name = opened.columns.get("step")
    if name is None or "step" in opened.columns.from_partition or not table.column(name).null_count:
        return None
    return table.column(name).is_null().to_numpy(zero_copy_only=False)


def _filled_step(values: pa.Array) -> pa.Array:
    """Null steps take a neighbour's value, so that a null inside a sequence does not cut it in two (the
    sequence is then skipped as a whole, with the null's row)."""
    return pc.fill_null_backward(pc.fill_null_forward(values)).fill_null(0)


def _sequence_changes(opened: _OpenFile, table: pa.Table) -> np.ndarray:
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
    opened: _OpenFile,
    table: pa.Table,
    first_row: int,
    run_lengths: np.ndarray,
    finished: set[tuple[int, str]],
    reader: DumpReader,
) -> _Block:
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

    trainer, rollout, mask = column("trainer"), column("rollout"), column("mask")
    token_ids = column("token_ids")
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
            text = None if text is None else text.take(pa.array(order))
    block = _Block(
        file=path,
        file_row=first_row + run_starts,
        step=step,
        sample_id=sample_id,
        lengths=run_lengths.astype(np.int64),
        trainer=trainer,
        rollout=rollout,
        mask=mask,
        token_ids=_as_ids(token_ids),
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
    return _drop_rows(block, bad_rows) if bad_rows.size else block


# ---------------------------------------------------------------------------------- validation
def _validate(block: _Block, log: ReadLog, strict: bool) -> _Block | None:
    """Skip (and record, in file-row order) rows with a bad mask value, or NaN/inf/positive logprobs on model
    tokens, besides those already found while decoding (null lists, ragged rows, duplicate positions)."""
    rows = len(block.lengths)
    token_row = np.repeat(np.arange(rows), block.lengths)
    offsets = np.concatenate([[0], np.cumsum(block.lengths)])
    bad_row = np.zeros(rows, dtype=bool)
    records = list(block.skipped)
    mask = block.mask
    model = np.ones(len(token_row), dtype=bool) if mask is None else mask == 1

    def flag(bad_token: np.ndarray, role: str, describe) -> None:
        for token in np.flatnonzero(bad_token):
            row = int(token_row[token])
            if bad_row[row]:
                continue
            bad_row[row] = True
            # token layout: the row that holds the bad token; sequence layout: the sequence's row
            file_row = int(block.file_row[row] if block.token_rows is None else block.token_rows[token])
            records.append(
                SkippedRow(
                    block.file, file_row, block.names.get(role, role), describe(token, int(token - offsets[row]))
                )
            )

    if mask is not None:
        flag(
            (mask != 0) & (mask != 1),
            "mask",
            lambda t, p: f"mask value {_fmt(mask[t])} at position {p} (must be 0 or 1)",
        )
    for role, values in (("trainer", block.trainer), ("rollout", block.rollout)):
        with np.errstate(invalid="ignore"):
            nonfinite = model & ~np.isfinite(values)
            positive = model & (values > MAX_POSITIVE_LOGPROB)
        flag(nonfinite, role, lambda t, p, v=values: f"{_fmt(v[t])} logprob at position {p}")
        flag(
            positive,
            role,
            lambda t, p, v=values: f"positive logprob {_fmt(v[t])} at position {p} (logprobs are ≤ 0)",
        )
    for record in sorted(records, key=lambda r: -1 if r.row is None else r.row):
        log.skip(record, strict)  # under --strict the first (lowest) row raises
    if bad_row.any():
        block = _drop_rows(block, np.flatnonzero(bad_row))
    return block if len(block.lengths) else None


def _drop_rows(block: _Block, rows: np.ndarray) -> _Block:
    """The block without ``rows`` (possibly empty); its pending skip records stay with it."""
    keep_row = np.ones(len(block.lengths), dtype=bool)
    keep_row[rows] = False
    keep_token = np.repeat(keep_row, block.lengths)
    kept = np.flatnonzero(keep_row)
    return _Block(
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
    )


def _take(values: ExtraColumn, rows: np.ndarray) -> ExtraColumn:
    return values[rows] if isinstance(values, np.ndarray) else values.take(rows)


def _as_ids(values: np.ndarray | None) -> np.ndarray | None:
    """Token ids as int64; nulls (read as NaN) become -1."""
    if values is None:
        return None
    if values.dtype.kind == "f":
        values = np.where(np.isnan(values), -1, values)
    return values.astype(np.int64, copy=False)


def _fmt(value: float) -> str:
    value = float(value)
    if math.isnan(value):
        return "NaN (or null)"
    if math.isinf(value):
        return "+inf" if value > 0 else "-inf"
    return f"{value:g}"


__all__ = ["DEFAULT_CHUNK_TOKENS", "DumpReader", "ReadLog", "RolloutDiagError"]
