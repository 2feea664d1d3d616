"""Root-cause hints: each fires on data with its cause planted and stays silent on clean data and on the real sample;
the evidence sums match a slow float64 reference and do not depend on chunking or merging; policy_version is read.

Dumps are built from one generator (``rows``): "true" logprobs a from a mix of near-certain and uncertain tokens,
rollout logprobs r = a − noise with a noise scale that a planted cause may make depend on position, round, rollout
probability or policy lag, and plants that rewrite the trainer or rollout values the way a bug would.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import jsonschema
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from helpers.dumps import random_rows, seq_row, sequence_table, write_sequence_dump, write_table, write_token_dump
from helpers.sampling import Processing, sample
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import rollout_diag as rd
from rollout_diag.cli import app
from rollout_diag.decisions.contrasts import MIN_GROUP_TOKENS, Contrast, Group
from rollout_diag.decisions.hints import HINT_IDS, Evidence, find_hints, staleness
from rollout_diag.drivers.passes import Analysis, open_reader, run_chunks
from rollout_diag.errors import ColumnError, DataError
from rollout_diag.metrics.hints import PROBABILITY_EDGES, TOKEN_SUMS
from rollout_diag.render.hints import hint_lines
from rollout_diag.report import render_report
from rollout_diag.results import HintRow, RowRef

REPO = Path(__file__).resolve().parents[2]
REAL_SAMPLE = REPO / "sample_data" / "textgenrnn_bf16_vs_fp32.parquet"
LOG_HALF = math.log(0.5)


# ------------------------------------------------------------------------------------------ generator
def f32(values: np.ndarray) -> list[float]:
    """Values that survive the float32 dump exactly, as float64."""
    return np.float32(values).astype(np.float64).tolist()


def rows(
    seed: int = 0,
    *,
    steps: int = 3,
    rows_per_step: int = 16,
    length: int = 64,
    rounds: int = 1,
    env_length: int = 8,
    noise: Callable[[dict], np.ndarray] | None = None,
    plant: Callable[[dict], None] | None = None,
    lag: Callable[[np.random.Generator], int] | None = None,
) -> list[dict]:
    """Rows of ``rounds`` model segments of ``length`` tokens, separated by environment segments of ``env_length``.

    ``noise(token)`` gives the noise scale of each token from a dict of arrays (position, round, p, lag);
    default 0.02 everywhere (clean). ``plant(row)`` rewrites a row's arrays (trainer, rollout, mask) in place.
    ``lag(rng)`` draws the policy lag of a row (a ``policy_version`` = step − lag is written).
    """
    rng = np.random.default_rng(seed)
    out = []
    for step in range(steps):
        for index in range(rows_per_step):
            mask, round_of = [], []
            for k in range(rounds):
                mask += [1] * length
                round_of += [k] * length
                if k < rounds - 1:
                    mask += [0] * env_length
                    round_of += [k] * env_length
            mask_array = np.array(mask, dtype=np.int8)
            n = len(mask)
            # half near-certain tokens (p ≈ 1), half uncertain ones (p from 1 down to ~1e-4)
            certain = rng.random(n) < 0.5
            true = np.where(certain, -rng.exponential(0.03, n), -rng.exponential(2.0, n))
            row_lag = 0 if lag is None else lag(rng)
            token = {
                "position": np.arange(n),
                "round": np.array(round_of),
                "p": np.exp(true),
                "lag": np.full(n, row_lag),
            }
            scale = np.full(n, 0.02) if noise is None else noise(token)
            rollout = np.minimum(true - rng.normal(0.0, 1.0, n) * scale, 0.0)
            row = {"trainer": true.copy(), "rollout": rollout, "mask": mask_array, "rng": rng, "round": token["round"]}
            if plant is not None:
                plant(row)
            made = seq_row(step, f"s{step}-{index:02d}", f32(row["rollout"]), f32(row["trainer"]), row["mask"].tolist())
            if lag is not None:
                made["policy_version"] = step - row_lag
            out.append(made)
    return out


def dump(tmp_path: Path, made: list[dict], name: str = "dump.parquet") -> Path:
    table = sequence_table(made)
    if any("policy_version" in row for row in made):
        table = table.append_column("policy_version", pa.array([row["policy_version"] for row in made], pa.int64()))
    return write_table(tmp_path / name, table)


def hint_ids(path: Path, **options) -> list[str]:
    return [hint.id for hint in rd.analyze(str(path), device="cpu", **options).hints]


# ------------------------------------------------------------------------------------------ plants
def shift_trainer(row: dict) -> None:
    """The trainer's logprobs gathered one position off: a'[t] = a[t + 1] within each model segment (the last
    token gets the logprob of whatever token follows the segment)."""
    trainer, mask = row["trainer"], row["mask"]
    shifted = trainer.copy()
    model = np.flatnonzero(mask == 1)
    for start, end in _runs(model):
        shifted[start : end - 1] = trainer[start + 1 : end]
        shifted[end - 1] = -row["rng"].exponential(2.0)
    row["trainer"] = shifted


def _runs(indices: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each run of consecutive indices."""
    runs, start = [], None
    for i, index in enumerate(indices):
        if start is None:
            start = index
        if i + 1 == len(indices) or indices[i + 1] != index + 1:
            runs.append((int(start), int(index) + 1))
            start = None
    return runs


