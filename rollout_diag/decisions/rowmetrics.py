"""Key mismatch metrics as ratios of per-row sums, so that they can be recomputed on resampled rows.

Each metric is Σ_i w_i·num_i / (Σ_i w_i·den_i + eps) + offset over rows i with weights w (all ones for the
value itself, bootstrap counts for a replicate). With unit weights each one is the metric of METRICS.md that
``analyze`` reports under the same name (tests check it to 1e-12).
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


def _token(metric: catalogue.Metric, column: str, offset: float = 0.0, eps: float = EPS) -> RowMetric:
    """A token mean Σ S_i[column] / (N + eps) + offset, named and explained by its catalogue row."""
    return RowMetric(
        metric.key, lambda rows: rows.sums[column], lambda rows: rows.tokens, eps, offset, metric.row_meaning
    )


def _per_row(metric: catalogue.Metric, value: Callable[[RowStats], np.ndarray], offset: float = 0.0) -> RowMetric:
    """A mean over rows of ``value`` + offset, named and explained by its catalogue row."""
    return RowMetric(metric.key, value, _ones, 0.0, offset, metric.row_meaning)


def _log_ppl_abs_diff(rows: RowStats) -> np.ndarray:  # |d_i|, d_i = R_i[r] − R_i[a] (§1)
    return np.abs(_row_mean(rows, "rollout") - _row_mean(rows, "trainer"))


def _chi2_seq_term(rows: RowStats) -> np.ndarray:  # exp(2·clamp20(S_i[δ])) (§1)
    return np.exp(2.0 * np.clip(rows.sums["log_ratio"], -CLAMP, CLAMP))


# The metrics `diff` compares (and `check` can gate on even where analyze does not report them).
KEY_METRICS: tuple[RowMetric, ...] = (
    _token(catalogue.K3_KL, "k3"),
    _token(catalogue.CHI2_TOKEN, "chi2_term", offset=-1.0),
    _per_row(catalogue.CHI2_SEQ, _chi2_seq_term, offset=-1.0),
    _per_row(catalogue.LOG_PPL_ABS_DIFF, _log_ppl_abs_diff),
    _token(catalogue.LOGPROB_ABS_DIFF, "abs_log_ratio"),
    _per_row(catalogue.ROLLOUT_KL_ABS, lambda rows: _row_mean(rows, "abs_log_ratio")),
    _token(catalogue.PROBS_DIFF_MEAN, "prob_diff", eps=0.0),
    _token(catalogue.TOKEN_MULT_PROB_ERROR, "exp_abs_log_ratio"),
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
    """The metric of each step's rows."""
    return {int(step): metric.value(rows.select(rows.step == step)) for step in np.unique(rows.step)}
