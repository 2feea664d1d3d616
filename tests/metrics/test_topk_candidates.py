"""The top-K prefilter of the worst rows and the hint examples keeps every row a top-K list could take."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_diag.metrics.localize import TopK, top_candidates

SCORES = st.sampled_from([0.0, -0.0, 1.0, 2.5, -3.0, np.inf, -np.inf, np.nan]) | st.floats(-5, 5)


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(SCORES, max_size=40),
    k=st.integers(1, 8),
    threshold=st.sampled_from([-np.inf, 0.0, 1.0]),
    held=st.integers(0, 8),
)
def test_the_prefilter_changes_no_top_k(values, k, threshold, held):
    """A top-K offered the prefiltered rows keeps what it keeps when offered every eligible row (ties by location)."""
    scores = np.array(values, dtype=np.float64)
    rows = np.flatnonzero(scores >= threshold)
    kept = top_candidates(scores, rows, k)
    assert set(kept.tolist()) <= set(rows.tolist())
    locations = {row: (row % 3, f"s{row}", "f", row, -1) for row in rows.tolist()}
    full, narrowed = TopK(k), TopK(k)
    for tracker in (full, narrowed):  # a list that already holds some items
        tracker.offer([(float(i) - 2.0, (9, "x", "f", i, -1), None) for i in range(held)])

    def offered(candidates):
        ordered = sorted(candidates, key=lambda row: (-scores[row], locations[row]))[:k]
        return [(float(scores[row]), locations[row], row) for row in ordered]

    full.offer(offered(rows.tolist()))
    narrowed.offer(offered(kept.tolist()))
    assert full.items == narrowed.items
