"""Result objects: plain, frozen, JSON-able. The contract every renderer (terminal, JSON, CSV, HTML) reads."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from rollout_diag.catalogue import CATALOGUE, INTRUSIVE_MIN_ESS, INTRUSIVE_REJECTED_FRACTION, K3_KL, OFFPOLICY_PREFIX
from rollout_diag.errors import ConfigError, InputError, option_name
from rollout_diag.formatting import ExtraValue

SCHEMA_VERSION = 2  # 2: compare-presets writes its per-step metrics as columns (1: a step object each)


# ----------------------------------------------------------------------- short reprs
REPR_MAX = 1000  # characters of any result's repr, whatever the data: a notebook cell or a log line, never a dump
REPR_TEXT = 160  # characters of one data string (a sentence, a file name) inside a repr


def short_repr(kind: str, *parts: str) -> str:
    """``<kind: part; part; …>`` cut to REPR_MAX characters: what a result is about (verdict, sizes, worst step), so
    that ``repr`` in a REPL or a log shows an answer rather than every token and per-step dict."""
    text = f"<{kind}: {'; '.join(part for part in parts if part)}>"
    return text if len(text) <= REPR_MAX else f"{text[: REPR_MAX - 2]}…>"


def repr_text(text: object) -> str:
    """A data string quoted for a repr, cut to REPR_TEXT characters."""
    shown = repr(str(text))
    return shown if len(shown) <= REPR_TEXT else f"{shown[: REPR_TEXT - 2]}…{shown[0]}"


def repr_inputs(inputs: Sequence[str]) -> str:
    """``1 input 'a.parquet'`` or ``12 inputs 'a.parquet', …``."""
    if not inputs:
        return ""
    more = ", …" if len(inputs) > 1 else ""
    return f"{len(inputs):,} input{'s' if len(inputs) != 1 else ''} {repr_text(inputs[0])}{more}"


def repr_sizes(run: StepResult, steps: Sequence[StepResult], skipped_rows: int) -> str:
    """Rows and model tokens analysed, steps, and the rows reading skipped."""
    return (
        f"{run.rows:,} rows, {run.tokens:,} model tokens, {len(steps):,} step{'s' if len(steps) != 1 else ''}, "
        f"{skipped_rows:,} rows skipped"
    )


def repr_worst_step(steps: Sequence[StepResult]) -> str:
    """The step with the largest k3_kl (the one a user looks at first), or "" with fewer than two scored steps."""
    key = K3_KL.key
    present, values = metric_column(steps, key)
    scored = present & ~np.isnan(values)
    if int(scored.sum()) < 2:
        return ""
    index = int(np.flatnonzero(scored)[np.argmax(values[scored])])
    return f"worst step {int(step_ids(steps)[index])} (k3_kl {values[index]:.4g})"


def repr_verdict(verdict: OverallVerdict | None) -> str:
    if verdict is None:
        return "verdict n/a"
    return f"verdict {verdict.level} ({verdict.cause}): {repr_text(verdict.sentence)}"


@dataclass(frozen=True)
class SkippedRow:
    """A row left out of the analysis, and why. ``row`` counts from 0 within ``file``."""

    file: str
    row: int | None
    column: str | None
    reason: str

    def describe(self) -> str:
        parts = [self.file]
        if self.row is not None:
            parts.append(f"row {self.row}")
        if self.column is not None:
            parts.append(f"column '{self.column}'")
        return f"{', '.join(parts)}: {self.reason}"


@dataclass(frozen=True)
class SkippedData:
    """How much of the input reading left out, and why: the rows and model tokens skipped as invalid, of those read
    (analysed + skipped), and every skipped row counted by what was wrong with it (``reasons``, most rows first).
    ``tokens`` counts the model tokens of the skipped rows whose lists could be read (a null list, lists of unequal
    lengths or an undecodable row group have none to count)."""

    rows: int = 0
    input_rows: int = 0
    tokens: int = 0
    input_tokens: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    first: SkippedRow | None = None  # the first row skipped, in reading order

    @property
    def row_share(self) -> float:
        return self.rows / self.input_rows if self.input_rows else 0.0

    @property
    def token_share(self) -> float:
        return self.tokens / self.input_tokens if self.input_tokens else 0.0

    def line(self) -> str:
        """ "64 of 128 rows (50 %) skipped: trainer logprobs NaN (all 64)" ("" when nothing was skipped)."""
        if not self.rows:
            return ""
        return f"{self.rows:,} of {self.input_rows:,} rows ({share_text(self.row_share)}) skipped: {self.reason_text()}"

    def detail(self) -> str:
        """``line()``, then the model tokens skipped and the first skipped row: what ``invalid_rows`` says."""
        tokens = (
            f"; {self.tokens:,} of {self.input_tokens:,} model tokens ({share_text(self.token_share)})"
            if self.tokens
            else ""
        )
        first = f"; the first: {self.first.describe()}" if self.first is not None else ""
        return f"{self.line()}{tokens}{first}"

    def reason_text(self) -> str:
        """ "trainer logprobs NaN (all 64)" or "trainer logprobs NaN (40), rollout logprobs null (24)"."""
        if len(self.reasons) == 1:
            ((reason, rows),) = self.reasons.items()
            return f"{reason} ({'all ' if rows == self.rows and rows > 1 else ''}{rows:,})"
        return ", ".join(f"{reason} ({rows:,})" for reason, rows in self.reasons.items())

    def counts(self, rows: int, tokens: int) -> str:
        """ "64 of 128 rows, 4,000 of 8,000 model tokens" (the analysed ``rows`` and ``tokens`` of those read), or "128
        rows, 8,000 model tokens" when nothing was skipped."""
        if not self.rows:
            return f"{rows:,} rows, {tokens:,} model tokens"
        return f"{rows:,} of {self.input_rows:,} rows, {tokens:,} of {self.input_tokens:,} model tokens"

    def to_json(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "input_rows": self.input_rows,
            "row_share": self.row_share,
            "tokens": self.tokens,
            "input_tokens": self.input_tokens,
            "token_share": self.token_share,
            "reasons": dict(self.reasons),
            "first": None if self.first is None else asdict(self.first),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> SkippedData:
        first = raw.get("first")
        return cls(
            rows=raw["rows"],
            input_rows=raw["input_rows"],
            tokens=raw.get("tokens", 0),
            input_tokens=raw.get("input_tokens", 0),
            reasons=dict(raw.get("reasons", {})),
            first=None if first is None else SkippedRow(**first),
        )


def share_text(share: float) -> str:
    """A share in 3 significant digits, for sentences: "50 %", "99.6 %", "0.781 %"."""
    return f"{100.0 * share:.3g} %"


@dataclass(frozen=True)
class Verdict:
    """How a key metric looks: ``ok`` below ``watch``, ``watch`` below ``bad``, else ``bad``."""

    metric: str
    value: float | None
    level: str  # "ok" | "watch" | "bad" | "n/a"
    watch: float
    bad: float
    meaning: str


@dataclass(frozen=True)
class StepResult:
    """One training step (= one verl batch), or the whole run when ``step`` is None."""

    step: int | None
    rows: int
    tokens: int
    metrics: dict[str, float]
    empty_rows: int = 0
    # framework -> metric name as that trainer logs it -> value (``--dialect``; docs/dialects.md)
    dialects: dict[str, dict[str, float]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rows": self.rows, "tokens": self.tokens, "empty_rows": self.empty_rows}
        if self.step is not None:
            out = {"step": self.step, **out}
        out["metrics"] = {name: json_number(value) for name, value in self.metrics.items()}
        if self.dialects:
            out["dialects"] = {
                framework: {name: json_number(value) for name, value in values.items()}
                for framework, values in self.dialects.items()
            }
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> StepResult:
        """Inverse of ``to_json``; a null metric (NaN or inf when written) comes back as NaN."""
        metrics = {name: math.nan if value is None else value for name, value in raw.get("metrics", {}).items()}
        dialects = {
            framework: {name: math.nan if value is None else value for name, value in values.items()}
            for framework, values in raw.get("dialects", {}).items()
        }
        return cls(raw.get("step"), raw["rows"], raw["tokens"], metrics, raw.get("empty_rows", 0), dialects)

    def __repr__(self) -> str:
        k3_kl = self.metrics.get(K3_KL.key)
        return short_repr(
            "StepResult",
            "run" if self.step is None else f"step {self.step}",
            f"{self.rows:,} rows, {self.tokens:,} model tokens, {self.empty_rows:,} empty",
            f"{len(self.metrics):,} metrics" + ("" if k3_kl is None else f", k3_kl {k3_kl:.4g}"),
        )


# ----------------------------------------------------------------------- per-step values as columns
# One group of keys a set of steps reports together: (steps that report them: bool [S], key -> values [S]); the values
# are a float64 array (each read back as a Python float) or an object array (values kept as the family gave them).
KeyColumns = tuple[np.ndarray, dict[str, np.ndarray]]


class MetricColumns:
    """Per-step ``name -> value`` dicts held as columns: key groups in order. Step ``i``'s dict is the groups that
    report at ``i``, folded in order as ``dict.update`` would (a key keeps its first place and takes its last
    value); ``order`` (name -> rank) then moves the ranked names first, by rank (a framework's declared order)."""

    __slots__ = ("_rows", "_sorted", "groups", "order", "reports", "where")

    def __init__(self, groups: Sequence[KeyColumns], count: int, order: Mapping[str, int] | None = None) -> None:
        kept = []
        self._rows: list[tuple[np.ndarray, tuple[str, ...], np.ndarray | None]] = []
        for present, values in groups:
            if not values:
                continue
            present = np.asarray(present, dtype=bool)
            names = tuple(values)
            matrix = None
            if all(np.asarray(column).dtype == np.float64 for column in values.values()):
                # a float group as one [S, keys] matrix: a step's row is one read (tolist), its columns are views
                matrix = np.empty((present.shape[0], len(names)))
                for index, column in enumerate(values.values()):
                    matrix[:, index] = column
                values = {name: matrix[:, index] for index, name in enumerate(names)}
            kept.append((present, dict(values)))
            self._rows.append((present, names, matrix))
        self.groups: tuple[KeyColumns, ...] = tuple(kept)
        self.order = dict(order) if order else None
        self._sorted: dict[tuple[str, ...], list[str]] = {}
        self.where: dict[str, tuple[int, ...]] = {}  # name -> the groups holding it, in order
        for index, (_, values) in enumerate(self.groups):
            for name in values:
                self.where[name] = (*self.where.get(name, ()), index)
        reports = np.zeros(count, dtype=bool)
        for present, _ in self.groups:
            reports |= present
        self.reports = reports  # steps with at least one value

    def __reduce__(self):
        return (MetricColumns, (self.groups, self.reports.shape[0], self.order))

    def row(self, index: int) -> dict[str, Any]:
        """Step ``index``'s values as a plain dict."""
        out: dict[str, Any] = {}
        for (present, names, matrix), (_, values) in zip(self._rows, self.groups, strict=True):
            if not present[index]:
                continue
            if matrix is not None:
                out.update(zip(names, matrix[index].tolist(), strict=True))
            else:
                out.update((name, _scalar(column, index)) for name, column in values.items())
        if self.order is not None and out:
            keys = tuple(out)  # the order depends only on the keys: sorted once per set of keys
            if (names := self._sorted.get(keys)) is None:
                rank, last = self.order, len(self.order)
                names = self._sorted[keys] = sorted(keys, key=lambda name: rank.get(name, last))
            out = {name: out[name] for name in names}
        return out

    def value(self, name: str, index: int) -> Any:
        """Step ``index``'s value of ``name``; KeyError when it has none."""
        for group in reversed(self.where.get(name, ())):
            present, values = self.groups[group]
            if present[index]:
                return _scalar(values[name], index)
        raise KeyError(name)

    def column(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps that report ``name``: bool [S], its values [S] as float64, NaN where absent)."""
        present = np.zeros(self.reports.shape[0], dtype=bool)
        values = np.full(self.reports.shape[0], math.nan)
        for group in self.where.get(name, ()):
            reports, columns = self.groups[group]
            values[reports] = np.asarray(columns[name][reports], dtype=np.float64)
            present |= reports
        return present, values


def _scalar(column: np.ndarray, index: int) -> Any:
    return float(column[index]) if column.dtype == np.float64 else column[index]


class RowMetrics(Mapping):
    """One step's values, read from its MetricColumns on access (no dict per step is kept). Equal to the dict it
    stands for (NaN to NaN too); pickles and copies as that dict."""

    __slots__ = ("columns", "index")

    def __init__(self, columns: MetricColumns, index: int) -> None:
        self.columns, self.index = columns, index

    def __getitem__(self, name: str) -> Any:
        return self.columns.value(name, self.index)

    def __contains__(self, name: object) -> bool:
        return any(self.columns.groups[g][0][self.index] for g in self.columns.where.get(name, ()))  # type: ignore[arg-type]

    def __iter__(self):
        return iter(self.columns.row(self.index))

    def __len__(self) -> int:
        return len(self.columns.row(self.index))

    def items(self):  # one fold, not a lookup per key
        return self.columns.row(self.index).items()

    def values(self):
        return self.columns.row(self.index).values()

    def __eq__(self, other: object) -> bool:
        # as dict equality, but a NaN equals a NaN (a dict only compares its own NaN objects equal, and each read
        # of a column makes a new one)
        if not isinstance(other, Mapping):
            return NotImplemented
        mine, theirs = self.columns.row(self.index), dict(other.items())
        return mine.keys() == theirs.keys() and all(
            value == theirs[name] or (value != value and theirs[name] != theirs[name]) for name, value in mine.items()
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self.columns.row(self.index))

    def __reduce__(self):
        return (dict, (self.columns.row(self.index),))


class ReadSequence(Sequence):
    """A sequence whose items are made when read (none kept): equal to the list it stands for (item by item, so a
    list of the same items compares equal either way round), unhashable as a list, pickled as that list."""

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self):
        return (list, (list(self),))


class StepTable(ReadSequence):
    """``AnalysisResult.steps`` as columns: the step ids, their rows, tokens and empty rows, the metric values and each
    framework's dialect values; ``table[i]`` is a StepResult read from the columns (nothing per step is kept, so
    200 000 steps cost their numbers, not 200 000 dicts). Equal to the list of StepResults it stands for."""

    def __init__(
        self,
        steps: np.ndarray,
        rows: np.ndarray,
        tokens: np.ndarray,
        empty_rows: np.ndarray,
        metrics: MetricColumns,
        dialects: Mapping[str, MetricColumns] | None = None,
    ) -> None:
        self.step_ids = np.asarray(steps, dtype=np.int64)
        self.rows, self.tokens, self.empty_rows = (
            np.asarray(column, dtype=np.int64) for column in (rows, tokens, empty_rows)
        )
        self.metrics = metrics
        self.dialects = dict(dialects or {})
        self._built: list[StepResult] | None = None

    def __len__(self) -> int:
        return int(self.step_ids.shape[0])

    def __getitem__(self, index):  # type: ignore[override]
        return self._steps()[index]

    def __iter__(self):
        return iter(self._steps())

    def _steps(self) -> list[StepResult]:
        # built once, so that a step is the same object each time it is read (renderers key steps by identity);
        # each holds views into the columns, not dicts
        if self._built is None:
            reports = [(name, columns, columns.reports.tolist()) for name, columns in self.dialects.items()]
            counts = (self.step_ids.tolist(), self.rows.tolist(), self.tokens.tolist(), self.empty_rows.tolist())
            self._built = [
                StepResult(
                    step,
                    rows,
                    tokens,
                    RowMetrics(self.metrics, index),  # type: ignore[arg-type]
                    empty,
                    {name: RowMetrics(columns, index) for name, columns, at in reports if at[index]},  # type: ignore[misc]
                )
                for index, (step, rows, tokens, empty) in enumerate(zip(*counts, strict=True))
            ]
        return self._built

    def column(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps that report metric ``name``: bool [S], its values [S] as float64, NaN where absent)."""
        return self.metrics.column(name)

    def float_column(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        """``column(name)`` where every group holding ``name`` is float64 (each value is then exactly the float a step
        reads); None where one is not (read those steps' values one by one)."""
        holders = self.metrics.where.get(name, ())
        if any(np.asarray(self.metrics.groups[group][1][name]).dtype != np.float64 for group in holders):
            return None
        return self.metrics.column(name)

    def step(self, index: int) -> StepResult:
        """``table[index]`` without building every step: the built step once the table has been read whole, else
        one made alone (equal to it, not the same object)."""
        if self._built is not None:
            return self._built[index]
        index = range(len(self))[index]
        return StepResult(
            int(self.step_ids[index]),
            int(self.rows[index]),
            int(self.tokens[index]),
            RowMetrics(self.metrics, index),  # type: ignore[arg-type]
            int(self.empty_rows[index]),
            {name: RowMetrics(columns, index) for name, columns in self.dialects.items() if columns.reports[index]},  # type: ignore[misc]
        )

    def __repr__(self) -> str:
        return f"StepTable({len(self)} steps)"

    def __reduce__(self):
        return (StepTable, (self.step_ids, self.rows, self.tokens, self.empty_rows, self.metrics, self.dialects))


class Rows(ReadSequence):
    """A list of table rows (dicts with the same keys) held as columns: ``head`` (plain dicts) first, then one row per
    entry of the columns, each value a Python int, float, str or None as the dict it stands for would hold. Rows are
    built when read, none is kept (a 200 000-step run has 600 000 position rows). Equal to that list of dicts."""

    def __init__(self, head: Sequence[dict[str, Any]], columns: Mapping[str, np.ndarray]) -> None:
        self.head = list(head)
        self.names = tuple(columns)
        self.columns = tuple(np.asarray(column) for column in columns.values())
        self.count = self.columns[0].shape[0] if self.columns else 0

    def __len__(self) -> int:
        return len(self.head) + self.count

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(len(self))[index]]
        index = range(len(self))[index]
        if index < len(self.head):
            return dict(self.head[index])
        at = index - len(self.head)
        return dict(zip(self.names, (column[at : at + 1].tolist()[0] for column in self.columns), strict=True))

    def __iter__(self):
        for row in self.head:
            yield dict(row)
        for begin in range(0, self.count, 65_536):  # a block of rows at a time: Python values made in bulk
            values = [column[begin : begin + 65_536].tolist() for column in self.columns]
            for row in zip(*values, strict=True):
                yield dict(zip(self.names, row, strict=True))

    def __repr__(self) -> str:
        return f"Rows({len(self)} rows)"


def run_rows(positions: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of the whole run (``step`` None) of a positions or rounds table, in order. Rows held as columns:
    their run rows are the head's (a per-step row's step, an integer column, is never None), so no per-step row is
    made."""
    if isinstance(positions, Rows) and "step" in positions.names:
        step = positions.columns[positions.names.index("step")]
        if step.dtype.kind in "iu":
            return [row for row in positions.head if row.get("step") is None]
    return [row for row in positions if row.get("step") is None]


class Converted(ReadSequence):
    """``[convert(item) for item in items]``, each made when read and none kept: per-step results of a 200 000-step
    run (the sweep's 13 options × targets a step) as objects only while a renderer reads them. Equal to that list."""

    def __init__(self, items: Sequence[Any], convert: Any) -> None:
        self.items, self.convert = items, convert

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self.convert(item) for item in self.items[index]]
        return self.convert(self.items[index])

    def __iter__(self):
        return (self.convert(item) for item in self.items)

    def __repr__(self) -> str:
        return f"Converted({len(self)} items)"


def metric_column(steps: Sequence[StepResult], name: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps that report metric ``name``: bool [S], its values as float64, NaN where absent), from a StepTable's
    columns or step by step from a list."""
    if isinstance(steps, StepTable):
        return steps.column(name)
    present = np.array([name in step.metrics for step in steps], dtype=bool)
    values = np.array([step.metrics.get(name, math.nan) for step in steps], dtype=np.float64)
    return present, values


def step_ids(steps: Sequence[StepResult]) -> np.ndarray:
    """The step of each entry of ``steps`` (0 for the run's None), as int64."""
    if isinstance(steps, StepTable):
        return steps.step_ids
    return np.array([step.step or 0 for step in steps], dtype=np.int64)


@dataclass(frozen=True)
class WorstRow:
    """A row ranked among the worst by ``criterion``; ``value`` is its score under that criterion."""

    criterion: str  # log_ppl_abs_diff | max_abs_diff | k3_sum | catastrophic_share
    value: float
    step: int
    sample_id: str
    file: str
    row: int  # row number within ``file`` (token layout: first token's row)
    length: int  # tokens in the row, environment tokens included
    model_tokens: int
    rounds: int
    worst_round: int  # round with the highest mean |δ| in this row (-1 for a row with no model token)
    log_ppl_diff: float  # d_i = R_i[r] − R_i[a]
    max_abs_diff: float
    k3_sum: float
    catastrophic_count: int
    # The row's per-row dump columns no role takes (reward, advantage, policy_version, …), in column order.
    extra: dict[str, ExtraValue] = field(default_factory=dict)


@dataclass(frozen=True)
class WorstToken:
    """One of the tokens with the largest |δ|, located to the step, row, position and round."""

    step: int
    sample_id: str
    file: str
    row: int
    position: int  # index in the row, environment tokens included
    round: int
    token_id: int | None
    token: str | None
    trainer_logprob: float
    rollout_logprob: float
    log_ratio: float  # δ = trainer − rollout

    @property
    def trainer_prob(self) -> float:
        return math.exp(self.trainer_logprob)

    @property
    def rollout_prob(self) -> float:
        return math.exp(self.rollout_logprob)


@dataclass(frozen=True)
class RowTokens:
    """Every token of one row (environment tokens included), for token strips and ``inspect``."""

    step: int
    sample_id: str
    file: str
    row: int
    mask: list[int]
    trainer_logprob: list[float]  # 0.0 at mask-0 positions (never used there)
    rollout_logprob: list[float]
    token_id: list[int] | None = None
    token: list[str | None] | None = None
    start: int = 0  # position in the row of the first token listed (``inspect --around``: a window of the row)
    row_length: int | None = None  # tokens in the whole row when only a window is listed
    # … and then the whole row's largest |δ| over model tokens and its position (the window's may be smaller)
    row_largest_abs_delta: float | None = None
    row_largest_position: int | None = None
    extra: dict[str, ExtraValue] = field(default_factory=dict)  # the row's extra dump columns, as in WorstRow
    # lists with one value per listed token: a saved result whose lists disagree is refused when read (check_shape)
    JSON_SAME_LENGTH: ClassVar[tuple[str, ...]] = ("mask", "trainer_logprob", "rollout_logprob", "token_id", "token")

    @property
    def log_ratio(self) -> list[float]:
        return [a - r for a, r in zip(self.trainer_logprob, self.rollout_logprob, strict=True)]

    def __repr__(self) -> str:
        listed = len(self.mask)
        length = listed if self.row_length is None else self.row_length
        return short_repr(
            "RowTokens",
            f"sample {repr_text(self.sample_id)}, step {self.step}, {repr_text(self.file)} row {self.row:,}",
            f"tokens {self.start:,}–{self.start + listed:,} of {length:,} ({sum(self.mask):,} model tokens listed)",
        )


@dataclass(frozen=True)
class Anomaly:
    """A step whose ``metric`` is ``factor`` × the median of the previous steps' values (``baseline``) and above
    their robust log-scale spread (rollout_diag/decisions/trends.py states the rule)."""

    step: int
    metric: str
    value: float
    baseline: float
    factor: float


@dataclass(frozen=True)
class Trend:
    """Least-squares slope of ``metric`` against ``against`` (round index or step), 95 % confidence interval."""

    metric: str
    against: str
    slope: float
    ci_low: float
    ci_high: float
    points: int
    summary: str  # one line for a human, empty when the data shows no significant trend
    # step trends: the rise test (decisions/trends.py rise_test); NaN for a round trend or fewer than 8 steps
    headline: str = ""  # "mean |δ| up 2.5× from step 0 to 44" when the rise is significant, else empty
    rank_correlation: float = math.nan  # Spearman's ρ of the value with the step
    p_value: float = math.nan  # one-sided, for a rise
    level_before: float = math.nan  # median of the first max(3, n // 10) steps
    level_after: float = math.nan  # … of the last as many
    ratio: float = math.nan  # level_after / level_before


Sums = Mapping[str, Any]  # one state of metrics/hints.py as plain floats and lists (a step's or the run's)


@dataclass(frozen=True)
class RowRef:
    """A row to look at, with how strongly it shows the hint's pattern."""

    step: int
    sample_id: str
    file: str
    row: int
    score: float


FILL_VALUES_KEPT = 4  # distinct fill values named per file and side


@dataclass
class FillCount:
    """Model tokens of one side of one file whose logprob is a fill value (``catalogue.FILL_LOGPROB`` or below):
    how many, in how many rows, which values, and the first of them in reading order."""

    column: str
    tokens: int = 0
    rows: int = 0
    values: dict[float, int] = field(default_factory=dict)  # fill value -> tokens (the FILL_VALUES_KEPT commonest)
    first: RowRef | None = None  # the first row holding one (its score: the token's position in the row)

    def add(self, other: FillCount) -> None:
        """Fold in another part of the same file and side (a later part: the first row stays the earliest)."""
        self.tokens += other.tokens
        self.rows += other.rows
        for value, count in other.values.items():
            self.values[value] = self.values.get(value, 0) + count
        kept = sorted(self.values.items(), key=lambda item: -item[1])[:FILL_VALUES_KEPT]
        self.values = dict(kept)
        if self.first is None or (other.first is not None and other.first.row < self.first.row):
            self.first = other.first


@dataclass(frozen=True)
class Evidence:
    """What ``HintEvidenceAccumulator.evidence()`` hands over: sums for the run and per step, example rows per
    hint, and per version lag [tokens, Σy, Σy², rows] (empty without a policy_version column)."""

    run: Sums
    steps: Mapping[int, Sums]
    examples: Mapping[str, Sequence[RowRef]] = field(default_factory=dict)
    lags: Mapping[int, Sequence[float]] = field(default_factory=dict)
    has_versions: bool = False
    # inputs without a mask column: (tokens read, of them rollout logprob exactly 0.0 where the trainer's < log 0.5)
    unmasked: tuple[int, int] = (0, 0)
    # (file, role) -> model tokens holding a fill value instead of a logprob (io/reader.py counts them)
    fills: Mapping[tuple[str, str], FillCount] = field(default_factory=dict)


@dataclass(frozen=True)
class Hint:
    """A likely root cause the data supports (rollout_diag/decisions/hints.py): one sentence, the numbers behind it, and
    where to look (steps, rows, and what in them)."""

    id: str  # off_by_one | dummy_logprobs | processed_logprobs | first_token | last_token | low_probability | …
    message: str
    evidence: dict[str, float]
    steps: list[int] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)  # {"step", "sample_id", "file", "row"}
    look_at: str = ""


@dataclass(frozen=True)
class OverallVerdict:
    """The answer in one object (rollout_diag/decisions/verdict.py states the rules): the level, what causes it, one
    sentence saying what to do first, the key metrics that set the level, the pipeline findings (hint ids) behind
    cause ``pipeline``, and notes (length, negative χ², little data, outliers)."""

    level: str  # "ok" | "watch" | "bad" | "n/a"
    cause: str  # "none" | "mismatch" | "pipeline"
    sentence: str
    metrics: list[str] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> OverallVerdict:
        return _item(cls, raw)


@dataclass(frozen=True)
class GroupResult:
    """One group of rows of ``--by`` (``rollout_diag/groups.py``): its key metrics for the run and per step."""

    column: str  # the --by spec as written: "env_name", "reward:sign", "response_length:bins=100,1000"
    value: ExtraValue  # the column's value or the bucket's label; None: rows where the column is null
    rows: int
    tokens: int
    row_share: float  # of the run's rows
    token_share: float  # of the run's model tokens
    metrics: dict[str, float]
    steps: list[StepResult]
    verdict: dict[str, Any]  # {"level", "sentence", "metrics": {key: {"value", "level"}}}
    most_divergent_round: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "column": self.column,
            "value": self.value,
            "rows": self.rows,
            "tokens": self.tokens,
            "row_share": self.row_share,
            "token_share": self.token_share,
            "metrics": {name: json_number(value) for name, value in self.metrics.items()},
            "steps": [step.to_json() for step in self.steps],
            "verdict": _json_verdict(self.verdict),
            "most_divergent_round": self.most_divergent_round,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> GroupResult:
        return cls(
            column=raw["column"],
            value=raw["value"],
            rows=raw["rows"],
            tokens=raw["tokens"],
            row_share=raw.get("row_share", 0.0),
            token_share=raw.get("token_share", 0.0),
            metrics={name: math.nan if value is None else value for name, value in raw["metrics"].items()},
            steps=[StepResult.from_json(step) for step in raw.get("steps", [])],
            verdict=dict(raw.get("verdict", {})),
            most_divergent_round=raw.get("most_divergent_round"),
        )

    def __repr__(self) -> str:
        return short_repr(
            "GroupResult",
            f"{repr_text(self.column)} = {repr_text('(null)' if self.value is None else self.value)}",
            f"verdict {self.verdict.get('level', 'n/a')}",
            f"{self.rows:,} rows, {self.tokens:,} model tokens, {len(self.steps):,} steps",
        )


def _frames() -> Any:
    """rollout_diag.export.frames, loaded when a dataframe is asked for: by name, so that the result contract (which
    tests/test_architecture.py keeps free of heavy imports, polars among them) loads polars only in to_polars()."""
    import importlib

    return importlib.import_module("rollout_diag.export.frames")


def _json_verdict(verdict: Mapping[str, Any]) -> dict[str, Any]:
    metrics = {
        key: {**entry, "value": json_number(entry.get("value"))} for key, entry in verdict.get("metrics", {}).items()
    }
    return {**verdict, "metrics": metrics}


@dataclass(frozen=True)
class StepLevel:
    """The JSON shape of one ``step_levels`` entry (kept as a plain dict in the results): the step, its level and
    each judged metric's level. Read by ``check_shape`` only."""

    step: int | None
    level: str
    levels: dict[str, str]


@dataclass(frozen=True)
class AnalysisResult:
    """Everything ``analyze`` found; ``to_json()`` is the documented JSON (schemas/result.schema.json)."""

    JSON_SHAPES: ClassVar[dict[str, Any]] = {"step_levels": list[StepLevel]}  # fields whose JSON is typed further

    inputs: list[str]
    columns: dict[str, str]
    layout: str
    device: str
    run: StepResult
    steps: list[StepResult]  # built by analyze: a StepTable (the same StepResults, held as columns)
    rounds: list[dict[str, Any]]
    verdicts: list[Verdict]
    # Localisation (where it diverges): see rollout_diag/metrics/localize.py.
    # log2 position buckets; "step" None = run (built by analyze: Rows, the same dicts held as columns)
    positions: list[dict[str, Any]] = field(default_factory=list)
    worst_rows: list[WorstRow] = field(default_factory=list)
    worst_tokens: list[WorstToken] = field(default_factory=list)
    worst_row_tokens: list[RowTokens] = field(default_factory=list)
    delta_histogram: dict[str, list[float]] = field(default_factory=dict)  # signed log bins of δ, run level
    anomalies: list[Anomaly] = field(default_factory=list)
    trends: list[Trend] = field(default_factory=list)
    catastrophic_threshold: float = 1.0
    warnings: list[str] = field(default_factory=list)
    skipped: list[SkippedRow] = field(default_factory=list)
    skipped_rows: int = 0
    # how much of the input was skipped, of how much, and why (every skipped row counted, not only those listed)
    skipped_data: SkippedData = field(default_factory=SkippedData)
    anomalies_cut: int = 0  # flags beyond the ANOMALY_KEEP largest (``anomalies`` holds those, largest first)
    hints: list[Hint] = field(default_factory=list)  # likely root causes, only those the data supports
    format: str = "parquet"  # the trainer format the inputs were read as (io/formats)
    # Judgement, filled once by rollout_diag.decisions when the result is built; renderers only read these.
    verdict: OverallVerdict | None = None
    # per step: {"step", "level" (the step's worst), "levels": {judged metric: level}}
    step_levels: list[dict[str, Any]] = field(default_factory=list)
    # the most divergent round under the support rule and whether it stands out from the others (None: one round)
    divergent_round: dict[str, Any] | None = None
    anomaly_check: str = ""  # why the anomaly rule could not apply ("" when it did)
    groups: list[GroupResult] = field(default_factory=list)  # --by: every group of every spec, worst first
    selection: dict[str, Any] = field(default_factory=dict)  # --where / --steps: {"where", "steps", "rows_kept", …}

    def to_json(self) -> dict[str, Any]:
        document = self.json_document()
        return {
            **document,
            "steps": [step.to_json() for step in self.steps],
            "positions": [_json_row(row) for row in self.positions],
            "step_levels": [dict(entry) for entry in self.step_levels],
        }

    def json_document(self) -> dict[str, Any]:
        """``to_json`` with the per-step tables ``steps``, ``positions`` and ``step_levels`` left as this result holds
        them (a StepTable, Rows, a list of dicts), in their places: what ``render.export.analysis_json_pieces`` writes
        from their columns, a step at a time, without a dict per step."""
        return {
            "schema_version": SCHEMA_VERSION,
            "inputs": list(self.inputs),
            "columns": dict(self.columns),
            "layout": self.layout,
            "format": self.format,
            "device": self.device,
            "run": self.run.to_json(),
            "steps": self.steps,
            "rounds": [_json_row(row) for row in self.rounds],
            "verdicts": [{**asdict(v), "value": json_number(v.value)} for v in self.verdicts],
            "catastrophic_threshold": self.catastrophic_threshold,
            "positions": self.positions,
            "worst_rows": [{**_json_row(asdict(row)), "extra": _json_row(row.extra)} for row in self.worst_rows],
            "worst_tokens": [
                _json_row({**asdict(t), "trainer_prob": t.trainer_prob, "rollout_prob": t.rollout_prob})
                for t in self.worst_tokens
            ],
            "worst_row_tokens": [
                {**asdict(row), "end": row.start + len(row.mask), "extra": _json_row(row.extra)}
                for row in self.worst_row_tokens
            ],
            "delta_histogram": dict(self.delta_histogram),
            "anomalies": [_json_row(asdict(a)) for a in self.anomalies],
            "anomalies_cut": self.anomalies_cut,
            "trends": [_json_row(asdict(t)) for t in self.trends],
            "warnings": list(self.warnings),
            "skipped": [asdict(s) for s in self.skipped],
            "skipped_rows": self.skipped_rows,
            "skipped_data": self.skipped_data.to_json(),
            "hints": [{**asdict(h), "evidence": _json_row(h.evidence)} for h in self.hints],
            "verdict": None if self.verdict is None else self.verdict.to_json(),
            "step_levels": self.step_levels,
            "divergent_round": None if self.divergent_round is None else _json_row(self.divergent_round),
            "anomaly_check": self.anomaly_check,
            "groups": [group.to_json() for group in self.groups],
            "selection": dict(self.selection),
        }

    def to_polars(self) -> dict[str, Any]:
        """The tables a user slices, as polars DataFrames: steps (one row per step, one column per verl-named
        metric), run, rounds, positions, worst_rows (with their extra columns), worst_tokens, verdicts, groups and
        group_steps (``--by``). Raises ConfigError without polars."""
        return _frames().analysis_frames(self)

    def to_pandas(self) -> dict[str, Any]:
        """``to_polars()``'s tables as pandas DataFrames; raises ConfigError (saying what to install) without pandas."""
        return _frames().to_pandas(self.to_polars())

    def _repr_html_(self) -> str:
        """A notebook shows the verdict, where the mismatch sits and the key metrics (not the dataclass)."""
        from rollout_diag.export.notebook import analysis_html

        return analysis_html(self)

    def __repr__(self) -> str:
        findings = self.verdict.findings if self.verdict is not None else []
        return short_repr(
            "AnalysisResult",
            repr_verdict(self.verdict),
            repr_sizes(self.run, self.steps, self.skipped_rows),
            repr_worst_step(self.steps),
            f"findings {', '.join(findings)}" if findings else "",
            repr_inputs(self.inputs),
        )

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> AnalysisResult:
        """The AnalysisResult that ``to_json()`` wrote ``document`` from (JSON null metrics come back as NaN).

        Raises InputError when the document is not an ``analyze`` result of a schema version this build reads.
        """
        if not isinstance(document, dict) or "run" not in document or "steps" not in document:
            raise InputError("not an `analyze --format json` result: expected keys 'run' and 'steps'")
        _schema_version(document)
        try:  # a field of the wrong shape: one line naming it
            check_shape(cls, document, "", require=False)
            rows = [
                (f"{name}[{index}]", name, row)
                for name in _TABLE_ROW_LABEL
                for index, row in enumerate(document.get(name, []))
            ]
            if document.get("divergent_round") is not None:  # a rounds row, judged
                rows.append(("divergent_round", "rounds", document["divergent_round"]))
            for where_, name, row in rows:  # rows of numbers, labelled by a few keys
                label, kind = _TABLE_ROW_LABEL[name]
                if label not in row:
                    raise InputError(f"field '{where_}.{label}': missing.")
                check_shape(kind, row[label], f"{where_}.{label}")
                for key, value in row.items():
                    check_shape(_TABLE_ROW_KEYS.get(key, float), value, _join(where_, key))
            check_shape(dict[str, list[Number]], document.get("delta_histogram", {}), "delta_histogram")
        except InputError as exc:
            raise InputError(f"not an `analyze --format json` result: {exc.message}") from None
        values: dict[str, Any] = {}
        for spec in dataclasses.fields(cls):
            if spec.name not in document:
                continue
            raw = document[spec.name]
            if spec.name == "run":
                values[spec.name] = StepResult.from_json(raw)
            elif spec.name == "steps":
                values[spec.name] = [StepResult.from_json(step) for step in raw]
            elif spec.name in _ITEM_TYPES:
                values[spec.name] = [_item(_ITEM_TYPES[spec.name], item) for item in raw]
            elif spec.name == "verdict":
                values[spec.name] = None if raw is None else OverallVerdict.from_json(raw)
            elif spec.name == "skipped_data":
                values[spec.name] = SkippedData.from_json(raw)
            elif spec.name == "groups":
                values[spec.name] = [GroupResult.from_json(group) for group in raw]
            elif spec.name in ("rounds", "positions"):
                values[spec.name] = [{key: _nan_for_null(value, key) for key, value in row.items()} for row in raw]
            else:
                values[spec.name] = raw
        missing = [spec.name for spec in dataclasses.fields(cls) if _required(spec) and spec.name not in values]
        if missing:
            raise InputError(f"result JSON lacks {', '.join(missing)}")
        return cls(**values)


# List fields of AnalysisResult whose items are dataclasses.
_ITEM_TYPES: dict[str, type] = {
    "verdicts": Verdict,
    "skipped": SkippedRow,
    "worst_rows": WorstRow,
    "worst_tokens": WorstToken,
    "worst_row_tokens": RowTokens,
    "anomalies": Anomaly,
    "trends": Trend,
    "hints": Hint,
}


def _item(item_type: type, raw: dict[str, Any]) -> Any:
    """One list item; keys this build does not know (derived ones such as ``trainer_prob``) are left out, and a null
    where the field is a number (NaN or inf when written) comes back as NaN."""
    hints = _hints(item_type)
    return item_type(**{key: _nan_nulls(hints[key], value) for key, value in raw.items() if key in hints})


def _nan_nulls(expected: Any, value: Any) -> Any:
    if expected is float:
        return math.nan if value is None else value
    origin, arguments = typing.get_origin(expected), typing.get_args(expected)
    if origin is dict and arguments[1:] == (float,) and isinstance(value, dict):
        return {key: math.nan if item is None else item for key, item in value.items()}
    if origin is list and arguments == (float,) and isinstance(value, list):
        return [math.nan if item is None else item for item in value]
    return value


def _required(spec: dataclasses.Field) -> bool:
    return spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING


def _nan_for_null(value: Any, key: str) -> Any:
    # Integers-or-labels stay as they are; a null float metric was NaN before to_json().
    if value is None and key not in ("step", "bucket", "label"):
        return math.nan
    return value


def _json_row(row: dict[str, Any]) -> dict[str, Any]:
    return {key: json_number(value) for key, value in row.items()}


def extra_names(rows: Iterable[WorstRow]) -> list[str]:
    """The extra columns of ``rows``, each once, in the order they first appear (a table's extra columns)."""
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(getattr(row, "extra", None) or {}))
    return list(names)


