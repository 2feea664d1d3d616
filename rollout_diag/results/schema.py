"""A saved result read back is checked against its JSON schema (the repository's ``schemas/``, shipped in the package
as ``rollout_diag/schemas``) with jsonschema; the first problem is named in one line, ``field 'steps[3].rows':
expected a whole number, found a string ('3')``.

Reading is lenient where a document of another build may differ and still be read: fields at the top may be absent
(each result says which it needs) and keys this build does not know are allowed (``additionalProperties: false`` and
``propertyNames`` are for writing; ``tests/results/test_schema.py`` holds every written document to them)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout_diag.errors import InputError
from rollout_diag.results.shapes import found, join_path

if TYPE_CHECKING:  # jsonschema loads when a document is read, not with every command
    from jsonschema import ValidationError

SCHEMAS = Path(__file__).resolve().parent.parent / "schemas"
_KINDS = {
    "object": "an object",
    "array": "a list",
    "number": "a number",
    "integer": "a whole number",
    "string": "a string",
    "boolean": "true or false",
    "null": "null",
}
_BOUNDS = {"minimum": "≥", "maximum": "≤", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}


@cache
def _validator(name: str) -> Any:
    """A validator of ``schemas/<name>`` that reads as this module says: keys this build does not know are allowed
    (``additionalProperties: false`` and ``propertyNames`` are for writing), the top-level fields are the result's own
    to require, and the schema version is ``document.schema_version``'s to check."""
    from jsonschema import Draft202012Validator, validators
    from referencing import Registry, Resource

    closed = Draft202012Validator.VALIDATORS["additionalProperties"]

    def open_keys(validator: Any, allowed: Any, instance: Any, schema: Mapping[str, Any]) -> Iterable[Any]:
        return () if allowed is False else closed(validator, allowed, instance, schema)

    reading = validators.extend(Draft202012Validator, {"additionalProperties": open_keys, "propertyNames": _no_error})
    resources = []
    for path in sorted(SCHEMAS.glob("*.schema.json")):
        contents = json.loads(path.read_text(encoding="utf-8"))
        resources.append((contents["$id"], Resource.from_contents(contents)))
    schema = json.loads((SCHEMAS / name).read_text(encoding="utf-8"))
    schema.pop("required", None)
    schema["properties"].pop("schema_version", None)
    return reading(schema, registry=Registry().with_resources(resources))


def _no_error(*arguments: Any) -> Iterable[Any]:
    return ()


def check_document(document: Any, schema: str) -> None:
    """Raises InputError naming the first field of ``document`` that the schema ``schema`` (a file name of
    ``schemas/``) does not allow, in the order the schema lists its fields."""
    error = next(iter(_validator(schema).iter_errors(document)), None)
    if error is not None:
        path, message = _problem(error)
        raise InputError(f"field '{path}': {message}." if path else f"{message}.")


def _depth(error: ValidationError) -> int:
    return len(error.absolute_path) + (error.validator == "required")


def _problem(error: ValidationError) -> tuple[str, str]:
    """(field, what is wrong) of one error; for a value that fits none of several shapes (``oneOf``), the problem
    inside the shape it comes closest to, else every shape it could have had."""
    if error.context:
        deepest = max(_depth(inner) for inner in error.context)
        if deepest > _depth(error):
            return _problem(next(inner for inner in error.context if _depth(inner) == deepest))
        kinds = [_kinds(inner.validator_value) for inner in error.context if inner.validator == "type"]
        return _path(error.absolute_path), f"expected {' or '.join(kinds)}, found {found(error.instance)}"
    path = _path(error.absolute_path)
    if error.validator == "required":
        missing = next(name for name in error.validator_value if name not in error.instance)
        return join_path(path, missing), "missing"
    if error.validator == "type":
        return path, f"expected {_kinds(error.validator_value)}, found {found(error.instance)}"
    if error.validator in ("enum", "const"):
        choices = error.validator_value if error.validator == "enum" else [error.validator_value]
        return path, f"expected {' or '.join(repr(choice) for choice in choices)}, found {found(error.instance)}"
    if error.validator == "minItems":
        return path, f"expected at least {error.validator_value} value(s), found {len(error.instance)}"
    if error.validator in _BOUNDS:
        return path, f"expected {_BOUNDS[error.validator]} {error.validator_value}, found {found(error.instance)}"
    return path, error.message


def _kinds(value: str | list[str]) -> str:
    names = [value] if isinstance(value, str) else [name for name in value if name != "null"] or ["null"]
    return " or ".join(_KINDS.get(name, name) for name in names)


def _path(parts: Iterable[str | int]) -> str:
    path = ""
    for part in parts:
        path = f"{path}[{part}]" if isinstance(part, int) else join_path(path, part)
    return path
