"""A part of a table written line by line, as rich would write it: rich lays out the header and the first two rows,
every further row is joined from its cells (plain text padded by hand, a styled cell laid out by rich once). What
rollout_diag/render/table.py uses from ``FAST_ROWS`` rows on: rich measures and renders cell by cell, minutes for
200 000 steps."""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator, Sequence
from itertools import repeat

from rich.box import Box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions
from rich.segment import Segment, Segments
from rich.table import Table
from rich.text import Text

from rollout_diag.render.cells import Column, Laid, as_text

# From this many rows a part is laid out by rich for its header and first rows only, and every further row written
# as one line of its own (the bytes rich writes: checked on the first rows, else rich lays out the whole part);
# past as many distinct styled cells, rich lays out the whole part.
FAST_ROWS = 64
BLOCK_ROWS = 4096  # the writer pads and joins this many rows' cells a column at a time
ONE_LINE = frozenset("\t\n\r\x0b\x0c")  # a cell holding one of these is laid out by rich
NEW_LINE = Segment.line()

_Piece = str | list[Segment] | None  # a cell written: padded text, styled segments, or None (rich lays out its row)


def table_box(table: Table, console: Console, options: ConsoleOptions) -> Box | None:
    """The box ``table`` is drawn with on ``console`` (its safe substitute where the console asks for one); None
    without a box."""
    safe = table.safe_box if table.safe_box is not None else console.safe_box
    return table.box.substitute(options, safe=safe) if table.box is not None else None


def line_by_line(
    table_columns: Sequence[Column],
    console: Console,
    options: ConsoleOptions,
    rows: Laid,
    indices: Sequence[int],
    widths: Sequence[int | None],
) -> Iterator[Segment] | None:
    """One part of a table (its ``table_columns``, laid-out ``rows``) as rich writes it, at O(1) rich calls per
    distinct styled cell rather than per cell: rich lays out the header and the first two rows at the part's widths;
    every further row is one line joined from its cells (a block of rows at a time, column by column). None when that
    does not give rich's bytes for the first two rows (a row style, a cell that wraps or is padded in a way other than
    rich's justification), and then rich lays out the whole part."""
    columns = [table_columns[index] for index in indices]
    fixed = [
        width if width is not None else max(cell_len(column.header), rows.widest(index))
        for width, column, index in zip(widths, columns, indices, strict=True)
    ]
    if any(style is not None for style in rows.styles):
        return None
    writer = _LineWriter.checked(console, options, rows, list(zip(indices, columns, fixed, strict=True)))
    return None if writer is None else writer.written()