def json_number(value: Any) -> Any:
    """NaN and ±inf have no JSON spelling: they become null (the schema allows it for metrics)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


@dataclass(frozen=True)
class SweepTarget:
    """For one target share: the threshold (in verl's units) that rejects at most that share, and the share it does."""

    target: float
    threshold: float
    share: float


@dataclass(frozen=True)
class SweepPoint:
    """One point of an option's share-vs-threshold curve (threshold in verl's units)."""

    threshold: float
    share: float


@dataclass(frozen=True)
class SweepOption:
    """One rejection option (or IS truncation) of the sweep, for the run or one step (rollout_diag.metrics.sweep)."""

    JSON_SHAPES: ClassVar[dict[str, Any]] = {"level": Literal["token", "sequence"]}  # what the sentences know

    option: str  # seq_mean_k3, token_k1, is_sequence, …
    level: str  # "token" | "sequence"
    verl_default: str | None  # verl's default threshold spec for the option, None where verl has none
    count: int  # tokens or valid rows the shares are taken over
    exact: bool  # sequence options: exact; token options: from a histogram (never above the target)
    thresholds: list[SweepTarget]
    default_threshold: float | None = None  # the upper bound of verl_default, where the curve is marked
    default_share: float | None = None  # the share verl's default rejects
    curve: list[SweepPoint] | None = None  # run level only

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"option": self.option, "level": self.level, "verl_default": self.verl_default}
        if self.default_threshold is not None:
            out["default_threshold"] = self.default_threshold
        out["count"], out["exact"] = self.count, self.exact
        if self.default_share is not None:
            out["default_share"] = self.default_share
        out["thresholds"] = [asdict(target) for target in self.thresholds]
        if self.curve is not None:
            out["curve"] = [asdict(point) for point in self.curve]
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> SweepOption:
        """Inverse of ``to_json`` (also how the sweep accumulator's table rows become typed rows)."""
        curve = raw.get("curve")
        return cls(
            option=raw["option"],
            level=raw["level"],
            verl_default=raw.get("verl_default"),
            count=raw["count"],
            exact=raw["exact"],
            thresholds=[SweepTarget(**entry) for entry in raw["thresholds"]],
            default_threshold=raw.get("default_threshold"),
            default_share=raw.get("default_share"),
            curve=None if curve is None else [SweepPoint(**point) for point in curve],
        )