def zero_environment(row: dict) -> None:
    """Environment tokens let into the loss (mask 1) with the engine's placeholder rollout logprob 0.0."""
    environment = row["mask"] == 0
    row["rollout"] = np.where(environment, 0.0, row["rollout"])
    row["trainer"] = np.where(environment, -row["rng"].exponential(2.0, len(environment)) - 0.7, row["trainer"])
    row["mask"] = np.ones_like(row["mask"])


def copy_environment(row: dict) -> None:
    """Environment tokens let into the loss with the rollout logprob forward-filled from the last model token."""
    environment = np.flatnonzero(row["mask"] == 0)
    rollout = row["rollout"].copy()
    for index in environment:
        rollout[index] = rollout[index - 1]
    row["rollout"] = rollout
    row["mask"] = np.ones_like(row["mask"])


def temperature_on_rollout(row: dict, temperature: float = 0.8) -> None:
    """The row resampled from real distributions with the rollout's logprobs at temperature T: tokens from
    softmax(z / T), r = log softmax(z / T)[tok], a = log softmax(z)[tok] (not r = a / T)."""
    _resample(row, Processing(temperature=temperature))


def top_p_on_rollout(row: dict, top_p: float = 0.9) -> None:
    """The row resampled with the rollout's logprobs of the top-p truncated, renormalised distribution."""
    _resample(row, Processing(top_p=top_p))


def _resample(row: dict, processing: Processing) -> None:
    drawn = sample(row["rng"], len(row["trainer"]), processing, numerics=0.01)
    row["trainer"], row["rollout"] = drawn["trainer"], drawn["rollout"]


def retokenized_turn_starts(row: dict, k: int = 2) -> None:
    """The first k model tokens of every round after the first (right after an environment segment) scored on
    differently split tokens: their rollout logprobs disagree by ~0.5."""
    mask = row["mask"]
    starts = np.flatnonzero((mask == 1) & (np.concatenate([[1], mask[:-1]]) == 0))
    for start in starts:
        index = np.arange(start, start + k)
        row["rollout"][index] = np.minimum(row["trainer"][index] - row["rng"].normal(0, 0.6, k), 0.0)


def noisy_first_tokens(row: dict) -> None:
    mask = row["mask"]
    first = np.flatnonzero((mask == 1) & (np.concatenate([[0], mask[:-1]]) == 0))
    row["rollout"][first] = np.minimum(row["trainer"][first] - row["rng"].normal(0, 0.6, len(first)), 0.0)


def noisy_last_token(row: dict) -> None:
    last = int(np.flatnonzero(row["mask"] == 1)[-1])
    row["rollout"][last] = min(row["trainer"][last] - float(row["rng"].normal(0, 0.6)), 0.0)


