"""What ``watch`` says: the steps that became final (:class:`StepReport`), each poll's :class:`WatchUpdate`, and the
:class:`Reporter` that says each step, finding, anomaly and gate alert once (again, with a higher ``revision``, when a
step's state changes after it was reported)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rollout_diag import catalogue
from rollout_diag.decisions.check import FAIL, Gate, check
from rollout_diag.decisions.rowmetrics import KEY_METRIC_NAMES
from rollout_diag.decisions.verdict import step_levels
from rollout_diag.results import AnalysisResult, RowStats, StepResult, json_number, repr_sizes, repr_text, short_repr


def verdict_of(result: AnalysisResult | None) -> tuple[str, str]:
    """(level, one sentence) of the run so far: the overall verdict the result was built with (decisions/verdict.py),
    pipeline findings and length rules included, as ``analyze`` prints it."""
    if result is None:
        return "n/a", "no data yet."
    if result.verdict is None:
        return "n/a", "no verdict."
    return result.verdict.level, result.verdict.sentence


# A step report's JSON keys, in the order a line holds them (``level_set_by`` is the field ``set_by``)
_STEP_KEYS = (
    "step",
    "revision",
    "rows",
    "tokens",
    "level",
    "level_set_by",
    "metrics",
    "anomalies",
    "findings",
    "alerts",
)


def _copied(value: Any) -> Any:
    return list(value) if isinstance(value, list) else value


@dataclass(frozen=True)
class StepReport:
    """A step that became final (or changed again after it was reported: ``revision`` > 0)."""

    step: int
    revision: int
    rows: int
    tokens: int
    metrics: dict[str, float]
    level: str
    anomalies: list[str] = field(default_factory=list)  # anomaly flags new at this step
    findings: list[str] = field(default_factory=list)  # pipeline findings (hints) first seen since the last report
    alerts: list[str] = field(default_factory=list)  # gates failing on this step (or newly on the run)
    set_by: list[str] = field(default_factory=list)  # the judged metrics at the step's watch/bad level

    def to_json(self) -> dict[str, Any]:
        """One ``--format jsonl`` line (schemas/watch.schema.json), its keys in the schema's order."""
        written = {
            "level_set_by": list(self.set_by),
            "metrics": {name: json_number(value) for name, value in self.metrics.items()},
        }
        return {key: written[key] if key in written else _copied(getattr(self, key)) for key in _STEP_KEYS}

    def __repr__(self) -> str:
        return short_repr(
            "StepReport",
            f"step {self.step}" + (f" (revision {self.revision})" if self.revision else ""),
            f"level {self.level}, {self.rows:,} rows, {self.tokens:,} model tokens",
            f"{len(self.anomalies)} anomalies, {len(self.findings)} findings, {len(self.alerts)} alerts",
        )


@dataclass
class WatchUpdate:
    """What one poll found: the run so far, the steps that became final, notes and gate alerts."""

    result: AnalysisResult | None  # the run so far (None until a file with model tokens was read)
    level: str  # the run's overall verdict level ("n/a" before any result)
    sentence: str
    steps: list[StepReport]  # steps final at this poll, in step order
    notes: list[str]  # files retried, steps replaced, late ranks joined
    alerts: list[str]  # gate failures new at this poll (each said once)
    idle: float  # seconds since new data last arrived
    changed: bool  # whether this poll brought new data
    pending_steps: list[int]  # steps with data that are not final yet
    ended: str | None = None  # why the watch stops after this update (one line), None while it goes on
    exit_code: int | None = None

    def __repr__(self) -> str:
        return short_repr(
            "WatchUpdate",
            f"level {self.level}: {repr_text(self.sentence)}",
            f"{len(self.steps):,} steps final, {len(self.pending_steps):,} pending, {len(self.alerts):,} alerts",
            "" if self.result is None else repr_sizes(self.result.run, self.result.steps, self.result.skipped_rows),
            f"ended: {repr_text(self.ended)}" if self.ended else f"idle {self.idle:.1f} s",
        )


class WatchGone(Exception):
    """The watched directory was deleted or moved."""


