"""The numba engine (rollout_diag/engine/kernels) against the torch engine (engine/stats.py ChunkStats) on the CPU.

The torch engine is what runs on CUDA; CI runs it on the CPU here and requires every result of the numba engine to
equal it (1e-12 relative, counts exact), so CUDA differs from CI only by the device (tests/test_cuda.py).
Per segment the kernel adds in numpy reduceat's order, so sums of quantities without an exp are bit-identical.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers.kernel import RTOL, SAMPLES, assert_same_document, chunk_of, layouts
from helpers.metrics import random_rows, write_dump
from helpers.presets import ALL_PRESETS, random_steps
from helpers.presets import write_dump as write_preset_dump
from hypothesis import given, settings
from hypothesis import strategies as st

import rollout_diag as rd
import rollout_diag.metrics.dialects
from rollout_diag.engine.choice import ENVIRONMENT, kernel_for, use_engine
from rollout_diag.engine.kernels import compiled
from rollout_diag.engine.stats import ChunkStats, KernelStats
from rollout_diag.errors import ConfigError
from rollout_diag.metrics.localize import DELTA_BINS, delta_bin

# exp / expm1: the torch engine takes torch's or numpy's, the kernel its own (tests/kernels/test_kernel_exp.py); they
# may differ by an ulp or two
EXP_QUANTITIES = {"k3", "skyrl_k3", "chi2_term", "trainer_prob", "rollout_prob", "prob_diff"}
# k3 = expm1(±δ) ∓ δ cancels to ~δ²/2: an ulp or two of expm1 (~|δ|·2^-52 each) is then the engines' difference, up to
# ~1e-11 of a lone token's k3 for |δ| near 1e-4 (docs/benchmarks.md, session 9); summed over a segment, its Σ|δ| (for a
# segment's max or min, its max or min |δ|) sets the scale. Seen: 2.7e-20 apart on a k3 sum of 2.6e-8 (1.06e-12 rel.).
CANCELLING = {"k3", "skyrl_k3"}


def both(layout) -> tuple[ChunkStats, KernelStats]:
    """The same chunk twice, with the torch engine and with the numba engine as its shared per-chunk engine."""
    reference, kernel = ChunkStats(chunk_of(*layout)), KernelStats(chunk_of(*layout))
    reference.chunk.cache["stats"], kernel.chunk.cache["stats"] = reference, kernel
    return reference, kernel


@settings(max_examples=60, deadline=None)
@given(layouts())
def test_segments_and_their_reductions_equal_the_torch_engine(layout):
    reference, kernel = both(layout)
    for name in ("segment_starts", "segment_length", "segment_row", "segment_bucket", "segment_round", "row_count"):
        assert torch.equal(getattr(kernel, name), getattr(reference, name)), name
    assert kernel.model_tokens == reference.model_tokens
    assert kernel.group_token_ranges == reference.group_token_ranges
    length = int(kernel.segment_length.max()) if kernel.segment_length.numel() else 0  # the longest segment
    for name in (*compiled().QUANTITIES, "rs_k1"):
        for reduction in ("segment_sum", "segment_max", "segment_min"):
            mine, theirs = getattr(kernel, reduction)(name).numpy(), getattr(reference, reduction)(name).numpy()
            if name in EXP_QUANTITIES:
                # |p_a − p_r| cancels: an ulp of a probability (≤ 2^-53) is the scale of the engines' difference
                atol = 1e-15 * length if name == "prob_diff" else 1e-300
                if name in CANCELLING:  # a tolerance per segment (assert_allclose takes one number)
                    scale = 1e-15 * np.abs(getattr(kernel, reduction)("abs_log_ratio").numpy())
                    close = np.isclose(mine, theirs, rtol=RTOL, atol=scale)
                    assert close.all(), f"{reduction}({name}): {mine[~close]} against {theirs[~close]}"
                    continue
                np.testing.assert_allclose(mine, theirs, rtol=RTOL, atol=atol, err_msg=f"{reduction}({name})")
            else:
                np.testing.assert_array_equal(mine, theirs, err_msg=f"{reduction}({name})")
    for bound in (1e-6, 0.01, 0.5):
        name = kernel.catastrophic(bound)
        assert reference.catastrophic(bound) == name
        np.testing.assert_array_equal(kernel.segment_sum(name).numpy(), reference.segment_sum(name).numpy())
    np.testing.assert_array_equal(
        kernel.delta_histogram(delta_bin, DELTA_BINS).numpy(), reference.delta_histogram(delta_bin, DELTA_BINS).numpy()
    )
    for floor in (0.0, 1e-3, 0.3, math.inf):
        (mine_index, mine_values), (index, values) = (
            kernel.largest_tokens("abs_log_ratio", floor),
            reference.largest_tokens("abs_log_ratio", floor),
        )
        assert torch.equal(mine_index, index) and torch.equal(mine_values, values)
        assert kernel.token_locations(index.tolist()) == reference.token_locations(index.tolist())
    for x, y in (("prob_diff", "prob_diff"), ("trainer_prob", "rollout_prob"), ("log_ratio", None), ("k3", "square")):
        mine, theirs = kernel.group_moments(x, y).numpy(), reference.group_moments(x, y).numpy()
        atol = 1e-15 * kernel.model_tokens if x == "prob_diff" else 1e-300
        np.testing.assert_allclose(mine, theirs, rtol=RTOL, atol=atol, err_msg=f"moments({x}, {y})")


@settings(max_examples=60, deadline=None)
@given(layouts())
def test_hint_evidence_equals_the_torch_engine(layout):
    """metrics.hints' per-row token patterns and probability buckets: the compiled pass against the torch code."""
    from rollout_diag.metrics.hints import HintEvidenceAccumulator, _ChunkEvidence

    reference, kernel = both(layout)
    mine, theirs = _ChunkEvidence(kernel.chunk), _ChunkEvidence(reference.chunk)
    assert isinstance(mine.stats, KernelStats) and not isinstance(theirs.stats, KernelStats)
    np.testing.assert_allclose(mine.rows.numpy(), theirs.rows.numpy(), rtol=RTOL, atol=1e-300)
    for name in ("dummy_zero", "dummy_zero_run", "copied", "tokens", "pairs", "first", "last", "rest"):
        np.testing.assert_array_equal(mine.column(name).numpy(), theirs.column(name).numpy(), err_msg=name)
    stats_mine = HintEvidenceAccumulator()._stats(kernel.chunk)
    stats_theirs = HintEvidenceAccumulator()._stats(reference.chunk)
    for name, value in stats_theirs.items():
        np.testing.assert_allclose(stats_mine[name].numpy(), value.numpy(), rtol=RTOL, atol=1e-300, err_msg=name)


