"""Is the change of the mismatch between the early and the late window beyond noise, and which part of which factor
explains most of it (docs/drift.md).

The interval is a seeded percentile bootstrap over rows, resampled within each window: rows fall into
REPLICATE_GROUPS random groups by a hash of their file and row number (``metrics/drift.py``), and each replicate draws
that many groups with replacement in each window (independent streams of one seed, as ``diff`` draws A and B), so the
interval is the same for any chunking or worker count and costs [replicates × groups] arithmetic, not a pass. A change
is *beyond noise* when the interval excludes 0 and the late value is at least DRIFT_MIN_RATIO times the early one (or
at most its inverse): a 3 % move of a 20 M-token run is real but says nothing about why training went wrong.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rollout_diag.decisions.bootstrap import DEFAULT_LEVEL, DEFAULT_REPLICATES, DEFAULT_SEED, tail_interval

DRIFT_MIN_RATIO = 1.25  # a change smaller than 25 % is not said, whatever its interval
EXPLAINS = 0.5  # a part that carries at least half of the change is named as its cause
LITTLE = 0.25  # the rest of a factor moved "little" when it carries under a quarter of the change


def bootstrap_changes(
    before: np.ndarray, after: np.ndarray, columns: Sequence[int], replicates: int, seed: int
) -> np.ndarray:
    """[replicates, len(columns)] of the late window's token mean minus the early one's, each window's groups
    (``before``, ``after``: [groups, (tokens, Σ values …)]) drawn with replacement, as many as there are groups."""
    stream_before, stream_after = (np.random.default_rng(child) for child in np.random.SeedSequence(seed).spawn(2))
    values = []
    for sums, rng in ((before, stream_before), (after, stream_after)):
        groups = sums.shape[0]
        counts = rng.multinomial(groups, np.full(groups, 1.0 / groups), size=replicates).astype(np.float64)
        # [replicates, sums]: one matrix product (BLAS order: compared with rtol only); an infinite Σ k3 (δ > 709)
        # makes inf or NaN replicates, which the interval leaves out, without a warning
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            drawn = counts @ sums
            values.append(drawn[:, list(columns)] / drawn[:, [0]])
    return values[1] - values[0]


def _explained_by(entry: Mapping[str, Any]) -> dict[str, Any] | None:
    """What explains the change: the factor whose mix carries the largest share of it; its mix when that share is at
    least EXPLAINS (with the bucket the tokens moved toward), else the within part (no shift between buckets explains
    it: each bucket's own mismatch moved). None when the change is 0."""
    change = entry["change"]
    if change == 0 or not math.isfinite(change) or not entry["factors"]:
        return None
    factor = max(entry["factors"], key=lambda f: f["mix"] / change)
    mix, within = factor["mix"] / change, factor["within"] / change
    found: dict[str, Any] = {"factor": factor["factor"], "mix_share": mix}
    if mix >= EXPLAINS:
        # toward the bucket whose mix moved the value most in the change's direction
        toward = max(factor["buckets"], key=lambda b: (b["mix"] / change, b["to_share"] - b["from_share"]))
        found.update(part="mix", share=mix, rest=within, toward=toward["bucket"])
    else:
        found.update(part="within", share=within, rest=mix)
    found["rest_little"] = abs(found["rest"]) < LITTLE
    return found


def judge_drift(
    entries: Sequence[dict[str, Any]],
    before: np.ndarray,
    after: np.ndarray,
    columns: Mapping[str, int],
    replicates: int = DEFAULT_REPLICATES,
    level: float = DEFAULT_LEVEL,
    seed: int = DEFAULT_SEED,
) -> list[dict[str, Any]]:
    """``entries`` (one per metric, ``drivers/drift.py``) with the ratio, the bootstrap interval of the change,
    whether it is beyond noise and what explains it added. ``before``/``after``: each window's replicate-group sums;
    ``columns``: each entry's column there, in entry order."""
    changes = bootstrap_changes(before, after, list(columns.values()), replicates, seed)
    tail = (1.0 - level) / 2.0
    out = []
    for index, entry in enumerate(entries):
        low, high = tail_interval(changes[:, index], tail)
        start, end = entry["from"], entry["to"]
        ratio = end / start if start > 0 else None
        material = ratio is not None and (ratio >= DRIFT_MIN_RATIO or ratio <= 1.0 / DRIFT_MIN_RATIO)
        beyond = bool(material and math.isfinite(low) and (low > 0 or high < 0))
        out.append(
            {
                **entry,
                "ratio": ratio,
                "interval": [low, high] if math.isfinite(low) else None,
                "beyond_noise": beyond,
                "explained_by": _explained_by(entry) if beyond else None,
                "bootstrap": {"replicates": replicates, "level": level, "seed": seed, "unit": "row groups"},
            }
        )
    return out
