"""Counts of model tokens by |δ|: bitwise-differing tokens, extreme-token shares, tolerance bands (metrics/offpolicy.py
``exact_counts``, the fused pass's COUNTS), the verdict's ``identical`` cause and ``check --exact``."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from helpers.kernel import chunk_of, layouts
from helpers.reference import count_metrics
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import rollout_diag as rd
from rollout_diag import catalogue
from rollout_diag.cli import app
from rollout_diag.engine import arrays
from rollout_diag.engine.quantities import COUNTS
from rollout_diag.engine.stats import ChunkStats, KernelStats
from rollout_diag.io.chunk import Chunk
from rollout_diag.metrics.rounds import RoundAccumulator

FLOAT32 = pa.float32()


def write(path, trainer: list[np.ndarray], rollout: list[np.ndarray], kind=FLOAT32, rollout_kind=None) -> str:
    """One step per two rows, every token a model token."""
    table = pa.table(
        {
            "step": pa.array([i // 2 for i in range(len(trainer))], pa.int64()),
            "sample_id": pa.array([str(i) for i in range(len(trainer))]),
            "old_log_probs": pa.array([t.tolist() for t in trainer], pa.list_(kind)),
            "rollout_log_probs": pa.array([r.tolist() for r in rollout], pa.list_(rollout_kind or kind)),
            "response_mask": pa.array([[1] * len(t) for t in trainer], pa.list_(pa.int8())),
        }
    )
    pq.write_table(table, path)
    return str(path)


def test_hand_computed_counts(tmp_path):
    # row 0: δ = 0, −0.001 (−0.5 + 0.499 = −0.0010000000000000009 in float64: just above the 1e-3 band), 0.05 − 0.0
    # (−0.5 + 0.45 = −0.04999…), 0.8, 2.0; row 1: δ = 0, 0
    trainer = [np.array([-0.5, -0.5, -0.5, -0.5, -0.5]), np.array([-1.0, -1.0])]
    rollout = [np.array([-0.5, -0.499, -0.45, 0.3, 1.5]) - 0.0, np.array([-1.0, -1.0])]
    rollout[0][3], rollout[0][4] = -1.3, -2.5  # δ 0.8 (> ln 2 = 0.693) and 2.0 (> ln 5 = 1.609)
    path = write(tmp_path / "d.parquet", trainer, rollout, pa.float64())
    run = rd.analyze(path, device="cpu").run.metrics
    # 7 model tokens: 4 differ (δ ≠ 0); |δ| > ln 2: 2 (0.8, 2.0); > ln 5 (1.609): 1; ≤ 1e-3: 3 (the three zeros);
    # ≤ 1e-2: 4 (+0.001); ≤ 1e-1: 5 (+0.05); rows within each band: the second row only (1 of 2)
    assert run[catalogue.MISMATCHED_TOKENS.key] == 4
    assert run[catalogue.MISMATCHED_TOKEN_SHARE.key] == 4 / 7
    assert run[catalogue.MAX_ABS_DELTA.key] == 2.0
    assert run[catalogue.EXTREME_FRAC_LN2.key] == 2 / 7 and run[catalogue.EXTREME_FRAC_LN5.key] == 1 / 7
    assert [run[m.key] for m in catalogue.BAND_TOKEN_SHARES] == [3 / 7, 4 / 7, 5 / 7]
    assert [run[m.key] for m in catalogue.BAND_SEQ_SHARES] == [0.5, 0.5, 0.5]
    reference = count_metrics([(t, r, np.ones(len(t))) for t, r in zip(trainer, rollout, strict=True)])
    assert {key: run[key] for key in reference} == pytest.approx(reference, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(layouts())
def test_counts_equal_the_torch_engine_exactly(layout):
    for float32 in (False, True):
        reference, kernel = ChunkStats(chunk_of(*layout)), KernelStats(chunk_of(*layout))
        reference.chunk.float32 = kernel.chunk.float32 = float32
        reference.chunk.cache["stats"], kernel.chunk.cache["stats"] = reference, kernel
        for name in COUNTS:
            assert torch.equal(kernel.segment_sum(name), reference.segment_sum(name)), (name, float32)


@settings(max_examples=40, deadline=None)
@given(layouts())
def test_count_sums_and_bucket_maxima_of_numpy_chunks_equal_the_torch_engine(layout):
    """A numpy chunk reduces each count and each round bucket's max |δ| by runs of the (step group, bucket) index,
    sorted first where it goes down (interleaved steps, rounds), and counts the rows within each band per round by
    runs of (row, round): the numbers torch's index_add_ and scatter_reduce give, exactly."""
    reference, kernel = ChunkStats(chunk_of(*layout)), KernelStats(numpy_chunk(chunk_of(*layout)))
    reference.chunk.cache["stats"], kernel.chunk.cache["stats"] = reference, kernel
    buckets = 4  # rounds past the third pooled, as max_rounds does

    def reductions(s: ChunkStats) -> dict[str, np.ndarray]:
        bucket = arrays.clamp(s.segment_round, upper=buckets - 1)
        found = {
            **s.count_sums(COUNTS),
            **{f"bucket {name}": value for name, value in s.count_sums(COUNTS[1:], bucket, buckets).items()},
            "max": s.bucket_max(s.segment_max("abs_log_ratio"), bucket, buckets),
            **RoundAccumulator._rows_within(s, bucket, buckets),
        }
        return {name: np.asarray(arrays.host(value)) for name, value in found.items()}

    expected = reductions(reference)
    for name, value in reductions(kernel).items():
        np.testing.assert_array_equal(value, expected[name], err_msg=name)


