"""Number formatting shared by every table."""

from __future__ import annotations

import math

LEVEL_STYLE = {"ok": "green", "watch": "yellow", "bad": "bold red", "n/a": "dim"}


def number(value: float | int | None, digits: int = 6) -> str:
    """``digits`` significant digits; integers as integers; NaN/None as a dash."""
    if value is None:
        return "–"
    if isinstance(value, int):
        return f"{value:,}"
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value):,}"
    return f"{value:.{digits}g}"


def percent(value: float | None) -> str:
    """2 decimals; tiny non-zero shares keep 2 significant digits instead of rounding to 0.00 %."""
    if value is None or math.isnan(value):
        return "–"
    if 0 < abs(value) < 1e-4:
        return f"{100.0 * value:.2g} %"
    return f"{100.0 * value:.2f} %"


def level(text: str) -> str:
    """A verdict level with its colour, as rich markup."""
    return f"[{LEVEL_STYLE.get(text, '')}]{text}[/]"
