"""The result's typed rows and findings: a step's metrics, skipped rows, judged metrics, worst rows and tokens,
anomalies, trends, hints and their evidence, the overall verdict."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

import numpy as np

from rollout_diag.catalogue import K3_KL
from rollout_diag.formatting import ExtraValue
from rollout_diag.results.reprs import repr_text, short_repr
from rollout_diag.results.shapes import JsonItem, json_as, json_number, optional


def share_text(share: float) -> str:
    """A share in 3 significant digits, for sentences: "50 %", "99.6 %", "0.781 %"."""
    return f"{100.0 * share:.3g} %"


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
class SkippedData(JsonItem):
    """How much of the input reading left out, and why: the rows and model tokens skipped as invalid, of those read
    (analysed + skipped), and every skipped row counted by what was wrong with it (``reasons``, most rows first).
    ``tokens`` counts the model tokens of the skipped rows whose lists could be read (a null list, lists of unequal
    lengths or an undecodable row group have none to count)."""

    rows: int = 0
    input_rows: int = field(default=0, metadata=json_as(then=("row_share",)))
    tokens: int = 0
    input_tokens: int = field(default=0, metadata=json_as(then=("token_share",)))
    reasons: dict[str, int] = field(default_factory=dict, metadata=json_as(write=dict, read=dict))
    # the first row skipped, in reading order
    first: SkippedRow | None = field(default=None, metadata=json_as(write=optional(asdict)))

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


def repr_sizes(run: StepResult, steps: Sequence[StepResult], skipped_rows: int) -> str:
    """Rows and model tokens analysed, steps, and the rows reading skipped."""
    return (
        f"{run.rows:,} rows, {run.tokens:,} model tokens, {len(steps):,} step{'s' if len(steps) != 1 else ''}, "
        f"{skipped_rows:,} rows skipped"
    )


def repr_verdict(verdict: OverallVerdict | None) -> str:
    if verdict is None:
        return "verdict n/a"
    return f"verdict {verdict.level} ({verdict.cause}): {repr_text(verdict.sentence)}"


@dataclass(frozen=True)
class RowPlace:
    """Where a row sits: its step, sample, file and row number within the file."""

    step: int
    sample_id: str
    file: str
    row: int


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
    # position of the row's first model token whose two logprobs differ in any bit; None when every one is equal
    first_differing_position: int | None = None


@dataclass(frozen=True)
class WorstToken(RowPlace):
    """One of the tokens with the largest |δ|, located to the step, row, position and round."""

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
class RowTokens(RowPlace):
    """Every token of one row (environment tokens included), for token strips and ``inspect``."""

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
    # the whole row's first model token whose two logprobs differ in any bit (inspect; None: every one is equal or,
    # in a result's worst_row_tokens, see worst_rows)
    first_differing_position: int | None = None
    # lists with one value per listed token: a saved result whose lists disagree is refused when read
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
    # the step a resumed run starts at, when this step is one of the few right after it (decisions/resume.py): a
    # restart's transient, not a spike of the run's mismatch; None otherwise (and absent from JSON)
    resume: int | None = None


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
class RowRef(RowPlace):
    """A row to look at, with how strongly it shows the hint's pattern."""

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


# An Evidence.files piece's back step where its rows' steps go back more than once: rows out of step order (shuffled
# or interleaved), a layout rather than a resumed run (decisions/resume.py)
UNORDERED = -2


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
    # file -> pieces of its rows in row order (first row, first step, last step, min step, max step, row and step of
    # the first step back, -1 for none, UNORDERED where the piece goes back more than once): where a file sequence's
    # steps go back (a resumed run)
    files: Mapping[str, Sequence[tuple[int, ...]]] = field(default_factory=dict)


@dataclass(frozen=True)
class DivergentRound:
    """The most divergent round, as the support rule names it and rollout_diag/decisions/analysis.py judges it: its mean
    |δ| and tokens, the other rounds' token-weighted mean (None without another round's token), their ratio with and
    without the round's largest |δ| token (None where not defined), whether it stands out, why not when one token
    makes it (``note``), and the rounds below the support rule (never named)."""

    round: int
    pooled: bool
    logprob_abs_diff_mean: float
    token_count: int
    others_mean: float | None
    factor: float | None
    factor_without_largest: float | None
    stands_out: bool
    note: str
    unsupported: list[int]

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> DivergentRound:
        """As written (null stays None); keys of an older build's document default, keys this build does not know are
        left out."""
        known = {spec.name for spec in fields(cls)}
        optional: dict[str, Any] = {"factor_without_largest": None, "note": "", "unsupported": []}
        return cls(**{**optional, **{key: value for key, value in raw.items() if key in known}})


@dataclass(frozen=True)
class HintRow(RowPlace):
    """A row a hint points at: its step, sample and where it sits (file, row number within the file)."""


@dataclass(frozen=True)
class Hint:
    """A likely root cause the data supports (rollout_diag/decisions/hints.py): one sentence, the numbers behind it, and
    where to look (steps, rows, and what in them)."""

    id: str  # off_by_one | dummy_logprobs | processed_logprobs | first_token | last_token | low_probability | …
    message: str
    evidence: dict[str, float]
    steps: list[int] = field(default_factory=list)
    rows: list[HintRow] = field(default_factory=list)
    look_at: str = ""


@dataclass(frozen=True)
class OverallVerdict(JsonItem):
    """The answer in one object (rollout_diag/decisions/verdict.py states the rules): the level, what causes it, one
    sentence saying what to do first, the key metrics that set the level, the pipeline findings (hint ids) behind
    cause ``pipeline``, and notes (length, negative χ², little data, outliers)."""

    level: str  # "ok" | "watch" | "bad" | "n/a"
    cause: str  # "none" | "mismatch" | "pipeline"
    sentence: str
    metrics: list[str] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


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
