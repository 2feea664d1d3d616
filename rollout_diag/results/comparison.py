"""``compare-presets``' result: each preset's metrics per step and for the run, the recommendation, and the
document's per-step columns (schema version 2)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from rollout_diag.catalogue import CATALOGUE, INTRUSIVE_MIN_ESS, INTRUSIVE_REJECTED_FRACTION, OFFPOLICY_PREFIX
from rollout_diag.errors import InputError
from rollout_diag.results.analysis import GroupResult
from rollout_diag.results.columns import (
    Column,
    KeyColumns,
    MetricColumns,
    StepTable,
    column_json,
    repr_worst_step,
    table_columns,
)
from rollout_diag.results.document import result_document, schema_version
from rollout_diag.results.reprs import ResultViews, repr_inputs, repr_text, short_repr
from rollout_diag.results.rows import (
    OverallVerdict,
    SkippedData,
    SkippedRow,
    StepResult,
    Verdict,
    json_number,
    repr_sizes,
    repr_verdict,
)
from rollout_diag.results.schema import check_document
from rollout_diag.results.shapes import JsonItem, each, found, item_from_json, join_path, json_as
from rollout_diag.results.sweep import SweepOption

STEP_COUNTS = ("step", "rows", "tokens", "empty_rows")  # the leading columns of the document's top-level ``steps``


# METRICS.md §1: the off-policy metrics of the data, the same under every preset (verl computes them before any
# correction); the comparison document writes them once per step, in its top-level ``steps``
FIRST_SECTION = frozenset(metric.key for metric in CATALOGUE.values() if metric.section == "offpolicy")


@runtime_checkable
class HeldSteps(Protocol):
    """A preset's steps that give the document's columns as held, over the analysis's steps (``base``): the pass's
    ``metrics.outcome.PresetSteps``, a document's :class:`PresetTable`."""

    base: Sequence[StepResult]

    def json_columns(self) -> dict[str, Column]: ...


def comparison_columns(presets: Sequence[PresetResult]) -> tuple[dict[str, Column], list[dict[str, Column]]]:
    """The per-step columns of the ``compare-presets`` document: its top-level block (each step's id, rows, tokens and
    empty rows, then its §1 metrics, the same under every preset) and each preset's own block (the step ids, then the
    preset's own metrics: §2/§3 or §8 and ``summary/``; a §1 key too where the preset's value differs, which a reader
    lays over the top-level one). Presets read from the pass (``metrics.outcome.PresetSteps``) or from a document
    (:class:`PresetTable`) give their columns as held; other steps are read step by step. Raises ValueError when the
    presets do not hold the same steps (a document has one set of steps)."""
    tables = [preset.steps for preset in presets]
    base = getattr(tables[0], "base", None) if tables else None
    held = [steps for steps in tables if isinstance(steps, HeldSteps) and steps.base is base]
    if isinstance(base, StepTable) and len(held) == len(tables):
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
        return top, [{"step": top["step"], **steps.json_columns()} for steps in held]
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
    return Column(len(steps), [(None, present, _values_column(values, present))])


def _values_column(values: Sequence[Any], present: np.ndarray) -> np.ndarray:
    """One value per step as a column: float64 (NaN where None) when the value of every ``present`` step is a float,
    else an object array holding the values as given."""
    if all(type(value) is float for value, here in zip(values, present.tolist(), strict=True) if here):
        return np.array([math.nan if value is None else value for value in values], dtype=np.float64)
    column = np.empty(len(values), dtype=object)
    column[:] = values
    return column


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
        raise InputError(f"field '{path}': expected an object of columns, found {found(raw)}.")
    integers: dict[str, np.ndarray] = {}
    for name in counts:
        if name not in raw:
            raise InputError(f"field '{join_path(path, name)}': missing.")
        integers[name] = np.array(raw[name], dtype=np.int64)
    size = length if length is not None else len(raw[counts[0]])
    groups: list[KeyColumns] = []
    previous: np.ndarray | None = None
    for name, values in raw.items():
        if name in STEP_COUNTS or not name.startswith(prefix):
            continue
        where_ = join_path(path, name)
        if len(values) != size:
            raise InputError(f"field '{where_}': expected {size} values (one per step), found {len(values)}.")
        present = np.array([value is not None for value in values], dtype=bool)
        column = _values_column(values, present)
        if previous is not None and np.array_equal(previous, present):
            groups[-1][1][name] = column
        else:
            groups.append((present, {name: column}))
            previous = present
    for name, column in integers.items():
        if column.shape[0] != size:
            raise InputError(
                f"field '{join_path(path, name)}': expected {size} values (one per step), found {column.shape[0]}."
            )
    return integers, MetricColumns(groups, size)


