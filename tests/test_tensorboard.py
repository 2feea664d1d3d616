"""``--tensorboard DIR``: the event files, read back with TensorBoard's own reader, hold every per-step metric of the
JSON at global step = the dump's step, the alert scalar, and each group's metrics (``--by``)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from dumps import write_table
from test_groups import env_table
from typer.testing import CliRunner

from rollout_diag.cli import app
from rollout_diag.errors import ConfigError

tensorboard = pytest.importorskip("tensorboard", reason="the optional tensorboard extra is not installed")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from tensorboard.util.tensor_util import make_ndarray  # noqa: E402

from rollout_diag import analyze, compare_presets  # noqa: E402
from rollout_diag.export.tensorboard import ALERT_TAG, step_alert, write_tensorboard  # noqa: E402

runner = CliRunner()


def read_scalars(directory: Path) -> dict[str, dict[int, float]]:
    """tag -> {step: value}, from every event file in ``directory``."""
    events = EventAccumulator(str(directory), size_guidance={"tensors": 0})
    events.Reload()
    return {
        tag: {event.step: float(make_ndarray(event.tensor_proto)) for event in events.Tensors(tag)}
        for tag in events.Tags()["tensors"]
    }


def same(value: float, expected: float | None) -> bool:
    """TensorBoard keeps scalars as float32: the value read back is the float64 result rounded to float32, exactly."""
    if expected is None or math.isnan(expected):
        return math.isnan(value)
    return value == float(np.float32(expected))


@pytest.fixture(scope="module")
def dump(tmp_path_factory) -> Path:
    return write_table(tmp_path_factory.mktemp("tb") / "envs.parquet", env_table(3), row_group_size=19)


def test_cli_scalars_read_back_equal_the_json(dump, tmp_path):
    logs = tmp_path / "logs"
    done = runner.invoke(app, ["analyze", str(dump), "--by", "env_name", "--tensorboard", str(logs), "-f", "json"])
    assert done.exit_code == 0, done.output
    document = json.loads(done.stdout)
    scalars = read_scalars(logs)
    for step in document["steps"]:
        for name, value in step["metrics"].items():
            assert same(scalars[name][step["step"]], value), (name, step["step"])
    for entry in document["step_levels"]:  # the alert is the level the verdict rules gave each step
        assert scalars[ALERT_TAG][entry["step"]] == step_alert(entry["level"])
    for group in document["groups"]:
        suffix = f"/env_name={'(null)' if group['value'] is None else group['value']}"
        for step in group["steps"]:
            for name, value in step["metrics"].items():
                assert same(scalars[name + suffix][step["step"]], value)
    assert "wrote" in done.stderr and "TensorBoard scalars" in done.stderr


def test_alert_levels(dump):
    result = analyze(dump, device="cpu")
    levels = {entry["step"]: step_alert(entry["level"]) for entry in result.step_levels}
    assert set(levels) == {step.step for step in result.steps} and set(levels.values()) <= {0.0, 1.0, 2.0}
    assert (step_alert("bad"), step_alert("watch"), step_alert("ok"), step_alert("n/a")) == (2.0, 1.0, 0.0, 0.0)


def test_comparison_scalars_per_preset(dump, tmp_path):
    comparison = compare_presets(dump, ["decoupled_token_is"], device="cpu")
    count = write_tensorboard(comparison, tmp_path / "cmp")
    scalars = read_scalars(tmp_path / "cmp")
    assert count == sum(len(s.metrics) for s in comparison.presets[0].steps)
    step = comparison.presets[0].steps[0]
    for name, value in step.metrics.items():
        assert same(scalars[f"{name}/decoupled_token_is"][step.step], value)


def test_without_tensorboard_the_error_says_what_to_install(dump, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard.summary", None)
    with pytest.raises(ConfigError, match="needs the tensorboard package"):
        write_tensorboard(analyze(dump, device="cpu"), tmp_path / "none")
    done = runner.invoke(app, ["analyze", str(dump), "--tensorboard", str(tmp_path / "none")])
    assert done.exit_code == 1 and "rollout-diag[tensorboard]" in done.output and "Traceback" not in done.output
