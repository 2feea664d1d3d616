"""A table that fits the terminal: never cuts a number or a name with "…"; folds free text and, when the
columns still do not fit, splits into parts that each repeat the key columns (step, preset, …)."""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Literal

import numpy as np
from rich.box import Box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.segment import Segment, Segments
from rich.table import Table
from rich.text import Text

from rollout_diag.formatting import FIXED_RANGE, needs_scientific, number_in, reads_fixed
from rollout_diag.render.format import visible

BORDER = 3  # per column: one padding space each side and one border line (plus one for the left edge)
# From this many rows a part is laid out by rich for its header and first rows only, and every further row written
# as one line of its own (the bytes rich writes: checked on the first rows, else rich lays out the whole part):
# rich measures and renders cell by cell, minutes for 200 000 steps.
FAST_ROWS = 64
BLOCK_ROWS = 4096  # the line writer pads and joins this many rows' cells a column at a time
_ONE_LINE = frozenset("\t\n\r\x0b\x0c")  # a cell holding one of these is laid out by rich
_NEW_LINE = Segment.line()


@dataclass(frozen=True)
class Num:
    """A number cell, formatted when the table is complete: every number of a column takes the column's
    notation (``formatting.numbers``); ``suffix`` follows it (``" (0.08 %)"``, ``" raw"``)."""

    value: float | int | None
    suffix: str = ""
    digits: int = 4


@dataclass(frozen=True, eq=False)
class Nums:
    """A column of number cells given at once (``FitTable.add_rows``), written as a ``Num`` per value would be (the
    column's one notation) without an object per cell: 200 000 steps × 9 numbers. ``values``: a float64 array
    (``present`` False where a cell has no value: a dash, as ``Num(None)``), an integer array, or a list of what
    ``Num`` takes."""

    values: np.ndarray | Sequence[float | int | None]
    present: np.ndarray | None = None
    suffix: str = ""
    digits: int = 4

    def __len__(self) -> int:
        return len(self.values)


Cell = str | Text | Num
_Chunk = list["Cell | None"] | Nums  # a run of one column's cells: added row by row, or a Nums block


@dataclass
class _Laid:
    """A table's cells as laid out, column by column (``columns[c][r]``: unstyled text as its string, a Text only
    where styled), and each row's style."""

    columns: list[list[str | Text]]
    styles: list[str | None]
    _widest: dict[int, int] = field(default_factory=dict, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.styles)

    def widest(self, index: int) -> int:
        """The widest line of column ``index``'s cells (measured once)."""
        if index not in self._widest:
            self._widest[index] = _widest_cell(self.columns[index])
        return self._widest[index]

    def row(self, index: int) -> list[str | Text]:
        return [column[index] for column in self.columns]


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
        self._chunks: list[list[_Chunk]] = [[] for _ in self.columns]  # per column, its cells in runs
        self._styles: list[str | None] = []

    def add_row(self, *cells: Cell | None, style: str | None = None) -> None:
        """Plain strings are data: shown as they are (control characters visible), never read as markup;
        ``Num`` cells are numbers, written in their column's one notation."""
        if len(cells) != len(self.columns):
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns")
        for chunks, cell in zip(self._chunks, cells, strict=True):
            _open_cells(chunks).append(cell)
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
                _open_cells(chunks).extend(column)
        self._styles.extend([None] * count)

    @property
    def rows(self) -> list[tuple[list[Text], str | None]]:
        """Every row as rich Text cells, numbers formatted column by column."""
        laid = self._cells()
        return [([_text(cell) for cell in laid.row(index)], style) for index, style in enumerate(laid.styles)]

    def _cells(self) -> _Laid:
        """As ``rows``, column by column, with a cell of unstyled text as its string (a Text is made only for rich to
        lay out: 200 000 rows × 11 columns of Text objects were 1 GB)."""
        return _Laid([_column_cells(chunks) for chunks in self._chunks], list(self._styles))

    def needs(self, rows: _Laid | None = None) -> list[int]:
        """The narrowest each column can be: its widest cell and longest header word (free text: ``fold_width``)."""
        rows = self._cells() if rows is None else rows
        widths = []
        for index, column in enumerate(self.columns):
            cells = rows.widest(index)
            header = max((cell_len(word) for word in column.header.split()), default=1)
            widths.append(max(header, min(cells, column.fold_width) if column.wrap else cells))
        return widths

    def parts(self, width: int, rows: _Laid | None = None, needs: list[int] | None = None) -> list[list[int]]:
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
        rows: _Laid,
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
            table.add_row(*(_text(rows.columns[index][at]) for index in indices), style=style)
        return table

    def _widths(
        self,
        rows: _Laid,
        indices: Sequence[int],
        width: int,
        needs: list[int] | None = None,
    ) -> list[int | None]:
        needs = self.needs(rows) if needs is None else needs
        natural = [max(needs[i], cell_len(self.columns[i].header), rows.widest(i)) for i in indices]
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


