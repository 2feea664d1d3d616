"""A table that fits the terminal: never cuts a number or a name with "…"; folds free text and, when the
columns still do not fit, splits into parts that each repeat the key columns (step, preset, …)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

from rollout_diag.render.cells import Cell, Chunk, Column, Laid, Num, Nums, as_text, column_cells, open_cells
from rollout_diag.render.lines import FAST_ROWS, line_by_line

__all__ = ["Column", "FitTable", "Num", "Nums", "short_title"]

BORDER = 3  # per column: one padding space each side and one border line (plus one for the left edge)


class FitTable:
    """Rows of cells under ``columns``; rendered as one rich Table when it fits the width, else as several."""

    def __init__(self, title: str, columns: Sequence[Column], caption: str | None = None) -> None:
        self.title = title
        self.columns = list(columns)
        self.caption = caption
        self._chunks: list[list[Chunk]] = [[] for _ in self.columns]  # per column, its cells in runs
        self._styles: list[str | None] = []

    def add_row(self, *cells: Cell | None, style: str | None = None) -> None:
        """Plain strings are data: shown as they are (control characters visible), never read as markup;
        ``Num`` cells are numbers, written in their column's one notation."""
        if len(cells) != len(self.columns):
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns")
        for chunks, cell in zip(self._chunks, cells, strict=True):
            open_cells(chunks).append(cell)
        self._styles.append(style)

    def add_rows(self, *columns: Sequence[Cell | None] | Nums) -> None:
        """Rows given column by column (each column as long as the others; cells as ``add_row`` takes them, or a
        ``Nums`` of a column's numbers), unstyled: what ``add_row`` of each row would add."""
        if len(columns) != len(self.columns):
            raise ValueError(f"{len(columns)} columns for {len(self.columns)} columns")
        count = len(columns[0]) if columns else 0
        if any(len(column) != count for column in columns):
            raise ValueError("columns of different lengths")
        for chunks, column in zip(self._chunks, columns, strict=True):
            if isinstance(column, Nums):
                chunks.append(column)
            else:
                open_cells(chunks).extend(column)
        self._styles.extend([None] * count)

    @property
    def rows(self) -> list[tuple[list[Text], str | None]]:
        """Every row as rich Text cells, numbers formatted column by column."""
        laid = self._cells()
        return [([as_text(cell) for cell in laid.row(index)], style) for index, style in enumerate(laid.styles)]

    def _cells(self) -> Laid:
        """As ``rows``, column by column, with a cell of unstyled text as its string (a Text is made only for rich to
        lay out: 200 000 rows × 11 columns of Text objects were 1 GB)."""
        return Laid([column_cells(chunks) for chunks in self._chunks], list(self._styles))

    def needs(self, rows: Laid | None = None) -> list[int]:
        """The narrowest each column can be: its widest cell and longest header word (free text: ``fold_width``)."""
        rows = self._cells() if rows is None else rows
        widths = []
        for index, column in enumerate(self.columns):
            cells = rows.widest(index)
            header = max((cell_len(word) for word in column.header.split()), default=1)
            widths.append(max(header, min(cells, column.fold_width) if column.wrap else cells))
        return widths

    def parts(self, width: int, rows: Laid | None = None, needs: list[int] | None = None) -> list[list[int]]:
        """Column indices of each part: key columns first in every part, the others in order, as many as fit."""
        needs = self.needs(rows) if needs is None else needs
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
        rows = self._cells()
        needs = self.needs(rows)
        parts = self.parts(options.max_width, rows, needs)
        for number, indices in enumerate(parts):
            title = self.title if number == 0 else f"{short_title(self.title)} (continued, {number + 1}/{len(parts)})"
            # title and caption as lines of their own: they wrap at the terminal's width, not the part's
            yield Text(title, style="table.title")
            widths = self._widths(rows, indices, options.max_width, needs)
            lines = (
                line_by_line(self.columns, console, options, rows, indices, widths) if len(rows) >= FAST_ROWS else None
            )
            if lines is None:
                yield self._table(rows, indices, options.max_width, widths)
            else:
                yield from lines
        if self.caption:
            yield Text(self.caption, style="table.caption")

    def _table(
        self,
        rows: Laid,
        indices: Sequence[int],
        width: int,
        widths: Sequence[int | None] | None = None,
    ) -> Table:
        """Natural widths when they fit; else every column at a width of its own: numbers and names at their
        needed width (headers wrap at spaces), free text folded into what is left."""
        widths = self._widths(rows, indices, width) if widths is None else widths
        table = Table()
        for index, fixed in zip(indices, widths, strict=True):
            column = self.columns[index]
            table.add_column(column.header, justify=column.justify, width=fixed, overflow="fold")
        for at, style in enumerate(rows.styles):
            table.add_row(*(as_text(rows.columns[index][at]) for index in indices), style=style)
        return table

    def _widths(
        self,
        rows: Laid,
        indices: Sequence[int],
        width: int,
        needs: list[int] | None = None,
    ) -> list[int | None]:
        needs = self.needs(rows) if needs is None else needs
        natural = [max(needs[i], cell_len(self.columns[i].header), rows.widest(i)) for i in indices]
        if sum(natural) + BORDER * len(indices) + 1 <= width:
            return [None] * len(indices)  # rich lays it out at natural widths
        widths = [needs[i] for i in indices]
        spare = width - sum(widths) - BORDER * len(indices) - 1
        growing = [k for k, i in enumerate(indices) if self.columns[i].wrap and natural[k] > widths[k]]
        while spare > 0 and growing:  # share what is left among the free-text columns, one cell at a time
            for k in list(growing):
                if spare == 0:
                    break
                widths[k] += 1
                spare -= 1
                if widths[k] >= natural[k]:
                    growing.remove(k)
        return [*widths]


def short_title(title: str) -> str:
    """A title's lead (what comes before its first parenthesis or colon), for the later parts of a split table:
    the full title is already above the first part, and a repeated long title wraps into a block of its own."""
    cuts = [index for index in (title.find(" ("), title.find(": ")) if index > 0]
    return title[: min(cuts)] if cuts else title
