#!/usr/bin/env python3
"""Tokens per second of each importer: `analyze` on one generated dataset written in every trainer format.

    python benchmarks/bench_importers.py --tokens 10000000
    python benchmarks/bench_importers.py --tokens 10000000 --write docs/benchmarks.md

The dataset is tests/helpers/formats.py's (the one the importer tests use), scaled up: `--steps` steps of
rows up to `--max-length` tokens, written as Parquet (the reference) and as prime-rl, NeMo-RL, slime,
SkyRL and verl dumps by the same writers as the tests. Each contender is `rollout_diag.analyze` on that
directory in a fresh process (median of --repeat; wall seconds include interpreter start), and `convert`
of the same input. Peak RSS shows whether reading stays bounded (pickles and .pt hold a whole step).

The JSON-lines importers (prime-rl, NeMo-RL) are also timed alone: every file read into the reader's
canonical Arrow batches, by the fast path (the compiled scanner, io/jsonl/) and by the
reference path (Python's json, line by line), in the same fresh process order; wall and CPU seconds of
the reading loop only (imports excluded), M tokens/s and CPU ns per token.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests"))
from bench_analyze import median_of, publish  # noqa: E402 - the sibling script

ANALYZE = """
import sys, rollout_diag
from rollout_diag.io.formats import DumpInputs
result = rollout_diag.analyze(DumpInputs([sys.argv[1]], sys.argv[3]), device=sys.argv[2])
assert result.run.tokens > 0
"""

CONVERT = """
import sys, tempfile, pathlib
from rollout_diag.io.convert import convert
from rollout_diag.io.formats import DumpInputs
with tempfile.TemporaryDirectory() as out:
    convert(DumpInputs([sys.argv[1]], sys.argv[3]), pathlib.Path(out) / "run.parquet")
"""

READ = """
import json, sys, time
from pathlib import Path
import pyarrow.compute as pc
from rollout_diag.io.formats import nemo_rl, prime_rl, resolve
module = {"prime-rl": prime_rl, "nemo-rl": nemo_rl}[sys.argv[2]]
_, sources = resolve([sys.argv[1]], sys.argv[2])
cpu, wall, tokens = time.process_time(), time.perf_counter(), 0
for source in sources:
    for batch in module.open_file(source.path, fast=sys.argv[3] == "fast").iter_batches(batch_size=4096):
        tokens += pc.sum(pc.list_value_length(batch.column("rollout_log_probs"))).as_py() or 0
