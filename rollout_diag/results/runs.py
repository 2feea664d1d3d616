"""``runs``: many runs at once, each with its knobs; what each knob did to the mismatch (schemas/runs.schema.json).

Plain data: ``decisions/runs.py`` builds a :class:`RunsResult` (values, bootstrap intervals, onset steps, knob
effects, gates and the first line); renderers and exports read it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rollout_diag.errors import InputError
from rollout_diag.results.document import SCHEMA_VERSION, schema_version
from rollout_diag.results.prompts import RunsPrompts
from rollout_diag.results.reprs import short_repr
from rollout_diag.results.schema import check_document
from rollout_diag.results.shapes import JsonItem, found, json_as, json_float, json_number, optional


def _pair(low: float, high: float) -> list[Any]:
    return [json_number(low), json_number(high)] if math.isfinite(low) and math.isfinite(high) else [None, None]


def _interval(pair: list[float | None]) -> tuple[float, float]:
    return json_float(pair[0]), json_float(pair[1])


# A statistic: written by ``json_number``, read back as a float (null: NaN).
_STATISTIC = json_as(write=json_number, read=json_float)
# The bootstrap interval (low, high) of a statistic, one JSON pair (null, null where either end is not finite).
_INTERVAL = json_as(key="interval", write=lambda ends: _pair(*ends), read=_interval)
# The interval of ``difference``, null where there is none.
_DIFFERENCE_INTERVAL = json_as(
    key="difference_interval",
    write=lambda ends: None if None in ends else _pair(*ends),
    read=lambda pair: (None, None) if pair is None else _interval(pair),
)


@dataclass(frozen=True)
class RunMetric(JsonItem):
    """One key metric of one run and its bootstrap interval over the run's rows (resampled within steps)."""

    metric: str
    value: float = field(metadata=_STATISTIC)
    low: float = field(metadata=_INTERVAL)
    high: float = field(metadata=_INTERVAL)


@dataclass(frozen=True)
class RunSummary(JsonItem):
    """One run: its name, knobs (values as text), what it read, its verdict (the overall verdict's rules on its run
    metrics, without hint evidence), its key metrics and the first step where it departs from the baseline run."""

    name: str
    knobs: dict[str, str] = field(metadata=json_as(write=dict))
    inputs: list[str] = field(metadata=json_as(write=list))
    rows: int
    tokens: int
    steps: int
    verdict: str
    verdict_sentence: str
    # written by metric name
    metrics: list[RunMetric] = field(
        metadata=json_as(
            write=lambda metrics: {metric.metric: metric.to_json() for metric in metrics},
            read=lambda raw: [RunMetric.from_json(metric) for metric in raw.values()],
        )
    )
    onset_step: int | None

    def metric(self, key: str) -> RunMetric:
        return next(found for found in self.metrics if found.metric == key)


@dataclass(frozen=True)
class KnobEffect(JsonItem):
    """What setting ``knob`` from ``from_`` (the baseline run's level) to ``to`` did to ``metric``: the ratio
    metric(to) / metric(from), its bootstrap interval, ``detectable`` when the interval excludes 1.

    ``method`` "pair": the two runs ``runs`` differ in this knob alone and the design has no run to spare (the ratio
    of their values; ``difference`` and its interval are then ``diff``'s B − A); "fit": a least-squares fit of
    log(metric) on every knob's levels over all runs (multiplicative effects, no interactions)."""

    knob: str
    from_: str = field(metadata=json_as(key="from"))
    to: str
    metric: str
    ratio: float | None = field(metadata=json_as(write=optional(json_number)))
    low: float = field(metadata=_INTERVAL)
    high: float = field(metadata=_INTERVAL)
    detectable: bool
    method: str
    runs: tuple[str, str] | None = field(default=None, metadata=json_as(write=optional(list), read=optional(tuple)))
    difference: float | None = field(default=None, metadata=json_as(write=optional(json_number)))
    difference_low: float | None = field(default=None, metadata=_DIFFERENCE_INTERVAL)
    difference_high: float | None = field(default=None, metadata=_DIFFERENCE_INTERVAL)


@dataclass(frozen=True)
class RatioGate(JsonItem):
    """``--max-ratio METRIC=LIMIT``: a run's metric over the baseline run's, passed when at most ``limit``."""

    run: str
    metric: str
    limit: float
    ratio: float = field(metadata=_STATISTIC)
    low: float = field(metadata=_INTERVAL)
    high: float = field(metadata=_INTERVAL)
    passed: bool