def _open_cells(chunks: list[_Chunk]) -> list[Cell | None]:
    """The column's last run of cells, a new one after a ``Nums`` block (cells are added to it in order)."""
    if not chunks or isinstance(chunks[-1], Nums):
        chunks.append([])
    return chunks[-1]  # type: ignore[return-value]


def _column_cells(chunks: Sequence[_Chunk]) -> list[str | Text]:
    """One column's cells as laid out: its numbers (``Num`` cells and ``Nums`` blocks alike) in one notation per
    precision, as ``formatting.numbers`` of all of them writes them; text made visible."""
    scientific = _notations(chunks)
    out: list[str | Text] = []
    for chunk in chunks:
        if isinstance(chunk, Nums):
            out.extend(_nums_texts(chunk, scientific[chunk.digits]))
        else:
            out.extend(_cell_text(cell, scientific) for cell in chunk)
    return out


def _notations(chunks: Sequence[_Chunk]) -> dict[int, bool]:
    """Per precision, whether any of the column's numbers written at it needs scientific notation."""
    scientific: dict[int, bool] = {}
    for chunk in chunks:
        if isinstance(chunk, Nums):
            scientific[chunk.digits] = scientific.get(chunk.digits, False) or _nums_scientific(chunk)
            continue
        for cell in chunk:
            if isinstance(cell, Num):
                scientific[cell.digits] = scientific.get(cell.digits, False) or needs_scientific(
                    cell.value, cell.digits
                )
    return scientific


def _cell_text(cell: Cell | None, scientific: dict[int, bool]) -> str | Text:
    """One cell as laid out: a number in its precision's notation, a Text as it is, text made visible."""
    if isinstance(cell, Num):
        return number_in(cell.value, cell.digits, scientific[cell.digits]) + cell.suffix
    if isinstance(cell, Text):
        return cell
    if cell is None:
        return ""
    return cell if cell.isascii() and cell.isprintable() else visible(cell)  # printable ASCII: nothing to make visible


def _float_array(nums: Nums) -> bool:
    return isinstance(nums.values, np.ndarray) and nums.values.dtype == np.float64


def _nums_scientific(nums: Nums) -> bool:
    """Whether any of ``nums`` needs scientific notation (``formatting.needs_scientific``)."""
    values, digits = nums.values, nums.digits
    if isinstance(values, np.ndarray) and values.dtype.kind in "iu":
        return False  # integers are written as integers
    if not _float_array(nums):
        shown = values if nums.present is None else [v for v, there in zip(values, nums.present, strict=True) if there]
        return any(needs_scientific(value, digits) for value in shown)
    with np.errstate(invalid="ignore"):
        fraction = np.isfinite(values) & (values != 0) & ~((values == np.trunc(values)) & (np.abs(values) < 1e15))
    if nums.present is not None:
        fraction &= nums.present
    magnitude = np.abs(values[fraction])
    if ((magnitude < FIXED_RANGE[0]) | (magnitude >= FIXED_RANGE[1])).any():
        return True
    # inside the fixed range %g still writes an exponent where a value rounds up to 10**digits: those few, exactly
    border = magnitude[magnitude >= 10.0 ** (max(digits, 1) - 1)]
    return any(needs_scientific(value, digits) for value in border.tolist())