PLANTED: dict[str, dict] = {
    "off_by_one": {"plant": shift_trainer},
    "dummy_logprobs": {"plant": zero_environment, "rounds": 3},
    "processed_logprobs": {"plant": temperature_on_rollout},
    "top_p_truncation": {"plant": top_p_on_rollout},
    "retokenization": {"plant": retokenized_turn_starts, "rounds": 4, "length": 40},
    "first_token": {"plant": noisy_first_tokens, "rounds": 3},
    "last_token": {"plant": noisy_last_token, "rows_per_step": 24},
    "low_probability": {"noise": lambda t: 0.2 * (1.0 - t["p"]) + 1e-4},
    "long_context": {"noise": lambda t: 0.004 * (1.0 + t["position"] / 32.0), "length": 512, "rows_per_step": 8},
    "turn_growth": {"noise": lambda t: 0.01 * (1.0 + t["round"]), "rounds": 6, "length": 40},
    "staleness": {"noise": lambda t: 0.01 * (1.0 + t["lag"]), "lag": lambda rng: int(rng.integers(0, 4))},
}
CLEAN: dict[str, dict] = {
    "single_turn": {},
    "multi_turn": {"rounds": 4, "length": 40},
    "long_rows": {"length": 512, "rows_per_step": 6},
    "with_policy_version": {"lag": lambda rng: int(rng.integers(0, 4)), "rounds": 2},
}


# ------------------------------------------------------------------------------------------ firing / silence
@pytest.mark.parametrize("hint", list(PLANTED))
def test_each_hint_fires_on_its_planted_cause(tmp_path, hint):
    path = dump(tmp_path, rows(1, **PLANTED[hint]))
    result = rd.analyze(str(path), device="cpu")
    found = {h.id: h for h in result.hints}
    assert hint in found, [h.id for h in result.hints]
    fired = found[hint]
    assert fired.message and fired.evidence and all(math.isfinite(v) for v in fired.evidence.values())
    assert fired.steps or fired.rows, "a hint says where to look"


@pytest.mark.parametrize("shape", list(CLEAN))
def test_clean_synthetic_data_shows_no_hint(tmp_path, shape):
    assert hint_ids(dump(tmp_path, rows(2, **CLEAN[shape]))) == []


def test_random_rows_show_no_hint(tmp_path):
    assert hint_ids(write_sequence_dump(tmp_path / "r.parquet", random_rows(3, rows_per_step=64, max_length=40))) == []


def test_the_real_sample_shows_low_probability_only():
    # bf16 vs fp32 on one model: the numerical-precision signature and nothing else (sample_data/README.md)
    result = rd.analyze(str(REAL_SAMPLE), device="cpu")
    assert [h.id for h in result.hints] == ["low_probability"]
    evidence = result.hints[0].evidence
    assert evidence["factor"] > 3.0 and evidence["lowest_bucket_abs_share"] > evidence["lowest_bucket_token_share"]


def test_the_real_sample_without_its_mask_shows_dummy_logprobs(tmp_path):
    # the real engine wrote 0.0 for the environment tokens it never scored; dropping the mask lets them in
    without_mask = write_table(tmp_path / "no-mask.parquet", pq.read_table(REAL_SAMPLE).drop(["response_mask"]))
    hint = next(h for h in rd.analyze(str(without_mask), device="cpu").hints if h.id == "dummy_logprobs")
    assert hint.evidence["share_of_model_tokens"] > 0.05 and hint.evidence["copied_tokens"] == 0


def test_off_by_one_names_the_direction_and_the_rows(tmp_path):
    path = dump(tmp_path, rows(4, plant=shift_trainer))
    hint = next(h for h in rd.analyze(str(path), device="cpu").hints if h.id == "off_by_one")
    assert hint.evidence["ratio"] < 0.2
    assert "early" in hint.look_at  # a'[t] = a[t+1]: the trainer values sit one position early
    assert hint.steps == [0, 1, 2] or sorted(hint.steps) == [0, 1, 2]
    assert len(hint.rows) == 5


def test_off_by_one_fires_only_on_the_shifted_rows_steps(tmp_path):
    made = rows(5) + [
        {**row, "step": 7, "sample_id": f"bad-{i}"} for i, row in enumerate(rows(6, steps=1, plant=shift_trainer))
    ]
    hint = next(h for h in rd.analyze(str(dump(tmp_path, made)), device="cpu").hints if h.id == "off_by_one")
    assert hint.steps == [7]
    assert all(row.step == 7 and row.sample_id.startswith("bad-") for row in hint.rows)


