"""verl's k1 rejection with asymmetric bounds "L_U" keeps −log ρ in [log L, log U], i.e. ρ ∈ [1/U, 1/L] (verl #6377,
closed unmerged): its numbers stay verl's, and ``summary/k1_as_written_*`` (metrics/correction.py
K1AsWrittenAccumulator) say what ρ ∈ [L, U] as written would reject; the line the table and the report print
(results/wording.py)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.presets import random_steps, write_dump
from helpers.reference import OFFPOLICY, rs_metrics

import rollout_diag as rd
from rollout_diag.engine.choice import use_engine
from rollout_diag.metrics.correction import k1_as_written, k1_is_asymmetric
from rollout_diag.presets import PRESETS, preset_from_options
from rollout_diag.results.wording import k1_bounds_line


def test_which_bounds_are_asymmetric():
    # 0.5_2.0: 0.5·2 = 1, symmetric; 0.999_1.001: 0.999·1.001 = 0.999999, asymmetric by 1e-6 in ρ
    assert not k1_is_asymmetric(PRESETS["decoupled_seq_is_rs"].rejection[0])
    assert k1_is_asymmetric(PRESETS["decoupled_geo_rs"].rejection[0])
    assert not k1_is_asymmetric(PRESETS["decoupled_k3_rs"].rejection[0])  # k3: one upper bound
    option = preset_from_options(rollout_rs="token_k1", rollout_rs_threshold="0.5_1.5").rejection[0]
    written = k1_as_written(option)  # keeps −log 1.5 ≤ k1 ≤ −log 0.5: ρ = exp(−k1) ∈ [0.5, 1.5]
    assert (written.lower, written.upper) == (-option.upper, -option.lower)


@pytest.mark.parametrize("engine", ["numba", "torch"])
@pytest.mark.parametrize("option", ["seq_mean_k1", "token_k1", "seq_sum_k1"])
def test_as_written_shares_equal_the_reference_with_reciprocal_bounds(tmp_path, engine, option):
    steps = random_steps(21)
    path = tmp_path / "k1.parquet"
    write_dump(path, steps)
    rows = [(np.float32(a).astype(np.float64), np.float32(r).astype(np.float64), m) for step_rows in steps.values()
            for a, r, m in step_rows]  # fmt: skip
    lower, upper = (0.9, 1.05) if option != "seq_sum_k1" else (0.7, 1.2)
    preset = preset_from_options("asym", rollout_rs=option, rollout_rs_threshold=f"{lower}_{upper}")
    with use_engine(engine):
        metrics = rd.compare_presets(path, [preset], device="cpu", chunk_tokens=31).presets[0].run.metrics
    # [L, U] on ρ as written is verl's k1 rule with bounds 1/U_1/L
    written = rs_metrics(rows, [option], [f"{1 / upper!r}_{1 / lower!r}"])
    verl = rs_metrics(rows, [option], [f"{lower}_{upper}"])
    prefix = f"{OFFPOLICY}rollout_rs_{option}_"
    assert metrics["summary/k1_as_written_token_fraction"] == pytest.approx(written[prefix + "masked_fraction"], 1e-9)
    assert metrics["summary/k1_as_written_row_fraction"] == pytest.approx(written[prefix + "seq_masked_fraction"], 1e-9)
    assert metrics[prefix + "masked_fraction"] == pytest.approx(verl[prefix + "masked_fraction"], rel=1e-9)
    assert metrics["summary/k1_as_written_token_fraction"] != metrics[prefix + "masked_fraction"]  # they differ here
    line = k1_bounds_line("asym", preset.config(), metrics)
    assert line is not None and "ρ ∈ [1/U, 1/L]" in line and "as written would reject" in line and "\n" not in line


def test_a_symmetric_preset_gets_no_line_and_no_keys(tmp_path):
    path = tmp_path / "sym.parquet"
    write_dump(path, random_steps(2))
    result = rd.compare_presets(path, ["decoupled_seq_is_rs"], device="cpu")
    metrics = result.presets[0].run.metrics
    assert "summary/k1_as_written_token_fraction" not in metrics
    assert k1_bounds_line("decoupled_seq_is_rs", result.presets[0].config, metrics) is None
