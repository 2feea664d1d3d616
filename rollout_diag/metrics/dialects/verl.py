"""verl: today's output under verl's own names, plus the same row means over valid rows only.

Definitions: verl-project/verl (formerly volcengine/verl) ``verl/trainer/ppo/rollout_corr_helper.py``
(``compute_offpolicy_metrics``) and ``verl/utils/debug/metrics.py`` (``calculate_debug_metrics``), commit
1dda039b9c6311889a9c9a26040677e1254814f9 (2026-08-22, the newest the snapshot holds). Read first at b178a3c; between
the two neither function changed a number of a step with a model token (#5860 only returns NaN placeholders for a
batch without one, which has no dialect values). What did change in between are the ``rollout_is_*`` keys (#5722,
#6806): the presets compute them at 1dda039b9, ``verl@b178a3c`` (verl_b178a3c.py) as they were before.
verl averages per-row means over every row of the batch, and a row without model tokens enters with
R_i = 0 (ppl 1, d_i = 0): that dilutes the row means. ``<name>@valid_rows`` is the same formula over the
rows that have model tokens, so a user sees verl's digits and the undiluted value side by side.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from rollout_diag.engine import arrays
from rollout_diag.engine.arrays import Array
from rollout_diag.engine.stats import stats
from rollout_diag.io.chunk import Chunk
from rollout_diag.metrics.base import Columns, KeyGroup, StepAccumulator
from rollout_diag.metrics.debug import DebugAccumulator
from rollout_diag.metrics.dialects.base import DialectMetric, Framework, by_step, reductions, valid_extremes
from rollout_diag.metrics.offpolicy import ROW_VALUES, OffPolicyAccumulator, row_values
from rollout_diag.results import MetricColumns

VALID = "@valid_rows"


class ValidRowsAccumulator(StepAccumulator):
    """verl's row means (§1) summed over valid rows only (n_i > 0), with their count, max and min of d_i."""

    REDUCTIONS: ClassVar[dict[str, str]] = reductions(
        sum=("valid_rows", *ROW_VALUES), max=("log_ppl_diff_max",), min=("log_ppl_diff_min",)
    )

    def _stats(self, chunk: Chunk) -> dict[str, Array]:
        s = stats(chunk)
        valid = s.row_count > 0
        weight = arrays.float64(valid)
        per_row = row_values(s)  # exactly as OffPolicyAccumulator: R_i[a], R_i[r], d_i = R_i[r] − R_i[a], …
        out = {name: by_step(s, values * weight) for name, values in per_row.items()}
        out["valid_rows"] = by_step(s, weight)
        out["log_ppl_diff_max"], out["log_ppl_diff_min"] = valid_extremes(s, per_row["log_ppl_diff"], valid)
        return out

    def finalize_block(self, columns: Columns) -> list[KeyGroup]:
        """The family's metrics over a block of steps: its one formula (the run is a block of one, ``_finalize``)."""
        rows = columns["valid_rows"]
        with np.errstate(divide="ignore", invalid="ignore"):
            out = {f"rollout_corr/{name}{VALID}": columns[name] / rows for name in ROW_VALUES}
            out[f"rollout_corr/chi2_seq{VALID}"] = out[f"rollout_corr/chi2_seq{VALID}"] - 1.0
        out[f"rollout_corr/log_ppl_diff_max{VALID}"] = columns["log_ppl_diff_max"]
        out[f"rollout_corr/log_ppl_diff_min{VALID}"] = columns["log_ppl_diff_min"]
        return [(rows != 0, out)]