@settings(max_examples=40, deadline=None)
@given(layouts())
def test_the_pass_without_probabilities_changes_nothing_else(layout):
    """``prepare(..., probabilities=False)`` (compare-presets: no debug family) runs the fused pass without them: every
    other result of the fused pass is the full pass's, bit for bit, and the probability quantities, read anyway, are
    reduced from the tokens by the torch engine's code, not taken as the lean pass's zeros."""
    from rollout_diag.engine.quantities import PROBABILITIES
    from rollout_diag.engine.stats import prepare

    reference, full = both(layout)
    lean = KernelStats(chunk_of(*layout))
    lean.chunk.cache["stats"] = lean
    prepare(lean.chunk, probabilities=False)
    assert not lean.probabilities and full.probabilities
    (full_sums, full_max, full_min, _, full_histogram, full_counts), full_hints = full._fused
    (sums, maxima, minima, moments, histogram, counts), hints = lean._fused
    assert moments.shape[1] == 0  # the moment pairs are the probabilities'
    kernels = compiled()
    for name, column in kernels.COLUMN.items():
        if name not in PROBABILITIES:
            np.testing.assert_array_equal(sums[column], full_sums[column], err_msg=name)
    for name, column in kernels.EXTREME.items():
        if name not in PROBABILITIES:
            np.testing.assert_array_equal(maxima[column], full_max[column], err_msg=name)
            np.testing.assert_array_equal(minima[column], full_min[column], err_msg=name)
    np.testing.assert_array_equal(histogram, full_histogram)
    np.testing.assert_array_equal(counts, full_counts)
    for mine, theirs in zip(hints, full_hints, strict=True):
        np.testing.assert_array_equal(mine, theirs)
    for name in PROBABILITIES:
        for reduction in ("segment_sum", "segment_max", "segment_min"):
            np.testing.assert_array_equal(
                getattr(lean, reduction)(name).numpy(), getattr(reference, reduction)(name).numpy(), err_msg=name
            )
    for x, y in (("prob_diff", "prob_diff"), ("trainer_prob", "rollout_prob")):
        # the kernel's centred sums (its own exps) about the torch code's means: an ulp of a probability apart
        atol = 1e-15 * lean.model_tokens
        mine, theirs = lean.group_moments(x, y).numpy(), reference.group_moments(x, y).numpy()
        np.testing.assert_allclose(mine, theirs, rtol=RTOL, atol=atol, err_msg=f"moments({x}, {y})")


