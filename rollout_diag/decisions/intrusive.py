"""The intrusive rule: when a rollout-correction preset throws away too much of the training signal.

The only place the rule lives (its two thresholds are catalogue rows, so that results.py can name them without
importing a judgement): compare-presets marks presets with it, the terminal table, the report, the glossary and the
recommendation read it from here. Pure: run metrics in, reasons out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from rollout_diag import catalogue
from rollout_diag.catalogue import INTRUSIVE_MIN_ESS, INTRUSIVE_REJECTED_FRACTION

# Where each number is read: summary/ covers every family; rollout_corr/ is verl's helper (§2), mismatch/ §8.
REJECTED_KEY = catalogue.REJECTED_TOKEN_FRACTION.key
ESS_KEYS = (catalogue.IS_EFF_SAMPLE_SIZE.key, catalogue.legacy_twin(catalogue.IS_EFF_SAMPLE_SIZE).key)


def intrusive_reasons(
    metrics: Mapping[str, float],
    rejected_fraction: float = INTRUSIVE_REJECTED_FRACTION,
    min_ess: float = INTRUSIVE_MIN_ESS,
) -> tuple[str, ...]:
    """Why a preset's run metrics make it intrusive: too many tokens dropped, or too low an ESS (empty: it is not)."""
    reasons = []
    dropped = metrics.get(REJECTED_KEY)
    if dropped is not None and dropped > rejected_fraction:
        reasons.append(f"drops {dropped:.1%} of model tokens (> {rejected_fraction:.0%})")
    for key in ESS_KEYS:
        ess = metrics.get(key)
        if ess is not None and not math.isnan(ess) and ess < min_ess:
            reasons.append(f"IS effective sample size {ess:.3g} (< {min_ess:g})")
    return tuple(reasons)
