"""The probability gates' compiled pass (rollout_diag/engine/kernels/presets.py gate_arguments, gate_finish) against the
torch engine's formula (engine/formulas.py gate_values) on the CPU: every token's kpop, bkl and tv bit for bit (both
take numpy's exp and log), the sweep's histograms of them counted alike, and compare-presets' and sweep's documents
equal in the two engines, near the clamps too."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.kernel import assert_same_document
from helpers.presets import make_chunk, write_dump

import rollout_diag as rd
from rollout_diag.engine.choice import use_engine
from rollout_diag.engine.stats import ChunkStats, KernelStats
from rollout_diag.metrics.sweep import exact_bin_edges, gate_histograms
from rollout_diag.presets import GATE_PRESETS


def gate_rows(seed: int, rows: int) -> list:
    """Rows with probabilities near 0 and 1 (either side of both clamps), near each other and far apart."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(rows):
        length = int(rng.integers(0, 50))
        rollout = -rng.choice([1e-9, 1e-7, 1e-5, 0.3, 2.0, 13.0, 14.5, 19.0, 30.0], length) * rng.uniform(
            0.5, 2, length
        )
        trainer = np.minimum(rollout + rng.normal(0, 1, length) * rng.choice([0.0, 1e-6, 0.05, 2.0], length), 0.0)
        mask = (rng.random(length) > 0.1).astype(np.float64)
        out.append((trainer, rollout, mask))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_compiled_gates_are_the_torch_engines_bit_for_bit(seed):
    records = [(step, row) for step in range(3) for row in gate_rows(seed + 11 * step, 7)]
    kernel_chunk, torch_chunk = make_chunk(records), make_chunk(records)
    kernel = KernelStats(kernel_chunk)
    kernel_chunk.cache["stats"] = kernel
    torch_chunk.cache["stats"] = reference = ChunkStats(torch_chunk)
    values = kernel.gate_values(exact_bin_edges())
    for index, name in enumerate(("rs_kpop", "rs_bkl", "rs_tv")):
        expected = reference.token(name)
        assert torch.equal(torch.from_numpy(values[index]), expected), name
        assert torch.equal(kernel.token(name), expected), name
    assert (values >= 0).all() and np.isfinite(values).all()
    assert torch.equal(
        torch.as_tensor(gate_histograms(kernel), dtype=torch.float64),
        torch.as_tensor(gate_histograms(reference), dtype=torch.float64),
    )


def test_compare_presets_and_sweep_of_the_gates_are_the_same_in_both_engines(tmp_path):
    path = tmp_path / "gates.parquet"
    write_dump(path, {step: gate_rows(40 + step, 9) for step in (0, 1, 4)})
    documents = []
    for engine in ("numba", "torch"):
        with use_engine(engine):
            compared = rd.compare_presets(path, list(GATE_PRESETS), device="cpu", chunk_tokens=53)
            swept = rd.threshold_sweep(path, device="cpu", chunk_tokens=53)
        documents.append((compared.to_json(), swept.to_json()))
    (compared_numba, swept_numba), (compared_torch, swept_torch) = documents
    assert_same_document(compared_numba, compared_torch)
    assert_same_document(swept_numba, swept_torch)
    assert {"token_kpop", "seq_mean_bkl"} <= {option["option"] for option in swept_numba["run"]}


def test_the_probabilities_buffers_come_in_the_kernels_size_classes():
    """gate_inputs allocates p and q in Python in the compiled kernels' size classes (kernels.cpu.size_class)."""
    from rollout_diag.engine.kernels.cpu import size_class
    from rollout_diag.engine.kernels.presets import _host_size_class

    sizes = [0, 1, 65_535, 65_536, 65_537, 100_000, 2**21, 2**21 + 1, 3_000_001, *range(1_000_000, 1_000_100)]
    assert [_host_size_class(n) for n in sizes] == [size_class(n) for n in sizes]


def test_the_gates_of_tokens_a_clamp_moves_come_from_their_own_logs():
    """Moved tokens (p or q beyond a clamp) sit among unmoved ones in the preset pass's segments: each token's kpop and
    bkl are the torch engine's (as torch.equal compares them), whichever segment and place holds it."""
    from rollout_diag.engine.formulas import gate_values
    from rollout_diag.engine.kernels import presets as kernels

    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 30, 40)
    raw = np.concatenate([[0], np.cumsum(lengths + 3)[:-1]]).astype(np.int64)  # three unread raw tokens between
    model = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    size = int(raw[-1] + lengths[-1])
    rollout = -rng.choice([0.0, 1e-9, 1e-7, 0.3, 2.0, 14.0, 19.0, np.inf], size)
    trainer = np.minimum(rollout + rng.choice([0.0, 1e-8, 0.5], size) * rng.normal(size=size), 0.0)
    inputs = kernels.gate_inputs(trainer, rollout, raw, model, lengths.astype(np.int64))
    found, _ = kernels.gate_tokens(
        trainer, rollout, raw, model, lengths.astype(np.int64), inputs, np.zeros(40, np.int64), 1, np.zeros(0),
        np.zeros(0, np.int64),
    )  # fmt: skip
    places = np.concatenate([np.arange(r, r + n) for r, n in zip(raw, lengths, strict=True)])
    expected = torch.stack(gate_values(torch.from_numpy(trainer[places]), torch.from_numpy(rollout[places]))).numpy()
    assert inputs[3].size > 0 and np.array_equal(found, expected)  # equal values: bit for bit but a zero's sign
