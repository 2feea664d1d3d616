"""Reading ahead of torch (``DumpReader.read_ahead``, ``Dump.opened(read_ahead=True)``, the CLI's analyze,
compare-presets, report and check): on the numba engine on the CPU the reader decodes, validates and runs each
chunk's compiled passes (``kernels/prepass.py``) before torch is loaded, and the results, records and errors are
those of reading when the call reads."""

from __future__ import annotations

import math
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.dumps import seq_row, write_sequence_dump
from helpers.metrics import random_rows, write_dump

import rollout_diag as rd
from rollout_diag.drivers import distributed
from rollout_diag.drivers.dump import Dump, _one_process, built_without_gpu, read_ahead_depth, reads_ahead
from rollout_diag.engine.choice import use_engine
from rollout_diag.engine.kernels import prepass as prepass_module
from rollout_diag.errors import DataError
from rollout_diag.io.reader import DumpReader

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def dump(tmp_path):
    rng = np.random.default_rng(20)
    path = tmp_path / "dump.parquet"
    write_dump(path, {step: random_rows(rng, 30, max_len=60) for step in range(5)}, row_group_size=16)
    return path


def _analysis(path, read_ahead: bool, engine: str = "numba", chunk_tokens: int = 300) -> str:
    dump = Dump([str(path)], device="cpu", engine=engine, chunk_tokens=chunk_tokens, workers=1)
    return rd.analyze(dump.opened(read_ahead=read_ahead), top_k=5).to_json()


def _comparison(path, read_ahead: bool, chunk_tokens: int = 300) -> str:
    dump = Dump([str(path)], device="cpu", engine="numba", chunk_tokens=chunk_tokens, workers=1)
    from rollout_diag.render.export import comparison_json_pieces

    return "".join(comparison_json_pieces(rd.compare_presets(dump.opened(read_ahead=read_ahead))))


def test_the_first_chunks_are_read_and_their_kernels_run_before_torch_is_loaded(dump):
    script = f"""
import sys, time
from rollout_diag.drivers.dump import Dump
dump = Dump([{str(dump)!r}], device="cpu", engine="numba", chunk_tokens=300, workers=1).opened(read_ahead=True)
ahead = dump._reader[0]._ahead
deadline = time.monotonic() + 120
while time.monotonic() < deadline and len(ahead.items) < 3:
    time.sleep(0.01)
items = [item for item in list(ahead.items) if isinstance(item, tuple)]  # not the end marker
assert len(items) >= 3, items
assert all(item[0].prepass is not None for item in items), items
assert "torch" not in sys.modules
print("read ahead", len(items))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300, env=_env()
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("read ahead")


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONPATH": str(REPO)}


@pytest.mark.parametrize("chunk_tokens", [97, 300, 1 << 19])
def test_reading_ahead_changes_no_digit(dump, chunk_tokens):
    assert _analysis(dump, True, chunk_tokens=chunk_tokens) == _analysis(dump, False, chunk_tokens=chunk_tokens)


def test_reading_ahead_changes_no_digit_of_compare_presets(dump):
    assert _comparison(dump, True) == _comparison(dump, False)


def test_the_chunks_read_ahead_carry_the_kernels_the_chunk_would_compute(dump):
    """Each chunk's KernelPrepass equals the layout, fused pass and hint rows KernelStats computes from the chunk."""
    from rollout_diag.engine.kernels.prepass import prepass

    reader = DumpReader([str(dump)], chunk_tokens=300)
    with use_engine("numba"):
        reader.read_ahead(4)
        deadline = time.monotonic() + 60
        while len(reader._ahead.items) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        chunks = [chunk for chunk, _ in reader.chunks("cpu")]
    # those read before the handover carry their passes; the rest compute them when read (KernelStats)
    assert len(chunks) > 8 and all(chunk.prepass is not None for chunk in chunks[:4])
    assert chunks[-1].prepass is None
    for chunk in (chunk for chunk in chunks if chunk.prepass is not None):
        ahead = chunk.prepass
        arrays = (chunk.step, chunk.offsets, chunk.trainer, chunk.rollout, chunk.mask)
        mine = prepass(*(tensor.numpy() for tensor in arrays))
        steps, row_group = torch.unique(chunk.step, sorted=True, return_inverse=True)
        assert ahead.steps == tuple(steps.tolist()) and np.array_equal(ahead.row_group, row_group.numpy())
        theirs = (*ahead.layout, *ahead.reductions, *ahead.hints)
        for value, own in zip(theirs, (*mine.layout, *mine.reductions, *mine.hints), strict=True):
            np.testing.assert_array_equal(value, own)


