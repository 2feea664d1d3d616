"""Key mismatch metrics as ratios of per-row sums, so that they can be recomputed on resampled rows.

Each metric is Σ_i w_i·num_i / (Σ_i w_i·den_i + eps) + offset over rows i with weights w (all ones for the
value itself, bootstrap counts for a replicate). Which metrics, and each one's formula over the rows, are stated
once in the metric's catalogue row (role ``bootstrapped``, ``row=RowFormula``); this module only evaluates them.
With unit weights each one is the metric of METRICS.md that ``analyze`` reports under the same name (tests check
it to 1e-12).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rollout_diag import catalogue
from rollout_diag.catalogue import CLAMP, EPS
from rollout_diag.results import RowStats


def _row_mean(rows: RowStats, name: str) -> np.ndarray:  # R_i[x] = S_i[x] / (n_i + 1e-8)
    return rows.sums[name] / (rows.tokens + EPS)


def _ones(rows: RowStats) -> np.ndarray:
    return np.ones(rows.rows)


@dataclass(frozen=True)
class RowMetric:
    """A metric of the run as Σ w·numerator / (Σ w·denominator + eps) + offset; lower values mean less mismatch."""

    name: str
    numerator: Callable[[RowStats], np.ndarray]
    denominator: Callable[[RowStats], np.ndarray]
    eps: float = 0.0
    offset: float = 0.0
    meaning: str = ""

    def value(self, rows: RowStats) -> float:
        """The metric over every row of ``rows`` (NaN without a row or a model token)."""
        if rows.rows == 0 or float(rows.tokens.sum()) == 0.0:
            return float("nan")
        return float(self.numerator(rows).sum() / (self.denominator(rows).sum() + self.eps) + self.offset)


def _abs_log_ppl_diff(rows: RowStats) -> np.ndarray:  # |d_i|, d_i = R_i[r] − R_i[a] (§1)
    return np.abs(_row_mean(rows, "rollout") - _row_mean(rows, "trainer"))


def _chi2_seq_term(rows: RowStats) -> np.ndarray:  # exp(2·clamp20(S_i[δ])) (§1)
    return np.exp(2.0 * np.clip(rows.sums["log_ratio"], -CLAMP, CLAMP))


# The per-row values a catalogue RowFormula of kind "row" names (besides ``row_mean:X`` = R_i[X]).
ROW_VALUES: dict[str, Callable[[RowStats], np.ndarray]] = {
    "abs_log_ppl_diff": _abs_log_ppl_diff,
    "chi2_seq_term": _chi2_seq_term,
}


def _row_value(name: str) -> Callable[[RowStats], np.ndarray]:
    if name.startswith("row_mean:"):
        column = name.removeprefix("row_mean:")
        return lambda rows: _row_mean(rows, column)
    return ROW_VALUES[name]


def row_metric(metric: catalogue.Metric) -> RowMetric:
    """The RowMetric its catalogue row's ``row`` formula states: a token mean of a per-row sum, or a mean over rows
    of a per-row value. Raises ValueError for a row without one."""
    formula = metric.row
    if formula is None:
        raise ValueError(f"{metric.key} has no row formula in the catalogue")
    if formula.kind == "token":
        column = formula.of
        return RowMetric(
            metric.key,
            lambda rows: rows.sums[column],
            lambda rows: rows.tokens,
            formula.eps,
            formula.offset,
            metric.row_meaning,
        )
    return RowMetric(metric.key, _row_value(formula.of), _ones, 0.0, formula.offset, metric.row_meaning)


# The metrics `diff` compares (and `check` can gate on even where analyze does not report them): the catalogue's
# rows with the role "bootstrapped", in its order.
KEY_METRICS: tuple[RowMetric, ...] = tuple(
    row_metric(metric) for metric in catalogue.with_role(catalogue.Role.BOOTSTRAPPED)
)
KEY_METRIC_NAMES = tuple(metric.name for metric in KEY_METRICS)


def rejected_share(preset: str) -> RowMetric:
    """Share of model tokens ``preset`` drops (summary/rejected_token_fraction) as a row metric."""
    return RowMetric(
        f"{catalogue.REJECTED_TOKEN_FRACTION.key}[{preset}]",
        lambda rows: rows.rejected[preset],
        lambda rows: rows.tokens,
        meaning=f"share of model tokens {preset} drops",
    )


def by_step(metric: RowMetric, rows: RowStats) -> dict[int, float]:
    """The metric of each step's rows (each step's rows in their order, found by one stable sort: a scan of every
    row per step made ``check --per-step`` quadratic in the step count).

    The per-row numerator and denominator are computed once over every row (they are elementwise); the steps of
    fewer than ``_SEQUENTIAL`` rows are summed together, one row position at a time from 0.0, which is the order
    ``ndarray.sum`` adds in below that size, so every value equals ``metric.value`` of the step's rows."""
    if rows.rows == 0:
        return {}
    order = np.argsort(rows.step, kind="stable")
    steps = rows.step[order]
    starts = np.flatnonzero(np.r_[True, steps[1:] != steps[:-1]])
    ends = np.r_[starts[1:], len(order)]
    numerator = metric.numerator(rows)[order]
    denominator = metric.denominator(rows)[order]
    tokens = rows.tokens[order]
    sizes = ends - starts
    owner = np.repeat(np.arange(len(starts)), sizes)  # each sorted row's step index
    place = np.arange(len(order)) - starts[owner]  # its position within its step
    small = sizes[owner] < _SEQUENTIAL
    count = len(starts)
    num, den, tok = (_sequential(values, owner, place, small, count) for values in (numerator, denominator, tokens))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        values = num / (den + metric.eps) + metric.offset
    values[tok == 0.0] = np.nan
    for index in np.flatnonzero(ends - starts >= _SEQUENTIAL).tolist():  # pairwise summation: as metric.value
        lo, hi = int(starts[index]), int(ends[index])
        if float(tokens[lo:hi].sum()) == 0.0:
            values[index] = np.nan
        else:
            values[index] = numerator[lo:hi].sum() / (denominator[lo:hi].sum() + metric.eps) + metric.offset
    return dict(zip(steps[starts].tolist(), values.tolist(), strict=True))


def _sequential(column: np.ndarray, owner: np.ndarray, place: np.ndarray, small: np.ndarray, count: int) -> np.ndarray:
    """Σ of ``column`` per step (``owner``), added position by position from 0.0 (the small steps only)."""
    grid = np.zeros((_SEQUENTIAL, count))
    grid[place[small], owner[small]] = column[small]
    total = np.zeros(count)
    for row in grid:
        total = total + row  # a trailing 0.0 leaves a sum as it is
    return total


# Below this many elements numpy's sum adds one after the other (its pairwise summation unrolls by 8 from there).
_SEQUENTIAL = 8
