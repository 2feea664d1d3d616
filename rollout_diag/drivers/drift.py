"""The analysis result's ``drift``: the early and the late window's sums per factor, read from the families that hold
them (hint evidence: rollout-probability buckets; drift: response-length buckets and the replicate groups; positions;
rounds; each ``--by`` grouping's §1 state), split by ``metrics/drift.py`` and judged by ``decisions/drift.py``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from rollout_diag.decisions.drift import judge_drift
from rollout_diag.decisions.hints import PROBABILITY_LABELS
from rollout_diag.engine.state import State
from rollout_diag.metrics.base import StepAccumulator
from rollout_diag.metrics.drift import (
    DRIFT_METRICS,
    DRIFT_SUMS,
    LENGTH_BUCKETS,
    DriftWindows,
    choose_windows,
    length_label,
    split,
)
from rollout_diag.metrics.hints import PROBABILITY_BUCKETS, PROBABILITY_COLUMNS
from rollout_diag.metrics.localize import POSITION_BUCKETS, bucket_label

if TYPE_CHECKING:
    from rollout_diag.drivers.passes import Analysis

# per factor: tokens, Σ|δ|, Σ k3 as [buckets] arrays of one window
Sums = dict[str, np.ndarray]


def _window_state(family: StepAccumulator, window: np.ndarray) -> State | None:
    table = family.store
    return table.subset(np.isin(table.steps, window)).total()


def _factor_sums(analysis: Analysis, window: np.ndarray) -> Iterator[tuple[str, list[str], Sums]]:
    """(factor, bucket labels, sums) of one window, for every factor in report order."""
    state = _window_state(analysis.hint_evidence, window)
    if state is not None:
        columns = np.asarray(state["probability_buckets"], np.float64).reshape(PROBABILITY_BUCKETS, -1)
        index = {name: PROBABILITY_COLUMNS.index(name) for name in ("tokens", "abs", "k3")}
        yield "probability", list(PROBABILITY_LABELS), {name: columns[:, k] for name, k in index.items()}
    state = _window_state(analysis.drift, window)
    if state is not None:
        length = np.asarray(state["length"], np.float64).reshape(LENGTH_BUCKETS, len(DRIFT_SUMS))
        labels = [length_label(b) for b in range(LENGTH_BUCKETS)]
        yield "length", labels, {name: length[:, k] for k, name in enumerate(DRIFT_SUMS)}
    state = _window_state(analysis.positions, window)
    if state is not None:
        labels = [bucket_label(b)[2] for b in range(POSITION_BUCKETS)]
        yield "position", labels, _sums(state)
    state = _window_state(analysis.rounds, window)
    if state is not None:
        rounds = analysis.rounds.max_rounds
        labels = [str(k) if k < rounds else f"{k}+" for k in range(rounds + 1)]
        yield "round", labels, _sums(state)
    for grouped in analysis.grouped:
        by_group = grouped.split(grouped.families[0])  # §1 per group: tokens, Σ|δ|, Σ k3 per step
        labels, tokens, abs_sums, k3_sums = [], [], [], []
        for sort_key in sorted(by_group):
            group_state = _window_state(by_group[sort_key], window)
            value = grouped.values[sort_key]
            labels.append("(null)" if value is None else str(value))
            tokens.append(0.0 if group_state is None else float(group_state["tokens"]))
            abs_sums.append(0.0 if group_state is None else float(group_state["abs_diff"]))
            k3_sums.append(0.0 if group_state is None else float(group_state["k3_kl"]))
        yield (
            grouped.spec.label,
            labels,
            {"tokens": np.array(tokens), "abs": np.array(abs_sums), "k3": np.array(k3_sums)},
        )


def _sums(state: State) -> Sums:
    """A positions' or rounds' state as the split's sums (their own names for tokens, Σ|δ|, Σ k3)."""
    return {
        "tokens": np.asarray(state["token_count"], np.float64).ravel(),
        "abs": np.asarray(state["abs_diff"], np.float64).ravel(),
        "k3": np.asarray(state["k3_kl"], np.float64).ravel(),
    }


def _replicates(analysis: Analysis, window: np.ndarray) -> np.ndarray:
    state = _window_state(analysis.drift, window)
    if state is None:  # no step of the window in the drift family: no replicate
        return np.zeros((0, len(DRIFT_SUMS)))
    return np.asarray(state["replicates"], np.float64).reshape(-1, len(DRIFT_SUMS))


def drift_of(analysis: Analysis) -> list[dict[str, Any]]:
    """One entry per metric of DRIFT_METRICS (k3_kl, mean |δ|): the early and the late window
    (``analysis.drift_windows``: step ranges, inclusive; None: the first and the last 20 % of the steps), the token
    mean in each, its change and the change's split per factor, judged (bootstrap interval, beyond noise); [] with
    fewer than two steps and no windows, or a pass without the families it reads.
    Raises ConfigError when a given window holds no step."""
    if analysis.offpolicy_only or not analysis.findings:
        return []
    windows: DriftWindows | None = analysis.drift_windows  # type: ignore[assignment]  # parsed by Analysis
    chosen = choose_windows(analysis.offpolicy.store.steps, windows)
    if chosen is None:
        return []
    early, late = chosen
    before, after = list(_factor_sums(analysis, early)), list(_factor_sums(analysis, late))
    entries = []
    for name, metric in DRIFT_METRICS.items():
        factors = []
        for (factor, labels, sums0), (_, _, sums1) in zip(before, after, strict=True):
            parts = split((sums0["tokens"], sums0[name]), (sums1["tokens"], sums1[name]), labels)
            factors.append({"factor": factor, **parts})
        # the window's value from the length factor: every token of the window, from this family's own sums
        head = next(f for f in factors if f["factor"] == "length")
        entries.append(
            {
                "metric": metric,
                "from_steps": [int(early[0]), int(early[-1])],
                "to_steps": [int(late[0]), int(late[-1])],
                "from": head["from"],
                "to": head["to"],
                "change": head["to"] - head["from"],
                "factors": [
                    {"factor": f["factor"], "mix": f["mix"], "within": f["within"], "buckets": f["buckets"]}
                    for f in factors
                ],
            }
        )
    column = {name: DRIFT_SUMS.index(name) for name in DRIFT_METRICS}
    return judge_drift(entries, _replicates(analysis, early), _replicates(analysis, late), column)
