"""Named exceptions. Every message is one line: where (file, row, column), what, then a hint.

The CLI turns any :class:`RolloutDiagError` into ``Error: <message>`` and exit code 1; nothing else
in the package prints or exits.
"""

from __future__ import annotations


class RolloutDiagError(Exception):
    """Base of every error rollout-diag raises on purpose (bad input, bad options)."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message, hint)  # both in args, so the error survives pickling (worker processes)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if self.hint is None else f"{self.message} Hint: {self.hint}"


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
