"""Flat text exports: JSON and CSV strings of result objects."""

from __future__ import annotations

import csv
import io
import json
import math
from collections import Counter
from collections.abc import Callable, Hashable, Iterator, Sequence
from functools import partial
from json.encoder import encode_basestring_ascii
from typing import TYPE_CHECKING, Any

import numpy as np

from rollout_diag.results import (
    AnalysisResult,
    Column,
    MetricColumns,
    Rows,
    StepResult,
    StepTable,
    json_number,
    json_row,
)

if TYPE_CHECKING:  # analyze's JSON loads neither of these results
    from rollout_diag.results import ComparisonResult, SweepResult


def to_json_text(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, allow_nan=False) + "\n"


def json_pieces(document: dict[str, Any]) -> Iterator[str]:
    """``to_json_text(document)`` in pieces, one per top-level entry and one per item of a top-level list, each
    made when asked for: a 200 000-step sweep is written step by step, never held as one string. The same bytes;
    the indented encoding is :func:`_indented` (json's own indented encoder is pure Python, 5× slower)."""
    yield "{"
    for number, (key, value) in enumerate(document.items()):
        lead = ("," if number else "") + "\n  " + _key(key) + ": "
        if (isinstance(value, list | ItemTexts) or _lazy(value)) and len(value):
            yield lead + "["
            items: Iterator[str | Iterator[str]] | None
            if isinstance(value, ItemTexts):
                items = value.texts()
            else:
                items = _templated(value) if hasattr(value, "columns") else None  # the sweep's per-step tables
            if items is None:
                items = (_indented(item, "\n    ") for item in value)
            batch: list[str] = []  # items joined into pieces of about _PIECE characters: a write a piece
            size = 0
            for index, item in enumerate(items):
                batch.append(",\n    " if index else "\n    ")
                if isinstance(item, str):
                    batch.append(item)
                    size += len(item)
                    if size >= _PIECE:
                        yield "".join(batch)
                        batch, size = [], 0
                else:  # an item written in pieces itself (ItemTexts of comparison_json_pieces' presets)
                    yield "".join(batch)
                    yield from item
                    batch, size = [], 0
            batch.append("\n  ]")
            yield "".join(batch)
        elif isinstance(value, ColumnTexts):
            yield lead
            yield from value.pieces("\n  ")
        else:
            yield lead + _indented(value, "\n  ")
    yield "\n}\n" if document else "}\n"


_PIECE = 1 << 20


def _lazy(value: object) -> bool:
    """A sequence a result hands over to be read item by item (``SweepResult.json_document``'s steps)."""
    return isinstance(value, Sequence) and not isinstance(value, str | bytes | tuple)


_SLOT = "\x00slot\x00"  # stands for a step's own value in the text of a step's table
_BLOCK = 4096


