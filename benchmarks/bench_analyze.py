#!/usr/bin/env python3
"""Time `analyze` against the I/O floor and the obvious alternative; print tokens/s, ratios and peak RSS.

    python benchmarks/bench_analyze.py --tokens 50000000            # CPU
    python benchmarks/bench_analyze.py --tokens 50000000 --device cuda
    python benchmarks/bench_analyze.py --tokens 50000000 --write docs/benchmarks.md

Each measurement runs in a fresh subprocess (so peak RSS is its own), ``--repeat`` times; the median
is reported. Contenders:
- floor: pyarrow reads the same columns batch by batch and does nothing else;
- analyze: ``rollout_diag.analyze`` (every metric of METRICS.md §1/§5/§6/§7 plus localisation);
- naive: the obvious script: read the whole file, per step pad the rows into [B, L] numpy arrays and
  compute the §1 metrics with torch in one batch (float32, as a trainer would).
Peak RSS of ``analyze`` is also measured on a dump 4× smaller, to show it does not grow with the file.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENGINES = ("auto", "numba", "torch")  # = rollout_diag.engine.kernels.ENGINES (not imported: the script runs without it)
COLUMNS = ["step", "sample_id", "rollout_log_probs", "old_log_probs", "response_mask"]

FLOOR = """
import sys, pyarrow.parquet as pq
rows = 0
for batch in pq.ParquetFile(sys.argv[1]).iter_batches(columns=@COLUMNS@, batch_size=4096):
    rows += batch.num_rows
""".replace("@COLUMNS@", repr(COLUMNS))

ANALYZE = """
import sys, rollout_diag
result = rollout_diag.analyze(sys.argv[1], device=sys.argv[2])
assert result.run.tokens > 0
"""

# The obvious way, shared by both naive baselines: read the whole file, pad each step into [B, L] tensors.
PAD_STEPS = """
import sys, numpy as np, pyarrow.compute as pc, pyarrow.parquet as pq, torch


def padded_steps(path, device):
    table = pq.read_table(path, columns=["step", "rollout_log_probs", "old_log_probs", "response_mask"])
    for step in np.unique(table["step"].to_numpy()):
        part = table.filter(pc.equal(table["step"], step))
        lengths = pc.list_value_length(part["rollout_log_probs"]).to_numpy()
        rows, width = len(lengths), int(lengths.max())
        row = np.repeat(np.arange(rows), lengths)
        col = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        padded = []
        for name in ("rollout_log_probs", "old_log_probs", "response_mask"):
            array = np.zeros((rows, width), dtype=np.float32)
            array[row, col] = pc.list_flatten(part[name].combine_chunks()).to_numpy()
            padded.append(torch.from_numpy(array).to(device))
        yield int(step), *padded
"""

NAIVE = (
    PAD_STEPS
    + """
metrics = {}
for step, r, a, m in padded_steps(sys.argv[1], torch.device(sys.argv[2])):
    n = m.sum(-1)
    mean_a, mean_r = (a * m).sum(-1) / (n + 1e-8), (r * m).sum(-1) / (n + 1e-8)
    delta = (a - r) * m
    count = m.sum() + 1e-8
    d = mean_r - mean_a
    metrics[step] = {
        "training_ppl": torch.exp(-mean_a).mean().item(), "rollout_ppl": torch.exp(-mean_r).mean().item(),
        "kl": ((r - a) * m).sum().item() / count.item(),
        "k3_kl": ((torch.exp(delta) - delta - 1) * m).sum().item() / count.item(),
        "log_ppl_diff": d.mean().item(), "log_ppl_abs_diff": d.abs().mean().item(),
        "chi2_token": ((torch.exp(2 * delta.clamp(-20, 20)) * m).sum() / count).item() - 1,
        "chi2_seq": torch.exp(2 * delta.sum(-1).clamp(-20, 20)).mean().item() - 1,
    }