@dataclass(frozen=True)
class SweepStep:
    """The sweep of one step (its options without curves)."""

    step: int
    options: list[SweepOption]

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "options": [option.to_json() for option in self.options]}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> SweepStep:
        return cls(raw["step"], [SweepOption.from_json(option) for option in raw["options"]])


@dataclass(frozen=True)
class SweepResult:
    """Threshold sweep (``rollout-diag sweep``): per option, thresholds for target shares, verl's default's share."""

    inputs: list[str]
    columns: dict[str, str]
    targets: list[float]
    run: list[SweepOption]  # one entry per option, with the share-vs-threshold curve
    steps: list[SweepStep]  # per step, without curves
    warnings: list[str] = field(default_factory=list)
    skipped: list[SkippedRow] = field(default_factory=list)
    skipped_rows: int = 0

    def to_json(self) -> dict[str, Any]:
        return _document(
            self,
            targets=list(self.targets),
            run=[option.to_json() for option in self.run],
            steps=_steps_json(self.steps),
        )

    def json_document(self) -> dict[str, Any]:
        """``to_json`` with ``steps`` as a sequence read step by step (the sweep's own per-step tables where the steps
        come from them): what ``render.export.json_pieces`` writes without holding every step's dict."""
        steps = self.steps
        lazy = steps.items if isinstance(steps, Converted) and steps.convert == SweepStep.from_json else None
        return _document(
            self,
            targets=list(self.targets),
            run=[option.to_json() for option in self.run],
            steps=lazy if lazy is not None else _steps_json(steps),
        )

    def __repr__(self) -> str:
        return short_repr(
            "SweepResult",
            f"{len(self.run):,} options, targets {', '.join(f'{target:g}' for target in self.targets[:8])}"
            + (", …" if len(self.targets) > 8 else ""),
            f"{len(self.steps):,} steps, {self.skipped_rows:,} rows skipped",
            repr_inputs(self.inputs),
        )