def _templated(steps: Any) -> Iterator[str] | None:
    """``_indented(table, "\\n    ")`` of every per-step sweep table (``metrics.sweep.StepTables``), each written into
    the text of the first one from the step columns: one ``%`` per step instead of a dict and an encoding per value
    (200 000 steps: minutes). None (encode table by table) when the tables do not share one layout, a value is not
    finite (the table-by-table encoding raises as json does), or the text differs from it for a step checked."""
    columns = steps.columns
    count = len(steps)
    layout = _sweep_slots(columns)
    if layout is None:
        return None
    slotted, values = layout
    if any(
        isinstance(column, np.ndarray) and column.dtype.kind == "f" and not np.isfinite(column).all()
        for column in values
    ):
        return None
    pattern = _pattern(_indented(slotted, "\n    "), len(values))
    kinds: list[str] = [column.dtype.kind if isinstance(column, np.ndarray) else "i" for column in values]
    if pattern is None or any(kind not in "fi" for kind in kinds):
        return None
    for index in sorted({0, count // 2, count - 1}):
        if pattern % tuple(text[0] for text in _sweep_texts(values, kinds, index, index + 1)) != _indented(
            columns.step_table(index), "\n    "
        ):
            return None
    return _sweep_tables(pattern, values, kinds, count)


def _sweep_slots(columns: Any) -> tuple[dict, list[np.ndarray | list[int]]] | None:
    """The first step's table with a slot for each of a step's own values, and those values' step columns in the
    slots' order; None when the steps do not share the first one's layout."""
    first = columns.step_table(0)
    slotted = {**first, "step": _SLOT, "options": []}
    values: list[np.ndarray | list[int]] = [columns.steps]
    for row, option in zip(first["options"], columns.options, strict=True):
        option_row = _sweep_option_slots(row, option, values)
        if option_row is None:
            return None
        slotted["options"].append(option_row)
    return slotted, values


def _sweep_option_slots(row: dict, option: Any, values: list[np.ndarray | list[int]]) -> dict | None:
    """One option's row of the first step's table with slots, its step columns appended to ``values``; None when
    the option's columns do not fit the row."""
    row = {**row, "count": _SLOT}
    values.append(option.count)
    if "default_share" in row:
        if option.default_share is None:
            return None
        row["default_share"] = _SLOT
        values.append(option.default_share)
    if len(row["thresholds"]) != len(option.thresholds):
        return None
    row["thresholds"] = [{**entry, "threshold": _SLOT, "share": _SLOT} for entry in row["thresholds"]]
    for thresholds, shares in zip(option.thresholds, option.shares, strict=True):
        values.extend((thresholds, shares))
    return row


def _sweep_texts(values: list[np.ndarray | list[int]], kinds: list[str], begin: int, end: int) -> list[list[str]]:
    """Steps ``begin``–``end`` of each value column as JSON texts."""
    made: dict[bytes, list[str]] = {}  # a step's threshold is often the same for every target: formatted once
    return [
        _float_texts(np.asarray(column[begin:end], dtype=np.float64), made)
        if kind == "f"
        else list(map(int.__repr__, _plain(column[begin:end], kind)))
        for column, kind in zip(values, kinds, strict=True)
    ]


def _sweep_tables(pattern: str, values: list[np.ndarray | list[int]], kinds: list[str], count: int) -> Iterator[str]:
    """Every step's table: ``pattern`` filled with the step's values, a block of steps at a time."""
    for begin in range(0, count, _BLOCK):
        for row in zip(*_sweep_texts(values, kinds, begin, min(begin + _BLOCK, count)), strict=True):
            yield pattern % row


class ItemTexts:
    """A top-level list of a document that :func:`json_pieces` writes from texts made when asked for: its length and
    ``texts()``, each item's ``_indented(item, "\\n    ")`` in order (or an iterator of its pieces)."""

    def __init__(self, count: int, texts: Callable[[], Iterator[str | Iterator[str]]]) -> None:
        self.count, self.texts = count, texts

    def __len__(self) -> int:
        return self.count


_ITEM = "\n    "  # the indentation of an item of a top-level list


def analysis_json_pieces(result: AnalysisResult) -> Iterator[str]:
    """``to_json_text(result.to_json())`` in pieces: ``steps`` and ``positions`` written a block of steps at a time
    from their columns and ``step_levels`` entry by entry, never a dict per step nor the document as one string
    (200 000 steps: 1 GB of JSON). The same bytes."""
    document = result.json_document()
    for name, texts in (("steps", step_texts), ("positions", row_texts), ("step_levels", level_texts)):
        items = document[name]
        document[name] = ItemTexts(len(items), partial(texts, items)) if len(items) else []
    return json_pieces(document)


_LEVEL_KEYS = ("step", "level", "levels")


def level_texts(levels: Sequence[dict[str, Any]]) -> Iterator[str]:
    """``_indented(dict(entry), "\\n    ")`` of every ``step_levels`` entry. An entry ``{"step": int, "level": str,
    "levels": dict}`` is written around its levels' text, made once per levels dict (steps share one dict per row of
    levels: ``decisions.step_levels_of``)."""
    made: dict[int, tuple[dict[str, Any], str]] = {}
    for entry in levels:
        shape = tuple(entry) == _LEVEL_KEYS and tuple(map(type, entry.values())) == (int, str, dict)
        if not shape:
            yield _indented(dict(entry), _ITEM)
        else:
            judged = entry["levels"]
            found = made.get(id(judged))
            if found is None:  # the dict kept with its text, so that its id names it while the entries are written
                found = made[id(judged)] = (judged, _indented(judged, _COUNTS))
            yield (
                '{\n      "step": '
                + int.__repr__(entry["step"])
                + ',\n      "level": '
                + encode_basestring_ascii(entry["level"])
                + ',\n      "levels": '
                + found[1]
                + _ITEM
                + "}"
            )


def step_texts(steps: Sequence[StepResult]) -> Iterator[str]:
    """``_indented(step.to_json(), "\\n    ")`` of every step. A StepTable's steps are written from its columns: the
    steps that report the same key groups share one text with a slot per value, filled by one ``%`` a step from the
    columns' texts (a block of steps at a time); checked against the step's own encoding on the first and last step
    of each such text (where one differs, those steps are encoded one by one)."""
    if not isinstance(steps, StepTable):
        yield from (_indented(step.to_json(), _ITEM) for step in steps)
        return
    count = len(steps)
    sources = [steps.metrics, *steps.dialects.values()]
    presence = [present for columns in sources for present, _ in columns.groups]
    yield from _pattern_texts(
        _kinds(presence, count),
        lambda members: _step_pattern(steps, members),
        lambda index: _indented(steps.step_alone(index).to_json(), _ITEM),
        lambda slots, where: _slot_texts(slots, where),
    )


def _slot_texts(slots: list[_Slot], where: np.ndarray) -> list[list[str]]:
    """Each slot's value texts for the steps ``where``, column by column (equal ones formatted once). Fewer steps than
    a column looks for repeated values in (``_REPEATS_FROM``): the float64 slots' values taken into one [slots, steps]
    array and formatted in one call (a step holds ~1 000 of them: a call per slot cost more than its few values)."""
    made: dict[bytes, list[str]] = {}
    out: list[list[str]] = [[] for _ in slots]
    floats = [index for index, (column, _, _) in enumerate(slots) if column.dtype == np.float64]
    if floats and where.shape[0] < _REPEATS_FROM:
        count = where.shape[0]
        texts = _float_texts(np.stack([slots[index][0][where] for index in floats]).reshape(-1))
        for place, index in enumerate(floats):
            out[index] = texts[place * count : (place + 1) * count]
    else:
        floats = []
    batched = set(floats)
    for index, (column, indent, scalars) in enumerate(slots):
        if index not in batched:
            out[index] = _value_texts(column, where, indent, scalars, made)
    return out


_COUNTS = "\n      "  # a value of a step's own dict
_METRIC = "\n        "  # a value of its metrics
_DIALECT = "\n          "  # a value of a framework's dialect metrics


_Slot = tuple[np.ndarray, str, bool]  # a slot's column, indentation and whether it is read as MetricColumns reads it


def _step_pattern(steps: StepTable, members: np.ndarray) -> tuple[str, list[_Slot]] | None:
    """The text of the steps ``members`` (which report the same key groups) with ``%s`` for each value, and each
    slot's column and indentation; None when a step checked encodes otherwise."""
    first = int(members[0])
    slots: list[_Slot] = [
        (column, _COUNTS, False) for column in (steps.step_ids, steps.rows, steps.tokens, steps.empty_rows)
    ]
    slotted: dict[str, Any] = dict.fromkeys(("step", "rows", "tokens", "empty_rows"), _SLOT)
    slotted["metrics"] = _slotted(steps.metrics, first, slots, _METRIC)
    dialects = {
        name: _slotted(columns, first, slots, _DIALECT)
        for name, columns in steps.dialects.items()
        if columns.reports[first]
    }
    if dialects:
        slotted["dialects"] = dialects
    pattern = _pattern(_indented(slotted, _ITEM), len(slots))
    if pattern is None:
        return None
    checked = sorted({first, int(members[-1])})
    texts = _slot_texts(slots, np.array(checked))
    for place, index in enumerate(checked):
        if pattern % tuple(text[place] for text in texts) != _indented(steps.step_alone(index).to_json(), _ITEM):
            return None
    return pattern, slots


def _slotted(columns: MetricColumns, index: int, slots: list[_Slot], newline: str) -> dict[str, str]:
    """Step ``index``'s keys of ``columns`` in their order, each a slot; the column each value comes from (the last
    group reporting it at ``index``, as ``dict.update`` folds them) appended to ``slots``."""
    out = {}
    for name in columns.row(index):
        group = next(g for g in reversed(columns.where[name]) if columns.groups[g][0][index])
        slots.append((columns.groups[group][1][name], newline, True))
        out[name] = _SLOT
    return out


def _pattern(text: str, slots: int) -> str | None:
    """``text`` with each slot a ``%s`` (and every other ``%`` doubled); None unless it holds ``slots`` slots."""
    template = encode_basestring_ascii(_SLOT)
    if text.count(template) != slots:
        return None
    return "%s".join(piece.replace("%", "%%") for piece in text.split(template))


def _value_texts(
    column: np.ndarray,
    at: np.ndarray,
    newline: str,
    numpy_scalars: bool = False,
    made: dict[bytes, list[str]] | None = None,
) -> list[str]:
    """The JSON text of ``column[at]``, each value as ``_indented(json_number(value), newline)`` encodes it: a float64
    column read as Python floats (null where not finite; the texts of equal values ``made`` before, where given), an
    integer one as ints. Other columns value by value: ``numpy_scalars`` reads each as ``column[i]`` (MetricColumns'
    ``_scalar``), else as ``tolist`` gives it (Rows)."""
    values = column[at]
    if values.dtype == np.float64:
        return _float_texts(values, made)
    if values.dtype.kind in "iu" and not numpy_scalars:
        return list(map(int.__repr__, values.tolist()))
    read = list(values) if numpy_scalars else values.tolist()
    return [_indented(json_number(value), newline) for value in read]


def _float_texts(values: np.ndarray, made: dict[bytes, list[str]] | None = None, repeats: bool = True) -> list[str]:
    """``json_number(value)``'s JSON text of each float64 value (null where not finite). With ``made``: the texts of
    values equal bit for bit to some made before are those (the same list, read only), else made and kept there."""
    if made is not None:
        key = values.tobytes()
        found = made.get(key)
        if found is None:
            found = made[key] = _float_texts(values)
        return found
    if repeats and values.shape[0] >= _REPEATS_FROM:
        # a value repeated in a column (counts, shares of 0 or 1) formatted once: distinct bit patterns, so that
        # -0.0 and 0.0 (and NaN payloads) keep their own texts
        bits, where = np.unique(values.view(np.int64), return_inverse=True)
        if bits.shape[0] * 4 <= values.shape[0] * 3:
            return np.array(_float_texts(bits.view(np.float64), repeats=False), dtype=object)[where].tolist()
    texts = list(map(float.__repr__, values.tolist()))
    bad = ~np.isfinite(values)
    if bad.any():
        for index in np.flatnonzero(bad).tolist():
            texts[index] = "null"
    return texts


_REPEATS_FROM = 64  # values in a block from which repeated values are looked for


def row_texts(rows: Sequence[dict[str, Any]]) -> Iterator[str]:
    """``_indented(json_row(row), "\\n    ")`` of every row (the ``positions`` table); a Rows' column rows written
    into one text with a slot per key, checked against the row's own encoding on its first, middle and last row."""
    if not isinstance(rows, Rows):
        yield from (_indented(json_row(row), _ITEM) for row in rows)
        return
    yield from (_indented(json_row(row), _ITEM) for row in rows.head)
    pattern = _pattern(_indented(dict.fromkeys(rows.names, _SLOT), _ITEM), len(rows.names)) if rows.held else None
    slots = [(column, _COUNTS) for column in rows.columns]
    if pattern is not None:
        for index in sorted({0, rows.held // 2, rows.held - 1}):
            values = tuple(_value_texts(column, np.array([index]), newline)[0] for column, newline in slots)
            if pattern % values != _indented(json_row(rows[len(rows.head) + index]), _ITEM):
                pattern = None
                break
    if pattern is None:
        yield from (_indented(json_row(rows[len(rows.head) + index]), _ITEM) for index in range(rows.held))
        return
    for begin in range(0, rows.held, _BLOCK):
        at = np.arange(begin, min(begin + _BLOCK, rows.held))
        made: dict[bytes, list[str]] = {}
        texts = [_value_texts(column, at, newline, made=made) for column, newline in slots]
        yield from (pattern % row for row in zip(*texts, strict=True))


def comparison_json_pieces(result: ComparisonResult) -> Iterator[str]:
    """``compare-presets --format json``: ``to_json_text(result.to_json())``, but each list of a per-step block (the
    top-level ``steps`` and each preset's) on one line without spaces; written in pieces, a column at a time (each
    preset's read from the pass's columns) and ``step_levels`` entry by entry, never a dict per step nor the document
    as one string. A column that several blocks share (a part's, such as one IS weight's) is formatted once."""
    document = result.json_document()
    presets = document["presets"]
    blocks = [document["steps"], *(preset["steps"] for preset in presets)]
    texts = _Texts(
        Counter(column.identity for block in blocks for column in block.values() if column.identity), TEXT_BUDGET
    )
    document["steps"] = ColumnTexts(document["steps"], texts)
    for preset in presets:
        preset["steps"] = ColumnTexts(preset["steps"], texts)
    pieces = (_preset_pieces(preset) for preset in presets)
    document["presets"] = ItemTexts(len(presets), lambda: pieces) if presets else []
    levels = document["step_levels"]
    document["step_levels"] = ItemTexts(len(levels), lambda: level_texts(levels)) if len(levels) else []
    return json_pieces(document)


class ColumnTexts:
    """A per-step block of the comparison document (name -> results.Column), which :func:`json_pieces` writes as an
    object of one-line lists, a column at a time."""

    def __init__(self, columns: dict[str, Column], texts: _Texts) -> None:
        self.columns, self.texts = columns, texts

    def pieces(self, newline: str) -> Iterator[str]:
        inner = newline + "  "
        for index, (name, column) in enumerate(self.columns.items()):
            yield ("{" if index == 0 else ",") + inner + _key(name) + ": " + self.texts.text(column)
        yield newline + "}" if self.columns else "{}"


TEXT_BUDGET = 192 * 2**20  # characters of column texts kept for a later preset (200 000 steps: ~3 MB a column)


class _Texts:
    """The one-line JSON text of columns, each column several blocks share formatted once: kept (``uses``: how many
    blocks hold each column identity) until its last use, while the texts kept stay under ``budget`` characters; a
    column past the budget is formatted each time it is written."""

    def __init__(self, uses: Counter, budget: int) -> None:
        self.uses, self.budget, self.size = uses, budget, 0
        self.kept: dict[Hashable, str] = {}  # a column's text by its identity, until its last use

    def text(self, column: Column) -> str:
        identity = column.identity
        if identity is None:
            return column_text(column)
        left = self.uses[identity] = self.uses[identity] - 1  # uses after this one
        found = self.kept.pop(identity, None) if left <= 0 else self.kept.get(identity)
        if found is not None:
            if left <= 0:
                self.size -= len(found)
            return found
        found = column_text(column)
        if left > 0 and self.size + len(found) <= self.budget:
            self.kept[identity] = found
            self.size += len(found)
        return found


def column_text(column: Column) -> str:
    """``json.dumps(column_json(column), separators=(",", ":"))``, from the column's values as a whole."""
    present, values = column.read()
    if values.dtype == np.float64:
        texts = _float_texts(values)
        for index in np.flatnonzero(~present).tolist():
            texts[index] = "null"
    elif values.dtype.kind in "iu" and present.all():
        texts = list(map(int.__repr__, values.tolist()))
    else:
        texts = [
            _indented(json_number(value), "") if here else "null"
            for value, here in zip(values.tolist(), present.tolist(), strict=True)
        ]
    return "[" + ",".join(texts) + "]"


_PRESET = "\n      "  # a value of a preset's own dict (an item of the top-level ``presets`` list)


def _preset_pieces(preset: dict[str, Any]) -> Iterator[str]:
    """``_indented(preset, "\\n    ")`` in pieces: its settings, its per-step columns (a piece each), its run."""
    head = _indented({key: value for key, value in preset.items() if key not in ("steps", "run")}, _ITEM)
    yield head[: -len(_ITEM + "}")] + "," + _PRESET + '"steps": '
    yield from preset["steps"].pieces(_PRESET)
    yield "," + _PRESET + '"run": ' + _indented(preset["run"], _PRESET) + _ITEM + "}"


def _plain(column: np.ndarray | list[int], kind: str) -> list:
    """Python floats or ints, as the step tables hold them (``float(x)``, ``int(x)``)."""
    if isinstance(column, list):
        return [int(value) for value in column]
    return column.astype(np.float64 if kind == "f" else np.int64).tolist()


def _key(key: object) -> str:
    if type(key) is str:
        return encode_basestring_ascii(key)
    return json.dumps({key: 0})[1:-4]  # json's own conversion of a non-string key


def _indented(value: object, newline: str) -> str:
    """``json.dumps(value, indent=2, allow_nan=False)`` with every line break followed by the indentation in
    ``newline`` (the value's own depth): the same text for dicts, lists, str, int, float, bool and None."""
    kind = type(value)
    encode = _SCALARS.get(kind)
    if encode is not None:
        return encode(value)
    inner = newline + "  "
    scalar = _SCALARS.get  # scalars are encoded in place (a call per value was most of the time)
    if kind is dict:
        if not value:
            return "{}"
        items = (
            _key(key) + ": " + (encode(item) if (encode := scalar(type(item))) else _indented(item, inner))
            for key, item in value.items()  # type: ignore[attr-defined]
        )
        return "{" + inner + ("," + inner).join(items) + newline + "}"
    if kind is list or kind is tuple:
        if not value:
            return "[]"
        items = (
            encode(item) if (encode := scalar(type(item))) else _indented(item, inner)
            for item in value  # type: ignore[attr-defined]
        )
        return "[" + inner + ("," + inner).join(items) + newline + "]"
    # anything else (subclasses, numpy scalars, NaN): json says what it makes of it, or raises as to_json_text does
    return json.dumps(value, indent=2, allow_nan=False).replace("\n", newline)


def _float(value: float) -> str:
    if value != value or value in (math.inf, -math.inf):
        raise ValueError(f"Out of range float values are not JSON compliant: {value!r}")
    return float.__repr__(value)


_SCALARS: dict[type, Callable[[Any], str]] = {
    str: encode_basestring_ascii,
    float: _float,
    int: int.__repr__,
    bool: lambda value: "true" if value else "false",
    type(None): lambda value: "null",
}


def steps_csv(steps: Sequence[StepResult], leading: dict[str, Any] | None = None) -> str:
    """One line per step: step, rows, tokens, then every metric (union of names, first-seen order)."""
    names: dict[str, None] = {}
    for step in steps:
        names.update(dict.fromkeys(step.metrics))
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    lead = dict(leading or {})
    writer.writerow([*lead, "step", "rows", "tokens", *names])
    for step in steps:
        values = [step.metrics.get(name) for name in names]
        writer.writerow(
            [
                *lead.values(),
                step.step,
                step.rows,
                step.tokens,
                *(plain_number(v) for v in values),
            ]
        )
    return buffer.getvalue()


def analysis_csv(result: Any) -> str:
    """``analyze --format csv``: one line per step, then a line for the whole run, whose step cell is empty (null): a
    word there would make a reader (polars, pandas) take the whole step column as text."""
    return steps_csv([*result.steps, result.run])


def plain_number(value: Any) -> str:
    """A CSV cell: the float's shortest round-trip digits (never ``np.float64(…)``); empty for None/NaN."""
    if value is None or value == "":
        return ""
    if isinstance(value, (bool, int)) and not isinstance(value, float):
        return str(int(value))
    number = float(value)
    return "" if math.isnan(number) else repr(number)


def sweep_csv(result: SweepResult) -> str:
    """One line per step (and the run, its step cell empty) × option × target: the threshold and the share it
    rejects."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["step", "option", "level", "target", "threshold", "share", "verl_default", "default_share"])
    tables = [(None, result.run)] + [(entry.step, entry.options) for entry in result.steps]
    for step, options in tables:
        for row in options:
            for entry in row.thresholds:
                writer.writerow(
                    [
                        step,
                        row.option,
                        row.level,
                        plain_number(entry.target),
                        plain_number(entry.threshold),
                        plain_number(entry.share),
                        row.verl_default or "",
                        plain_number(row.default_share) if row.verl_default else "",
                    ]
                )
    return buffer.getvalue()


def comparison_csv(result: Any) -> str:
    """One line per preset × step (and a run line per preset, its step cell empty): name, mode, then every metric."""
    names: dict[str, None] = {}
    for preset in result.presets:
        for step in [*preset.steps, preset.run]:
            names.update(dict.fromkeys(step.metrics))
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["preset", "mode", "step", "rows", "tokens", *names])
    for preset in result.presets:
        for step in [*preset.steps, preset.run]:
            values = [step.metrics.get(name) for name in names]
            writer.writerow(
                [
                    preset.name,
                    preset.mode,
                    step.step,  # None (an empty cell) for the run: the column stays numeric
                    step.rows,
                    step.tokens,
                    *(plain_number(v) for v in values),
                ]
            )
    return buffer.getvalue()


def _kinds(presence: list[np.ndarray], count: int) -> np.ndarray:
    """Per step, a number naming which key groups it reports (``presence``: one bool [count] per group): steps of one
    kind share one text with a slot per value."""
    if not presence:
        return np.zeros(count, dtype=np.int64)
    _, kinds = np.unique(np.packbits(np.stack(presence, axis=1), axis=1), axis=0, return_inverse=True)
    return kinds.reshape(count)


def _pattern_texts(
    kinds: np.ndarray,
    pattern_of: Callable[[np.ndarray], tuple[str, list] | None],
    encoded: Callable[[int], str],
    values_of: Callable[[list, np.ndarray], list[list[str]]],
) -> Iterator[str]:
    """Each step's text, a block of steps at a time: the steps of one kind fill one pattern (``pattern_of`` the
    kind's steps: its text with ``%s`` slots and the slots, made once per kind; ``values_of`` the slots' value texts
    for some steps); a kind without a pattern is encoded step by step (``encoded``)."""
    patterns: dict[int, tuple[str, list] | None] = {}
    for begin in range(0, kinds.shape[0], _BLOCK):
        block = kinds[begin : begin + _BLOCK]
        texts: list[str] = [""] * block.shape[0]
        for kind in np.unique(block).tolist():
            if kind not in patterns:
                patterns[kind] = pattern_of(np.flatnonzero(kinds == kind))
            at = np.flatnonzero(block == kind)
            found = patterns[kind]
            if found is None:
                for index in at.tolist():
                    texts[index] = encoded(begin + index)
                continue
            pattern, slots = found
            for index, row in zip(at.tolist(), zip(*values_of(slots, at + begin), strict=True), strict=True):
                texts[index] = pattern % row
        yield from texts