class _LineWriter:
    """A part of a table written line by line (``line_by_line``): the header and first two rows as rich lays them
    out, then each row joined from its cells, plain text padded by hand, a styled cell laid out by rich once."""

    def __init__(
        self,
        console: Console,
        options: ConsoleOptions,
        rows: Laid,
        placed: list[tuple[int, Column, int]],
        head: Table,
        head_lines: list[list[Segment]],
        box: Box,
    ) -> None:
        self.console = console
        self.options = options
        self.rows = rows
        self.placed = placed  # each column of the part: its index in the table, the column, its width
        self.head = head
        self.head_lines = head_lines  # the header and first two rows as rich lays them out, and the bottom line
        self.box = box
        self.between = " " + box.mid_vertical + " "
        self.styled: dict[tuple, list[Segment]] = {}  # a styled cell as rich lays it out, by text, style and width

    @classmethod
    def checked(
        cls, console: Console, options: ConsoleOptions, rows: Laid, placed: list[tuple[int, Column, int]]
    ) -> _LineWriter | None:
        """The writer of the part, or None when it does not write the first two rows as rich does."""
        head = Table()
        for _, column, width in placed:
            head.add_column(column.header, justify=column.justify, width=width, overflow="fold")
        for at in range(2):
            head.add_row(*(as_text(rows.columns[index][at]) for index, _, _ in placed))
        lines = console.render_lines(head, options, pad=False, new_lines=False)
        box = table_box(head, console, options)
        if box is None:
            return None
        writer = cls(console, options, rows, placed, head, lines, box)
        first = writer.block(0, 2)
        if any(segments is None for segments in first) or [ansi(s) for s in first] != [ansi(s) for s in lines[-3:-1]]:
            return None
        return writer

    def written(self) -> Iterator[Segment]:
        """The part: rich's header lines, every row from the third in blocks, rich's bottom line."""
        for head_line in self.head_lines[:-1]:
            yield from head_line
            yield NEW_LINE
        for start in range(2, len(self.rows), BLOCK_ROWS):
            for at, segments in enumerate(self.block(start, min(start + BLOCK_ROWS, len(self.rows))), start):
                if segments is None:  # a cell rich lays out otherwise: that row alone, by rich, without a header
                    yield from self._by_rich(at)
                    continue
                yield from segments
                yield NEW_LINE
        yield from self.head_lines[-1]
        yield NEW_LINE

    def _by_rich(self, at: int) -> Iterator[Segment]:
        """Row ``at`` as rich lays it out alone (its lines between the box's top and bottom)."""
        alone = Table(show_header=False, box=self.head.box)
        for _, column, width in self.placed:
            alone.add_column(justify=column.justify, width=width, overflow="fold")
        alone.add_row(*(as_text(self.rows.columns[index][at]) for index, _, _ in self.placed))
        for line in self.console.render_lines(alone, self.options, pad=False, new_lines=False)[1:-1]:
            yield from line
            yield NEW_LINE

    def block(self, start: int, end: int) -> list[list[Segment] | None]:
        """Rows ``start``–``end`` as lines of segments (None for a row rich must lay out)."""
        alternating = self._alternating(self._runs(start, end), end - start)
        if len(alternating) == 1:
            return [[Segment(text)] for text in alternating[0]]
        return [_joined(row) for row in zip(*alternating, strict=False)]  # (a constant repeats without end)

    def _runs(self, start: int, end: int) -> list[tuple[bool, list]]:
        """Rows ``start``–``end`` column by column, consecutive columns of plain text in one run (joined row by row at
        once), each other column a run of its own (written cell by cell)."""
        runs: list[tuple[bool, list]] = []
        for index, column, width in self.placed:
            pieces, plain_text = self._column_pieces(self.rows.columns[index][start:end], column, width)
            if plain_text and runs and runs[-1][0]:
                runs[-1][1].append(pieces)
            else:
                runs.append((plain_text, [pieces]))
        return runs

    def _alternating(self, runs: list[tuple[bool, list]], count: int) -> list[Iterable]:
        """The line alternating text and styled cells: text (the borders and the plain runs between) as one string a
        row, each other cell as its segments (a cell written as text: one segment of its own)."""
        alternating: list[Iterable] = []
        text: str | list[str] = self.box.mid_left + " "  # the text before the next styled cell: a constant or a column
        for number, (plain_text, parts) in enumerate(runs):
            after = " " + self.box.mid_right if number == len(runs) - 1 else self.between
            if plain_text:  # (runs of plain text are maximal: the text before is a constant)
                texts = [self.between.join(cells) for cells in zip(*parts, strict=True)] if len(parts) > 1 else parts[0]
                text = [f"{text}{cell}{after}" for cell in texts]
                continue
            alternating.append(repeat(text, count) if isinstance(text, str) else text)
            alternating.append([[Segment(piece)] if type(piece) is str else piece for piece in parts[0]])
            text = after
        alternating.append(repeat(text, count) if isinstance(text, str) else text)
        return alternating

    def _column_pieces(self, cells: list[str | Text], column: Column, width: int) -> tuple[list[_Piece], bool]:
        """A block of one column's cells as written, and whether every one is plain text."""
        # a plain cell of printable ASCII (every number) is its own width: justified by str.rjust / str.ljust
        pad = str.rjust if column.justify == "right" else str.ljust if column.justify == "left" else None
        if pad is not None and _all_padded(cells, width):
            return [pad(value, width) for value in cells], True  # type: ignore[arg-type]
        out: list[_Piece] = []
        seen: dict[int, _Piece] = {}  # a Text shared by many rows (a verdict level) is written once
        for value in cells:
            if type(value) is not str:
                if id(value) not in seen:
                    seen[id(value)] = self._cell(value, column, width)
                out.append(seen[id(value)])
            elif pad is not None and _padded(value, width):
                out.append(pad(value, width))
            else:
                out.append(self._cell(value, column, width))
        return out, all(type(piece) is str for piece in out)

    def _cell(self, text: str | Text, column: Column, width: int) -> _Piece:
        """One cell written as rich would, or None where rich must lay it out (it wraps, or is padded otherwise)."""
        plain_text = text if isinstance(text, str) else text.plain
        if plain_text != plain_text.strip() or not ONE_LINE.isdisjoint(plain_text) or cell_len(plain_text) > width:
            return None
        if isinstance(text, str):
            return _justified(plain_text, column.justify, width)
        if not _laid_as_given(text):
            return None
        if not text.style and not text.spans:
            return _justified(plain_text, column.justify, width)
        return self._styled_cell(text, column, width)

    def _styled_cell(self, text: Text, column: Column, width: int) -> list[Segment] | None:
        """A styled cell as rich lays it out alone (once per text, style and width; None past FAST_ROWS of them)."""
        key = (text.plain, str(text.style), tuple(text.spans), column.justify, width)
        if key not in self.styled:
            if len(self.styled) >= FAST_ROWS:
                return None
            alone = Table(show_header=False)
            alone.add_column(justify=column.justify, width=width, overflow="fold")
            alone.add_row(text)
            line = self.console.render_lines(alone, self.options, pad=False, new_lines=False)[1]
            self.styled[key] = list(Segment.divide(line, [2, 2 + width, width + 4]))[1]
        return self.styled[key]


