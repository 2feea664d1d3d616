#!/usr/bin/env python3
"""Tokens per second of each importer: `analyze` on one generated dataset written in every trainer format.

    python benchmarks/bench_importers.py --tokens 10000000
    python benchmarks/bench_importers.py --tokens 10000000 --write docs/benchmarks.md

The dataset is tests/fixtures_formats.py's (the one the importer tests use), scaled up: `--steps` steps of
rows up to `--max-length` tokens, written as Parquet (the reference) and as prime-rl, NeMo-RL, slime,
SkyRL and verl dumps by the same writers as the tests. Each contender is `rollout_diag.analyze` on that
directory in a fresh process (median of --repeat; wall seconds include interpreter start), and `convert`
of the same input. Peak RSS shows whether reading stays bounded (pickles and .pt hold a whole step).
"""

from __future__ import annotations

import argparse
import platform
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


def make_dumps(tokens: int, steps: int, max_length: int, root: Path) -> tuple[dict[str, Path], int]:
    """The dataset in every format under ``root`` (reused when already there); returns paths and its tokens."""
    import fixtures_formats as ff
    from dumps import random_rows

    rows_per_step = max(1, int(tokens / steps / ((1 + max_length) / 2)))
    marker = root / f"dataset_{tokens}_{steps}_{max_length}.done"
    paths = {"parquet": root / "dataset.parquet", **{name: root / name for name in ff.WRITERS}}
    rows = None
    if not marker.exists():
        root.mkdir(parents=True, exist_ok=True)
        rows = random_rows(11, steps=range(1, steps + 1), rows_per_step=rows_per_step, max_length=max_length)
        for row in rows:
            row["token_ids"] = list(range(len(row["rollout"])))
        ff.write_parquet(paths["parquet"], rows)
        for name, writer in ff.WRITERS.items():
            print(f"writing {name} …", file=sys.stderr)
            writer(paths[name], rows)
        marker.write_text(str(sum(len(row["rollout"]) for row in rows)))
    return paths, int(marker.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=10_000_000)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--max-length", type=int, default=2000)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/rollout_diag_bench_importers"))
    parser.add_argument("--write", type=Path, help="append the results as a markdown section to this file")
    args = parser.parse_args()

    paths, tokens = make_dumps(args.tokens, args.steps, args.max_length, args.dir)
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
        f"tests/fixtures_formats.py; median of {args.repeat} fresh processes (min–max), wall seconds.",
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
        "",
    ]
    publish(lines, args.write)


if __name__ == "__main__":
    main()
