"""Robust statistics: the anomaly baseline, supported most-divergent round, exact std of constant values,
one definition of a sequence share. Each test fails on the code before the fix."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers.dumps import seq_row, write_sequence_dump
from helpers.reference import round_metrics

import rollout_diag as rd
from rollout_diag.decisions.trends import ANOMALY_METRICS, find_anomalies, keep_largest
from rollout_diag.results import Anomaly, StepResult


# ------------------------------------------------------------------------------------------ anomalies
def series_steps(series: dict[str, np.ndarray]) -> list[StepResult]:
    length = len(next(iter(series.values())))
    return [StepResult(i, 8, 800, {name: float(values[i]) for name, values in series.items()}) for i in range(length)]


def stationary(draw, seed: int, steps: int = 400) -> dict[str, np.ndarray]:
    """One independent stationary series per anomaly metric."""
    rng = np.random.default_rng(seed)
    return {name: draw(rng, steps) for name in ANOMALY_METRICS}


HEAVY_TAILED = {
    "lognormal σ=0.5": lambda rng, n: rng.lognormal(-7.0, 0.5, n),
    "lognormal σ=1": lambda rng, n: rng.lognormal(-7.0, 1.0, n),
    "lognormal σ=2": lambda rng, n: rng.lognormal(-7.0, 2.0, n),
    "pareto α=2": lambda rng, n: 1e-3 * (rng.pareto(2.0, n) + 1.0),
    "pareto α=3": lambda rng, n: 1e-3 * (rng.pareto(3.0, n) + 1.0),
}


@pytest.mark.parametrize("family", sorted(HEAVY_TAILED))
def test_stationary_heavy_tailed_series_flag_at_most_one_percent(family):
    # 400 steps × 3 metrics per seed, 5 seeds: the old rule (3 × the median of 10) flagged ~5–20 % of these
    flagged, total = 0, 0
    for seed in range(5):
        steps = series_steps(stationary(HEAVY_TAILED[family], seed))
        flagged += len(find_anomalies(steps))
        total += len(steps) * len(ANOMALY_METRICS)
    assert flagged <= 0.01 * total, f"{family}: {flagged} of {total} flagged"


def test_planted_jump_is_found_and_ranked_first():
    series = stationary(lambda r, n: r.lognormal(-7.0, 0.3, n), seed=11, steps=200)
    k3 = series["rollout_corr/k3_kl"]
    k3[120] = 10.0 * float(np.median(k3[90:120]))
    smaller = series["rollout_corr/chi2_token"]
    smaller[150] = 6.0 * float(np.median(smaller[120:150]))  # a smaller jump, also beyond 5 spreads (e^1.5)
    anomalies = find_anomalies(series_steps(series))
    assert (anomalies[0].step, anomalies[0].metric) == (120, "rollout_corr/k3_kl")
    assert anomalies[0].factor == pytest.approx(10.0, rel=1e-12)
    assert [a.factor for a in anomalies] == sorted((a.factor for a in anomalies), reverse=True)
    assert {(a.step, a.metric) for a in anomalies} >= {(150, "rollout_corr/chi2_token")}


def test_a_jump_on_a_constant_series_is_flagged_and_a_zero_series_is_not():
    steps = [StepResult(i, 1, 10, {"rollout_corr/k3_kl": 0.0 if i < 20 else 1.0}) for i in range(25)]
    assert find_anomalies(steps) == []  # no positive baseline: "× the median" means nothing
    constant = [StepResult(i, 1, 10, {"rollout_corr/k3_kl": 2.0 if i == 12 else 0.5}) for i in range(20)]
    assert [(a.step, a.factor) for a in find_anomalies(constant)] == [(12, pytest.approx(4.0))]


def test_keep_largest_ranks_by_factor_and_counts_the_cut():
    anomalies = [Anomaly(step, "rollout_corr/k3_kl", float(step), 1.0, float(step % 7 + 1)) for step in range(60)]
    kept, cut = keep_largest(anomalies, limit=50)
    assert len(kept) == 50 and cut == 10
    assert [a.factor for a in kept] == sorted((a.factor for a in anomalies), reverse=True)[:50]
    assert keep_largest(anomalies[:3], limit=50) == (sorted(anomalies[:3], key=lambda a: -a.factor), 0)


def test_analysis_result_reports_anomalies_ranked_and_cut(tmp_path):
    # 40 steps; steps 20.. have a slowly growing mismatch: many flags of different size, more than the result keeps
    rows = []
    rng = np.random.default_rng(3)
    for step in range(40):
        spread = 0.01 if step < 12 else 0.01 * 1.5 ** (step - 11)
        for index in range(2):
            trainer = -rng.exponential(1.0, 30)
            rows.append(seq_row(step, f"s{step}-{index}", (trainer + rng.normal(0, spread, 30)).tolist(), trainer))
    path = write_sequence_dump(tmp_path / "growing.parquet", rows)
    result = rd.analyze(str(path), device="cpu")
    factors = [a.factor for a in result.anomalies]
    assert factors == sorted(factors, reverse=True)
    assert result.to_json()["anomalies_cut"] == result.anomalies_cut
    kept, cut = keep_largest(find_anomalies(result.steps), limit=2)
    assert kept == result.anomalies[:2] and cut == len(result.anomalies) + result.anomalies_cut - 2


# ------------------------------------------------------------------------------------------ rounds
def multi_turn_rows(late_round_rows: int, late_round_tokens: int) -> list[dict]:
    """Step 0: 10 rows with a 100-token round 0 (|δ| 0.01); ``late_round_rows`` of them also have a round 1
    of ``late_round_tokens`` tokens with |δ| = 0.5, after 5 environment tokens."""
    rows = []
    for index in range(10):
        trainer = [-1.0] * 100
        rollout = [-1.01] * 100
        mask = [1] * 100
        if index < late_round_rows:
            trainer += [-2.0] * 5 + [-1.0] * late_round_tokens
            rollout += [-7.0] * 5 + [-1.5] * late_round_tokens
            mask += [0] * 5 + [1] * late_round_tokens
        rows.append(seq_row(0, f"s{index}", rollout, trainer, mask))
    return rows


def test_a_round_of_51_tokens_of_one_row_is_not_named(tmp_path):
    path = write_sequence_dump(tmp_path / "one_row.parquet", multi_turn_rows(late_round_rows=1, late_round_tokens=51))
    run = rd.analyze(str(path), device="cpu").run.metrics
    assert run["per_round/round_1/logprob_abs_diff_mean"] > run["per_round/round_0/logprob_abs_diff_mean"]
    assert run["per_round/most_divergent_round"] == 0.0  # the old rule named round 1


def test_a_supported_late_round_is_named(tmp_path):
    path = write_sequence_dump(tmp_path / "supported.parquet", multi_turn_rows(late_round_rows=4, late_round_tokens=60))
    run = rd.analyze(str(path), device="cpu").run.metrics
    assert run["per_round/round_1/token_count"] == 240 and run["per_round/round_1/seq_count"] == 4
    assert run["per_round/most_divergent_round"] == 1.0


def test_round_support_rule_matches_the_reference(tmp_path):
    for late_rows, late_tokens in ((1, 51), (2, 150), (3, 70), (3, 60), (10, 1)):
        rows = multi_turn_rows(late_rows, late_tokens)
        path = write_sequence_dump(tmp_path / f"r{late_rows}-{late_tokens}.parquet", rows)
        run = rd.analyze(str(path), device="cpu").run.metrics
        reference_rows = [
            (np.array(r["trainer"]), np.array(r["rollout"]), np.array(r["mask"], dtype=np.float64)) for r in rows
        ]
        expected = round_metrics(reference_rows).get("per_round/most_divergent_round")
        assert run.get("per_round/most_divergent_round") == expected, (late_rows, late_tokens)


def test_no_round_with_support_names_none():
    # round 0: 30 rows × 2 tokens (60 < min(200, 1000/10)); round 1: one row's 1000 tokens (1 row < 3)
    mask = np.array([1.0, 1.0, 0.0] + [1.0] * 1000)
    rows = [(np.zeros(1003), np.full(1003, -0.5), mask)]
    rows += [(np.zeros(2), np.array([-0.5, -0.5]), np.ones(2))] * 29
    assert "per_round/most_divergent_round" not in round_metrics(rows)


# ------------------------------------------------------------------------------------------ std
def one_sequence_dump(tmp_path, tokens: int = 330, delta: float = 0.001):
    """One step with one sequence: under sequence-level IS every token carries the same weight exp(Σδ)."""
    trainer = [-1.0] * tokens
    rollout = [-1.0 - delta] * tokens
    return write_sequence_dump(tmp_path / "one_sequence.parquet", [seq_row(0, "only", rollout, trainer)])


def test_std_of_constant_weights_is_zero(tmp_path):
    # decoupled_seq_is_rs: sequence IS at 2.0 and seq_sum_k1 at 0.5_2.0. s = 330 × 0.001 (float32-rounded) ≈ 0.33:
    # every c = exp(s) ≈ 1.39 < 2, every seq_sum_k1 statistic = −s, inside [log 0.5, log 2]: both stds are 0
    # (the old code gave sqrt(ε/N)·|mean| ≈ 7.7e-6 and 1.8e-6)
    path = one_sequence_dump(tmp_path)
    result = rd.compare_presets(str(path), ["decoupled_seq_is_rs"], device="cpu")
    for metrics in (result.presets[0].run.metrics, result.presets[0].steps[0].metrics):
        assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(math.exp(0.33), rel=1e-3)
        assert abs(metrics["rollout_corr/rollout_is_std"]) <= 1e-12
        assert abs(metrics["rollout_corr/rollout_rs_seq_sum_k1_std"]) <= 1e-12
        assert metrics["rollout_corr/rollout_is_seq_std"] == 0.0  # one row: fewer than 2 values
        assert metrics["rollout_corr/rollout_is_eff_sample_size"] == pytest.approx(1.0, rel=1e-7)  # ε guards


def test_std_of_constant_token_weights_is_zero_for_every_family(tmp_path):
    # token-level presets see one weight exp(0.001) at every token; the legacy family and the debug std too
    path = one_sequence_dump(tmp_path, tokens=1000)
    presets = ["decoupled_token_is", "decoupled_token_icepop", "decoupled_k3_rs_token_tis", "legacy_token_truncate"]
    result = rd.compare_presets(str(path), presets, device="cpu")
    for preset in result.presets:
        stds = {k: v for k, v in preset.run.metrics.items() if k.endswith("_std")}
        assert stds, preset.name
        for name, value in stds.items():
            assert abs(value) <= 1e-12, (preset.name, name, value)
    debug = rd.analyze(str(path), device="cpu").run.metrics
    assert abs(debug["training/rollout_probs_diff_std"]) <= 1e-12


# ------------------------------------------------------------------------------------------ shares
def test_preset_table_and_sweep_share_one_sequence_denominator(tmp_path):
    # 12 rows, one of them without a model token: a share of sequences is over the 11 rows that have one
    rng = np.random.default_rng(8)
    rows = []
    for index in range(12):
        trainer = -rng.exponential(1.0, 20)
        rollout = np.minimum(trainer + rng.normal(0.0, 0.05 * (index + 1), 20), 0.0)
        mask = [0] * 20 if index == 5 else [1] * 20
        rows.append(seq_row(0, f"s{index}", rollout.tolist(), trainer.tolist(), mask))
    path = write_sequence_dump(tmp_path / "empty_row.parquet", rows)
    result = rd.compare_presets(str(path), ["decoupled_seq_is_rs", "decoupled_geo_rs", "decoupled_k3_rs"], device="cpu")
    sweep = {row.option: row for row in result.sweep}
    option_of = {
        "decoupled_seq_is_rs": "seq_sum_k1",
        "decoupled_geo_rs": "seq_mean_k1",
        "decoupled_k3_rs": "seq_mean_k3",
    }
    rejected_somewhere = False
    for preset in result.presets:
        metrics = preset.run.metrics
        share = metrics["summary/rejected_row_fraction"]
        assert share == sweep[option_of[preset.name]].default_share, preset.name
        assert share == metrics["summary/rows_rejected"] / 11
        rejected_somewhere |= 0 < share < 1
    assert rejected_somewhere, "the data must reject some rows and keep others"