def test_copied_environment_values_are_dummy_logprobs(tmp_path):
    path = dump(tmp_path, rows(7, rounds=3, plant=copy_environment))
    hint = next(h for h in rd.analyze(str(path), device="cpu").hints if h.id == "dummy_logprobs")
    assert hint.evidence["copied_tokens"] > 0


def test_isolated_exact_zeros_are_not_dummy_logprobs(tmp_path):
    # bf16 engines round near-certain tokens to exactly 0.0: isolated zeros with a trainer p ≥ 0.5 are numerics
    def round_certain(row: dict) -> None:
        row["rollout"] = np.where(row["trainer"] > -0.05, 0.0, row["rollout"])

    assert hint_ids(dump(tmp_path, rows(8, plant=round_certain))) == []


def test_processed_logprobs_names_the_direction(tmp_path):
    sharper = rd.analyze(str(dump(tmp_path, rows(9, plant=temperature_on_rollout))), device="cpu").hints
    hint = next(h for h in sharper if h.id == "processed_logprobs")
    # T = 0.8 on the rollout: its likely tokens gain probability (δ < 0), its unlikely ones lose it (δ > 0)
    assert hint.evidence["sharper_rollout"] == 1.0
    assert hint.evidence["likely_bucket_mean"] < 0 < hint.evidence["unlikely_bucket_mean"]
    assert "top_p_truncation" not in {h.id for h in sharper}

    def flatter(row: dict) -> None:
        temperature_on_rollout(row, 1.3)

    hints = rd.analyze(str(dump(tmp_path, rows(9, plant=flatter), "flat.parquet")), device="cpu").hints
    assert next(h for h in hints if h.id == "processed_logprobs").evidence["sharper_rollout"] == 0.0


# The hints of issue 41 (truncated sampling, retokenization, resume): each silent on every other planted cause.
NEW_HINTS = {"top_p_truncation", "processed_logprobs", "retokenization", "resume_spike"}


@pytest.mark.parametrize("hint", list(PLANTED))
def test_the_sampling_and_turn_hints_are_silent_on_other_causes(tmp_path, hint):
    found = set(hint_ids(dump(tmp_path, rows(3, **PLANTED[hint]))))
    assert not (found & NEW_HINTS) - {hint}, found


def test_staleness_is_silent_without_a_policy_version_column(tmp_path):
    made = rows(10, **PLANTED["staleness"])
    for row in made:
        del row["policy_version"]
    assert "staleness" not in hint_ids(dump(tmp_path, made))


# ------------------------------------------------------------------------------------------ pure rules
def test_contrast_needs_size_factor_gap_and_t():
    high, low = Group(100, 30.0, 10.0), Group(100, 5.0, 0.5)
    assert Contrast(high, low).holds(3.0)
    assert not Contrast(high, low).holds(7.0)  # 6× only
    assert not Contrast(Group(MIN_GROUP_TOKENS - 1, 9.0, 3.0), low).holds(3.0)
    assert not Contrast(Group(100, 1e-4, 1e-10), Group(100, 1e-5, 1e-12)).holds(3.0)  # 10× but negligible
    assert not Contrast(Group(100, 30.0, 100.0), Group(100, 5.0, 25.0)).holds(3.0)  # too noisy: small t


def test_staleness_rule_on_hand_built_lags():
    def evidence(lags: dict[int, list[float]], has_versions: bool = True) -> Evidence:
        refs = [RowRef(5, "a", "f", 3, 3.5)]
        return Evidence(
            run={"tokens": 1.0}, steps={}, examples={"staleness": refs}, lags=lags, has_versions=has_versions
        )

    fresh, stale = [1000.0, 10.0, 0.2], [1000.0, 30.0, 1.2]
    hint = staleness(evidence({0: fresh, 2: stale}))
    assert hint is not None and hint.evidence["factor"] == pytest.approx(3.0) and hint.evidence["max_lag"] == 2
    assert hint.rows == [HintRow(5, "a", "f", 3)] and hint.steps == [5]
    assert staleness(evidence({0: fresh, 2: fresh})) is None
    assert staleness(evidence({0: fresh})) is None
    assert staleness(evidence({0: fresh, 2: stale}, has_versions=False)) is None


