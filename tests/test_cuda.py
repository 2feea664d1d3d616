"""The CUDA path: the torch engine on ``device="cuda"`` against the numba engine on the CPU, and the reference.

Skipped (saying so) where torch sees no GPU. Where one is present, every analysis and preset metric on
CUDA must equal the CPU result of the numba kernels to 1e-12 relative and the float64 reference to the suite's
tolerance. CI runs the same torch engine on the CPU against the kernels over every test dump
(tests/kernels/test_kernel.py), so what only a GPU can check is the device: ``segment_reduce`` and the device-side
validation and bookkeeping.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
from helpers import kernel
from helpers.metrics import assert_metrics_match, random_rows, reference_metrics, write_dump
from helpers.presets import ALL_PRESETS, random_steps
from helpers.presets import write_dump as write_preset_dump

import rollout_diag as rd
from rollout_diag.engine.choice import use_engine

# ROLLOUT_DIAG_TEST_DEVICE=cpu runs these tests with the torch engine on the CPU in place of CUDA: a dry run of this
# file on a machine without a GPU (benchmarks/device_check.py), so that a lent GPU's time is not spent on a typo.
DEVICE = os.environ.get("ROLLOUT_DIAG_TEST_DEVICE", "cuda")
ENGINE = "auto" if DEVICE.startswith("cuda") else "torch"
ON_A_GPU = DEVICE.startswith("cuda")
pytestmark = pytest.mark.skipif(
    ON_A_GPU and not torch.cuda.is_available(), reason="torch sees no CUDA GPU: CUDA path not run"
)

RTOL_DEVICE = 1e-12  # CPU and GPU are both float64; only the summation order differs


def on_its_sum(name: str, value: float) -> float:
    """What a metric is compared on: chi2 metrics are a mean of ρ² (a sum of terms near 1) less 1, so the order of that
    sum shows in their digits ~1/χ² times magnified (torch's ``segment_reduce`` on CUDA adds in its own order: an H100
    gave χ² 1.5e-12 apart relative at χ² = 3e-4, the mean of ρ² 4e-16 apart). They are compared on the mean, χ² + 1."""
    return value + 1.0 if "chi2" in name else value


def assert_close(cpu: float, cuda: float, name: str) -> None:
    if math.isnan(cpu):
        assert math.isnan(cuda), name
    else:
        assert on_its_sum(name, cuda) == pytest.approx(on_its_sum(name, cpu), rel=RTOL_DEVICE, abs=1e-300), name


def assert_same(cpu: dict[str, float], cuda: dict[str, float]) -> None:
    assert set(cpu) == set(cuda)
    for name, value in cpu.items():
        assert_close(value, cuda[name], name)


@pytest.mark.parametrize("chunk_tokens", [37, 1 << 20])
def test_analysis_on_cuda_matches_cpu_and_reference(tmp_path, chunk_tokens):
    rng = np.random.default_rng(7)
    steps = {step: random_rows(rng, 25) for step in range(3)}
    path = tmp_path / "dump.parquet"
    write_dump(path, steps, row_group_size=11)
    with use_engine("numba"):
        cpu = rd.analyze(path, device="cpu", chunk_tokens=chunk_tokens)
    with use_engine(ENGINE):  # torch on CUDA
        cuda = rd.analyze(path, device=DEVICE, chunk_tokens=chunk_tokens)
    assert cuda.device.startswith(DEVICE)
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
    with use_engine(ENGINE):
        cuda = rd.compare_presets(path, ALL_PRESETS, device=DEVICE, chunk_tokens=37)
    for cpu_preset, cuda_preset in zip(cpu.presets, cuda.presets, strict=True):
        assert cpu_preset.name == cuda_preset.name
        assert_same(cpu_preset.run.metrics, cuda_preset.run.metrics)


# ---------------------------------------------------------------- the kernel-equality tests, with torch on CUDA
# tests/kernels/test_kernel.py requires the torch engine on the CPU to equal the numba kernels over every test dump;
# here the same documents are compared with the torch engine on the GPU, so the device is the only thing that differs.


def assert_same_document(cpu_doc, cuda_doc) -> None:
    """Two JSON documents equal: floats as :func:`assert_close` (named by their key), every other value exact."""
    kernel.assert_same_document(cpu_doc, cuda_doc, close=assert_close, skipped=("elapsed_seconds", "engine", "device"))


def same_document(cpu_doc: dict, cuda_doc: dict) -> None:
    assert cuda_doc["device"].startswith(DEVICE) and cpu_doc["device"] == "cpu"
    assert_same_document(cpu_doc, cuda_doc)


def analyze_on_both(path, **options) -> None:
    with use_engine("numba"):
        cpu = rd.analyze(path, device="cpu", workers=1, **options).to_json()
    with use_engine(ENGINE):
        cuda = rd.analyze(path, device=DEVICE, workers=1, **options).to_json()
    same_document(cpu, cuda)


def samples():
    from helpers.kernel import SAMPLES

    return SAMPLES


@pytest.mark.parametrize("path", samples(), ids=[p.name for p in samples()])
def test_the_samples_on_cuda_equal_the_kernels(path):
    analyze_on_both(path, dialect="all")


@pytest.mark.parametrize("chunk_tokens", [37, 1 << 20])
@pytest.mark.parametrize("seed", [0, 1])
def test_random_dumps_on_cuda_equal_the_kernels(tmp_path, seed, chunk_tokens):
    rng = np.random.default_rng(seed)
    path = tmp_path / "dump.parquet"
    write_dump(path, {step: random_rows(rng, 20) for step in (0, 1, 4)}, row_group_size=7)
    analyze_on_both(path, chunk_tokens=chunk_tokens, top_k=5)


def test_presets_and_sweep_on_cuda_equal_the_kernels(tmp_path):
    path = tmp_path / "presets.parquet"
    write_preset_dump(path, random_steps(3))
    documents = {}
    for device, engine in (("cpu", "numba"), (DEVICE, ENGINE)):
        with use_engine(engine):
            documents[device] = (
                rd.compare_presets(path, ALL_PRESETS, device=device, chunk_tokens=37, workers=1).to_json(),
                rd.threshold_sweep(path, device=device).to_json(),
            )
    (cpu_presets, cpu_sweep), (cuda_presets, cuda_sweep) = documents["cpu"], documents[DEVICE]
    assert_same_document(cpu_presets, cuda_presets)
    assert_same_document(cpu_sweep, cuda_sweep)


@pytest.mark.skipif(not ON_A_GPU, reason="the GPU's chunk size: on a GPU only")
def test_a_gpu_reads_larger_chunks_unless_told_a_size(tmp_path, monkeypatch):
    """On CUDA the CPU's default chunk size becomes GPU_CHUNK_TOKENS (its cost is per chunk); a chosen size is kept."""
    from rollout_diag.drivers import passes
    from rollout_diag.io.reader import DumpReader

    sizes: list[int] = []
    original = DumpReader.chunks

    def spy(self, *args, **kwargs):
        sizes.append(self.chunk_tokens)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(DumpReader, "chunks", spy)
    path = tmp_path / "dump.parquet"
    write_dump(path, {0: random_rows(np.random.default_rng(3), 5)})
    rd.analyze(path, device="cuda", workers=1)
    rd.analyze(path, device="cuda", workers=1, chunk_tokens=37)
    rd.compare_presets(path, device="cuda", workers=1)
    assert sizes == [passes.GPU_CHUNK_TOKENS, 37, passes.GPU_CHUNK_TOKENS]
