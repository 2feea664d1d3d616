"""``analyze``'s result (``AnalysisResult``) and a ``--by`` group's (``GroupResult``), with their JSON."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

from rollout_diag.errors import InputError
from rollout_diag.formatting import ExtraValue
from rollout_diag.results.association import TrainerColumns
from rollout_diag.results.columns import repr_worst_step
from rollout_diag.results.document import SCHEMA_VERSION, schema_version
from rollout_diag.results.prompts import PromptFindings
from rollout_diag.results.reprs import ResultViews, repr_inputs, repr_text, short_repr
from rollout_diag.results.rows import (
    Anomaly,
    DivergentRound,
    Hint,
    OverallVerdict,
    RowTokens,
    SkippedData,
    SkippedRow,
    StepResult,
    Trend,
    Verdict,
    WorstRow,
    WorstToken,
    repr_sizes,
    repr_verdict,
)
from rollout_diag.results.schema import check_document
from rollout_diag.results.shapes import (
    JsonItem,
    check_same_lengths,
    each,
    item_from_json,
    item_json,
    json_as,
    json_number,
    required,
)


def json_row(row: dict[str, Any]) -> dict[str, Any]:
    return {key: json_number(value) for key, value in row.items()}


def json_row_nested(value: Any) -> Any:
    """``value`` with every float JSON can spell as it is and NaN / ±inf as null, through dicts and lists."""
    if isinstance(value, dict):
        return {key: json_row_nested(item) for key, item in value.items()}
    if isinstance(value, list):
        return [json_row_nested(item) for item in value]
    return json_number(value) if isinstance(value, float) else value


def _field_values(row: RowTokens) -> dict[str, Any]:
    """``asdict(row)`` without its deep copy: a row's token lists (thousands of values each) are written as they are,
    not copied value by value (``dataclasses.asdict`` recurses into every list element)."""
    return {item.name: getattr(row, item.name) for item in fields(row)}


def extra_names(rows: Iterable[WorstRow]) -> list[str]:
    """The extra columns of ``rows``, each once, in the order they first appear (a table's extra columns)."""
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(getattr(row, "extra", None) or {}))
    return list(names)


def json_verdict(verdict: Mapping[str, Any]) -> dict[str, Any]:
    metrics = {
        key: {**entry, "value": json_number(entry.get("value"))} for key, entry in verdict.get("metrics", {}).items()
    }
    return {**verdict, "metrics": metrics}


def _table_rows(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{key: _nan_for_null(value, key) for key, value in row.items()} for row in raw]


def _nan_for_null(value: Any, key: str) -> Any:
    # Integers-or-labels stay as they are; a null float metric was NaN before to_json().
    if value is None and key not in ("step", "bucket", "label"):
        return math.nan
    return value


@dataclass(frozen=True)
class GroupResult(JsonItem):
    """One group of rows of ``--by`` (``rollout_diag/groups.py``): its key metrics for the run and per step."""

    column: str  # the --by spec as written: "env_name", "reward:sign", "response_length:bins=100,1000"
    value: ExtraValue  # the column's value or the bucket's label; None: rows where the column is null
    rows: int
    tokens: int
    row_share: float = field(metadata=json_as(absent=0.0))  # of the run's rows
    token_share: float = field(metadata=json_as(absent=0.0))  # of the run's model tokens
    metrics: dict[str, float] = field(metadata=json_as(write=json_row))
    steps: list[StepResult] = field(metadata=json_as(write=each(item_json), absent=[]))
    # {"level", "sentence", "metrics": {key: {"value", "level"}}}
    verdict: dict[str, Any] = field(metadata=json_as(write=json_verdict, read=dict, absent={}))
    most_divergent_round: int | None = None

    def __repr__(self) -> str:
        value = "(null)" if self.value is None else self.value
        return short_repr(
            "GroupResult",
            f"{repr_text(self.column)} = {repr_text(value)}",
            f"verdict {self.verdict.get('level', 'n/a')}",
            f"{self.rows:,} rows, {self.tokens:,} model tokens, {len(self.steps):,} steps",
        )