def _steps_json(steps: Sequence[SweepStep]) -> list[dict[str, Any]]:
    """Each step's JSON: the sweep's own per-step tables where the steps are read from them (``to_json`` of the step
    ``SweepStep.from_json`` makes of a table is that table), else ``to_json`` step by step."""
    if isinstance(steps, Converted) and steps.convert == SweepStep.from_json:
        return list(steps.items)
    return [step.to_json() for step in steps]


def _document(result: Any, **body: Any) -> dict[str, Any]:
    """A sweep or comparison result's JSON: provenance first, its own ``body``, then what reading skipped."""
    return {
        "schema_version": SCHEMA_VERSION,
        "inputs": list(result.inputs),
        "columns": dict(result.columns),
        **body,
        "warnings": list(result.warnings),
        "skipped": [asdict(s) for s in result.skipped],
        "skipped_rows": result.skipped_rows,
    }


# ------------------------------------------------------------- compare-presets' per-step columns (schema version 2)
# A column's source: (each step's position in ``values``, None where it is the step's own index, -1 where the source
# has no entry for the step; the entries that hold a value, None: all; the values).
ColumnSource = tuple["np.ndarray | None", "np.ndarray | None", np.ndarray]
STEP_COUNTS = ("step", "rows", "tokens", "empty_rows")  # the leading columns of the document's top-level ``steps``
# METRICS.md §1: the off-policy metrics of the data, the same under every preset (verl computes them before any
# correction); the comparison document writes them once per step, in its top-level ``steps``
FIRST_SECTION = frozenset(metric.key for metric in CATALOGUE.values() if metric.section == "offpolicy")


