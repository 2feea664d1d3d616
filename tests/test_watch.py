"""rollout-diag watch: follow a dump directory while it is written; the final state is analyze's."""

from __future__ import annotations

import json
import math
import shutil
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import rollout_diag as rd
from rollout_diag.watch import Watcher, WatchGone, watch


def batch(seed: int, rows: int = 5, width: int = 12, spread: float = 0.05) -> dict[str, Any]:
    """Right-padded [B, L] tensors with a mismatch of about ``spread`` nats per token."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, width + 1, (rows,), generator=generator)
    rollout = -torch.rand(rows, width, generator=generator, dtype=torch.float64) * 3.0
    trainer = (rollout + torch.randn(rows, width, generator=generator, dtype=torch.float64) * spread).clamp(max=0.0)
    positions = torch.arange(width).expand(rows, width)
    mask = (positions < lengths[:, None]).to(torch.int64)
    mask[:, 0] = 0  # a prompt token: an environment token inside the row
    return {
        "old_log_probs": trainer,
        "rollout_log_probs": rollout,
        "response_mask": mask,
        "lengths": lengths,
    }


def write_run(root: Path, steps: range, ranks: int = 2, spread=lambda step: 0.05, world_size: int | None = 2):
    writers = [rd.DumpWriter(root, rank=r, world_size=world_size, logprob_type="float64") for r in range(ranks)]
    for step in steps:
        for rank, writer in enumerate(writers):
            writer.write_step(step, **batch(1000 * step + rank, spread=spread(step)))
    for writer in writers:
        writer.close()


def assert_same(actual: Any, expected: Any, where: str = "result") -> None:
    """Equal value for value: numbers to rtol 1e-12, everything else exactly."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict) and sorted(actual) == sorted(expected), where
        for key in expected:
            assert_same(actual[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), where
        for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, f"{where}[{index}]")
    elif isinstance(expected, float) and not isinstance(actual, bool):
        assert isinstance(actual, (float, int)), where
        assert math.isclose(actual, expected, rel_tol=1e-12, abs_tol=1e-300) or (
            math.isnan(actual) and math.isnan(expected)
        ), f"{where}: {actual} != {expected}"
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


def same_as_analyze(result: rd.AnalysisResult, directory: Path) -> None:
    expected = rd.analyze(str(directory), device="cpu").to_json()
    assert_same(result.to_json(), expected)


def run_watch(directory: Path, **options: Any) -> list:
    options.setdefault("interval", 0.02)
    options.setdefault("exit_after_idle", 0.3)
    options.setdefault("device", "cpu")
    return list(watch(directory, **options))


# ----------------------------------------------------------------------------------------------- the loop
def test_watch_beside_a_writer_ends_with_analyzes_result(tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    writer = threading.Thread(target=write_run, args=(root, range(12)), kwargs={"spread": lambda s: 0.02 * (1 + s)})
    writer.start()
    try:
        updates = run_watch(root, exit_after_idle=1.0)
    finally:
        writer.join()
    last = updates[-1]
    assert last.exit_code == 0 and last.ended.startswith("nothing new")
    same_as_analyze(last.result, root)
    reported = [report for update in updates for report in update.steps]
    assert sorted({r.step for r in reported}) == list(range(12))
    finals = {r.step: r for r in reported}
    for step in last.result.steps:  # each step's line carries the step's metrics as analyze computes them
        assert_same(finals[step.step].metrics, step.metrics, f"step {step.step}")