class VerlAccumulator:
    """verl's off-policy (§1) and debug (§5) metrics, exactly as ``analyze`` reports them, and the valid-row means:
    three accumulator families side by side, updated, merged and finalized together."""

    def __init__(self) -> None:
        self.families: tuple[StepAccumulator, ...] = (
            OffPolicyAccumulator(),
            DebugAccumulator(),
            ValidRowsAccumulator(),
        )

    def update(self, chunk: Chunk) -> None:
        for family in self.families:
            family.update(chunk)

    def merge(self, other: VerlAccumulator) -> None:
        for mine, theirs in zip(self.families, other.families, strict=True):
            mine.merge(theirs)

    def step_accumulators(self) -> tuple[StepAccumulator, ...]:
        return self.families

    def finalize_steps(self) -> dict[int, dict[str, float]]:
        out: dict[int, dict[str, float]] = {}
        for family in self.families:
            for step, values in family.finalize_steps().items():
                out.setdefault(step, {}).update(_verl_only(values))
        return {step: values for step, values in sorted(out.items()) if _has_tokens(values)}

    def finalize_columns(self, steps: np.ndarray) -> MetricColumns:
        """``finalize_steps`` as columns over ``steps`` (the same values and keys per step, no dict per step)."""
        groups = []
        for family in self.families:
            for present, values in family.finalize_columns(steps).groups:
                kept = {name: column for name, column in values.items() if _is_verl(name)}
                if kept:
                    groups.append((present, kept))
        has_tokens, _ = MetricColumns(groups, steps.shape[0]).column("rollout_corr/kl")
        return MetricColumns([(present & has_tokens, values) for present, values in groups], steps.shape[0])

    def finalize_run(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for family in self.families:
            out.update(_verl_only(family.finalize_run()))
        return out if _has_tokens(out) else {}


def _is_verl(name: str) -> bool:
    # mismatch/logprob_abs_diff is rollout-diag's own key (METRICS.md §7), not one verl logs
    return name.startswith(("rollout_corr/", "training/"))


def _verl_only(values: dict[str, float]) -> dict[str, float]:
    return {name: value for name, value in values.items() if _is_verl(name)}


def _has_tokens(values: dict[str, float]) -> bool:
    # a step with no model token has no §1 metrics; its §5 NaN placeholders alone are not a dialect value
    return "rollout_corr/kl" in values


def dilution(run: dict[str, float]) -> tuple[str, float, float] | None:
    """(metric, verl's value, valid-rows value) of the row mean the empty rows moved most, relatively."""
    moved = []
    for index, name in enumerate((*ROW_VALUES, "log_ppl_diff_max", "log_ppl_diff_min")):
        verl_value, valid_value = run.get(f"rollout_corr/{name}"), run.get(f"rollout_corr/{name}{VALID}")
        if verl_value is None or valid_value is None or not math.isfinite(verl_value - valid_value):
            continue
        scale = max(abs(valid_value), 1e-300)
        # the empty rows scale every plain row mean by the same factor: moves equal to 9 digits are a tie (rounding
        # would pick by chunking), won by the first metric in the list
        relative = float(f"{abs(verl_value - valid_value) / scale:.9g}")
        moved.append((relative, -index, name, verl_value, valid_value))
    if not moved:
        return None
    _, _, name, verl_value, valid_value = max(moved)
    return f"rollout_corr/{name}", verl_value, valid_value


_SOURCE = (
    "verl-project/verl (formerly volcengine/verl) `verl/trainer/ppo/rollout_corr_helper.py` "
    "(compute_offpolicy_metrics), `verl/utils/debug/metrics.py` (calculate_debug_metrics) "
    "@ 1dda039b9c6311889a9c9a26040677e1254814f9"
)
_ROWS = "mean over all B rows of the batch (empty rows enter with R_i = 0)"
_VALID_ROWS = "rollout-diag's correction: mean over the rows with n_i > 0 only"
_TOKENS = "token mean over the batch, Σ/(N + 1e-8)"


def _metrics() -> tuple[DialectMetric, ...]:
    row_formulas = {
        "training_ppl": ("trainer perplexity (row mean)", "exp(−R_i[a])"),
        "training_log_ppl": ("trainer log-perplexity (row mean)", "−R_i[a]"),
        "rollout_ppl": ("rollout perplexity (row mean)", "exp(−R_i[r])"),
        "rollout_log_ppl": ("rollout log-perplexity (row mean)", "−R_i[r]"),
        "log_ppl_diff": ("log-ppl diff d_i = R_i[r] − R_i[a] (row mean)", "d_i"),
        "log_ppl_abs_diff": ("|log-ppl diff| (row mean)", "|d_i|"),
        "ppl_ratio": ("ppl ratio exp(d_i) (row mean)", "exp(d_i)"),
        "chi2_seq": ("χ² of the sequence ratio", "exp(2·clamp20(S_i[δ])), minus 1 after the mean"),
    }
    out: list[DialectMetric] = []
    for name, (concept, formula) in row_formulas.items():
        out.append(DialectMetric(f"rollout_corr/{name}", concept, formula, _ROWS))
    out += [
        DialectMetric(
            "rollout_corr/log_ppl_diff_max", "log-ppl diff, max over rows", "max_i d_i", "max over all B rows"
        ),
        DialectMetric(
            "rollout_corr/log_ppl_diff_min", "log-ppl diff, min over rows", "min_i d_i", "min over all B rows"
        ),
        DialectMetric("rollout_corr/kl", "k1 KL r − a (token mean)", "r − a", _TOKENS),
        DialectMetric("rollout_corr/k3_kl", "k3 KL exp(δ) − δ − 1 (token mean)", "exp(δ) − δ − 1 (no clamp)", _TOKENS),
        DialectMetric("rollout_corr/chi2_token", "χ² of the token ratio", "exp(2·clamp20(δ)), minus 1", _TOKENS),
        DialectMetric(
            "training/rollout_probs_diff_max", "|p_a − p_r| max", "|exp(a) − exp(r)|", "max over masked tokens"
        ),
        DialectMetric(
            "training/rollout_probs_diff_mean", "|p_a − p_r| mean", "|exp(a) − exp(r)|", "mean over masked tokens"
        ),
        DialectMetric(
            "training/rollout_probs_diff_std",
            "|p_a − p_r| std",
            "|exp(a) − exp(r)|",
            "unbiased std over masked tokens",
        ),
        DialectMetric(
            "training/rollout_actor_probs_pearson_corr",
            "Pearson correlation of p_a and p_r",
            "corr(exp(a), exp(r))",
            "over masked tokens",
        ),
        DialectMetric("training/rollout_probs_diff_valid", "a masked token exists", "1 (0 without one)", "per batch"),
    ]
    for name, (concept, formula) in row_formulas.items():
        out.append(DialectMetric(f"rollout_corr/{name}{VALID}", concept, formula, _VALID_ROWS))
    out += [
        DialectMetric(f"rollout_corr/log_ppl_diff_max{VALID}", "log-ppl diff, max over rows", "max_i d_i", _VALID_ROWS),
        DialectMetric(f"rollout_corr/log_ppl_diff_min{VALID}", "log-ppl diff, min over rows", "min_i d_i", _VALID_ROWS),
    ]
    return tuple(out)


FRAMEWORK = Framework(
    name="verl",
    title="verl",
    source=_SOURCE,
    config=(
        "always computed (rollout-correction metrics and debug metrics). The same numbers as at b178a3c (2026-01-29); "
        "the `rollout_corr/rollout_is_*` keys, which #5722 (2026-03-24) redefined without renaming, are the "
        "presets' (`compare-presets`, verl @ 1dda039b9) and, with their meaning before #5722, `verl@b178a3c`'s"
    ),
    offline="none: the metrics are batch-level already. `@valid_rows` names are rollout-diag's, not verl's.",
    metrics=_metrics(),
    accumulator=VerlAccumulator,
)
