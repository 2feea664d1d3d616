"""What the bootstrap intervals share (``diff``'s A against B, ``drift``'s early against late window): their defaults
and the percentile interval of replicated differences. Light on purpose: ``analyze`` judges drift without loading
``diff``."""

from __future__ import annotations

import math

import numpy as np

DEFAULT_REPLICATES = 1000
DEFAULT_LEVEL = 0.95
DEFAULT_SEED = 0


def tail_interval(replicates: np.ndarray, tail: float) -> tuple[float, float]:
    """The bootstrap interval of one metric's replicated differences: the ``tail`` and 1 − ``tail`` quantiles of
    the finite replicates (NaN, NaN when none is finite)."""
    finite = replicates[np.isfinite(replicates)]
    if not finite.size:
        return math.nan, math.nan
    return float(np.quantile(finite, tail)), float(np.quantile(finite, 1.0 - tail))
