"""Results as dataframes (``to_polars``, ``to_pandas``), ``--format parquet`` and the CSV's run row, against the JSON
they must agree with; and what a notebook shows (``_repr_html_``)."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import polars as pl
import pytest
from helpers.dumps import write_table
from helpers.groups import env_table

from rollout_diag import analyze, compare_presets
from rollout_diag.cli import app
from rollout_diag.errors import ConfigError
from rollout_diag.export.parquet import groups_path
from rollout_diag.formatting import group_label
from rollout_diag.results import AnalysisResult
from tests.helpers.cli import runner


@pytest.fixture(scope="module")
def dump(tmp_path_factory) -> Path:
    return write_table(tmp_path_factory.mktemp("frames") / "envs.parquet", env_table(2), row_group_size=17)


@pytest.fixture(scope="module")
def result(dump) -> AnalysisResult:
    return analyze(dump, device="cpu", by=["env_name"])


def same(value, expected) -> bool:
    if expected is None or (isinstance(expected, float) and math.isnan(expected)):
        return value is None or (isinstance(value, float) and math.isnan(value))
    return value == expected


def assert_rows_equal_steps(frame: pl.DataFrame, steps: list[dict]) -> None:
    """Each row of ``frame`` equals the JSON step at its position: counts and every metric, bit for bit."""
    assert frame.height == len(steps)
    for row, step in zip(frame.iter_rows(named=True), steps, strict=True):
        assert (row["step"], row["rows"], row["tokens"]) == (step.get("step"), step["rows"], step["tokens"])
        metrics = {k: v for k, v in row.items() if "/" in k}
        assert set(step["metrics"]) <= set(metrics)
        for name, value in metrics.items():
            assert same(value, step["metrics"].get(name)), (step.get("step"), name, value)


def test_steps_frame_equals_the_json(result):
    document = json.loads(json.dumps(result.to_json(), allow_nan=False))
    frames = result.to_polars()
    assert_rows_equal_steps(frames["steps"], document["steps"])
    assert frames["steps"].schema["step"] == pl.Int64
    assert all(dtype == pl.Float64 for name, dtype in frames["steps"].schema.items() if "/" in name)
    assert frames["run"].height == 1 and frames["run"]["tokens"][0] == result.run.tokens


def test_every_table(result):
    frames = result.to_polars()
    assert set(frames) == {
        "steps",
        "run",
        "rounds",
        "positions",
        "worst_rows",
        "worst_tokens",
        "verdicts",
        "groups",
        "group_steps",
        "drift",
    }
    assert frames["rounds"].height == len(result.rounds)
    assert frames["positions"].height == len(result.positions)
    drift = frames["drift"]  # one row per metric, factor and bucket
    assert drift.height == sum(len(f["buckets"]) for entry in result.drift for f in entry["factors"])
    worst = frames["worst_rows"]
    assert worst.height == len(result.worst_rows)
    assert {"env_name", "reward", "flag"} <= set(worst.columns)  # the extras, as columns
    for row, kept in zip(worst.iter_rows(named=True), result.worst_rows, strict=True):
        assert row["sample_id"] == kept.sample_id and same(row["reward"], kept.extra["reward"])
        assert row["env_name"] == kept.extra["env_name"]
    assert frames["worst_tokens"].height == len(result.worst_tokens)
    groups = frames["groups"]
    assert groups["value"].to_list() == [group_label(g.value) for g in result.groups]
    assert groups["rollout_corr/k3_kl"].to_list() == [g.metrics["rollout_corr/k3_kl"] for g in result.groups]
    assert frames["group_steps"].height == sum(len(g.steps) + 1 for g in result.groups)


def test_parquet_rows_equal_the_json(dump, tmp_path):
    target = tmp_path / "result.parquet"
    done = runner.invoke(app, ["analyze", str(dump), "--by", "env_name", "--device", "cpu", "-o", str(target)])
    assert done.exit_code == 0, done.output
    document = json.loads(
        runner.invoke(app, ["analyze", str(dump), "--by", "env_name", "--device", "cpu", "-f", "json"]).stdout
    )
    assert_rows_equal_steps(pl.read_parquet(target), document["steps"])
    groups = pl.read_parquet(groups_path(target))
    for group in document["groups"]:
        label = group_label(group["value"])
        mine = groups.filter((pl.col("column") == group["column"]) & (pl.col("value") == label))
        steps = mine.filter(pl.col("step").is_not_null())
        assert_rows_equal_steps(steps, group["steps"])
        run = mine.filter(pl.col("step").is_null())
        assert_rows_equal_steps(run, [{**group, "step": None}])


def test_parquet_needs_an_output_and_names_the_groups_file(dump, tmp_path):
    done = runner.invoke(app, ["analyze", str(dump), "-f", "parquet"])
    assert done.exit_code == 1 and "give --output FILE.parquet" in done.output
    assert groups_path(Path("a/out.parquet")) == Path("a/out.groups.parquet")
    assert groups_path(Path("out")) == Path("out.groups")


def test_csv_run_row(dump):
    done = runner.invoke(app, ["analyze", str(dump), "--device", "cpu", "-f", "csv"])
    records = list(csv.reader(io.StringIO(done.stdout)))
    run = analyze(dump, device="cpu").run
    assert records[-1][0] == "" and int(records[-1][1]) == run.rows and int(records[-1][2]) == run.tokens
    header = records[0]
    assert float(records[-1][header.index("rollout_corr/k3_kl")]) == run.metrics["rollout_corr/k3_kl"]
    frame = pl.read_csv(io.StringIO(done.stdout))  # the step column read as numbers, the run's step as null
    assert frame["step"].dtype.is_integer() and frame["step"].to_list()[-1] is None
    assert frame["step"].to_list()[:-1] == [step.step for step in analyze(dump, device="cpu").steps]


def test_comparison_frames_and_parquet(dump, tmp_path):
    comparison = compare_presets(dump, ["decoupled_token_is", "decoupled_seq_is"], device="cpu", by=["env_name"])
    frames = comparison.to_polars()
    assert frames["presets"]["preset"].to_list() == ["decoupled_token_is", "decoupled_seq_is"]
    steps = frames["preset_steps"]
    for preset in comparison.presets:
        mine = steps.filter(pl.col("preset") == preset.name).drop("preset")
        assert_rows_equal_steps(mine, [s.to_json() for s in preset.steps])
    assert frames["sweep"].height == sum(len(o.thresholds) for o in comparison.sweep)
    assert frames["groups"].height == len(comparison.groups)
    target = tmp_path / "cmp.parquet"
    done = runner.invoke(
        app, ["compare-presets", str(dump), "--preset", "decoupled_token_is", "--by", "env_name", "-o", str(target)]
    )
    assert done.exit_code == 0, done.output
    assert pl.read_parquet(target).height == len(comparison.presets[0].steps)
    assert groups_path(target).exists()


def test_to_pandas_goes_through_polars_or_says_what_to_install(result):
    try:
        import pandas  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match="needs pandas"):
            result.to_pandas()
        return
    frames = result.to_pandas()
    assert list(frames["steps"]["step"]) == [s.step for s in result.steps]


def test_repr_html(result):
    page = result._repr_html_()
    assert "Verdict:" in page and "k3_kl" in page and "worst step " in page
    assert "env_name=" in page and "is the worst group" in page  # the terminal's "Where:" lines
    assert "AnalysisResult(" not in page
    assert "<table>" in compare_presets(result.inputs, ["decoupled_token_is"], device="cpu")._repr_html_()
