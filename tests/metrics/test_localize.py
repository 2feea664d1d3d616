"""Localisation (issue 5) against brute force, and chunking / order / file-split invariance of everything."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers.localize import assert_same
from helpers.metrics import random_rows, write_dump
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rollout_diag as rd
from rollout_diag.decisions.trends import change_point, find_anomalies, least_squares, t_quantile_975
from rollout_diag.results import StepResult


def model_tokens(steps: dict[int, list[dict]]):
    """(step, sample_id, position, round, δ) of every model token, by plain loops."""
    out = []
    for step, rows in steps.items():
        for row in rows:
            round_index, previous = -1, 0
            for position, mask in enumerate(row["mask"]):
                if mask and not previous:
                    round_index += 1
                previous = mask
                if mask:
                    delta = float(row["trainer"][position]) - float(row["rollout"][position])
                    out.append((step, f"{step}-{row['sample_id']}", position, round_index, delta))
    return out


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    rng = np.random.default_rng(11)
    steps = {step: random_rows(rng, 25, max_len=70) for step in range(4)}
    path = tmp_path_factory.mktemp("loc") / "dump.parquet"
    write_dump(path, steps, row_group_size=7)
    return steps, str(path)


def test_worst_tokens_are_the_largest_abs_delta(dump):
    steps, path = dump
    result = rd.analyze(path, device="cpu", top_k=7, chunk_tokens=101)
    expected = sorted(model_tokens(steps), key=lambda t: -abs(t[4]))[:7]
    got = [(t.step, t.sample_id, t.position, t.round, t.log_ratio) for t in result.worst_tokens]
    assert [g[:4] for g in got] == [e[:4] for e in expected]
    assert [g[4] for g in got] == pytest.approx([e[4] for e in expected], rel=1e-12)


def test_worst_rows_by_log_ppl_diff(dump):
    steps, path = dump
    result = rd.analyze(path, device="cpu", top_k=5, chunk_tokens=64)
    scores = []
    for step, rows in steps.items():
        for row in rows:
            mask = row["mask"].astype(bool)
            if not mask.any():
                continue
            n = mask.sum()
            d = (row["rollout"][mask].astype(float).sum() - row["trainer"][mask].astype(float).sum()) / (n + 1e-8)
            scores.append((abs(d), f"{step}-{row['sample_id']}"))
    expected = [sid for _, sid in sorted(scores, reverse=True)[:5]]
    got = [r.sample_id for r in result.worst_rows if r.criterion == "log_ppl_abs_diff"]
    assert got == expected
    worst = next(r for r in result.worst_rows if r.criterion == "max_abs_diff")
    assert worst.max_abs_diff == pytest.approx(max(abs(t[4]) for t in model_tokens(steps)), rel=1e-12)
    # the kept token strips belong to the listed rows and hold every token of the row
    strip = next(t for t in result.worst_row_tokens if t.sample_id == got[0])
    row = next(r for s, rows in steps.items() for r in rows if f"{s}-{r['sample_id']}" == got[0])
    assert strip.mask == row["mask"].tolist()


def test_position_buckets_and_catastrophic_share(dump):
    steps, path = dump
    result = rd.analyze(path, device="cpu", catastrophic=0.5)
    buckets: dict[int, list[float]] = {}
    for _, _, position, _, delta in model_tokens(steps):
        bucket = 0 if position == 0 else math.floor(math.log2(position)) + 1
        buckets.setdefault(bucket, []).append(delta)
    run = [p for p in result.positions if p["step"] is None]
    assert [p["token_count"] for p in run] == [len(buckets[b]) for b in sorted(buckets)]
    for entry, bucket in zip(run, sorted(buckets), strict=True):
        deltas = buckets[bucket]
        assert entry["start"] == (0 if bucket == 0 else 2 ** (bucket - 1))
        assert entry["logprob_abs_diff_mean"] == pytest.approx(sum(map(abs, deltas)) / len(deltas), rel=1e-12)
        assert entry["catastrophic_share"] == pytest.approx(sum(abs(d) > 0.5 for d in deltas) / len(deltas))
    catastrophic = sum(abs(t[4]) > 0.5 for t in model_tokens(steps))
    assert result.run.metrics["diag/catastrophic_tokens"] == catastrophic
    assert sum(r["catastrophic_count"] for r in result.rounds) == catastrophic
    assert sum(result.delta_histogram["counts"]) == len(model_tokens(steps))


def comparable(result: rd.AnalysisResult) -> dict:
    document = result.to_json()
    for key in ("inputs", "skipped", "warnings", "worst_row_tokens"):
        document.pop(key)
    for entry in document["worst_rows"] + document["worst_tokens"]:
        entry.pop("file")
        entry.pop("row")
    return document


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    chunk_tokens=st.integers(1, 400),
    seed=st.integers(0, 2**16),
    files=st.integers(1, 3),
    data=st.data(),
)
def test_chunking_row_order_and_file_split_never_change_results(tmp_path_factory, chunk_tokens, seed, files, data):
    rng = np.random.default_rng(seed)
    # at least 3 rows a step: each of up to 3 files (per-rank files) holds every step; a file that starts above the
    # first step reads as a resumed run (decisions/resume.py), which a rank without rows at step 0 would look like
    steps = {step: random_rows(rng, int(rng.integers(3, 12)), max_len=30) for step in range(3)}
    if sum(int(r["mask"].sum()) for rows in steps.values() for r in rows) == 0:
        return
    folder = tmp_path_factory.mktemp("inv")
    write_dump(folder / "whole.parquet", steps)
    baseline = rd.analyze(str(folder / "whole.parquet"), device="cpu", top_k=5)
    # shuffle rows within each step, then deal the rows over several files
    shuffled = {s: [rows[i] for i in data.draw(st.permutations(range(len(rows))))] for s, rows in steps.items()}
    parts: list[dict[int, list[dict]]] = [{} for _ in range(files)]
    for step, rows in shuffled.items():
        for i, row in enumerate(rows):
            parts[i % files].setdefault(step, []).append(row)
    paths = []
    for i, part in enumerate(parts):
        if part:
            paths.append(str(folder / f"part{i}.parquet"))
            write_dump(paths[-1], part, row_group_size=3)
    split = rd.analyze(paths, device="cpu", top_k=5, chunk_tokens=chunk_tokens)
    assert_same(comparable(baseline), comparable(split))


def step(index: int, k3: float) -> StepResult:
    return StepResult(index, 10, 100, {"rollout_corr/k3_kl": k3})


def test_anomaly_rule():
    # 8 steps at 1 (median 1, zero spread) → step 8 at 3.5 is 3.5× (flagged), step 9 at 2 (median 1) is not
    steps = [step(i, v) for i, v in enumerate([1.0] * 8 + [3.5, 2.0])]
    anomalies = find_anomalies(steps, metrics=("rollout_corr/k3_kl",))
    assert [(a.step, a.factor) for a in anomalies] == [(8, pytest.approx(3.5))]
    # with 7 previous steps there is no baseline yet
    assert find_anomalies(steps[1:], metrics=("rollout_corr/k3_kl",)) == []


def test_change_point_finds_the_rise():
    values = [1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 1.0, 3.0, 3.1, 2.9, 3.05, 2.95, 3.0]
    index, before, after, t = change_point(values)
    assert index == 7 and before == pytest.approx(1.0) and after == pytest.approx(3.0) and t > 3
    assert change_point([1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 1.0, 1.02, 0.98, 1.0, 1.01]) is None


def test_t_quantiles_and_least_squares():
    # Student t 97.5 % quantiles from the standard table
    assert t_quantile_975(10) == pytest.approx(2.228138852, abs=2e-4)
    assert t_quantile_975(30) == pytest.approx(2.042272456, abs=1e-5)
    slope, low, high = least_squares([0, 1, 2, 3], [1.0, 3.0, 5.0, 7.0])  # exact line: slope 2, zero width
    assert (slope, low, high) == (pytest.approx(2.0), pytest.approx(2.0), pytest.approx(2.0))


def test_merged_workers_equal_one_pass(dump, tmp_path):
    """What a Ray or process-pool driver does: analyse parts separately, merge the states, finalize once."""
    steps, path = dump
    halves = [{s: rows for s, rows in steps.items() if s % 2 == parity} for parity in (0, 1)]
    parts = []
    for index, part in enumerate(halves):
        part_path = tmp_path / f"part{index}.parquet"
        write_dump(part_path, part, row_group_size=5)
        reader = rd.DumpReader([str(part_path)], chunk_tokens=97)
        analysis = rd.Analysis(top_k=5)
        for chunk, _ in reader.chunks("cpu"):
            analysis.update(chunk)
        parts.append(analysis)
    parts[1].merge(parts[0])  # merge order must not matter either
    whole = rd.analyze(path, device="cpu", top_k=5)
    assert_same(whole.run.metrics, parts[1].run_result().metrics)
    assert_same(
        [[s.step, s.rows, s.tokens, s.metrics] for s in whole.steps],
        [[s.step, s.rows, s.tokens, s.metrics] for s in parts[1].step_results()],
    )
    assert [t.log_ratio for t in whole.worst_tokens] == [t.log_ratio for t in parts[1].worst.worst_tokens()]


def test_mask_edge_cases_rounds_and_positions(tmp_path):
    # alternating 1/0: every model token is its own round; a mask starting and ending with 0; all ones
    rows = [
        {"sample_id": "alt", "mask": [1, 0, 1, 0, 1, 0, 1]},
        {"sample_id": "edges", "mask": [0, 0, 1, 1, 0, 1, 0]},
        {"sample_id": "ones", "mask": [1, 1, 1, 1]},
        {"sample_id": "none", "mask": [0, 0, 0]},
    ]
    for row in rows:
        n = len(row["mask"])
        row["mask"] = np.array(row["mask"], np.int8)
        row["rollout"] = np.full(n, -1.0, np.float32)
        row["trainer"] = np.full(n, -1.5, np.float32)  # δ = -0.5 everywhere
    write_dump(tmp_path / "edges.parquet", {0: rows})
    result = rd.analyze(str(tmp_path / "edges.parquet"), device="cpu", max_rounds=2)
    rounds = {r["round"]: r for r in result.rounds}
    # round 0: alt(pos 0) + edges(pos 2, 3) + ones(4 tokens) = 7 tokens in 3 rows;
    # round 1: alt(pos 2) + edges(pos 5) = 2 tokens; round ≥ 2 (pooled): alt's rounds 2 and 3 = 2 tokens, 1 row
    assert {k: (r["token_count"], r["seq_count"], r["pooled"]) for k, r in rounds.items()} == {
        0: (7, 3, False),
        1: (2, 2, False),
        2: (2, 1, True),
    }
    assert result.run.metrics["per_round/num_rounds_max"] == 4  # unpooled
    assert result.run.rows == 4 and result.run.empty_rows == 1
    by_bucket = {p["bucket"]: p["token_count"] for p in result.positions if p["step"] is None}
    # model-token positions: alt 0,2,4,6; edges 2,3,5; ones 0,1,2,3 → buckets 0:2, 1:1, 2–3:5, 4–7:3
    assert by_bucket == {"0": 2, "1": 1, "2–3": 5, "4–7": 3}
    strip = rd.inspect_row(str(tmp_path / "edges.parquet"), "0-edges", device="cpu")
    assert strip.mask == [0, 0, 1, 1, 0, 1, 0]


def test_process_workers_equal_one_pass(tmp_path):
    rng = np.random.default_rng(3)
    steps = {step: random_rows(rng, 20, max_len=40) for step in range(5)}
    path = tmp_path / "dump.parquet"
    write_dump(path, steps, row_group_size=9)
    one = rd.analyze(str(path), device="cpu", top_k=5)
    three = rd.analyze(str(path), device="cpu", top_k=5, workers=3)
    assert_same(comparable(one), comparable(three))
    with pytest.raises(rd.ConfigError, match="backend"):
        rd.analyze(str(path), device="cpu", workers=2, backend="slurm")


def test_delta_histogram_bins_by_brute_force():
    """Every δ lands in the DELTA_EDGES bin that holds it; |δ| < 2^-20 (exact 0 included: bf16 dumps are full of
    them) in the centre bin. The bin was once read off frexp's exponent, which is 0 for δ = 0: exact zeros were
    counted in [−1, −0.5)."""
    import torch

    from rollout_diag.metrics.localize import DELTA_BINS, DELTA_EDGES, delta_bin

    edges = DELTA_EDGES
    values = [0.0, -0.0, 1e-9, -1e-9, 2.0**-20, -(2.0**-20), 0.3, -0.3, 0.5, -0.5, 1.0, -1.0, 127.9, 128.0, 1e6, -1e6]
    rng = np.random.default_rng(5)
    values += list(rng.normal(0, 0.05, 200)) + list(rng.standard_cauchy(50))

    def brute(value: float) -> int:
        if abs(value) < 2.0**-20:
            return DELTA_BINS // 2
        for index in range(DELTA_BINS):  # [e_i, e_{i+1}) for δ > 0, (e_i, e_{i+1}] mirrored for δ < 0
            low, high = edges[index], edges[index + 1]
            if (value > 0 and low <= value < high) or (value < 0 and low < value <= high):
                return index
        return DELTA_BINS - 1 if value > 0 else 0

    got = delta_bin(torch.tensor(values, dtype=torch.float64)).tolist()
    assert got == [brute(v) for v in values]


def _long_row_dump(tmp_path, length: int, spike: int) -> str:
    """One step: a short row and a row of ``length`` tokens whose largest |δ| (3.0) sits at position ``spike``; every
    other token has |δ| 0.01 (trainer −1.0, rollout −1.01), so the long row is the worst row by every criterion."""
    from helpers.dumps import seq_row, write_sequence_dump

    trainer = [-1.0] * length
    rollout = [-1.01] * length
    rollout[spike] = -4.0
    rows = [seq_row(0, "short", [-1.0, -1.0], [-1.0, -1.0]), seq_row(0, "long", rollout, trainer)]
    return str(write_sequence_dump(tmp_path / f"long_{length}.parquet", rows))


@pytest.mark.parametrize("length, spike", [(50_000, 31_000), (50_000, 10), (50_000, 49_995)])
def test_a_long_row_is_carried_as_the_window_inspect_shows(tmp_path, length, spike):
    from rollout_diag.metrics.localize import DEFAULT_WINDOW

    path = _long_row_dump(tmp_path, length, spike)
    result = rd.analyze(path, device="cpu")
    carried = next(tokens for tokens in result.worst_row_tokens if tokens.sample_id == "long")
    # DEFAULT_WINDOW (100) tokens centred on the spike, moved inside the row at its ends:
    # spike 31 000 -> [30 950, 31 050); spike 10 -> [0, 100); spike 49 995 -> [49 900, 50 000)
    first = min(max(0, spike - DEFAULT_WINDOW // 2), length - DEFAULT_WINDOW)
    assert (carried.start, carried.row_length, len(carried.mask)) == (first, length, DEFAULT_WINDOW)
    assert carried.log_ratio[spike - first] == pytest.approx(3.0, abs=1e-5)  # float32 logprobs: −1 − (−4)
    shown = rd.inspect_row(path, "long", device="cpu")
    assert (shown.start, shown.row_length, shown.mask) == (carried.start, carried.row_length, carried.mask)
    entry = next(row for row in result.to_json()["worst_row_tokens"] if row["sample_id"] == "long")
    assert (entry["start"], entry["end"], entry["row_length"]) == (first, first + DEFAULT_WINDOW, length)
    short = next(row for row in result.to_json()["worst_row_tokens"] if row["sample_id"] == "short")
    assert (short["start"], short["end"], short["row_length"]) == (0, 2, None)  # a short row whole


def test_no_output_grows_with_the_length_of_one_row(tmp_path):
    """analyze's JSON and CSV of a 10×-longer worst row differ by its counts' digits and the log2 position buckets
    (log2(50 000 / 5 000) ≈ 3.3 more), not by its tokens: within 10 % in size (tokens in whole: the JSON ~10×)."""
    from typer.testing import CliRunner

    from rollout_diag.cli import app

    sizes = {}
    for length in (5_000, 50_000):
        path = _long_row_dump(tmp_path, length, length // 2)
        for output in ("json", "csv"):
            target = tmp_path / f"{length}.{output}"
            done = CliRunner().invoke(app, ["analyze", path, "--format", output, "--output", str(target)])
            assert done.exit_code == 0, done.output
            sizes[length, output] = target.stat().st_size
    for output in ("json", "csv"):
        assert sizes[50_000, output] <= 1.1 * sizes[5_000, output], sizes
