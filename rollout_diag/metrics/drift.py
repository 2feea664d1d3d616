"""Why the mismatch moved between an early and a late window of steps (docs/drift.md).

A token mean over a window is Σ_b w_b·m_b over the buckets b of a factor (w_b: the bucket's share of the window's
tokens, m_b: its mean), so its change between two windows splits exactly into a *mix* part (tokens moved between
buckets) and a *within* part (each bucket's own mean moved), the two-factor Shapley split:

    mix = Σ_b (w'_b − w_b)·(m_b + m'_b)/2,   within = Σ_b (m'_b − m_b)·(w_b + w'_b)/2,   mix + within = change.

A bucket empty in one window has no mean there; it is given the other window's mean, so that all of it is mix (the
identity holds for any value there, its weight being 0). The buckets' edges are fixed (log2 lengths and positions,
the hints' rollout-probability edges, rounds, a ``--by`` column's values), never quantiles of the data, which would
move with it.

This family keeps what no other one does: per step, the tokens, Σ|δ| and Σ k3 of each response-length bucket (log2
of the row's model tokens) and of each of REPLICATE_GROUPS random groups of rows (a hash of the row's step and sample
id picks its group), from which ``decisions/drift.py`` bootstraps the change over rows. The rollout-probability,
position and round buckets are the hint evidence's, the positions' and the rounds' own state (read, not restated).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from rollout_diag import catalogue
from rollout_diag.engine import arrays
from rollout_diag.engine.arrays import Array
from rollout_diag.engine.stats import stats
from rollout_diag.errors import ConfigError, option_name
from rollout_diag.io.chunk import Chunk
from rollout_diag.io.readlog import row_keys
from rollout_diag.metrics.base import State, StepAccumulator
from rollout_diag.metrics.localize import POSITION_BUCKETS, bucket_label

LENGTH_BUCKETS = POSITION_BUCKETS  # log2 buckets of a row's model tokens: 0, 1, 2–3, 4–7, … (rows up to 2^38)
# Rows fall into this many random groups (a hash of step and sample id: the same group whatever the chunking, the file
# split or the worker); the bootstrap resamples the groups of each window. 64 groups keep a step's state small (≤ 64 ×
# 3 floats) and give a percentile interval as steady as resampling rows does once a window holds a few hundred rows.
REPLICATE_GROUPS = 64
DRIFT_SUMS = ("tokens", "abs", "k3")  # per bucket: model tokens, Σ|δ|, Σ(exp δ − δ − 1)
DRIFT_METRICS = {"k3": catalogue.K3_KL.key, "abs": catalogue.LOGPROB_ABS_DIFF.key}  # each a token mean (METRICS.md)
WINDOW_SHARE = 0.2  # default windows: the first and the last 20 % of the steps (at least one step each)
DriftWindows = tuple[tuple[int, int], tuple[int, int]]  # (early, late): first and last step of each, inclusive


def length_bucket(tokens: np.ndarray) -> np.ndarray:
    """The log2 bucket of each row's model-token count (0 → 0, 1 → 1, 2–3 → 2, 4–7 → 3, …), as positions'."""
    exponent = np.frexp(np.asarray(tokens, dtype=np.float64))[1].astype(np.int64)  # n = m·2^e, m in [0.5, 1)
    return np.minimum(exponent, LENGTH_BUCKETS - 1)  # a count ≥ 0 has an exponent ≥ 0


def length_label(bucket: int) -> str:
    """A length bucket's label: its token range."""
    return bucket_label(bucket)[2] if bucket else "0"


def row_groups(steps: np.ndarray, sample_ids: Sequence[str], keys: np.ndarray | None = None) -> np.ndarray:
    """The replicate group of each row: the hash of its (step, sample id) (``io.readlog.row_keys``, the skipped rows'
    key; ``keys``: those hashes, where the reader made them: ``Chunk.row_key``) mod REPLICATE_GROUPS. A function of
    the row alone, so any chunking, row order, file split, storage or worker split gives every row the same group."""
    if keys is None:
        keys = row_keys(np.asarray(steps), sample_ids)
    return (keys % np.uint64(REPLICATE_GROUPS)).astype(np.int64)


class DriftAccumulator(StepAccumulator):
    """Per step: [tokens, Σ|δ|, Σ k3] per response-length bucket and per replicate group of rows."""

    REDUCTIONS: ClassVar[dict[str, str]] = {"length": "sum", "replicates": "sum"}

    def _stats(self, chunk: Chunk) -> dict[str, Array]:
        s = stats(chunk)
        groups = chunk.groups
        tokens = arrays.host(arrays.float64(s.row_count))
        values = np.stack([tokens, arrays.host(s.row_sum("abs_log_ratio")), arrays.host(s.row_sum("k3"))], axis=1)
        row_group = arrays.host(groups.row_group).astype(np.int64)
        out = {}
        for name, bucket, buckets in (
            ("length", length_bucket(tokens), LENGTH_BUCKETS),
            ("replicates", row_groups(arrays.host(chunk.step), chunk.sample_id, chunk.row_key), REPLICATE_GROUPS),
        ):
            key = row_group * buckets + bucket
            size = groups.count * buckets
            out[name] = np.stack(
                [np.bincount(key, weights=values[:, k], minlength=size) for k in range(len(DRIFT_SUMS))], axis=1
            ).reshape(groups.count, buckets, len(DRIFT_SUMS))
        return out

    def _finalize(self, state: State) -> dict[str, float]:
        return {}  # no metric of its own: ``split`` reads the windows' states


