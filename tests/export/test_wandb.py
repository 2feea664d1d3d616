"""``--wandb PROJECT``: offline W&B runs (``WANDB_MODE=offline``), read back from their ``.wandb`` files
(tests/helpers/wandb_offline.py), hold every per-step metric of the JSON at W&B step = the dump's step, the alert per
step, a run per ``--by`` group and per preset in one group, the verdict and findings as the summary and a table, the
report as an artifact; ``--wandb-run-id`` adds to an existing run; a missing wandb is a one-line error."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from helpers.dumps import write_table
from helpers.groups import env_table

from rollout_diag.cli import app
from rollout_diag.errors import ConfigError
from tests.helpers.cli import runner

wandb = pytest.importorskip("wandb", reason="the optional wandb extra is not installed")

from helpers.wandb_offline import OfflineRun, offline_runs  # noqa: E402

from rollout_diag import analyze  # noqa: E402
from rollout_diag.export.wandb import ALERT_KEY, PREFIX, STEP_KEY, log_to_wandb, step_levels  # noqa: E402
from rollout_diag.results import FIRST_SECTION  # noqa: E402


@pytest.fixture(scope="module")
def wb(tmp_path_factory):
    """Every run offline, its files under one directory for the module (wandb reads its settings once a process,
    so each test's runs are told apart by their group or id), never the network nor the user's settings."""
    directory = tmp_path_factory.mktemp("wandb")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WANDB_MODE", "offline")
        patch.setenv("WANDB_DIR", str(directory))
        patch.setenv("WANDB_SILENT", "true")
        patch.setenv("WANDB_CONFIG_DIR", str(directory / "config"))
        patch.delenv("WANDB_API_KEY", raising=False)
        yield directory


def runs_of(directory: Path, group: str) -> dict[str, OfflineRun]:
    return {run.name: run for run in offline_runs(directory) if run.group == group}


@pytest.fixture(scope="module")
def dump(tmp_path_factory) -> Path:
    return write_table(tmp_path_factory.mktemp("wb") / "envs.parquet", env_table(3), row_group_size=19)


def same(value: float, expected: float | None) -> bool:
    if expected is None or (isinstance(expected, float) and math.isnan(expected)):
        return value is None or (isinstance(value, float) and math.isnan(value))
    return value == pytest.approx(expected, rel=1e-15)


def history(run: OfflineRun, key: str = "_step") -> dict[int, dict]:
    return {int(row[key]): row for row in run.history if key in row and len(row) > 4}


def test_cli_analyze_runs_read_back_equal_the_json(dump, wb):
    done = runner.invoke(
        app, ["analyze", str(dump), "--by", "env_name", "--wandb", "proj", "--wandb-group", "g1", "-f", "json"]
    )
    assert done.exit_code == 0, done.output
    document = json.loads(done.stdout)
    runs = runs_of(wb, "g1")
    groups = {f"env_name={'(null)' if g['value'] is None else g['value']}": g for g in document["groups"]}
    assert set(runs) == {"analyze", *groups}
    assert {run.group for run in runs.values()} == {"g1"} and {run.project for run in runs.values()} == {"proj"}
    main = runs["analyze"]
    rows = history(main)
    for step in document["steps"]:  # W&B's step is the dump's step; every metric under its verl name
        for name, value in step["metrics"].items():
            assert same(rows[step["step"]][name], value), (name, step["step"])
    for entry in document["step_levels"]:
        assert rows[entry["step"]][ALERT_KEY] == {"bad": 2, "watch": 1}.get(entry["level"], 0)
    summary = main.summary
    assert summary[PREFIX + "verdict"] == document["verdict"]["sentence"]
    assert summary[PREFIX + "verdict_level"] == document["verdict"]["level"]
    for name, value in document["run"]["metrics"].items():  # the run's value, not the last step's
        assert same(summary[name], value), name
    assert summary[PREFIX + "findings/_type"] == "table-file" and summary[PREFIX + "findings/ncols"] == 2
    findings = main.table(PREFIX + "findings")
    assert findings[0] == ["verdict", document["verdict"]["sentence"]]
    assert {kind for kind, _ in findings} >= {"verdict", "where"}
    for label, group in groups.items():  # a run per group, its metrics under their own names: one chart
        group_rows = history(runs[label])
        for step in group["steps"]:
            for name, value in step["metrics"].items():
                assert same(group_rows[step["step"]][name], value)
    assert "logged" in done.stderr and "W&B project proj" in done.stderr


def test_comparison_presets_are_runs_and_the_report_an_artifact(dump, tmp_path, wb):
    report = tmp_path / "r.html"
    done = runner.invoke(
        app,
        [
            *("report", str(dump), "--preset", "decoupled_k3_rs", "--preset", "disabled", "-o", str(report)),
            *("--wandb", "p", "--wandb-group", "rep"),
        ],
    )
    assert done.exit_code == 0, done.output
    runs = runs_of(wb, "rep")
    assert set(runs) == {"analyze"}  # report logs its analysis (no --by) and attaches the page
    ((_, kind, files),) = runs["analyze"].artifacts[-1:]
    assert kind == "rollout-diag-report" and files == ["r.html"]
    done = runner.invoke(
        app, ["compare-presets", str(dump), "--preset", "decoupled_k3_rs", "--wandb", "p", "--wandb-group", "cmp"]
    )
    assert done.exit_code == 0, done.output
    runs = runs_of(wb, "cmp")
    assert set(runs) == {"compare-presets", "decoupled_k3_rs"}
    own = {key for row in runs["decoupled_k3_rs"].history for key in row if not key.startswith("_")}
    shared = {key for row in runs["compare-presets"].history for key in row if not key.startswith("_")}
    assert "rollout_corr/rollout_rs_masked_fraction" in own and not own & FIRST_SECTION
    assert "rollout_corr/k3_kl" in shared


def test_adding_to_an_existing_run(dump, wb):
    result = analyze(str(dump), device="cpu", by=["env_name"])
    first = wandb.init(project="train", id="trainrun", reinit="finish_previous")
    for step in range(10):  # the trainer's own curve, steps taken
        first.log({"loss": 1.0 / (step + 1)}, step=step)
    first.finish()
    target = log_to_wandb(result, "train", run_id="trainrun")
    assert [run_id for _, run_id in target.runs] == ["trainrun"]
    added = [run for run in offline_runs(wb) if run.run_id == "trainrun"][-1]
    assert any(metric["glob"] == PREFIX + "*" and metric["step"] == STEP_KEY for metric in added.metrics)
    rows = [row for row in added.history if STEP_KEY in row and PREFIX + "rollout_corr/k3_kl" in row]
    steps = [int(row[STEP_KEY]) for row in rows]
    assert steps == [step.step for step in result.steps]
    group = next(g for g in result.groups)
    label = f"env_name={group.value}"
    assert any(PREFIX + label + "/rollout_corr/k3_kl" in row for row in added.history)
    assert added.summary[PREFIX + "verdict_level"] == result.verdict.level
    assert step_levels(result)


def test_watch_logs_each_finished_step(tmp_path, wb):
    from helpers.dumps import sequence_table

    directory = tmp_path / "run"
    for step in range(3):
        rows = [
            {
                "step": step,
                "sample_id": f"s{step}-{i}",
                "rollout": [-0.5, -0.6],
                "trainer": [-0.5, -0.7],
                "mask": [1, 1],
            }
            for i in range(4)
        ]
        (directory / f"step={step}").mkdir(parents=True)
        write_table(directory / f"step={step}" / "part-0.parquet", sequence_table(rows))
    done = runner.invoke(
        app,
        [
            "watch",
            str(directory),
            "-f",
            "jsonl",
            "--exit-after-idle",
            "0",
            "--interval",
            "0.05",
            "--wandb",
            "w",
            "--wandb-group",
            "watched",
        ],
    )
    assert done.exit_code == 0, done.output
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    (run,) = runs_of(wb, "watched").values()
    rows = history(run)
    for line in lines:
        for name, value in line["metrics"].items():
            assert same(rows[line["step"]][name], value)
    assert PREFIX + "verdict_level" in run.summary


def test_without_wandb_the_error_says_what_to_install(dump, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ConfigError, match="needs the wandb package"):
        log_to_wandb(analyze(dump, device="cpu"), "p")
    done = runner.invoke(app, ["analyze", str(dump), "--wandb", "p"])
    assert done.exit_code == 1 and "rollout-diag[wandb]" in done.output and "Traceback" not in done.output
    done = runner.invoke(app, ["analyze", str(dump), "--wandb-run-id", "x"])
    assert done.exit_code == 1 and "go with --wandb PROJECT" in done.output


def test_runs_each_run_a_wandb_run_and_the_effects_a_table(tmp_path, wb):
    from helpers.dumps import sequence_table

    for name, shift in (("a", 0.0), ("b", 0.05)):
        rows = [
            {
                "step": step,
                "sample_id": f"s{step}-{i}",
                "rollout": [-0.5 - shift * (i % 3), -0.6],
                "trainer": [-0.5, -0.61],
                "mask": [1, 1],
            }
            for step in range(3)
            for i in range(8)
        ]
        write_table(tmp_path / f"{name}.parquet", sequence_table(rows))
    arguments = ["runs", f"base={tmp_path / 'a.parquet'}", f"cand={tmp_path / 'b.parquet'}", "-f", "json"]
    done = runner.invoke(app, [*arguments, "--replicates", "100", "--wandb", "p", "--wandb-group", "abl"])
    assert done.exit_code in (0, 3), done.output
    document = json.loads(done.stdout)
    runs = runs_of(wb, "abl")
    assert set(runs) == {"base", "cand", "runs"}
    for run in document["runs"]:
        logged = runs[run["name"]]
        assert logged.summary[PREFIX + "verdict_level"] == run["verdict"]
        for metric, value in run["metrics"].items():
            assert same(logged.summary[metric], value["value"]), metric
        assert sorted(history(logged)) == [0, 1, 2]
    assert runs["runs"].summary[PREFIX + "answer"] == document["answer"]
    assert len(runs["runs"].table(PREFIX + "effects")) == len(document["effects"])
