"""The drift split (metrics/drift.py, drivers/drift.py, decisions/drift.py): exact Shapley parts, fixed buckets,
chunking invariance, the planted cause found, silence on a flat run, the windows option."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import pytest
from helpers.drift import write_scenario
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_diag.drivers.engine import analyze
from rollout_diag.errors import ConfigError
from rollout_diag.metrics.drift import choose_windows, length_bucket, parse_windows, row_groups, split
from rollout_diag.results.wording import drift_sentence


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("drift")
    return {
        name: write_scenario(root / f"{name}.parquet", name) for name in ("length", "probability", "within", "flat")
    }


# ------------------------------------------------------------------------------------------------ the split
def test_split_by_hand() -> None:
    # bucket a: 10 tokens, Σ 1 (mean 0.1) → 30 tokens, Σ 6 (mean 0.2); bucket b: 30 tokens, Σ 3 (mean 0.1) → 10, Σ 1
    # w = (0.25, 0.75) → (0.75, 0.25); from = 4/40 = 0.1, to = 7/40 = 0.175, change 0.075
    # mix = (0.5)(0.1 + 0.2)/2 + (−0.5)(0.1 + 0.1)/2 = 0.075 − 0.05 = 0.025
    # within = (0.1)(0.25 + 0.75)/2 + 0·… = 0.05
    parts = split((np.array([10.0, 30.0]), np.array([1.0, 3.0])), (np.array([30.0, 10.0]), np.array([6.0, 1.0])), "ab")
    assert parts["from"] == pytest.approx(0.1, rel=1e-15)
    assert parts["to"] == pytest.approx(0.175, rel=1e-15)
    assert parts["mix"] == pytest.approx(0.025, rel=1e-14)
    assert parts["within"] == pytest.approx(0.05, rel=1e-14)
    assert [b["bucket"] for b in parts["buckets"]] == ["a", "b"]


def test_split_empty_bucket_is_all_mix() -> None:
    # bucket b appears only late: no early mean, so its whole part is mix (its mean taken from the late window)
    # early: a 10 tokens mean 0.1 → 0.1; late: a 10 tokens mean 0.1, b 10 tokens mean 0.3 → 0.2; change 0.1
    # mix = (0.5 − 1)(0.1 + 0.1)/2 + (0.5 − 0)(0.3 + 0.3)/2 = −0.05 + 0.15 = 0.1; within = 0
    parts = split((np.array([10.0, 0.0]), np.array([1.0, 0.0])), (np.array([10.0, 10.0]), np.array([1.0, 3.0])), "ab")
    assert parts["mix"] == pytest.approx(0.1, rel=1e-14)
    assert parts["within"] == pytest.approx(0.0, abs=1e-16)
    assert parts["buckets"][1]["from_mean"] is None


bucket_sums = st.lists(
    st.tuples(
        st.integers(0, 1000),
        st.floats(0, 10, allow_nan=False),
        st.integers(0, 1000),
        st.floats(0, 10, allow_nan=False),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(buckets=bucket_sums)
def test_parts_sum_to_the_change(buckets: list[tuple[int, float, int, float]]) -> None:
    n0, m0, n1, m1 = (np.array(column, dtype=np.float64) for column in zip(*buckets, strict=True))
    if n0.sum() == 0 or n1.sum() == 0:
        return  # a window without a token: never split (a chosen window holds a step, a step a token)
    parts = split((n0, n0 * m0), (n1, n1 * m1), [str(b) for b in range(len(buckets))])
    scale = max(abs(parts["from"]), abs(parts["to"]), 1e-300)
    assert abs(parts["mix"] + parts["within"] - parts["change"]) <= 1e-12 * scale
    assert parts["from"] == pytest.approx((n0 * m0).sum() / n0.sum(), rel=1e-12)
    for bucket in parts["buckets"]:  # each bucket's parts sum to its own w'm' − wm
        assert math.isfinite(bucket["mix"]) and math.isfinite(bucket["within"])


def test_length_buckets_are_fixed_log2_edges() -> None:
    assert length_bucket(np.array([0, 1, 2, 3, 4, 7, 8, 255, 256])).tolist() == [0, 1, 2, 2, 3, 3, 4, 8, 9]


def test_row_groups_depend_on_the_row_alone() -> None:
    ids = [f"{name}-{row}" for name in ("a", "b") for row in range(500)]
    steps = np.repeat(np.arange(10), 100)
    whole = row_groups(steps, ids)
    parts = np.concatenate([row_groups(steps[i : i + 97], ids[i : i + 97]) for i in range(0, 1000, 97)])
    assert np.array_equal(whole, parts)  # any chunking
    order = np.random.default_rng(0).permutation(1000)
    assert np.array_equal(row_groups(steps[order], [ids[i] for i in order]), whole[order])  # any order or file split
    assert 40 <= len(np.unique(whole)) <= 64  # spread over the groups
    assert not np.array_equal(whole[:500], whole[500:])  # the id decides


# ------------------------------------------------------------------------------------------------ windows
def test_parse_windows() -> None:
    assert parse_windows("0:9,90:99") == ((0, 9), (90, 99))
    assert parse_windows(" 3:3 , 4:7 ") == ((3, 3), (4, 7))


@pytest.mark.parametrize("text", ["0:9", "0:9,5", "a:b,1:2", "9:0,10:12", "0:9,5:20", "0:9,10:12,13:14", ""])
def test_bad_windows(text: str) -> None:
    with pytest.raises(ConfigError) as found:
        parse_windows(text)
    assert "\n" not in str(found.value) and "drift_windows" in str(found.value)


def test_default_windows_are_a_fifth_of_the_steps() -> None:
    steps = np.arange(45)
    early, late = choose_windows(steps, None)
    assert (early[0], early[-1], late[0], late[-1]) == (0, 8, 36, 44)
    early, late = choose_windows(np.array([3, 7]), None)
    assert early.tolist() == [3] and late.tolist() == [7]
    assert choose_windows(np.array([3]), None) is None
    with pytest.raises(ConfigError, match="no step"):
        choose_windows(steps, ((50, 60), (70, 80)))


# ------------------------------------------------------------------------------------------------ planted causes
def _factor(entry: dict, name: str) -> dict:
    return next(f for f in entry["factors"] if f["factor"] == name)


@pytest.mark.parametrize("metric", [0, 1])
@pytest.mark.parametrize(("scenario", "factor"), [("length", "length"), ("probability", "probability")])
def test_a_planted_mix_is_found(scenarios: dict[str, Path], scenario: str, factor: str, metric: int) -> None:
    entry = analyze([str(scenarios[scenario])], workers=1).drift[metric]
    assert entry["beyond_noise"] and entry["change"] > 0
    assert _factor(entry, factor)["mix"] >= 0.8 * entry["change"]
    assert entry["explained_by"]["factor"] == factor and entry["explained_by"]["part"] == "mix"
    sentence = drift_sentence(entry)
    assert sentence is not None and f"({factor} mix)" in sentence


@pytest.mark.parametrize("metric", [0, 1])
def test_within_drift_is_found(scenarios: dict[str, Path], metric: int) -> None:
    entry = analyze([str(scenarios["within"])], workers=1).drift[metric]
    assert entry["beyond_noise"]
    for factor in entry["factors"]:  # every factor: the buckets' own mismatch moved, not their mix
        assert factor["within"] >= 0.8 * entry["change"], factor["factor"]
    assert entry["explained_by"]["part"] == "within"
    assert "the mismatch itself rose within buckets" in (drift_sentence(entry) or "")


def test_flat_run_says_nothing(scenarios: dict[str, Path]) -> None:
    result = analyze([str(scenarios["flat"])], workers=1)
    assert [entry["beyond_noise"] for entry in result.drift] == [False, False]
    assert all(drift_sentence(entry) is None for entry in result.drift)


def test_by_column_is_a_factor(scenarios: dict[str, Path]) -> None:
    entry = analyze([str(scenarios["length"])], workers=1, by=["response_length:bins=100"]).drift[0]
    grouped = _factor(entry, "response_length:bins=100")
    assert grouped["mix"] + grouped["within"] == pytest.approx(entry["change"], rel=1e-12)
    assert grouped["mix"] >= 0.8 * entry["change"]


def test_explicit_windows(scenarios: dict[str, Path]) -> None:
    entry = analyze([str(scenarios["length"])], workers=1, drift_windows="0:2,7:9").drift[0]
    assert entry["from_steps"] == [0, 2] and entry["to_steps"] == [7, 9]
    for factor in entry["factors"]:
        assert abs(factor["mix"] + factor["within"] - entry["change"]) <= 1e-12 * entry["to"]


# ------------------------------------------------------------------------------------------------ chunking
@pytest.mark.parametrize("chunk_tokens", [97, 1013])
def test_chunking_invariance(scenarios: dict[str, Path], chunk_tokens: int) -> None:
    whole = analyze([str(scenarios["length"])], workers=1).drift
    chunked = analyze([str(scenarios["length"])], workers=1, chunk_tokens=chunk_tokens).drift
    for a, b in zip(whole, chunked, strict=True):
        assert a["from_steps"] == b["from_steps"] and a["beyond_noise"] == b["beyond_noise"]
        for key in ("from", "to", "change"):
            assert b[key] == pytest.approx(a[key], rel=1e-12)
        assert b["interval"] == pytest.approx(a["interval"], rel=1e-9)
        for fa, fb in zip(a["factors"], b["factors"], strict=True):
            assert fb["mix"] == pytest.approx(fa["mix"], rel=1e-10, abs=1e-15)
            assert fb["within"] == pytest.approx(fa["within"], rel=1e-10, abs=1e-15)
            assert [x["bucket"] for x in fa["buckets"]] == [x["bucket"] for x in fb["buckets"]]


@functools.cache  # the chunks of one dump, read once for every hypothesis example
def _collect(path: Path, chunk_tokens: int) -> list:
    import torch

    from rollout_diag.drivers.passes import Analysis, run_chunks
    from rollout_diag.io.reader import DumpReader

    chunks: list = []
    probe = Analysis()
    run_chunks(
        DumpReader([str(path)], chunk_tokens=chunk_tokens), [chunks.append], torch.device("cpu"), prepare=probe.prepare
    )
    return chunks


@settings(max_examples=8, deadline=None)
@given(cut=st.integers(0, 100), backwards=st.booleans())
def test_merged_parts_give_the_whole(scenarios: dict[str, Path], cut: int, backwards: bool) -> None:
    from rollout_diag.drivers.drift import drift_of
    from rollout_diag.drivers.passes import Analysis

    chunks = _collect(scenarios["probability"], 1013)
    whole, first, second = Analysis(), Analysis(), Analysis()
    at = cut * len(chunks) // 100
    for index, chunk in enumerate(chunks):
        whole.update(chunk)
        (first if index < at else second).update(chunk)
    if backwards:
        second.merge(first)
        merged = second
    else:
        first.merge(second)
        merged = first
    for a, b in zip(drift_of(whole), drift_of(merged), strict=True):
        assert b["change"] == pytest.approx(a["change"], rel=1e-12)
        assert b["interval"] == pytest.approx(a["interval"], rel=1e-9)
        for fa, fb in zip(a["factors"], b["factors"], strict=True):
            assert (fb["mix"], fb["within"]) == pytest.approx((fa["mix"], fa["within"]), rel=1e-10, abs=1e-15)


def test_torch_engine_gives_the_same_split(scenarios: dict[str, Path]) -> None:
    from rollout_diag.engine.choice import use_engine

    numba = analyze([str(scenarios["probability"])], workers=1).drift
    with use_engine("torch"):
        torch = analyze([str(scenarios["probability"])], workers=1).drift
    for a, b in zip(numba, torch, strict=True):
        assert b["change"] == pytest.approx(a["change"], rel=1e-12)
        for fa, fb in zip(a["factors"], b["factors"], strict=True):
            assert (fb["mix"], fb["within"]) == pytest.approx((fa["mix"], fa["within"]), rel=1e-10, abs=1e-15)


def test_an_infinite_k3_is_null_in_the_json_and_said_nowhere(tmp_path: Path) -> None:
    import json
    import warnings

    import pyarrow as pa
    from helpers.dumps import random_rows, seq_row, write_sequence_dump

    from rollout_diag.report import render_report
    from rollout_diag.results import AnalysisResult

    rows = random_rows(1, steps=tuple(range(6)), rows_per_step=5)
    rows.append(seq_row(5, "inf", [-750.0, -1.0], [0.0, -1.0]))  # δ = 750: exp(δ) − δ − 1 overflows to inf
    path = write_sequence_dump(tmp_path / "inf.parquet", rows, logprob_type=pa.float64())
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        result = analyze([str(path)], workers=1)
    k3 = result.drift[0]
    assert math.isinf(k3["to"]) and not k3["beyond_noise"] and drift_sentence(k3) is None
    document = json.loads(json.dumps(result.to_json(), allow_nan=False))
    assert document["drift"][0]["to"] is None
    assert "Why did it move?" in render_report(AnalysisResult.from_json(document))