assert metrics
"""
)

MEASURE = """
import resource, subprocess, sys, time, json
start = time.perf_counter()
subprocess.run([sys.executable, "-c", sys.argv[1], *sys.argv[2:]], check=True)
wall = time.perf_counter() - start
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "rss_mb": usage.ru_maxrss / 1024}))
"""


def measure(code: str, *args: str) -> dict[str, float]:
    """Wall seconds, CPU seconds (user + system) and peak RSS (MB) of ``python -c code args`` in a fresh process
    (with this process's environment: ``--engine`` sets ROLLOUT_DIAG_ENGINE)."""
    out = subprocess.run([sys.executable, "-c", MEASURE, code, *args], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def median_of(code: str, repeat: int, *args: str) -> dict[str, float]:
    runs = [measure(code, *args) for _ in range(repeat)]
    return {
        "wall": statistics.median(r["wall"] for r in runs),
        "wall_min": min(r["wall"] for r in runs),
        "wall_max": max(r["wall"] for r in runs),
        "cpu": statistics.median(r["cpu"] for r in runs),
        "rss_mb": max(r["rss_mb"] for r in runs),
    }


def make_dump(tokens: int, path: Path) -> Path:
    if not path.exists():
        generator = ROOT / "sample_data" / "make_synthetic.py"
        subprocess.run([sys.executable, str(generator), "--tokens", str(tokens), "--out", str(path)], check=True)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=50_000_000)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--engine", choices=ENGINES, default="auto", help="per-token engine (ROLLOUT_DIAG_ENGINE)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path("/tmp"), help="where the generated dumps are kept")
    parser.add_argument("--skip-naive", action="store_true", help="skip the naive baseline (needs the file in RAM)")
    parser.add_argument("--write", type=Path, help="append the results as a markdown section to this file")
    args = parser.parse_args()
    os.environ["ROLLOUT_DIAG_ENGINE"] = args.engine  # inherited by every measured process

    big = make_dump(args.tokens, args.dir / f"rollout_diag_bench_{args.tokens}.parquet")
    small = make_dump(args.tokens // 4, args.dir / f"rollout_diag_bench_{args.tokens // 4}.parquet")
    size_mb = big.stat().st_size / 1e6

    measure(ANALYZE, str(small), args.device)  # warm the page cache and imports
    floor = median_of(FLOOR, args.repeat, str(big))
    analyze = median_of(ANALYZE, args.repeat, str(big), args.device)
    analyze_small = median_of(ANALYZE, 1, str(small), args.device)
    naive = None if args.skip_naive else median_of(NAIVE, args.repeat, str(big), args.device)

    def line(name: str, result: dict[str, float], tokens: int = args.tokens) -> str:
        rate = tokens / result["wall"] / 1e6
        return (
            f"| {name} | {result['wall']:.2f} ({result['wall_min']:.2f}–{result['wall_max']:.2f}) "
            f"| {rate:.1f} | {result['cpu'] * 1e9 / tokens:.0f} | {result['rss_mb']:.0f} |"
        )

    lines = [
        f"### analyze, {args.tokens / 1e6:.0f}M tokens, device {args.device}, engine {args.engine} "
        f"({time.strftime('%Y-%m-%d')})",
        "",
        f"Machine: {platform.machine()}, {platform.processor() or 'cpu'}, Python {platform.python_version()}; "
        f"dump {size_mb:.0f} MB (snappy), generated by sample_data/make_synthetic.py; median of {args.repeat} "
        "fresh processes (min–max), wall seconds including interpreter start.",
        "",
        "| contender | wall s | M tokens/s | CPU ns/token | peak RSS MB |",
        "|---|---|---|---|---|",
        line("pyarrow read only (I/O floor)", floor),
        line("rollout-diag analyze", analyze),
        line(f"rollout-diag analyze, {args.tokens // 4 / 1e6:.1f}M tokens", analyze_small, args.tokens // 4),
    ]
    if naive is not None:
        lines.append(line("naive: read all, pad per step, §1 in torch", naive))
    lines += [
        "",
        f"- analyze / floor = **{analyze['wall'] / floor['wall']:.2f}×**"
        + (f"; naive / analyze = **{naive['wall'] / analyze['wall']:.2f}×**" if naive else ""),
        f"- peak RSS of analyze: {analyze_small['rss_mb']:.0f} MB at {args.tokens // 4 / 1e6:.1f}M tokens, "
        f"{analyze['rss_mb']:.0f} MB at {args.tokens / 1e6:.0f}M tokens"
        + (f" (naive: {naive['rss_mb']:.0f} MB)" if naive else ""),
        "",
    ]
    publish(lines, args.write)


def publish(lines: list[str], path: Path | None) -> None:
    """Print a markdown section, and append it to ``path`` (docs/benchmarks.md) when given."""
    text = "\n".join(lines)
    print(text)
    if path is not None:
        with path.open("a", encoding="utf-8") as handle:
            handle.write("\n" + text)


if __name__ == "__main__":
    main()
