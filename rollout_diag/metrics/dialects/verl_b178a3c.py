"""verl as it was at b178a3c, before #5722 (IcePop, 2026-03-24) changed what ``rollout_corr/rollout_is_*`` mean without
renaming them: ``--dialect verl@b178a3c`` (token-level TIS at 2.0) and ``verl@b178a3c:seq`` (sequence level at 2.0),
so that a run analysed today can be read beside a W&B curve logged by verl before March 2026.

Definitions: volcengine/verl ``verl/trainer/ppo/rollout_corr_helper.py`` at commit
b178a3cd56f58b2d502255daba591e92833930a7 (``compute_rollout_correction_weights``, ``compute_is_metrics``):
w_raw = exp(clamp20(δ))·m (token) or exp(clamp20(S_i[δ]))·m (sequence), and every metric is taken on w_raw,
*before* truncation (``metrics = compute_is_metrics(rollout_is_weights, …)`` precedes ``clamp(max=threshold)``):
- rollout_is_mean = T[w_raw]; token level: max / min of w_raw over masked tokens, fractions T[w_raw > U] /
  T[w_raw < 1/U]; sequence level: exp(min(max_i s_i, 20)) / exp(min_i s_i), fractions over the rows
  [s_i > log U] / [s_i < log(1/U)] (as today);
- rollout_is_std / _eff_sample_size on c = clamp(w_raw, 1/U, U) (today: clamp(w, 0, U) of the truncated w);
- rollout_is_seq_* on q_i = R_i[w_raw] over all rows (today on the truncated weights, the fractions on the raw
  ones since #6806).
What #5722 changed, so that a curve before and after cannot be compared: token-level mean / max / min are now
post-truncation (max ≤ U, mean lower by the clipped mass), std and ESS clamp at 0 instead of 1/U, and the seq_*
statistics describe the truncated weights. verl's other keys (``compute_offpolicy_metrics``,
``calculate_debug_metrics``) compute the same numbers at b178a3c and at 1dda039b9 for a step with a model token.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from rollout_diag.engine import arrays
from rollout_diag.engine.arrays import Array, segment_moments
from rollout_diag.engine.formulas import clamp20
from rollout_diag.engine.stats import stats
from rollout_diag.io.chunk import Chunk
from rollout_diag.metrics.base import State, StepAccumulator, as_float
from rollout_diag.metrics.dialects import verl
from rollout_diag.metrics.dialects.base import DialectMetric, Framework, by_step, reductions, token_group

COMMIT = "b178a3cd56f58b2d502255daba591e92833930a7"
EPS = 1e-8  # verl_F.masked_mean's guard
PREFIX = "rollout_corr/"
NAMES = (
    "rollout_is_mean",
    "rollout_is_max",
    "rollout_is_min",
    "rollout_is_ratio_fraction_high",
    "rollout_is_ratio_fraction_low",
    "rollout_is_std",
    "rollout_is_eff_sample_size",
    "rollout_is_seq_mean",
    "rollout_is_seq_std",
    "rollout_is_seq_max",
    "rollout_is_seq_min",
    "rollout_is_seq_max_deviation",
    "rollout_is_seq_fraction_high",
    "rollout_is_seq_fraction_low",
)


class OldISAccumulator(StepAccumulator):
    """b178a3c's ``compute_is_metrics`` over one step (one verl batch), from w_raw."""

    LEVEL: ClassVar[str] = "token"
    THRESHOLD: ClassVar[float] = 2.0  # rollout_is_threshold: verl's default, and every b178a3c preset's
    REDUCTIONS: ClassVar[dict[str, str]] = reductions(
        sum=("tokens", "rows", "weight_sum", "high", "low", "seq_high", "seq_low"),
        moments=("clamped", "seq_weight"),
        max=("extreme_max", "seq_weight_max", "seq_deviation_max"),
        min=("extreme_min", "seq_weight_min"),
    )

    def _stats(self, chunk: Chunk) -> dict[str, Array]:
        s = stats(chunk)
        groups = chunk.groups
        upper, lower = self.THRESHOLD, 1.0 / self.THRESHOLD
        n = s.row_count
        row = chunk.model.row
        if self.LEVEL == "token":
            raw = arrays.exp(clamp20(s.token("log_ratio")))
            group = token_group(s)
            extreme_max = arrays.segment_max(raw, group, groups.count)
            extreme_min = arrays.segment_min(raw, group, groups.count)
            high = arrays.segment_sum(arrays.float64(raw > upper), group, groups.count)
            low = arrays.segment_sum(arrays.float64(raw < lower), group, groups.count)
        else:
            log_sum = s.row_sum("log_ratio")  # s_i over every row (0 for an empty row, which verl keeps)
            raw = arrays.exp(clamp20(log_sum))[row]
            extreme_max = by_step(s, log_sum, "max")
            extreme_min = by_step(s, log_sum, "min")
            high = by_step(s, arrays.float64(log_sum > math.log(upper)))
            low = by_step(s, arrays.float64(log_sum < math.log(lower)))
        clamped = arrays.clamp(raw, lower=lower, upper=upper)
        seq_weight = arrays.segment_sum(raw, row, chunk.rows) / (n + EPS)  # q_i = R_i[w_raw], 0 for an empty row
        zeros = arrays.zeros(arrays.size(clamped), clamped)
        row_zeros = arrays.zeros(arrays.size(seq_weight), seq_weight)
        return {
            "tokens": by_step(s, n),
            "rows": by_step(s, arrays.ones(chunk.rows, n)),
            "weight_sum": arrays.segment_sum(raw, token_group(s), groups.count),
            "extreme_max": extreme_max,
            "extreme_min": extreme_min,
            "high": high,
            "low": low,
            "clamped": segment_moments(clamped, zeros, token_group(s), groups.count),
            "seq_weight": segment_moments(seq_weight, row_zeros, groups.row_group, groups.count),
            "seq_weight_max": by_step(s, seq_weight, "max"),
            "seq_weight_min": by_step(s, seq_weight, "min"),
            "seq_deviation_max": by_step(s, abs(seq_weight - 1.0), "max"),
            "seq_high": by_step(s, arrays.float64(seq_weight > upper)),
            "seq_low": by_step(s, arrays.float64(seq_weight < lower)),
        }

    def _finalize(self, state: State) -> dict[str, float]:
        # the correction families' module (and the sweep's it imports) only where this dialect is asked for: analyze
        # imports this module with every dialect, and reads it only with --dialect verl@b178a3c
        from rollout_diag.metrics.correction import effective_sample_sizes, population_stds, sample_stds

        tokens, rows = as_float(state["tokens"]), as_float(state["rows"])
        if tokens == 0:
            return {}  # verl raises on a batch without a masked token; the dialect reports nothing
        clamped = np.asarray(state["clamped"], dtype=np.float64)
        seq = np.asarray(state["seq_weight"], dtype=np.float64)
        if self.LEVEL == "token":
            is_max, is_min = as_float(state["extreme_max"]), as_float(state["extreme_min"])
            fraction_base = tokens + EPS
        else:
            is_max = math.exp(min(as_float(state["extreme_max"]), 20.0))
            is_min = math.exp(as_float(state["extreme_min"]))
            fraction_base = rows
        values = {
            "rollout_is_mean": as_float(state["weight_sum"]) / (tokens + EPS),
            "rollout_is_max": is_max,
            "rollout_is_min": is_min,
            "rollout_is_ratio_fraction_high": as_float(state["high"]) / fraction_base,
            "rollout_is_ratio_fraction_low": as_float(state["low"]) / fraction_base,
            "rollout_is_std": float(population_stds(clamped[None])[0]),
            "rollout_is_eff_sample_size": float(effective_sample_sizes(clamped[None])[0]),
            "rollout_is_seq_mean": float(seq[1]),
            "rollout_is_seq_std": float(sample_stds(seq[None])[0]),
            "rollout_is_seq_max": as_float(state["seq_weight_max"]),
            "rollout_is_seq_min": as_float(state["seq_weight_min"]),
            "rollout_is_seq_max_deviation": as_float(state["seq_deviation_max"]),
            "rollout_is_seq_fraction_high": as_float(state["seq_high"]) / rows,
            "rollout_is_seq_fraction_low": as_float(state["seq_low"]) / rows,
        }
        return {PREFIX + name: value for name, value in values.items()}


