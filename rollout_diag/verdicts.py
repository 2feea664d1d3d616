"""ok / watch / bad for the key mismatch metrics. Thresholds are judgement, documented in docs/metrics.md.

They are set from what healthy bf16-rollout / fp32-trainer pairs show (the bundled real dump: k3_kl
≈ 4e-4, chi2_token ≈ 1e-3) and from where verl's own rejection defaults start to bite (seq_mean_k3 ≤
0.01): *watch* means "look at the per-step table", *bad* means "expect the run to be off-policy enough to
matter; turn on a correction (see compare-presets)".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rollout_diag.results import Verdict


@dataclass(frozen=True)
class Rule:
    metric: str
    watch: float
    bad: float
    meaning: str


RULES: tuple[Rule, ...] = (
    Rule("rollout_corr/k3_kl", 1e-3, 1e-2, "token-level KL(rollout‖trainer), k3 estimator"),
    Rule("rollout_corr/chi2_token", 1e-2, 1e-1, "variance of token IS weights ρ = π_train/π_rollout"),
    Rule("rollout_corr/chi2_seq", 0.5, 2.0, "variance of sequence IS weights (grows with length)"),
    Rule("rollout_corr/log_ppl_abs_diff", 1e-2, 5e-2, "per-sequence |log-ppl gap| between the two stacks"),
    Rule("training/rollout_probs_diff_mean", 1e-2, 5e-2, "mean |p_train − p_rollout| per token"),
    Rule("mismatch/logprob_abs_diff", 5e-2, 2e-1, "mean |log p_train − log p_rollout| per token"),
)


def judge(metrics: dict[str, float], rules: tuple[Rule, ...] = RULES) -> list[Verdict]:
    """One Verdict per rule: ``bad`` at or above ``bad``, ``watch`` at or above ``watch``, else ``ok``."""
    verdicts = []
    for rule in rules:
        value = metrics.get(rule.metric)
        if value is None or math.isnan(value):
            level = "n/a"
        elif abs(value) >= rule.bad:
            level = "bad"
        elif abs(value) >= rule.watch:
            level = "watch"
        else:
            level = "ok"
        verdicts.append(Verdict(rule.metric, value, level, rule.watch, rule.bad, rule.meaning))
    return verdicts
