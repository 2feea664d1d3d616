"""Off-policy metrics (METRICS.md §1, keys ``rollout_corr/…``) and ``mismatch/logprob_abs_diff`` (§7)."""

from __future__ import annotations

from typing import ClassVar

import torch

from rollout_diag.io.chunk import Chunk
from rollout_diag.metrics.base import (
    EPS,
    State,
    StepAccumulator,
    as_float,
    clamp20,
    row_mean,
    segment_max,
    segment_min,
    segment_sum,
)

PREFIX = "rollout_corr/"


class OffPolicyAccumulator(StepAccumulator):
    """Sums over rows of row-level values and over tokens of token-level values, per step."""

    REDUCTIONS: ClassVar[dict[str, str]] = {
        "rows": "sum",
        "empty_rows": "sum",
        "tokens": "sum",
        "training_ppl": "sum",  # Σ_i exp(−R_i[a])
        "training_log_ppl": "sum",  # Σ_i −R_i[a]
        "rollout_ppl": "sum",
        "rollout_log_ppl": "sum",
        "kl": "sum",  # Σ m·(r − a)
        "k3_kl": "sum",  # Σ m·(exp δ − δ − 1)
        "log_ppl_diff": "sum",  # Σ_i d_i
        "log_ppl_abs_diff": "sum",  # Σ_i |d_i|
        "log_ppl_diff_max": "max",
        "log_ppl_diff_min": "min",
        "ppl_ratio": "sum",  # Σ_i exp(d_i)
        "chi2_token": "sum",  # Σ m·exp(2·clamp20(δ))
        "chi2_seq": "sum",  # Σ_i exp(2·clamp20(S_i[δ]))
        "abs_diff": "sum",  # Σ m·|δ|
    }

    def _stats(self, chunk: Chunk) -> dict[str, torch.Tensor]:
        model = chunk.model
        groups = chunk.groups
        rows, count = chunk.rows, groups.count
        row_group = groups.row_group
        token_group = row_group[model.row]
        n = chunk.tokens_per_row
        delta = model.log_ratio

        def per_row(values: torch.Tensor) -> torch.Tensor:
            return segment_sum(values, model.row, rows)

        mean_trainer = row_mean(per_row(model.trainer), n)  # §1 R_i[a]
        mean_rollout = row_mean(per_row(model.rollout), n)  # §1 R_i[r]
        log_ppl_diff = mean_rollout - mean_trainer  # §1 d_i = R_i[r] − R_i[a], as verl subtracts
        seq_log_ratio = per_row(delta)  # §1 S_i[δ]

        def by_step(values: torch.Tensor) -> torch.Tensor:
            return segment_sum(values, row_group, count)

        def by_step_tokens(values: torch.Tensor) -> torch.Tensor:
            return segment_sum(values, token_group, count)

        return {
            "rows": by_step(torch.ones(rows, dtype=torch.float64, device=chunk.device)),
            "empty_rows": by_step((n == 0).to(torch.float64)),
            "tokens": by_step(n.to(torch.float64)),
            "training_ppl": by_step(torch.exp(-mean_trainer)),
            "training_log_ppl": by_step(-mean_trainer),
            "rollout_ppl": by_step(torch.exp(-mean_rollout)),
            "rollout_log_ppl": by_step(-mean_rollout),
            "kl": by_step_tokens(model.rollout - model.trainer),
            "k3_kl": by_step_tokens(torch.expm1(delta) - delta),
            "log_ppl_diff": by_step(log_ppl_diff),
            "log_ppl_abs_diff": by_step(log_ppl_diff.abs()),
            "log_ppl_diff_max": segment_max(log_ppl_diff, row_group, count),
            "log_ppl_diff_min": segment_min(log_ppl_diff, row_group, count),
            "ppl_ratio": by_step(torch.exp(log_ppl_diff)),
            "chi2_token": by_step_tokens(torch.exp(2.0 * clamp20(delta))),
            "chi2_seq": by_step(torch.exp(2.0 * clamp20(seq_log_ratio))),
            "abs_diff": by_step_tokens(delta.abs()),
        }

    def _finalize(self, state: State) -> dict[str, float]:
        value = {name: as_float(array) for name, array in state.items()}
        rows, tokens = value["rows"], value["tokens"]
        if tokens == 0 or rows == 0:
            return {}  # METRICS.md §1: a step with N = 0 has no metrics

        def token_mean(name: str) -> float:  # T[x] = Σ m·x / (N + 1e-8)
            return value[name] / (tokens + EPS)

        def row_average(name: str) -> float:  # mean_i over all B rows
            return value[name] / rows

        metrics = {
            "training_ppl": row_average("training_ppl"),
            "training_log_ppl": row_average("training_log_ppl"),
            "rollout_ppl": row_average("rollout_ppl"),
            "rollout_log_ppl": row_average("rollout_log_ppl"),
            "kl": token_mean("kl"),
            "k3_kl": token_mean("k3_kl"),
            "log_ppl_diff": row_average("log_ppl_diff"),
            "log_ppl_abs_diff": row_average("log_ppl_abs_diff"),
            "log_ppl_diff_max": value["log_ppl_diff_max"],
            "log_ppl_diff_min": value["log_ppl_diff_min"],
            "ppl_ratio": row_average("ppl_ratio"),
            "chi2_token": token_mean("chi2_token") - 1.0,
            "chi2_seq": row_average("chi2_seq") - 1.0,
        }
        out = {PREFIX + name: float(v) for name, v in metrics.items()}
        out["mismatch/logprob_abs_diff"] = token_mean("abs_diff")  # §7, last line
        return out
