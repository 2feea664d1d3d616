"""A table that fits the terminal: never cuts a number or a name with "…"; folds free text and, when the
columns still do not fit, splits into parts that each repeat the key columns (step, preset, …)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

from rollout_diag.formatting import numbers
from rollout_diag.render.format import plain

BORDER = 3  # per column: one padding space each side and one border line (plus one for the left edge)


@dataclass(frozen=True)
class Num:
    """A number cell, formatted when the table is complete: every number of a column takes the column's
    notation (``formatting.numbers``); ``suffix`` follows it (``" (0.08 %)"``, ``" raw"``)."""

    value: float | int | None
    suffix: str = ""
    digits: int = 4


Cell = str | Text | Num


@dataclass(frozen=True)
class Column:
    """``key`` columns are repeated in every part of a split table; ``wrap`` columns hold free text that may fold."""

    header: str
    justify: Literal["left", "right", "center"] = "right"
    key: bool = False
    wrap: bool = False
    fold_width: int = 24  # a ``wrap`` column folds down to this width before the table is split instead


class FitTable:
    """Rows of cells under ``columns``; rendered as one rich Table when it fits the width, else as several."""

    def __init__(self, title: str, columns: Sequence[Column], caption: str | None = None) -> None:
        self.title = title
        self.columns = list(columns)
        self.caption = caption
        self.raw: list[tuple[list[Cell | None], str | None]] = []

    def add_row(self, *cells: Cell | None, style: str | None = None) -> None:
        """Plain strings are data: shown as they are (control characters visible), never read as markup;
        ``Num`` cells are numbers, written in their column's one notation."""
        if len(cells) != len(self.columns):
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns")
        self.raw.append((list(cells), style))

    @property
    def rows(self) -> list[tuple[list[Text], str | None]]:
        """Every row as rich Text cells, numbers formatted column by column."""
        formatted: list[list[Text]] = [[] for _ in self.raw]
        for index in range(len(self.columns)):
            column = [cells[index] for cells, _ in self.raw]
            texts = iter(_number_texts([cell for cell in column if isinstance(cell, Num)]))
            for row, cell in zip(formatted, column, strict=True):
                if isinstance(cell, Num):
                    row.append(next(texts))
                else:
                    row.append(cell if isinstance(cell, Text) else plain("" if cell is None else cell))
        return [(row, style) for row, (_, style) in zip(formatted, self.raw, strict=True)]

    def needs(self, rows: list[tuple[list[Text], str | None]] | None = None) -> list[int]:
        """The narrowest each column can be: its widest cell and longest header word (free text: ``fold_width``)."""
        rows = self.rows if rows is None else rows
        widths = []
        for index, column in enumerate(self.columns):
            cells = max(_cell_widths(rows, index), default=0)
            header = max((cell_len(word) for word in column.header.split()), default=1)
            widths.append(max(header, min(cells, column.fold_width) if column.wrap else cells))
        return widths

    def parts(self, width: int, rows: list[tuple[list[Text], str | None]] | None = None) -> list[list[int]]:
        """Column indices of each part: key columns first in every part, the others in order, as many as fit."""
        needs = self.needs(rows)
        keys = [i for i, column in enumerate(self.columns) if column.key]
        base = sum(needs[i] + BORDER for i in keys) + 1
        parts: list[list[int]] = []
        current: list[int] = []
        used = base
        for index, column in enumerate(self.columns):
            if column.key:
                continue
            if current and used + needs[index] + BORDER > width:
                parts.append(current)
                current, used = [], base
            current.append(index)
            used += needs[index] + BORDER
        if current or not parts:
            parts.append(current)
        return [sorted(keys + part) for part in parts]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        rows = self.rows
        parts = self.parts(options.max_width, rows)
        for number, indices in enumerate(parts):
            title = self.title if number == 0 else f"{short_title(self.title)} (continued, {number + 1}/{len(parts)})"
            # title and caption as lines of their own: they wrap at the terminal's width, not the part's
            yield Text(title, style="table.title")
            yield self._table(rows, indices, options.max_width)
        if self.caption:
            yield Text(self.caption, style="table.caption")

    def _table(
        self,
        rows: list[tuple[list[Text], str | None]],
        indices: Sequence[int],
        width: int,
    ) -> Table:
        """Natural widths when they fit; else every column at a width of its own: numbers and names at their
        needed width (headers wrap at spaces), free text folded into what is left."""
        widths = self._widths(rows, indices, width)
        table = Table()
        for index, fixed in zip(indices, widths, strict=True):
            column = self.columns[index]
            table.add_column(column.header, justify=column.justify, width=fixed, overflow="fold")
        for cells, style in rows:
            table.add_row(*(cells[index] for index in indices), style=style)
        return table

    def _widths(
        self, rows: list[tuple[list[Text], str | None]], indices: Sequence[int], width: int
    ) -> list[int | None]:
        needs = self.needs(rows)
        natural = [max(needs[i], cell_len(self.columns[i].header), *_cell_widths(rows, i)) for i in indices]
        if sum(natural) + BORDER * len(indices) + 1 <= width:
            return [None] * len(indices)  # rich lays it out at natural widths
        widths: list[int | None] = [needs[i] for i in indices]
        spare = width - sum(widths) - BORDER * len(indices) - 1
        growing = [k for k, i in enumerate(indices) if self.columns[i].wrap and natural[k] > widths[k]]
        while spare > 0 and growing:  # share what is left among the free-text columns, one cell at a time
            for k in list(growing):
                if spare == 0:
                    break
                widths[k] = (widths[k] or 0) + 1
                spare -= 1
                if (widths[k] or 0) >= natural[k]:
                    growing.remove(k)
        return widths


def short_title(title: str) -> str:
    """A title's lead (what comes before its first parenthesis or colon), for the later parts of a split table:
    the full title is already above the first part, and a repeated long title wraps into a block of its own."""
    cuts = [index for index in (title.find(" ("), title.find(": ")) if index > 0]
    return title[: min(cuts)] if cuts else title


def _number_texts(cells: Sequence[Num]) -> list[Text]:
    """Number cells of one column, in one notation per precision."""
    shown: dict[int, str] = {}
    for digits in {cell.digits for cell in cells}:
        group = [index for index, cell in enumerate(cells) if cell.digits == digits]
        for index, text in zip(group, numbers([cells[i].value for i in group], digits), strict=True):
            shown[index] = text
    return [Text(shown[index] + cell.suffix) for index, cell in enumerate(cells)]


def _cell_widths(rows: list[tuple[list[Text], str | None]], index: int) -> list[int]:
    return [_longest_line(cells[index]) for cells, _ in rows]


def _longest_line(text: Text) -> int:
    return max((cell_len(line) for line in text.plain.split("\n")), default=0)
