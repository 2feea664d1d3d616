"""``summary/is_raw_*`` (metrics/correction.py raw_weight_metrics): the IS weights before truncation, after verl's
clamp20 of the log ratio (METRICS.md §2: w_raw = exp(clamp20(δ)) per token, exp(clamp20(s_i)) per row), beside verl's
``rollout_is_*`` of the applied weights; against the float64 reference and a hand-computed case, in both engines."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers.presets import random_steps, write_dump
from helpers.reference import raw_is_summary

import rollout_diag as rd
from rollout_diag.engine.choice import use_engine

KEYS = ("mean", "std", "min", "max", "eff_sample_size")


def reference(rows, level: str) -> dict[str, float]:
    """The reference (helpers/reference.py raw_is_summary), without the key prefix."""
    return {key.removeprefix("summary/is_raw_"): value for key, value in raw_is_summary(rows, level).items()}


@pytest.mark.parametrize("engine", ["numba", "torch"])
@pytest.mark.parametrize("setting", [("token", "2.0"), ("sequence", "2.0"), ("token", "0.5_5.0")])
def test_raw_is_statistics_equal_the_reference(tmp_path, engine, setting):
    level, threshold = setting
    steps = random_steps(9)
    path = tmp_path / "raw.parquet"
    write_dump(path, steps)
    rows = [
        (np.float32(a).astype(np.float64), np.float32(r).astype(np.float64), m)
        for step_rows in steps.values()
        for a, r, m in step_rows
    ]  # fmt: skip  (the dump holds float32 logprobs)
    preset = rd.preset_from_options("is", rollout_is=level, rollout_is_threshold=threshold)
    with use_engine(engine):
        metrics = rd.compare_presets(path, [preset], device="cpu", chunk_tokens=29).presets[0].run.metrics
    expected = reference(rows, level)
    for key in KEYS:
        # ESS divides by T[w]² + terms in 1e-8 that the reference writes differently: 1e-7 relative
        assert metrics[f"summary/is_raw_{key}"] == pytest.approx(expected[key], rel=1e-7), key
    # truncation can only lower the max and the mean (TIS), never the raw ones
    assert metrics["summary/is_raw_max"] >= metrics["rollout_corr/rollout_is_max"] - 1e-12


def test_hand_computed_raw_and_applied(tmp_path):
    # one row, δ = log 4, log 1, log 0.25 (a = δ + r): w_raw = 4, 1, 0.25; TIS at 2 applies 2, 1, 0.25
    # raw: mean (4 + 1 + 0.25)/3 = 1.75, max 4, min 0.25, std sqrt(((2.25)² + 0.75² + 1.5²)/3) = sqrt(2.625) = 1.62019,
    # ESS = 1.75² / ((16 + 1 + 0.0625)/3) = 3.0625 / 5.6875 = 0.538462; applied mean (2 + 1 + 0.25)/3 = 1.083333
    rollout = np.array([-2.0, -1.0, -2.0])
    trainer = rollout + np.log([4.0, 1.0, 0.25])
    path = tmp_path / "one.parquet"
    write_dump(path, {0: [(trainer, rollout, np.ones(3))]})
    preset = rd.preset_from_options("tis", rollout_is="token", rollout_is_threshold="2")
    metrics = rd.compare_presets(path, [preset], device="cpu").presets[0].run.metrics
    assert metrics["summary/is_raw_mean"] == pytest.approx(1.75, rel=1e-6)  # float32 logprobs in the dump
    assert metrics["summary/is_raw_max"] == pytest.approx(4.0, rel=1e-6)
    assert metrics["summary/is_raw_min"] == pytest.approx(0.25, rel=1e-6)
    assert metrics["summary/is_raw_std"] == pytest.approx(math.sqrt(2.625), rel=1e-6)
    assert metrics["summary/is_raw_eff_sample_size"] == pytest.approx(3.0625 / 5.6875, rel=1e-6)
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(3.25 / 3, rel=1e-6)
