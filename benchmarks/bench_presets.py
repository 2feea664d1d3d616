#!/usr/bin/env python3
"""Time `compare_presets` (verl's 19 presets in one pass) against `analyze` and the obvious alternative.

    python benchmarks/bench_presets.py --tokens 12500000
    python benchmarks/bench_presets.py --tokens 12500000 --write docs/benchmarks.md

The alternative is what one would write by hand: for each preset, read the dump, pad each step into
[B, L] tensors and compute that preset's IS weights and rejection mask in one torch batch, then its main
numbers (IS mean / max / ESS, share of tokens rejected). It computes far fewer metrics than
compare_presets, so the ratio flatters it. Each contender runs in a fresh process (median of --repeat).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_analyze import (  # the sibling script
    ANALYZE,
    ENGINES,
    FLOOR,
    PAD_STEPS,
    make_dump,
    measure,
    median_of,
    publish,
)

COMPARE = """
import sys, rollout_diag
result = rollout_diag.compare_presets(sys.argv[1], ["verl"], device=sys.argv[2])
assert len(result.presets) == 19
"""

NAIVE = (
    PAD_STEPS
    + """
from rollout_diag.presets import get_presets

device = torch.device(sys.argv[2])
for preset in get_presets(["verl"]):
    for _, r, a, m in padded_steps(sys.argv[1], device):  # one read and padding pass per preset
        c = ((a - r) * m).clamp(-20, 20)
        n = m.sum(-1)
        keep = m.clone()
        for option in preset.rejection:
            k = {"k1": -c, "k2": 0.5 * c * c, "k3": torch.exp(c) - 1 - c}[option.statistic] * m
            value = k.sum(-1) if option.scope == "seq_sum" else k.sum(-1) / (n + 1e-8)
            ok = (value <= option.upper) & ((value >= option.lower) if option.statistic == "k1" else True)
            keep = keep * ok.float()[:, None]
        if preset.importance is not None:
            s = c.sum(-1, keepdim=True) if preset.importance.level == "sequence" else c
            w = torch.exp(s.clamp(-20, 20)).expand_as(c) * m
            upper, lower = preset.importance.upper, preset.importance.lower
            w = torch.where((w >= lower) & (w <= upper), w, 0.0) if preset.importance.icepop else w.clamp(max=upper)
            total = m.sum()
            mean = (w * m).sum() / total
            ess = 1.0 / (((w / (mean + 1e-8)) ** 2 * m).sum() / total)
            summary = (mean.item(), w.max().item(), ess.item())
        rejected = (1 - keep).mul(m).sum().item() / max(m.sum().item(), 1.0)
"""
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=12_500_000)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--engine", choices=ENGINES, default="auto", help="per-token engine (ROLLOUT_DIAG_ENGINE)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path("/tmp"))
    parser.add_argument("--write", type=Path, help="append the results as a markdown section to this file")
    args = parser.parse_args()
    os.environ["ROLLOUT_DIAG_ENGINE"] = args.engine  # inherited by every measured process

    dump = make_dump(args.tokens, args.dir / f"rollout_diag_bench_{args.tokens}.parquet")
    measure(ANALYZE, str(dump), args.device)  # warm the page cache and imports
    results = {
        "floor: pyarrow reads the same columns": median_of(FLOOR, args.repeat, str(dump)),
        "rollout-diag analyze": median_of(ANALYZE, args.repeat, str(dump), args.device),
        "rollout-diag compare-presets, 19 verl presets, one pass": median_of(
            COMPARE, args.repeat, str(dump), args.device
        ),
        "naive: per preset, read + pad per step + torch batch": median_of(NAIVE, args.repeat, str(dump), args.device),
    }
    floor, analyze, compare, naive = (results[name]["wall"] for name in results)
    lines = [
        f"### compare-presets, {args.tokens / 1e6:.1f}M tokens, device {args.device}, engine {args.engine} "
        f"({time.strftime('%Y-%m-%d')})",
        "",
        f"Machine: {platform.machine()}, Python {platform.python_version()}; median of {args.repeat} fresh "
        "processes (min–max), wall seconds including interpreter start.",
        "",
        "| contender | wall s | M tokens/s | CPU ns/token | peak RSS MB |",
        "|---|---|---|---|---|",
        *(
            f"| {name} | {r['wall']:.2f} ({r['wall_min']:.2f}–{r['wall_max']:.2f}) | "
            f"{args.tokens / r['wall'] / 1e6:.1f} | {r['cpu'] * 1e9 / args.tokens:.0f} | {r['rss_mb']:.0f} |"
            for name, r in results.items()
        ),
        "",
        f"- compare-presets / floor = **{compare / floor:.2f}×** (issue 13 target ≤ 2×); compare-presets / analyze = "
        f"**{compare / analyze:.2f}×** (issue 4 target ≤ 2×); naive / compare-presets = **{naive / compare:.1f}×** "
        "(target ≥ 10×)",
        "",
    ]
    publish(lines, args.write)


if __name__ == "__main__":
    main()