def _nums_texts(nums: Nums, scientific: bool) -> list[str]:
    """Each of ``nums`` as ``formatting._number`` writes it in the column's notation, then its suffix."""
    values, digits, present = nums.values, nums.digits, nums.present
    if _float_array(nums):
        texts = _float_texts(values, present, digits, scientific)  # type: ignore[arg-type]
    elif isinstance(values, np.ndarray) and values.dtype.kind in "iu":
        texts = [format(value, ",") for value in values.tolist()]
        if present is not None:
            _put(texts, ~np.asarray(present, dtype=bool), repeat("–"))
    else:
        there = [True] * len(values) if present is None else np.asarray(present, dtype=bool).tolist()
        texts = [number_in(v, digits, scientific) if hit else "–" for v, hit in zip(values, there, strict=True)]
    return texts if not nums.suffix else [text + nums.suffix for text in texts]


def _float_texts(values: np.ndarray, present: np.ndarray | None, digits: int, scientific: bool) -> list[str]:
    """``formatting.number_in(value, digits, scientific)`` of each float64 value (a dash where not ``present``): the
    values sorted into kinds (absent or NaN, ±inf, integral, fractional) by numpy, each kind written by one loop."""
    out = ["–"] * values.shape[0]
    finite = np.isfinite(values)
    infinite = np.isinf(values)
    if present is not None:
        present = np.asarray(present, dtype=bool)
        finite &= present
        infinite &= present
    _put(out, infinite, ("inf" if value > 0 else "-inf" for value in values[infinite].tolist()))
    integral = finite & (values == np.trunc(values)) & (np.abs(values) < 1e15)
    _put(out, integral, (format(int(value), ",") for value in values[integral].tolist()))
    fraction = finite & ~integral
    if scientific:  # 1 ≤ |value| < 10 000 stays fixed in a scientific column (formatting.reads_fixed)
        magnitude = np.abs(values)
        maybe_fixed = fraction & (magnitude >= 1.0) & (magnitude < FIXED_RANGE[1])
        reads = np.array([reads_fixed(value, digits) for value in values[maybe_fixed].tolist()], dtype=bool)
        fixed = np.zeros_like(fraction)
        fixed[np.flatnonzero(maybe_fixed)[reads]] = True
        spec = f".{digits}g"
        _put(out, fixed, (format(value, spec) for value in values[fixed].tolist()))
        rest = fraction & ~fixed
        _put(out, rest, _scientific_texts(values[rest].tolist(), digits))
    else:
        shown = values[fraction].tolist()
        spec = f".{digits}g"
        _put(out, fraction, (format(value, spec) for value in shown))
    return out


def _scientific_texts(values: list[float], digits: int) -> list[str]:
    """Finite non-integral values in scientific notation as ``formatting._number`` writes them (``3.421e-3``)."""
    spec = f".{max(digits - 1, 0)}e"
    exponents: dict[str, str] = {}
    out = []
    for value in values:
        mantissa, _, exponent = format(value, spec).partition("e")
        if "." in mantissa:
            mantissa = mantissa.rstrip("0").rstrip(".")
        shown = exponents.get(exponent)
        if shown is None:
            shown = exponents[exponent] = f"e{int(exponent)}"
        out.append(mantissa + shown)
    return out


def _put(out: list[str], mask: np.ndarray, texts: Iterable[str]) -> None:
    """``out[i] = text`` for each index where ``mask`` holds, in order, from ``texts``."""
    for at, text in zip(np.flatnonzero(mask).tolist(), texts, strict=False):  # texts: as many, or endless
        out[at] = text


def _widest_cell(cells: Sequence[str | Text]) -> int:
    """The widest line of ``cells``: printable ASCII strings (numbers) measured by ``len`` a column at a time."""
    if not cells:
        return 0
    if set(map(type, cells)) == {str}:
        joined = "".join(cells)  # type: ignore[arg-type]
        if joined.isascii() and joined.isprintable():
            return max(map(len, cells))
    widest: dict[int, int] = {}  # a Text shared by many rows (a verdict level) is measured once
    for cell in cells:
        if id(cell) not in widest:
            widest[id(cell)] = _longest_line(cell)
    return max(widest.values())


def _longest_line(text: str | Text) -> int:
    if type(text) is str and text.isascii() and text.isprintable():  # every number: one cell per character
        return len(text)
    plain = text if isinstance(text, str) else text.plain
    if "\n" not in plain:
        return cell_len(plain)
    return max(cell_len(line) for line in plain.split("\n"))


_Piece = str | list[Segment] | None  # a cell written: padded text, styled segments, or None (rich lays out its row)