class Column:
    """One column of a per-step block of the ``compare-presets`` document: a value per step, assembled when read from
    ``sources`` in order (a later source's value wins, as a step's key groups fold). ``identity`` names what the
    column is read from (equal identities, equal columns; None: not named), so that a writer formats once a column
    that several presets share."""

    __slots__ = ("count", "identity", "sources")

    def __init__(self, count: int, sources: Sequence[ColumnSource], identity: Hashable | None = None) -> None:
        self.count, self.sources, self.identity = count, tuple(sources), identity

    def read(self) -> tuple[np.ndarray, np.ndarray]:
        """(steps with a value: bool [S], the values [S]): float64 (NaN where absent) where every source is float64,
        a source's own dtype where it is the only one and covers every step (the int64 step counts), else object
        (each value as the source holds it, None where absent)."""
        if len(self.sources) == 1 and self.sources[0][0] is None and self.sources[0][1] is None:
            return np.ones(self.count, dtype=bool), np.asarray(self.sources[0][2])
        floats = all(np.asarray(values).dtype == np.float64 for _, _, values in self.sources)
        out = np.full(self.count, math.nan) if floats else np.full(self.count, None, dtype=object)
        present = np.zeros(self.count, dtype=bool)
        for at, reports, values in self.sources:
            values = np.asarray(values)
            if at is None:
                here = np.ones(self.count, dtype=bool) if reports is None else np.array(reports, dtype=bool)
                out[here] = values[here]
            else:
                here = at >= 0
                positions = at[here]
                if reports is not None:
                    keep = np.asarray(reports, dtype=bool)[positions]
                    here[here] = keep
                    positions = positions[keep]
                out[here] = values[positions]
            present |= here
        return present, out


def column_json(column: Column) -> list[Any]:
    """``column`` as the document's list: each value as ``json_number`` gives it (null for NaN and ±inf), null where
    the step has no value."""
    present, values = column.read()
    if values.dtype == np.float64:
        out = values.tolist()
        for index in np.flatnonzero(~(present & np.isfinite(values))).tolist():
            out[index] = None
        return out
    out = values.tolist()
    return [json_number(value) if here else None for value, here in zip(out, present.tolist(), strict=True)]


def table_columns(metrics: MetricColumns, count: int, names: Iterable[str] | None = None) -> dict[str, Column]:
    """The keys of ``metrics`` (``names`` of them, in their order; default: every key, in the order its groups list
    them) as document columns, each folded from the groups that hold it."""
    return {
        name: Column(
            count,
            [(None, metrics.groups[group][0], metrics.groups[group][1][name]) for group in metrics.where[name]],
            tuple((id(metrics.groups[group][0]), id(metrics.groups[group][1][name])) for group in metrics.where[name]),
        )
        for name in (metrics.where if names is None else names)
    }


