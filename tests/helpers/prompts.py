"""Dumps with a prompt identity: GRPO-like groups of rows per prompt, prompts that recur at later steps, and two
plants — a stale prefix cache (recurring rows' δ grows with the versions since their prompt was first seen) and
prompts that are extreme every time (every row of theirs carries a large mean δ)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

CLEAN_NOISE = 0.02


def stale_noise(age: int) -> float:
    """The stale-cache plant: noise grows with the versions since the prompt was first seen."""
    return CLEAN_NOISE * (1.0 + 3.0 * age)


def _answers(
    rng: np.random.Generator, step: int, prompt: str, ids: list[int], rows: int, length: int, scale: float, bias: float
) -> list[dict]:
    """``rows`` rows answering ``prompt`` at ``step``: its prompt tokens ``ids`` (mask 0), then ``length`` model tokens
    (trainer log-probs ~ −Exp(1)) whose δ ~ N(``bias``, ``scale``); values rounded to float32, as a dump keeps them."""
    out = []
    for member in range(rows):
        true = -rng.exponential(1.0, length)
        rollout = np.minimum(true - (rng.normal(0.0, scale, length) + bias), 0.0)
        out.append(
            {
                "step": step,
                "sample_id": f"s{step}-{prompt}-{member}",
                "prompt_id": prompt,
                "token_ids": ids + rng.integers(0, 50_000, length).tolist(),
                "rollout_log_probs": [0.0] * len(ids) + np.float32(rollout).astype(float).tolist(),
                "old_log_probs": [0.0] * len(ids) + np.float32(true).astype(float).tolist(),
                "response_mask": [0] * len(ids) + [1] * length,
            }
        )
    return out


def prompt_rows(
    seed: int = 0,
    *,
    steps: int = 8,
    new_per_step: int = 6,
    recurring_per_step: int = 6,
    group: int = 4,
    length: int = 48,
    prompt_tokens: int = 6,
    noise: Callable[[int], float] | None = None,
    extreme: int = 0,
    extreme_bias: float = 0.8,
    extreme_group: int | None = None,
    versions: bool = False,
    drift: float = 0.0,
) -> list[dict]:
    """Rows (dicts) of ``steps`` steps: each step answers ``new_per_step`` prompts never seen before and
    ``recurring_per_step`` prompts seen at an earlier step (none at step 0), ``group`` rows each. Each row holds
    ``prompt_tokens`` prompt tokens (mask 0, token ids fixed per prompt) then ``length`` model tokens.

    ``noise(age)``: the δ noise scale of a row whose prompt was first seen ``age`` steps before (default: clean,
    CLEAN_NOISE at every age). ``extreme``: that many prompts (seen at every step) get a mean δ of ``extreme_bias``
    on every row (``extreme_group`` rows a step, default ``group``). ``versions``: write a ``policy_version`` column
    (= step − 1 for odd steps: async lag). ``drift``: every row's noise grows by this share per step (a mismatch
    that rises over training, the same for new and recurring prompts)."""
    rng = np.random.default_rng(seed)
    first_seen: dict[str, int] = {}
    prompt_ids: dict[str, list[int]] = {}
    out = []
    next_prompt = 0
    extreme_prompts = [f"x{k}" for k in range(extreme)]
    for step in range(steps):
        seen = [p for p in first_seen if p not in extreme_prompts]
        chosen = list(rng.choice(seen, size=min(recurring_per_step, len(seen)), replace=False)) if seen else []
        fresh = []
        for _ in range(new_per_step):
            fresh.append(f"p{next_prompt}")
            next_prompt += 1
        for prompt in [*fresh, *chosen, *extreme_prompts]:
            version = step - (step % 2) if versions else step
            first_seen.setdefault(prompt, version)
            ids = prompt_ids.setdefault(prompt, rng.integers(0, 50_000, prompt_tokens).tolist())
            age = version - first_seen[prompt]
            members = group if prompt not in extreme_prompts or extreme_group is None else extreme_group
            scale = (CLEAN_NOISE if noise is None else noise(age)) * (1.0 + drift * step)
            bias = extreme_bias if prompt in extreme_prompts else 0.0
            for row in _answers(rng, step, prompt, ids, members, length, scale, bias):
                if versions:
                    row["policy_version"] = version
                out.append(row)
    return out


def prompt_table(rows: list[dict], *, prompt_column: str | None = "prompt_id") -> pa.Table:
    """The rows as the canonical sequence layout; ``prompt_column``: the prompt id's column name (None: left out, so
    the prompt is known only from its token ids)."""
    columns: dict[str, pa.Array] = {
        "step": pa.array([r["step"] for r in rows], pa.int64()),
        "sample_id": pa.array([r["sample_id"] for r in rows]),
        "rollout_log_probs": pa.array([r["rollout_log_probs"] for r in rows], pa.list_(pa.float32())),
        "old_log_probs": pa.array([r["old_log_probs"] for r in rows], pa.list_(pa.float32())),
        "response_mask": pa.array([r["response_mask"] for r in rows], pa.list_(pa.int8())),
        "token_ids": pa.array([r["token_ids"] for r in rows], pa.list_(pa.int32())),
    }
    if prompt_column is not None:
        columns[prompt_column] = pa.array([r["prompt_id"] for r in rows])
    if rows and "policy_version" in rows[0]:
        columns["policy_version"] = pa.array([r["policy_version"] for r in rows], pa.int64())
    return pa.table(columns)


def write_prompt_dump(path: Path, rows: list[dict], *, row_group_size: int | None = None, **options) -> Path:
    pq.write_table(prompt_table(rows, **options), path, row_group_size=row_group_size)
    return path


def matched_run_rows(
    seed: int,
    *,
    prompts: int = 300,
    first: int = 0,
    planted: int = 0,
    planted_bias: float = 0.8,
    group: int = 2,
    steps: int = 6,
    length: int = 32,
    prompt_tokens: int = 6,
) -> list[dict]:
    """One run of a matched set (``runs``' prompts matched across runs): the same pool of prompts ``p<first>`` … in
    every run (and the same prompt token ids: ``prompt_rows``' layout), each answered once, ``group`` rows, at a step
    and in an order this run's ``seed`` picks; ``planted`` prompts ``x0`` … answered once too, with a mean δ of
    ``planted_bias`` on every row (a deterministic outlier: extreme in every run, yet with ``group`` rows a run too
    few for the single-run rule). Clean rows: δ ~ N(0, CLEAN_NOISE)."""
    rng = np.random.default_rng(seed)
    names = [f"p{k}" for k in range(first, first + prompts)] + [f"x{k}" for k in range(planted)]
    order = rng.permutation(len(names))
    out = []
    for position, index in enumerate(order.tolist()):
        prompt = names[index]
        step = position * steps // len(names)
        ids = np.random.default_rng([first + index, 7]).integers(0, 50_000, prompt_tokens).tolist()  # every run's
        bias = planted_bias if prompt.startswith("x") else 0.0
        out.extend(_answers(rng, step, prompt, ids, group, length, CLEAN_NOISE, bias))
    return out
