"""The compiled kernels' specialisations and their cache (rollout_diag/engine/kernels).

numba compiles a kernel once per distinct set of argument types (dtype, layout, read-only flag), each a full compile
of 0.3–5 s, and loads what it compiled from its cache in later runs. Each test runs the commands in a fresh process
(the kernels' signatures there are the commands' alone, not those other tests call the kernels with) and reads back,
as JSON, every kernel's signatures and every compile numba started.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from helpers.dumps import random_rows, sequence_table, write_sequence_dump, write_table, write_token_dump

from rollout_diag.cores import available_cores
from rollout_diag.engine.kernels import cpu, presets

ROOT = Path(__file__).resolve().parents[2]

# Runs the commands on the numba engine over the dumps given, then prints {"signatures": {kernel: [signature]},
# "compiled": [function compiled in this process]}.
RUN = r"""
import json, sys
import numba.core.event as event
from numba.core.registry import CPUDispatcher

compiled = []


class Compiles(event.Listener):
    def on_start(self, found):
        function = found.data["dispatcher"].py_func
        compiled.append(f"{function.__module__}.{function.__name__}")

    def on_end(self, found):
        pass


event.register("numba:compile", Compiles())
import rollout_diag as rd
from rollout_diag.engine.choice import use_engine

commands = sys.argv[1].split(",")
with use_engine("numba"):
    for path in sys.argv[2:]:
        if "analyze" in commands:
            rd.analyze(path, device="cpu", workers=1)
            # small chunks: the worst tokens' prefilter from the second chunk on; every trainer's dialect
            rd.analyze(path, device="cpu", workers=1, top_k=1, chunk_tokens=37, dialect="all")
        if "compare" in commands:
            rd.compare_presets(path, presets=["all"], device="cpu", workers=1)  # the gates too: every kernel
        if "sweep" in commands:
            rd.threshold_sweep(path, device="cpu")
        if "report" in commands:
            rd.analyze_and_compare(path, device="cpu", workers=1)
from rollout_diag.engine.kernels import cpu, presets

signatures = {}
for module in (cpu, presets):
    for name, value in vars(module).items():
        if isinstance(value, CPUDispatcher):
            signatures[f"{module.__name__.rsplit('.', 1)[1]}.{name}"] = [str(s) for s in value.signatures]