def comparison_columns(presets: Sequence[PresetResult]) -> tuple[dict[str, Column], list[dict[str, Column]]]:
    """The per-step columns of the ``compare-presets`` document: its top-level block (each step's id, rows, tokens and
    empty rows, then its §1 metrics, the same under every preset) and each preset's own block (the step ids, then the
    preset's own metrics: §2/§3 or §8 and ``summary/``; a §1 key too where the preset's value differs, which a reader
    lays over the top-level one). Presets read from the pass (``metrics.outcome.PresetSteps``) or from a document
    (:class:`PresetTable`) give their columns as held; other steps are read step by step. Raises ValueError when the
    presets do not hold the same steps (a document has one set of steps)."""
    tables = [preset.steps for preset in presets]
    base = getattr(tables[0], "base", None) if tables else None
    if isinstance(base, StepTable) and all(
        getattr(steps, "base", None) is base and callable(getattr(steps, "json_columns", None)) for steps in tables
    ):
        count = len(base)
        top = {
            name: Column(count, [(None, None, column)], ("counts", id(column)))
            for name, column in zip(STEP_COUNTS, (base.step_ids, base.rows, base.tokens, base.empty_rows), strict=True)
        }
        top.update(
            table_columns(
                base.metrics, count, [name for name in base.metrics.where if name.startswith(OFFPOLICY_PREFIX)]
            )
        )
        return top, [{"step": top["step"], **steps.json_columns()} for steps in tables]
    return _listed_columns(presets)


def _listed_columns(presets: Sequence[PresetResult]) -> tuple[dict[str, Column], list[dict[str, Column]]]:
    """:func:`comparison_columns` of presets whose steps are StepResults, read one by one."""
    listed = [list(preset.steps) for preset in presets]
    first = listed[0] if listed else []
    count = len(first)
    counts = [np.array([getattr(step, name) for step in first], dtype=np.int64) for name in STEP_COUNTS]
    for preset, steps in zip(presets, listed, strict=True):
        mine = [[getattr(step, name) for step in steps] for name in STEP_COUNTS]
        if any(values != column.tolist() for values, column in zip(mine, counts, strict=True)):
            raise ValueError(
                f"preset {preset.name!r} holds other steps than {presets[0].name!r} (step ids, rows, tokens or empty "
                "rows): a compare-presets document holds one set of steps"
            )
    top = {name: Column(count, [(None, None, column)]) for name, column in zip(STEP_COUNTS, counts, strict=True)}
    shared = {name: None for step in first for name in step.metrics if name in FIRST_SECTION}
    top.update((name, _listed_column(first, name)) for name in shared)
    blocks = []
    for steps in listed:
        block = {"step": top["step"]}
        for name in {name: None for step in steps for name in step.metrics}:
            column = _listed_column(steps, name)
            if name not in shared or not _same_column(column, top[name]):
                block[name] = column
        blocks.append(block)
    return top, blocks


def _listed_column(steps: Sequence[StepResult], name: str) -> Column:
    present = np.array([name in step.metrics for step in steps], dtype=bool)
    values = [step.metrics[name] if here else None for step, here in zip(steps, present.tolist(), strict=True)]
    if all(type(value) is float for value, here in zip(values, present.tolist(), strict=True) if here):
        column = np.array([math.nan if value is None else value for value in values], dtype=np.float64)
    else:
        column = np.empty(len(values), dtype=object)
        column[:] = values
    return Column(len(steps), [(None, present, column)])


def _same_column(one: Column, other: Column) -> bool:
    """The same steps hold a value in both, and the values are equal (NaN equal to NaN)."""
    (here, values), (there, others) = one.read(), other.read()
    if not np.array_equal(here, there):
        return False
    return all(
        a == b or (a != a and b != b) for a, b in zip(values[here].tolist(), others[there].tolist(), strict=True)
    )


class PresetTable(StepTable):
    """``PresetResult.steps`` read back from a ``compare-presets`` document (schema version 2): the document's
    top-level columns (``base``: each step's counts and §1 metrics, shared by every preset) and the preset's own
    (``own``). A step's metrics are the §1 ones followed by the preset's own (a preset's value of a §1 key in that
    key's place), as the pass makes them (``metrics.outcome.with_metrics``)."""

    def __init__(self, base: StepTable, own: MetricColumns) -> None:
        super().__init__(
            base.step_ids,
            base.rows,
            base.tokens,
            base.empty_rows,
            MetricColumns([*base.metrics.groups, *own.groups], len(base)),
        )
        self.base, self.own = base, own

    def json_columns(self) -> dict[str, Column]:
        """The preset's own metrics as document columns (:func:`comparison_columns`)."""
        return table_columns(self.own, len(self))

    def __repr__(self) -> str:
        return f"PresetTable({len(self)} steps)"

    def __reduce__(self):
        return (PresetTable, (self.base, self.own))


def _block_from_json(
    raw: Any, path: str, counts: Sequence[str], length: int | None = None, prefix: str = ""
) -> tuple[dict[str, np.ndarray], MetricColumns]:
    """A per-step block of a ``compare-presets`` document (schema version 2): its ``counts`` columns as int64 and its
    metric columns as MetricColumns (each run of keys with a value on the same steps one group; a value null where the
    step has none; keys without ``prefix`` are left out); every column as long as the first (or ``length``). Raises
    InputError naming the field."""
    if not isinstance(raw, dict):
        raise InputError(f"field '{path}': expected an object of columns, found {_found(raw)}.")
    integers: dict[str, np.ndarray] = {}
    for name in counts:
        if name not in raw:
            raise InputError(f"field '{_join(path, name)}': missing.")
        check_shape(list[int], raw[name], _join(path, name))
        integers[name] = np.array(raw[name], dtype=np.int64)
    size = length if length is not None else len(raw[counts[0]])
    groups: list[KeyColumns] = []
    previous: np.ndarray | None = None
    for name, values in raw.items():
        if name in STEP_COUNTS or not name.startswith(prefix):
            continue
        where_ = _join(path, name)
        check_shape(list[float], values, where_)
        if len(values) != size:
            raise InputError(f"field '{where_}': expected {size} values (one per step), found {len(values)}.")
        present = np.array([value is not None for value in values], dtype=bool)
        if all(type(value) is float for value in values if value is not None):
            column = np.array([math.nan if value is None else value for value in values], dtype=np.float64)
        else:
            column = np.empty(size, dtype=object)
            column[:] = values
        if previous is not None and np.array_equal(previous, present):
            groups[-1][1][name] = column
        else:
            groups.append((present, {name: column}))
            previous = present
    for name, column in integers.items():
        if column.shape[0] != size:
            raise InputError(
                f"field '{_join(path, name)}': expected {size} values (one per step), found {column.shape[0]}."
            )
    return integers, MetricColumns(groups, size)


@dataclass(frozen=True)
class PresetResult:
    """One preset: its settings, §1 + §2/§3 (or §8) + ``summary/`` metrics per step and for the run."""

    name: str
    config: dict[str, Any]
    mode: str
    steps: list[StepResult]
    run: StepResult
    intrusive_reasons: tuple[str, ...] = ()  # decisions/intrusive.py: why the preset is intrusive (empty: it is not)

    @property
    def intrusive(self) -> bool:
        return bool(self.intrusive_reasons)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "mode": self.mode,
            "config": dict(self.config),
            "intrusive": self.intrusive,
            "intrusive_reasons": list(self.intrusive_reasons),
            "steps": [step.to_json() for step in self.steps],
            "run": self.run.to_json(),
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> PresetResult:
        """Inverse of ``to_json``."""
        return cls(
            name=raw["name"],
            config=raw["config"],
            mode=raw["mode"],
            steps=[StepResult.from_json(step) for step in raw["steps"]],
            run=StepResult.from_json(raw["run"]),
            intrusive_reasons=tuple(raw.get("intrusive_reasons", ())),
        )

    def __repr__(self) -> str:
        return short_repr(
            "PresetResult",
            f"{repr_text(self.name)} ({self.mode})" + (", intrusive" if self.intrusive else ""),
            f"{self.run.rows:,} rows, {self.run.tokens:,} model tokens, {len(self.steps):,} steps",
            f"{len(self.run.metrics):,} run metrics",
        )