def test_blocks_decoded_while_the_kernels_load_are_all_read(dump, monkeypatch):
    """The reader decodes ahead while numba loads; blocks still waiting when the file ends are read too."""
    real = prepass_module.warm_up
    monkeypatch.setattr(prepass_module, "warm_up", lambda: (time.sleep(1.0), real()))
    assert _analysis(dump, True) == _analysis(dump, False)


def test_a_handover_to_the_torch_engine_gives_the_torch_engines_result(dump):
    """Chunks read ahead for the numba engine and taken by a call on the torch engine are its chunks (no prepass)."""
    dump_ahead = Dump([str(dump)], device="cpu", engine="numba", chunk_tokens=300, workers=1).opened(read_ahead=True)
    with use_engine("torch"):
        handed = rd.analyze(dump_ahead._reader[0], device="cpu", chunk_tokens=300, top_k=5).to_json()
    assert handed == _analysis(dump, False, engine="torch")


def _spoilt(tmp_path) -> Path:
    rows = [
        seq_row(
            step,
            f"s{step}-{i}",
            [-0.5, -1.0, -1.5, -2.0],
            [-0.6, math.nan if (step, i) == (1, 2) else -1.1, -1.4, -2.0],
            [1, 1, 1, 0],
        )
        for step in range(3)
        for i in range(6)
    ]
    return write_sequence_dump(tmp_path / "spoilt.parquet", rows, row_group_size=4)


def test_bad_rows_are_recorded_and_fail_strict_reading_as_without_reading_ahead(tmp_path):
    path = _spoilt(tmp_path)
    results = [_analysis(path, ahead, chunk_tokens=8) for ahead in (True, False)]
    assert results[0] == results[1] and results[0]["skipped_rows"] == 1
    errors = []
    for ahead in (True, False):
        dump = Dump([str(path)], device="cpu", engine="numba", chunk_tokens=8, workers=1, strict=True)
        with pytest.raises(DataError) as caught:
            rd.analyze(dump.opened(read_ahead=ahead))
        errors.append(str(caught.value))
    assert errors[0] == errors[1]


@pytest.mark.parametrize(
    "arguments",
    [
        ["analyze", "{dump}", "-f", "json", "--device", "cpu"],
        ["compare-presets", "{dump}", "-f", "json", "--chunk-tokens", "200"],
        ["analyze", "{spoilt}", "-f", "json", "--chunk-tokens", "8"],
        ["analyze", "{spoilt}", "--strict", "--chunk-tokens", "8"],
        ["compare-presets", "{spoilt}", "--strict"],
        ["analyze", "{dump}", "--top-k", "0"],
        ["check", "{dump}", "--max", "rollout_corr/k3_kl=1", "--per-step", "-f", "json", "--chunk-tokens", "200"],
        ["check", "{spoilt}", "--max", "rollout_corr/k3_kl=1", "--chunk-tokens", "8"],
        ["check", "{spoilt}", "--gates", "default", "--strict"],
    ],
    ids=[
        "analyze",
        "compare-presets",
        "skipped-rows",
        "strict",
        "strict-presets",
        "bad-option",
        "check",
        "check-skipped-rows",
        "check-strict",
    ],
)
def test_the_cli_gives_the_same_output_and_errors_as_without_reading_ahead(tmp_path, dump, monkeypatch, arguments):
    from typer.testing import CliRunner

    import rollout_diag.drivers.dump as dump_module
    from rollout_diag.cli import app

    spoilt = _spoilt(tmp_path)
    given = ["--engine", "numba", *(a.format(dump=dump, spoilt=spoilt) for a in arguments)]
    started = []
    real = dump_module.reads_ahead
    monkeypatch.setattr(dump_module, "reads_ahead", lambda *a: started.append(real(*a)) or started[-1])
    ahead = CliRunner().invoke(app, given)
    monkeypatch.setattr(dump_module, "reads_ahead", lambda *a: False)
    plain = CliRunner().invoke(app, given)
    assert started == [True]
    assert (ahead.exit_code, ahead.stdout, ahead.stderr) == (plain.exit_code, plain.stdout, plain.stderr)
    # check of the spoilt dump fails its default gate skipped_row_share (more than 1 % of its rows skipped): exit 3
    gated = arguments[0] == "check" and "{spoilt}" in arguments
    passes = "0" not in given and "--strict" not in given and not gated
    assert "Traceback" not in ahead.stderr and (ahead.exit_code == 0) == passes