class Reporter:
    """What has been said so far of a watched run: the steps reported (with the state version each was reported at),
    the pipeline findings, anomalies and gate alerts said once, and whether a gate failed."""

    def __init__(self, gates: Sequence[Gate]) -> None:
        self.gates = list(gates)
        self.need_rows = any(gate.metric in KEY_METRIC_NAMES for gate in self.gates)  # a gate on per-row metrics
        self.reported: dict[int, tuple[int, int]] = {}  # step -> (version reported, revision)
        self.alerted: set[tuple[str, int | None]] = set()
        self.failed_gates = False
        self.known_hints: set[str] = set()  # pipeline findings (hint ids) said once
        self.known_anomalies: set[tuple[int, str]] = set()

    def report(
        self,
        result: AnalysisResult,
        final_steps: set[int],
        versions: Mapping[int, int],
        rows: Callable[[], RowStats],
        final: bool,
    ) -> tuple[list[StepReport], list[str]]:
        """The steps of ``final_steps`` not reported at their state's version (``versions``) yet, and the gate alerts
        new now; ``rows``: the run's per-row statistics, read where a gate needs them. ``final``: the watch ends (the
        run's own alerts are said even without a step)."""
        by_step = {step.step: step for step in result.steps}
        ready = sorted(
            step
            for step in final_steps
            if step in by_step and self.reported.get(step, (-1, -1))[0] != versions.get(step)
        )
        failures = self._gate_failures(result, rows)
        # a finding is said once, by its id: its numbers change as steps arrive (the live view shows them in place)
        fresh = [h for h in result.hints if h.id not in self.known_hints] if ready else []
        self.known_hints.update(h.id for h in fresh)  # said with the last step reported now, else at the next one
        new_findings = [h.message for h in fresh]
        reports: list[StepReport] = []
        alerts: list[str] = []
        for step in ready:
            entry = by_step[step]
            step_level = step_level_of(entry)
            revision = self.reported[step][1] + 1 if step in self.reported else 0
            self.reported[step] = (versions[step], revision)
            anomalies = [
                f"step {a.step}: {a.metric} = {a.value:.4g}, {a.factor:.3g}× its baseline {a.baseline:.4g}"
                for a in result.anomalies
                if a.step == step and (a.step, a.metric) not in self.known_anomalies
            ]
            self.known_anomalies.update((a.step, a.metric) for a in result.anomalies if a.step == step)
            step_alerts = self._new_alerts(failures, step)
            alerts += step_alerts
            reports.append(
                StepReport(
                    step=step,
                    revision=revision,
                    rows=entry.rows,
                    tokens=entry.tokens,
                    metrics=dict(entry.metrics),
                    level=step_level,
                    anomalies=anomalies,
                    findings=new_findings if step == ready[-1] else [],
                    alerts=step_alerts,
                    set_by=level_set_by(entry.metrics, step_level),
                )
            )
        run_alerts = self._new_alerts(failures, None) if ready or final else []
        if run_alerts and reports:
            last = reports[-1]
            reports[-1] = replace(last, alerts=last.alerts + run_alerts)
        return reports, alerts + run_alerts

    def _gate_failures(self, result: AnalysisResult, rows: Callable[[], RowStats]) -> dict[int | None, list[str]]:
        if not self.gates:
            return {}
        outcome = check(result, self.gates, per_step=True, rows=rows() if self.need_rows else None)
        failures: dict[int | None, list[str]] = {}
        for gate_outcome in outcome.outcomes:
            if gate_outcome.status == FAIL:
                failures.setdefault(gate_outcome.step, []).append(gate_outcome.message())
        return failures

    def _new_alerts(self, failures: dict[int | None, list[str]], step: int | None) -> list[str]:
        new = []
        for message in failures.get(step, []):
            key = (message.split(" = ")[0], step)
            if key not in self.alerted:
                self.alerted.add(key)
                new.append(f"ALERT {message}")
        if new:
            self.failed_gates = True
        return new


def step_level_of(step: StepResult) -> str:
    """A step's level by the verdict's thresholds on its metrics; n/a for a step without model tokens."""
    return str(step_levels([(step.step, step.metrics)])[0]["level"]) if step.tokens else "n/a"


def level_set_by(metrics: Mapping[str, float], level: str) -> list[str]:
    """The judged metrics of a step at its (watch or bad) level: what made the step's level; [] for ok and n/a."""
    if level not in ("watch", "bad"):
        return []
    levels = step_levels([(None, metrics)])[0]["levels"]
    growing = set(catalogue.keys_with_role(catalogue.Role.LENGTH_GROWING))
    return [metric for metric, found in levels.items() if found == level and metric not in growing]
