"""``runs --report``: the forest plot draws each effect's ratio and interval, the curves one line per run."""

from __future__ import annotations

import json
import re

import pytest

from rollout_diag.drivers.dump import Dump
from rollout_diag.drivers.runs import RunSpec, compare_dumps
from rollout_diag.report.runs import forest_figure, render_runs_report
from tests.helpers.runs import write_run


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs_report")
    specs = [
        RunSpec("base", Dump(str(write_run(root / "a.parquet", 1, steps=5))), {"kv": "bf16"}),
        RunSpec("<fp8>", Dump(str(write_run(root / "b.parquet", 2, steps=5, scale=2.0))), {"kv": "fp8"}),
    ]
    return compare_dumps(specs, workers=1, metadata_knobs=False)


def test_forest_plot_holds_each_ratio_and_interval(result):
    figure = forest_figure(result)
    rated = [e for e in result.effects if e.ratio is not None]
    drawn = [
        (x, plus, minus)
        for trace in figure["data"]
        for x, plus, minus in zip(trace["x"], trace["error_x"]["array"], trace["error_x"]["arrayminus"], strict=True)
    ]
    assert len(drawn) == len(rated)
    for effect, (x, plus, minus) in zip(rated, drawn, strict=True):
        assert x == effect.ratio and x + plus == pytest.approx(effect.high) and x - minus == pytest.approx(effect.low)
    assert figure["layout"]["xaxis"]["type"] == "log"


def test_page_escapes_run_names_and_draws_every_run(result):
    page = render_runs_report(result)
    assert "<fp8>" not in page.replace("&lt;fp8&gt;", "")  # a run's name is data, escaped
    payload = json.loads(re.search(r'id="report-data">(.*?)</script>', page, re.DOTALL).group(1))
    curves = payload["figures"]["runs-curves"]["data"]
    assert len(curves) == len(result.runs) * len(result.metrics)  # one line per run in each metric's panel
    assert [t["name"] for t in curves if t["showlegend"]] == ["base", "&lt;fp8&gt;"]  # each run once in the legend
    assert "No prompt identity in the runs" in page  # the prompts section: one line without an identity


def test_the_prompts_heatmap_holds_each_prompt_in_each_run(tmp_path):
    from rollout_diag.report.runs import prompts_figure
    from tests.helpers.prompts import matched_run_rows, write_prompt_dump

    specs = [
        RunSpec(name, Dump(str(write_prompt_dump(tmp_path / f"{name}.parquet", rows))), {})
        for name, rows in (
            ("base", matched_run_rows(1, prompts=100, planted=2)),
            ("<tp4>", matched_run_rows(2, prompts=100, planted=2)),
            ("fp8", matched_run_rows(3, prompts=120, planted=2)),  # 20 prompts of its own: not matched
        )
    ]
    result = compare_dumps(specs, workers=1, metadata_knobs=False, replicates=100)
    prompts = result.prompts
    runs = [run.name for run in result.runs]
    figure = prompts_figure(prompts, runs)
    (trace,) = figure["data"]
    assert len(trace["y"]) == len(prompts.matrix) == 50 and trace["x"] == ["base", "&lt;tp4&gt;", "fp8"]
    assert trace["y"][:2] == [f"★ {item.prompt}" for item in prompts.listed]
    for item, row in zip(prompts.matrix, trace["z"], strict=True):
        assert row == [None if item.cell(run) is None else item.cell(run).score_mean for run in runs]
    page = render_runs_report(result)
    payload = json.loads(re.search(r'id="report-data">(.*?)</script>', page, re.DOTALL).group(1))
    assert "runs-prompts" in payload["figures"] and "deterministic outliers" in page
