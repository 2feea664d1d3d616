"""Option values without pydantic: Typer (0.29) turns every option's text into its type through a pydantic
TypeAdapter; importing pydantic and building ~20 adapters took 0.24 s of the 0.46 s a missing-file error took
(docs/benchmarks.md, issue 39). The options here are str, int, float, Path, an Enum, bool or lists of those: plain
text is converted as pydantic would; anything else (a bad number, an unknown choice) goes to typer's own adapter,
whose message is unchanged."""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Iterable
from enum import Enum
from pathlib import Path
from typing import Any

_PLAIN_INT = re.compile(r"[+-]?\d+")
_PLAIN_FLOAT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_UNCONVERTED = object()


def _light_value(annotation: Any, value: Any) -> Any:
    """``value`` (the option's text, or its default) as ``annotation``, or _UNCONVERTED where typer should decide."""
    if annotation is str or annotation is bool:
        return value if isinstance(value, annotation) else _UNCONVERTED
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        return int(value) if isinstance(value, str) and _PLAIN_INT.fullmatch(value) else _UNCONVERTED
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        return float(value) if isinstance(value, str) and _PLAIN_FLOAT.fullmatch(value) else _UNCONVERTED
    if annotation is Path:
        return value if isinstance(value, Path) else Path(value) if isinstance(value, str) and value else _UNCONVERTED
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        if isinstance(value, annotation):
            return value
        return next((member for member in annotation if member.value == value), _UNCONVERTED)
    return _UNCONVERTED


def light_coercion(params: Iterable[Any]) -> None:
    """Give each of the options ``params`` whose type :func:`_light_value` knows a converter that needs no pydantic;
    typer's own is built only for a value it cannot convert. A typer without these internals keeps its own."""
    try:
        from typer._coercion import RuntimeParam, build_runtime_param
    except ImportError:
        return

    @dataclasses.dataclass(frozen=True)
    class LightParam(RuntimeParam):
        descriptor: Any

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            item_type = self.annotation
            if typing.get_origin(item_type) is list:
                item_type = typing.get_args(item_type)[0]
                items = [_light_value(item_type, item) for item in value] if isinstance(value, (list, tuple)) else None
                if items is not None and _UNCONVERTED not in items:
                    return items
            else:
                converted = _light_value(item_type, value)
                if converted is not _UNCONVERTED:
                    return converted
            # typer's own conversion, for what the light path leaves (typer has no public hook for it)
            return build_runtime_param(self.descriptor)._coerce_value(value, param=param, ctx=ctx)  # noqa: SLF001

    for param in params:
        descriptor = getattr(param, "type_descriptor", None)
        info = getattr(descriptor, "parameter_info", None)
        if (
            getattr(param, "_runtime_param", False) is not None
            or descriptor is None
            or info is None
            or descriptor.file_annotation is not None
            or getattr(info, "parser", None) is not None
            or getattr(info, "click_type", None) is not None
        ):
            continue
        annotation = descriptor.annotation
        item = typing.get_args(annotation)[0] if typing.get_origin(annotation) is list else annotation
        if item in (str, bool, int, float, Path) or (isinstance(item, type) and issubclass(item, Enum)):
            param._runtime_param = LightParam(info, annotation, descriptor)  # noqa: SLF001  (typer's lazy slot)
