"""``--wandb PROJECT``: a result in Weights & Biases, where the training curves already are.

- every per-step metric under its verl name at the dump's step (W&B's step), with ``rollout_diag/alert`` (0 ok,
  1 watch, 2 bad) per step, as ``--tensorboard`` writes them;
- ``--by`` groups (the ``GROUP_RUNS`` worst of each spec) and ``compare-presets``' presets as runs of their own in one
  W&B group (``--wandb-group``, default
  ``rollout-diag-<time>``), so that the same metric of every group or preset overlays on one chart: a group's run
  holds its key metrics, a preset's its own metrics; the §1 metrics (the same under every preset) once, in the main
  run;
- the main run's summary: the verdict (``rollout_diag/verdict``, ``…/verdict_level``, ``…/cause``), every whole-run
  metric under its name (the run's value, not the last step's), and a table ``rollout_diag/findings`` (kind, text) of
  the verdict, where the mismatch sits, the hints, the anomalies and (compare-presets) the recommendation;
- the HTML report as an artifact (type ``rollout-diag-report``) when one is written.

``run_id`` adds to an existing run, the training run itself (``resume="allow"``): its steps are already taken, so the
metrics go under ``rollout_diag/…`` against their own step metric ``rollout_diag_step`` (``define_metric``), and the
groups and presets under ``rollout_diag/<group or preset>/…`` in the same run.

``runs`` (many dumps): ``log_runs_to_wandb``, each run a W&B run with its knobs as config, and a run ``runs`` with the
answer and the knob effects.

Works offline (``WANDB_MODE=offline``: ``wandb sync`` uploads later). Needs the optional ``wandb`` package
(``pip install 'rollout-diag[wandb]'``). Reads results; judges nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout_diag.errors import ConfigError
from rollout_diag.formatting import group_label

if TYPE_CHECKING:
    from rollout_diag.results import AnalysisResult, ComparisonResult, RunsResult, StepResult

ALERT_KEY = "rollout_diag/alert"
ALERT_LEVEL = {"bad": 2.0, "watch": 1.0}
PREFIX = "rollout_diag/"  # an existing run's metrics, beside the trainer's own
STEP_KEY = "rollout_diag_step"  # outside rollout_diag/*: the step metric of the keys it orders
REPORT_ARTIFACT_TYPE = "rollout-diag-report"
GROUP_RUNS = 50  # runs per --by spec, the worst groups first (each run costs W&B a process start; JSON has them all)


def wandb_module() -> Any:
    """The ``wandb`` package; raises ConfigError saying what to install without it (the CLI calls this before
    reading, so a missing package fails at once)."""
    try:
        import wandb
    except ImportError:
        raise ConfigError("--wandb needs the wandb package.", hint="pip install 'rollout-diag[wandb]'.") from None
    return wandb


def default_group() -> str:
    """A W&B group for one command's runs: ``rollout-diag-<UTC date and time>``."""
    return "rollout-diag-" + time.strftime("%Y%m%d-%H%M%S", time.gmtime())


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class WandbTarget:
    """Where a result goes: the project, the group of this command's runs, an existing run to add to, wandb's
    directory for its files (None: wandb's default), the main run's name."""

    project: str
    group: str | None = None
    run_id: str | None = None
    directory: str | Path | None = None
    name: str | None = None
    entity: str | None = None
    runs: list[tuple[str, str]] = field(default_factory=list)  # (name, id) of every run written
    scalars: int = 0

    def open(self, name: str, main: bool = True) -> WandbRun:
        """A run: the main one (the existing run with ``run_id``) or one per group or preset in the group."""
        wandb = wandb_module()
        if self.group is None:
            self.group = default_group()
        options: dict[str, Any] = {
            "project": self.project,
            "entity": self.entity,
            "dir": None if self.directory is None else str(self.directory),
            "reinit": "finish_previous",
        }
        if not main:  # a group's or preset's run: wandb's lines once (for the main run), not once a run
            options["settings"] = wandb.Settings(silent=True)
        if self.run_id is not None:
            run = wandb.init(**options, id=self.run_id, resume="allow")
        else:
            run = wandb.init(**options, name=name if not main else (self.name or name), group=self.group)
        self.runs.append((run.name or name, run.id))
        return WandbRun(run, self, existing=self.run_id is not None)