def numpy_chunk(chunk: Chunk) -> Chunk:
    """The chunk with numpy arrays, as the CPU reader gives them."""
    arrays_of = {name: getattr(chunk, name).numpy() for name in ("step", "offsets", "trainer", "rollout", "mask")}
    return Chunk(**arrays_of, sample_id=chunk.sample_id, file=chunk.file, file_row=chunk.file_row)


def test_float32_columns_compare_at_float32(tmp_path):
    rng = np.random.default_rng(3)
    trainer = [-rng.exponential(1.0, 64).astype(np.float32) for _ in range(4)]
    # the rollout in float64, each value its float32 trainer's plus a quarter of a float32 ulp: equal as float32
    rollout = [t.astype(np.float64) + np.spacing(t).astype(np.float64) / 4 for t in trainer]
    mixed = rd.analyze(write(tmp_path / "m.parquet", trainer, rollout, pa.float32(), pa.float64()), device="cpu")
    assert mixed.run.metrics[catalogue.MISMATCHED_TOKENS.key] == 0
    assert mixed.verdict.cause == "identical"
    wide = [t.astype(np.float64) for t in trainer]
    both64 = rd.analyze(write(tmp_path / "w.parquet", wide, rollout, pa.float64()), device="cpu")
    assert both64.run.metrics[catalogue.MISMATCHED_TOKENS.key] == 256  # float64 on both sides: every token differs


def test_one_ulp_differences_are_counted_and_said(tmp_path):
    rng = np.random.default_rng(4)
    trainer = [-rng.exponential(1.0, 32).astype(np.float32) for _ in range(4)]
    rollout = [t.copy() for t in trainer]
    for row in rollout:  # 24 of 32 tokens a row one float32 ulp apart: 96 of 128
        row[:24] = np.nextafter(row[:24], np.float32(0.0))
    result = rd.analyze(write(tmp_path / "u.parquet", trainer, rollout), device="cpu")
    run = result.run.metrics
    assert run[catalogue.MISMATCHED_TOKENS.key] == 96 and run[catalogue.MISMATCHED_TOKEN_SHARE.key] == 0.75
    assert 0 < run[catalogue.MAX_ABS_DELTA.key] < 1e-6
    assert result.verdict.level == "ok" and result.verdict.cause == "none"
    assert "96 of 128 model tokens" in result.verdict.sentence and "rounding-level" in result.verdict.sentence


