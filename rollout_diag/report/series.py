"""Bounded views of result data for the report: decimated step series and step-bucketed matrices.

The report's size must not grow with the run, so every per-step series goes through these rules
(stated in the report footer by ``SIZE_RULE``).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from typing import TypeGuard

import numpy as np

from rollout_diag.catalogue import ROUND_ABS_DIFF_MEAN, ROUND_TOKEN_COUNT, parse_round_key
from rollout_diag.results import StepResult, StepTable

MAX_STEP_POINTS = 2000  # a per-step line keeps every step up to this many
MAX_HEATMAP_COLUMNS = 400  # round×step and position×step heatmaps merge consecutive steps beyond this
MAX_HEATMAP_ROUNDS = 64  # rounds beyond are merged into one "≥ 64" row (token-weighted)
MAX_TABLE_ROWS = 50  # worst tokens, anomalies
MAX_STRIP_ROWS = 10  # token strips for the worst rows
MAX_STRIP_TOKENS = 1024  # tokens per strip: a window around the row's largest |δ|
MAX_TEXT = 200  # characters of any single string from the data (sample ids, file names)
MAX_TOKEN_TEXT = 24  # characters of one token's text in a strip

SIZE_RULE = (
    f"Size rule: per-step lines keep every step up to {MAX_STEP_POINTS:,} steps; longer runs are split into "
    f"{MAX_STEP_POINTS // 2:,} runs of consecutive steps, each keeping its minimum and maximum, plus every "
    f"anomaly step and the first and last step (so spikes are never lost). Heatmaps merge consecutive steps "
    f"into at most {MAX_HEATMAP_COLUMNS} columns (token-weighted means) and show at most {MAX_HEATMAP_ROUNDS} "
    f"rounds. Tables show the top {MAX_TABLE_ROWS} entries; token strips the {MAX_STRIP_ROWS} worst rows, "
    f"at most {MAX_STRIP_TOKENS:,} tokens each around the largest |δ|. Strings longer than {MAX_TEXT} "
    "characters are cut."
)


def finite(value: float | None) -> TypeGuard[float]:
    """Whether ``value`` is a number to draw: not None, not NaN nor infinite."""
    return value is not None and not (isinstance(value, float) and not math.isfinite(value))


def clip_text(text: str, limit: int = MAX_TEXT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def step_series(steps: Sequence[StepResult], metric: str) -> tuple[list[int], list[float | None]]:
    """(step ids, values) of ``metric`` over the steps that carry a step id; missing or NaN values are None."""
    if isinstance(steps, StepTable) and (read := steps.float_column(metric)) is not None:
        present, values = read  # every step of a table has an id; no step is built
        shown = (present & np.isfinite(values)).tolist()
        out = [value if hit else None for value, hit in zip(values.tolist(), shown, strict=True)]
        return steps.step_ids.tolist(), out
    ids, out = [], []
    for step in steps:
        if step.step is None:
            continue
        value = step.metrics.get(metric)
        ids.append(step.step)
        out.append(value if finite(value) else None)
    return ids, out


def decimate(
    ids: Sequence[int], values: Sequence[float | None], keep: Collection[int] = (), max_points: int = MAX_STEP_POINTS
) -> tuple[list[int], list[float | None]]:
    """Min-max decimation: beyond ``max_points``, each of ``max_points // 2`` consecutive runs keeps its min and max.

    Steps in ``keep`` (anomalies) and the first and last step always stay; None values are gaps and stay only
    when kept for another reason.
    """
    if len(ids) <= max_points:
        return list(ids), list(values)
    chosen = {0, len(ids) - 1}
    if keep:
        chosen |= {index for index, step in enumerate(ids) if step in keep}
    numbers = _as_floats(values)
    for start, end in bucket_bounds(len(ids), max_points // 2):
        if numbers is not None:  # the first smallest and first largest of the run, as min() and max() pick them
            # (not nanargmin/nanargmax: they read a gap as ±inf, so a gap before an infinite value would win)
            present = start + np.flatnonzero(~np.isnan(numbers[start:end]))
            if present.size:
                run = numbers[present]
                chosen.add(int(present[np.argmin(run)]))
                chosen.add(int(present[np.argmax(run)]))
            continue
        held = {index: value for index in range(start, end) if (value := values[index]) is not None}
        if held:
            chosen.add(min(held, key=held.__getitem__))
            chosen.add(max(held, key=held.__getitem__))
    order = sorted(chosen)
    return [ids[index] for index in order], [values[index] for index in order]


def _as_floats(values: Sequence[float | None]) -> np.ndarray | None:
    """``values`` as float64, NaN for None; None where a value is not a float or is NaN itself (min() and max() of
    those are read value by value)."""
    if not all(value is None or type(value) is float for value in values):
        return None
    numbers = np.array([math.nan if value is None else value for value in values], dtype=np.float64)
    if np.isnan(numbers).sum() != sum(value is None for value in values):
        return None
    return numbers


def bucket_bounds(length: int, buckets: int) -> list[tuple[int, int]]:
    """Split range(length) into at most ``buckets`` consecutive [start, end) runs of near-equal size."""
    if length <= buckets:
        return [(index, index + 1) for index in range(length)]
    return [(length * b // buckets, length * (b + 1) // buckets) for b in range(buckets)]


def weighted_buckets(
    values: Sequence[float | None], weights: Sequence[float], bounds: Sequence[tuple[int, int]]
) -> list[tuple[float | None, float]]:
    """(weight-averaged value, total weight) per bucket; None where the bucket has no weight."""
    merged = []
    for start, end in bounds:
        pairs = [(value, weights[i]) for i in range(start, end) if (value := values[i]) is not None]
        total = sum(weight for _, weight in pairs)
        weighted = sum(value * weight for value, weight in pairs)
        merged.append((weighted / total if total > 0 else None, total))
    return merged


def per_round_by_step(steps: Sequence[StepResult]) -> dict[int, tuple[list[float | None], list[float]]]:
    """round index → (mean |δ| per step, model tokens per step), over ``steps`` in order."""
    if isinstance(steps, StepTable):
        columns = _round_columns(steps)
        if columns is not None:
            return columns
    table: dict[int, tuple[list[float | None], list[float]]] = {}
    for position, step in enumerate(steps):
        for name, value in step.metrics.items():
            parsed = parse_round_key(name)
            if parsed is None or parsed[1] not in (ROUND_TOKEN_COUNT, ROUND_ABS_DIFF_MEAN):
                continue
            means, tokens = table.setdefault(parsed[0], ([None] * len(steps), [0.0] * len(steps)))
            if parsed[1] is ROUND_TOKEN_COUNT:
                tokens[position] = float(value) if finite(value) else 0.0
            else:
                means[position] = value if finite(value) else None
    return dict(sorted(table.items()))


def _round_columns(steps: StepTable) -> dict[int, tuple[list[float | None], list[float]]] | None:
    """``per_round_by_step`` read from a StepTable's columns (no step's dict is built); None where a round column
    is not float64 (then each step's value as it reads is what the figure shows)."""
    metrics = steps.metrics
    table: dict[int, tuple[list[float | None], list[float]]] = {}
    for name, groups in metrics.where.items():
        parsed = parse_round_key(name)
        if parsed is None or parsed[1] not in (ROUND_TOKEN_COUNT, ROUND_ABS_DIFF_MEAN):
            continue
        if any(np.asarray(metrics.groups[group][1][name]).dtype != np.float64 for group in groups):
            return None
        present, values = steps.column(name)
        if not present.any():
            continue
        means, tokens = table.setdefault(parsed[0], ([None] * len(steps), [0.0] * len(steps)))
        for position, value in zip(np.flatnonzero(present).tolist(), values[present].tolist(), strict=True):
            if parsed[1] is ROUND_TOKEN_COUNT:
                tokens[position] = value if math.isfinite(value) else 0.0
            else:
                means[position] = value if math.isfinite(value) else None
    return dict(sorted(table.items()))


def pool_rounds(
    table: dict[int, tuple[list[float | None], list[float]]], limit: int = MAX_HEATMAP_ROUNDS
) -> dict[int, tuple[list[float | None], list[float]]]:
    """Rounds at index ≥ ``limit`` merged into round ``limit`` (token-weighted), so the heatmap stays bounded."""
    if len(table) <= limit:
        return table
    kept = {k: v for k, v in table.items() if k < limit}
    extra = [v for k, v in table.items() if k >= limit]
    steps = len(extra[0][1])
    tokens = [sum(t[i] for _, t in extra) for i in range(steps)]
    means = [
        sum(mean * t[i] for m, t in extra if (mean := m[i]) is not None) / tokens[i] if tokens[i] > 0 else None
        for i in range(steps)
    ]
    kept[limit] = (means, tokens)
    return kept