class OldSequenceISAccumulator(OldISAccumulator):
    LEVEL: ClassVar[str] = "sequence"


class VerlB178a3cAccumulator(verl.VerlAccumulator):
    """verl's dialect (the same off-policy, debug and valid-row families) and b178a3c's IS weight metrics."""

    IS: ClassVar[type[OldISAccumulator]] = OldISAccumulator

    def __init__(self) -> None:
        super().__init__()
        self.families = (*self.families, self.IS())


class VerlB178a3cSequenceAccumulator(VerlB178a3cAccumulator):
    IS: ClassVar[type[OldISAccumulator]] = OldSequenceISAccumulator


_RAW = "w_raw = exp(clamp20(δ))·m, before truncation"
_SEQ_RAW = "w_raw = exp(clamp20(S_i[δ]))·m, before truncation"
_TOKENS = "token mean over the batch, Σ/(N + 1e-8)"
_C = "c = clamp(w_raw, 1/U, U)"


def _is_metrics(level: str) -> tuple[DialectMetric, ...]:
    raw = _RAW if level == "token" else _SEQ_RAW
    was = f"b178a3c, {level} level, U = 2: "
    if level == "token":
        extremes = [
            ("rollout_is_max", "IS weight, max", "w_raw (today: min(w_raw, U))", "max over masked tokens"),
            ("rollout_is_min", "IS weight, min", "w_raw (today: min(w_raw, U))", "min over masked tokens"),
            ("rollout_is_ratio_fraction_high", "share of IS weights above U", "w_raw > U (as today)", _TOKENS),
            ("rollout_is_ratio_fraction_low", "share of IS weights below the lower bound", "w_raw < 1/U", _TOKENS),
        ]
    else:
        extremes = [
            ("rollout_is_max", "IS weight, max", "exp(min(max_i S_i[δ], 20)) (as today)", "over all B rows"),
            ("rollout_is_min", "IS weight, min", "exp(min_i S_i[δ]) (as today)", "over all B rows"),
            ("rollout_is_ratio_fraction_high", "share of IS weights above U", "S_i[δ] > log U (as today)", "B rows"),
            ("rollout_is_ratio_fraction_low", "share of IS weights below the lower bound", "S_i[δ] < log(1/U)", "B"),
        ]
    rows = [
        ("rollout_is_mean", "IS weight, mean", f"{raw} (today: after truncation)", _TOKENS),
        *extremes,
        ("rollout_is_std", "IS weight, std", f"{_C} (today: clamp(w, 0, U))", "population std over masked tokens"),
        ("rollout_is_eff_sample_size", "IS effective sample size", f"1 / T[(c / (T[c] + 1e-8))²], {_C}", "per batch"),
        ("rollout_is_seq_mean", "per-row IS weight, mean", "q_i = R_i[w_raw] (today: of the truncated w)", "B rows"),
        ("rollout_is_seq_std", "per-row IS weight, std", "q_i = R_i[w_raw]", "unbiased std over all B rows"),
        ("rollout_is_seq_max", "per-row IS weight, max", "q_i = R_i[w_raw]", "max over all B rows"),
        ("rollout_is_seq_min", "per-row IS weight, min", "q_i = R_i[w_raw]", "min over all B rows"),
        ("rollout_is_seq_max_deviation", "per-row IS weight, max deviation", "|q_i − 1|", "max over B rows"),
        ("rollout_is_seq_fraction_high", "share of rows above U", "q_i > U (raw, as today since #6806)", "B rows"),
        ("rollout_is_seq_fraction_low", "share of rows below 1/U", "q_i < 1/U (raw)", "mean over all B rows"),
    ]
    return tuple(DialectMetric(PREFIX + name, concept, was + formula, how) for name, concept, formula, how in rows)