@dataclass(frozen=True)
class PresetResult(JsonItem):
    """One preset: its settings, §1 + §2/§3 (or §8) + ``summary/`` metrics per step and for the run."""

    name: str
    config: dict[str, Any]
    mode: str
    steps: Sequence[StepResult]  # built by compare_presets: PresetSteps (read from the presets' columns)
    run: StepResult
    # decisions/intrusive.py: why the preset is intrusive (empty: it is not)
    intrusive_reasons: tuple[str, ...] = field(default=(), metadata=json_as(read=tuple))

    @property
    def intrusive(self) -> bool:
        return bool(self.intrusive_reasons)

    def to_json(self) -> dict[str, Any]:
        return self.json_entry([step.to_json() for step in self.steps])

    def json_entry(self, steps: Any) -> dict[str, Any]:
        """The preset's JSON with ``steps`` as its steps (a document's: the block of its own columns)."""
        return {
            "name": self.name,
            "mode": self.mode,
            "config": dict(self.config),
            "intrusive": self.intrusive,
            "intrusive_reasons": list(self.intrusive_reasons),
            "steps": steps,
            "run": self.run.to_json(),
        }

    def __repr__(self) -> str:
        return short_repr(
            "PresetResult",
            f"{repr_text(self.name)} ({self.mode})" + (", intrusive" if self.intrusive else ""),
            f"{self.run.rows:,} rows, {self.run.tokens:,} model tokens, {len(self.steps):,} steps",
            f"{len(self.run.metrics):,} run metrics",
        )


_LISTED = json_as(write=list)  # a list field, written as a copy


@dataclass(frozen=True)
class Recommendation(JsonItem):
    """The recommended preset (None when no preset meets the rule), the rule, the runner-up, and why each more
    intrusive preset was not chosen (rollout_diag/decisions/recommend.py states the rule)."""

    preset: str | None
    rule: str
    reasons: list[str] = field(metadata=_LISTED)
    runner_up: str | None = None
    runner_up_reason: str = ""
    # (preset, why), most intrusive last; each written as {"preset", "reason"}
    not_chosen: list[tuple[str, str]] = field(
        default_factory=list,
        metadata=json_as(
            write=each(lambda item: {"preset": item[0], "reason": item[1]}),
            read=each(lambda item: (item["preset"], item["reason"])),
        ),
    )
    # same IS/RS settings, another mode: same numbers
    equivalent: list[str] = field(default_factory=list, metadata=_LISTED)
    note: str = ""
    order: list[str] = field(default_factory=list, metadata=_LISTED)  # every preset, least intrusive first
    ties: list[str] = field(default_factory=list, metadata=_LISTED)  # presets within the noise bound of the chosen one
    tie_reason: str = ""  # why the chosen one won among its ties ("" without ties)

    def summary(self) -> str:
        if self.preset is None:
            return "No preset meets the rule on this data."
        return f"Recommended: {self.preset} ({'; '.join(self.reasons)})."

    def __repr__(self) -> str:
        return short_repr(
            "Recommendation",
            repr_text(self.summary()),
            f"runner-up {self.runner_up}" if self.runner_up else "",
            f"{len(self.ties):,} ties" if self.ties else "",
            f"{len(self.order):,} presets ranked",
        )


@dataclass(frozen=True)
class ComparisonResult(ResultViews):
    """What ``compare_presets`` found; ``to_json()`` is the documented JSON. ``sweep`` is the run-level threshold
    sweep (one entry per option, with its share-vs-threshold curve: rollout_diag.metrics.sweep). ``to_polars()``:
    presets (run metrics per preset), preset_steps, sweep (per option and target), groups and group_steps (``--by``)."""

    VIEW_KIND: ClassVar[str] = "comparison"

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
            raise InputError(f"{what}: expected an object, found {found(document)}.")
        presets: list[PresetResult] | None = None
        try:
            version = schema_version(document)
            shape, listed = document, document.get("presets")
            if version < 2 and isinstance(listed, list):  # a step object each: read step by step, as written then
                shape = {
                    **document,
                    "presets": [{**item, "steps": {"step": []}} if isinstance(item, dict) else item for item in listed],
                }
            check_document(shape, "comparison.schema.json")
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
                verdicts=[item_from_json(Verdict, item) for item in document.get("verdicts", [])],
                step_levels=list(document.get("step_levels", [])),
                groups=[GroupResult.from_json(group) for group in document.get("groups", [])],
                selection=dict(document.get("selection", {})),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise InputError(f"not a `compare-presets --format json` result (missing {exc}).") from exc

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
        presets = [preset.json_entry(block) for preset, block in zip(self.presets, blocks, strict=True)]
        return result_document(
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
        presets.append(replace(PresetResult.from_json({**item, "steps": []}), steps=PresetTable(base, own)))
    return presets