print(json.dumps({"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu, "tokens": tokens}))
"""
JSONL_FORMATS = ("prime-rl", "nemo-rl")


def time_reads(path: Path, name: str, repeat: int) -> dict[str, dict[str, float]]:
    """Median wall and CPU seconds of reading ``path`` into canonical batches by each path (json, fast),
    the two alternating so that a change in the machine's load falls on both."""
    runs: dict[str, list[dict[str, float]]] = {"json": [], "fast": []}
    for _ in range(repeat):
        for how, done in runs.items():
            out = subprocess.run(
                [sys.executable, "-c", READ, str(path), name, how], check=True, capture_output=True, text=True
            )
            done.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {
        how: {key: statistics.median(run[key] for run in done) for key in ("wall", "cpu", "tokens")}
        for how, done in runs.items()
    }


def make_dumps(
    tokens: int, steps: int, max_length: int, root: Path, formats: set[str] | None = None
) -> tuple[dict[str, Path], int]:
    """The dataset in every format (or those of ``formats``) under ``root``, each reused when already
    there; returns paths and its tokens."""
    import helpers.formats as ff
    from helpers.dumps import random_rows

    rows_per_step = max(1, int(tokens / steps / ((1 + max_length) / 2)))
    root = root / f"dataset_{tokens}_{steps}_{max_length}"
    names = [name for name in ff.WRITERS if formats is None or name in formats]
    paths = {"parquet": root / "dataset.parquet", **{name: root / name for name in names}}
    rows = None
    for name, path in paths.items():
        if path.exists():
            continue
        if rows is None:
            rows = random_rows(11, steps=range(1, steps + 1), rows_per_step=rows_per_step, max_length=max_length)
            for row in rows:
                row["token_ids"] = list(range(len(row["rollout"])))
            root.mkdir(parents=True, exist_ok=True)
            (root / "tokens").write_text(str(sum(len(row["rollout"]) for row in rows)))
        print(f"writing {name} …", file=sys.stderr)
        (ff.write_parquet if name == "parquet" else ff.WRITERS[name])(path, rows)
    return paths, int((root / "tokens").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=10_000_000)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--max-length", type=int, default=2000)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/rollout_diag_bench_importers"))
    parser.add_argument("--write", type=Path, help="append the results as a markdown section to this file")
    parser.add_argument("--formats", help="comma-separated formats to time (default: all; parquet always)")
    parser.add_argument("--read-only", action="store_true", help="time only the JSON-lines reading, not analyze")
    args = parser.parse_args()

    formats = set(args.formats.split(",")) if args.formats else None
    paths, tokens = make_dumps(args.tokens, args.steps, args.max_length, args.dir, formats)
    reads = {}
    for name in (n for n in JSONL_FORMATS if n in paths):
        for how, read in time_reads(paths[name], name, args.repeat).items():
            reads[name, how] = read
    read_lines = [
        "",
        "JSON-lines reading alone (every file into canonical Arrow batches; reading loop only, median of "
        f"{args.repeat} fresh processes):",
        "",
        "| format | path | wall s | M tokens/s (wall) | CPU s | CPU ns/token |",
        "|---|---|---|---|---|---|",
    ]
    for (name, how), read in reads.items():
        read_lines.append(
            f"| {name} | {'compiled scanner (fast)' if how == 'fast' else 'Python json'} | {read['wall']:.2f} "
            f"| {read['tokens'] / read['wall'] / 1e6:.2f} | {read['cpu']:.2f} "
            f"| {read['cpu'] / read['tokens'] * 1e9:.0f} |"
        )
    if args.read_only:
        publish(
            [f"### JSON-lines importers, {tokens / 1e6:.1f}M tokens ({time.strftime('%Y-%m-%d')})", *read_lines],
            args.write,
        )
        return
    results = {}
    for name, path in paths.items():
        analyze = median_of(ANALYZE, args.repeat, str(path), args.device, name)
        converted = median_of(CONVERT, 1, str(path), args.device, name)
        size = sum(p.stat().st_size for p in ([path] if path.is_file() else path.rglob("*") if path.is_dir() else []))
        results[name] = (analyze, converted, size)

    lines = [
        f"### importers, {tokens / 1e6:.1f}M tokens, device {args.device} ({time.strftime('%Y-%m-%d')})",
        "",
        f"Machine: {platform.machine()}, {platform.processor() or 'cpu'}, Python {platform.python_version()}; "
        f"one dataset ({args.steps} steps, rows of 1–{args.max_length} tokens) written in every format by "
        f"tests/helpers/formats.py; median of {args.repeat} fresh processes (min–max), wall seconds.",
        "",
        "| format | input MB | analyze wall s | M tokens/s | peak RSS MB | convert wall s |",
        "|---|---|---|---|---|---|",
    ]
    for name, (analyze, converted, size) in results.items():
        spread = f"{analyze['wall_min']:.2f}–{analyze['wall_max']:.2f}"
        lines.append(
            f"| {name} | {size / 1e6:.0f} | {analyze['wall']:.2f} ({spread}) "
            f"| {tokens / analyze['wall'] / 1e6:.2f} | {analyze['rss_mb']:.0f} | {converted['wall']:.2f} |"
        )
    base = results["parquet"][0]["wall"]
    slowest = max(results, key=lambda n: results[n][0]["wall"])
    lines += [
        "",
        f"- slowest importer: {slowest}, {results[slowest][0]['wall'] / base:.1f}× the Parquet reference",
        *read_lines,
        "",
    ]
    publish(lines, args.write)


if __name__ == "__main__":
    main()