# ------------------------------------------------------------------------------------------------ windows
def parse_windows(text: str) -> DriftWindows:
    """``A:B,C:D`` (steps, inclusive, A ≤ B, C ≤ D) as ((A, B), (C, D)); raises ConfigError."""
    parts = [part.strip() for part in text.split(",")]
    hint = "give two step ranges, early then late, e.g. 0:9,90:99."
    if len(parts) != 2:
        raise ConfigError(f"{option_name('drift_windows')} {text!r}: {hint}")
    windows = []
    for part in parts:
        first, sep, last = part.partition(":")
        bad = f"{option_name('drift_windows')} {text!r}: {part!r} is not FIRST:LAST (integers, FIRST ≤ LAST); {hint}"
        try:
            low, high = int(first), int(last)
        except ValueError:
            raise ConfigError(bad) from None
        if not sep or low > high:
            raise ConfigError(bad)
        windows.append((low, high))
    if windows[1][0] <= windows[0][1]:
        raise ConfigError(
            f"{option_name('drift_windows')} {text!r}: the late window must start after the early one ends."
        )
    return windows[0], windows[1]


def choose_windows(steps: np.ndarray, windows: DriftWindows | None) -> tuple[np.ndarray, np.ndarray] | None:
    """The steps (sorted ids) of the early and the late window: ``windows`` as given, else the first and the last
    WINDOW_SHARE of the steps (at least one each); None with fewer than 2 steps and no windows given. Raises
    ConfigError when a given window holds no step."""
    if windows is None:
        if steps.shape[0] < 2:
            return None
        size = max(1, int(steps.shape[0] * WINDOW_SHARE + 1e-9))
        return steps[:size], steps[-size:]
    found = []
    for low, high in windows:
        inside = steps[(steps >= low) & (steps <= high)]
        if not inside.size:
            raise ConfigError(
                f"{option_name('drift_windows')} {low}:{high}: no step of the input lies there (steps "
                f"{int(steps[0])}–{int(steps[-1])})."
                if steps.size
                else f"{option_name('drift_windows')}: no step."
            )
        found.append(inside)
    return found[0], found[1]


# ------------------------------------------------------------------------------------------------ the split
def split(
    before: tuple[np.ndarray, np.ndarray], after: tuple[np.ndarray, np.ndarray], labels: Sequence[str]
) -> dict[str, Any]:
    """The Shapley split of a token mean's change between two windows over one factor's buckets. ``before`` and
    ``after``: (tokens [B], Σ value [B]) per bucket. Returns {"from", "to", "change", "mix", "within", "buckets"}:
    each bucket that holds a token in either window with its shares, means (None where empty) and parts."""
    n0, s0 = (np.asarray(a, dtype=np.float64) for a in before)
    n1, s1 = (np.asarray(a, dtype=np.float64) for a in after)
    total0, total1 = float(n0.sum()), float(n1.sum())
    w0 = n0 / total0 if total0 > 0 else np.zeros_like(n0)
    w1 = n1 / total1 if total1 > 0 else np.zeros_like(n1)
    # an infinite Σ k3 (a token with δ > 709) gives inf or NaN parts, as the step's k3_kl is inf: no warning
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        m0 = np.where(n0 > 0, s0 / n0, np.nan)
        m1 = np.where(n1 > 0, s1 / n1, np.nan)
        # a bucket empty in one window takes the other's mean there: its whole part is mix (weight 0 makes it exact)
        m0_filled = np.where(n0 > 0, m0, m1)
        m1_filled = np.where(n1 > 0, m1, m0)
        present = (n0 > 0) | (n1 > 0)
        mix = np.where(present, (w1 - w0) * (m0_filled + m1_filled) / 2.0, 0.0)
        within = np.where(present, (m1_filled - m0_filled) * (w0 + w1) / 2.0, 0.0)
        value0 = float(np.sum(np.where(n0 > 0, w0 * m0_filled, 0.0)))
        value1 = float(np.sum(np.where(n1 > 0, w1 * m1_filled, 0.0)))
    buckets = [
        {
            "bucket": labels[b],
            "from_share": float(w0[b]),
            "to_share": float(w1[b]),
            "from_mean": None if n0[b] == 0 else float(m0[b]),
            "to_mean": None if n1[b] == 0 else float(m1[b]),
            "mix": float(mix[b]),
            "within": float(within[b]),
        }
        for b in np.flatnonzero(present).tolist()
    ]
    return {
        "from": value0,
        "to": value1,
        "change": value1 - value0,
        "mix": float(mix.sum()),
        "within": float(within.sum()),
        "buckets": buckets,
    }
