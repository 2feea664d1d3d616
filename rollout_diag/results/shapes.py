"""A result's items as JSON and read back into their types, field by field (:class:`JsonItem`: a field is written as
it is and read as written, a null where a number was written as NaN, a nested item by its own type, unless the field
declares otherwise with :func:`json_as`), and how a field and a JSON value are named in a one-line error. The
document's shape is checked by ``schema.py``."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from rollout_diag.errors import InputError

Item = TypeVar("Item", bound="JsonItem")


def json_number(value: Any) -> Any:
    """NaN and ±inf have no JSON spelling: they become null (the schema allows it for metrics)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def json_float(value: Any) -> float:
    """A number written by :func:`json_number`, as a float: null (NaN or ±inf when written) back as NaN."""
    return math.nan if value is None else float(value)


_DEFAULT: Any = object()  # a key absent from a document: the field's default (none: the key is required)


@dataclasses.dataclass(frozen=True)
class JsonField:
    """How one field of a :class:`JsonItem` is written and read where not as it is (see :func:`json_as`)."""

    key: str | None = None  # the JSON key (None: the field's name)
    write: Callable[[Any], Any] | None = None  # the value -> its JSON (None: as it is)
    read: Callable[[Any], Any] | None = None  # its JSON -> the value (None: by the field's type)
    absent: Any = _DEFAULT  # the JSON read where the key is absent
    then: tuple[str, ...] = ()  # derived numbers (properties) written right after the field; not read back


def json_as(
    *,
    key: str | None = None,
    write: Callable[[Any], Any] | None = None,
    read: Callable[[Any], Any] | None = None,
    absent: Any = _DEFAULT,
    then: tuple[str, ...] = (),
) -> dict[str, JsonField]:
    """A dataclass field's ``metadata`` (``field(metadata=json_as(…))``): the field is written under ``key``, through
    ``write``, read through ``read``, ``absent`` taken as its JSON where a document lacks the key, and the properties
    ``then`` written after it. Fields that share a key are one entry, at the first one's place: its ``write`` takes
    their values as a tuple and its ``read`` gives them back as one."""
    return {"json": JsonField(key, write, read, absent, then)}