def test_no_evidence_no_hints():
    empty = rd.analyze(str(REAL_SAMPLE), device="cpu")
    assert find_hints(Evidence(run={}, steps={}), empty) == []


# ------------------------------------------------------------------------------------------ reference sums
def reference_sums(made: list[dict]) -> dict[str, float]:
    """TOKEN_SUMS and the probability buckets by plain loops over the rows' model tokens (float64)."""
    out = dict.fromkeys(TOKEN_SUMS, 0.0)
    out["probability"] = [0.0] * (len(PROBABILITY_EDGES) + 1)
    out["probability_abs"] = [0.0] * (len(PROBABILITY_EDGES) + 1)
    out["probability_delta"] = [0.0] * (len(PROBABILITY_EDGES) + 1)
    out["position"] = {}  # log2 bucket -> [tokens, Σy]
    for row in made:
        mask, a, r = row["mask"], row["trainer"], row["rollout"]
        model = [t for t in range(len(mask)) if mask[t] == 1]
        last = model[-1] if model else None

        def dummy(t: int, a: list[float] = a, r: list[float] = r) -> bool:
            return (r[t] == 0.0 and a[t] < LOG_HALF) or (a[t] == 0.0 and r[t] < LOG_HALF)

        for i, t in enumerate(model):
            delta = a[t] - r[t]
            y = min(abs(delta), 1.0)
            linked_next = i + 1 < len(model) and model[i + 1] == t + 1
            linked_prev = i > 0 and model[i - 1] == t - 1
            out["tokens"] += 1
            out["cross"] += delta * r[t]
            out["rollout_square"] += r[t] * r[t]
            out["delta_square"] += delta * delta
            out["rollout_sum"] += r[t]
            out["delta_sum"] += delta
            if linked_next:
                out["pairs"] += 1
                out["pair_abs"] += abs(delta)
                out["shift_next"] += abs(a[t + 1] - r[t])
                out["shift_prev"] += abs(a[t] - r[t + 1])
            if dummy(t):
                out["dummy_zero"] += 1
                if (linked_next and dummy(t + 1)) or (linked_prev and dummy(t - 1)):
                    out["dummy_zero_run"] += 1
            if linked_prev:
                same_r = r[t] == r[t - 1] and r[t] != 0.0 and abs(a[t] - a[t - 1]) > math.log(2.0)
                same_a = a[t] == a[t - 1] and a[t] != 0.0 and abs(r[t] - r[t - 1]) > math.log(2.0)
                out["copied"] += same_r or same_a
            first, is_last = not linked_prev, t == last
            for name, member in (("first", first), ("last", is_last), ("rest", not first and not is_last)):
                if member:
                    out[name] += 1
                    out[f"{name}_y"] += y
                    out[f"{name}_y2"] += y * y
            bucket = sum(r[t] < math.log(edge) for edge in PROBABILITY_EDGES)
            out["probability"][bucket] += 1
            out["probability_abs"][bucket] += abs(delta)
            out["probability_delta"][bucket] += delta
            position_bucket = 0 if t == 0 else t.bit_length()  # 1 → 1, 2–3 → 2, 4–7 → 3, …
            entry = out["position"].setdefault(position_bucket, [0.0, 0.0])
            entry[0] += 1
            entry[1] += y
    return out


