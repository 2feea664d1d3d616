"""The CUDA path: the torch engine on ``device="cuda"`` against the numba engine on the CPU, and the reference.

Skipped (saying so) where torch sees no GPU. Where one is present, every analysis and preset metric on
CUDA must equal the CPU result of the numba kernels to 1e-12 relative and the float64 reference to the suite's
tolerance. CI runs the same torch engine on the CPU against the kernels over every test dump (tests/test_kernel.py),
so what only a GPU can check is the device: ``segment_reduce`` and the device-side validation and bookkeeping.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_correction import ALL_PRESETS, random_steps
from test_correction import write_dump as write_preset_dump
from test_metrics import assert_metrics_match, random_rows, reference_metrics, write_dump

import rollout_diag as rd
from rollout_diag.kernels import use_engine

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA GPU: CUDA path not run")

RTOL_DEVICE = 1e-12  # CPU and GPU are both float64; only the summation order differs


def assert_same(cpu: dict[str, float], cuda: dict[str, float]) -> None:
    assert set(cpu) == set(cuda)
    for name, value in cpu.items():
        if math.isnan(value):
            assert math.isnan(cuda[name]), name
        else:
            assert cuda[name] == pytest.approx(value, rel=RTOL_DEVICE, abs=1e-300), name


@pytest.mark.parametrize("chunk_tokens", [37, 1 << 20])
def test_analysis_on_cuda_matches_cpu_and_reference(tmp_path, chunk_tokens):
    rng = np.random.default_rng(7)
    steps = {step: random_rows(rng, 25) for step in range(3)}
    path = tmp_path / "dump.parquet"
    write_dump(path, steps, row_group_size=11)
    with use_engine("numba"):
        cpu = rd.analyze(path, device="cpu", chunk_tokens=chunk_tokens)
    with use_engine("auto"):  # torch on CUDA
        cuda = rd.analyze(path, device="cuda", chunk_tokens=chunk_tokens)
    assert cuda.device.startswith("cuda")
    assert_same(cpu.run.metrics, cuda.run.metrics)
    for cpu_step, cuda_step in zip(cpu.steps, cuda.steps, strict=True):
        assert_same(cpu_step.metrics, cuda_step.metrics)
        assert_metrics_match(cuda_step.metrics, reference_metrics(steps[cuda_step.step]))
    assert [r.sample_id for r in cpu.worst_rows] == [r.sample_id for r in cuda.worst_rows]


def test_presets_on_cuda_match_cpu(tmp_path):
    path = tmp_path / "presets.parquet"
    write_preset_dump(path, random_steps(3))
    with use_engine("numba"):
        cpu = rd.compare_presets(path, ALL_PRESETS, device="cpu", chunk_tokens=37)
    with use_engine("auto"):
        cuda = rd.compare_presets(path, ALL_PRESETS, device="cuda", chunk_tokens=37)
    for cpu_preset, cuda_preset in zip(cpu.presets, cuda.presets, strict=True):
        assert cpu_preset.name == cuda_preset.name
        assert_same(cpu_preset.run.metrics, cuda_preset.run.metrics)