@dataclass(frozen=True)
class AnalysisResult(ResultViews):
    """Everything ``analyze`` found; ``to_json()`` is the documented JSON (schemas/result.schema.json).
    ``to_polars()``: steps (one row per step, one column per verl-named metric), run, rounds, positions, worst_rows
    (with their extra columns), worst_tokens, verdicts, groups, group_steps (``--by``) and drift."""

    VIEW_KIND: ClassVar[str] = "analysis"

    inputs: list[str]
    columns: dict[str, str]
    layout: str
    device: str
    run: StepResult
    steps: Sequence[StepResult]  # built by analyze: a StepTable (the same StepResults, held as columns)
    rounds: list[dict[str, Any]] = field(metadata=json_as(read=_table_rows))
    verdicts: list[Verdict]
    # Localisation (where it diverges): see rollout_diag/metrics/localize.py.
    # log2 position buckets; "step" None = run (built by analyze: Rows, the same dicts held as columns)
    positions: Sequence[dict[str, Any]] = field(default_factory=list, metadata=json_as(read=_table_rows))
    worst_rows: list[WorstRow] = field(default_factory=list)
    worst_tokens: list[WorstToken] = field(default_factory=list)
    worst_row_tokens: list[RowTokens] = field(default_factory=list)
    delta_histogram: Mapping[str, Sequence[float]] = field(default_factory=dict)  # signed log bins of δ, run level
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
    divergent_round: DivergentRound | None = None
    anomaly_check: str = ""  # why the anomaly rule could not apply ("" when it did)
    groups: list[GroupResult] = field(default_factory=list)  # --by: every group of every spec, worst first
    selection: dict[str, Any] = field(default_factory=dict)  # --where / --steps: {"where", "steps", "rows_kept", …}
    # why the mismatch moved from the early to the late window of steps: per metric (k3_kl, mean |δ|) the change split
    # per factor into mix and within parts, judged (docs/drift.md; built by drivers/drift.py)
    drift: list[dict[str, Any]] = field(default_factory=list)
    # the prompt identity and the prompts extreme every time (decisions/prompts.py); None: the dump has no prompt id
    prompts: PromptFindings | None = None
    # row mismatch against the dump's reward, advantage, entropy, response length and GRPO groups (None: no such column)
    trainer_columns: TrainerColumns | None = None

    def to_json(self) -> dict[str, Any]:
        document = self.json_document()
        return {
            **document,
            "steps": [step.to_json() for step in self.steps],
            "positions": [json_row(row) for row in self.positions],
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
            "rounds": [json_row(row) for row in self.rounds],
            "verdicts": [{**asdict(v), "value": json_number(v.value)} for v in self.verdicts],
            "catastrophic_threshold": self.catastrophic_threshold,
            "positions": self.positions,
            "worst_rows": [{**json_row(asdict(row)), "extra": json_row(row.extra)} for row in self.worst_rows],
            "worst_tokens": [
                json_row({**asdict(t), "trainer_prob": t.trainer_prob, "rollout_prob": t.rollout_prob})
                for t in self.worst_tokens
            ],
            "worst_row_tokens": [
                {**_field_values(row), "end": row.start + len(row.mask), "extra": json_row(row.extra)}
                for row in self.worst_row_tokens
            ],
            "delta_histogram": dict(self.delta_histogram),
            "anomalies": [json_row(_anomaly_row(a)) for a in self.anomalies],
            "anomalies_cut": self.anomalies_cut,
            "trends": [json_row(asdict(t)) for t in self.trends],
            "warnings": list(self.warnings),
            "skipped": [asdict(s) for s in self.skipped],
            "skipped_rows": self.skipped_rows,
            "skipped_data": self.skipped_data.to_json(),
            "hints": [{**asdict(h), "evidence": json_row(h.evidence)} for h in self.hints],
            "verdict": None if self.verdict is None else self.verdict.to_json(),
            "step_levels": self.step_levels,
            "divergent_round": None if self.divergent_round is None else json_row(asdict(self.divergent_round)),
            "anomaly_check": self.anomaly_check,
            "groups": [group.to_json() for group in self.groups],
            "selection": dict(self.selection),
            "drift": [json_row_nested(entry) for entry in self.drift],
            "prompts": None if self.prompts is None else json_row_nested(self.prompts.to_json()),
            "trainer_columns": None if self.trainer_columns is None else self.trainer_columns.to_json(),
        }

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
        schema_version(document)
        try:  # a field of the wrong shape: one line naming it
            check_document(document, "result.schema.json")
            check_same_lengths(document.get("worst_row_tokens"), RowTokens.JSON_SAME_LENGTH, "worst_row_tokens")
        except InputError as exc:
            raise InputError(f"not an `analyze --format json` result: {exc.message}") from None
        missing = [spec.name for spec in dataclasses.fields(cls) if required(spec) and spec.name not in document]
        if missing:
            raise InputError(f"result JSON lacks {', '.join(missing)}")
        return item_from_json(cls, document)


def _anomaly_row(anomaly: Anomaly) -> dict[str, Any]:
    """An anomaly's JSON fields; ``resume`` only where the step follows a resume."""
    row = asdict(anomaly)
    if row["resume"] is None:
        del row["resume"]
    return row