_SOURCE = (
    "volcengine/verl `verl/trainer/ppo/rollout_corr_helper.py` (compute_offpolicy_metrics, "
    "compute_rollout_correction_weights, compute_is_metrics), `verl/utils/debug/metrics.py` "
    f"(calculate_debug_metrics) @ {COMMIT}"
)
_OFFLINE = (
    "as `verl`; the IS weight metrics are computed on w before any batch normalisation, as verl does. "
    "Today's meanings of the same keys: `compare-presets` (verl @ 1dda039b9)."
)

FRAMEWORK = Framework(
    name="verl@b178a3c",
    title="verl @b178a3c",
    source=_SOURCE,
    config=(
        "verl's metrics as `verl`, plus `rollout_corr/rollout_is_*` with rollout_is token and rollout_is_threshold "
        "2.0 (TIS; compute_rollout_correction_weights' defaults, the decoupled_token_is preset's); "
        "`verl@b178a3c:seq` for rollout_is sequence at 2.0. Before #5722 (2026-03-24): every rollout_is_* is taken "
        "on the weights before truncation"
    ),
    offline=_OFFLINE,
    metrics=(*verl.FRAMEWORK.metrics, *_is_metrics("token")),
    accumulator=VerlB178a3cAccumulator,
)

FRAMEWORK_SEQ = Framework(
    name="verl@b178a3c:seq",
    title="verl @b178a3c (sequence IS)",
    source=_SOURCE,
    config=(
        "verl's metrics as `verl`, plus `rollout_corr/rollout_is_*` with rollout_is sequence and "
        "rollout_is_threshold 2.0 (the decoupled_seq_is and bypass_pg_is presets' at b178a3c)"
    ),
    offline=_OFFLINE,
    metrics=(*verl.FRAMEWORK.metrics, *_is_metrics("sequence")),
    accumulator=VerlB178a3cSequenceAccumulator,
)
