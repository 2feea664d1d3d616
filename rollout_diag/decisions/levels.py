"""ok / watch / bad for the key mismatch metrics. Thresholds are judgement, stated in the metric catalogue
(``rollout_diag/catalogue.py``) and documented in docs/metrics.md.

They are set from what healthy bf16-rollout / fp32-trainer pairs show (the bundled real dump: k3_kl
≈ 4e-4, chi2_token ≈ 1e-3) and from where verl's own rejection defaults start to bite (seq_mean_k3 ≤
0.01): *watch* means "look at the per-step table", *bad* means "expect the run to be off-policy enough to
matter; turn on a correction (see compare-presets)".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rollout_diag import catalogue
from rollout_diag.results import Verdict


@dataclass(frozen=True)
class Rule:
    metric: str
    watch: float
    bad: float
    meaning: str

    @classmethod
    def of(cls, metric: catalogue.Metric) -> Rule:
        """The rule a catalogue row's thresholds state."""
        if metric.verdict is None:
            raise ValueError(f"{metric.key} has no verdict thresholds in the catalogue")
        return cls(metric.key, metric.verdict.watch, metric.verdict.bad, metric.verdict.measures)


# The metrics judged (catalogue role "judged"), in the order analyze, the report and JSON list their verdicts.
JUDGED: tuple[catalogue.Metric, ...] = catalogue.with_role(catalogue.Role.JUDGED)
RULES: tuple[Rule, ...] = tuple(Rule.of(metric) for metric in JUDGED)


def rule_of(metric: str) -> tuple[Rule, ...]:
    """The rules judging ``metric`` (one, or none for a metric without a verdict): to judge one metric per step."""
    return tuple(rule for rule in RULES if rule.metric == metric)


def judge(metrics: dict[str, float], rules: tuple[Rule, ...] = RULES) -> list[Verdict]:
    """One Verdict per rule: ``bad`` at or above ``bad``, ``watch`` at or above ``watch``, else ``ok``. The judged
    metrics are never negative but for χ²'s sample estimates, which a negative value puts below their expectation
    (≈ 0): a negative value is ok, never large."""
    verdicts = []
    for rule in rules:
        value = metrics.get(rule.metric)
        if value is None or math.isnan(value):
            level = "n/a"
        elif value >= rule.bad:
            level = "bad"
        elif value >= rule.watch:
            level = "watch"
        else:
            level = "ok"
        verdicts.append(Verdict(rule.metric, value, level, rule.watch, rule.bad, rule.meaning))
    return verdicts
