"""A table's cells as text: number cells (``Num``, ``Nums``) written in their column's one notation, text made
visible, and the cells laid out column by column (``Laid``) with the widths they need; ``Column``, what a table's
column is (rollout_diag/render/table.py lays the cells out; rollout_diag/render/lines.py writes them fast)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Literal

import numpy as np
from rich.cells import cell_len
from rich.text import Text

from rollout_diag.formatting import FIXED_RANGE, needs_scientific, number_in, reads_fixed
from rollout_diag.render.format import visible


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
Chunk = list["Cell | None"] | Nums  # a run of one column's cells: added row by row, or a Nums block


@dataclass
class Laid:
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
            self._widest[index] = widest_cell(self.columns[index])
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


def as_text(cell: str | Text) -> Text:
    """A cell as rich lays it out: unstyled text (already made visible) as a Text of its own."""
    return cell if isinstance(cell, Text) else Text(cell)


def open_cells(chunks: list[Chunk]) -> list[Cell | None]:
    """The column's last run of cells, a new one after a ``Nums`` block (cells are added to it in order)."""
    if not chunks or isinstance(chunks[-1], Nums):
        chunks.append([])
    return chunks[-1]  # type: ignore[return-value]


def column_cells(chunks: Sequence[Chunk]) -> list[str | Text]:
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


def _notations(chunks: Sequence[Chunk]) -> dict[int, bool]:
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


def _nums_scientific(nums: Nums) -> bool:
    """Whether any of ``nums`` needs scientific notation (``formatting.needs_scientific``)."""
    values, digits = nums.values, nums.digits
    if isinstance(values, np.ndarray) and values.dtype.kind in "iu":
        return False  # integers are written as integers
    if not isinstance(values, np.ndarray) or values.dtype != np.float64:
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
    if isinstance(values, np.ndarray) and values.dtype == np.float64:
        texts = _float_texts(values, None if present is None else np.asarray(present, dtype=bool), digits, scientific)
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


def widest_cell(cells: Sequence[str | Text]) -> int:
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
