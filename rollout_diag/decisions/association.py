"""Which relations of row mismatch to the trainer's own columns stand out (``AnalysisResult.trainer_columns``).

- **A rank correlation** stands out when at least ``MIN_ROWS`` sampled rows carry the column, its 95 % interval
  excludes 0, and |ρ| ≥ ``MIN_RHO``. The floor on |ρ| matters on large dumps: over 50 000 rows an interval excludes 0
  from |ρ| ≈ 0.01, a relation too weak to act on; at |ρ| = 0.2 the column's rank explains 4 % of the rank variance
  of the mismatch, where "the high-reward rows diverge more" starts to be worth a look.
- **The group rule** stands out when at least ``MIN_GROUPS`` groups count, the worst row is the group's best in at
  least ``MIN_FACTOR`` × the count expected by chance, and that count has a chance of at most ``MAX_P`` (the
  Poisson-binomial tail, one-sided: only "more often than chance" is a finding: then importance-sampling truncation
  or rejection, which acts on the worst rows, cuts exactly the samples GRPO pushes up).
"""

from __future__ import annotations

import math

from rollout_diag.results import ColumnAssociation, GroupWorstRows, TrainerColumns

MIN_ROWS = 30
MIN_RHO = 0.2
MIN_GROUPS = 10
MIN_FACTOR = 1.5
MAX_P = 0.01


def correlation_stands_out(item: ColumnAssociation) -> bool:
    """At least MIN_ROWS rows, a 95 % interval that excludes 0 and |ρ| ≥ MIN_RHO."""
    if item.rows < MIN_ROWS or not all(math.isfinite(v) for v in (item.spearman, item.ci_low, item.ci_high)):
        return False
    return (item.ci_low > 0 or item.ci_high < 0) and abs(item.spearman) >= MIN_RHO


def group_rule_stands_out(groups: GroupWorstRows | None) -> bool:
    """At least MIN_GROUPS groups, MIN_FACTOR × the chance count or more, a one-sided chance of at most MAX_P."""
    if groups is None or groups.overflow or groups.groups < MIN_GROUPS or not math.isfinite(groups.p_value):
        return False
    return groups.worst_is_best >= MIN_FACTOR * groups.expected and groups.p_value <= MAX_P


def judge_trainer_columns(found: TrainerColumns | None) -> TrainerColumns | None:
    """``found`` with each correlation's and the group rule's ``significant`` set."""
    if found is None:
        return None
    return found.judged(
        [correlation_stands_out(item) for item in found.correlations], group_rule_stands_out(found.groups)
    )
