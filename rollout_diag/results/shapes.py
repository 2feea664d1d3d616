"""Reading a saved result's items back into their types (JSON null as NaN where a number was written), and how a
field and a JSON value are named in a one-line error. The document's shape is checked by ``schema.py``."""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any

from rollout_diag.errors import InputError


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


def item_from_json(item_type: type, raw: dict[str, Any]) -> Any:
    """One list item; keys this build does not know (derived ones such as ``trainer_prob``) are left out, and a null
    where the field is a number (NaN or inf when written) comes back as NaN."""
    hints = type_hints(item_type)
    return item_type(**{key: nan_nulls(hints[key], value) for key, value in raw.items() if key in hints})


def nan_nulls(expected: Any, value: Any) -> Any:
    if expected is float:
        return math.nan if value is None else value
    origin, arguments = typing.get_origin(expected), typing.get_args(expected)
    if origin is dict and arguments[1:] == (float,) and isinstance(value, dict):
        return {key: math.nan if item is None else item for key, item in value.items()}
    if origin is list and arguments == (float,) and isinstance(value, list):
        return [math.nan if item is None else item for item in value]
    if (
        origin is list
        and arguments
        and isinstance(arguments[0], type)
        and dataclasses.is_dataclass(arguments[0])
        and isinstance(value, list)
    ):
        return [item_from_json(arguments[0], item) if isinstance(item, dict) else item for item in value]
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
