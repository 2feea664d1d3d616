#!/usr/bin/env python
"""Seeded generator of synthetic training–inference logprob-mismatch dumps for rollout-diag.

Three jobs, one script (needs only numpy and pyarrow):

* no arguments: write the bundled sample ``sample_data/synthetic_multiturn.parquet``
  (12 steps × 64 rows of multi-turn agent trajectories, with a decoded ``tokens`` column);
* ``--tokens N --out PATH``: stream a large dump of exactly N tokens for benchmarks, one
  Parquet row group at a time, so memory stays bounded whatever N is;
* ``--bad KIND --out PATH``: write a small, deliberately broken file for tests and demos
  (``--bad all --out DIR`` writes every kind into DIR).

Layout ("sequence", the default): one row per sequence with ``step`` (int64), ``sample_id``
(string), list columns ``rollout_log_probs`` / ``old_log_probs`` (list<float32>),
``response_mask`` (list<int8>), ``token_ids`` (list<int32>) and optionally ``tokens``
(list<string>). ``--layout token`` writes the same data exploded: one row per token with scalar
``step, sample_id, position`` and the same value columns.

The model
---------
Row shape. A row is single-turn (one model segment) or, with probability
``--multiturn-fraction``, a multi-turn trajectory of K rounds: model segment, environment
segment, model segment, …, model segment (K model segments, K−1 environment segments). K is
1 + Geometric(1/4) (≥ 2, mean 5) for 90 % of those rows and uniform in [0.4·max_rounds, max_rounds] for
the rest, so some rows have dozens of rounds. Segment lengths are log-normal around
``--turn-len`` / ``--env-len`` (``--single-len`` for single-turn rows); rows longer than
``--max-len`` are truncated there, as a trainer truncates a response. One row per file has
mask all zeros (a sequence without any model token).

Rollout logprobs. At a model token (mask 1) the surprisal s = −r is exp(μ_row + 2.2·L), L a
unit-sd logistic draw (log-logistic: median ≈ 0.02 nats, so most tokens sit near 0, with a heavy
tail of improbable tokens; clipped to [1e-6, 30]); μ_row varies by row (sd 0.5). At an
environment token (mask 0) the engine never produced a logprob: r = 0.0.

Trainer logprobs. The trainer sees the same token through a perturbed logit: with p = e^r and
ℓ = logit(p), a = log σ(ℓ − ε), ε = σ·L' (L' unit-sd logistic, so heavier tails than normal).
That is δ = a − r = −log(p + (1 − p)·e^ε) ≈ −(1 − p)·ε: near-certain tokens barely move and
improbable tokens carry the mismatch (|δ| saturating near σ), the shape of bf16 vs fp32 in the
bundled real dump; a ≤ 0 always and E[δ] < 0 (KL ≥ 0). σ = scale · (1 + step_drift ·
step/(steps−1)) · (1 + round_drift · round) · row factor (log-normal, sd 0.25) · step jitter
(log-normal, sd 0.05): mismatch grows with token improbability, over training steps and over
the rounds of a trajectory. A share ``--outlier-rate`` of tokens gets 8·ε; |ε| is capped at 0.95,
so |δ| < 1 everywhere except at the catastrophic tokens. At environment tokens
the trainer logprob is a teacher-forced value, −exp(log 0.4 + 1.3·L).

Catastrophic tokens. In every step, 1 to ``--catastrophic`` model tokens in chosen rows are
overwritten with |δ| between 1.5 and 6 (either sign). Their step, sample_id, row, position and
round are printed and stored, with the parameters, in the Parquet schema metadata
(``catastrophic_tokens``, ``all_mask0_rows``, ``params``).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

GENERATOR_VERSION = "1"
SAMPLE_PATH = Path(__file__).resolve().parent / "synthetic_multiturn.parquet"
BAD_KINDS = ("ragged", "nan", "positive", "mask", "strings", "missing", "empty", "allmask0")

# Decoded text pieces. Model pieces come first (token ids 0..len-1), environment pieces after.
# A few pieces need HTML escaping on purpose: < > & " '.
# fmt: off
MODEL_PIECES = (
    " the", " a", " to", " of", " and", " is", " in", " that", " it", " for", " we", " this",
    " answer", " step", " so", " =", " +", " -", " *", " /", " x", " y", " n", " 1", " 2", " 3",
    " 0", ".", ",", ":", "\n", " Let", " compute", " check", " result", " function", " call",
    " search", " file", " value", " if", " then", " not", " <", " >", " &", ' "', "'", " <=",
    " &&", " </think>", "<think>", " tool", " query", " return", " print", "(", ")", "[", "]",
    " True", " False", " None", " because", " therefore", " Hmm", " wait", " done", " final",
    " boxed", "{", "}", " error", " retry", " ok", " list", " sum", " total", " count", " é",
    " →", " 42", " 7", " 10", " 100",
)
ENV_PIECES = (
    "<tool_response>", "</tool_response>", "{", "}", '"', '"status"', '"ok"', '"error"', ":",
    ",", " ", "\n", '"result"', "[", "]", "0", "1", "2", "3", "5", "9", ".", "-", "&amp;",
    "&", "<", ">", "null", "true", "false", '"path"', "/", "src", "main", ".py", "line", "Trace",
    "back", " File", '"stdout"',
)
# fmt: on
VOCAB = MODEL_PIECES + ENV_PIECES

FLOAT_COLUMNS = ("rollout_log_probs", "old_log_probs")
ENV_LOGPROB_MEDIAN = 0.4  # median surprisal (nats) of a teacher-forced environment token
ENV_LOGPROB_SPREAD = 1.3
MODEL_LOGPROB_SPREAD = 2.2
OUTLIER_FACTOR = 8.0
MAX_NOISE = np.float32(0.95)  # |ε| cap, so |δ| > 1 happens only at the catalogued catastrophic tokens


@dataclass(frozen=True)
class Params:
    """Every knob of the generator; written as JSON into the file's schema metadata."""

    steps: int
    rows_per_step: int
    tokens: int | None  # exact total token count (list elements), or None: steps × rows_per_step rows
    max_len: int
    multiturn_fraction: float
    max_rounds: int
    turn_len: float
    env_len: float
    single_len: float
    surprisal_median: float
    mismatch_scale: float
    step_drift: float
    round_drift: float
    outlier_rate: float
    catastrophic: int
    seed: int
    row_group_rows: int
    layout: str
    text: bool
    token_ids: bool
    compression: str