def test_a_quantity_outside_the_kernel_is_reduced_by_the_torch_code():
    layout = (
        [5, 0, 9],
        [True] * 3 + [False, True] + [True, True, False, True, True, True, False, False, True],
        [0, 1, 0],
        3,
    )
    reference, kernel = both(layout)
    for name in ("token_is_weight", "rs_k3", "exp_abs_log_ratio"):
        np.testing.assert_array_equal(kernel.segment_sum(name).numpy(), reference.segment_sum(name).numpy())
        np.testing.assert_array_equal(kernel.row_max(name).numpy(), reference.row_max(name).numpy())


def test_a_long_segment_adds_in_numpys_order():
    """One row of 70 000 model tokens: its last log2 segments (32 768 tokens) take numpy's pairwise tree."""
    layout = ([70_000], [True] * 70_000, [4], 11)
    reference, kernel = both(layout)
    for name in ("log_ratio", "abs_log_ratio", "square", "rs_k2", "hint_cross", "hint_clipped_square"):
        np.testing.assert_array_equal(kernel.segment_sum(name).numpy(), reference.segment_sum(name).numpy())


# ------------------------------------------------------------------------------------------ end to end


def analyze_both(path, **options):
    with use_engine("numba"):
        numba_result = rd.analyze(path, device="cpu", **options)
    with use_engine("torch"):
        torch_result = rd.analyze(path, device="cpu", **options)
    return numba_result.to_json(), torch_result.to_json()


@pytest.mark.parametrize("chunk_tokens", [37, 1 << 20])
@pytest.mark.parametrize("seed", [0, 1])
def test_analysis_of_random_dumps_equals_the_torch_engine(tmp_path, seed, chunk_tokens):
    rng = np.random.default_rng(seed)
    steps = {step: random_rows(rng, 20) for step in (0, 1, 4)}
    path = tmp_path / "dump.parquet"
    write_dump(path, steps, row_group_size=7)
    assert_same_document(*analyze_both(path, chunk_tokens=chunk_tokens, top_k=5))


@pytest.mark.parametrize("path", SAMPLES, ids=[p.name for p in SAMPLES])
def test_analysis_of_the_samples_equals_the_torch_engine(path):
    # every trainer and every variant (verl@b178a3c, areal:kpop, …): both engines
    assert_same_document(*analyze_both(path, dialect=",".join(rollout_diag.metrics.dialects.FRAMEWORKS)))


