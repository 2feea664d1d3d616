"""The 2026 fingerprints (issue 41): truncated sampling logprobs, temperature on the real relation, retokenization at
turn boundaries and resume spikes. Each is planted in data sampled from real distributions (tests/helpers/sampling.py:
logits, a sampled token, trainer = log softmax(z)[tok], rollout = the processed distribution's logprob) or in the real
dump, and each must be silent on clean data and on the bundled samples. The other hints' plants are in
tests/test_hints.py, which checks these four stay silent on them.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.dumps import sequence_table, write_table
from helpers.sampling import Processing, sample, sampled_rows

import rollout_diag as rd
from rollout_diag.decisions.hints import processed_logprobs, top_p_truncation
from rollout_diag.decisions.resume import resume_steps, resume_windows
from rollout_diag.report import render_report
from rollout_diag.results import Evidence

REPO = Path(__file__).resolve().parents[2]
REAL = REPO / "sample_data" / "textgenrnn_bf16_vs_fp32.parquet"
MULTITURN = REPO / "sample_data" / "synthetic_multiturn.parquet"
NEW_HINTS = {"top_p_truncation", "processed_logprobs", "retokenization", "resume_spike"}


def analyze(tmp_path: Path, made: list[dict], name: str = "dump.parquet", **options):
    return rd.analyze(str(write_table(tmp_path / name, sequence_table(made))), device="cpu", **options)


def ids(result) -> list[str]:
    return [hint.id for hint in result.hints]


# ------------------------------------------------------------------------------------------ the simulator
def test_the_simulator_samples_from_the_processed_distribution():
    rng = np.random.default_rng(0)
    drawn = sample(rng, 4000, Processing(top_p=0.9))
    # top-p: r = a − log M for every token, so ρ = exp(a − r) is the kept mass, and M ≥ top_p
    assert np.allclose(np.exp(drawn["trainer"] - drawn["rollout"]), drawn["kept"], rtol=1e-9)
    assert drawn["kept"].min() >= 0.9 - 1e-12
    warm = sample(rng, 4000, Processing(temperature=0.7))
    # temperature: r = a / T + c with c ≥ 0 (T < 1), so a ≤ T·r, equal only where the distribution is peaked
    assert (warm["trainer"] <= 0.7 * warm["rollout"] + 1e-9).all()
    assert not np.allclose(warm["rollout"], warm["trainer"] / 0.7, atol=1e-3)


# ------------------------------------------------------------------------------------------ sampling processing
@pytest.mark.parametrize(
    ("processing", "expected"),
    [
        (Processing(top_p=0.8), "top_p_truncation"),
        (Processing(top_p=0.95), "top_p_truncation"),
        (Processing(top_k=20), "top_p_truncation"),
        (Processing(temperature=0.7), "processed_logprobs"),
        (Processing(temperature=0.9), "processed_logprobs"),
        (Processing(temperature=1.3), "processed_logprobs"),
    ],
)
def test_each_processing_is_named_and_not_the_other(tmp_path, processing, expected):
    result = analyze(tmp_path, sampled_rows(1, processing))
    found = set(ids(result)) & NEW_HINTS
    assert found == {expected}, ids(result)
    assert result.verdict.cause == "pipeline" and result.verdict.findings[0] == expected


@pytest.mark.parametrize("top_p", [0.8, 0.9, 0.95])
def test_top_p_truncation_estimates_the_kept_mass(tmp_path, top_p):
    made = sampled_rows(2, Processing(top_p=top_p))
    hint = next(h for h in analyze(tmp_path, made).hints if h.id == "top_p_truncation")
    # every token's ρ is its context's kept mass M ∈ [top_p, 1): exp(mean δ) is their geometric mean
    assert top_p <= hint.evidence["kept_mass"] < 1.0
    assert hint.evidence["one_sided_share"] > 0.95 and hint.steps and "top_p" in hint.look_at


def test_trainer_side_truncation_is_named_too(tmp_path):
    made = sampled_rows(3, Processing(top_p=0.85))
    for row in made:  # the trainer renormalised instead: the two columns swapped
        row["trainer"], row["rollout"] = row["rollout"], row["trainer"]
    hint = next(h for h in analyze(tmp_path, made).hints if h.id == "top_p_truncation")
    assert "trainer logprobs come from a truncated" in hint.message


@pytest.mark.parametrize("seed", range(4))
def test_clean_sampled_data_shows_none_of_them(tmp_path, seed):
    assert not set(ids(analyze(tmp_path, sampled_rows(seed, numerics=0.02)))) & NEW_HINTS


@pytest.mark.parametrize("sample_file", [REAL, MULTITURN])
def test_the_bundled_samples_show_none_of_them(sample_file):
    result = rd.analyze(str(sample_file), device="cpu")
    assert not set(ids(result)) & NEW_HINTS
    assert all(a.resume is None for a in result.anomalies)


def test_rules_on_hand_built_buckets():
    def evidence(buckets: list[tuple[float, float, float, float]]) -> Evidence:
        # (tokens, Σδ, Σ|δ|, Σy²) per rollout-probability bucket
        run = {
            "tokens": sum(b[0] for b in buckets),
            "probability_buckets": [{"tokens": n, "delta": d, "abs": a, "y": a, "y2": y2} for n, d, a, y2 in buckets],
        }
        return Evidence(run=run, steps={})

    # truncation: every bucket's δ < 0; mean δ over 400 tokens = −20 / 400 = −0.05 → kept mass e^−0.05 = 0.951
    truncated = evidence([(100, -5.0, 5.0, 0.3), (100, -5.0, 5.0, 0.3), (100, -5.0, 5.0, 0.3), (100, -5.0, 5.0, 0.3)])
    hint = top_p_truncation(truncated)
    assert hint is not None and hint.evidence["kept_mass"] == pytest.approx(math.exp(-0.05))
    assert processed_logprobs(truncated) is None
    # temperature T < 1: likely tokens δ < 0, unlikely ones δ > 0 (t = ±5 / √0.3 ≈ ±9)
    warm = evidence([(100, -5.0, 5.0, 0.3), (100, -2.0, 2.5, 0.1), (100, 0.1, 3.0, 0.2), (100, 5.0, 5.0, 0.3)])
    assert top_p_truncation(warm) is None
    assert processed_logprobs(warm).evidence["sharper_rollout"] == 1.0
    # noise: no bucket leans
    noise = evidence([(100, 0.05, 1.0, 0.02), (100, -0.05, 1.0, 0.02), (100, 0.02, 1.0, 0.02), (100, -0.1, 1.0, 0.02)])
    assert top_p_truncation(noise) is None and processed_logprobs(noise) is None


# ------------------------------------------------------------------------------------------ retokenization
def retokenize(table: pa.Table, k: int = 2, scale: float = 0.6, seed: int = 0) -> pa.Table:
    """The real dump with the first k model tokens after each environment segment scored on other token ids: their
    rollout logprob moved by N(0, scale), kept ≤ 0 (rounds ≥ 1 only: round 0's first tokens stay)."""
    rng = np.random.default_rng(seed)
    rows = table.to_pydict()
    for index, (mask, trainer, rollout) in enumerate(
        zip(rows["response_mask"], rows["old_log_probs"], rows["rollout_log_probs"], strict=True)
    ):
        new = list(rollout)
        for t in range(1, len(mask)):
            if mask[t] == 1 and mask[t - 1] == 0 and 1 in mask[:t]:
                for u in range(t, min(t + k, len(mask))):
                    if mask[u] == 1:
                        new[u] = min(trainer[u] - float(rng.normal(0.0, scale)), 0.0)
        rows["rollout_log_probs"][index] = new
    return pa.table(rows, schema=table.schema)


def test_retokenization_planted_in_the_real_dump(tmp_path):
    path = write_table(tmp_path / "retokenized.parquet", retokenize(pq.read_table(REAL)))
    result = rd.analyze(str(path), device="cpu")
    hint = next(h for h in result.hints if h.id == "retokenization")
    assert hint.evidence["k"] == 2 and hint.evidence["factor"] > 3
    assert "first_token" not in ids(result) and "turn_growth" not in ids(result)
    assert result.verdict.cause == "pipeline" and "token ids" in result.verdict.sentence


def test_every_turn_start_is_first_token_not_retokenization(tmp_path):
    # round 0's first tokens as bad as the later rounds': a template / boundary problem of every turn
    table = pq.read_table(REAL)
    rows = table.to_pydict()
    rng = np.random.default_rng(1)
    for index, (mask, trainer) in enumerate(zip(rows["response_mask"], rows["old_log_probs"], strict=True)):
        new = list(rows["rollout_log_probs"][index])
        for t in range(len(mask)):
            if mask[t] == 1 and (t == 0 or mask[t - 1] == 0):
                new[t] = min(trainer[t] - float(rng.normal(0.0, 0.6)), 0.0)
        rows["rollout_log_probs"][index] = new
    result = rd.analyze(str(write_table(tmp_path / "first.parquet", pa.table(rows, schema=table.schema))), device="cpu")
    assert "retokenization" not in ids(result)


# ------------------------------------------------------------------------------------------ resume
def resumed(seed: int = 0, resume: int = 10, last: int = 15, spike: float = 0.3) -> list[dict]:
    """Steps 0..last−1 of a clean run, then the run resumed at ``resume`` (the same steps again and on), its first 3
    steps with a rollout-side noise of ``spike``: one file whose steps go back, as an appended dump reads."""
    first = sampled_rows(seed, steps=last, rows_per_step=8)
    again = sampled_rows(seed + 1, first_step=resume, steps=3, rows_per_step=8, spread=spike)
    again += sampled_rows(seed + 2, first_step=resume + 3, steps=last - resume, rows_per_step=8)
    for row in again:
        row["sample_id"] = "resumed-" + row["sample_id"]
    return first + again


def test_resume_spike_in_one_file_whose_steps_go_back(tmp_path):
    result = analyze(tmp_path, resumed())
    hint = next(h for h in result.hints if h.id == "resume_spike")
    assert hint.evidence["resume_step"] == 10 and hint.steps == [10, 11, 12]
    assert "Resume at step 10" in hint.message
    flagged = [a for a in result.anomalies if 10 <= a.step <= 12]
    assert flagged and all(a.resume == 10 for a in flagged)
    assert all(a.resume is None for a in result.anomalies if a.step not in (10, 11, 12))
    assert not any(t.summary and "rising" in t.summary for t in result.trends)
    document = result.to_json()
    assert all(item.get("resume") == 10 for item in document["anomalies"] if 10 <= item["step"] <= 12)


def test_resume_across_two_run_directories(tmp_path):
    made = resumed(seed=3, spike=0.5)
    first = [row for row in made if not row["sample_id"].startswith("resumed-")]
    second = [row for row in made if row["sample_id"].startswith("resumed-")]
    folder = tmp_path / "runs"
    for name, part in (("run-1", first), ("run-2", second)):
        (folder / name).mkdir(parents=True)
        write_table(folder / name / "dump.parquet", sequence_table(part))
    result = rd.analyze(str(folder), device="cpu")
    hint = next(h for h in result.hints if h.id == "resume_spike")
    assert hint.evidence["resume_step"] == 10
    # the three resumed steps carry most of the run's mismatch: the verdict names the restart first
    assert result.verdict.cause == "pipeline" and result.verdict.findings == ["resume_spike"]


def test_per_rank_files_holding_every_step_are_no_resume(tmp_path):
    folder = tmp_path / "ranks"
    folder.mkdir()
    for rank in range(3):
        write_table(folder / f"rank-{rank}.parquet", sequence_table(sampled_rows(rank, steps=12, rows_per_step=4)))
    result = rd.analyze(str(folder), device="cpu")
    assert "resume_spike" not in ids(result) and all(a.resume is None for a in result.anomalies)


def test_a_resume_without_a_jump_is_no_hint(tmp_path):
    assert "resume_spike" not in ids(analyze(tmp_path, resumed(spike=0.0)))


def test_policy_version_going_back_is_a_resume(tmp_path):
    made = sampled_rows(5, steps=10, rows_per_step=8) + sampled_rows(
        6, first_step=10, steps=3, rows_per_step=8, spread=0.3
    )
    made += sampled_rows(7, first_step=13, steps=3, rows_per_step=8)
    table = sequence_table(made)
    versions = [row["step"] if row["step"] < 10 else row["step"] - 10 for row in made]  # the counter restarts
    table = table.append_column("policy_version", pa.array(versions, pa.int64()))
    result = rd.analyze(str(write_table(tmp_path / "v.parquet", table)), device="cpu")
    assert next(h for h in result.hints if h.id == "resume_spike").evidence["resume_step"] == 10


def test_resume_steps_from_hand_built_pieces():
    def evidence(files: dict, steps: dict | None = None) -> Evidence:
        return Evidence(run={"tokens": 1.0}, steps=steps or {}, files=files)

    # (first row, first step, last step, min, max, back row, back step)
    appended = {"dump.parquet": [(0, 0, 20, 0, 20, 80, 15)]}
    assert resume_steps(evidence(appended)) == [15]
    ranks = {"rank-0.parquet": [(0, 0, 9, 0, 9, -1, -1)], "rank-1.parquet": [(0, 0, 9, 0, 9, -1, -1)]}
    assert resume_steps(evidence(ranks)) == []
    runs = {"a/step=1.parquet": [(0, 1, 1, 1, 1, -1, -1)], "a/step=2.parquet": [(0, 2, 2, 2, 2, -1, -1)]}
    runs["b/step=2.parquet"] = [(0, 2, 2, 2, 2, -1, -1)]  # a second run directory starting again at step 2
    assert resume_steps(evidence(runs)) == []  # the same step again is no step back
    runs["b/step=1.parquet"] = [(0, 1, 1, 1, 1, -1, -1)]
    assert resume_steps(evidence(runs)) == []  # back to the first step: a layout, not a resume
    versions = {s: {"version_min": float(v), "version_max": float(v)} for s, v in enumerate([0, 1, 2, 3, 0, 1])}
    assert resume_steps(evidence({}, versions)) == [4]
    assert resume_windows([4], [0, 1, 2, 3, 4, 5, 7, 9]) == {4: 4, 5: 4, 7: 4}


# ------------------------------------------------------------------------------------------ report
def test_the_report_shows_the_new_hints(tmp_path):
    result = analyze(tmp_path, resumed())
    html = render_report(result)
    assert "resume_spike" in html and "Resume at step 10" in html and "resume at step 10" in html
    truncated = analyze(tmp_path, sampled_rows(1, Processing(top_p=0.9)), "p.parquet")
    assert "top_p_truncation" in render_report(truncated)


# ------------------------------------------------------------------------------------------ side columns
def test_rollout_token_ids_name_the_first_difference(tmp_path):
    table = retokenize(pq.read_table(REAL))
    rows = table.to_pydict()
    rollout_ids, first = [], None
    for index, (mask, trainer_ids) in enumerate(zip(rows["response_mask"], rows["token_ids"], strict=True)):
        other = list(trainer_ids)
        for t in range(1, len(mask)):
            if mask[t] == 1 and mask[t - 1] == 0 and 1 in mask[:t]:
                other[t] = trainer_ids[t] + 1  # the engine's id of the boundary token: another split
                first = first or (rows["step"][index], index, t)
        rollout_ids.append(other)
    with_ids = table.append_column("rollout_token_ids", pa.array(rollout_ids, pa.list_(pa.int64())))
    result = rd.analyze(str(write_table(tmp_path / "ids.parquet", with_ids)), device="cpu")
    hint = next(h for h in result.hints if h.id == "retokenization")
    changed = sum(
        a != b for x, y in zip(rows["token_ids"], rollout_ids, strict=True) for a, b in zip(x, y, strict=True)
    )
    assert hint.evidence["token_id_mismatches"] == changed and hint.evidence["k"] == 2
    step, row, position = first
    assert (hint.rows[0].step, hint.rows[0].row, hint.evidence["first_position"]) == (step, row, position)
    assert f"position {position}" in hint.message
    same = pq.read_table(REAL)
    same = same.append_column("rollout_token_ids", same.column("token_ids"))
    assert "retokenization" not in ids(rd.analyze(str(write_table(tmp_path / "same.parquet", same)), device="cpu"))


def test_a_kept_mass_column_decides_top_p(tmp_path):
    rng = np.random.default_rng(4)
    made, clean = [], []
    for step in range(3):
        for index in range(16):
            truncated = sample(rng, 64, Processing(top_p=0.9), numerics=0.01)
            full = sample(rng, 64, Processing(), numerics=0.01)
            for out, drawn, kept in ((made, truncated, truncated["kept"]), (clean, full, np.full(64, 0.9))):
                out.append(
                    {
                        "step": step,
                        "sample_id": f"s{step}-{index}",
                        "rollout": drawn["rollout"].tolist(),
                        "trainer": drawn["trainer"].tolist(),
                        "mask": [1] * 64,
                        "kept": kept.tolist(),
                    }
                )

    def written(rows: list[dict], name: str) -> Path:
        table = sequence_table(rows).append_column(
            "kept_mass", pa.array([r["kept"] for r in rows], pa.list_(pa.float64()))
        )
        return write_table(tmp_path / name, table)

    hint = next(
        h for h in rd.analyze(str(written(made, "kept.parquet")), device="cpu").hints if h.id == "top_p_truncation"
    )
    expected = math.exp(np.mean([math.log(k) for r in made for k in r["kept"]]))
    assert hint.evidence["kept_mass"] == pytest.approx(expected, rel=1e-6) and hint.evidence["unexplained_share"] < 0.2
    # a kept mass recorded while the engine reports the full distribution's logprobs: δ does not follow it
    assert "top_p_truncation" not in ids(rd.analyze(str(written(clean, "full.parquet")), device="cpu"))
