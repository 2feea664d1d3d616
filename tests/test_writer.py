"""DumpWriter: what a trainer writes is what analyze reads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rollout_diag as rd


def test_padded_torch_batches_round_trip(tmp_path):
    path = tmp_path / "run.parquet"
    rollout = torch.tensor([[-1.0, -2.0, -0.5], [-0.25, -3.0, 0.0]], dtype=torch.bfloat16)
    trainer = torch.tensor([[-1.5, -2.0, -0.5], [-0.5, -3.5, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    with rd.DumpWriter(path) as dump:
        dump.write(7, rollout, trainer, mask, sample_ids=["a", "b"], lengths=[3, 2])
        dump.write(8, rollout, trainer, mask, sample_ids=["c", "d"])
    result = rd.analyze(str(path), device="cpu")
    assert [(s.step, s.rows, s.tokens) for s in result.steps] == [(7, 2, 4), (8, 2, 4)]
    row = rd.inspect_row(str(path), "b", device="cpu")
    assert row.mask == [1, 1]  # trimmed to length 2
    # bf16 rollout values survive exactly (they are representable in float32)
    assert row.rollout_logprob == [-0.25, -3.0]
    expected_kl = np.mean([0.5, 0.0, 0.25, 0.5])  # T[r − a] over the 4 model tokens of step 7
    assert result.steps[0].metrics["rollout_corr/kl"] == pytest.approx(expected_kl, rel=1e-6)


def test_shape_mismatch_is_a_clear_error(tmp_path):
    with rd.DumpWriter(tmp_path / "bad.parquet") as dump, pytest.raises(rd.ConfigError, match=r"\[B, L\]"):
        dump.write(0, np.zeros((2, 3)), np.zeros((2, 4)), np.ones((2, 3)))