def test_presets_and_sweep_equal_the_torch_engine(tmp_path):
    path = tmp_path / "presets.parquet"
    write_preset_dump(path, random_steps(3))
    with use_engine("numba"):
        numba_result = rd.compare_presets(path, ALL_PRESETS, device="cpu", chunk_tokens=37)
        numba_sweep = rd.threshold_sweep(path, device="cpu")
    with use_engine("torch"):
        torch_result = rd.compare_presets(path, ALL_PRESETS, device="cpu", chunk_tokens=37)
        torch_sweep = rd.threshold_sweep(path, device="cpu")
    assert_same_document(numba_result.to_json(), torch_result.to_json())
    assert_same_document(numba_sweep.to_json(), torch_sweep.to_json())


@pytest.mark.parametrize("chunk_tokens", [37, 500, 1 << 20])
def test_numba_engine_is_chunk_size_invariant(tmp_path, chunk_tokens):
    rng = np.random.default_rng(5)
    path = tmp_path / "dump.parquet"
    write_dump(path, {step: random_rows(rng, 15) for step in range(3)})
    with use_engine("numba"):
        whole = rd.analyze(path, device="cpu", chunk_tokens=1 << 22).to_json()
        chunked = rd.analyze(path, device="cpu", chunk_tokens=chunk_tokens).to_json()
    assert_same_document(chunked, whole)


# ------------------------------------------------------------------------------------------- selection
def test_engine_selection(monkeypatch):
    monkeypatch.delenv(ENVIRONMENT, raising=False)
    assert kernel_for("cpu") and not kernel_for("cuda")  # auto
    with use_engine("torch"):
        assert not kernel_for("cpu")
    with use_engine("numba"):
        assert kernel_for("cpu")
        with pytest.raises(ConfigError, match="runs on the CPU"):
            kernel_for("cuda")
    with pytest.raises(ConfigError, match="not an engine"), use_engine("fortran"):
        pass
    monkeypatch.setenv(ENVIRONMENT, "gpu")
    with pytest.raises(ConfigError, match="ROLLOUT_DIAG_ENGINE=gpu"):
        kernel_for("cpu")


def test_auto_runs_torch_on_a_small_input(monkeypatch, engines_seen):
    """``auto`` on the CPU, where the chunks are tensors (torch is loaded anyway: ``inspect``): the torch engine for an
    input of fewer tokens than the bound (from the footers), the numba kernels from the bound up; an explicit engine
    holds whatever the size; no size known: the kernels. The commands on numpy chunks (``analyze``,
    ``compare-presets``, no torch): the kernels at any size."""
    from rollout_diag.drivers.dump import Dump
    from rollout_diag.engine.choice import SMALL_INPUT_ENVIRONMENT, SMALL_INPUT_ROWS, small_input_tokens
    from rollout_diag.io.reader import DumpReader

    monkeypatch.delenv(ENVIRONMENT, raising=False)
    path = SAMPLES[-1]
    tokens, rows = Dump(path).open().input_size()
    assert rows < SMALL_INPUT_ROWS
    seen = engines_seen
    for bound, engine, expected in (
        (tokens + 1, None, "torch"),
        (tokens, None, "numba"),
        (tokens + 1, "numba", "numba"),
        (0, "torch", "torch"),
    ):
        monkeypatch.setenv(SMALL_INPUT_ENVIRONMENT, str(bound))
        with use_engine(engine):
            engines = {chunk.engine for chunk, _ in DumpReader(str(path)).chunks("cpu")}  # tensor chunks
        assert engines == {expected}, (bound, engine)
        for command in (rd.analyze, lambda dump: rd.compare_presets(dump, presets=["decoupled_token_is"])):
            seen.clear()
            command(Dump(path, device="cpu", engine=engine))
            assert set(seen) == {"ChunkStats" if engine == "torch" else "KernelStats"}, (bound, engine)
    monkeypatch.setenv(SMALL_INPUT_ENVIRONMENT, "10")
    assert not kernel_for("cpu", (9, 1)) and kernel_for("cpu", (10, 1)) and kernel_for("cpu", None)
    # many rows (each perhaps a step of its own: the torch engine's cost per step is higher) go to the kernels
    assert not kernel_for("cpu", (9, SMALL_INPUT_ROWS - 1)) and kernel_for("cpu", (9, SMALL_INPUT_ROWS))
    assert not kernel_for("cuda", (10**9, 10**9))
    monkeypatch.delenv(SMALL_INPUT_ENVIRONMENT)
    assert small_input_tokens() == 1 << 22
    monkeypatch.setenv(SMALL_INPUT_ENVIRONMENT, "-3")
    with pytest.raises(ConfigError, match="ROLLOUT_DIAG_SMALL_INPUT_TOKENS=-3"):
        kernel_for("cpu", (5, 1))


