"""The library against the slow float64 reference (tests/helpers/reference.py), written from METRICS.md alone."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from helpers.metrics import assert_metrics_match, random_rows, reference_metrics, write_dump

import rollout_diag as rd


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("chunk_tokens", [37, 1 << 20])
def test_every_step_and_the_run_match_the_reference(tmp_path, seed, chunk_tokens):
    rng = np.random.default_rng(seed)
    steps = {step: random_rows(rng, int(rng.integers(5, 30))) for step in (0, 3, 7)}
    path = tmp_path / "dump.parquet"
    write_dump(path, steps, row_group_size=16)
    result = rd.analyze(str(path), device="cpu", max_rounds=3, chunk_tokens=chunk_tokens)
    by_step = {s.step: s for s in result.steps}
    assert sorted(by_step) == sorted(steps)
    for step, rows in steps.items():
        assert by_step[step].rows == len(rows)
        assert by_step[step].tokens == sum(int(r["mask"].sum()) for r in rows)
        assert_metrics_match(by_step[step].metrics, reference_metrics(rows))
    all_rows = [row for rows in steps.values() for row in rows]
    assert_metrics_match(result.run.metrics, reference_metrics(all_rows))


def test_hand_computed_batch(tmp_path):
    # Row A: a = [-1.0, -2.0], r = [-1.5, -2.0], m = [1, 1] → δ = [0.5, 0.0]
    # Row B: a = [-0.5, -9.0, -1.0], r = [-0.25, -0.5, -0.5], m = [1, 0, 1] → δ = [-0.25, ·, -0.5]
    # Row C: no model token (m = [0]) → enters row means with R = 0 (verl's 1e-8 quirk).
    rows = [
        {"sample_id": "A", "trainer": [-1.0, -2.0], "rollout": [-1.5, -2.0], "mask": [1, 1]},
        {"sample_id": "B", "trainer": [-0.5, -9.0, -1.0], "rollout": [-0.25, -0.5, -0.5], "mask": [1, 0, 1]},
        {"sample_id": "C", "trainer": [-3.0], "rollout": [-3.0], "mask": [0]},
    ]
    rows = [
        {**r, **{k: np.array(r[k], np.float32) for k in ("trainer", "rollout")}, "mask": np.array(r["mask"], np.int8)}
        for r in rows
    ]
    path = tmp_path / "hand.parquet"
    write_dump(path, {0: rows})
    m = rd.analyze(str(path), device="cpu").run.metrics
    eps = 1e-8
    # N = 4 model tokens; T[x] = Σx / (4 + 1e-8).
    # kl = T[r − a] = (-0.5 + 0 + 0.25 + 0.5) / 4 = 0.0625
    assert m["rollout_corr/kl"] == pytest.approx(0.25 / (4 + eps), rel=1e-12)
    # k3 = T[exp δ − δ − 1] over δ = 0.5, 0, -0.25, -0.5
    k3 = sum(math.exp(d) - d - 1 for d in (0.5, 0.0, -0.25, -0.5)) / (4 + eps)
    assert m["rollout_corr/k3_kl"] == pytest.approx(k3, rel=1e-12)
    # R_A[a] = -3/2, R_B[a] = -1.5/2, R_C = 0 → training_log_ppl = mean(1.5, 0.75, 0) = 0.75
    r_a = (-3.0 / (2 + eps), -1.5 / (2 + eps), 0.0)
    assert m["rollout_corr/training_log_ppl"] == pytest.approx(-sum(r_a) / 3, rel=1e-12)
    assert m["rollout_corr/training_ppl"] == pytest.approx(sum(math.exp(-x) for x in r_a) / 3, rel=1e-12)
    # d_i = R_i[r] − R_i[a]: A: (-3.5 + 3)/2 = -0.25; B: (-0.75 + 1.5)/2 = 0.375; C: 0
    d = (-0.5 / (2 + eps), 0.75 / (2 + eps), 0.0)
    assert m["rollout_corr/log_ppl_diff"] == pytest.approx(sum(d) / 3, rel=1e-12)
    assert m["rollout_corr/log_ppl_abs_diff"] == pytest.approx(sum(abs(x) for x in d) / 3, rel=1e-12)
    assert m["rollout_corr/log_ppl_diff_max"] == pytest.approx(d[1], rel=1e-12)
    assert m["rollout_corr/log_ppl_diff_min"] == pytest.approx(d[0], rel=1e-12)
    # χ²_seq: S_A = 0.5, S_B = -0.75, S_C = 0 → mean(e^1, e^-1.5, 1) − 1
    assert m["rollout_corr/chi2_seq"] == pytest.approx((math.e + math.exp(-1.5) + 1) / 3 - 1, rel=1e-12)
    # |δ| mean = (0.5 + 0 + 0.25 + 0.5) / 4 = 0.3125
    assert m["mismatch/logprob_abs_diff"] == pytest.approx(1.25 / (4 + eps), rel=1e-12)
    # rounds: A has round 0 (2 tokens); B has rounds 0 (δ -0.25) and 1 (δ -0.5)
    assert m["per_round/round_0/token_count"] == 3
    assert m["per_round/round_1/logprob_abs_diff_mean"] == pytest.approx(0.5)
    assert m["per_round/num_rounds_max"] == 2
    assert m["per_round/most_divergent_round"] == 1
    # rollout_kl/k1: mean over the 3 rows of R_i[δ]: (0.25, -0.375, 0) / 3
    assert m["rollout_kl/k1"] == pytest.approx((0.5 / (2 + eps) - 0.75 / (2 + eps)) / 3, rel=1e-12)


def test_real_dump_matches_the_reference():
    """The bundled bf16-vs-fp32 dump: every step equals the reference to 1e-9."""
    path = "sample_data/textgenrnn_bf16_vs_fp32.parquet"
    table = pq.read_table(path)
    result = rd.analyze(path, device="cpu", max_rounds=3, chunk_tokens=5000)
    for step in result.steps:
        selected = table.filter(pa.compute.equal(table["step"], step.step)).to_pylist()
        rows = [
            {
                "trainer": np.array(r["old_log_probs"], np.float32),
                "rollout": np.array(r["rollout_log_probs"], np.float32),
                "mask": np.array(r["response_mask"], np.int8),
            }
            for r in selected
        ]
        assert_metrics_match(step.metrics, reference_metrics(rows))


@pytest.mark.parametrize("function", ["exp", "expm1"])
def test_cpu_exp_backends_agree_within_one_ulp(function):
    """token_exp / token_expm1 run numpy's loop or torch's kernel by CPU (metrics/base.py, NUMPY_SVML): either
    must give the same value to 1 ulp over the range a log-prob dump reaches (δ and log-probs in [−40, 40])."""
    from rollout_diag.engine.formulas import _host_or_torch

    values = torch.cat([torch.linspace(-40.0, 40.0, 200_001, dtype=torch.float64), torch.tensor([0.0, -0.0, 1e-300])])
    numpy_path = _host_or_torch(getattr(np, function), function, numpy_on_cpu=True)(values)
    torch_path = _host_or_torch(getattr(np, function), function, numpy_on_cpu=False)(values)
    np.testing.assert_array_max_ulp(numpy_path.numpy(), torch_path.numpy(), maxulp=1)