def _line_by_line(
    table: FitTable,
    console: Console,
    options: ConsoleOptions,
    rows: _Laid,
    indices: Sequence[int],
    widths: Sequence[int | None],
) -> Iterator[Segment] | None:
    """One part of ``table`` as rich writes it, at O(1) rich calls per distinct styled cell rather than per cell:
    rich lays out the header and the first two rows at the part's widths; every further row is one line joined
    from its cells (a block of rows at a time, column by column). None when that does not give rich's bytes for the
    first two rows (a row style, a cell that wraps or is padded in a way other than rich's justification), and then
    rich lays out the whole part."""
    columns = [table.columns[index] for index in indices]
    fixed = [
        width if width is not None else max(cell_len(column.header), rows.widest(index))
        for width, column, index in zip(widths, columns, indices, strict=True)
    ]
    if any(style is not None for style in rows.styles):
        return None
    writer = _LineWriter.checked(console, options, rows, list(zip(indices, columns, fixed, strict=True)))
    return None if writer is None else writer.written()


class _LineWriter:
    """A part of a table written line by line (``_line_by_line``): the header and first two rows as rich lays them
    out, then each row joined from its cells, plain text padded by hand, a styled cell laid out by rich once."""

    def __init__(
        self,
        console: Console,
        options: ConsoleOptions,
        rows: _Laid,
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
        cls, console: Console, options: ConsoleOptions, rows: _Laid, placed: list[tuple[int, Column, int]]
    ) -> _LineWriter | None:
        """The writer of the part, or None when it does not write the first two rows as rich does."""
        head = Table()
        for _, column, width in placed:
            head.add_column(column.header, justify=column.justify, width=width, overflow="fold")
        for at in range(2):
            head.add_row(*(_text(rows.columns[index][at]) for index, _, _ in placed))
        lines = console.render_lines(head, options, pad=False, new_lines=False)
        box = head.box.substitute(options, safe=head.safe_box if head.safe_box is not None else console.safe_box)
        if box is None:
            return None
        writer = cls(console, options, rows, placed, head, lines, box)
        first = writer.block(0, 2)
        if any(segments is None for segments in first) or [_ansi(s) for s in first] != [_ansi(s) for s in lines[-3:-1]]:
            return None
        return writer

    def written(self) -> Iterator[Segment]:
        """The part: rich's header lines, every row from the third in blocks, rich's bottom line."""
        for segments in self.head_lines[:-1]:
            yield from segments
            yield _NEW_LINE
        for start in range(2, len(self.rows), BLOCK_ROWS):
            for at, segments in enumerate(self.block(start, min(start + BLOCK_ROWS, len(self.rows))), start):
                if segments is None:  # a cell rich lays out otherwise: that row alone, by rich, without a header
                    yield from self._by_rich(at)
                    continue
                yield from segments
                yield _NEW_LINE
        yield from self.head_lines[-1]
        yield _NEW_LINE

    def _by_rich(self, at: int) -> Iterator[Segment]:
        """Row ``at`` as rich lays it out alone (its lines between the box's top and bottom)."""
        alone = Table(show_header=False, box=self.head.box)
        for _, column, width in self.placed:
            alone.add_column(justify=column.justify, width=width, overflow="fold")
        alone.add_row(*(_text(self.rows.columns[index][at]) for index, _, _ in self.placed))
        for line in self.console.render_lines(alone, self.options, pad=False, new_lines=False)[1:-1]:
            yield from line
            yield _NEW_LINE

    def block(self, start: int, end: int) -> list[list[Segment] | None]:
        """Rows ``start``–``end`` as lines of segments (None for a row rich must lay out)."""
        alternating = self._alternating(self._runs(start, end), end - start)
        if len(alternating) == 1:
            return [[Segment(text)] for text in alternating[0]]  # type: ignore[union-attr]
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
        if plain_text != plain_text.strip() or not _ONE_LINE.isdisjoint(plain_text) or cell_len(plain_text) > width:
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


def _ansi(segments: Sequence[Segment] | None) -> str:
    """``segments`` written with every colour and attribute (to compare two ways of writing one line)."""
    sink = io.StringIO()
    Console(file=sink, force_terminal=True, color_system="truecolor", width=10_000, soft_wrap=True).print(
        Segments(segments or []), end=""
    )
    return sink.getvalue()