@dataclass
class WandbRun:
    """One open W&B run; ``existing``: an existing run, whose keys take the ``rollout_diag/`` prefix and their own
    step metric."""

    run: Any
    target: WandbTarget
    existing: bool = False
    logged_to: int | None = None  # the last step logged (W&B takes steps in increasing order)
    defined: bool = False

    def key(self, name: str, label: str | None = None) -> str:
        if not self.existing:
            return name
        return PREFIX + (f"{label}/" if label else "") + name

    def log_step(
        self, step: int, metrics: Mapping[str, Any], level: str | None = None, label: str | None = None
    ) -> bool:
        """``metrics`` (verl names) at ``step``; False (nothing logged) for a step at or before the last one."""
        if self.logged_to is not None and step <= self.logged_to:
            return False
        values = {self.key(name, label): float(value) for name, value in metrics.items() if _number(value)}
        if level is not None and label is None:
            values[ALERT_KEY] = ALERT_LEVEL.get(level, 0.0)
        if self.existing:
            if not self.defined:  # the trainer's steps are taken: ours against a step metric of their own
                self.run.define_metric(STEP_KEY)
                self.run.define_metric(PREFIX + "*", step_metric=STEP_KEY)
                self.defined = True
            self.run.log({STEP_KEY: step, **values})
        else:
            self.run.log(values, step=int(step), commit=True)  # the row now: a later summary update is not overwritten
        self.logged_to = step
        self.target.scalars += len(values)
        return True

    def log_steps(
        self,
        steps: Iterable[StepResult],
        keep: Callable[[str], bool] = lambda name: True,
        levels: Mapping[int, str] | None = None,
        label: str | None = None,
    ) -> None:
        for step in steps:
            if step.step is None:
                continue
            metrics = {name: value for name, value in step.metrics.items() if keep(name)}
            self.log_step(int(step.step), metrics, None if levels is None else levels.get(int(step.step)), label)

    def summarize(self, result: AnalysisResult | ComparisonResult) -> None:
        """The verdict, the whole-run metrics and the findings table as the run's summary."""
        wandb = wandb_module()
        summary: dict[str, Any] = {}
        verdict = result.verdict
        if verdict is not None:
            summary.update(
                {
                    PREFIX + "verdict_level": verdict.level,
                    PREFIX + "verdict": verdict.sentence,
                    PREFIX + "cause": verdict.cause,
                }
            )
        summary.update({self.key(name): value for name, value in _run_metrics(result).items() if _number(value)})
        table = wandb.Table(columns=["kind", "finding"], data=[[kind, text] for kind, text in findings_of(result)])
        # the table first: it joins the last step's history row, whose values would otherwise overwrite the summary's
        self.run.log({PREFIX + "findings": table})
        self.run.summary.update(summary)

    def attach_report(self, path: str | Path) -> None:
        """The HTML report as an artifact of this run."""
        wandb = wandb_module()
        artifact = wandb.Artifact(f"rollout-diag-report-{self.run.id}", type=REPORT_ARTIFACT_TYPE)
        artifact.add_file(str(path), name=Path(path).name)
        self.run.log_artifact(artifact)

    def finish(self) -> None:
        self.run.finish()


def _run_metrics(result: AnalysisResult | ComparisonResult) -> dict[str, float]:
    if hasattr(result, "presets"):
        from rollout_diag.results import FIRST_SECTION

        first = result.presets[0].run.metrics if result.presets else {}
        return {name: value for name, value in first.items() if name in FIRST_SECTION}
    return dict(result.run.metrics)


def findings_of(result: AnalysisResult | ComparisonResult) -> list[tuple[str, str]]:
    """(kind, text) of what the result found, as the terminal words it: the verdict, where the mismatch sits, the
    hints, the anomalies and, for a comparison, the recommendation."""
    rows: list[tuple[str, str]] = []
    verdict = result.verdict
    if verdict is not None:
        rows.append(("verdict", verdict.sentence))
    if not hasattr(result, "presets"):
        from rollout_diag.results.wording import where

        rows += [("where", line) for line in where(result)]
        rows += [
            ("anomaly", f"step {a.step}: {a.metric} {a.value:.4g} = {a.factor:.3g}× baseline") for a in result.anomalies
        ]
    rows += [("hint", f"{hint.id}: {hint.message}") for hint in getattr(result, "hints", [])]
    recommendation = getattr(result, "recommendation", None)
    if recommendation is not None:
        rows.append(("recommendation", recommendation.summary()))
    withheld = getattr(result, "recommendation_withheld", None)
    if withheld:
        rows.append(("recommendation", withheld))
    return rows


def step_levels(result: AnalysisResult | ComparisonResult) -> dict[int, str]:
    return {int(entry["step"]): entry["level"] for entry in result.step_levels if entry["step"] is not None}


