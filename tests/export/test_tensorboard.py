"""``--tensorboard DIR``: the event files, read back with TensorBoard's own reader, hold every per-step metric of the
JSON at global step = the dump's step, the alert scalar, and each group's metrics (``--by``)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers.dumps import write_table
from helpers.groups import env_table

from rollout_diag.cli import app
from rollout_diag.errors import ConfigError
from tests.helpers.cli import runner

tensorboard = pytest.importorskip("tensorboard", reason="the optional tensorboard extra is not installed")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from tensorboard.util.tensor_util import make_ndarray  # noqa: E402

from rollout_diag import analyze, compare_presets  # noqa: E402
from rollout_diag.export.tensorboard import ALERT_TAG, run_name, step_alert, write_tensorboard  # noqa: E402
from rollout_diag.results import FIRST_SECTION  # noqa: E402


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
    runs = sorted(path.name for path in logs.iterdir() if path.is_dir())
    assert runs == sorted(
        f"env_name={'(null)' if group['value'] is None else group['value']}" for group in document["groups"]
    )
    for group in document["groups"]:  # a run (sub-directory) per group, its metrics under their own names: one chart
        run = read_scalars(logs / f"env_name={'(null)' if group['value'] is None else group['value']}")
        assert not any("=" in tag for tag in run)
        for step in group["steps"]:
            for name, value in step["metrics"].items():
                assert same(run[name][step["step"]], value)
    assert "wrote" in done.stderr and "TensorBoard scalars" in done.stderr


def test_alert_levels(dump):
    result = analyze(dump, device="cpu")
    levels = {entry["step"]: step_alert(entry["level"]) for entry in result.step_levels}
    assert set(levels) == {step.step for step in result.steps} and set(levels.values()) <= {0.0, 1.0, 2.0}
    assert (step_alert("bad"), step_alert("watch"), step_alert("ok"), step_alert("n/a")) == (2.0, 1.0, 0.0, 0.0)


def test_comparison_scalars_per_preset(dump, tmp_path):
    """§1 once in DIR, each preset's own metrics in DIR/<preset> under their own names: TensorBoard overlays the same
    metric of every preset on one chart (a tag per preset would draw a chart each)."""
    comparison = compare_presets(dump, ["decoupled_token_is", "decoupled_k3_rs"], device="cpu")
    count = write_tensorboard(comparison, tmp_path / "cmp")
    shared = read_scalars(tmp_path / "cmp")
    assert set(shared) == {
        name for step in comparison.presets[0].steps for name in step.metrics if name in FIRST_SECTION
    }
    expected = sum(len(shared[name]) for name in shared)
    for preset in comparison.presets:
        own = read_scalars(tmp_path / "cmp" / preset.name)
        assert own and not set(own) & FIRST_SECTION  # §1 is not repeated under every preset
        for step in preset.steps:
            for name, value in step.metrics.items():
                assert same((shared if name in FIRST_SECTION else own)[name][step.step], value), (preset.name, name)
        expected += sum(len(values) for values in own.values())
    assert "rollout_corr/rollout_rs_masked_fraction" in read_scalars(tmp_path / "cmp" / "decoupled_k3_rs")
    assert count == expected


def test_without_tensorboard_the_error_says_what_to_install(dump, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard.summary", None)
    with pytest.raises(ConfigError, match="needs the tensorboard package"):
        write_tensorboard(analyze(dump, device="cpu"), tmp_path / "none")
    done = runner.invoke(app, ["analyze", str(dump), "--tensorboard", str(tmp_path / "none")])
    assert done.exit_code == 1 and "rollout-diag[tensorboard]" in done.output and "Traceback" not in done.output


def test_run_names_stay_one_directory_inside_dir():
    assert run_name("env_name=math") == "env_name=math" and run_name("env_name=(null)") == "env_name=(null)"
    assert run_name("path=../a/b c") == "path=.._a_b_c" and run_name("..") == "_.."