@dataclass(frozen=True)
class Recommendation:
    """The recommended preset (None when no preset meets the rule), the rule, the runner-up, and why each more
    intrusive preset was not chosen (rollout_diag/decisions/recommend.py states the rule)."""

    preset: str | None
    rule: str
    reasons: list[str]
    runner_up: str | None = None
    runner_up_reason: str = ""
    not_chosen: list[tuple[str, str]] = field(default_factory=list)  # (preset, why), most intrusive last
    # Fields whose JSON form differs from their Python type (check_shape reads this): pairs are written as objects.
    JSON_SHAPES: ClassVar[dict[str, Any]] = {"not_chosen": list[dict[str, str]]}
    equivalent: list[str] = field(default_factory=list)  # same IS/RS settings, another mode: same numbers
    note: str = ""
    order: list[str] = field(default_factory=list)  # every preset, least intrusive first
    ties: list[str] = field(default_factory=list)  # presets within the noise bound of the chosen one
    tie_reason: str = ""  # why the chosen one won among its ties ("" without ties)

    def summary(self) -> str:
        if self.preset is None:
            return "No preset meets the rule on this data."
        return f"Recommended: {self.preset} ({'; '.join(self.reasons)})."

    def to_json(self) -> dict[str, Any]:
        return {
            "preset": self.preset,
            "rule": self.rule,
            "reasons": list(self.reasons),
            "runner_up": self.runner_up,
            "runner_up_reason": self.runner_up_reason,
            "not_chosen": [{"preset": name, "reason": reason} for name, reason in self.not_chosen],
            "equivalent": list(self.equivalent),
            "note": self.note,
            "order": list(self.order),
            "ties": list(self.ties),
            "tie_reason": self.tie_reason,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Recommendation:
        values = {key: value for key, value in raw.items() if key in {f.name for f in dataclasses.fields(cls)}}
        values["not_chosen"] = [(item["preset"], item["reason"]) for item in raw.get("not_chosen", [])]
        return cls(**values)

    def __repr__(self) -> str:
        return short_repr(
            "Recommendation",
            repr_text(self.summary()),
            f"runner-up {self.runner_up}" if self.runner_up else "",
            f"{len(self.ties):,} ties" if self.ties else "",
            f"{len(self.order):,} presets ranked",
        )


@dataclass(frozen=True)
class ComparisonResult:
    """What ``compare_presets`` found; ``to_json()`` is the documented JSON. ``sweep`` is the run-level threshold
    sweep (one entry per option, with its share-vs-threshold curve: rollout_diag.metrics.sweep)."""

    JSON_SHAPES: ClassVar[dict[str, Any]] = {"step_levels": list[StepLevel]}  # fields whose JSON is typed further

    inputs: list[str]
    columns: dict[str, str]
    presets: list[PresetResult]
    warnings: list[str] = field(default_factory=list)
    skipped: list[SkippedRow] = field(default_factory=list)
    skipped_rows: int = 0
    skipped_data: SkippedData = field(default_factory=SkippedData)  # as AnalysisResult.skipped_data
    layout: str = ""
    device: str = ""
    sweep: list[SweepOption] = field(default_factory=list)
    intrusive_rejected_fraction: float = INTRUSIVE_REJECTED_FRACTION
    intrusive_min_ess: float = INTRUSIVE_MIN_ESS
    # Judgement, filled once by rollout_diag.decisions when the comparison is built: the data's overall verdict,
    # the recommendation, or (None) why it is withheld.
    verdict: OverallVerdict | None = None
    recommendation: Recommendation | None = None
    recommendation_withheld: str | None = None
    verdicts: list[Verdict] = field(default_factory=list)  # the data's key metrics, judged (as AnalysisResult's)
    step_levels: list[dict[str, Any]] = field(default_factory=list)  # as AnalysisResult.step_levels
    groups: list[GroupResult] = field(default_factory=list)  # --by: the key metrics per group (as analyze's)
    selection: dict[str, Any] = field(default_factory=dict)  # --where / --steps (as analyze's)

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> ComparisonResult:
        """Inverse of ``to_json`` (``compare-presets --format json``), of this schema version (per-step columns) or
        version 1 (a step object each); raises InputError for another document or a newer version."""
        what = "not a `compare-presets --format json` result"
        if not isinstance(document, dict):
            raise InputError(f"{what}: expected an object, found {_found(document)}.")
        presets: list[PresetResult] | None = None
        try:
            version = _schema_version(document)
            shape, listed = document, document.get("presets")
            if version >= 2 and isinstance(listed, list):  # the steps are columns, read below
                shape = {
                    **document,
                    "presets": [{**item, "steps": []} if isinstance(item, dict) else item for item in listed],
                }
            check_shape(cls, shape, "", require=False)
            check_shape(dict[str, Number], document.get("intrusive", {}), "intrusive")
            for index, option in enumerate(document.get("sweep", [])):  # the target shares asked for are never null
                for place, target in enumerate(option["thresholds"]):
                    check_shape(Number, target.get("target"), f"sweep[{index}].thresholds[{place}].target")
            if version >= 2:
                presets = _presets_from_columns(document)
        except InputError as exc:
            raise InputError(f"{what}: {exc.message}") from None
        try:
            intrusive = document.get("intrusive", {})
            return cls(
                inputs=document["inputs"],
                columns=document["columns"],
                presets=[PresetResult.from_json(item) for item in document["presets"]] if presets is None else presets,
                warnings=document.get("warnings", []),
                skipped=[SkippedRow(**item) for item in document.get("skipped", [])],
                skipped_rows=document.get("skipped_rows", 0),
                skipped_data=SkippedData.from_json(document["skipped_data"])
                if "skipped_data" in document
                else SkippedData(),
                layout=document.get("layout", ""),
                device=document.get("device", ""),
                sweep=[SweepOption.from_json(option) for option in document.get("sweep", [])],
                intrusive_rejected_fraction=intrusive.get("rejected_fraction", INTRUSIVE_REJECTED_FRACTION),
                intrusive_min_ess=intrusive.get("min_ess", INTRUSIVE_MIN_ESS),
                verdict=None if document.get("verdict") is None else OverallVerdict.from_json(document["verdict"]),
                recommendation=None
                if document.get("recommendation") is None
                else Recommendation.from_json(document["recommendation"]),
                recommendation_withheld=document.get("recommendation_withheld"),
                verdicts=[_item(Verdict, item) for item in document.get("verdicts", [])],
                step_levels=list(document.get("step_levels", [])),
                groups=[GroupResult.from_json(group) for group in document.get("groups", [])],
                selection=dict(document.get("selection", {})),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise InputError(f"not a `compare-presets --format json` result (missing {exc}).") from exc

    def to_polars(self) -> dict[str, Any]:
        """presets (run metrics per preset), preset_steps, sweep (per option and target), groups and group_steps
        (``--by``) as polars DataFrames."""
        return _frames().comparison_frames(self)

    def to_pandas(self) -> dict[str, Any]:
        """``to_polars()``'s tables as pandas DataFrames; raises ConfigError (saying what to install) without pandas."""
        return _frames().to_pandas(self.to_polars())

    def _repr_html_(self) -> str:
        from rollout_diag.export.notebook import comparison_html

        return comparison_html(self)

    def __repr__(self) -> str:
        if self.recommendation is not None and self.recommendation.preset is not None:
            answer = f"recommended {self.recommendation.preset}"
        else:
            answer = f"no recommendation: {repr_text(self.recommendation_withheld or 'no preset meets the rule')}"
        first = self.presets[0] if self.presets else None
        return short_repr(
            "ComparisonResult",
            repr_verdict(self.verdict),
            answer,
            f"{len(self.presets):,} presets",
            "" if first is None else repr_sizes(first.run, first.steps, self.skipped_rows),
            "" if first is None else repr_worst_step(first.steps),
            repr_inputs(self.inputs),
        )

    def preset(self, name: str) -> PresetResult:
        """The result of preset ``name``; raises KeyError."""
        for result in self.presets:
            if result.name == name:
                return result
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        """The documented JSON (schemas/comparison.schema.json): the per-step values as columns, a list per key, in the
        top-level ``steps`` (each step's id, rows, tokens, empty rows and §1 metrics, the same under every preset) and
        in each preset's ``steps`` (the step ids and the preset's own metrics); null where a step has no value."""
        document = self.json_document()
        document["step_levels"] = [dict(entry) for entry in self.step_levels]
        document["steps"] = {name: column_json(column) for name, column in document["steps"].items()}
        document["presets"] = [
            {**preset, "steps": {name: column_json(column) for name, column in preset["steps"].items()}}
            for preset in document["presets"]
        ]
        return document

    def json_document(self) -> dict[str, Any]:
        """``to_json`` with the per-step blocks as :class:`Column` objects (read when written) and ``step_levels`` the
        entries as held: what ``render.export.comparison_json_pieces`` writes a column at a time."""
        top, blocks = comparison_columns(self.presets)
        presets = [
            {
                "name": preset.name,
                "mode": preset.mode,
                "config": dict(preset.config),
                "intrusive": preset.intrusive,
                "intrusive_reasons": list(preset.intrusive_reasons),
                "steps": block,
                "run": preset.run.to_json(),
            }
            for preset, block in zip(self.presets, blocks, strict=True)
        ]
        return _document(
            self,
            layout=self.layout,
            device=self.device,
            intrusive={"rejected_fraction": self.intrusive_rejected_fraction, "min_ess": self.intrusive_min_ess},
            verdict=None if self.verdict is None else self.verdict.to_json(),
            recommendation=None if self.recommendation is None else self.recommendation.to_json(),
            recommendation_withheld=self.recommendation_withheld,
            skipped_data=self.skipped_data.to_json(),
            verdicts=[{**asdict(v), "value": json_number(v.value)} for v in self.verdicts],
            step_levels=self.step_levels,
            steps=top,
            presets=presets,
            sweep=[option.to_json() for option in self.sweep],
            **({"groups": [group.to_json() for group in self.groups]} if self.groups else {}),
            **({"selection": dict(self.selection)} if self.selection else {}),
        )


def _schema_version(document: dict[str, Any]) -> int:
    """The document's ``schema_version`` (1 where it has none); raises InputError for one that is no whole number or
    newer than this build reads."""
    version = document.get("schema_version", 1)
    if isinstance(version, bool) or not isinstance(version, int):
        raise InputError(f"field 'schema_version': expected a whole number, found {_found(version)}.")
    if version > SCHEMA_VERSION:
        raise InputError(
            f"result has schema_version {version}, this rollout-diag reads up to {SCHEMA_VERSION}: upgrade"
        )
    return version


def _presets_from_columns(document: dict[str, Any]) -> list[PresetResult]:
    """The presets of a ``compare-presets`` document of schema version 2: each preset's steps a :class:`PresetTable`
    over the top-level ``steps`` columns and its own. Raises InputError naming the field that is wrong."""
    if "steps" not in document:
        raise InputError("field 'steps': missing.")
    counts, shared = _block_from_json(document["steps"], "steps", STEP_COUNTS, prefix=OFFPOLICY_PREFIX)
    base = StepTable(counts["step"], counts["rows"], counts["tokens"], counts["empty_rows"], shared)
    presets = []
    for index, item in enumerate(document.get("presets", [])):  # their other fields' shape is checked
        path = f"presets[{index}].steps"
        if "steps" not in item:
            raise InputError(f"field '{path}': missing.")
        steps, own = _block_from_json(item["steps"], path, ("step",), len(base))
        if not np.array_equal(steps["step"], base.step_ids):
            raise InputError(f"field '{path}.step': expected the steps of the top-level 'steps.step'.")
        presets.append(
            PresetResult(
                name=item["name"],
                config=item["config"],
                mode=item["mode"],
                steps=PresetTable(base, own),  # type: ignore[arg-type]
                run=StepResult.from_json(item["run"]),
                intrusive_reasons=tuple(item.get("intrusive_reasons", ())),
            )
        )
    return presets


@dataclass(frozen=True)
class RowStats:
    """Per-row columns (float64 [R]) of one run, in reading order; ``rejected[preset]``: model tokens the
    preset drops in each row (RS rejection, IcePop zero weight, legacy mask/veto)."""

    step: np.ndarray  # int64 [R]
    tokens: np.ndarray  # n_i, float64 [R]
    sums: dict[str, np.ndarray]  # S_i[x] by name (metrics/rowstats.py ROW_SUMS)
    rejected: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return int(self.step.shape[0])

    def select(self, keep: np.ndarray) -> RowStats:
        """The rows where ``keep`` (bool [R]) is true."""
        return RowStats(
            self.step[keep],
            self.tokens[keep],
            {name: values[keep] for name, values in self.sums.items()},
            {name: values[keep] for name, values in self.rejected.items()},
        )

    def in_steps(self, first: int | None, last: int | None) -> RowStats:
        """Rows of steps first..last (inclusive; None = open end)."""
        keep = np.ones(self.rows, dtype=bool)
        if first is not None:
            keep &= self.step >= first
        if last is not None:
            keep &= self.step <= last
        return self.select(keep)

    def column(self, name: str) -> np.ndarray:
        """``tokens``, a ROW_SUMS name, or ``rejected:<preset>``."""
        if name == "tokens":
            return self.tokens
        if name.startswith("rejected:"):
            return self.rejected[name.removeprefix("rejected:")]
        return self.sums[name]

    def __repr__(self) -> str:
        steps = np.unique(self.step).shape[0]
        return short_repr(
            "RowStats",
            f"{self.rows:,} rows, {steps:,} steps, {int(self.tokens.sum()):,} model tokens",
            f"{len(self.sums):,} row sums, {len(self.rejected):,} presets' rejections",
        )


@dataclass(frozen=True)
class DialectLayout:
    """Plain-data description of the dialects: titles, and per framework its metric names -> concept, in order
    (built by ``metrics.dialects.layout()``, read by ``render.dialects``)."""

    titles: Mapping[str, str]
    concepts: Sequence[str]  # rows of the side-by-side table, in order
    metrics: Mapping[str, Mapping[str, str]]  # framework -> metric name -> concept


def result_from_json(document: Any) -> AnalysisResult | ComparisonResult:
    """The result a ``--format json`` document holds: ``compare-presets``'s (it has ``presets``) or ``analyze``'s
    (``run`` and ``steps``). Raises InputError for anything else."""
    if isinstance(document, dict) and "presets" in document:
        return ComparisonResult.from_json(document)
    if isinstance(document, dict) and "run" in document and "steps" in document:
        return AnalysisResult.from_json(document)
    raise InputError("not the --format json output of analyze or compare-presets.")


def load_results(paths: Sequence[str | Path]) -> tuple[AnalysisResult | None, ComparisonResult | None]:
    """(analysis, comparison) from saved ``--format json`` files, at most one of each kind (a report draws one run).
    Raises InputError for an unreadable file or another document, ConfigError for two results of one kind."""
    import json

    found: dict[type, tuple[str | Path, AnalysisResult | ComparisonResult]] = {}
    for path in paths:
        try:
            document = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InputError(f"{path}: not a readable JSON file ({exc}).") from exc
        try:
            result = result_from_json(document)
        except InputError as exc:
            raise InputError(f"{path}: {exc.message}") from exc
        if type(result) in found:
            kind = "compare-presets" if isinstance(result, ComparisonResult) else "analyze"
            raise ConfigError(
                f"{option_name('from_json')}: {found[type(result)][0]} and {path} are both {kind} results; "
                "give one of each."
            )
        found[type(result)] = (path, result)
    analysis = found.get(AnalysisResult, (None, None))[1]
    comparison = found.get(ComparisonResult, (None, None))[1]
    return analysis, comparison  # type: ignore[return-value]


# ------------------------------------------------------------------ the shape of a saved result
# Keys of a rounds / positions row that are not numbers (every other key is a number, or null for NaN).
_TABLE_ROW_KEYS: dict[str, Any] = {
    "pooled": bool,
    "bucket": str,
    "label": str,
    "step": int | None,
    "stands_out": bool,
    "note": str,  # divergent_round's
    "unsupported": list[int],  # … and the rounds below the support rule
}
# The key that names each row of a table (never null), and its kind.
_TABLE_ROW_LABEL: dict[str, tuple[str, Any]] = {"rounds": ("round", int), "positions": ("bucket", str)}


class Number:
    """For :func:`check_shape`: a number that cannot be null (histogram edges and counts are never NaN)."""


_KIND_NAMES = {
    int: "a whole number",
    float: "a number",
    Number: "a number",
    str: "a string",
    bool: "true or false",
    type(None): "null",
}


def check_shape(expected: Any, value: Any, path: str, *, require: bool = True) -> None:
    """Raises InputError naming the field (``steps[3].metrics``) where ``value``, read from JSON, does not have the
    shape of the type ``expected``: a result dataclass (an object with its fields; unknown keys are allowed, and
    missing required ones are an error when ``require``), ``list[X]``, ``tuple[X, ...]``, ``dict[str, X]``, a union,
    ``int``, ``float`` (null allowed: NaN and inf are written as null), ``str``, ``bool`` or ``Any``."""
    problem = _shape_problem(expected, value, path, require)
    if problem is not None:
        where_, message = problem
        raise InputError(f"field '{where_}': {message}." if where_ else f"{message}.")


def _shape_problem(expected: Any, value: Any, path: str, require: bool = True) -> tuple[str, str] | None:
    if expected is Any:
        return None
    if dataclasses.is_dataclass(expected):
        if not isinstance(value, dict):
            return path, f"expected an object, found {_found(value)}"
        hints = _hints(expected)
        for spec in dataclasses.fields(expected):
            if spec.name not in value:  # a field that may be null may be left out (the run's step)
                if require and _required(spec) and _shape_problem(hints[spec.name], None, "") is not None:
                    return _join(path, spec.name), "missing"
                continue
            shape = getattr(expected, "JSON_SHAPES", {}).get(spec.name, hints[spec.name])
            problem = _shape_problem(shape, value[spec.name], _join(path, spec.name))
            if problem is not None:
                return problem
        return _length_problem(expected, value, path)
    origin, arguments = typing.get_origin(expected), typing.get_args(expected)
    if origin is Literal:
        return (
            None
            if value in arguments and type(value) in {type(a) for a in arguments}
            else (path, f"expected {_describe(expected)}, found {_found(value)}")
        )
    if origin in (typing.Union, types.UnionType):
        problems = [_shape_problem(arm, value, path) for arm in arguments]
        if all(problems):
            deepest = max(problems, key=lambda problem: len(problem[0]))  # type: ignore[index]
            if deepest[0] != path:  # the value has the right kind, but something inside it is wrong
                return deepest
            return path, f"expected {' or '.join(_describe(arm) for arm in arguments)}, found {_found(value)}"
        return None
    if origin in (list, tuple):
        if not isinstance(value, list):
            return path, f"expected a list, found {_found(value)}"
        item = arguments[0] if arguments else Any
        for index, element in enumerate(value):
            problem = _shape_problem(item, element, f"{path}[{index}]")
            if problem is not None:
                return problem
        return None
    if origin is dict:
        if not isinstance(value, dict):
            return path, f"expected an object, found {_found(value)}"
        item = arguments[1] if arguments else Any
        for key, element in value.items():
            problem = _shape_problem(item, element, _join(path, str(key)))
            if problem is not None:
                return problem
        return None
    if expected is float or expected is Number:
        ok = (value is None and expected is float) or (isinstance(value, (int, float)) and not isinstance(value, bool))
    elif expected is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif expected in (str, bool, type(None)):
        ok = isinstance(value, expected)
    else:
        ok = True  # a type this check does not know: left to the constructor
    return None if ok else (path, f"expected {_describe(expected)}, found {_found(value)}")


def _length_problem(expected: type, value: dict, path: str) -> tuple[str, str] | None:
    """Where the lists of ``expected.JSON_SAME_LENGTH`` in ``value`` (each a list or absent/null) differ in length
    from the first of them: the field and what it should hold."""
    names = [name for name in getattr(expected, "JSON_SAME_LENGTH", ()) if isinstance(value.get(name), list)]
    for name in names[1:]:
        if len(value[name]) != len(value[names[0]]):
            return (
                _join(path, name),
                f"expected {len(value[names[0]])} values (one per entry of '{names[0]}'), found {len(value[name])}",
            )
    return None


def _hints(result_type: type) -> dict[str, Any]:
    return typing.get_type_hints(result_type, globalns=globals())


def _join(path: str, name: str) -> str:
    """``path.name``; a key from the file that holds control characters is shown escaped (messages are one line)."""
    if not name.isprintable():
        name = name.encode("unicode_escape").decode("ascii")
    return f"{path}.{name}" if path else name


def _describe(expected: Any) -> str:
    if typing.get_origin(expected) is Literal:
        return " or ".join(repr(choice) for choice in typing.get_args(expected))
    if dataclasses.is_dataclass(expected) or typing.get_origin(expected) is dict:
        return "an object"
    if typing.get_origin(expected) in (list, tuple):
        return "a list"
    return _KIND_NAMES.get(expected, str(expected))


def _found(value: Any) -> str:
    """How a JSON value is named in an error: its JSON kind and (short) text."""
    kind = (
        "null"
        if value is None
        else "true/false"
        if isinstance(value, bool)
        else "a number"
        if isinstance(value, (int, float))
        else "a string"
        if isinstance(value, str)
        else "a list"
        if isinstance(value, list)
        else "an object"
        if isinstance(value, dict)
        else type(value).__name__
    )
    if isinstance(value, (list, dict)) or value is None:
        return kind
    text = repr(value)
    return f"{kind} ({text[:40]}{'…' if len(text) > 40 else ''})"
