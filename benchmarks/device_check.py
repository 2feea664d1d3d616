#!/usr/bin/env python3
"""Everything the lent GPU machine is for, in one call: the CUDA tests, the GPU figures and the core-scaling table.

    python benchmarks/device_check.py --out "$OUT"                       # on the device machine (~4 minutes)
    python benchmarks/device_check.py --tokens 2000000 --cores 1,2 --workers 1,2,auto --out /tmp/dc   # a dry run
    python benchmarks/device_check.py --parts tests,gpu --out "$OUT"     # the CUDA tests and GPU figures only

Steps, each recorded in ``OUT/device_check.json`` (and the whole log in ``OUT/device_check.log``):

1. the machine: GPU, cores, versions of torch, numpy, numba, pyarrow;
2. ``tests/test_cuda.py`` (torch on CUDA against the numba kernels on the CPU over every test dump, 1e-12 relative);
3. a dump of ``--tokens`` tokens from ``sample_data/make_synthetic.py``;
4. on the GPU, in this process, after a warm-up: the read floor (benchmarks/floor_read.py), ``analyze`` and
   ``compare_presets`` end to end; the arithmetic alone (every analysis family over chunks already on the GPU, no
   read); the host synchronisations per chunk (torch's sync debug mode); the GPU result against the numba kernels
   on the CPU over the whole dump (largest relative difference of any number in the JSON);
5. on the CPU, fresh processes: ``analyze`` and ``compare_presets`` on 1/2/4/... cores (``taskset``, default
   options: what ``--workers auto`` makes of them) and on every core with ``--workers 1/2/4/...``.

A step that fails is recorded with its error and the script goes on: one call must bring back every figure it can.
Without a GPU, step 2 skips and step 4 is left out, saying so (the dry run on the build machine).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the package from this checkout, installed or not (the device machine: not)
LOG: list[str] = []

# A fresh process that times one command and reports its wall, CPU and peak memory as one JSON line.
CHILD = r"""
import json, resource, sys, time
start = time.perf_counter()
kind, path, device, workers = sys.argv[1:5]
workers = workers if workers == "auto" else int(workers)
if kind == "floor":
    sys.path.insert(0, "benchmarks")
    from floor_read import read
    read(path)
else:
    import rollout_diag as rd
    if kind == "analyze":
        rd.analyze(path, device=device, workers=workers)
    else:
        rd.compare_presets(path, device=device, workers=workers)
wall = time.perf_counter() - start
me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
cpu = me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime
# this process's peak (VmHWM: ru_maxrss survives exec on Linux and would show the parent's size at fork); workers'
# peaks are their own, ru_maxrss of the children, each forked from this process
with open("/proc/self/status") as status:
    peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
