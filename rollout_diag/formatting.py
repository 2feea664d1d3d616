"""Number and text formatting both renderers use (terminal tables and the HTML report): short numbers, percentages,
and data strings with their control characters made visible. Pure: no rich, torch or plotly."""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

ExtraValue = float | int | bool | str | None  # a row's value of an extra dump column (reward, advantage, …)

FIXED_RANGE = (0.01, 1e4)  # |value| in this range prints as 0.01691 or 1234; outside it as 3.42e-3
# Invisible characters that reorder or hide text (bidi overrides, zero-width): shown like control characters.
HIDDEN = frozenset("\u061c\u200b\u200c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\ufeff")


def number(value: float | int | None, digits: int = 4) -> str:
    """``digits`` significant digits (trailing zeros dropped), scientific with a short exponent (``3.421e-3``)
    outside 0.01–10 000; integers (and integral floats) with thousands separators; None and NaN as a dash."""
    return number_in(value, digits, None)


def numbers(values: Sequence[float | int | None], digits: int = 4) -> list[str]:
    """One table column: as :func:`number`, except that the column takes one notation: when any of its
    non-integral values needs scientific notation, every non-integral value below 1 in magnitude is written in it
    (counts and integral values stay integers; 1 ≤ |value| < 10 000 stays fixed: ``-13.05``, not ``-1.305e1``), so
    that a column never mixes ``0.1115`` with ``1.13e-4``."""
    scientific = any(needs_scientific(value, digits) for value in values)
    return [number_in(value, digits, scientific) for value in values]


def needs_scientific(value: float | int | None, digits: int) -> bool:
    """Whether ``value`` with ``digits`` significant digits is written in scientific notation (never for None,
    integers, integral floats, zero or non-finite values)."""
    if value is None or isinstance(value, (bool, int)):
        return False
    value = float(value)
    if not math.isfinite(value) or value == 0 or (value == int(value) and abs(value) < 1e15):
        return False
    return "e" in _fixed(value, digits) or not FIXED_RANGE[0] <= abs(value) < FIXED_RANGE[1]


def _fixed(value: float, digits: int) -> str:
    return f"{value:.{digits}g}"


def reads_fixed(value: float, digits: int) -> bool:
    """Whether a value in a scientific column still prints fixed: 1 ≤ |value| < 10 000 (a logprob, an O(1) ratio)
    reads as ``-13.05`` rather than ``-1.305e1``, no wider, and cannot pass for a small number in scientific
    notation (its integer part is not 0); below 1 the column's notation holds (no ``0.1115`` beside ``1.13e-4``)."""
    return 1.0 <= abs(value) < FIXED_RANGE[1] and "e" not in _fixed(value, digits)


def number_in(value: float | int | None, digits: int, scientific: bool | None) -> str:
    """:func:`number` in a given notation: ``scientific`` True or False as a column decided it
    (:func:`numbers`), None to decide for this value alone."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return f"{value:,}"
    value = float(value)
    if math.isnan(value):
        return "–"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value):,}"
    if scientific is None:
        scientific = needs_scientific(value, digits)
    if not scientific or reads_fixed(value, digits):
        return _fixed(value, digits)
    mantissa, exponent = f"{value:.{max(digits - 1, 0)}e}".split("e")
    if "." in mantissa:
        mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent)}"


def change(a: float | None, b: float | None) -> str:
    """B against A in words: ``109× lower``, ``2.4× higher``, ``same``; a dash where a ratio means nothing (a side
    missing, zero or negative)."""
    if a is None or b is None or not a > 0 or not b > 0:
        return "–"
    ratio = b / a
    factor = ratio if ratio >= 1 else 1 / ratio
    shown = f"{factor:,.0f}" if factor >= 100 else number(factor, 3)
    if shown == "1":
        return "same"
    return f"{shown}× {'higher' if ratio > 1 else 'lower'}"


def extra_cell(value: ExtraValue) -> str:
    """An extra column's value: numbers as every table shows them, booleans as JSON spells them, null as a dash."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return number(value) if isinstance(value, float) else value


def percent(value: float | None) -> str:
    """A share as a percentage with 2 decimals, always; a non-zero share that would round to 0.00 % reads
    ``< 0.01 %`` (``> -0.01 %`` below zero) instead. None and NaN as a dash."""
    if value is None or math.isnan(value):
        return "–"
    if 0 < abs(value) < 5e-5:
        return "< 0.01 %" if value > 0 else "> -0.01 %"
    return f"{100.0 * value:.2f} %"


def visible(text: object) -> str:
    """``text`` with every control character (ESC, CR, BEL, C1 codes…) and every invisible reordering character
    written as an escape (``\\x1b``, ``\\u202e``): data can never move the cursor, clear the screen, open a link
    or hide itself on a terminal. Newlines and tabs become ``\\n`` and ``\\t`` (a cell stays one line)."""
    out = []
    for char in str(text):
        if char in HIDDEN or unicodedata.category(char) in ("Cc", "Zl", "Zp"):
            code = ord(char)
            out.append(
                {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(char)
                or (f"\\x{code:02x}" if code < 256 else f"\\u{code:04x}")
            )
        else:
            out.append(char)
    return "".join(out)


def token_cell(text: str | None, token_id: int | None) -> str | None:
    """A token as tables show it: its text and its id (``" the #279"``), the text alone (a dump with text and no
    ids), ``#279`` (ids and no text: no ``tokens`` column, no ``--tokenizer``), or None (neither)."""
    if text is None:
        return None if token_id is None else f"#{token_id}"
    return text if token_id is None else f"{text} #{token_id}"


# ----------------------------------------------------------------------- --by groups and --where / --steps
GROUPS_SHOWN = 12  # groups per grouping in the terminal and the report; JSON, dataframes and Parquet keep every one


def group_label(value: ExtraValue) -> str:
    """A group's value as tables show it: rows whose value is null as "(null)", numbers as their digits."""
    if value is None:
        return "(null)"
    if isinstance(value, float):
        return number(value)
    return str(value)


def selection_sentence(selection: Mapping[str, Any]) -> str:
    """The rows a result is about (``--where``, ``--steps``: its ``selection``), one sentence: "Rows (where reward >
    0, steps 100 to 300): 1,234 kept, 5,678 left out (not decoded)."."""
    parts = []
    if selection.get("where") is not None:
        parts.append(f"where {selection['where']}")
    if selection.get("steps") is not None:
        first, last = selection["steps"]
        if first is not None and last is not None:
            parts.append(f"step {first}" if first == last else f"steps {first} to {last}")
        else:
            parts.append(f"steps from {first}" if first is not None else f"steps up to {last}")
    kept, left_out = selection.get("rows_kept", 0), selection.get("rows_left_out", 0)
    return f"Rows ({', '.join(parts)}): {kept:,} kept, {left_out:,} left out (not decoded)."
