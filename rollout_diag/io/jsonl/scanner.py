"""From the compiled scan to Arrow: :class:`Scanner` holds a format's schema as the scan's arrays, runs
``records.scan`` on a block of lines and builds one Arrow table of the accepted lines (:class:`Scanned`).

Schema kinds (``pyarrow`` types of a :data:`FastLines.schema`): ``int64``, ``string``, and lists or lists of lists of
``float64`` / ``int64`` / ``bool``. A JSON ``null`` (or an absent field) is an Arrow null at that place, as pyarrow's
JSON reader gives it; :class:`Scanned` also says which nulls were written out. A list field's null flags are gathered
only where the scan read a null item in it."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from numba import njit

from rollout_diag.io.jsonl import records
from rollout_diag.io.jsonl.records import BOOL_ELEMENT, FLOAT_ELEMENT, INT, INT_ELEMENT, LIST, LIST2, NULL, STRING
from rollout_diag.io.jsonl.words import FLAGS


@njit(**FLAGS)
def _gather(rows, first, count, values):
    """Concatenate ``values[first[r]:first[r] + count[r]]`` over ``rows``; returns (offsets, values)."""
    total = 0
    for r in rows:
        total += count[r]
    out = np.empty(total, values.dtype)
    offsets = np.empty(rows.shape[0] + 1, np.int32)
    offsets[0] = 0
    at = 0
    for i in range(rows.shape[0]):
        r = rows[i]
        for j in range(first[r], first[r] + count[r]):  # a loop, not a slice copy: no size check to compile
            out[at] = values[j]
            at += 1
        offsets[i + 1] = at
    return offsets, out


@dataclass(frozen=True)
class _Field:
    kind: int
    element: int
    arrow: pa.DataType


def _field(data_type: pa.DataType) -> _Field:
    elements = {pa.float64(): FLOAT_ELEMENT, pa.int64(): INT_ELEMENT, pa.bool_(): BOOL_ELEMENT}
    if data_type == pa.int64():
        return _Field(INT, INT_ELEMENT, data_type)
    if data_type == pa.string():
        return _Field(STRING, INT_ELEMENT, data_type)
    if pa.types.is_list(data_type):
        inner = data_type.value_type
        if inner in elements:
            return _Field(LIST, elements[inner], data_type)
        if pa.types.is_list(inner) and inner.value_type in elements:
            return _Field(LIST2, elements[inner.value_type], data_type)
    raise TypeError(f"io.jsonl reads int64, string and (lists of) lists of float64/int64/bool, not {data_type}")


def _announce_compiling() -> None:
    """Say on stderr when the scanner is not in numba's cache yet (its first compile takes seconds)."""
    try:
        cached = records.scan._cache._cache_file._load_index()  # noqa: SLF001  (no public cache query; {} when stale)
    except Exception:  # numba's cache internals moved, or an index it cannot read: say nothing
        return
    if not cached:
        print("rollout-diag: compiling the JSON-lines reader once (about 20 s; cached after).", file=sys.stderr)
        from rollout_diag.engine.kernels import drop_stale_caches
        from rollout_diag.io.jsonl import KERNEL_MODULES

        for module in KERNEL_MODULES:  # an upgrade's first run: the last version's files go
            drop_stale_caches(module)


@dataclass(frozen=True)
class Scanned:
    """What :meth:`Scanner.scan` read: ``rows`` (indexes of the accepted lines in the block), ``table`` (one
    row each, the schema's fields) and ``written_null[row, field]`` (a ``null`` written out, not absent)."""

    rows: np.ndarray
    table: pa.Table
    written_null: np.ndarray


@dataclass(frozen=True)
class _Read:
    """``records.scan``'s arrays for the accepted lines (``present``, ``first``, ``count``: per accepted row and
    field) and its shared element and sub-list arrays."""

    present: np.ndarray
    first: np.ndarray
    count: np.ndarray
    field_nulls: np.ndarray
    sub_first: np.ndarray
    sub_count: np.ndarray
    sub_null: np.ndarray
    floats: np.ndarray
    ints: np.ndarray
    nulls: np.ndarray