def test_the_report_is_the_same_as_without_reading_ahead(tmp_path, dump, monkeypatch):
    from typer.testing import CliRunner

    import rollout_diag.drivers.dump as dump_module
    import rollout_diag.report as report_module
    from rollout_diag.cli import app

    monkeypatch.setattr(report_module, "_generated", lambda: "generated at a fixed time")
    started = []
    real = dump_module.reads_ahead
    monkeypatch.setattr(dump_module, "reads_ahead", lambda *a: started.append(real(*a)) or started[-1])
    pages = []
    for name in ("ahead.html", "plain.html"):
        given = ["--engine", "numba", "report", str(dump), "-o", str(tmp_path / name), "--chunk-tokens", "200"]
        result = CliRunner().invoke(app, given)
        assert result.exit_code == 0, result.output
        pages.append((tmp_path / name).read_bytes())
        monkeypatch.setattr(dump_module, "reads_ahead", lambda *a: False)
    assert started == [True]
    assert pages[0] == pages[1]


def test_read_ahead_only_where_the_call_reads_everything_with_numba_on_the_cpu(dump, monkeypatch):
    def decided(**options) -> bool:
        chosen = Dump([str(dump)], **{"device": "cpu", "engine": "numba", "workers": 1, **options})
        return reads_ahead(chosen, chosen.open())

    assert decided()
    assert not decided(engine="torch")
    assert not decided(device="cuda")
    assert not decided(device="meta")
    assert not decided(workers=2)
    assert decided(engine="auto")  # the suite's bound: auto is numba on the CPU whatever the size (conftest.py)
    monkeypatch.delenv("ROLLOUT_DIAG_SMALL_INPUT_TOKENS")
    assert not decided(engine="auto")  # a small input: the torch engine (engine.choice.kernel_for) …
    chosen = Dump([str(dump)], device="cpu", workers=1)
    assert reads_ahead(chosen, chosen.open(), numpy=True)  # … but numpy chunks (every reading command) run the kernels
    reader = DumpReader([str(dump)])
    reader.narrow(step=1)
    assert not reads_ahead(Dump([str(dump)], device="cpu", engine="numba", workers=1), reader)


@pytest.mark.parametrize("cores", [1, 2, 3, 8])
@pytest.mark.parametrize("workers", ["auto", 1, 2, 5])
def test_one_process_agrees_with_resolve_workers(dump, monkeypatch, cores, workers):
    import rollout_diag.cores as cores_module

    monkeypatch.setattr(cores_module, "available_cores", lambda: cores)  # what both read (cores.auto_cpu_workers)
    reader = DumpReader([str(dump)])
    assert _one_process(workers, reader) == (distributed.resolve_workers(workers, reader, torch.device("cpu")) == 1)


def test_a_torch_build_with_cuda_or_rocm_may_use_a_gpu():
    cpu_build = "__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\nhip: Optional[str] = None\n"
    assert built_without_gpu(cpu_build)
    assert not built_without_gpu(cpu_build.replace("cuda: Optional[str] = None", "cuda: Optional[str] = '12.4'"))
    assert not built_without_gpu(cpu_build.replace("hip: Optional[str] = None", "hip: Optional[str] = '6.2.4'"))
    assert not built_without_gpu("")


def test_depth_follows_the_chunk_size():
    assert read_ahead_depth(1 << 19) == 45
    assert read_ahead_depth(1 << 22) == 5
    assert read_ahead_depth(7) == 64 and read_ahead_depth(1 << 40) == 1


def test_a_reader_that_reads_ahead_refuses_to_change_what_it_reads(dump):
    from rollout_diag.selection import RowSelection

    reader = DumpReader([str(dump)])
    with use_engine("numba"):
        reader.read_ahead(2)
    reader.select(None)  # nothing to change
    reader.select(RowSelection(None, None))
    with pytest.raises(RuntimeError, match="reads ahead"):
        reader.select(RowSelection("step > 1", None))
    with pytest.raises(RuntimeError, match="reads ahead"):
        reader.narrow(step=1)
    chunks = reader.chunks("cpu")
    next(chunks)
    chunks.close()
    deadline = time.monotonic() + 5.0
    while any(t.name.startswith("rollout-diag") for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not [t.name for t in threading.enumerate() if t.name.startswith("rollout-diag")]
