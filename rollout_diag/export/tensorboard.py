"""``--tensorboard DIR``: every per-step metric as a TensorBoard scalar under its verl name, at global step = the
dump's step, so that the values sit next to the trainer's own curves (as float32, TensorBoard's scalar type; NaN
stays NaN). Also written, per step:

- ``rollout_diag/alert``: 0 when every judged metric of the step is ok (or n/a), 1 at watch level, 2 at bad level
  (the thresholds of ``analyze``'s verdict, applied to the step);
- with ``--by``: each group's metrics under their own names in a sub-directory ``<column>=<value>`` of DIR;
- ``compare-presets``: the §1 metrics (the same under every preset: verl computes them before any correction) once in
  DIR, each preset's own metrics under their own names in a sub-directory ``<preset>``.

TensorBoard shows each sub-directory as a run: the same metric of every group or preset overlays on one chart.

Needs the optional ``tensorboard`` package (``pip install 'rollout-diag[tensorboard]'``); its own writer is used.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
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


def _scalars(writer: Any, steps: Iterable[StepResult], keep: Callable[[str], bool] = lambda name: True) -> int:
    written = 0
    for step in steps:
        if step.step is None:
            continue
        for name, value in step.metrics.items():
            if keep(name) and isinstance(value, (int, float)) and not isinstance(value, bool):
                writer.add_scalar(name, float(value), step=int(step.step))
                written += 1
    return written


def run_name(label: str) -> str:
    """A preset's or group's sub-directory: its label with every character outside ``A-Za-z0-9._=+-()`` as ``_`` (a
    value holding ``/`` or ``..`` stays one directory inside DIR)."""
    name = re.sub(r"[^A-Za-z0-9._=+()-]", "_", label)
    return "_" + name if name.startswith(".") else name


def _run(
    directory: Path, label: str, steps: Iterable[StepResult], keep: Callable[[str], bool] = lambda name: True
) -> int:
    writer = _writer(directory / run_name(label))
    try:
        written = _scalars(writer, steps, keep)
        writer.flush()
    finally:
        writer.close()
    return written


def write_tensorboard(result: AnalysisResult | ComparisonResult, directory: str | Path) -> int:
    """Write ``result``'s per-step metrics to event files in ``directory`` (a comparison's §1 metrics once there, each
    preset's own in a sub-directory named after it; each ``--by`` group's in a sub-directory ``<column>=<value>``);
    returns the number of scalars written. Raises ConfigError without tensorboard."""
    from rollout_diag.results import FIRST_SECTION

    root = Path(directory)
    writer = _writer(root)
    try:
        written = 0
        if hasattr(result, "presets"):
            if result.presets:  # §1 is the data's, the same under every preset: once
                written += _scalars(writer, result.presets[0].steps, lambda name: name in FIRST_SECTION)
        else:
            written += _scalars(writer, result.steps)
            for entry in result.step_levels:
                if entry["step"] is not None:
                    writer.add_scalar(ALERT_TAG, step_alert(entry["level"]), step=int(entry["step"]))
                    written += 1
        writer.flush()
    finally:
        writer.close()
    for preset in getattr(result, "presets", []):
        written += _run(root, preset.name, preset.steps, lambda name: name not in FIRST_SECTION)
    for group in result.groups:
        written += _run(root, f"{group.column}={group_label(group.value)}", group.steps)
    return written