class Scanner:
    """Reads blocks of lines into an Arrow table of ``schema``'s fields (see ``io/jsonl/__init__.py``)."""

    def __init__(self, schema: pa.Schema) -> None:
        _announce_compiling()
        self.schema = schema
        self.fields = [_field(field.type) for field in schema]
        names = [name.encode() for name in schema.names]
        self._key_bytes = np.frombuffer(b"".join(names) or b"\0", np.uint8)
        self._key_starts = np.cumsum([0, *map(len, names)]).astype(np.int64)
        self._kinds = np.array([f.kind for f in self.fields], np.int64)
        self._elements = np.array([f.element for f in self.fields], np.int64)

    def scan(self, data: bytes, starts: np.ndarray) -> Scanned:
        """Lines ``data[starts[i]:starts[i + 1]]`` (ASCII or checked UTF-8): the accepted ones, read."""
        buf = np.frombuffer(data, np.uint8)
        buf.flags.writeable = False  # one compiled type whether ``data`` is bytes or a reused buffer
        accepted, field_nulls, status, first, count, sub_first, sub_count, sub_null, floats, ints, nulls = records.scan(
            buf, starts, self._key_bytes, self._key_starts, self._kinds, self._elements
        )
        rows = np.flatnonzero(accepted)
        status = status[rows]
        read = _Read(
            status == records.PRESENT,
            first[rows],
            count[rows],
            field_nulls,
            sub_first,
            sub_count,
            sub_null,
            floats,
            ints,
            nulls,
        )
        columns = [self._column(data, read, k, field) for k, field in enumerate(self.fields)]
        table = pa.Table.from_arrays(columns, schema=self.schema)
        return Scanned(rows, table, status == NULL)

    @staticmethod
    def _column(data: bytes, read: _Read, k: int, field: _Field) -> pa.Array:
        """Field ``k``'s column of the accepted rows."""
        present = read.present[:, k]
        starts_k = np.ascontiguousarray(read.first[:, k])
        if field.kind == INT:
            return pa.array(starts_k, pa.int64(), mask=~present)
        if field.kind == STRING:
            ends = read.count[:, k].tolist()
            values = [
                data[a:b].decode("utf-8") if ok else None
                for a, b, ok in zip(starts_k.tolist(), ends, present.tolist(), strict=True)
            ]
            return pa.array(values, pa.string())
        items = read.ints if field.element != FLOAT_ELEMENT else read.floats.view(np.int64)  # one compiled _gather
        any_null = read.field_nulls[k]  # else the field's items' null flags (all 0) are not gathered
        lengths = np.where(present, read.count[:, k], 0)
        every = np.arange(len(present))
        if field.kind == LIST2:
            offsets, subs = _gather(every, starts_k, lengths, np.arange(len(read.sub_first)))
            inner_offsets, values = _gather(subs, read.sub_first, read.sub_count, items)
            value_nulls = _gather(subs, read.sub_first, read.sub_count, read.nulls)[1] if any_null else None
            inner_nulls = read.sub_null[subs].view(np.bool_)
            inner = pa.ListArray.from_arrays(
                pa.array(inner_offsets),
                _values(values, value_nulls, field.element),
                mask=pa.array(inner_nulls) if inner_nulls.any() else None,
            )
        else:
            offsets, values = _gather(every, starts_k, lengths, items)
            value_nulls = _gather(every, starts_k, lengths, read.nulls)[1] if any_null else None
            inner = _values(values, value_nulls, field.element)
        mask = None if present.all() else pa.array(~present)
        return pa.ListArray.from_arrays(pa.array(offsets), inner, mask=mask)


def _values(values: np.ndarray, value_nulls: np.ndarray | None, element: int) -> pa.Array:
    """``values`` (int64, or float64's bits as int64) as the element type's Arrow array."""
    mask = value_nulls.view(np.bool_) if value_nulls is not None and value_nulls.any() else None
    if element == BOOL_ELEMENT:
        return pa.array(values.astype(np.bool_), pa.bool_(), mask=mask)
    if element == FLOAT_ELEMENT:
        return pa.array(values.view(np.float64), pa.float64(), mask=mask)
    return pa.array(values, pa.int64(), mask=mask)