print(json.dumps({"wall": wall, "cpu": cpu, "rss_mb": peak / 1024, "worker_rss_mb": children.ru_maxrss / 1024}))
"""


def say(message: str) -> None:
    line = f"[{time.strftime('%H:%M:%S')}] {message}"
    LOG.append(line)
    print(line, flush=True)


def step(record: dict, name: str, work: Callable[[], Any]) -> Any:
    """Run one step; its result (or its error) goes into ``record[name]``; never raises."""
    started = time.perf_counter()
    say(f"-- {name}")
    try:
        record[name] = work()
    except Exception as exc:  # a device run must bring back what it can
        record[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        say(f"   FAILED: {type(exc).__name__}: {exc}")
    say(f"   {name} took {time.perf_counter() - started:.1f} s")
    return record[name]


def versions() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, Any] = {"python": platform.python_version(), "machine": platform.machine()}
    found["cores"] = os.cpu_count()
    for name in ("torch", "numpy", "numba", "llvmlite", "pyarrow", "typer", "rich", "polars", "plotly"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    import torch

    found["cuda_available"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        found["gpu"] = torch.cuda.get_device_name(0)
        found["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        found["torch_cuda"] = torch.version.cuda
    try:
        found["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        found["nvidia_smi"] = None
    with open("/proc/cpuinfo") as info:
        found["cpu"] = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), None)
    return found


def cuda_tests(timeout: int) -> dict[str, Any]:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "tests/test_cuda.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = (done.stdout + done.stderr).strip().splitlines()
    for line in lines[-40:]:
        say(f"   | {line}")
    return {"rc": done.returncode, "summary": lines[-1] if lines else "", "wall": time.perf_counter() - started}


def make_dump(tokens: int, path: Path) -> dict[str, Any]:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "sample_data/make_synthetic.py", "--tokens", str(tokens), "--out", str(path)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    return {"tokens": tokens, "bytes": path.stat().st_size, "wall": time.perf_counter() - started}


def synchronize() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(work: Callable[[], Any], repeat: int) -> tuple[float, list[float], Any]:
    """Median wall seconds of ``repeat`` runs (the GPU synchronised around each), every run's, the last result."""
    walls, result = [], None
    for _ in range(repeat):
        synchronize()
        started = time.perf_counter()
        result = work()
        synchronize()
        walls.append(time.perf_counter() - started)
    return sorted(walls)[len(walls) // 2], walls, result


def largest_difference(cpu: Any, gpu: Any, where: str = "", on_sums: bool = False) -> tuple[float, str, list[str]]:
    """The largest relative difference between two JSON documents' floats, where it is, and what else differs.
    ``on_sums``: chi2 metrics (a mean of ρ² less 1) compared on the mean, as tests/test_cuda.py does."""
    worst, at, other = 0.0, "", []
    if isinstance(cpu, dict) and isinstance(gpu, dict):
        for key in set(cpu) | set(gpu):
            if key in ("device", "elapsed_seconds", "engine"):
                continue
            if key not in cpu or key not in gpu:
                other.append(f"{where}/{key}: only on one side")
                continue
            found, place, more = largest_difference(cpu[key], gpu[key], f"{where}/{key}", on_sums)
            other += more
            if found > worst:
                worst, at = found, place
    elif isinstance(cpu, list) and isinstance(gpu, list):
        if len(cpu) != len(gpu):
            return worst, at, [f"{where}: {len(cpu)} against {len(gpu)} items"]
        for index, (mine, theirs) in enumerate(zip(cpu, gpu, strict=True)):
            found, place, more = largest_difference(mine, theirs, f"{where}[{index}]", on_sums)
            other += more
            if found > worst:
                worst, at = found, place
    elif isinstance(cpu, float) and isinstance(gpu, (float, int)) and not isinstance(gpu, bool):
        if math.isnan(cpu) or math.isnan(gpu):
            if not (math.isnan(cpu) and math.isnan(gpu)):
                other.append(f"{where}: {cpu} against {gpu}")
        elif cpu != gpu:
            if on_sums and "chi2" in where.rsplit("/", 1)[-1]:
                cpu, gpu = cpu + 1.0, gpu + 1.0
            scale = max(abs(cpu), abs(gpu))
            return (abs(cpu - gpu) / scale if scale else 0.0), where, []
    elif cpu != gpu:
        other.append(f"{where}: {cpu!r} against {gpu!r}"[:300])
    return worst, at, other


def on_the_gpu(path: Path, warm_path: Path, tokens: int, repeat: int, device: str, found: dict) -> dict[str, Any]:
    """Step 4; ``device="cpu"`` runs the same code with the torch engine on the CPU (the dry run of this function)."""
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from floor_read import read

    import rollout_diag as rd

    rd.analyze(warm_path, device=device)  # CUDA context, torch's kernels, the reader's modules
    rd.compare_presets(warm_path, device=device)
    floor, walls, _ = timed(lambda: read(str(path)), repeat)
    found["floor"] = {"wall": floor, "walls": walls, "tokens_per_s": tokens / floor}
    say(f"   floor (pyarrow read, in process): {floor:.3f} s = {tokens / floor / 1e6:.0f} M tokens/s")
    gpu = device.startswith("cuda")
    for size in CHUNK_SIZES:
        if gpu:
            torch.cuda.reset_peak_memory_stats()
        wall, walls, _ = timed(lambda size=size: rd.analyze(path, device=device, chunk_tokens=size), max(1, repeat - 1))
        peak = torch.cuda.max_memory_allocated() / 2**30 if gpu else math.nan
        found[f"analyze_chunk_{size}"] = {"wall": wall, "walls": walls, "tokens_per_s": tokens / wall, "gpu_gib": peak}
        rate = f"{tokens / wall / 1e6:.0f} M tokens/s, GPU peak {peak:.2f} GiB"
        say(f"   analyze, chunks of {size:,}: {wall:.3f} s = {rate}")
    wall, walls, gpu_result = timed(lambda: rd.analyze(path, device=device), repeat)
    found["analyze"] = {"wall": wall, "walls": walls, "tokens_per_s": tokens / wall, "device": gpu_result.device}
    rate = f"{tokens / wall / 1e6:.0f} M tokens/s ({wall / floor:.2f}x floor)"
    say(f"   analyze on {gpu_result.device}: {wall:.3f} s = {rate}")
    wall, walls, _ = timed(lambda: rd.compare_presets(path, device=device), repeat)
    found["compare_presets"] = {"wall": wall, "walls": walls, "tokens_per_s": tokens / wall}
    rate = f"{tokens / wall / 1e6:.0f} M tokens/s ({wall / floor:.2f}x floor)"
    say(f"   compare_presets on {device}: {wall:.3f} s = {rate}")

    equal_to_cpu(path, tokens, gpu_result, found)
    for size in CHUNK_SIZES:
        found[f"arithmetic_chunk_{size}"] = arithmetic_alone(path, device, size, max(1, repeat - 1))
    return found


def arithmetic_alone(path: Path, device: str, size: int, repeat: int) -> dict[str, Any]:
    """Every analysis family over chunks of ``size`` tokens already on the device (no read), and the host
    synchronisations per chunk (torch's sync debug mode, on up to 8 chunks)."""
    import warnings

    import torch

    import rollout_diag as rd
    from rollout_diag.drivers.passes import Analysis, Pass

    found: dict[str, Any] = {}
    reader = rd.Dump(str(path), chunk_tokens=size).open()
    chunks = [chunk for chunk, _ in reader.chunks(device, prefetch=0)]
    on_gpu = sum(int(chunk.mask.sum()) for chunk in chunks)

    def arithmetic(chunks: list) -> None:
        """Every analysis family over ``chunks``, as ``run_chunks`` feeds them (each chunk's shared values let go)."""
        work = Pass(Analysis())
        for chunk in chunks:
            chunk.cache.clear()
            work.prepare(chunk)
            for consume in work.consumers():
                consume(chunk)
            chunk.cache.clear()

    arithmetic(chunks)  # warm
    wall, walls, _ = timed(lambda: arithmetic(chunks), repeat)
    all_tokens = sum(int(chunk.trainer.numel()) for chunk in chunks)
    found["arithmetic"] = {
        "wall": wall,
        "walls": walls,
        "chunks": len(chunks),
        "tokens_per_s": all_tokens / wall,
        "model_tokens_per_s": on_gpu / wall,
    }
    rate = f"{all_tokens / wall / 1e6:.0f} M tokens/s"
    say(f"   arithmetic alone, chunks of {size:,}: {len(chunks)} chunks, {wall:.3f} s = {rate}")

    # host synchronisations per chunk: torch warns at each one in its sync debug mode
    sample = chunks[: min(8, len(chunks))]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if device.startswith("cuda"):
            torch.cuda.set_sync_debug_mode("warn")
        try:
            arithmetic(sample)
        finally:
            if device.startswith("cuda"):
                torch.cuda.set_sync_debug_mode("default")
    syncs = [str(w.message) for w in caught if "synchroniz" in str(w.message).lower()]
    places: dict[str, int] = {}
    for w in caught:
        if "synchroniz" in str(w.message).lower():
            key = f"{Path(w.filename).name}:{w.lineno}"
            places[key] = places.get(key, 0) + 1
    found["syncs"] = {"chunks": len(sample), "syncs": len(syncs), "per_chunk": len(syncs) / max(1, len(sample))}
    found["syncs"]["where"] = dict(sorted(places.items(), key=lambda item: -item[1])[:30])
    say(f"   host syncs: {len(syncs)} over {len(sample)} chunks = {len(syncs) / max(1, len(sample)):.1f} per chunk")
    chunks.clear()  # the GPU's memory back
    return found


def equal_to_cpu(path: Path, tokens: int, gpu_result: Any, found: dict) -> None:
    import rollout_diag as rd
    from rollout_diag.engine.choice import use_engine

    with use_engine("numba"):
        cpu_result = rd.analyze(path, device="cpu")
    cpu_doc, gpu_doc = cpu_result.to_json(), gpu_result.to_json()
    worst, at, other = largest_difference(cpu_doc, gpu_doc)
    on_sums, at_sums, _ = largest_difference(cpu_doc, gpu_doc, on_sums=True)
    found["equal_to_cpu"] = {
        "largest_relative_difference": worst,
        "where": at,
        "largest_on_sums": on_sums,
        "where_on_sums": at_sums,
        "other_differences": other[:20],
    }
    say(f"   GPU against the numba kernels on {tokens:,} tokens: largest relative difference {worst:.3g} at {at}")
    say(f"   ... with chi2 compared on the mean of rho^2: {on_sums:.3g} at {at_sums}")
    if other:
        say(f"   and {len(other)} other differences, first: {other[:3]}")


def fresh(kind: str, path: Path, workers: str, cores: int | None, timeout: int, device: str = "cpu") -> dict[str, Any]:
    command = [sys.executable, "-c", CHILD, kind, str(path), device, workers]
    pinned = None if cores is None else (lambda: os.sched_setaffinity(0, range(cores)))  # as taskset -c 0-(N-1)
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, preexec_fn=pinned)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:4])}…: rc {done.returncode}: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