# ---------------------------------------------------------------------------------------------
# Row structure: segments (model / environment) of each row, generated per row group
# ---------------------------------------------------------------------------------------------


@dataclass
class Structure:
    """Segments of the rows of one row group (after truncation; empty segments dropped)."""

    row_len: np.ndarray  # int64 [rows]
    n_model: np.ndarray  # int64 [rows], model tokens per row
    seg_row: np.ndarray  # int64 [segments], row (local) of the segment
    seg_len: np.ndarray  # int64 [segments]
    seg_start: np.ndarray  # int64 [segments], position of the first token within its row
    seg_model: np.ndarray  # bool [segments]
    seg_round: np.ndarray  # int64 [segments], round index (model segment k and the env after it)


def _structure(p: Params, group: int, n_rows: int, empty_row: int, last_row_cap: int | None) -> Structure:
    """Segments of row group `group`, drawn for a full group then cut to its first `n_rows` rows.

    Depends only on (seed, group), so a second call returns the same rows. `empty_row` (local
    index, or −1) gets mask all zeros; `last_row_cap` caps the length of the group's last row.
    """
    rng = np.random.default_rng([p.seed, 1, group])
    full = p.row_group_rows
    multi = rng.random(full) < p.multiturn_fraction
    long_lo = max(2, (2 * p.max_rounds) // 5)
    rounds = np.where(
        rng.random(full) < 0.1,
        rng.integers(long_lo, max(long_lo, p.max_rounds) + 1, size=full),
        1 + rng.geometric(0.25, size=full),
    )
    rounds = np.where(multi, np.minimum(rounds, p.max_rounds), 1)
    n_seg = 2 * rounds - 1
    seg_row = np.repeat(np.arange(full), n_seg)
    seg_first = np.cumsum(n_seg) - n_seg
    seg_k = np.arange(seg_row.size) - np.repeat(seg_first, n_seg)
    seg_model = seg_k % 2 == 0
    seg_round = seg_k // 2
    median = np.where(seg_model, np.where(multi[seg_row], p.turn_len, p.single_len), p.env_len)
    spread = np.where(multi[seg_row], 0.7, 0.8)
    seg_len = np.maximum(1, np.ceil(median * np.exp(spread * rng.standard_normal(seg_row.size))))
    seg_len = seg_len.astype(np.int64)

    # Truncate rows at max_len (or at the token budget for the file's last row).
    cap = np.full(full, p.max_len, dtype=np.int64)
    if last_row_cap is not None:
        cap[n_rows - 1] = last_row_cap
    seg_start = np.cumsum(seg_len) - seg_len
    seg_start -= np.repeat(seg_start[seg_first], n_seg)
    seg_len = np.clip(cap[seg_row] - seg_start, 0, seg_len)
    if 0 <= empty_row < n_rows:
        seg_model[seg_row == empty_row] = False
    keep = (seg_len > 0) & (seg_row < n_rows)
    seg_row, seg_len, seg_start = seg_row[keep], seg_len[keep], seg_start[keep]
    seg_model, seg_round = seg_model[keep], seg_round[keep]
    row_len = np.bincount(seg_row, weights=seg_len, minlength=n_rows).astype(np.int64)
    n_model = np.bincount(seg_row, weights=seg_len * seg_model, minlength=n_rows).astype(np.int64)
    return Structure(row_len, n_model, seg_row, seg_len, seg_start, seg_model, seg_round)


@dataclass
class Plan:
    """Whole-file decisions taken before any token is generated (all O(rows), not O(tokens))."""

    total_rows: int
    steps: int
    rows_per_step: int
    last_row_cap: int | None
    empty_row: int
    row_len: np.ndarray
    step_factor: np.ndarray  # float64 [steps]: drift × jitter of σ
    catastrophic: list[dict]
    # int64 [steps + 1]: first row of each step, then total_rows. --steps N spreads the rows over exactly N
    # steps (sizes differ by at most one row); otherwise steps hold rows_per_step rows, the last one the rest.
    step_starts: np.ndarray

    def step_of(self, rows: np.ndarray) -> np.ndarray:
        """The step of each row (int64)."""
        return np.searchsorted(self.step_starts, rows, side="right").astype(np.int64) - 1

    def sample_id(self, row: int) -> str:
        step = int(self.step_of(np.asarray([row]))[0])
        return _sample_id(step, row - int(self.step_starts[step]), self.rows_per_step)


def _group_bounds(p: Params, g: int, total_rows: int) -> tuple[int, int]:
    start = g * p.row_group_rows
    return start, min(start + p.row_group_rows, total_rows)


def _group_structure(p: Params, plan_rows: int, last_cap: int | None, empty_row: int, g: int) -> Structure:
    start, stop = _group_bounds(p, g, plan_rows)
    cap = last_cap if stop == plan_rows else None
    return _structure(p, g, stop - start, empty_row - start, cap)


def make_plan(p: Params) -> Plan:
    """Pass over row structures only: row count, steps, the empty row, catastrophic tokens."""
    rng = np.random.default_rng([p.seed, 0])
    if p.tokens is None:
        total_rows = p.steps * p.rows_per_step
        empty_row = int(rng.integers(total_rows))
        lengths, last_cap = [], None
        for g in range(math.ceil(total_rows / p.row_group_rows)):
            lengths.append(_group_structure(p, total_rows, None, empty_row, g).row_len)
        row_len = np.concatenate(lengths)
        steps, rows_per_step = p.steps, p.rows_per_step
    else:
        # The total is not known yet: draw the empty row among rows that surely exist (no row is
        # longer than max_len, so at least tokens // max_len rows precede the budget's end).
        empty_row = int(rng.integers(min(p.row_group_rows, max(1, p.tokens // p.max_len))))
        lengths, done, g = [], 0, 0
        while done < p.tokens:
            lens = _structure(p, g, p.row_group_rows, empty_row - g * p.row_group_rows, None).row_len
            cum = done + np.cumsum(lens)
            if cum[-1] >= p.tokens:
                cut = int(np.searchsorted(cum, p.tokens))  # first row reaching the budget
                lens = lens[: cut + 1].copy()
                lens[-1] -= cum[cut] - p.tokens
            lengths.append(lens)
            done += int(lens.sum())
            g += 1
        row_len = np.concatenate(lengths)
        total_rows = row_len.size
        last_cap = int(row_len[-1])
        if p.steps > 0:
            steps = min(p.steps, total_rows)
            rows_per_step = math.ceil(total_rows / steps)  # the largest step (for sample id widths)
        else:
            rows_per_step = p.rows_per_step
            steps = math.ceil(total_rows / rows_per_step)
    if p.tokens is not None and p.steps > 0:  # exactly the steps asked for (ceil-sized steps could end early)
        step_starts = np.arange(steps + 1, dtype=np.int64) * total_rows // steps
    else:
        step_starts = np.minimum(np.arange(steps + 1, dtype=np.int64) * rows_per_step, total_rows)
    drift = 1.0 + p.step_drift * np.arange(steps) / max(steps - 1, 1)
    step_factor = drift * np.exp(0.05 * rng.standard_normal(steps))

    # Catastrophic tokens: choose rows per step, then find the positions from the row structure.
    n_model = np.concatenate(
        [
            _group_structure(p, total_rows, last_cap, empty_row, g).n_model
            for g in range(math.ceil(total_rows / p.row_group_rows))
        ]
    )
    chosen: dict[int, tuple[int, float, float]] = {}
    for step in range(steps if p.catastrophic > 0 else 0):
        lo, hi = int(step_starts[step]), int(step_starts[step + 1])
        candidates = lo + np.flatnonzero(n_model[lo:hi] > 0)
        if candidates.size == 0:
            continue
        count = min(int(rng.integers(1, p.catastrophic + 1)), candidates.size)
        for row in np.sort(rng.choice(candidates, size=count, replace=False)):
            ordinal = int(rng.integers(n_model[row]))
            size = float(rng.uniform(1.5, 6.0))
            if rng.random() < 0.5:  # rollout sampled a token it found improbable; trainer disagrees
                rollout = -(size + float(rng.uniform(0.5, 4.0)))
                old = rollout + size
            else:  # rollout was confident; trainer finds the token improbable
                rollout = -float(rng.uniform(0.001, 0.3))
                old = rollout - size
            chosen[int(row)] = (ordinal, rollout, old)
    catastrophic = []
    groups = sorted({row // p.row_group_rows for row in chosen})
    for g in groups:
        s = _group_structure(p, total_rows, last_cap, empty_row, g)
        start = g * p.row_group_rows
        for row in sorted(r for r in chosen if r // p.row_group_rows == g):
            ordinal, rollout, old = chosen[row]
            segs = np.flatnonzero((s.seg_row == row - start) & s.seg_model)
            before = np.cumsum(s.seg_len[segs]) - s.seg_len[segs]
            k = int(np.searchsorted(before, ordinal, side="right") - 1)
            seg = segs[k]
            rollout32, old32 = np.float32(rollout), np.float32(old)
            step = int(np.searchsorted(step_starts, row, side="right")) - 1
            catastrophic.append(
                {
                    "step": step,
                    "sample_id": _sample_id(step, row - int(step_starts[step]), rows_per_step),
                    "row": row,
                    "position": int(s.seg_start[seg] + ordinal - before[k]),
                    "round": int(s.seg_round[seg]),
                    "rollout_log_prob": float(rollout32),
                    "old_log_prob": float(old32),
                    "delta": float(old32 - rollout32),
                }
            )
    return Plan(total_rows, steps, rows_per_step, last_cap, empty_row, row_len, step_factor, catastrophic, step_starts)


def _sample_id(step: int, index: int, rows_per_step: int) -> str:
    width = max(3, len(str(rows_per_step - 1)))
    return f"s{step}-{index:0{width}d}"


# ---------------------------------------------------------------------------------------------
# Token values, one row group at a time
# ---------------------------------------------------------------------------------------------


def _schema(p: Params) -> pa.Schema:
    f32, i8 = pa.float32(), pa.int8()
    if p.layout == "sequence":
        fields = [
            pa.field("step", pa.int64()),
            pa.field("sample_id", pa.string()),
            pa.field("rollout_log_probs", pa.list_(f32)),
            pa.field("old_log_probs", pa.list_(f32)),
            pa.field("response_mask", pa.list_(i8)),
        ]
        if p.token_ids:
            fields.append(pa.field("token_ids", pa.list_(pa.int32())))
        if p.text:
            fields.append(pa.field("tokens", pa.list_(pa.string())))
    else:
        fields = [
            pa.field("step", pa.int64()),
            pa.field("sample_id", pa.string()),
            pa.field("position", pa.int32()),
            pa.field("rollout_log_probs", f32),
            pa.field("old_log_probs", f32),
            pa.field("response_mask", i8),
        ]
        if p.token_ids:
            fields.append(pa.field("token_ids", pa.int32()))
        if p.text:
            fields.append(pa.field("tokens", pa.string()))
    return pa.schema(fields)


BLOCK_TOKENS = 1 << 15  # token math runs on cache-sized blocks: ~2x faster than whole arrays
LOGISTIC_SD = math.pi / math.sqrt(3.0)  # sd of the standard logistic distribution


def _logit_uniform(rng: np.random.Generator, out: np.ndarray, scratch: np.ndarray) -> np.ndarray:
    """Fill `out` with standard logistic draws, logit(u), float32 (sd π/√3): normal-like with
    heavier tails, and cheaper than normal draws. Finite: |logit| < 17.4."""
    rng.random(dtype=np.float32, out=out)  # u: multiples of 2^-24 in [0, 1)
    np.subtract(np.float32(1.0), out, out=scratch)  # 1 − u ≥ 2^-24, exact
    out += np.float32(2.0**-25)  # u > 0
    np.divide(out, scratch, out=out)
    return np.log(out, out=out)


def _fill_logprobs(
    rng: np.random.Generator,
    outlier_rate: float,
    mu: np.ndarray,
    spread: np.ndarray,
    sigma: np.ndarray,
    rollout_sign: np.ndarray,
    rollout: np.ndarray,
    old: np.ndarray,
) -> None:
    """Write rollout and trainer logprobs of every token into `rollout` and `old` (float32).

    Per token: surprisal s = exp(mu + spread·L1) clipped to [1e-6, 30] (p = e^−s); the trainer
    sees the same token through a perturbed logit, a = log σ(logit(p) − ε), ε = sigma·L2 (×8 for
    a share `outlier_rate` of tokens; |ε| ≤ 0.95), which gives δ = a − (−s) = −log(p + (1 − p)·e^ε).
    L1, L2: logistic draws (`spread` and `sigma` already divided by their sd). `rollout_sign` is
    −1.0 at model tokens and +0.0 at environment tokens, where the rollout logprob is 0.0 and
    sigma is 0, so the trainer keeps the drawn −s (a teacher-forced logprob).
    """
    n_tok = rollout.size
    size = min(BLOCK_TOKENS, n_tok)
    buffers = [np.empty(size, dtype=np.float32) for _ in range(3)]
    one, zero = np.float32(1.0), np.float32(0.0)
    for lo in range(0, n_tok, size):
        hi = min(lo + size, n_tok)
        srp, err, tmp = (buf[: hi - lo] for buf in buffers)
        _logit_uniform(rng, srp, tmp)
        srp *= spread[lo:hi]
        srp += mu[lo:hi]
        np.exp(srp, out=srp)
        np.clip(srp, np.float32(1e-6), np.float32(30.0), out=srp)
        _logit_uniform(rng, err, tmp)
        err *= sigma[lo:hi]
        n_out = int(rng.binomial(hi - lo, outlier_rate))
        err[rng.integers(0, hi - lo, size=n_out)] *= np.float32(OUTLIER_FACTOR)
        np.clip(err, -MAX_NOISE, MAX_NOISE, out=err)  # |δ| ≤ |ε| < 1: only catalogued tokens exceed 1
        np.multiply(srp, rollout_sign[lo:hi], out=rollout[lo:hi])
        logprob = np.negative(srp, out=tmp)
        prob = np.exp(logprob, out=srp)
        np.exp(err, out=err)
        trainer = np.subtract(one, err, out=old[lo:hi])  # p + (1 − p)·e^ε = p·(1 − e^ε) + e^ε
        trainer *= prob
        trainer += err
        np.log(trainer, out=trainer)  # −δ
        np.subtract(logprob, trainer, out=trainer)
        np.minimum(trainer, zero, out=trainer)  # float32 rounding only: a ≤ 0 exactly in theory


def _group_table(p: Params, plan: Plan, g: int, schema: pa.Schema, vocab: pa.Array) -> pa.Table:
    """All columns of row group `g` (vectorised over its tokens)."""
    start, stop = _group_bounds(p, g, plan.total_rows)
    n_rows = stop - start
    s = _group_structure(p, plan.total_rows, plan.last_row_cap, plan.empty_row, g)
    rng = np.random.default_rng([p.seed, 2, g])
    rows = np.arange(start, stop)
    step = plan.step_of(rows)

    # Per-segment parameters, broadcast to tokens with one np.repeat each. σ is 0 at environment
    # segments, which makes the trainer's logprob there equal to the drawn teacher-forced value.
    row_mu = np.log(p.surprisal_median) + 0.5 * rng.standard_normal(n_rows)
    row_sigma = np.exp(0.25 * rng.standard_normal(n_rows)) * plan.step_factor[step] * p.mismatch_scale
    seg_mu = np.where(s.seg_model, row_mu[s.seg_row], math.log(ENV_LOGPROB_MEDIAN))
    seg_spread = np.where(s.seg_model, MODEL_LOGPROB_SPREAD, ENV_LOGPROB_SPREAD) / LOGISTIC_SD
    seg_sigma = np.where(s.seg_model, row_sigma[s.seg_row] * (1.0 + p.round_drift * s.seg_round), 0.0)
    seg_sigma /= LOGISTIC_SD
    mask = np.repeat(s.seg_model.astype(np.int8), s.seg_len)
    n_tok = mask.size

    rollout = np.empty(n_tok, dtype=np.float32)
    old = np.empty(n_tok, dtype=np.float32)
    _fill_logprobs(
        rng,
        p.outlier_rate,
        np.repeat(seg_mu.astype(np.float32), s.seg_len),
        np.repeat(seg_spread.astype(np.float32), s.seg_len),
        np.repeat(seg_sigma.astype(np.float32), s.seg_len),
        np.repeat(np.where(s.seg_model, np.float32(-1.0), np.float32(0.0)), s.seg_len),
        rollout,
        old,
    )

    offsets = np.zeros(n_rows + 1, dtype=np.int32)
    np.cumsum(plan.row_len[start:stop], out=offsets[1:])
    for c in plan.catastrophic:
        if start <= c["row"] < stop:
            t = offsets[c["row"] - start] + c["position"]
            rollout[t], old[t] = c["rollout_log_prob"], c["old_log_prob"]

    columns: dict[str, pa.Array] = {}
    ids = None
    if p.token_ids or p.text:
        u = rng.random(n_tok, dtype=np.float32)
        model_ids = (u * u * len(MODEL_PIECES)).astype(np.int32)  # Zipf-like: low ids frequent
        env_ids = len(MODEL_PIECES) + (u * len(ENV_PIECES)).astype(np.int32)
        ids = np.where(mask.view(bool), model_ids, env_ids)
    index_in_step = rows - plan.step_starts[step]
    sample_ids = pa.array(
        [_sample_id(int(a), int(b), plan.rows_per_step) for a, b in zip(step, index_in_step, strict=True)],
        pa.string(),
    )
    if p.layout == "sequence":
        off = pa.array(offsets)
        columns["step"] = pa.array(step.astype(np.int64))
        columns["sample_id"] = sample_ids
        columns["rollout_log_probs"] = pa.ListArray.from_arrays(off, pa.array(rollout))
        columns["old_log_probs"] = pa.ListArray.from_arrays(off, pa.array(old))
        columns["response_mask"] = pa.ListArray.from_arrays(off, pa.array(mask))
        if p.token_ids:
            columns["token_ids"] = pa.ListArray.from_arrays(off, pa.array(ids))
        if p.text:
            columns["tokens"] = pa.ListArray.from_arrays(off, vocab.take(pa.array(ids)))
    else:
        row_of_token = np.repeat(np.arange(n_rows, dtype=np.int32), np.diff(offsets))
        columns["step"] = pa.array(np.repeat(step.astype(np.int64), np.diff(offsets)))
        columns["sample_id"] = pc.take(sample_ids, pa.array(row_of_token))
        columns["position"] = pa.array(np.arange(n_tok, dtype=np.int32) - offsets[:-1][row_of_token])
        columns["rollout_log_probs"] = pa.array(rollout)
        columns["old_log_probs"] = pa.array(old)
        columns["response_mask"] = pa.array(mask)
        if p.token_ids:
            columns["token_ids"] = pa.array(ids)
        if p.text:
            columns["tokens"] = vocab.take(pa.array(ids))
    return pa.Table.from_arrays([columns[f.name] for f in schema], schema=schema)


def _metadata(p: Params, plan: Plan, extra: dict[str, str] | None = None) -> dict[str, str]:
    meta = {
        "generator": "sample_data/make_synthetic.py",
        "generator_version": GENERATOR_VERSION,
        "rollout": "synthetic: log-logistic surprisal per model token; 0.0 at environment tokens",
        "trainer": "synthetic: log sigmoid(logit(p_rollout) - eps), eps = sigma * logistic (see params)",
        "env_fill": "zero",
        "layout": p.layout,
        "seed": str(p.seed),
        "params": json.dumps(asdict(p), sort_keys=True),
        "rows": str(plan.total_rows),
        "steps": str(plan.steps),
        "rows_per_step": str(plan.rows_per_step),
        "total_tokens": str(int(plan.row_len.sum())),
        "catastrophic_tokens": json.dumps(plan.catastrophic),
        "all_mask0_rows": json.dumps(
            [
                {
                    "step": int(plan.step_of(np.asarray([plan.empty_row]))[0]),
                    "sample_id": plan.sample_id(plan.empty_row),
                    "row": plan.empty_row,
                }
            ]
        ),
    }
    meta.update(extra or {})
    return meta


def _writer_options(p: Params, schema: pa.Schema) -> dict:
    float_cols = [f.name for f in schema if f.name in FLOAT_COLUMNS]
    if p.layout == "sequence":
        float_cols = [f"{c}.list.element" for c in float_cols]
    dict_cols = [f.name for f in schema if f.name in ("sample_id", "tokens", "step")]
    if p.layout == "sequence" and p.text:
        dict_cols = [c if c != "tokens" else "tokens.list.element" for c in dict_cols]
    return {
        "compression": p.compression,
        "use_dictionary": dict_cols,  # random floats gain nothing from a dictionary
        # byte-stream-split makes zstd ~10 % smaller; with fast codecs it only costs time
        "use_byte_stream_split": float_cols if p.compression == "zstd" else False,
        "write_statistics": [f.name for f in schema if f.name in ("step", "sample_id", "position")],
        "write_batch_size": 1 << 18,  # the default 1024 makes list columns ~40 % slower to write
    }


def iter_tables(p: Params, plan: Plan, threads: int = 2) -> Iterator[pa.Table]:
    """Row-group tables of the dump, in order; `threads` worker threads generate ahead."""
    schema = _schema(p)
    vocab = pa.array(VOCAB, pa.string())
    n_groups = math.ceil(plan.total_rows / p.row_group_rows)
    if threads <= 1:
        for g in range(n_groups):
            yield _group_table(p, plan, g, schema, vocab)
        return
    with ThreadPoolExecutor(max_workers=threads) as pool:
        pending = [pool.submit(_group_table, p, plan, g, schema, vocab) for g in range(min(threads, n_groups))]
        for g in range(n_groups):
            table = pending.pop(0).result()
            if g + threads < n_groups:
                pending.append(pool.submit(_group_table, p, plan, g + threads, schema, vocab))
            yield table


def write_dump(p: Params, out: Path, threads: int = 2, command: str | None = None) -> Plan:
    """Write the dump described by `p` to `out`, one row group at a time; return its plan."""
    plan = make_plan(p)
    schema = _schema(p)
    extra = {"command": command} if command else None
    schema = schema.with_metadata(_metadata(p, plan, extra))
    out.parent.mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(out, schema, **_writer_options(p, schema)) as writer:
        for table in iter_tables(p, plan, threads):
            writer.write_table(table, row_group_size=table.num_rows)
    return plan


# ---------------------------------------------------------------------------------------------
# Deliberately broken files
# ---------------------------------------------------------------------------------------------


def _replace_list(table: pa.Table, name: str, values: list, type_: pa.DataType) -> pa.Table:
    idx = table.schema.get_field_index(name)
    return table.set_column(idx, pa.field(name, type_), pa.array(values, type_))


def bad_table(kind: str, seed: int = 0) -> pa.Table:
    """A small table (3 steps × 8 rows) broken in one documented way; `kind` is one of BAD_KINDS.

    The schema metadata says what is broken and where (`bad_kind`, `bad_detail`).
    """
    if kind not in BAD_KINDS:
        raise ValueError(f"unknown bad kind {kind!r}; choose from {', '.join(BAD_KINDS)}")
    p = replace(
        default_params(sample=True),
        steps=3,
        rows_per_step=8,
        turn_len=6,
        env_len=4,
        single_len=20,
        max_rounds=6,
        catastrophic=0,
        seed=seed,
        text=False,
    )
    plan = make_plan(p)
    table = pa.concat_tables(list(iter_tables(p, plan, threads=1)))
    meta = _metadata(p, plan)
    masks = table.column("response_mask").to_pylist()
    # Victim: the middle model token of the first row of step 1 that has model tokens.
    row = next(i for i in range(8, 16) if any(masks[i]))
    model_positions = [i for i, m in enumerate(masks[row]) if m == 1]
    pos = model_positions[len(model_positions) // 2]
    sid = table.column("sample_id")[row].as_py()
    where = {"row": row, "sample_id": sid, "step": 1, "position": pos}
    f32list = pa.list_(pa.float32())
    if kind == "ragged":
        old = table.column("old_log_probs").to_pylist()
        old[row] = old[row][:-1]
        table = _replace_list(table, "old_log_probs", old, f32list)
        detail = {**where, "position": None, "what": "old_log_probs is one element shorter than the other lists"}
    elif kind == "nan":
        old = table.column("old_log_probs").to_pylist()
        old[row][pos] = float("nan")
        table = _replace_list(table, "old_log_probs", old, f32list)
        detail = {**where, "what": "old_log_probs is NaN at a model token"}
    elif kind == "positive":
        rollout = table.column("rollout_log_probs").to_pylist()
        rollout[row][pos] = 0.5
        table = _replace_list(table, "rollout_log_probs", rollout, f32list)
        detail = {**where, "what": "rollout_log_probs is +0.5 at a model token"}
    elif kind == "mask":
        masks[row][pos] = 2
        table = _replace_list(table, "response_mask", masks, pa.list_(pa.int8()))
        detail = {**where, "what": "response_mask value 2"}
    elif kind == "strings":
        old = [[f"{v:.6g}" for v in seq] for seq in table.column("old_log_probs").to_pylist()]
        table = _replace_list(table, "old_log_probs", old, pa.list_(pa.string()))
        detail = {"what": "old_log_probs is list<string>"}
    elif kind == "missing":
        table = table.drop_columns(["rollout_log_probs"])
        detail = {"what": "no rollout_log_probs column"}
    elif kind == "empty":
        table = table.slice(0, 0)
        detail = {"what": "valid schema, zero rows"}
    else:  # allmask0
        steps = table.column("step").to_numpy()
        masks = [[0] * len(m) if s == 1 else m for m, s in zip(masks, steps, strict=True)]
        rollout = [
            [0.0] * len(r) if s == 1 else r
            for r, s in zip(table.column("rollout_log_probs").to_pylist(), steps, strict=True)
        ]
        table = _replace_list(table, "response_mask", masks, pa.list_(pa.int8()))
        table = _replace_list(table, "rollout_log_probs", rollout, f32list)
        detail = {"step": 1, "what": "step 1 has no model token (every mask 0)"}
    meta.update({"bad_kind": kind, "bad_detail": json.dumps(detail)})
    return table.replace_schema_metadata(meta)


def write_bad(kind: str, out: Path, seed: int = 0) -> list[Path]:
    """Write one broken file to `out`, or with kind 'all' every kind into directory `out`."""
    if kind == "all":
        out.mkdir(parents=True, exist_ok=True)
        return [path for k in BAD_KINDS for path in write_bad(k, out / f"bad_{k}.parquet", seed)]
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(bad_table(kind, seed), out, compression="zstd")
    return [out]


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def default_params(sample: bool) -> Params:
    """Defaults of the bundled sample (`sample=True`) or of a `--tokens` benchmark dump."""
    return Params(
        steps=12 if sample else 0,
        rows_per_step=64 if sample else 256,
        tokens=None,
        max_len=2048 if sample else 8192,
        multiturn_fraction=0.5,
        max_rounds=40,
        turn_len=14 if sample else 160,
        env_len=10 if sample else 96,
        single_len=64 if sample else 1024,
        surprisal_median=0.02,
        mismatch_scale=0.04,
        step_drift=1.5,
        round_drift=0.04,
        outlier_rate=0.002,
        catastrophic=3,
        seed=0,
        row_group_rows=1000,
        layout="sequence",
        text=sample,
        token_ids=sample,
        compression="zstd" if sample else "snappy",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="make_synthetic.py",
        description=(
            "Write synthetic training-inference logprob-mismatch dumps for rollout-diag. With no "
            "arguments: the bundled sample sample_data/synthetic_multiturn.parquet. With --tokens N "
            "--out PATH: a streamed benchmark dump of exactly N tokens (no text column by default). "
            "With --bad KIND --out PATH: a small deliberately broken file."
        ),
        epilog=(
            "Defaults marked sample/bench differ between the bundled sample (no --tokens) and a "
            "--tokens dump. Model: see the module docstring (python -c 'help(\"make_synthetic\")' "
            "from sample_data/) or sample_data/README.md."
        ),
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output file (a directory for --bad all); default: the bundled sample path "
        "without --tokens, required with --tokens",
    )
    parser.add_argument(
        "--tokens",
        type=int,
        default=None,
        help="total tokens (list elements, environment tokens included) of a benchmark dump",
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="training steps (sample: 12; bench: derived from --rows-per-step)"
    )
    parser.add_argument(
        "--rows-per-step",
        type=int,
        default=None,
        help="rows (sequences) per step (sample: 64; bench: 256, or derived from --steps)",
    )
    parser.add_argument("--max-len", type=int, default=None, help="longest row, tokens (sample: 2048; bench: 8192)")
    parser.add_argument("--multiturn-fraction", type=float, default=None, help="share of multi-turn rows (default 0.5)")
    parser.add_argument("--max-rounds", type=int, default=None, help="most rounds in a row (default 40)")
    parser.add_argument(
        "--turn-len",
        type=float,
        default=None,
        help="median tokens of a model turn in a multi-turn row (sample: 14; bench: 160)",
    )
    parser.add_argument(
        "--env-len", type=float, default=None, help="median tokens of an environment segment (sample: 10; bench: 96)"
    )
    parser.add_argument(
        "--single-len",
        type=float,
        default=None,
        help="median tokens of a single-turn response (sample: 64; bench: 1024)",
    )
    parser.add_argument(
        "--mismatch-scale",
        type=float,
        default=None,
        help="sd of the logit perturbation at step 0, round 0 (default 0.04)",
    )
    parser.add_argument(
        "--step-drift",
        type=float,
        default=None,
        help="relative growth of the perturbation from the first to the last step (default 1.5)",
    )
    parser.add_argument(
        "--round-drift", type=float, default=None, help="relative growth of the perturbation per round (default 0.04)"
    )
    parser.add_argument(
        "--outlier-rate", type=float, default=None, help="share of tokens with an 8x perturbation (default 0.002)"
    )
    parser.add_argument(
        "--catastrophic",
        type=int,
        default=None,
        help="catastrophic tokens (|delta| in [1.5, 6]) per step: 1 to this many (default 3; 0: none)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--row-group-rows", type=int, default=None, help="rows (sequences) per Parquet row group (default 1000)"
    )
    parser.add_argument(
        "--layout",
        choices=("sequence", "token"),
        default="sequence",
        help="one row per sequence (list columns; default) or one row per token (scalar columns)",
    )
    text = parser.add_mutually_exclusive_group()
    text.add_argument(
        "--text",
        dest="text",
        action="store_true",
        default=None,
        help="write the decoded `tokens` column (default for the sample)",
    )
    text.add_argument(
        "--no-tokens",
        "--no-text",
        dest="text",
        action="store_false",
        help="skip the decoded `tokens` column (default with --tokens)",
    )
    parser.add_argument(
        "--token-ids",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="write the token_ids column (sample: yes; bench: no)",
    )
    parser.add_argument(
        "--compression", default=None, help="Parquet codec: zstd, snappy, lz4, none (sample: zstd; bench: snappy)"
    )
    parser.add_argument(
        "--threads", type=int, default=2, help="worker threads generating row groups ahead of the writer (default 2)"
    )
    parser.add_argument(
        "--bad",
        choices=(*BAD_KINDS, "all"),
        default=None,
        help="write a small broken file of this kind instead (all: every kind into --out DIR)",
    )
    return parser


def params_from_args(args: argparse.Namespace) -> Params:
    """Resolve command-line options against the sample or benchmark defaults; raise ValueError."""
    base = default_params(sample=args.tokens is None)
    given = {
        name: getattr(args, name)
        for name in (
            "max_len",
            "multiturn_fraction",
            "max_rounds",
            "turn_len",
            "env_len",
            "single_len",
            "mismatch_scale",
            "step_drift",
            "round_drift",
            "outlier_rate",
            "catastrophic",
            "row_group_rows",
            "text",
            "token_ids",
            "compression",
        )
        if getattr(args, name) is not None
    }
    p = replace(base, **given, tokens=args.tokens, seed=args.seed, layout=args.layout)
    if args.tokens is not None:
        if args.tokens <= 0:
            raise ValueError("--tokens must be positive")
        if args.steps is not None and args.rows_per_step is not None:
            raise ValueError("with --tokens give --steps or --rows-per-step, not both (the other is derived)")
        p = replace(p, steps=args.steps or 0, rows_per_step=args.rows_per_step or p.rows_per_step)
    else:
        p = replace(p, steps=args.steps or p.steps, rows_per_step=args.rows_per_step or p.rows_per_step)
    checks = [
        (p.steps >= 0 and p.rows_per_step > 0, "--steps and --rows-per-step must be positive"),
        (p.max_len > 0 and p.max_rounds > 0 and p.row_group_rows > 0, "lengths and counts must be positive"),
        (0.0 <= p.multiturn_fraction <= 1.0, "--multiturn-fraction must be in [0, 1]"),
        (0.0 <= p.outlier_rate <= 1.0, "--outlier-rate must be in [0, 1]"),
        (min(p.turn_len, p.env_len, p.single_len) > 0, "segment lengths must be positive"),
        (p.catastrophic >= 0, "--catastrophic must be >= 0"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)
    return p


def _keep_freed_memory() -> None:
    """Ask glibc to reuse freed row-group buffers instead of returning them to the OS.

    Every row group allocates tens of MB of fresh arrays; by default each comes from a new mmap
    and is paid for again in page faults (~15 % of the run). No-op where glibc is absent.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
        libc.mallopt(-3, 1 << 25)  # M_MMAP_THRESHOLD (32 MiB, its maximum)
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    if args.bad is not None:
        name = "rollout_diag_bad" if args.bad == "all" else f"bad_{args.bad}.parquet"
        default = Path(tempfile.gettempdir()) / name
        for path in write_bad(args.bad, args.out or default, args.seed):
            print(f"wrote {path} ({path.stat().st_size:,} bytes)")
        return 0
    try:
        p = params_from_args(args)
    except ValueError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2
    if p.tokens is not None and args.out is None:
        print("Error: --tokens needs --out PATH (keep big dumps out of the repository).", file=sys.stderr)
        return 2
    out = args.out or SAMPLE_PATH
    command = "python sample_data/make_synthetic.py" + ("" if not argv else " " + shlex.join(argv))
    started = time.perf_counter()
    plan = write_dump(p, out, threads=args.threads, command=command)
    seconds = time.perf_counter() - started
    n_tok = int(plan.row_len.sum())
    print(
        f"wrote {out}: {plan.steps} steps, {plan.total_rows:,} rows, {n_tok:,} tokens, "
        f"{os.path.getsize(out):,} bytes in {seconds:.2f} s ({n_tok / seconds / 1e6:.1f} M tokens/s)"
    )
    if p.steps > plan.steps:
        print(f"(--steps {p.steps} asked for more steps than the {plan.total_rows} rows the token budget makes)")
    print(f"all-mask-0 row: {_metadata(p, plan)['all_mask0_rows']}")
    if len(plan.catastrophic) <= 60:
        for c in plan.catastrophic:
            print(
                f"catastrophic token: step {c['step']} {c['sample_id']} position {c['position']} "
                f"(round {c['round']}): rollout {c['rollout_log_prob']:.3f} old {c['old_log_prob']:.3f} "
                f"delta {c['delta']:+.3f}"
            )
    else:
        print(f"{len(plan.catastrophic)} catastrophic tokens (listed in the schema metadata)")
    return 0


if __name__ == "__main__":
    _keep_freed_memory()  # process-wide malloc setting: only when run as a script
    sys.exit(main())
