#!/usr/bin/env python3
"""Time and peak RSS of `analyze` (and the pyarrow read floor) at growing dump sizes: linear time, flat memory.

    python benchmarks/bench_scaling.py                                   # 10M, 100M, 1G tokens
    python benchmarks/bench_scaling.py --sizes 10e6,100e6 --write docs/benchmarks.md

Each dump is generated streaming by ``sample_data/make_synthetic.py`` (bounded memory whatever the size),
measured in fresh processes, and deleted afterwards unless ``--keep`` (1G tokens is about 7.5 GB on disk).
Sizes above ``--repeat-below`` tokens are measured once; smaller ones ``--repeat`` times (median).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_analyze import ANALYZE, FLOOR, make_dump, median_of, publish  # the sibling script


def parse_sizes(text: str) -> list[int]:
    return [int(float(part)) for part in text.split(",") if part.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=parse_sizes, default=parse_sizes("10e6,100e6,1e9"), help="token counts")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--repeat-below", type=float, default=200e6, help="sizes below this are repeated")
    parser.add_argument("--dir", type=Path, default=Path("/tmp"), help="where the generated dumps go")
    parser.add_argument("--keep", action="store_true", help="keep the generated dumps")
    parser.add_argument("--write", type=Path, help="append the results as a markdown section to this file")
    args = parser.parse_args()

    rows = []
    for tokens in args.sizes:
        path = make_dump(tokens, args.dir / f"rollout_diag_bench_{tokens}.parquet")
        size_gb = path.stat().st_size / 1e9
        repeat = args.repeat if tokens < args.repeat_below else 1
        floor = median_of(FLOOR, repeat, str(path))
        analyze = median_of(ANALYZE, repeat, str(path), args.device)
        rows.append((tokens, size_gb, repeat, floor, analyze))
        if not args.keep:
            path.unlink()
        print(f"{tokens:,} tokens: floor {floor['wall']:.2f} s, analyze {analyze['wall']:.2f} s", file=sys.stderr)

    lines = [
        f"### Scaling of analyze, device {args.device} ({time.strftime('%Y-%m-%d')})",
        "",
        f"Machine: {platform.machine()}, Python {platform.python_version()}; dumps from sample_data/make_synthetic.py; "
        "fresh processes, wall seconds including interpreter start (median of the runs shown).",
        "",
        "| tokens | file GB | runs | floor s | analyze s | analyze / floor | analyze ns/token | peak RSS MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for tokens, size_gb, repeat, floor, analyze in rows:
        lines.append(
            f"| {tokens / 1e6:,.0f}M | {size_gb:.2f} | {repeat} | {floor['wall']:.2f} | {analyze['wall']:.2f} "
            f"| {analyze['wall'] / floor['wall']:.2f}× | {analyze['wall'] / tokens * 1e9:.0f} "
            f"| {analyze['rss_mb']:.0f} |"
        )
    lines.append("")
    publish(lines, args.write)


if __name__ == "__main__":
    main()
