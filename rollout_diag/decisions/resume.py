"""Resumed runs: where a dump's steps start again from a checkpoint, found from the hint evidence (pure functions).

A run resumed from a checkpoint shows in a dump in two ways (``docs/hints.md``, ``resume_spike``):

- **steps go back** in the file sequence (files in natural order, rows in file order): a file, or a row inside one,
  whose step is below the step read before it, but above the first step of the dump. Per-rank files that each
  hold every step start again at the first step: that is a layout, not a resume;
- **policy_version goes back**: a step whose rows all carry a lower policy version than every row of the step
  before it (a weight-sync counter that restarts with the process).

``resume_steps`` returns the steps where a resumed run starts; the anomaly and trend rules label the steps right after
one as a resume (``decisions/trends.py``), and ``resume_spike`` (``decisions/hints.py``) says whether the mismatch
jumps there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from rollout_diag.paths import natural_key
from rollout_diag.results import UNORDERED, Evidence

RESUME_WINDOW = 3  # steps from the resumed step on that a resume transient covers (slime #1695: "a few steps")


RESUMES_AT_MOST = 3  # more steps back than this in the file sequence: rows out of step order, not resumes


def resume_steps(evidence: Evidence | None) -> list[int]:
    """Steps where a resumed run starts, ascending (empty when none is seen). A file sequence whose steps go back
    within a piece more than once, or more than RESUMES_AT_MOST times in all, holds rows out of step order (shuffled
    or interleaved): no resume is read from it (a policy_version that goes back still is)."""
    if evidence is None:
        return []
    unordered = any(piece[6] == UNORDERED for pieces in evidence.files.values() for piece in pieces)
    back = [] if unordered else _steps_back(evidence.files)
    found = set(back if len(back) <= RESUMES_AT_MOST else []) | set(_versions_back(evidence.steps))
    return sorted(found)


def _steps_back(files: Mapping[str, Sequence[tuple[int, ...]]]) -> list[int]:
    """Steps at which the file sequence goes back to a step above its first one. After a step back the sequence
    follows the resumed run (the position is the last step read, not the highest), so the resumed run's next
    steps, which the first run had reached too, are not resumes again."""
    ordered = sorted(files, key=natural_key)
    if not ordered:
        return []
    first = sorted(files[ordered[0]])[0][1]
    found: list[int] = []
    position = -math.inf
    for file in ordered:
        for _, first_step, last_step, _, _, _, back_step in sorted(files[file]):
            if position > first_step > first:  # the piece starts below the step last read
                found.append(first_step)
            if back_step > first:  # a step back inside the piece (-1: none)
                found.append(back_step)
            position = last_step
    return found


def _versions_back(steps: Mapping[int, Mapping[str, float]]) -> list[int]:
    """Steps whose highest policy_version is below the lowest of the step before (with a policy_version column): each
    step that carries one against the last step before it that does."""
    ordered, low, high = _version_extremes(steps)
    carries = np.isfinite(low)
    ordered, low, high = ordered[carries], low[carries], high[carries]
    return [int(step) for step in ordered[1:][high[1:] < low[:-1]]]


def _version_extremes(steps: Mapping[int, Mapping[str, float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the steps ascending, each one's version_min, version_max; ±inf where a step has none): as columns where the
    evidence holds them (``metrics.hints`` ``_NamedSteps.columns``; read step by step, 200 000 steps took 1.2 s a
    reading), else step by step."""
    columns = getattr(steps, "columns", None)
    if columns is not None:
        ordered, (low, high) = columns(("version_min", "version_max"))
        return ordered, low, high
    ordered = sorted(steps)
    low = np.array([steps[step].get("version_min", math.inf) for step in ordered], dtype=np.float64)
    high = np.array([steps[step].get("version_max", -math.inf) for step in ordered], dtype=np.float64)
    return np.array(ordered, dtype=np.int64), low, high


def resume_windows(resumes: Sequence[int], steps: Sequence[int]) -> dict[int, int]:
    """Each step within RESUME_WINDOW steps (of those present) from a resume → that resume's step."""
    ordered = sorted(set(steps))
    out: dict[int, int] = {}
    for resume in resumes:
        after = [step for step in ordered if step >= resume][:RESUME_WINDOW]
        for step in after:
            out.setdefault(step, resume)
    return out