print(json.dumps({"signatures": signatures, "compiled": compiled}))
"""


def run(commands: str, paths: list[Path], cache: Path | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if cache is not None:
        env["NUMBA_CACHE_DIR"] = str(cache)
    done = subprocess.run(
        [sys.executable, "-c", RUN, commands, *map(str, paths)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


# preset kernels no command runs on its default path: the gates' values token by token (KernelStats.token), and
# their exp and log as the torch engine takes them on the CPU (engine.formulas.gate_values)
ON_DEMAND = ("gate_tokens", "gate_exp", "gate_log")


def intended() -> dict[str, set[str]]:
    """kernel -> the signatures its module says it has (``SIGNATURES``); none for any other dispatcher."""
    return {
        f"{module.__name__.rsplit('.', 1)[1]}.{name}": {str(signature) for signature in signatures}
        for module in (cpu, presets)
        for name, signatures in module.SIGNATURES.items()
    }


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> list[Path]:
    """A dump of each input type the scan is compiled for: float32 and float64 logprobs, a byte mask, an int32
    mask, no mask; the sequence and the token layout."""
    directory = tmp_path_factory.mktemp("compile")
    rows = random_rows(3, rows_per_step=5, max_length=40)
    int32_mask = sequence_table(rows)
    index = int32_mask.schema.get_field_index("response_mask")
    int32_mask = int32_mask.set_column(index, "response_mask", int32_mask.column(index).cast(pa.list_(pa.int32())))
    return [
        write_sequence_dump(directory / "float32.parquet", rows),
        write_sequence_dump(directory / "float64.parquet", rows, logprob_type=pa.float64()),
        write_table(directory / "int32_mask.parquet", int32_mask),
        write_sequence_dump(directory / "no_mask.parquet", rows, names={"mask": None}),
        write_token_dump(directory / "token.parquet", rows),
    ]


def test_the_commands_compile_only_the_intended_signatures(dumps):
    found = run("analyze,compare,sweep,report", dumps)["signatures"]
    wanted = intended()
    for kernel, signatures in found.items():
        assert set(signatures) <= wanted.get(kernel, set()), kernel  # inline helpers: none of their own
    # one specialisation of every kernel after the scan, whatever the input's dtypes (a helper a kernel calls, _value,
    # gets its own only where that kernel is compiled rather than loaded from the cache)
    for kernel in {name for name in cpu.SIGNATURES if not name.startswith(("_", "checked"))}:
        assert found[f"cpu.{kernel}"] == [str(cpu.SIGNATURES[kernel][0])], kernel
    for kernel, signatures in presets.SIGNATURES.items():
        assert found[f"presets.{kernel}"] == ([] if kernel in ON_DEMAND else [str(signatures[0])]), kernel
    # the scan: one per logprob dtype and mask width, the inputs read-only (Arrow's buffers are, copies are not)
    float32, float64 = (
        [str(signature) for signature in cpu.SIGNATURES["checked_model_values"] if str(signature).startswith(prefix)]
        for prefix in ("(Array(float32", "(Array(float64")
    )
    assert sorted(found["cpu.checked_model_values"]) == sorted([*float32, float64[0]])  # uint8 and int64 masks
    assert found["cpu.checked_values"] == [str(cpu.SIGNATURES["checked_values"][0])]


def test_a_second_run_compiles_nothing(dumps):
    run("analyze,compare,sweep", dumps[:2])  # fills the cache where it lacks anything
    assert run("analyze,compare,sweep", dumps[:2])["compiled"] == []


def test_the_scan_reads_any_integer_mask():
    """Every integer mask dtype reads through the scan's two compiled mask widths (uint8, int64): 0 and 1 read as
    they are, any other value flags the block (the exact check then names it), a uint64 above 2**63 too."""
    from rollout_diag.io.decode import Block
    from rollout_diag.io.packing import scanned_values

    def block(mask: np.ndarray) -> Block:
        return Block(
            file="memory",
            file_row=np.zeros(1, dtype=np.int64),
            step=np.zeros(1, dtype=np.int64),
            sample_id=["0"],
            lengths=np.array([3], dtype=np.int64),
            trainer=np.array([-1.0, -2.0, -0.5], dtype=np.float32),
            rollout=np.array([-1.5, -2.0, -0.25], dtype=np.float32),
            mask=mask,
        )

    for dtype in (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64):
        trainer, rollout, model = scanned_values(block(np.array([1, 0, 1], dtype=dtype)), "cpu")
        assert model.tolist() == [True, False, True], dtype
        assert trainer.tolist() == [-1.0, 0.0, -0.5] and rollout.tolist() == [-1.5, 0.0, -0.25], dtype
        assert scanned_values(block(np.array([1, 2, 1], dtype=dtype)), "cpu") is None, dtype
    for bad, dtype in ((256, np.uint16), (1 << 33, np.int64), ((1 << 64) - 1, np.uint64), (1 << 63, np.uint64)):
        assert scanned_values(block(np.array([1, bad, 1], dtype=dtype)), "cpu") is None, (bad, dtype)


@pytest.mark.skipif(available_cores() < 2, reason="the helper process runs where a second core is")
def test_a_helper_process_compiles_the_preset_kernels(dumps, tmp_path):
    """An empty cache: compare-presets compiles the analysis kernels itself and leaves the preset kernels to a helper
    process (on the other core), then loads them from the cache; the result is the one a cached run gives."""
    first = run("compare", dumps[:1], cache=tmp_path / "cache")
    compiled_here = {name.rsplit(".", 1)[0] for name in first["compiled"]}
    assert "rollout_diag.engine.kernels.cpu" in compiled_here
    assert "rollout_diag.engine.kernels.presets" not in compiled_here
    for kernel, signatures in presets.SIGNATURES.items():
        assert first["signatures"][f"presets.{kernel}"] == ([] if kernel in ON_DEMAND else [str(signatures[0])])
    assert run("compare", dumps[:1], cache=tmp_path / "cache")["compiled"] == []


def test_readonly_views_keep_the_values():
    from rollout_diag.io.packing import readonly

    values = np.arange(10, dtype=np.float32)
    for given in (values, values[::2]):
        view = readonly(given)
        assert view.flags.c_contiguous and not view.flags.writeable
        assert np.array_equal(view, given)
    assert values.flags.writeable  # the caller's array is left as it was


CACHE_PROBE = """
import importlib, json, sys
sys.path.insert(0, sys.argv[1])
from rollout_diag.engine.kernels import _has_cache
module = importlib.import_module("probe")
before = _has_cache(module, ["double"])
module.double(2.0)  # loads it from numba's cache, or compiles it (and writes the cache)
print(json.dumps({"cached": before, "compiled": module.double.stats.cache_misses != {}}))
"""


def test_a_cache_counts_as_one_where_numba_loads_it(tmp_path):
    """_has_cache agrees with numba in every case: no cache, a cache of this source, of a source only touched (numba
    0.68 hashes the text: cached; 0.60 compares mtimes: not), of a source changed on the same line (not)."""
    source = tmp_path / "probe.py"

    def probe() -> dict:
        environment = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
        done = subprocess.run(
            [sys.executable, "-c", CACHE_PROBE, str(tmp_path)], capture_output=True, text=True, env=environment
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout.splitlines()[-1])

    source.write_text("from numba import njit\n\n@njit(cache=True)\ndef double(x):\n    return 2 * x\n")
    assert probe() == {"cached": False, "compiled": True}
    assert probe() == {"cached": True, "compiled": False}
    os.utime(source, (source.stat().st_atime, source.stat().st_mtime + 100))  # touched, the same text
    touched = probe()
    assert touched["cached"] == (not touched["compiled"])
    assert probe() == {"cached": True, "compiled": False}
    source.write_text(source.read_text().replace("2 * x", "3 * x"))  # changed on the same line
    os.utime(source, (source.stat().st_atime, source.stat().st_mtime + 200))
    assert probe() == {"cached": False, "compiled": True}


STALE_PROBE = """
import importlib, json, sys
sys.path.insert(0, sys.argv[1])
from rollout_diag.engine.kernels import drop_stale_caches
module = importlib.import_module("probe")
module.double(2.0)
module.triple(2.0)
print(json.dumps({"dropped": drop_stale_caches(module) if sys.argv[2] == "drop" else 0}))
"""


def test_an_earlier_versions_cache_files_are_dropped(tmp_path):
    """numba names a kernel's cache files by its line: a kernel that moved leaves its old files behind for good.
    drop_stale_caches removes those of the module's kernels as they are no longer written; the current ones, another
    Python's and another module's stay, and the next run loads from the cache."""
    source, cache = tmp_path / "probe.py", tmp_path / "cache"
    kernels = (
        "@njit(cache=True)\ndef double(x):\n    return 2 * x\n\n@njit(cache=True)\ndef triple(x):\n    return 3 * x\n"
    )

    def probe(action: str) -> int:
        environment = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
        done = subprocess.run(
            [sys.executable, "-c", STALE_PROBE, str(tmp_path), action], capture_output=True, text=True, env=environment
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout.splitlines()[-1])["dropped"]

    def names() -> set[str]:
        return {path.name for path in cache.rglob("*.nb*")}

    source.write_text("from numba import njit\n\n" + kernels)
    probe("keep")
    first = names()
    assert len(first) == 4 and {name.split("-")[0] for name in first} == {"probe.double", "probe.triple"}
    source.write_text("from numba import njit\n\n\n\n" + kernels)  # both kernels two lines down: new file names
    probe("keep")
    assert len(names()) == 8  # what numba leaves: both versions
    directory = next(cache.rglob("*.nbi")).parent
    tag = next(iter(first)).split(".py")[1].split(".")[0]
    others = {f"probe.double-1.py{int(tag) + 1}.nbi", "probes.double-3.py" + tag + ".nbi"}
    for name in others:
        (directory / name).write_bytes(b"")
    assert probe("drop") == 4
    assert names() - others == {name.replace("-3.", "-5.").replace("-7.", "-9.") for name in first}
    assert names() >= others