def test_evidence_sums_match_the_reference(tmp_path):
    made = rows(11, rounds=3, rows_per_step=6, plant=zero_environment) + rows(12, rows_per_step=6, plant=shift_trainer)
    made += [{**row, "step": 5} for row in rows(19, steps=1, rounds=3, rows_per_step=4, plant=copy_environment)]
    made += [seq_row(9, "single", [-0.5], [-0.25])]  # a row of one token: no pair, first and last at once
    path = dump(tmp_path, made)
    analysis = Analysis()
    run_chunks(open_reader(str(path), None, strict=False, chunk_tokens=300), [analysis.update], "cpu")
    run = analysis.hint_evidence.evidence().run
    expected = reference_sums(made)
    for name in TOKEN_SUMS:
        assert run[name] == pytest.approx(expected[name], rel=1e-12, abs=1e-12), name
    assert [b["tokens"] for b in run["probability_buckets"]] == expected["probability"]
    assert [b["abs"] for b in run["probability_buckets"]] == pytest.approx(expected["probability_abs"], rel=1e-12)
    assert [b["delta"] for b in run["probability_buckets"]] == pytest.approx(expected["probability_delta"], abs=1e-12)
    positions = {k: [b["tokens"], b["y"]] for k, b in enumerate(run["position_buckets"]) if b["tokens"]}
    assert positions.keys() == expected["position"].keys()
    for bucket, (tokens, y) in expected["position"].items():
        assert positions[bucket] == pytest.approx([tokens, y], rel=1e-12)
    assert run["dummy_zero_run"] > 0 and run["copied"] > 0 and run["pairs"] > 0


def evidence_of(path: Path, chunk_tokens: int, layout_path: Path | None = None) -> Evidence:
    analysis = Analysis()
    run_chunks(
        open_reader(str(layout_path or path), None, strict=False, chunk_tokens=chunk_tokens), [analysis.update], "cpu"
    )
    return analysis.hint_evidence.evidence()


def assert_same_evidence(a: Evidence, b: Evidence, same_file: bool = True) -> None:
    assert a.steps.keys() == b.steps.keys()
    for mine, theirs in [(a.run, b.run), *((a.steps[s], b.steps[s]) for s in a.steps)]:
        for name in TOKEN_SUMS:
            assert mine[name] == pytest.approx(theirs[name], rel=1e-12, abs=1e-12), name
        for kind in ("probability_buckets", "position_buckets"):
            for x, y in zip(mine[kind], theirs[kind], strict=True):
                assert x == pytest.approx(y, rel=1e-12, abs=1e-12)
    if same_file:
        assert a.examples == b.examples
    else:  # the same rows, at other file rows
        for kind, refs in a.examples.items():
            assert [(r.step, r.sample_id, r.score) for r in refs] == [
                (r.step, r.sample_id, r.score) for r in b.examples[kind]
            ], kind
    assert a.lags.keys() == b.lags.keys()
    for lag in a.lags:
        assert a.lags[lag] == pytest.approx(b.lags[lag], rel=1e-12)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), chunk_tokens=st.integers(10, 150))
def test_evidence_does_not_depend_on_chunking(tmp_path, seed, chunk_tokens):
    made = random_rows(seed, steps=(0, 1, 2), rows_per_step=7, max_length=30)
    for index, row in enumerate(made):
        row["policy_version"] = row["step"] - index % 3
    path = dump(tmp_path, made, f"chunks-{seed}.parquet")
    assert_same_evidence(evidence_of(path, 1 << 20), evidence_of(path, chunk_tokens))


def test_merged_evidence_equals_one_pass(tmp_path):
    made = rows(13, rounds=2, lag=lambda rng: int(rng.integers(0, 3)), plant=shift_trainer)
    path = dump(tmp_path, made)
    whole = evidence_of(path, 1 << 20)
    parts = [Analysis(), Analysis()]
    chunks = [chunk for chunk, _ in open_reader(str(path), None, strict=False, chunk_tokens=1500).chunks("cpu")]
    for index, chunk in enumerate(chunks):
        parts[index % 2].update(chunk)
    parts[1].merge(parts[0])  # the later chunks first: merge order must not matter either
    assert_same_evidence(whole, parts[1].hint_evidence.evidence())


def test_token_layout_gives_the_same_evidence(tmp_path):
    made = rows(14, rounds=2, rows_per_step=5, plant=zero_environment)
    sequence = dump(tmp_path, made)
    tokens = write_token_dump(tmp_path / "tokens.parquet", made, shuffle_seed=1)
    assert_same_evidence(evidence_of(sequence, 1 << 20), evidence_of(tokens, 1 << 20), same_file=False)


