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
