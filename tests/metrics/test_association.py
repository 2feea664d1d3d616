"""Mismatch against the trainer's own columns (rollout_diag/metrics/association.py, decisions/association.py): the
rank correlations on planted data with a known Spearman's ρ, their intervals, the bounded row sample (the same for any
chunking and worker count), the GRPO group rule on planted groups, and silence without trainer columns."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jsonschema
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.trainer_columns import planted, write_rows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rollout_diag as rd
from rollout_diag.cli import app
from rollout_diag.metrics import association
from rollout_diag.metrics.association import fisher_interval, poisson_binomial_tail, ranks, spearman
from rollout_diag.results import AnalysisResult
from rollout_diag.results.wording import trainer_column_lines
from tests.helpers.cli import runner

SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "result.schema.json"


def test_spearman_on_a_known_permutation(tmp_path):
    # reward = i, row mismatch ranked by the permutation p: ρ = 1 − 6 Σ (i − p_i)² / (n (n² − 1)); n = 10,
    # p = (1, 0, 3, 2, 5, 4, 7, 6, 9, 8): each d = ±1, Σ d² = 10, ρ = 1 − 60 / 990 = 0.93939…
    permutation = [1, 0, 3, 2, 5, 4, 7, 6, 9, 8]
    mismatch = [0.01 * (1 + rank) for rank in permutation]
    dump = write_rows(tmp_path / "known.parquet", mismatch, reward=[float(i) for i in range(10)])
    result = rd.analyze(str(dump), device="cpu")
    found = {item.role: item for item in result.trainer_columns.correlations}
    assert found["reward"].rows == 10 and found["reward"].column == "reward"
    assert found["reward"].spearman == pytest.approx(1 - 60 / 990, rel=1e-12)
    # Fisher z with the Bonett–Wright standard error, by hand: atanh(ρ) ± 1.96 · sqrt((1 + ρ²/2) / 7)
    rho = 1 - 60 / 990
    spread = 1.959963984540054 * math.sqrt((1 + rho * rho / 2) / 7)
    assert found["reward"].ci_low == pytest.approx(math.tanh(math.atanh(rho) - spread), rel=1e-12)
    assert found["reward"].ci_high == pytest.approx(math.tanh(math.atanh(rho) + spread), rel=1e-12)
    # the points in the sample's (hash) order; |d| = m up to verl's 1e-8 in the row means' denominators
    pairs = sorted(zip(found["reward"].points["x"], found["reward"].points["y"], strict=True))
    assert [x for x, _ in pairs] == [float(i) for i in range(10)]
    assert [y for _, y in pairs] == pytest.approx(mismatch, rel=1e-8)
    assert not found["reward"].significant  # 10 rows: under the 30 the rule needs
    # every row has 3 model tokens: response length is constant, ρ undefined
    assert math.isnan(found["response_length"].spearman)


def test_ranks_and_ties_against_a_slow_reference():
    values = np.array([3.0, 1.0, 3.0, 2.0, 3.0, 0.5])
    # by hand: 0.5 → 1, 1 → 2, 2 → 3, the three 3s share ranks 4, 5, 6 → 5
    assert ranks(values).tolist() == [5.0, 2.0, 5.0, 3.0, 5.0, 1.0]
    generator = np.random.default_rng(3)
    x, y = generator.integers(0, 5, 200).astype(float), generator.normal(size=200)

    def pearson(a, b):
        a, b = a - a.mean(), b - b.mean()
        return float((a * b).sum() / math.sqrt((a * a).sum() * (b * b).sum()))

    def slow_ranks(values):
        return np.array([(values < v).sum() + ((values == v).sum() + 1) / 2 for v in values])

    assert spearman(x, y) == pytest.approx(pearson(slow_ranks(x), slow_ranks(y)), rel=1e-12)
    assert math.isnan(spearman(np.ones(5), np.arange(5.0)))
    assert all(math.isnan(v) for v in fisher_interval(0.5, 3))


def test_planted_correlation_stands_out_and_unrelated_column_stays_silent(tmp_path):
    result = rd.analyze(str(planted(tmp_path)), device="cpu")
    found = {item.role: item for item in result.trainer_columns.correlations}
    assert found["reward"].spearman > 0.7 and found["reward"].significant
    assert found["advantage"].significant
    assert abs(found["entropy"].spearman) < 0.15 and not found["entropy"].significant
    lines = trainer_column_lines(result.trainer_columns)
    assert any(line.startswith("row |log-ppl diff| rises with reward (Spearman") for line in lines)
    assert not any("entropy" in line for line in lines)
    from rollout_diag.results.wording import where

    assert set(lines) <= set(where(result))  # the terminal's "Where:" and the report's "What stands out"


def test_sample_is_bounded_and_the_same_for_any_chunking_and_workers(tmp_path, monkeypatch):
    monkeypatch.setattr(association.TrainerColumnsTracker.__init__, "__defaults__", (64, association.SEED))
    dump = planted(tmp_path, rows=500)
    documents = [
        rd.analyze(str(dump), device="cpu", chunk_tokens=size, workers=1).trainer_columns.to_json()
        for size in (37, 1 << 20)
    ]
    documents.append(rd.analyze(str(dump), device="cpu", chunk_tokens=61, workers=2).trainer_columns.to_json())
    assert documents[0]["sampled_rows"] == 64 and documents[0]["rows"] == 500
    assert documents[0] == documents[1] == documents[2]


def test_large_samples_are_drawn_as_a_2d_histogram(tmp_path, monkeypatch):
    monkeypatch.setattr(association, "SCATTER_POINTS", 100)
    result = rd.analyze(str(planted(tmp_path, rows=300)), device="cpu")
    reward = next(item for item in result.trainer_columns.correlations if item.role == "reward")
    assert reward.points is None and sum(map(sum, reward.histogram["counts"])) == 300
    assert len(reward.histogram["x_edges"]) == association.HISTOGRAM_BINS + 1


def groups_dump(tmp_path: Path) -> Path:
    """10 groups of 4 rows (advantages 1, 2, 3, 4); the worst row is the advantage-4 one in 8 groups, the
    advantage-1 one in 2; one more group with equal advantages (not counted) and one of a single row (not counted)."""
    mismatch, advantage, uid, step = [], [], [], []
    for group in range(10):
        worst = 3 if group < 8 else 0
        for index in range(4):
            mismatch.append(0.5 if index == worst else 0.01 * (index + 1))
            advantage.append(float(index + 1))
            uid.append(group % 5)  # the same ids in step 0 and step 1: groups are (step, uid)
            step.append(group // 5)
    for index in range(3):
        mismatch.append(0.2 + index)
        advantage.append(0.0)
        uid.append(7)
        step.append(0)
    mismatch.append(0.9)
    advantage.append(1.0)
    uid.append(8)
    step.append(0)
    return write_rows(tmp_path / "groups.parquet", mismatch, advantage=advantage, uid=uid, step=step)


def test_group_rule_on_planted_groups(tmp_path):
    result = rd.analyze(str(groups_dump(tmp_path)), columns={"sample_id": "sample_id"}, device="cpu")
    groups = result.trainer_columns.groups
    assert (groups.column, groups.ranked_by) == ("uid", "advantage")
    assert (groups.groups_seen, groups.groups, groups.worst_is_best) == (12, 10, 8)
    assert groups.expected == pytest.approx(10 * 0.25, rel=1e-12)  # one top-advantage row of 4 in each group
    # P(Binomial(10, 1/4) ≥ 8), by hand
    tail = sum(math.comb(10, k) * 0.25**k * 0.75 ** (10 - k) for k in range(8, 11))
    assert groups.p_value == pytest.approx(tail, rel=1e-9)
    assert groups.significant
    (line,) = [line for line in trainer_column_lines(result.trainer_columns) if "group" in line]
    assert "highest-advantage sample in 8 of 10 groups (chance: 2.5)" in line and "IS would cut" in line


def test_poisson_binomial_exact_and_normal_agree():
    probabilities = np.full(400, 0.25)
    exact = poisson_binomial_tail(probabilities, 120)
    monkeypatched = association.EXACT_GROUPS
    try:
        association.EXACT_GROUPS = 10
        approximate = poisson_binomial_tail(probabilities, 120)
    finally:
        association.EXACT_GROUPS = monkeypatched
    assert approximate == pytest.approx(exact, rel=0.1)
    assert poisson_binomial_tail(probabilities, 0) == 1.0


def test_silence_without_trainer_columns_and_json_round_trip(tmp_path):
    plain = write_rows(tmp_path / "plain.parquet", [0.01 * i for i in range(40)])
    result = rd.analyze(str(plain), device="cpu")
    assert result.trainer_columns is None and result.to_json()["trainer_columns"] is None
    done = runner.invoke(app, ["analyze", str(planted(tmp_path)), "-f", "json"])
    document = json.loads(done.stdout)
    jsonschema.validate(document, json.loads(SCHEMA.read_text()))
    back = AnalysisResult.from_json(document)
    assert back.trainer_columns.to_json() == document["trainer_columns"]
    table = runner.invoke(app, ["analyze", str(planted(tmp_path))], env={"COLUMNS": "200"})
    assert "rises with reward" in table.stdout


def test_per_token_entropy_lists_enter_as_their_row_mean(tmp_path):
    # row i: entropy list [i, i + 2, null] → mean over non-null elements i + 1; mismatch rises with i: ρ = 1
    rows = 40
    dump = write_rows(
        tmp_path / "entropy.parquet",
        [0.001 * (1 + i) for i in range(rows)],
        entropy=[[float(i), float(i + 2), None] for i in range(rows)],
    )
    result = rd.analyze(str(dump), device="cpu")
    entropy = next(item for item in result.trainer_columns.correlations if item.role == "entropy")
    assert entropy.spearman == pytest.approx(1.0, rel=1e-12) and entropy.significant
    assert sorted(entropy.points["x"]) == [float(i + 1) for i in range(rows)]
    worst = result.worst_rows[0]
    assert worst.extra["entropy"] == pytest.approx(float(rows))  # the worst row (i = 39) carries its mean, 40


def test_group_rule_from_sample_ids_written_id_hash_k(tmp_path):
    # verl's and SkyRL's importers (and DumpWriter) write a prompt's k-th response as "<uid>#<k>": the group is <uid>
    mismatch, advantage = [], []
    for _ in range(12):
        for index in range(3):  # the worst row is the top-advantage one in every group
            mismatch.append(0.3 if index == 2 else 0.01 * (index + 1))
            advantage.append(float(index))
    path = write_rows(tmp_path / "verl.parquet", mismatch, advantage=advantage)
    table = pq.read_table(path)
    ids = pa.array([f"u{row // 3}#{row % 3}" for row in range(len(mismatch))])
    pq.write_table(table.set_column(table.schema.get_field_index("sample_id"), "sample_id", ids), path)
    groups = rd.analyze(str(path), device="cpu").trainer_columns.groups
    assert (groups.column, groups.groups, groups.worst_is_best) == ("prompt (sample id prefix)", 12, 12)
    assert groups.expected == pytest.approx(4.0) and groups.significant  # 12 groups × 1/3


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chunk_tokens=st.integers(min_value=3, max_value=400), sample=st.sampled_from([16, 50, 1000]))
def test_any_chunking_gives_the_same_sample_and_groups(tmp_path, monkeypatch, chunk_tokens, sample):
    # chunks that do not divide the rows (113-row style): the bottom-k sample and the per-group state merge exactly
    monkeypatch.setattr(association.TrainerColumnsTracker.__init__, "__defaults__", (sample, association.SEED))
    dump = planted(tmp_path, rows=113, seed=5)
    whole = rd.analyze(str(dump), device="cpu", workers=1).trainer_columns.to_json()
    chunked = rd.analyze(str(dump), device="cpu", workers=1, chunk_tokens=chunk_tokens).trainer_columns.to_json()
    assert chunked == whole and whole["sampled_rows"] == min(sample, 113)


def test_group_rule_from_the_readers_prompt_key(tmp_path):
    # no group column, plain sample ids: the prompt is the token ids before the first model token (io/prompts.py)
    rows = []
    for index in range(36):
        group, member = divmod(index, 3)
        shift = 0.3 if member == 2 else 0.01 * (member + 1)  # the worst row is the top-advantage one in every group
        rows.append(
            {
                "step": 0,
                "sample_id": f"s{index}",
                "rollout_log_probs": [0.0] + [-1.0 - shift] * 3,
                "old_log_probs": [0.0, -1.0, -1.0, -1.0],
                "response_mask": [0, 1, 1, 1],
                "token_ids": [1000 + group, 5, 6, 7],
                "advantage": float(member),
            }
        )
    path = tmp_path / "prompts.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    groups = rd.analyze(str(path), device="cpu").trainer_columns.groups
    assert groups.column.startswith("prompt (") and (groups.groups, groups.worst_is_best) == (12, 12)
