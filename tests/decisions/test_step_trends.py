"""Step trends users watch (issue 39): mean |δ|, k3_kl without catastrophic tokens and k3_kl, each with a rank
rise test; a significant rise is said in analyze's Where:, the report's "What stands out" and the JSON."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from helpers.dumps import seq_row, write_sequence_dump
from rich.console import Console

import rollout_diag as rd
from rollout_diag import catalogue
from rollout_diag.decisions.trends import RISE_MIN_RATIO, rise_test, step_trend, step_trends
from rollout_diag.render.analysis import render_analysis
from rollout_diag.report import render_report
from rollout_diag.results import AnalysisResult, StepResult

REPO = Path(__file__).resolve().parents[2]
RESULT_SCHEMA = json.loads((REPO / "schemas" / "result.schema.json").read_text())
ABS_DIFF = catalogue.LOGPROB_ABS_DIFF.key
STEPS, ROWS, WIDTH = 24, 16, 256


def run_dump(path: Path, rising: bool, seed: int = 0) -> Path:
    """STEPS steps of ROWS × WIDTH tokens. The bulk's |δ| is half-normal with mean 0.0034 (flat) or rising linearly
    to 0.0084 (2.5×); each step also has one catastrophic token of random size δ ∈ [−8, −3], which makes k3_kl on its
    own (e^−3 + 3 − 1 ≈ 2.05 to 7 over 4 096 tokens: 5e-4 to 1.7e-3 against the bulk's σ²/2 ≈ 1e-5 to 6e-5) and
    leaves k3_kl without a trend."""
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(STEPS):
        mean_abs = 0.0034 + (0.0084 - 0.0034) * step / (STEPS - 1) if rising else 0.0034
        sigma = mean_abs / math.sqrt(2 / math.pi)  # E|N(0, σ)| = σ √(2/π)
        deltas = rng.normal(0.0, sigma, (ROWS, WIDTH))
        deltas[rng.integers(ROWS), rng.integers(WIDTH)] = -rng.uniform(3.0, 8.0)  # trainer logprob stays ≤ 0
        rollout = -rng.uniform(0.5, 3.0, (ROWS, WIDTH))
        trainer = rollout + deltas
        rows += [seq_row(step, f"s{step}-{r}", rollout[r].tolist(), trainer[r].tolist()) for r in range(ROWS)]
    return write_sequence_dump(path, rows)


def terminal(result: AnalysisResult) -> str:
    stream = io.StringIO()
    Console(file=stream, width=200, color_system=None, soft_wrap=False).print(render_analysis(result))
    return stream.getvalue()


def test_rise_test_on_a_hand_computed_series():
    # 10 steps rising 1, 2, …, 10: Spearman ρ = 1; w = max(3, 10 // 10) = 3; medians of (1, 2, 3) = 2 and of
    # (8, 9, 10) = 9: ratio 4.5; p = (1 + permutations as rising as the identity) / 1000 = 0.001 (a random
    # permutation of 10 is the identity with probability 1 / 3 628 800)
    rise = rise_test(np.arange(10.0), np.arange(1.0, 11.0))
    assert rise is not None
    assert rise["rank_correlation"] == pytest.approx(1.0)
    assert rise["p_value"] == pytest.approx(0.001)
    assert (rise["window"], rise["level_before"], rise["level_after"]) == (3, 2.0, 9.0)
    assert rise["ratio"] == pytest.approx(4.5) and rise["rising"]
    # the same values falling: ρ = −1, p = 1.0 (every permutation is at least as rising), not a rise
    fall = rise_test(np.arange(10.0), np.arange(10.0, 0.0, -1.0))
    assert fall["rank_correlation"] == pytest.approx(-1.0) and fall["p_value"] == 1.0 and not fall["rising"]
    # rising in rank but only from 1.0 to 1.2 in steps of 0.2 / 9: medians 1 + 0.2/9 and 1 + 1.6/9, ratio ≈ 1.152,
    # below RISE_MIN_RATIO: not said
    small = rise_test(np.arange(10.0), np.linspace(1.0, 1.2, 10))
    assert small["ratio"] == pytest.approx((1 + 1.6 / 9) / (1 + 0.2 / 9))
    assert small["ratio"] < RISE_MIN_RATIO and not small["rising"]
    assert rise_test(np.arange(7.0), np.arange(7.0)) is None  # fewer than 8 steps


def test_step_trends_cover_the_three_watched_metrics_and_a_few_spikes_do_not_make_a_rise():
    # k3_kl: one spike of 1000× at step 3 among 20 flat steps: Spearman sees one high rank, medians ignore it
    steps = [
        StepResult(s, 4, 100, {catalogue.K3_KL.key: 1.0 + (999.0 if s == 3 else 0.01 * (s % 3)), ABS_DIFF: 0.01})
        for s in range(20)
    ]
    trends = step_trends(steps)
    assert [t.metric for t in trends] == [catalogue.K3_KL.key, ABS_DIFF]  # no without-catastrophic values: no trend
    assert all(not t.headline for t in trends)
    rising = [StepResult(s, 4, 100, {ABS_DIFF: 0.0034 + 0.0050 * s / 44}) for s in range(45)]
    trend = step_trend(rising, ABS_DIFF)
    # w = 45 // 10 = 4: medians of steps 0–3 and 41–44 = the values at 1.5 and 42.5: 0.0034 + 0.005·1.5/44 ≈ 0.003570
    # and 0.0034 + 0.005·42.5/44 ≈ 0.008230: ratio ≈ 2.305, said to two digits
    assert trend.level_before == pytest.approx(0.0034 + 0.005 * 1.5 / 44)
    assert trend.level_after == pytest.approx(0.0034 + 0.005 * 42.5 / 44)
    assert trend.headline == "mean |δ| up 2.3× from step 0 to 44"
    assert trend.summary.startswith(trend.headline) and "Spearman ρ = 1.00" in trend.summary


@pytest.fixture(scope="module")
def rising_result(tmp_path_factory) -> AnalysisResult:
    return rd.analyze(run_dump(tmp_path_factory.mktemp("rising") / "run.parquet", rising=True), device="cpu")


def test_a_broad_rise_under_catastrophic_noise_is_said_in_where_the_report_and_json(rising_result):
    by_metric = {t.metric: t for t in rising_result.trends if t.against == "step"}
    assert set(by_metric) == {catalogue.K3_KL.key, ABS_DIFF, catalogue.K3_KL_WITHOUT_CATASTROPHIC.key}
    assert not by_metric[catalogue.K3_KL.key].headline  # one random-sized catastrophic token per step: no rise
    headline = by_metric[ABS_DIFF].headline
    assert headline.startswith("mean |δ| up ") and headline.endswith("× from step 0 to 23")
    # the ratio by its definition: median of the last w = max(3, 24 // 10) = 3 steps' values over the first 3's
    # (the planted bulk rises 2.5×; each step's catastrophic token adds about 5.5 / 4 096 ≈ 0.0013 to both ends)
    values = [step.metrics[ABS_DIFF] for step in rising_result.steps]
    assert by_metric[ABS_DIFF].ratio == pytest.approx(np.median(values[-3:]) / np.median(values[:3]), rel=1e-12)
    assert by_metric[ABS_DIFF].ratio >= RISE_MIN_RATIO
    assert by_metric[catalogue.K3_KL_WITHOUT_CATASTROPHIC.key].headline  # σ² rises 2.5² ≈ 6×
    where = next(line for line in terminal(rising_result).splitlines() if line.startswith("Where: "))
    assert headline in where
    assert headline in render_report(rising_result).split("What stands out", 1)[1]
    document = json.loads(json.dumps(rising_result.to_json(), allow_nan=False))
    jsonschema.validate(document, RESULT_SCHEMA)
    written = next(t for t in document["trends"] if t["metric"] == ABS_DIFF)
    assert written["headline"] == headline and written["p_value"] < 0.01 and written["ratio"] >= RISE_MIN_RATIO
    again = AnalysisResult.from_json(document)
    assert [t.headline for t in again.trends] == [t.headline for t in rising_result.trends]


def test_a_flat_noisy_run_says_no_rise(tmp_path):
    result = rd.analyze(run_dump(tmp_path / "flat.parquet", rising=False, seed=1), device="cpu")
    assert [t for t in result.trends if t.headline] == []
    assert " up " not in next(line for line in terminal(result).splitlines() if line.startswith("Where: "))
