#!/usr/bin/env python3
"""Time `DumpWriter.write_step` (and `compute_metrics`) on one training batch of CPU tensors.

    python benchmarks/bench_writer.py                                  # 512 × 8 192 (4 M tokens)
    python benchmarks/bench_writer.py --write docs/benchmarks.md

Target (issue 11): write_step of a 512 × 8 192 batch under 1 s per step. The batch is what a trainer holds
after recomputing logprobs: padded [B, L] tensors (bf16 or fp32), every row full by default (``--fill``
sets the mean share of L a row uses), a multi-turn mask with environment runs. Each case writes
``--repeat`` steps into a fresh directory (the directory mode: one file per step, temporary file +
rename) or one file; the median seconds per step is reported, with the min–max, and for the default case
the time split into stripping the padding, building the table (host copy, float32 cast, validation) and
writing Parquet. ``compute_metrics`` (§1, §5–§7, no preset) on the same tensors is timed too:
what the in-loop metrics cost instead of (or besides) the dump.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_analyze import publish  # the sibling script

import rollout_diag as rd
from rollout_diag.io.writer import pack_padded


def make_batch(rows: int, width: int, fill: float, dtype: torch.dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    lengths = (width * (1 - (1 - fill) * 2 * torch.rand(rows, generator=generator))).clamp(1, width).long()
    positions = torch.arange(width)[None, :]
    inside = positions < lengths[:, None]
    trainer = -torch.empty(rows, width).exponential_(1.0, generator=generator)
    rollout = (trainer + 0.05 * torch.randn(rows, width, generator=generator)).clamp(max=0.0)
    # multi-turn: a 64-token environment run every 1 024 tokens
    mask = (inside & ((positions % 1024) >= 64)).long()
    return {
        "old_log_probs": torch.where(inside, trainer, 0.0).to(dtype),
        "rollout_log_probs": torch.where(inside, rollout, 0.0).to(dtype),
        "response_mask": mask,
        "lengths": lengths,
    }


def time_steps(batch: dict[str, torch.Tensor], repeat: int, **options) -> tuple[list[float], int]:
    """Seconds of each of ``repeat`` write_step calls into a fresh dump, and the dump's bytes on disk."""
    seconds = []
    with tempfile.TemporaryDirectory() as directory:
        target = Path(directory) / ("dump.parquet" if options.pop("one_file", False) else "dump")
        with rd.DumpWriter(target, **options) as dump:
            for step in range(repeat):
                start = time.perf_counter()
                dump.write_step(step, **batch)
                seconds.append(time.perf_counter() - start)
        size = sum(path.stat().st_size for path in Path(directory).rglob("*.parquet"))
    return seconds, size


def split(batch: dict[str, torch.Tensor], repeat: int) -> dict[str, float]:
    """Median seconds of the three phases of one write_step (directory mode, zstd)."""
    phases: dict[str, list[float]] = {"pack": [], "table": [], "parquet": []}
    with tempfile.TemporaryDirectory() as directory:
        dump = rd.DumpWriter(Path(directory) / "dump")
        for step in range(repeat):
            start = time.perf_counter()
            packed = pack_padded(
                batch["old_log_probs"],
                batch["rollout_log_probs"],
                batch["response_mask"],
                lengths=batch["lengths"],
            )
            ids = dump._sample_ids(None, packed.rows)
            packed_at = time.perf_counter()
            table = dump._table(step, packed, ids, {})
            table_at = time.perf_counter()
            dump._write_file(step, table)
            done = time.perf_counter()
            phases["pack"].append(packed_at - start)
            phases["table"].append(table_at - packed_at)
            phases["parquet"].append(done - table_at)
    return {name: statistics.median(values) for name, values in phases.items()}


def row(label: str, seconds: list[float], tokens: int, size: str = "") -> str:
    median = statistics.median(seconds)
    return (
        f"| {label} | {median:.3f} s ({min(seconds):.3f}–{max(seconds):.3f}) | {tokens / median / 1e6:.1f} M tokens/s "
        f"| {size} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--fill", type=float, default=1.0, help="mean share of the padded width a row uses")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--write", type=Path, help="append the section to this markdown file")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    bf16 = make_batch(args.rows, args.length, args.fill, torch.bfloat16)
    fp32 = make_batch(args.rows, args.length, args.fill, torch.float32)
    tokens = int(bf16["lengths"].sum())
    time_steps(bf16, 1)  # warm-up: imports, allocator, Parquet writer
    cases: list[tuple[str, tuple[list[float], int]]] = [
        ("bf16, directory mode, zstd (default)", time_steps(bf16, args.repeat)),
        ("fp32, directory mode, zstd", time_steps(fp32, args.repeat)),
        ("bf16, directory mode, snappy", time_steps(bf16, args.repeat, compression="snappy")),
        ("bf16, directory mode, uncompressed", time_steps(bf16, args.repeat, compression="none")),
        ("bf16, one file, zstd", time_steps(bf16, args.repeat, one_file=True)),
    ]
    metrics = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        rd.compute_metrics(
            bf16["old_log_probs"], bf16["rollout_log_probs"], bf16["response_mask"], lengths=bf16["lengths"]
        )
        metrics.append(time.perf_counter() - start)
    phases = split(bf16, args.repeat)

    lines = [
        "",
        f"## Writer: `write_step` of one {args.rows} × {args.length} batch ({tokens / 1e6:.2f} M tokens, CPU tensors)",
        "",
        f"Measured with `python benchmarks/bench_writer.py --rows {args.rows} --length {args.length} "
        f"--fill {args.fill} --repeat {args.repeat}` on {platform.machine()}, {torch.get_num_threads()} torch threads, "
        f"Python {platform.python_version()}, torch {torch.__version__}; median seconds per step (min–max). "
        "Target: < 1 s per step; `DumpWriter(every=k)` writes every k-th step only.",
        "",
        "| case | seconds per step | throughput | bytes per token on disk |",
        "|---|---|---|---|",
        *[row(label, seconds, tokens, f"{size / (tokens * args.repeat):.2f}") for label, (seconds, size) in cases],
        row("`compute_metrics` (§1, §5–§7, no preset), same batch", metrics, tokens),
        "",
        f"Default case split: stripping the padding {phases['pack']:.3f} s; host copy, float32 cast, validation "
        f"and Arrow arrays {phases['table']:.3f} s; Parquet write + rename {phases['parquet']:.3f} s.",
    ]
    publish(lines, args.write)


if __name__ == "__main__":
    main()