@pytest.mark.parametrize("layout", ["sequence", "token"])
def test_input_size_is_what_is_read(tmp_path, layout):
    """``DumpReader.input_size`` (from the footers, what ``auto`` is chosen by) is the number of tokens the chunks
    hold and of the file rows, for the whole input and for a part of it."""
    from helpers.dumps import random_rows, write_sequence_dump, write_token_dump

    from rollout_diag.io.reader import DumpReader

    rows = random_rows(3, steps=range(4), rows_per_step=5, max_length=40)
    if layout == "sequence":  # parts split at row groups
        paths = [str(write_sequence_dump(tmp_path / "dump.parquet", rows, row_group_size=3))]
    else:  # parts split at files
        paths = [str(write_token_dump(tmp_path / f"{i}.parquet", rows[i * 10 : i * 10 + 10])) for i in range(2)]

    def size_read(reader: DumpReader) -> tuple[int, int]:
        chunks = [chunk for chunk, _ in reader.chunks("cpu", prefetch=0)]
        tokens = sum(int(chunk.offsets[-1]) for chunk in chunks)
        return tokens, tokens if layout == "token" else sum(chunk.rows for chunk in chunks)

    reader = DumpReader(paths)
    whole = size_read(reader)
    assert reader.input_size() == whole
    assert whole[0] == sum(len(row["rollout"]) for row in rows)
    part = reader.plan(2)[-1]
    worker = DumpReader(paths, parts=part)
    assert 0 < worker.input_size()[0] < whole[0]
    assert worker.input_size() == size_read(DumpReader(paths, parts=part))


def test_a_worker_runs_the_engine_it_is_given(monkeypatch, engines_seen):
    """A worker (``run_part``) runs the driver's engine setting, not its own process's (a Ray worker may have been
    started before the setting); its pass (numpy chunks, presets or not) runs the kernels at any size under
    ``auto``."""
    from rollout_diag.drivers.distributed import run_part
    from rollout_diag.drivers.passes import PassSpec
    from rollout_diag.engine.choice import SMALL_INPUT_ENVIRONMENT
    from rollout_diag.io.reader import DumpReader
    from rollout_diag.presets import PRESETS

    seen = engines_seen
    reader = DumpReader(str(SAMPLES[-1]))
    tokens, _ = reader.input_size()
    presets = PassSpec({}, presets=[PRESETS["decoupled_token_is"]])
    monkeypatch.setenv(SMALL_INPUT_ENVIRONMENT, str(tokens + 1))  # the input is below the small-input bound …
    for process, engine, spec, expected in (
        ("numba", "torch", presets, "ChunkStats"),
        ("torch", "numba", presets, "KernelStats"),
        ("torch", "auto", presets, "KernelStats"),  # … which does not matter: numpy chunks
        ("numba", "auto", presets, "KernelStats"),
        ("numba", "auto", PassSpec({}), "KernelStats"),
    ):
        job = (reader.worker_inputs(), {}, reader.plan(1)[0], False, reader.chunk_tokens, "cpu", spec)
        seen.clear()
        with use_engine(process):
            run_part(*job, engine=engine)
        assert set(seen) == {expected}, (process, engine, spec.presets)