KINDS = ("floor", "analyze", "compare")
CHUNK_SIZES = (1 << 20, 1 << 22, 1 << 23, 1 << 24)


def attempt(work: Callable[[], dict]) -> dict:
    """One fresh process's figures, or its error with NaN figures (the table goes on)."""
    try:
        return work()
    except Exception as exc:
        say(f"   FAILED: {type(exc).__name__}: {exc}")
        return {"wall": math.nan, "cpu": math.nan, "rss_mb": math.nan, "error": f"{type(exc).__name__}: {exc}"}


def on_the_cpu(path: Path, warm_path: Path, tokens: int, cores: list[int], workers: list[str], timeout: int) -> dict:
    fresh("analyze", warm_path, "1", None, timeout)  # compiles the kernels once (numba's cache)
    fresh("compare", warm_path, "1", None, timeout)
    table: dict[str, Any] = {"cores": {}, "workers": {}}
    available = len(os.sched_getaffinity(0))
    for count in cores:
        if count > available:
            say(f"   {count} cores: this machine has {available}; left out")
            continue
        row = {kind: attempt(partial(fresh, kind, path, "auto", count, timeout)) for kind in KINDS}
        table["cores"][count] = row
        say(
            f"   {count:>2} cores (auto): floor {row['floor']['wall']:.2f} s, analyze {row['analyze']['wall']:.2f} s "
            f"({tokens / row['analyze']['wall'] / 1e6:.0f} M tokens/s), compare {row['compare']['wall']:.2f} s"
        )
    for setting in workers:
        row = {kind: attempt(partial(fresh, kind, path, setting, None, timeout)) for kind in KINDS[1:]}
        table["workers"][setting] = row
        say(
            f"   --workers {setting:>4} on {available} cores: analyze {row['analyze']['wall']:.2f} s "
            f"({row['analyze']['rss_mb']:.0f} MB), compare {row['compare']['wall']:.2f} s"
        )
    return table


