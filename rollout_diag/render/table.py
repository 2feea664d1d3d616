"""A table that fits the terminal: never cuts a number or a name with "…"; folds free text and, when the
columns still do not fit, splits into parts that each repeat the key columns (step, preset, …)."""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.segment import Segment, Segments
from rich.table import Table
from rich.text import Text

from rollout_diag.formatting import numbers
from rollout_diag.render.format import visible

BORDER = 3  # per column: one padding space each side and one border line (plus one for the left edge)
# From this many rows a part is laid out by rich for its header and first rows only, and every further row written
# as one line of its own (the bytes rich writes: checked on the first rows, else rich lays out the whole part):
# rich measures and renders cell by cell, minutes for 200 000 steps.
FAST_ROWS = 64
_ONE_LINE = frozenset("\t\n\r\x0b\x0c")  # a cell holding one of these is laid out by rich


@dataclass(frozen=True)
class Num:
    """A number cell, formatted when the table is complete: every number of a column takes the column's
    notation (``formatting.numbers``); ``suffix`` follows it (``" (0.08 %)"``, ``" raw"``)."""

    value: float | int | None
    suffix: str = ""
    digits: int = 4


Cell = str | Text | Num
_Rows = Sequence[tuple[Sequence[str | Text], str | None]]  # laid-out cells of each row, and the row's style


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
        return [([_text(cell) for cell in cells], style) for cells, style in self._cells()]

    def _cells(self) -> list[tuple[list[str | Text], str | None]]:
        """As ``rows``, with a cell of unstyled text as its string (a Text is made only for rich to lay out: 200 000
        rows × 11 columns of Text objects were 1 GB)."""
        formatted: list[list[str | Text]] = [[] for _ in self.raw]
        for index in range(len(self.columns)):
            column = [cells[index] for cells, _ in self.raw]
            texts = iter(_number_texts([cell for cell in column if isinstance(cell, Num)]))
            for row, cell in zip(formatted, column, strict=True):
                if isinstance(cell, Num):
                    row.append(next(texts))
                else:
                    row.append(cell if isinstance(cell, Text) else visible("" if cell is None else cell))
        return [(row, style) for row, (_, style) in zip(formatted, self.raw, strict=True)]

    def _widest(self, rows: _Rows, index: int) -> int:
        """The widest line of column ``index``'s cells in ``rows`` (measured once per rendering of ``rows``)."""
        cached = self.__dict__.get("_widest_of")
        if cached is None or cached[0] is not rows:
            cached = self._widest_of = (rows, {})
        if index not in cached[1]:
            cached[1][index] = max((_longest_line(cells[index]) for cells, _ in rows), default=0)
        return cached[1][index]

    def needs(self, rows: _Rows | None = None) -> list[int]:
        """The narrowest each column can be: its widest cell and longest header word (free text: ``fold_width``)."""
        rows = self.rows if rows is None else rows
        widths = []
        for index, column in enumerate(self.columns):
            cells = self._widest(rows, index)
            header = max((cell_len(word) for word in column.header.split()), default=1)
            widths.append(max(header, min(cells, column.fold_width) if column.wrap else cells))
        return widths

    def parts(self, width: int, rows: _Rows | None = None, needs: list[int] | None = None) -> list[list[int]]:
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
            lines = _line_by_line(self, console, options, rows, indices, widths) if len(rows) >= FAST_ROWS else None
            if lines is None:
                yield self._table(rows, indices, options.max_width, widths)
            else:
                yield from lines
        if self.caption:
            yield Text(self.caption, style="table.caption")

    def _table(
        self,
        rows: _Rows,
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
        for cells, style in rows:
            table.add_row(*(_text(cells[index]) for index in indices), style=style)
        return table

    def _widths(
        self,
        rows: _Rows,
        indices: Sequence[int],
        width: int,
        needs: list[int] | None = None,
    ) -> list[int | None]:
        needs = self.needs(rows) if needs is None else needs
        natural = [max(needs[i], cell_len(self.columns[i].header), self._widest(rows, i)) for i in indices]
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


def _text(cell: str | Text) -> Text:
    """A cell as rich lays it out: unstyled text (already made visible) as a Text of its own."""
    return cell if isinstance(cell, Text) else Text(cell)


def _number_texts(cells: Sequence[Num]) -> list[str]:
    """Number cells of one column, in one notation per precision."""
    shown: dict[int, str] = {}
    for digits in {cell.digits for cell in cells}:
        group = [index for index, cell in enumerate(cells) if cell.digits == digits]
        for index, text in zip(group, numbers([cells[i].value for i in group], digits), strict=True):
            shown[index] = text
    return [shown[index] + cell.suffix for index, cell in enumerate(cells)]


def _longest_line(text: str | Text) -> int:
    if type(text) is str and text.isascii() and text.isprintable():  # every number: one cell per character
        return len(text)
    plain = text if isinstance(text, str) else text.plain
    if "\n" not in plain:
        return cell_len(plain)
    return max(cell_len(line) for line in plain.split("\n"))


def _line_by_line(
    table: FitTable,
    console: Console,
    options: ConsoleOptions,
    rows: _Rows,
    indices: Sequence[int],
    widths: Sequence[int | None],
) -> Iterator[Segment | Segments] | None:
    """One part of ``table`` as rich writes it, at O(1) rich calls per distinct styled cell rather than per cell:
    rich lays out the header and the first two rows at the part's widths; every further row is one line joined
    from its cells. None when that does not give rich's bytes for the first two rows (a row style, a cell that
    wraps or is padded in a way other than rich's justification), and then rich lays out the whole part."""
    columns = [table.columns[index] for index in indices]
    fixed = [
        width if width is not None else max(cell_len(column.header), table._widest(rows, index))
        for width, column, index in zip(widths, columns, indices, strict=True)
    ]
    if any(style is not None for _, style in rows):
        return None
    head = Table()
    for column, width in zip(columns, fixed, strict=True):
        head.add_column(column.header, justify=column.justify, width=width, overflow="fold")
    for cells, _ in rows[:2]:
        head.add_row(*(_text(cells[index]) for index in indices))
    lines = console.render_lines(head, options, pad=False, new_lines=False)
    box = head.box.substitute(options, safe=head.safe_box if head.safe_box is not None else console.safe_box)
    if box is None:
        return None
    styled: dict[tuple, list[Segment]] = {}

    def cell(text: str | Text, column: Column, width: int) -> list[Segment] | str | None:
        plain_text = text if isinstance(text, str) else text.plain
        if isinstance(text, str):
            if plain_text != plain_text.strip() or not _ONE_LINE.isdisjoint(plain_text) or cell_len(plain_text) > width:
                return None
            return _justified(plain_text, column.justify, width)
        if (
            plain_text != plain_text.strip()
            or not _ONE_LINE.isdisjoint(plain_text)
            or cell_len(plain_text) > width
            or text.justify is not None
            or text.overflow is not None
            or text.no_wrap is not None
            or text.end != "\n"
        ):
            return None
        if not text.style and not text.spans:
            return _justified(plain_text, column.justify, width)
        key = (plain_text, str(text.style), tuple(text.spans), column.justify, width)
        if key not in styled:
            if len(styled) >= FAST_ROWS:
                return None
            alone = Table(show_header=False)
            alone.add_column(justify=column.justify, width=width, overflow="fold")
            alone.add_row(text)
            line = console.render_lines(alone, options, pad=False, new_lines=False)[1]
            styled[key] = list(Segment.divide(line, [2, 2 + width, width + 4]))[1]
        return styled[key]

    # a plain cell of printable ASCII (every number) is its own width: justified by str.rjust / str.ljust
    padders = [
        str.rjust if column.justify == "right" else str.ljust if column.justify == "left" else None
        for column in columns
    ]

    def line(cells: list[str | Text]) -> list[Segment] | None:
        segments: list[Segment] = []
        text = box.mid_left + " "
        for number, (index, column, width, pad) in enumerate(zip(indices, columns, fixed, padders, strict=True)):
            value = cells[index]
            if (
                pad is not None
                and type(value) is str
                and len(value) <= width
                and value.isascii()
                and value.isprintable()
                and value[:1] != " "
                and value[-1:] != " "
            ):
                shown: list[Segment] | str | None = pad(value, width)
            else:
                shown = cell(value, column, width)
            if shown is None:
                return None
            if isinstance(shown, str):
                text += shown
            else:
                segments.append(Segment(text))
                segments.extend(shown)
                text = ""
            text += " " + (box.mid_right if number == len(indices) - 1 else box.mid_vertical + " ")
        segments.append(Segment(text))
        return segments

    first = [line(cells) for cells, _ in rows[:2]]
    if any(segments is None for segments in first) or [_ansi(s) for s in first] != [_ansi(s) for s in lines[-3:-1]]:
        return None

    def written() -> Iterator[Segment | Segments]:
        for segments in lines[:-1]:
            yield Segments([*segments, Segment.line()])
        for cells, _ in rows[2:]:
            segments = line(cells)
            if segments is None:  # a cell rich lays out otherwise: that row alone, by rich, without a header
                alone = Table(show_header=False, box=head.box)
                for column, width in zip(columns, fixed, strict=True):
                    alone.add_column(justify=column.justify, width=width, overflow="fold")
                alone.add_row(*(_text(cells[index]) for index in indices))
                for segments in console.render_lines(alone, options, pad=False, new_lines=False)[1:-1]:
                    yield Segments([*segments, Segment.line()])
                continue
            segments.append(Segment.line())
            yield Segments(segments)
        yield Segments([*lines[-1], Segment.line()])

    return written()


def _justified(text: str, justify: str, width: int) -> str:
    pad = width - cell_len(text)
    if justify == "right":
        return " " * pad + text
    if justify == "center":
        return " " * (pad // 2) + text + " " * (pad - pad // 2)
    return text + " " * pad


def _ansi(segments: Sequence[Segment] | None) -> str:
    """``segments`` written with every colour and attribute (to compare two ways of writing one line)."""
    sink = io.StringIO()
    Console(file=sink, force_terminal=True, color_system="truecolor", width=10_000, soft_wrap=True).print(
        Segments(segments or []), end=""
    )
    return sink.getvalue()