def test_a_copied_column_is_identical_and_nothing_is_recommended(tmp_path):
    rng = np.random.default_rng(5)
    trainer = [-rng.exponential(1.0, 300) for _ in range(6)]
    path = write(tmp_path / "c.parquet", trainer, [t.copy() for t in trainer], pa.float64())
    result = rd.analyze(path, device="cpu")
    assert (result.verdict.level, result.verdict.cause, result.verdict.notes) == ("ok", "identical", [])
    assert "bypass" in result.verdict.sentence and "batch-invariant" in result.verdict.sentence
    assert result.run.metrics[catalogue.MAX_ABS_DELTA.key] == 0.0
    comparison = rd.compare_presets(path, device="cpu")
    assert comparison.recommendation is None or comparison.recommendation.preset is None
    assert "no correction needed" in (comparison.recommendation_withheld or "")


def test_all_zero_logprobs_are_dummy_not_identical(tmp_path):
    zeros = [np.zeros(50) for _ in range(4)]
    result = rd.analyze(write(tmp_path / "z.parquet", zeros, [z.copy() for z in zeros], pa.float64()), device="cpu")
    assert (result.verdict.level, result.verdict.cause) == ("bad", "pipeline")
    assert result.verdict.findings == ["dummy_logprobs"]


@pytest.fixture(scope="module")
def spread_dump(tmp_path_factory) -> tuple[str, dict[str, float]]:
    """12 rows of 5–120 tokens, half the tokens moved by N(0, 0.3): every count and band has tokens on both sides;
    with its whole-run counts in one chunk."""
    rng = np.random.default_rng(6)
    trainer = [-rng.exponential(1.0, int(n)) for n in rng.integers(5, 120, 12)]
    rollout = [t - rng.normal(0, 0.3, len(t)) * (rng.random(len(t)) < 0.5) for t in trainer]
    path = write(tmp_path_factory.mktemp("spread") / "k.parquet", trainer, rollout, pa.float64())
    return path, rd.analyze(path, device="cpu").run.metrics


@settings(max_examples=8, deadline=None)
@given(st.integers(1, 1500))
def test_counts_do_not_depend_on_chunking(spread_dump, chunk_tokens):
    path, whole = spread_dump
    chunked = rd.analyze(path, device="cpu", chunk_tokens=chunk_tokens).run.metrics
    keys = [k for k in whole if k.startswith(("mismatch/extreme", "mismatch/band", "diag/mismatched", "diag/max_abs"))]
    assert len(keys) == 11 and all(whole[k] == chunked[k] for k in keys)  # counts: exact, whatever the chunks
    assert not math.isnan(whole[catalogue.MISMATCHED_TOKEN_SHARE.key])


def test_check_exact_fails_and_names_the_first_differing_token(tmp_path):
    trainer = [np.full(10, -1.0, np.float32) for _ in range(4)]
    rollout = [t.copy() for t in trainer]
    rollout[2][6] = np.nextafter(np.float32(-1.0), np.float32(0.0))
    rollout[3][1] = -2.0
    path = write(tmp_path / "e.parquet", trainer, rollout)
    runner = CliRunner()
    failed = runner.invoke(app, ["check", path, "--exact"], terminal_width=200)
    assert failed.exit_code == 3, failed.output
    assert "diag/mismatched_tokens" in failed.output
    said = "".join(failed.output.split())  # the table may wrap a long temporary path anywhere
    expected = "e.parquet row 2, position 6 (step 1): trainer -1.0 vs rollout -0.99999994 (float32)"
    assert expected.replace(" ", "") in said
    same = write(tmp_path / "s.parquet", trainer, [t.copy() for t in trainer])
    assert runner.invoke(app, ["check", same, "--exact"]).exit_code == 0
