"""Rollout-KL estimators as SkyRL's rollout KL loss aggregates them (METRICS.md §6, keys ``rollout_kl/…``)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from rollout_diag import catalogue
from rollout_diag.engine import arrays
from rollout_diag.engine.arrays import Array
from rollout_diag.engine.formulas import row_mean
from rollout_diag.engine.stats import stats
from rollout_diag.io.chunk import Chunk
from rollout_diag.metrics.base import Columns, KeyGroup, StepAccumulator

PREFIX = catalogue.ROLLOUT_KL_PREFIX
ESTIMATORS = ("k1", "abs", "k2", "k3")


# §6 estimators of x = a − r: k1 = x, abs = |x|, k2 = ½x², k3 = exp(−x) − 1 + x (token quantities, engine/quantities.py)
ESTIMATOR_TOKENS = {
    "k1": ("log_ratio", 1.0),
    "abs": ("abs_log_ratio", 1.0),
    "k2": ("square", 0.5),
    "k3": ("skyrl_k3", 1.0),
}


class RolloutKLAccumulator(StepAccumulator):
    """Σ_i R_i[estimator] and the row count: the value is the mean over rows of the row means."""

    REDUCTIONS: ClassVar[dict[str, str]] = {"rows": "sum", "tokens": "sum", **{name: "sum" for name in ESTIMATORS}}

    def _stats(self, chunk: Chunk) -> dict[str, Array]:
        s = stats(chunk)
        n = s.row_count
        out = {"rows": s.group_sum_rows(arrays.ones(chunk.rows, n)), "tokens": s.group_sum_rows(n)}
        for name, (token_name, scale) in ESTIMATOR_TOKENS.items():
            out[name] = s.group_sum_rows(row_mean(s.row_sum(token_name) * scale, n))
        return out

    def finalize_block(self, columns: Columns) -> list[KeyGroup]:
        """The family's metrics over a block of steps: its one formula (the run is a block of one, ``_finalize``)."""
        rows, tokens = columns["rows"], columns["tokens"]
        with np.errstate(divide="ignore", invalid="ignore"):
            return [((rows != 0) & (tokens != 0), {PREFIX + name: columns[name] / rows for name in ESTIMATORS})]