def log_to_wandb(
    result: AnalysisResult | ComparisonResult,
    project: str,
    *,
    group: str | None = None,
    run_id: str | None = None,
    name: str | None = None,
    report: str | Path | None = None,
    directory: str | Path | None = None,
    entity: str | None = None,
) -> WandbTarget:
    """Log ``result`` (an ``analyze`` or ``compare-presets`` result) to W&B project ``project`` (see the module's
    docstring): the main run named ``name`` (default: ``analyze`` or ``compare-presets``), each ``--by`` group and
    preset a run of its own in ``group``; with ``run_id``, all of it into that existing run. ``report``: an HTML report
    to attach. Returns the target, listing the runs written and the scalars logged. Raises ConfigError without
    wandb."""
    from rollout_diag.results import FIRST_SECTION, ComparisonResult

    comparison = isinstance(result, ComparisonResult)
    target = WandbTarget(project, group, run_id, directory, name, entity)
    main = target.open("compare-presets" if comparison else "analyze")
    try:
        if isinstance(result, ComparisonResult):
            if result.presets:  # §1 is the data's, the same under every preset: once
                main.log_steps(result.presets[0].steps, lambda metric: metric in FIRST_SECTION, step_levels(result))
        else:
            main.log_steps(result.steps, levels=step_levels(result))
        if run_id is not None:  # one run: the groups and presets under their label
            for label, steps, keep in _parts(result):
                main.logged_to = None
                main.log_steps(steps, keep, label=label)
        main.summarize(result)
        if report is not None:
            main.attach_report(report)
    finally:
        main.finish()
    if run_id is None:
        for label, steps, keep in _parts(result):
            part = target.open(label, main=False)
            try:
                part.log_steps(steps, keep)
            finally:
                part.finish()
    return target


def _parts(result: AnalysisResult | ComparisonResult) -> list[tuple[str, Iterable[StepResult], Callable[[str], bool]]]:
    """(label, steps, which metrics) of each preset and each ``--by`` group."""
    from rollout_diag.results import FIRST_SECTION

    parts: list[tuple[str, Iterable[StepResult], Callable[[str], bool]]] = [
        (preset.name, preset.steps, lambda metric: metric not in FIRST_SECTION)
        for preset in getattr(result, "presets", [])
    ]
    shown: dict[str, int] = {}
    for group in result.groups:  # worst first: the first GROUP_RUNS of each --by spec
        shown[group.column] = shown.get(group.column, 0) + 1
        if shown[group.column] <= GROUP_RUNS:
            parts.append((f"{group.column}={group_label(group.value)}", group.steps, lambda metric: True))
    return parts


def log_runs_to_wandb(
    result: RunsResult,
    project: str,
    *,
    group: str | None = None,
    report: str | Path | None = None,
    directory: str | Path | None = None,
    entity: str | None = None,
) -> WandbTarget:
    """Log a ``runs`` result: each run a W&B run of its own in ``group`` (its knobs as its config, its per-step key
    metrics at the dump's steps, its verdict and whole-run metrics with their bootstrap intervals as its summary), so
    that W&B overlays them; and a run ``runs`` holding the answer, the knob effects and gates as tables, and the
    report as an artifact. Returns the target. Raises ConfigError without wandb."""
    wandb = wandb_module()
    target = WandbTarget(project, group, None, directory, None, entity)
    summaries = {run.name: run for run in result.runs}
    for steps in result.steps:
        part = target.open(steps.run, main=False)
        try:
            summary = summaries.get(steps.run)
            if summary is not None:
                part.run.config.update({"knobs": dict(summary.knobs), "inputs": list(summary.inputs)})
            for index, step in enumerate(steps.step.tolist()):
                part.log_step(int(step), {metric: values[index] for metric, values in steps.values.items()})
            if summary is not None:
                part.run.summary.update(
                    {
                        PREFIX + "verdict_level": summary.verdict,
                        PREFIX + "verdict": summary.verdict_sentence,
                        PREFIX + "onset_step": summary.onset_step,
                        **{metric.metric: metric.value for metric in summary.metrics},
                        **{f"{metric.metric}/low": metric.low for metric in summary.metrics},
                        **{f"{metric.metric}/high": metric.high for metric in summary.metrics},
                    }
                )
        finally:
            part.finish()
    main = target.open("runs")
    try:
        effects = [[e.knob, e.from_, e.to, e.metric, e.ratio, e.low, e.high, e.detectable] for e in result.effects]
        tables = {
            PREFIX + "effects": wandb.Table(
                columns=["knob", "from", "to", "metric", "ratio", "low", "high", "detectable"], data=effects
            ),
            PREFIX + "gates": wandb.Table(
                columns=["run", "metric", "limit", "ratio", "low", "high", "passed"],
                data=[[g.run, g.metric, g.limit, g.ratio, g.low, g.high, g.passed] for g in result.gates],
            ),
        }
        main.run.log(tables)
        main.run.summary.update({PREFIX + "answer": result.answer, PREFIX + "baseline": result.baseline})
        if report is not None:
            main.attach_report(report)
    finally:
        main.finish()
    return target
