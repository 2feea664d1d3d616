"""``--tensorboard DIR``: every per-step metric as a TensorBoard scalar under its verl name, at global step = the
dump's step, so that the values sit next to the trainer's own curves (as float32, TensorBoard's scalar type; NaN
stays NaN). Also written, per step:

- ``rollout_diag/alert``: 0 when every judged metric of the step is ok (or n/a), 1 at watch level, 2 at bad level
  (the thresholds of ``analyze``'s verdict, applied to the step);
- with ``--by``: each group's metrics under ``<metric>/<column>=<value>`` (as prime-rl logs
  ``mismatch_kl/<env_name>/…``).

Needs the optional ``tensorboard`` package (``pip install 'rollout-diag[tensorboard]'``); its own writer is used.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout_diag.errors import ConfigError
from rollout_diag.formatting import group_label

if TYPE_CHECKING:
    from rollout_diag.results import AnalysisResult, ComparisonResult, StepResult

ALERT_TAG = "rollout_diag/alert"
ALERT_LEVEL = {"bad": 2.0, "watch": 1.0}


def writer_class() -> Any:
    """tensorboard's event-file writer; raises ConfigError saying what to install without tensorboard (the CLI calls
    this before reading, so a missing package fails at once)."""
    try:
        from tensorboard.summary import Writer
    except ImportError:
        raise ConfigError(
            "--tensorboard needs the tensorboard package.", hint="pip install 'rollout-diag[tensorboard]'."
        ) from None
    return Writer


def _writer(directory: Path) -> Any:
    writer = writer_class()
    directory.mkdir(parents=True, exist_ok=True)
    return writer(str(directory))


def step_alert(level: str | None) -> float:
    """2 for a step at bad level, 1 at watch level, else 0 (the level the verdict rules gave it)."""
    return ALERT_LEVEL.get(level or "", 0.0)


def _scalars(writer: Any, steps: Iterable[StepResult], suffix: str = "") -> int:
    written = 0
    for step in steps:
        if step.step is None:
            continue
        for name, value in step.metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                writer.add_scalar(name + suffix, float(value), step=int(step.step))
                written += 1
    return written


def write_tensorboard(result: AnalysisResult | ComparisonResult, directory: str | Path) -> int:
    """Write ``result``'s per-step metrics (a comparison: each preset's, under ``<metric>/<preset>``) to an event
    file in ``directory``; returns the number of scalars written. Raises ConfigError without tensorboard."""
    writer = _writer(Path(directory))
    try:
        written = 0
        if hasattr(result, "presets"):
            for preset in result.presets:
                written += _scalars(writer, preset.steps, f"/{preset.name}")
        else:
            written += _scalars(writer, result.steps)
            for entry in result.step_levels:
                if entry["step"] is not None:
                    writer.add_scalar(ALERT_TAG, step_alert(entry["level"]), step=int(entry["step"]))
                    written += 1
        for group in result.groups:
            written += _scalars(writer, group.steps, f"/{group.column}={group_label(group.value)}")
        writer.flush()
    finally:
        writer.close()
    return written