def optional(function: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``function`` of a value, None kept as None (a ``write`` or ``read`` of an optional field)."""
    return lambda value: None if value is None else function(value)


def item_json(item: JsonItem) -> dict[str, Any]:
    """A nested item's own JSON (a ``write`` of an item field, with :func:`optional` or :func:`each`)."""
    return item.to_json()


def each(function: Callable[[Any], Any]) -> Callable[[Any], list[Any]]:
    """``function`` of every item of a list (a ``write`` or ``read`` of a list field)."""
    return lambda values: [function(value) for value in values]


@dataclasses.dataclass(frozen=True)
class _Entry:
    """One key of an item's JSON: the fields it holds, how they are written and read, and their type (one field)."""

    key: str
    names: tuple[str, ...]
    spec: JsonField
    hint: Any
    required: bool


def _entries(item_type: type) -> tuple[_Entry, ...]:
    found = _ENTRIES.get(item_type)
    if found is None:
        hints = type_hints(item_type)
        grouped: dict[str, list[dataclasses.Field]] = {}
        for spec in dataclasses.fields(item_type):
            grouped.setdefault(spec.metadata.get("json", _AS_IT_IS).key or spec.name, []).append(spec)
        found = _ENTRIES[item_type] = tuple(
            _Entry(
                key,
                tuple(spec.name for spec in specs),
                specs[0].metadata.get("json", _AS_IT_IS),
                hints[specs[0].name],
                any(required(spec) for spec in specs),
            )
            for key, specs in grouped.items()
        )
    return found


_AS_IT_IS = JsonField()
_ENTRIES: dict[type, tuple[_Entry, ...]] = {}  # each item type's keys, found once


class JsonItem:
    """A dataclass mixin: ``to_json`` writes every field under its key, in field order; ``from_json`` reads them back
    (keys this build does not know, derived ones such as ``trainer_prob``, are left out). Raises KeyError for a
    required key the JSON lacks."""

    def to_json(self) -> dict[str, Any]:
        return item_to_json(self)

    @classmethod
    def from_json(cls: type[Item], raw: Mapping[str, Any]) -> Item:
        return item_from_json(cls, raw)


def type_hints(result_type: type) -> dict[str, Any]:
    return typing.get_type_hints(result_type)


def join_path(path: str, name: str) -> str:
    """``path.name``; a key from the file that holds control characters is shown escaped (messages are one line)."""
    if not name.isprintable():
        name = name.encode("unicode_escape").decode("ascii")
    return f"{path}.{name}" if path else name


def found(value: Any) -> str:
    """How a JSON value is named in an error: its JSON kind and (short) text."""
    kind = (
        "null"
        if value is None
        else "true/false"
        if isinstance(value, bool)
        else "a number"
        if isinstance(value, (int, float))
        else "a string"
        if isinstance(value, str)
        else "a list"
        if isinstance(value, list)
        else "an object"
        if isinstance(value, dict)
        else type(value).__name__
    )
    if isinstance(value, (list, dict)) or value is None:
        return kind
    text = repr(value)
    return f"{kind} ({text[:40]}{'…' if len(text) > 40 else ''})"


def item_to_json(item: Any) -> dict[str, Any]:
    """The JSON of the dataclass ``item``: every field under its key, in field order, as :class:`JsonItem` writes it
    (a type that declares no field: every field as it is)."""
    out: dict[str, Any] = {}
    for entry in _entries(type(item)):
        names = entry.names
        value = getattr(item, names[0]) if len(names) == 1 else tuple(getattr(item, name) for name in names)
        out[entry.key] = value if entry.spec.write is None else entry.spec.write(value)
        for name in entry.spec.then:
            out[name] = json_number(getattr(item, name))
    return out


def item_from_json(item_type: type, raw: Mapping[str, Any]) -> Any:
    """The dataclass ``item_type`` read from its JSON ``raw``, field by field as :class:`JsonItem` reads one (a type
    that declares no field reads every field by its type). Raises KeyError for a required key ``raw`` lacks."""
    values: dict[str, Any] = {}
    for entry in _entries(item_type):
        if entry.key in raw:
            written = raw[entry.key]
        elif entry.spec.absent is not _DEFAULT:
            written = entry.spec.absent
        elif entry.required:
            raise KeyError(entry.key)
        else:
            continue
        value = entry.spec.read(written) if entry.spec.read is not None else value_from_json(entry.hint, written)
        values.update(zip(entry.names, value, strict=True) if len(entry.names) > 1 else [(entry.names[0], value)])
    return item_type(**values)


def value_from_json(expected: Any, value: Any) -> Any:
    """A field's value from its JSON by its type ``expected``: a null where a number (or a list or dict of numbers) was
    written as NaN, an item of a dataclass type (or a list of them; None for an optional one) by its ``from_json``."""
    if expected is float:
        return math.nan if value is None else value
    if isinstance(expected, type) and dataclasses.is_dataclass(expected) and isinstance(value, dict):
        return expected.from_json(value) if hasattr(expected, "from_json") else item_from_json(expected, value)
    origin, arguments = typing.get_origin(expected), typing.get_args(expected)
    if origin in (typing.Union, types.UnionType) and type(None) in arguments and len(arguments) == 2:
        return None if value is None else value_from_json(arguments[arguments[0] is type(None)], value)
    if origin is dict and arguments[1:] == (float,) and isinstance(value, dict):
        return {key: math.nan if item is None else item for key, item in value.items()}
    if origin is list and arguments == (float,) and isinstance(value, list):
        return [math.nan if item is None else item for item in value]
    if origin in (list, Sequence) and arguments and dataclasses.is_dataclass(arguments[0]) and isinstance(value, list):
        return [value_from_json(arguments[0], item) for item in value]
    return value


def required(spec: dataclasses.Field) -> bool:
    return spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING


def check_same_lengths(rows: Any, names: tuple[str, ...], path: str) -> None:
    """Raises InputError where, in an item of ``rows`` (a list read from JSON), the lists named ``names`` (each a list
    or absent/null) differ in length from the first of them: one value per listed token, which a schema cannot say."""
    for index, row in enumerate(rows if isinstance(rows, list) else []):
        listed = [name for name in names if isinstance(row, dict) and isinstance(row.get(name), list)]
        for name in listed[1:]:
            if len(row[name]) != len(row[listed[0]]):
                raise InputError(
                    f"field '{join_path(f'{path}[{index}]', name)}': expected {len(row[listed[0]])} values (one per "
                    f"entry of '{listed[0]}'), found {len(row[name])}."
                )
