"""The intrusive rule: when a rollout-correction preset throws away too much of the training signal.

The only place the thresholds live: compare-presets marks presets with it, the terminal table, the report, the
glossary and the recommendation read it from here. Pure: run metrics in, reasons out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from rollout_diag import catalogue

# A preset is "intrusive" (highlighted) when, over the run, it would drop more than this share of model
# tokens (RS rejection, IcePop zero weights, legacy mask/veto) ...
INTRUSIVE_REJECTED_FRACTION = 0.10
# ... or its IS weights leave an effective sample size (rollout_is_eff_sample_size) below this.
INTRUSIVE_MIN_ESS = 0.5
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
