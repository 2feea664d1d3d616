"""Result objects: plain, frozen, JSON-able. The contract every renderer (terminal, JSON, CSV, HTML) reads."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rollout_diag.decisions.intrusive import INTRUSIVE_MIN_ESS, INTRUSIVE_REJECTED_FRACTION
from rollout_diag.errors import ConfigError, InputError, option_name

SCHEMA_VERSION = 1
ExtraValue = float | int | bool | str | None  # a row's value of an extra dump column (reward, advantage, …)


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
    extra: dict[str, ExtraValue] = field(default_factory=dict)  # the row's extra dump columns, as in WorstRow

    @property
    def log_ratio(self) -> list[float]:
        return [a - r for a, r in zip(self.trainer_logprob, self.rollout_logprob, strict=True)]


@dataclass(frozen=True)
class Anomaly:
    """A step whose ``metric`` is ``factor`` × the median of the previous steps' values (``baseline``) and above
    their robust log-scale spread (rollout_diag/metrics/trends.py states the rule)."""

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


@dataclass(frozen=True)
class Hint:
    """A likely root cause the data supports (rollout_diag/hints.py): one sentence, the numbers behind it, and
    where to look (steps, rows, and what in them)."""

    id: str  # off_by_one | dummy_logprobs | processed_logprobs | first_token | last_token | low_probability | …
    message: str
    evidence: dict[str, float]
    steps: list[int] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)  # {"step", "sample_id", "file", "row"}
    look_at: str = ""


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
class AnalysisResult:
    """Everything ``analyze`` found; ``to_json()`` is the documented JSON (schemas/result.schema.json)."""

    inputs: list[str]
    columns: dict[str, str]
    layout: str
    device: str
    run: StepResult
    steps: list[StepResult]
    rounds: list[dict[str, Any]]
    verdicts: list[Verdict]
    # Localisation (where it diverges): see rollout_diag/metrics/localize.py.
    positions: list[dict[str, Any]] = field(default_factory=list)  # log2 position buckets; "step" None = run
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
    anomalies_cut: int = 0  # flags beyond the ANOMALY_KEEP largest (``anomalies`` holds those, largest first)
    hints: list[Hint] = field(default_factory=list)  # likely root causes, only those the data supports
    format: str = "parquet"  # the trainer format the inputs were read as (io/formats)
    groups: list[GroupResult] = field(default_factory=list)  # --by: every group of every spec, worst first
    selection: dict[str, Any] = field(default_factory=dict)  # --where / --steps: {"where", "steps", "rows_kept", …}

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "inputs": list(self.inputs),
            "columns": dict(self.columns),
            "layout": self.layout,
            "format": self.format,
            "device": self.device,
            "run": self.run.to_json(),
            "steps": [step.to_json() for step in self.steps],
            "rounds": [_json_row(row) for row in self.rounds],
            "verdicts": [{**asdict(v), "value": json_number(v.value)} for v in self.verdicts],
            "catastrophic_threshold": self.catastrophic_threshold,
            "positions": [_json_row(row) for row in self.positions],
            "worst_rows": [{**_json_row(asdict(row)), "extra": _json_row(row.extra)} for row in self.worst_rows],
            "worst_tokens": [
                _json_row({**asdict(t), "trainer_prob": t.trainer_prob, "rollout_prob": t.rollout_prob})
                for t in self.worst_tokens
            ],
            "worst_row_tokens": [{**asdict(row), "extra": _json_row(row.extra)} for row in self.worst_row_tokens],
            "delta_histogram": dict(self.delta_histogram),
            "anomalies": [_json_row(asdict(a)) for a in self.anomalies],
            "anomalies_cut": self.anomalies_cut,
            "trends": [_json_row(asdict(t)) for t in self.trends],
            "warnings": list(self.warnings),
            "skipped": [asdict(s) for s in self.skipped],
            "skipped_rows": self.skipped_rows,
            "hints": [{**asdict(h), "evidence": _json_row(h.evidence)} for h in self.hints],
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

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> AnalysisResult:
        """The AnalysisResult that ``to_json()`` wrote ``document`` from (JSON null metrics come back as NaN).

        Raises InputError when the document is not an ``analyze`` result of a schema version this build reads.
        """
        if not isinstance(document, dict) or "run" not in document or "steps" not in document:
            raise InputError("not an `analyze --format json` result: expected keys 'run' and 'steps'")
        version = document.get("schema_version")
        if version is not None and version > SCHEMA_VERSION:
            raise InputError(
                f"result has schema_version {version}, this rollout-diag reads up to {SCHEMA_VERSION}: upgrade"
            )
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
    """One list item; keys this build does not know (derived ones such as ``trainer_prob``) are left out."""
    names = {spec.name for spec in dataclasses.fields(item_type)}
    return item_type(**{key: value for key, value in raw.items() if key in names})


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
            steps=[step.to_json() for step in self.steps],
        )


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


@dataclass(frozen=True)
class ComparisonResult:
    """What ``compare_presets`` found; ``to_json()`` is the documented JSON. ``sweep`` is the run-level threshold
    sweep (one entry per option, with its share-vs-threshold curve: rollout_diag.metrics.sweep)."""

    inputs: list[str]
    columns: dict[str, str]
    presets: list[PresetResult]
    warnings: list[str] = field(default_factory=list)
    skipped: list[SkippedRow] = field(default_factory=list)
    skipped_rows: int = 0
    layout: str = ""
    device: str = ""
    sweep: list[SweepOption] = field(default_factory=list)
    intrusive_rejected_fraction: float = INTRUSIVE_REJECTED_FRACTION
    intrusive_min_ess: float = INTRUSIVE_MIN_ESS
    groups: list[GroupResult] = field(default_factory=list)  # --by: the key metrics per group (as analyze's)
    selection: dict[str, Any] = field(default_factory=dict)  # --where / --steps (as analyze's)

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> ComparisonResult:
        """Inverse of ``to_json`` (``compare-presets --format json``); raises InputError for another document."""
        try:
            intrusive = document.get("intrusive", {})
            return cls(
                inputs=document["inputs"],
                columns=document["columns"],
                presets=[PresetResult.from_json(item) for item in document["presets"]],
                warnings=document.get("warnings", []),
                skipped=[SkippedRow(**item) for item in document.get("skipped", [])],
                skipped_rows=document.get("skipped_rows", 0),
                layout=document.get("layout", ""),
                device=document.get("device", ""),
                sweep=[SweepOption.from_json(option) for option in document.get("sweep", [])],
                intrusive_rejected_fraction=intrusive.get("rejected_fraction", INTRUSIVE_REJECTED_FRACTION),
                intrusive_min_ess=intrusive.get("min_ess", INTRUSIVE_MIN_ESS),
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

    def preset(self, name: str) -> PresetResult:
        """The result of preset ``name``; raises KeyError."""
        for result in self.presets:
            if result.name == name:
                return result
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return _document(
            self,
            layout=self.layout,
            device=self.device,
            intrusive={"rejected_fraction": self.intrusive_rejected_fraction, "min_ess": self.intrusive_min_ess},
            presets=[preset.to_json() for preset in self.presets],
            sweep=[option.to_json() for option in self.sweep],
            **({"groups": [group.to_json() for group in self.groups]} if self.groups else {}),
            **({"selection": dict(self.selection)} if self.selection else {}),
        )


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