def gpu_workers(path: Path, tokens: int, timeout: int) -> dict[str, Any]:
    """``analyze --device cuda --workers N`` in fresh processes: whether several processes, each decoding its part
    and computing on the one GPU, lift the single reader thread's limit."""
    table: dict[str, Any] = {}
    for setting in ("1", "2", "4", "8"):
        table[setting] = attempt(partial(fresh, "analyze", path, setting, None, timeout, "cuda"))
        wall = table[setting]["wall"]
        say(f"   cuda --workers {setting}: analyze {wall:.2f} s ({tokens / wall / 1e6:.0f} M tokens/s, fresh process)")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=lambda text: int(float(text)), default=50_000_000)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/device_check")))
    parser.add_argument("--dir", type=Path, default=Path("/tmp"), help="where the generated dumps go")
    parser.add_argument("--cores", default="1,2,4,8,16", help="core counts for the scaling table (taskset)")
    parser.add_argument("--workers", default="1,2,4,8,16,auto", help="--workers settings on every core")
    parser.add_argument("--repeat", type=int, default=3, help="in-process GPU runs (median)")
    parser.add_argument(
        "--parts",
        type=lambda text: set(text.split(",")),
        default={"tests", "gpu", "cpu", "gpu_workers"},
        help="of tests,gpu,cpu,gpu_workers",
    )
    parser.add_argument("--gpu-on-cpu", action="store_true", help="without a GPU, run step 4 with torch on the CPU")
    parser.add_argument("--timeout", type=int, default=240, help="seconds for one child process")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.chdir(ROOT)
    record: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "tokens": args.tokens}
    try:
        machine = step(record, "machine", versions)
        say(f"   {json.dumps(machine)}")
        if "tests" in args.parts:
            step(record, "cuda_tests", lambda: cuda_tests(args.timeout))
        path, warm = args.dir / f"device_check_{args.tokens}.parquet", args.dir / "device_check_warm.parquet"
        step(record, "dump", lambda: make_dump(args.tokens, path))
        step(record, "warm_dump", lambda: make_dump(200_000, warm))
        if "gpu" not in args.parts:
            pass
        elif machine.get("cuda_available") or args.gpu_on_cpu:
            device = "cuda" if machine.get("cuda_available") else "cpu"
            record["gpu_so_far"] = found = {}  # what a failing step 4 had measured before it failed
            step(record, "gpu", lambda: on_the_gpu(path, warm, args.tokens, args.repeat, device, found))
        else:
            record["gpu"] = {"skipped": "torch sees no CUDA GPU"}
            say("-- gpu: skipped, torch sees no CUDA GPU")
        cores = [int(part) for part in args.cores.split(",") if part]
        workers = [part for part in args.workers.split(",") if part]
        if "cpu" in args.parts:
            step(record, "cpu", lambda: on_the_cpu(path, warm, args.tokens, cores, workers, args.timeout))
        if "gpu_workers" in args.parts:
            step(record, "gpu_workers", lambda: gpu_workers(path, args.tokens, args.timeout))
    finally:
        record["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
        (args.out / "device_check.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
        (args.out / "device_check.log").write_text("\n".join(LOG) + "\n")
        say(f"wrote {args.out / 'device_check.json'}")


if __name__ == "__main__":
    main()