# ------------------------------------------------------------------------------------------ policy_version
def test_policy_version_is_read_in_both_layouts(tmp_path):
    made = rows(15, steps=2, rows_per_step=3, length=5, lag=lambda rng: int(rng.integers(0, 3)))
    sequence = dump(tmp_path, made)
    table = write_token_dump(tmp_path / "t.parquet", made)
    versions = {row["sample_id"]: row["policy_version"] for row in made}
    token_table = pa.Table.from_pylist(
        [{**record, "policy_version": versions[record["sample_id"]]} for record in pq.read_table(table).to_pylist()]
    )
    token_path = write_table(tmp_path / "t2.parquet", token_table)
    for path in (sequence, token_path):
        read = {}
        for chunk, _ in open_reader(str(path), None, strict=False, chunk_tokens=7).chunks("cpu"):
            read.update(zip(chunk.sample_id, chunk.policy_version.tolist(), strict=True))
        assert read == versions


def test_policy_version_must_be_an_integer_without_nulls(tmp_path):
    made = rows(16, steps=1, rows_per_step=3, length=4)
    table = sequence_table(made)
    floats = write_table(tmp_path / "f.parquet", table.append_column("policy_version", pa.array([0.5, 1.0, 2.0])))
    with pytest.raises(ColumnError, match=r"policy_version'?: expected an integer policy_version"):
        rd.analyze(str(floats), device="cpu")
    nulls = write_table(
        tmp_path / "n.parquet", table.append_column("policy_version", pa.array([0, None, 1], pa.int64()))
    )
    with pytest.raises(DataError, match="row 1, column 'policy_version': policy_version is null"):
        rd.analyze(str(nulls), device="cpu")


# ------------------------------------------------------------------------------------------ outputs
def test_hints_in_json_terminal_and_report(tmp_path):
    path = dump(tmp_path, rows(17, plant=shift_trainer))
    runner = CliRunner()
    out = runner.invoke(app, ["analyze", str(path), "--device", "cpu", "--format", "json"], env={"COLUMNS": "160"})
    assert out.exit_code == 0, out.output
    document = json.loads(out.output)
    schema = json.loads((REPO / "schemas" / "result.schema.json").read_text())
    jsonschema.validate(document, schema)
    assert [h["id"] for h in document["hints"]] == ["off_by_one"]
    assert set(document["hints"][0]) == {"id", "message", "evidence", "steps", "rows", "look_at"}
    table = runner.invoke(app, ["analyze", str(path), "--device", "cpu"], env={"COLUMNS": "160"})
    assert "hint off_by_one:" in table.output and "evidence: aligned_abs_diff_mean" in table.output
    assert "Traceback" not in table.output
    result = rd.analyze(str(path), device="cpu")
    html = render_report(result)
    assert "Root-cause hints" in html and "<code>off_by_one</code>" in html
    # a saved JSON result gives the same hints back
    from rollout_diag.report import result_from_json

    assert result_from_json(document).hints == result.hints


def test_clean_data_has_an_empty_hints_list_and_a_note_in_the_report(tmp_path):
    result = rd.analyze(str(dump(tmp_path, rows(18))), device="cpu")
    assert result.to_json()["hints"] == []
    assert "No root-cause hint" in render_report(result)
    assert hint_lines(result) == []


def test_every_hint_id_is_documented():
    documented = (REPO / "docs" / "hints.md").read_text()
    schema = json.loads((REPO / "schemas" / "result.schema.json").read_text())
    assert schema["properties"]["hints"]["items"]["properties"]["id"]["enum"] == list(HINT_IDS)
    for hint in HINT_IDS:
        assert f"`{hint}`" in documented


def test_policy_version_written_by_the_dump_writer_drives_staleness(tmp_path):
    # the trainer side writes policy_version as a per-row extra column; the reader takes it as the role
    made = rows(20, **PLANTED["staleness"])
    with rd.DumpWriter(tmp_path / "dump") as writer:
        for step in sorted({row["step"] for row in made}):
            mine = [row for row in made if row["step"] == step]
            writer.write_step(
                step,
                old_log_probs=[torch.tensor(row["trainer"]) for row in mine],
                rollout_log_probs=[torch.tensor(row["rollout"]) for row in mine],
                response_mask=[torch.tensor(row["mask"]) for row in mine],
                sample_ids=[row["sample_id"] for row in mine],
                extra={"policy_version": [row["policy_version"] for row in mine]},
            )
    assert "staleness" in hint_ids(tmp_path / "dump")


