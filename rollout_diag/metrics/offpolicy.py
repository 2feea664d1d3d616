"""Off-policy metrics (METRICS.md §1, keys ``rollout_corr/…``), ``mismatch/logprob_abs_diff`` (§7), and the exact token
counts by |δ| read beside them: bitwise-differing tokens and max |δ| (``diag/…``), extreme-token shares and tolerance
bands (``mismatch/extreme_frac_…``, ``mismatch/band_…``)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from rollout_diag import catalogue
from rollout_diag.catalogue import EPS
from rollout_diag.engine import arrays
from rollout_diag.engine.arrays import Array, segment_max, segment_min
from rollout_diag.engine.formulas import clamp20, row_mean
from rollout_diag.engine.quantities import BANDS, COUNTS
from rollout_diag.engine.stats import ChunkStats, stats
from rollout_diag.io.chunk import Chunk, StepGroups
from rollout_diag.metrics.base import Columns, KeyGroup, StepAccumulator

PREFIX = catalogue.OFFPOLICY_PREFIX


# the keys of a step, in the order _finalize gives them
METRIC_ORDER = (
    "training_ppl",
    "training_log_ppl",
    "rollout_ppl",
    "rollout_log_ppl",
    "kl",
    "k3_kl",
    "log_ppl_diff",
    "log_ppl_abs_diff",
    "log_ppl_diff_max",
    "log_ppl_diff_min",
    "ppl_ratio",
    "chi2_token",
    "chi2_seq",
)
ROW_AVERAGES = (
    "training_ppl",
    "training_log_ppl",
    "rollout_ppl",
    "rollout_log_ppl",
    "log_ppl_diff",
    "log_ppl_abs_diff",
    "ppl_ratio",
)
ROW_VALUES = (*ROW_AVERAGES, "chi2_seq")  # the per-row values ``row_values`` gives (chi2_seq = mean_i of its − 1)


class OffPolicyAccumulator(StepAccumulator):
    """Sums over rows of row-level values and over tokens of token-level values, per step."""

    CHUNK_ONLY: ClassVar[bool] = True
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
        # exact counts of model tokens (engine/quantities.py COUNTS): bits differ, |δ| > ln 2 / ln 5, |δ| ≤ each band
        **{name: "sum" for name in COUNTS},
        **{f"rows_{name}": "sum" for name in COUNTS[3:]},  # valid rows whose every model token has |δ| ≤ the band
        "max_abs_delta": "max",  # max m·|δ|
    }

    def _stats(self, chunk: Chunk) -> dict[str, Array]:
        s = stats(chunk)
        groups = chunk.groups
        n = s.row_count
        per_row = row_values(s)
        log_ppl_diff = per_row["log_ppl_diff"]
        by_step = s.group_sum_rows
        return {
            "rows": by_step(arrays.ones(chunk.rows, n)),
            "empty_rows": by_step(arrays.float64(n == 0)),
            "tokens": by_step(n),
            **{name: by_step(values) for name, values in per_row.items()},  # Σ_i of each row average, Σ_i chi2_seq's
            "kl": -s.group_sum("log_ratio"),  # Σ m·(r − a); fl(r − a) = −fl(a − r) exactly
            "k3_kl": s.group_sum("k3"),
            "log_ppl_diff_max": segment_max(log_ppl_diff, groups.row_group, groups.count),
            "log_ppl_diff_min": segment_min(log_ppl_diff, groups.row_group, groups.count),
            "chi2_token": s.group_sum("chi2_term"),
            "abs_diff": s.group_sum("abs_log_ratio"),
            **s.count_sums(COUNTS),
            **_rows_within(s, groups, n),
            "max_abs_delta": s.group_max("abs_log_ratio"),
        }

    def finalize_block(self, columns: Columns) -> list[KeyGroup]:
        """The family's metrics over a block of steps: its one formula (the run is a block of one, ``_finalize``)."""
        rows, tokens = columns["rows"], columns["tokens"]
        reports = (tokens != 0) & (rows != 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            metrics = {
                **{name: columns[name] / rows for name in ROW_AVERAGES},
                "kl": columns["kl"] / (tokens + EPS),
                "k3_kl": columns["k3_kl"] / (tokens + EPS),
                "log_ppl_diff_max": columns["log_ppl_diff_max"],
                "log_ppl_diff_min": columns["log_ppl_diff_min"],
                "chi2_token": columns["chi2_token"] / (tokens + EPS) - 1.0,
                "chi2_seq": columns["chi2_seq"] / rows - 1.0,
            }
            out = {PREFIX + name: metrics[name] for name in METRIC_ORDER}
            out[catalogue.LOGPROB_ABS_DIFF.key] = columns["abs_diff"] / (tokens + EPS)
        return [(reports, out), (tokens != 0, exact_counts(columns))]


def row_values(s: ChunkStats) -> dict[str, Array]:
    """Each row's §1 value of every row average (``ROW_AVERAGES``) and of chi2_seq's term, in the order
    ``ROW_VALUES`` names them: the one formula this family and verl's valid-row means (``dialects/verl.py``) sum."""
    mean_trainer, mean_rollout = row_means(s)
    log_ppl_diff = mean_rollout - mean_trainer  # §1 d_i = R_i[r] − R_i[a], as verl subtracts
    return {
        "training_ppl": arrays.exp(-mean_trainer),
        "training_log_ppl": -mean_trainer,
        "rollout_ppl": arrays.exp(-mean_rollout),
        "rollout_log_ppl": -mean_rollout,
        "log_ppl_diff": log_ppl_diff,
        "log_ppl_abs_diff": abs(log_ppl_diff),
        "ppl_ratio": arrays.exp(log_ppl_diff),
        "chi2_seq": arrays.exp(2.0 * clamp20(s.row_sum("log_ratio"))),  # exp(2·clamp20(S_i[δ]))
    }


def row_means(s: ChunkStats) -> tuple[Array, Array]:
    """§1 (R_i[a], R_i[r]): each row's mean trainer and rollout logprob over its model tokens (0 for an empty row)."""
    n = s.row_count
    return row_mean(s.row_sum("trainer"), n), row_mean(s.row_sum("rollout"), n)


def log_ppl_diff(s: ChunkStats) -> Array:
    """§1 d_i = R_i[r] − R_i[a] of each row, as verl subtracts: the worst rows, the prompts' row scores and the trainer
    columns' association rank rows by |d_i|."""
    mean_trainer, mean_rollout = row_means(s)
    return mean_rollout - mean_trainer


def _rows_within(s: ChunkStats, groups: StepGroups, n: Array) -> dict[str, Array]:
    """Per step group, the valid rows whose largest |δ| is at most each band (``rows_within_<ε>``)."""
    row_max = s.row_max("abs_log_ratio")  # from the segment maxima; −inf for an empty row
    valid = n > 0
    return {f"rows_{name}": s.group_sum_rows(arrays.float64(valid & (row_max <= band))) for name, band in _BANDS}


_BANDS = tuple(zip(COUNTS[3:], BANDS, strict=True))


def exact_counts(columns: Columns) -> dict[str, np.ndarray]:
    """The counts by |δ| as shares over a block of steps (steps with model tokens): bitwise-differing tokens, their
    share and max |δ|; the shares above ln 2 and ln 5; per band ε the shares of model tokens with |δ| ≤ ε and of valid
    rows whose every model token has it. The rounds' and groups' blocks give the same keys from the same sums."""
    tokens = columns["tokens"]
    valid_rows = columns["rows"] - columns["empty_rows"]
    with np.errstate(divide="ignore", invalid="ignore"):
        out = {
            catalogue.EXTREME_FRAC_LN2.key: columns["above_ln2"] / tokens,
            catalogue.EXTREME_FRAC_LN5.key: columns["above_ln5"] / tokens,
        }
        for (name, _), key in zip(_BANDS, catalogue.BAND_TOKEN_SHARES, strict=True):
            out[key.key] = columns[name] / tokens
        for (name, _), key in zip(_BANDS, catalogue.BAND_SEQ_SHARES, strict=True):
            out[key.key] = columns[f"rows_{name}"] / valid_rows
        out[catalogue.MISMATCHED_TOKENS.key] = columns["mismatched"]
        out[catalogue.MISMATCHED_TOKEN_SHARE.key] = columns["mismatched"] / tokens
        out[catalogue.MAX_ABS_DELTA.key] = columns["max_abs_delta"]
    return out