def test_a_small_input_compares_presets_with_the_kernels_and_without_torch():
    """A fresh process comparing presets on the bundled sample with the default engine runs the numba kernels on numpy
    chunks and never imports torch (the small-input rule is for readings of tensor chunks, where torch is loaded
    anyway)."""
    env = {k: v for k, v in os.environ.items() if k != "ROLLOUT_DIAG_SMALL_INPUT_TOKENS"}
    env.pop(ENVIRONMENT, None)
    code = (
        "import sys, rollout_diag as rd\n"
        f"rd.compare_presets({str(SAMPLES[-1])!r}, device='cpu')\n"
        "print('numba' in sys.modules, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "True False", out.stdout + out.stderr


def test_a_fresh_cache_compiles_once_and_says_so(tmp_path):
    """A run with an empty cache directory says once that it compiles; the next run loads the kernels silently."""
    sample = SAMPLES[0]
    code = (
        "import sys, rollout_diag as rd; from rollout_diag.engine.choice import use_engine\n"
        f"with use_engine('numba'): rd.analyze({str(sample)!r}, device='cpu')\n"
    )
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert first.stderr.count("compiling the CPU kernels once") == 1, first.stderr
    second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert "compiling" not in second.stderr, second.stderr


def test_dump_engine_option_selects_the_engine(tmp_path, monkeypatch, engines_seen):
    """``Dump(engine=…)`` holds for the calls that read it; without one the process setting holds."""
    from rollout_diag.drivers.dump import Dump

    monkeypatch.delenv(ENVIRONMENT, raising=False)
    seen = engines_seen
    path = SAMPLES[-1]
    rd.analyze(Dump(path, device="cpu", engine="torch"))
    assert set(seen) == {"ChunkStats"}
    seen.clear()
    rd.analyze(Dump(path, device="cpu"))
    assert set(seen) == {"KernelStats"}
    with pytest.raises(ConfigError, match="not an engine"):
        Dump(path, engine="gpu")


def test_cli_engine_option(tmp_path, monkeypatch):
    """``rollout-diag --engine torch analyze`` and the default give the same JSON (the engines agree)."""
    from typer.testing import CliRunner

    from rollout_diag.cli import app

    monkeypatch.delenv(ENVIRONMENT, raising=False)
    runner = CliRunner()
    documents = []
    for engine in ("torch", "numba"):
        out = tmp_path / f"{engine}.json"
        result = runner.invoke(app, ["--engine", engine, "analyze", str(SAMPLES[-1]), "-f", "json", "-o", str(out)])
        assert result.exit_code == 0, result.output
        documents.append(__import__("json").loads(out.read_text()))
    assert_same_document(documents[1], documents[0])
    bad = runner.invoke(app, ["--engine", "gpu", "analyze", str(SAMPLES[-1])])
    assert bad.exit_code == 2 and "gpu" in bad.output
    assert ENVIRONMENT not in os.environ  # the option held for the command only


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=1 << 40))
def test_a_size_class_holds_its_size_with_at_most_an_eighth_more(n: int) -> None:
    size_class = compiled().size_class
    got = size_class(n)
    assert got == n if n < 65536 else n <= got <= n + n // 8


def test_chunks_of_nearby_sizes_share_a_few_size_classes() -> None:
    # 2M-token chunks cut at rows come in as many sizes as chunks; their arrays in a few sizes fit one another
    size_class = compiled().size_class
    assert len({size_class(n) for n in range(1_500_000, 2_100_001, 997)}) <= 6
    # the class of a length is one of eight per doubling: 2**20 + 1 .. 2**21 take 2**20 + k * 2**17, k = 1..8
    assert {size_class(n) for n in range((1 << 20) + 1, (1 << 21) + 1, 4099)} == {
        (1 << 20) + k * (1 << 17) for k in range(1, 9)
    }
