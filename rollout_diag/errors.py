"""Named exceptions. Every message is one line: where (file, row, column), what, then a hint.

The CLI turns any :class:`RolloutDiagError` into ``Error: <message>`` and exit code 1; nothing else
in the package prints or exits.
"""

from __future__ import annotations

import re
from collections.abc import Callable

OPTION = re.compile(r"\{opt:(\w+)\}(=?)")  # an option named in a message: {opt:max_rounds}, {opt:top_k}=0


def option_name(name: str) -> str:
    """How a message names the library option ``name`` (a keyword argument); the CLI shows its flag instead."""
    return f"{{opt:{name}}}"


class RolloutDiagError(Exception):
    """Base of every error rollout-diag raises on purpose (bad input, bad options).

    Messages name options as ``{opt:NAME}`` (see :func:`option_name`): ``str(error)`` says ``NAME`` (the library's
    keyword argument), the CLI says its flag (``render(flag_of, " ")``), so each caller reads its own terms."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message, hint)  # both in args, so the error survives pickling (worker processes)
        self.message = message
        self.hint = hint

    def render(self, term: Callable[[str], str] = str, assign: str = "=") -> str:
        """The message (and hint) with each named option spelled by ``term(NAME)``, and ``NAME=value`` as
        ``term(NAME) + assign + value`` (the CLI: ``--max-rounds 0``; the library: ``max_rounds=0``)."""
        text = self.message if self.hint is None else f"{self.message} Hint: {self.hint}"
        return OPTION.sub(lambda found: term(found.group(1)) + (assign if found.group(2) else ""), text)

    def __str__(self) -> str:
        return self.render()


def where(file: str | None = None, row: int | None = None, column: str | None = None) -> str:
    """Format a location prefix ``file: row 12, column 'x': `` (parts that are None are left out)."""
    parts = []
    if row is not None:
        parts.append(f"row {row}")
    if column is not None:
        parts.append(f"column '{column}'")
    inner = ", ".join(parts)
    if file is None:
        return f"{inner}: " if inner else ""
    return f"{file}: {inner}: " if inner else f"{file}: "


class InputError(RolloutDiagError):
    """A file cannot be read at all: missing, not Parquet, truncated, empty, wrong column types."""


class ColumnError(InputError):
    """A required column is missing, or two columns claim the same role."""


class DataError(InputError):
    """Values are invalid (NaN, positive logprobs, bad masks, ragged rows) and --strict forbids skipping."""


class ConfigError(RolloutDiagError):
    """An option is invalid: a threshold spec, a preset name, a column mapping, a device."""