# ------------------------------------------------------------------------------------------ no_mask
def test_no_mask_fires_on_environment_like_zeros_only_above_one_percent():
    from rollout_diag.decisions.pipeline_hints import NO_MASK_MIN_SHARE, no_mask

    assert no_mask(Evidence(run={}, steps={}, unmasked=(0, 0))) is None  # a dump with a mask column
    below = int(NO_MASK_MIN_SHARE * 10_000) - 1
    assert no_mask(Evidence(run={}, steps={}, unmasked=(10_000, below))) is None
    found = no_mask(Evidence(run={}, steps={}, unmasked=(10_000, 400)))
    assert found is not None and found.id == "no_mask" and "4.00%" in found.message
    assert found.evidence["share"] == 0.04


def test_the_real_dump_without_its_mask_shows_no_mask_first(tmp_path):
    import pyarrow.parquet as pq

    table = pq.read_table(REAL_SAMPLE).drop(["response_mask"])
    path = tmp_path / "unmasked.parquet"
    pq.write_table(table, path)
    ids = [hint.id for hint in rd.analyze(str(path), device="cpu").hints]
    assert ids[:2] == ["no_mask", "dummy_logprobs"]


# ------------------------------------------------------------------------------------------ fill_values
F32_MIN = float(np.finfo(np.float32).min)  # -3.4028235e38, what masked_fill(finfo.min) writes in a float32 dump


def plant_fills(made: list[dict]) -> list[dict]:
    """Rows 1 and 4: −1e30 on the trainer side at model positions 3 and 7 (row 1) and 0 (row 4); row 9: float32's
    finfo.min on the rollout side at model position 2; row 5: −1e30 on an environment token (mask 0), not a finding.
    (Each value is what the float32 dump holds: −1e30 reads back as float32(−1e30).)"""
    for index, position, role, value in ((1, 3, "trainer", -1e30), (1, 7, "trainer", -1e30), (4, 0, "trainer", -1e30)):
        made[index][role][position] = value
    made[9]["rollout"][2] = F32_MIN
    environment = made[5]["mask"].index(0)
    made[5]["trainer"][environment] = -1e30
    return made


@pytest.mark.parametrize(("engine", "chunk_tokens"), [("numba", None), ("numba", 37), ("torch", 37)])
def test_fill_values_on_model_tokens_are_named_with_what_where_and_how_many(tmp_path, engine, chunk_tokens):
    from rollout_diag.drivers.dump import Dump

    path = dump(tmp_path, plant_fills(rows(4, rounds=2)))
    # the numba engine's reader scans the values with environment tokens zeroed; the torch engine's masks them here
    options = {} if chunk_tokens is None else {"chunk_tokens": chunk_tokens}
    result = rd.analyze(Dump(str(path), device="cpu", engine=engine, **options))
    hint = next(h for h in result.hints if h.id == "fill_values")
    # 3 trainer tokens in rows 1 and 4, 1 rollout token in row 9: 4 tokens in 3 rows (row 5's is masked out)
    assert hint.evidence["tokens"] == 4 and hint.evidence["rows"] == 3
    assert hint.evidence["lowest_value"] == F32_MIN
    assert "3 on the trainer side (old_log_probs: -1e30 ×3)" in hint.message
    assert "1 on the rollout side (rollout_log_probs: -3.403e38 (float32's finfo.min) ×1)" in hint.message
    assert f"the first at position 3 of {path}:1 (step 0, sample s0-01)" in hint.message
    assert [(r.row, r.sample_id) for r in hint.rows] == [(1, "s0-01"), (9, "s0-09")]
    # a pipeline bug: the verdict names it first and compare-presets withholds its recommendation
    assert result.verdict.cause == "pipeline" and result.verdict.findings[0] == "fill_values"


def test_a_fill_value_on_environment_tokens_only_is_no_finding(tmp_path):
    made = rows(4, rounds=2)
    environment = made[5]["mask"].index(0)
    made[5]["trainer"][environment] = -1e30
    made[6]["rollout"][environment] = F32_MIN
    assert "fill_values" not in hint_ids(dump(tmp_path, made))