@dataclass(frozen=True, eq=False)
class RunSteps:
    """One run's per-step key metrics (from its row sums): ``step`` int64 [S] and ``values[metric]`` float64 [S],
    with each step's rows. Equal to another when its arrays are (NaN equal to NaN: a value no rows gave)."""

    run: str
    step: np.ndarray
    rows: np.ndarray
    values: dict[str, np.ndarray]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RunSteps):
            return NotImplemented
        return (
            self.run == other.run
            and np.array_equal(self.step, other.step)
            and np.array_equal(self.rows, other.rows)
            and list(self.values) == list(other.values)
            and all(np.array_equal(self.values[k], other.values[k], equal_nan=True) for k in self.values)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable arrays: equal by value, not hashable

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "step": self.step.tolist(),
            "rows": self.rows.tolist(),
            "metrics": {metric: [json_number(v) for v in values.tolist()] for metric, values in self.values.items()},
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> RunSteps:
        count = len(raw["step"])
        values = {
            metric: np.array([math.nan if v is None else v for v in listed], dtype=np.float64)
            for metric, listed in raw["metrics"].items()
        }
        if len(raw["rows"]) != count or any(len(listed) != count for listed in values.values()):
            raise InputError(f"field 'steps': run {raw['run']!r} has {count} steps but not as many rows or values.")
        return cls(raw["run"], np.array(raw["step"], dtype=np.int64), np.array(raw["rows"], dtype=np.int64), values)


@dataclass(frozen=True)
class RunsResult:
    """What ``runs`` found; ``to_json()`` is the documented JSON (schemas/runs.schema.json), ``step_records()`` the
    Parquet export's rows (one per run × step)."""

    runs: list[RunSummary]
    effects: list[KnobEffect]
    steps: list[RunSteps]
    baseline: str
    metrics: list[str]
    onset_metric: str
    answer: str
    replicates: int
    level: float
    seed: int
    gates: list[RatioGate] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    prompts: RunsPrompts | None = None  # prompts matched across runs; None when no run has a prompt identity

    @property
    def passed(self) -> bool:
        """Every ``--max-ratio`` gate passed (True without gates)."""
        return all(gate.passed for gate in self.gates)

    @property
    def knobs(self) -> list[str]:
        """The knob names, in the order the runs first give them."""
        return list(dict.fromkeys(name for run in self.runs for name in run.knobs))

    def __repr__(self) -> str:
        detectable = sum(effect.detectable for effect in self.effects)
        return short_repr(
            "RunsResult",
            f"{len(self.runs)} runs, baseline {self.baseline!r}",
            f"{detectable} of {len(self.effects)} knob effects detectable",
            self.answer,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "kind": "runs",
            "answer": self.answer,
            "baseline": self.baseline,
            "metrics": list(self.metrics),
            "onset_metric": self.onset_metric,
            "bootstrap": {"replicates": self.replicates, "level": self.level, "seed": self.seed, "unit": "rows"},
            "runs": [run.to_json() for run in self.runs],
            "effects": [effect.to_json() for effect in self.effects],
            "gates": [gate.to_json() for gate in self.gates],
            "passed": self.passed,
            "warnings": list(self.warnings),
            "prompts": None if self.prompts is None else self.prompts.to_json(),
            "steps": [steps.to_json() for steps in self.steps],
        }

    @classmethod
    def from_json(cls, document: Any) -> RunsResult:
        """The RunsResult that ``to_json()`` wrote ``document`` from (JSON null numbers come back as NaN); a document
        written before ``steps`` was in it comes back without per-step values. Raises InputError when the document
        is not a ``runs`` result of a schema version this build reads, naming the first field that is wrong."""
        what = "not a `runs --format json` result"
        if not isinstance(document, dict) or document.get("kind") != "runs":
            kind = document.get("kind") if isinstance(document, dict) else None
            raise InputError(f'{what}: expected "kind": "runs", found {found(kind)}.')
        try:
            schema_version(document)
            check_document(document, "runs.schema.json")
            missing = next((name for name in _NEEDED if name not in document), None)
            if missing is not None:
                raise InputError(f"field '{missing}': missing.")
            bootstrap = document["bootstrap"]
            return cls(
                runs=[RunSummary.from_json(run) for run in document["runs"]],
                effects=[KnobEffect.from_json(effect) for effect in document["effects"]],
                steps=[RunSteps.from_json(steps) for steps in document.get("steps", [])],
                baseline=document["baseline"],
                metrics=list(document["metrics"]),
                onset_metric=document["onset_metric"],
                answer=document["answer"],
                replicates=bootstrap["replicates"],
                level=bootstrap["level"],
                seed=bootstrap["seed"],
                gates=[RatioGate.from_json(gate) for gate in document.get("gates", [])],
                warnings=list(document.get("warnings", [])),
                prompts=None if document.get("prompts") is None else RunsPrompts.from_json(document["prompts"]),
            )
        except InputError as exc:
            raise InputError(f"{what}: {exc.message}") from None

    def step_records(self) -> dict[str, list[Any]]:
        """Columns of one row per run × step: ``run``, ``knob:<name>`` per knob, ``step``, ``rows`` and each key
        metric (polars-ready: ``pl.DataFrame(result.step_records())``)."""
        knobs = self.knobs
        by_name = {run.name: run for run in self.runs}
        columns: dict[str, list[Any]] = {"run": [], **{f"knob:{k}": [] for k in knobs}, "step": [], "rows": []}
        columns.update({metric: [] for metric in self.metrics})
        for steps in self.steps:
            count = steps.step.shape[0]
            columns["run"].extend([steps.run] * count)
            for knob in knobs:
                columns[f"knob:{knob}"].extend([by_name[steps.run].knobs.get(knob)] * count)
            columns["step"].extend(steps.step.tolist())
            columns["rows"].extend(steps.rows.tolist())
            for metric in self.metrics:
                columns[metric].extend(steps.values[metric].tolist())
        return columns


# The fields a runs document must have to be read back (the others default: no gates, warnings, prompts or steps).
_NEEDED = ("answer", "baseline", "metrics", "onset_metric", "bootstrap", "runs", "effects")
