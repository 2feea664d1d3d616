"""The shape of a saved result: a JSON value checked against a result type, the error naming the field."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Literal

from rollout_diag.errors import InputError


class Number:
    """For :func:`check_shape`: a number that cannot be null (histogram edges and counts are never NaN)."""


_KIND_NAMES = {
    int: "a whole number",
    float: "a number",
    Number: "a number",
    str: "a string",
    bool: "true or false",
    type(None): "null",
}


def check_shape(expected: Any, value: Any, path: str, *, require: bool = True) -> None:
    """Raises InputError naming the field (``steps[3].metrics``) where ``value``, read from JSON, does not have the
    shape of the type ``expected``: a result dataclass (an object with its fields; unknown keys are allowed, and
    missing required ones are an error when ``require``), ``list[X]``, ``tuple[X, ...]``, ``dict[str, X]``, a union,
    ``int``, ``float`` (null allowed: NaN and inf are written as null), ``str``, ``bool`` or ``Any``."""
    problem = _shape_problem(expected, value, path, require)
    if problem is not None:
        where_, message = problem
        raise InputError(f"field '{where_}': {message}." if where_ else f"{message}.")


def _shape_problem(expected: Any, value: Any, path: str, require: bool = True) -> tuple[str, str] | None:
    if expected is Any:
        return None
    if dataclasses.is_dataclass(expected):
        if not isinstance(value, dict):
            return path, f"expected an object, found {found(value)}"
        hints = type_hints(expected)
        for spec in dataclasses.fields(expected):
            if spec.name not in value:  # a field that may be null may be left out (the run's step)
                if require and required(spec) and _shape_problem(hints[spec.name], None, "") is not None:
                    return join_path(path, spec.name), "missing"
                continue
            shape = getattr(expected, "JSON_SHAPES", {}).get(spec.name, hints[spec.name])
            problem = _shape_problem(shape, value[spec.name], join_path(path, spec.name))
            if problem is not None:
                return problem
        return _length_problem(expected, value, path)
    origin, arguments = typing.get_origin(expected), typing.get_args(expected)
    if origin is Literal:
        return (
            None
            if value in arguments and type(value) in {type(a) for a in arguments}
            else (path, f"expected {_describe(expected)}, found {found(value)}")
        )
    if origin in (typing.Union, types.UnionType):
        problems = [_shape_problem(arm, value, path) for arm in arguments]
        if all(problems):
            deepest = max(problems, key=lambda problem: len(problem[0]))  # type: ignore[index]
            if deepest[0] != path:  # the value has the right kind, but something inside it is wrong
                return deepest
            return path, f"expected {' or '.join(_describe(arm) for arm in arguments)}, found {found(value)}"
        return None
    if origin in (list, tuple):
        if not isinstance(value, list):
            return path, f"expected a list, found {found(value)}"
        item = arguments[0] if arguments else Any
        for index, element in enumerate(value):
            problem = _shape_problem(item, element, f"{path}[{index}]")
            if problem is not None:
                return problem
        return None
    if origin is dict:
        if not isinstance(value, dict):
            return path, f"expected an object, found {found(value)}"
        item = arguments[1] if arguments else Any
        for key, element in value.items():
            problem = _shape_problem(item, element, join_path(path, str(key)))
            if problem is not None:
                return problem
        return None
    if expected is float or expected is Number:
        ok = (value is None and expected is float) or (isinstance(value, (int, float)) and not isinstance(value, bool))
    elif expected is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif expected in (str, bool, type(None)):
        ok = isinstance(value, expected)
    else:
        ok = True  # a type this check does not know: left to the constructor
    return None if ok else (path, f"expected {_describe(expected)}, found {found(value)}")


def _length_problem(expected: type, value: dict, path: str) -> tuple[str, str] | None:
    """Where the lists of ``expected.JSON_SAME_LENGTH`` in ``value`` (each a list or absent/null) differ in length
    from the first of them: the field and what it should hold."""
    names = [name for name in getattr(expected, "JSON_SAME_LENGTH", ()) if isinstance(value.get(name), list)]
    for name in names[1:]:
        if len(value[name]) != len(value[names[0]]):
            return (
                join_path(path, name),
                f"expected {len(value[names[0]])} values (one per entry of '{names[0]}'), found {len(value[name])}",
            )
    return None


def type_hints(result_type: type) -> dict[str, Any]:
    return typing.get_type_hints(result_type)


def join_path(path: str, name: str) -> str:
    """``path.name``; a key from the file that holds control characters is shown escaped (messages are one line)."""
    if not name.isprintable():
        name = name.encode("unicode_escape").decode("ascii")
    return f"{path}.{name}" if path else name


def _describe(expected: Any) -> str:
    if typing.get_origin(expected) is Literal:
        return " or ".join(repr(choice) for choice in typing.get_args(expected))
    if dataclasses.is_dataclass(expected) or typing.get_origin(expected) is dict:
        return "an object"
    if typing.get_origin(expected) in (list, tuple):
        return "a list"
    return _KIND_NAMES.get(expected, str(expected))


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
    return value


def required(spec: dataclasses.Field) -> bool:
    return spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING
