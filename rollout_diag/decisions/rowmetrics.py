"""Key mismatch metrics as ratios of per-row sums, so that they can be recomputed on resampled rows.

Each metric is Σ_i w_i·num_i / (Σ_i w_i·den_i + eps) + offset over rows i with weights w (all ones for the
value itself, bootstrap counts for a replicate). Which metrics, and each one's formula over the rows, are stated
once in the metric's catalogue row (role ``bootstrapped``, ``row=RowFormula``); this module only evaluates them.
With unit weights each one is the metric of METRICS.md that ``analyze`` reports under the same name (tests check
it to 1e-12).
"""

from __future__ import annotations

import itertools
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
    row per step made ``check --per-step`` quadratic in the step count)."""
    if rows.rows == 0:
        return {}
    order = np.argsort(rows.step, kind="stable")
    steps = rows.step[order]
    bounds = [*np.flatnonzero(np.r_[True, steps[1:] != steps[:-1]]).tolist(), len(order)]
    return {int(steps[lo]): metric.value(rows.select(order[lo:hi])) for lo, hi in itertools.pairwise(bounds)}
