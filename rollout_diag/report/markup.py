"""Small HTML helpers: every value is escaped unless it is ``Markup`` built by this package."""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeGuard

from rollout_diag.formatting import number, numbers
from rollout_diag.report.series import clip_text


class Markup(str):
    """HTML this package wrote itself: inserted as is (everything else is escaped)."""


@dataclass(frozen=True)
class Column:
    heading: str
    numeric: bool = False
    title: str = ""  # hover help for the heading


def escape(value: object, limit: int | None = None) -> str:
    text = "" if value is None else str(value)
    return html.escape(clip_text(text, limit) if limit else text, quote=True)


def cell(value: object) -> str:
    """A table cell's content: Markup as is, numbers formatted, anything else escaped and clipped."""
    if isinstance(value, Markup):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return escape(number(value, digits=4))
    return escape(value, limit=200)


def table(columns: Sequence[Column], rows: Iterable[Sequence[object]], row_classes: Sequence[str] = ()) -> Markup:
    head = "".join(
        f'<th class="{"num" if c.numeric else ""}"'
        + (f' title="{escape(c.title)}"' if c.title else "")
        + f">{escape(c.heading)}</th>"
        for c in columns
    )
    grid = [list(row) for row in rows]
    for index in range(len(columns)):  # each column's numbers in one notation (formatting.numbers)
        found = {r: value for r, row in enumerate(grid) if _is_number(value := row[index])}
        for r, text in zip(found, numbers(list(found.values())), strict=True):
            grid[r][index] = Markup(escape(text))
    body = []
    for index, row in enumerate(grid):
        css = row_classes[index] if index < len(row_classes) else ""
        cells = "".join(
            f'<td class="{"num" if c.numeric else ""}">{cell(value)}</td>'
            for c, value in zip(columns, row, strict=True)
        )
        body.append(f'<tr class="{css}">{cells}</tr>' if css else f"<tr>{cells}</tr>")
    return Markup(
        f'<div class="table-wrap"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'
    )


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def badge(level: str) -> Markup:
    css = {"ok": "ok", "watch": "watch", "bad": "bad"}.get(level, "na")
    return Markup(f'<span class="badge {css}">{escape(level)}</span>')


def note(text: str) -> Markup:
    return Markup(f'<p class="note">{escape(text)}</p>')


def paragraph(*parts: str) -> Markup:
    """A paragraph from escaped text parts and Markup parts."""
    return Markup("<p>" + "".join(p if isinstance(p, Markup) else escape(p) for p in parts) + "</p>")


def code(text: object) -> Markup:
    return Markup(f"<code>{escape(text, limit=200)}</code>")


def factor(value: float) -> str:
    """A ratio like "5.2" or "1,234" (for "× the median")."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"