def _all_padded(cells: list[str | Text], width: int) -> bool:
    """Whether every cell of a block is a string of printable ASCII that fits ``width`` and that str.rjust /
    str.ljust pads as rich would (no space at either end)."""
    if set(map(type, cells)) != {str}:
        return False
    joined = "".join(cells)  # type: ignore[arg-type]
    return (
        joined.isascii()
        and joined.isprintable()
        and max(map(len, cells)) <= width
        and (" " not in joined or not any(value[:1] == " " or value[-1:] == " " for value in cells))
    )


def _padded(value: str, width: int) -> bool:
    """Whether str.rjust / str.ljust pads ``value`` as rich would: printable ASCII, fits, no space at either end."""
    return len(value) <= width and value.isascii() and value.isprintable() and value[:1] != " " and value[-1:] != " "


def _laid_as_given(text: Text) -> bool:
    """Whether a Text sets nothing of its own that changes how rich lays it out in a cell."""
    return text.justify is None and text.overflow is None and text.no_wrap is None and text.end == "\n"


def _joined(row: tuple) -> list[Segment] | None:
    """One line from its alternating text and styled cells; None when a cell is one rich must lay out."""
    segments = [Segment(row[0])]
    for at in range(1, len(row), 2):
        if row[at] is None:
            return None
        segments.extend(row[at])
        segments.append(Segment(row[at + 1]))
    return segments


def _justified(text: str, justify: str, width: int) -> str:
    pad = width - cell_len(text)
    if justify == "right":
        return " " * pad + text
    if justify == "center":
        return " " * (pad // 2) + text + " " * (pad - pad // 2)
    return text + " " * pad


def ansi(segments: Sequence[Segment] | None) -> str:
    """``segments`` written with every colour and attribute (to compare two ways of writing one line)."""
    sink = io.StringIO()
    Console(file=sink, force_terminal=True, color_system="truecolor", width=10_000, soft_wrap=True).print(
        Segments(segments or []), end=""
    )
    return sink.getvalue()
