"""Rollout-correction metrics: IS weights (METRICS.md §2) and rejection sampling (§3), keys ``rollout_corr/…``.

Every accumulator reads the chunk's one per-chunk engine, :class:`~rollout_diag.engine.stats.ChunkStats`
(numpy arrays on the numba engine, which then never loads torch; tensors on the torch engine, through
``rollout_diag.engine.arrays``):
token quantities shared with the analysis families (c = clamp20(δ), k2, k3, exp(c) and their row sums), and
the values derived from a preset's config (IS weights, row statistics, keep flags), each memoised per chunk
(``ChunkStats.memo``) so presets that share a part compute it once. ``outcome.CorrectionAnalysis`` holds one
accumulator per *distinct* part of the chosen presets. The legacy family (§8) is in ``legacy.py``.

Exactness under chunking: every state is a float64 sum, count, min, max, or (count, mean, M2) merged by
Chan's formula. Nothing in §2/§3 needs a step-level value during the row pass: the §2 metrics are taken
on w before batch normalisation (METRICS.md says so, as verl computes them), the batch-norm factor is a
ratio of two sums, and ESS / std are functions of (N, Σc, Σc²) — see :func:`effective_sample_sizes`.
"""

from __future__ import annotations

import math
import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any, ClassVar

import numpy as np

from rollout_diag import catalogue
from rollout_diag.catalogue import CLAMP, EPS
from rollout_diag.engine import arrays
from rollout_diag.engine.arrays import Array
from rollout_diag.engine.formulas import DERIVED, clamp20, derived, row_mean
from rollout_diag.engine.stats import ChunkStats, PerToken, stats
from rollout_diag.io.chunk import Chunk
from rollout_diag.metrics.base import Columns, KeyGroup, StepAccumulator
from rollout_diag.metrics.sweep import SIGNED_HISTOGRAM, exact_bin_edges
from rollout_diag.presets import GATE_STATISTICS, ImportanceSampling, RejectionOption

PREFIX = catalogue.OFFPOLICY_PREFIX


# --------------------------------------------------------------------------- derived token quantities
def prepare_derived(s: ChunkStats, names: Iterable[str], moments: Iterable[str] = (), histogram: bool = False) -> None:
    """On the numba engine: the reductions of the derived quantities ``names`` (and the step groups' moments of
    ``moments``) from one compiled pass (``KernelStats.prepare_derived``); with ``histogram``, the sweep's signed
    histograms of c per step group from the same pass (``sweep.SIGNED_HISTOGRAM``). On the torch engine nothing: each
    is computed where it is read."""
    s.prepare_derived(names, moments, (SIGNED_HISTOGRAM, *exact_bin_edges()) if histogram else None)


def derived_moments(s: ChunkStats, name: str) -> Array:
    """[n, mean, 0, M2, 0, 0] per step group of a derived quantity: the compiled pass's (``prepare_derived`` with it
    among ``moments``), else the torch engine's."""
    return s.memo(("derived_moments", name), lambda: s.group_moments(PerToken.quantity(s, name)))


# --------------------------------------------------------------------------- per-chunk values of a config
class NamedQuantity(PerToken):
    """``PerToken.quantity(s, name)`` whose token tensor is built only if its ``values`` are read: reductions by name
    (segment, row and group sums, extremes, moments) come from the engine's caches, which on the numba engine the
    compiled preset pass fills, so a truncated weight or a §3 statistic reduced by name costs no token tensor. It
    refers to ``s`` weakly: ``s`` memoises it, and a reference cycle would keep each chunk's tensors alive until the
    cyclic garbage collector ran (memory grew with the file)."""

    _stats: weakref.ref[ChunkStats]

    def __init__(self, s: ChunkStats, name: str) -> None:
        object.__setattr__(self, "by_row", False)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "_stats", weakref.ref(s))

    @property
    def values(self) -> Array:
        s = self._stats()
        assert s is not None and self.name is not None, "a chunk's stats outlive the quantities they memoise"
        return s.token(self.name)


def sequence_log_ratio(s: ChunkStats) -> Array:
    """s_i = S_i[δ] (unclamped, every row; 0 for an empty row): the row sum §1 takes too, computed once."""
    return s.row_sum("log_ratio")


def sequence_weight(s: ChunkStats) -> PerToken:
    """§2 / §8 sequence-level w_raw = exp(clamp20(s_i)) per row (numpy's exp on the CPU: ``arrays.host_exp``)."""
    return s.memo("sequence_weight", lambda: PerToken(arrays.host_exp(clamp20(sequence_log_ratio(s))), by_row=True))


def rs_row_value(s: ChunkStats, option: RejectionOption) -> Array:
    """§3 v_i per row: S_i[k] (seq_sum), R_i[k] (seq_mean and token options), max (seq_max, 0 if empty)."""

    def compute() -> Array:
        row_total = statistic_row_sum(s, option.statistic)
        if option.scope == "seq_sum":
            return row_total
        if option.scope == "seq_max":  # k2 / k3 only (§3 has no seq_max_k1)
            return arrays.where(s.valid_rows, s.row_max(f"rs_{option.statistic}"), 0.0)
        return row_mean(row_total, s.row_count)

    return s.memo(("row_value", option.scope, option.statistic), compute)


def statistic_row_sum(s: ChunkStats, statistic: str) -> Array:
    """S_i[k] of a §3 token statistic, from the row sums the engine caches (the sweep reads the same ones); k1 = −c,
    so S_i[k1] = −S_i[c] (negation is exact)."""
    return -s.row_sum("clamped_log_ratio") if statistic == "k1" else s.row_sum(f"rs_{statistic}")


def rs_statistic(s: ChunkStats, option: RejectionOption) -> PerToken:
    """§3 per-token statistic: the token's own k1/k2/k3 (k1 = −c, k2 = ½c², k3 = exp(c) − 1 − c), or its row's
    value (sequence options)."""
    if option.is_sequence:
        return PerToken(rs_row_value(s, option), by_row=True)
    return NamedQuantity(s, f"rs_{option.statistic}")


def rs_rejected_name(option: RejectionOption) -> str:
    """The derived flag of a token option's rejected tokens: not (log L ≤ k1 ≤ log U); not (k ≤ U) for k2/k3; for a
    probability gate, which is never NaN (finite for every logprob ≤ 0: docs/gates.md), k > U: the flag of its
    ``_fraction_high``, counted once for both."""
    base = f"rs_{option.statistic}"
    if option.has_lower:
        return derived(base, "outside", option.lower, option.upper)
    if option.statistic in GATE_STATISTICS:
        return rs_high_name(option)
    return derived(base, "not_at_most", upper=option.upper)


def rs_low_name(option: RejectionOption) -> str:
    """The derived flag of a token option's tokens below its lower bound (``_fraction_low``)."""
    return derived(f"rs_{option.statistic}", "below", lower=option.lower)


def rs_high_name(option: RejectionOption) -> str:
    """The derived flag of a token option's tokens above its upper bound (``_fraction_high``)."""
    return derived(f"rs_{option.statistic}", "above", upper=option.upper)


def rs_clamped_name(option: RejectionOption) -> str:
    """The derived token quantity clamp(stat, lower, U) of a token option (its ``_std``)."""
    return derived(f"rs_{option.statistic}", "clamp", option.lower, option.upper)


def rs_rejections(s: ChunkStats, options: tuple[RejectionOption, ...]) -> tuple[Array | None, list[str]]:
    """What a chain of options rejects: rows (bool [R]: a sequence option drops them; None if none does) and the
    derived flags of its token options."""
    rows = None
    for option in options:
        if option.is_sequence:
            dropped = ~rs_keep(s, option).values
            rows = dropped if rows is None else rows | dropped
    return rows, [rs_rejected_name(option) for option in options if not option.is_sequence]


def rs_quantities(options: tuple[RejectionOption, ...]) -> list[str]:
    """The derived token quantities ``rs_rejections`` and the row statistics of ``options`` read."""
    names = ["rs_k3"] if any(option.statistic == "k3" for option in options) else []
    # a gate's row values read its row sums (or maxima): reduced in the compiled pass, with no token tensor
    names += list(dict.fromkeys(f"rs_{option.statistic}" for option in options if option.statistic in GATE_STATISTICS))
    return names + [rs_rejected_name(option) for option in options if not option.is_sequence]


def rs_keep(s: ChunkStats, option: RejectionOption) -> PerToken:
    """§3 keep flag: k1 log L ≤ stat ≤ log U; k2/k3 stat ≤ U (sequence options keep or drop whole rows)."""

    def compute() -> PerToken:
        stat = rs_statistic(s, option).values
        keep = stat <= option.upper
        if option.has_lower:
            keep = keep & (stat >= option.lower)
        return PerToken(keep, option.is_sequence)

    return s.memo(("keep", option), compute)


def rs_final_keep(s: ChunkStats, options: tuple[RejectionOption, ...]) -> PerToken:
    """§3 final mask on model tokens: Π(option keeps)."""

    def compute() -> PerToken:
        keep = PerToken(arrays.ones(s.chunk.rows, s.chunk.trainer, "bool"), by_row=True)
        for option in options:
            keep = s.both(keep, rs_keep(s, option))
        return keep

    return s.memo(("final_keep", options), compute)


def importance_weights(s: ChunkStats, config: ImportanceSampling) -> tuple[PerToken, PerToken]:
    """§2 (w_raw, w): token exp(clamp20(δ)), sequence exp(clamp20(s_i)) per row; TIS w = min(w_raw, U),
    IcePop w = w_raw inside [L, U] else 0."""

    def compute() -> tuple[PerToken, PerToken]:
        raw = raw_importance_weights(s, config.level)
        if config.level == "token":  # named derived quantities: reduced by name, on the numba engine without tensors
            return raw, NamedQuantity(s, token_weight_name(config))
        if config.icepop:
            inside = icepop_inside(s, config).values
            return raw, raw.map(lambda w: arrays.where(inside, w, 0.0))
        return raw, raw.map(lambda w: arrays.clamp(w, upper=config.upper))

    return s.memo(("is", config.level, config.upper, config.lower, config.icepop), compute)


def token_weight_name(config: ImportanceSampling) -> str:
    """The derived token quantity of a token-level §2 weight: min(w, U), or w inside [L, U] else 0 (IcePop)."""
    if config.icepop:
        return derived("token_is_weight", "icepop", config.lower, config.upper)
    return derived("token_is_weight", "tis", upper=config.upper)


def raw_importance_weights(s: ChunkStats, level: str) -> PerToken:
    """§2 w_raw: exp(clamp20(δ)) per token (token level) or exp(clamp20(s_i)) per row (sequence level)."""
    return PerToken.quantity(s, "token_is_weight") if level == "token" else sequence_weight(s)


def icepop_inside(s: ChunkStats, config: ImportanceSampling) -> PerToken:
    """§2 IcePop: L ≤ w_raw ≤ U, the tokens (or rows) whose weight IcePop keeps; its weight, its drop rule and its
    out-of-bounds count all read this one flag."""

    def compute() -> PerToken:
        return raw_importance_weights(s, config.level).map(lambda w: (w >= config.lower) & (w <= config.upper))

    return s.memo(("icepop_inside", config.level, config.lower, config.upper), compute)


def rejection_counts(s: ChunkStats, rejected: PerToken | Array) -> tuple[Array, Array]:
    """(rejected model tokens, rows with one) per step group, from one row count of the flags (exact integers), or
    from the rejected model tokens of each row given as they are (float64 [R])."""
    per_row = s.row_sum(rejected) if isinstance(rejected, PerToken) else rejected
    return s.group_sum_rows(per_row), s.group_sum_rows(per_row > 0)


def rejected_per_row(s: ChunkStats, rows: Array | None, flags: list[str]) -> Array | None:
    """Rejected model tokens of each row (float64 [R]) when a rule rejects whole rows (``rows``: bool [R], None for
    none) or the tokens of at most one derived flag quantity: every model token of a rejected row, else the row's
    flagged tokens. None when two token flags would have to be combined token by token (the caller does that)."""
    if len(flags) > 1:
        return None
    tokens = s.row_sum(flags[0]) if flags else arrays.zeros(s.chunk.rows, s.row_count)
    return tokens if rows is None else arrays.where(rows, s.row_count, tokens)


class CorrectionAccumulator(StepAccumulator, ABC):
    """A StepAccumulator reading the chunk's shared :class:`ChunkStats`, so every accumulator of a pass (every
    preset) computes δ, k1/k2/k3, row values, weights and keep masks once per chunk."""

    def _stats(self, chunk: Chunk) -> dict[str, Array]:
        s = stats(chunk)
        prepare_derived(s, *self.token_quantities())  # a no-op when the pass prepared every accumulator's at once
        return self.shared_stats(s)

    def token_quantities(self) -> tuple[list[str], list[str]]:
        """(derived token quantities this accumulator reduces by name, those whose moments it reads)."""
        return [], []

    def finalize_block(self, columns: Columns) -> list[KeyGroup]:
        """The family's one formula over a block of steps (the run is a block of one): ``_metrics`` on [B] columns,
        reported where a step has model tokens."""
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return [(columns["tokens"] != 0, self._metrics(columns))]

    @abstractmethod
    def _metrics(self, value: dict[str, Any]) -> dict[str, Any]:
        """Metric values from a merged state of a step (or run) that has model tokens: floats from one state (a
        step's or the run's), [B] columns from a block of steps (``value``'s scalars [B], moments [B, 6])."""

    @abstractmethod
    def shared_stats(self, s: ChunkStats) -> dict[str, Array]:
        """Partial state of each step group: name -> array [G, ...] of the chunk's kind."""


def log_bound(ratio: float | None, missing: float) -> float:
    """log of a ratio bound; log 0 = −inf, and ``missing`` (±inf) when there is no bound."""
    if ratio is None:
        return missing
    return math.log(ratio) if ratio > 0 else -math.inf


# over a block of steps: ``moments`` are [B, 6] ([n, mean_x, ·, M2_x, ·, ·]), the result [B]
def population_stds(moments: np.ndarray) -> np.ndarray:
    """§2/§3 ``_std``: the population std of c over model tokens when N > 1, else 0.

    sqrt(M2 / N) from centred moments, so constant c gives exactly 0. verl writes T[c²] − T[c]², whose 1e-8
    guards add N·mean²·ε / (N+ε)² to the variance: sqrt(ε/N)·|mean| (5.5e-6 for 330 tokens of weight 1) where
    the spread is 0. We leave that artefact out: the variances differ by exactly that term, never more.
    """
    count, m2 = moments[..., 0], moments[..., 3]
    return np.where(count <= 1, 0.0, np.sqrt(np.maximum(m2, 0.0) / np.maximum(count, 1.0)))


def effective_sample_sizes(moments: np.ndarray) -> np.ndarray:
    """§2 ESS = 1 / T[(c / (T[c] + ε))²] = (T[c] + ε)² · (N + ε) / Σc². All-zero weights (IcePop rejecting every
    token) give 1/0: inf (verl raises there)."""
    count, mean, m2 = moments[..., 0], moments[..., 1], moments[..., 3]
    sum_squares = m2 + count * mean * mean
    token_mean = count * mean / (count + EPS)
    # Python's ``x ** 2`` (C pow), as the scalar formula was written: pow and x·x can differ in the last bit
    squared = np.array([value**2 for value in (token_mean + EPS).tolist()], dtype=np.float64)
    return np.where(sum_squares <= 0, math.inf, squared * (count + EPS) / sum_squares)


def sample_stds(moments: np.ndarray) -> np.ndarray:
    """Notation: unbiased (n−1) std over rows; 0 with fewer than 2 values."""
    count, m2 = moments[..., 0], moments[..., 3]
    return np.where(count >= 2, np.sqrt(np.maximum(m2, 0.0) / np.maximum(count - 1, 1.0)), 0.0)


# --------------------------------------------------------------------------- §2 IS weights
# The weight summary that §2 and the legacy helper (§8) share; each adds its own keys around it.
WEIGHT_REDUCTIONS: dict[str, str] = {
    "weight_sum": "sum",  # Σ m·w
    "extreme_max": "max",  # token level: max w over model tokens; else max_i ℓ_i (log ratio) over all rows
    "extreme_min": "min",
    "high": "sum",  # token level: #tokens w_raw > U; else rows (or their tokens) with ℓ_i > log U
    "low": "sum",
    "clamped": "moments",  # c = clamp(w, floor, U) over model tokens
    "seq_weight": "moments",  # q_i = R_i[w] over all rows
    "seq_weight_max": "max",
    "seq_weight_min": "min",
    "seq_deviation_max": "max",  # max_i |q_i − 1|
    "seq_high": "sum",  # #rows R_i[w_raw] > U
    "seq_low": "sum",
}


def weight_stats(
    s: ChunkStats,
    raw: PerToken,
    weight: PerToken,
    level_log_ratio: Array | None,
    bounds: tuple[float | None, float, float],
    token_weighted_fractions: bool = False,
) -> dict[str, Array]:
    """Partial state of WEIGHT_REDUCTIONS. ``level_log_ratio``: ℓ_i per row for sequence-like levels (None at
    token level); ``bounds``: (clamp floor of c, lower L', upper U) in ratio space, the floor None where w
    already lies in [0, U] (c = w)."""
    floor, lower, upper = bounds
    if level_log_ratio is None:  # token level: extremes of w, fractions of w_raw over model tokens (named flags)
        extremes = {"extreme_max": s.group_max(weight), "extreme_min": s.group_min(weight)}
        high = s.group_sum(derived("token_is_weight", "above", upper=upper))
        low = s.group_sum(derived("token_is_weight", "below", lower=lower))
    else:  # sequence-like: unclamped ℓ_i over all rows, vs log U in float64 (verl takes log of a float32 U)
        extremes = {
            "extreme_max": s.group_max_rows(level_log_ratio),
            "extreme_min": s.group_min_rows(level_log_ratio),
        }
        high_rows = level_log_ratio > log_bound(upper, math.inf)
        low_rows = level_log_ratio < log_bound(lower, -math.inf)
        if token_weighted_fractions:
            high, low = s.group_sum(PerToken(high_rows, True)), s.group_sum(PerToken(low_rows, True))
        else:
            high, low = s.group_sum_rows(high_rows), s.group_sum_rows(low_rows)
    seq_weight = s.row_mean(weight)
    raw_seq_weight = seq_weight if raw is weight else s.row_mean(raw)
    if level_log_ratio is None:  # c = clamp(w, floor, U): the weight itself or a derived token quantity
        clamped_moments = derived_moments(s, weight_moments_name(weight, floor, upper))
    else:
        clamped_moments = s.group_moments(
            weight if floor is None else weight.map(lambda w: arrays.clamp(w, floor, upper))
        )
    return {
        "weight_sum": s.group_sum(weight),
        **extremes,
        "high": high,
        "low": low,
        "clamped": clamped_moments,
        "seq_weight": s.group_moments_rows(seq_weight),
        "seq_weight_max": s.group_max_rows(seq_weight),
        "seq_weight_min": s.group_min_rows(seq_weight),
        "seq_deviation_max": s.group_max_rows(abs(seq_weight - 1.0)),
        "seq_high": s.group_sum_rows(raw_seq_weight > upper),
        "seq_low": s.group_sum_rows(raw_seq_weight < lower),
    }


def weight_moments_name(weight: PerToken, floor: float | None, upper: float) -> str:
    """The token quantity whose moments are a token-level weight summary's c: the weight, or clamp(w, floor, U)."""
    assert weight.name is not None
    return weight.name if floor is None else derived("token_is_weight", "clamp", floor, upper)


def token_weight_names(weight: str, floor: float | None, lower: float, upper: float) -> tuple[list[str], list[str]]:
    """(quantities, quantities with moments) a token-level weight summary reads (``weight_stats``)."""
    flags = [derived("token_is_weight", "above", upper=upper), derived("token_is_weight", "below", lower=lower)]
    moments = weight if floor is None else derived("token_is_weight", "clamp", floor, upper)
    return ["token_is_weight", weight, *flags], [moments]


def token_denominator(value: dict[str, Any]) -> Any:
    """N + 1e-8 of a state (a float) or a block of steps ([B]): the denominator of every token mean T[x] (§1)."""
    return value["tokens"] + EPS


def weight_metrics(value: dict[str, Any], log_extremes: bool, fraction_base: Any) -> dict[str, Any]:
    """rollout_is_mean … _seq_fraction_low from WEIGHT_REDUCTIONS columns of a block of steps (names without prefix).

    ``log_extremes``: max/min are exp(min(max ℓ, 20)) / exp(min ℓ) (sequence-like levels); ``fraction_base``:
    what the ratio fractions divide by (N + ε for token-weighted ones, B for row ones).
    """
    rows = value["rows"]
    if log_extremes:  # §2 sequence: exp(min(max_i s_i, 20)), exp(min_i s_i) (inf, not an error, past exp's range)
        with np.errstate(over="ignore"):
            is_max, is_min = np.exp(np.minimum(value["extreme_max"], CLAMP)), np.exp(value["extreme_min"])
    else:
        is_max, is_min = value["extreme_max"], value["extreme_min"]
    return {
        "rollout_is_mean": value["weight_sum"] / token_denominator(value),  # T[w]
        "rollout_is_max": is_max,
        "rollout_is_min": is_min,
        "rollout_is_ratio_fraction_high": value["high"] / fraction_base,
        "rollout_is_ratio_fraction_low": value["low"] / fraction_base,
        "rollout_is_std": population_stds(value["clamped"]),
        "rollout_is_eff_sample_size": effective_sample_sizes(value["clamped"]),
        "rollout_is_seq_mean": value["seq_weight"][..., 1],
        "rollout_is_seq_std": sample_stds(value["seq_weight"]),
        "rollout_is_seq_max": value["seq_weight_max"],
        "rollout_is_seq_min": value["seq_weight_min"],
        "rollout_is_seq_max_deviation": value["seq_deviation_max"],
        "rollout_is_seq_fraction_high": value["seq_high"] / rows,
        "rollout_is_seq_fraction_low": value["seq_low"] / rows,
    }


class ImportanceAccumulator(CorrectionAccumulator):
    """§2 metrics of one IS config, on w before batch normalisation, plus the batch-norm factor."""

    REDUCTIONS: ClassVar[dict[str, str]] = {
        "tokens": "sum",
        "rows": "sum",
        "valid_rows": "sum",
        **WEIGHT_REDUCTIONS,
        "oob": "sum",  # IcePop: #tokens w_raw outside [L, U]
        "valid_seq_weight_sum": "sum",  # Σ_valid q_i (sequence batch norm)
        # w_raw before truncation (after verl's clamp20 of the log ratio), over model tokens: summary/is_raw_*
        "raw_weight": "moments",
        "raw_max": "max",
        "raw_min": "min",
    }

    def __init__(self, config: ImportanceSampling) -> None:
        super().__init__()
        self.config = config

    def token_quantities(self) -> tuple[list[str], list[str]]:
        config = self.config
        if config.level != "token":
            return [], []
        names, moments = token_weight_names(token_weight_name(config), None, config.lower, config.upper)
        if config.icepop:
            names.append(derived("token_is_weight", "outside", config.lower, config.upper))
        return names, [*moments, "token_is_weight"]

    def shared_stats(self, s: ChunkStats) -> dict[str, Array]:
        config = self.config
        raw, weight = importance_weights(s, config)
        # §2: token level T[w_raw > U]; sequence level mean_i [s_i > log U] with unclamped s_i; c = clamp(w, 0, U),
        # which is w itself (TIS and IcePop weights lie in [0, U])
        level_log_ratio = sequence_log_ratio(s) if config.level == "sequence" else None
        weights = weight_stats(s, raw, weight, level_log_ratio, (None, config.lower, config.upper))
        if config.icepop and config.level == "token":  # §2 T[w_raw < L or w_raw > U]: a named flag
            oob = s.group_sum(derived("token_is_weight", "outside", config.lower, config.upper))
        elif config.icepop:
            oob = s.group_tokens - s.group_sum(icepop_inside(s, config))
        else:
            oob = arrays.zeros(arrays.size(s.group_tokens), s.group_tokens)
        seq_weight = s.row_mean(weight)
        return {
            "tokens": s.group_tokens,
            "rows": s.group_rows,
            "valid_rows": s.group_valid_rows,
            **weights,
            "oob": oob,
            "valid_seq_weight_sum": s.group_sum_rows(arrays.where(s.valid_rows, seq_weight, 0.0)),
            **raw_weight_stats(s, raw),
        }

    def _metrics(self, value: dict[str, Any]) -> dict[str, Any]:
        rows = value["rows"]
        config = self.config
        denominator = token_denominator(value)  # T[x] = Σ m·x / (N + 1e-8)
        sequence = config.level == "sequence"
        metrics = weight_metrics(value, log_extremes=sequence, fraction_base=rows if sequence else denominator)
        if config.icepop:
            metrics["rollout_is_oob_ratio"] = value["oob"] / denominator
        if config.batch_normalize:  # §2: f = T[w] (token) or Σ_valid q_i / max(#valid, 1e-8) (sequence)
            if sequence:
                factor = value["valid_seq_weight_sum"] / np.maximum(value["valid_rows"], EPS)
            else:
                factor = value["weight_sum"] / denominator
            metrics["rollout_is_batch_norm_factor"] = np.where(factor > EPS, factor, 1.0)
        return {**{PREFIX + name: v for name, v in metrics.items()}, **raw_weight_metrics(value)}


def raw_weight_stats(s: ChunkStats, raw: PerToken) -> dict[str, Array]:
    """Partial state of the raw IS weights w_raw (exp(clamp20(δ)) per token, exp(clamp20(s_i)) of the row at sequence
    level) over model tokens: moments, max and min (a row without model tokens adds nothing)."""
    if raw.by_row:
        valid = s.valid_rows
        return {
            "raw_weight": s.group_moments(raw),
            "raw_max": s.group_max_rows(arrays.where(valid, raw.values, -math.inf)),
            "raw_min": s.group_min_rows(arrays.where(valid, raw.values, math.inf)),
        }
    return {
        "raw_weight": derived_moments(s, "token_is_weight"),
        "raw_max": s.group_max(raw),
        "raw_min": s.group_min(raw),
    }


def raw_weight_metrics(value: dict[str, Any]) -> dict[str, Any]:
    """``summary/is_raw_*``: verl's rollout_is_mean / _std / _eff_sample_size / _max / _min formulas on w_raw, before
    truncation or IcePop (TRL #5243, NeMo-RL #3900 ask for both sides): T[w_raw], its population std and ESS over
    model tokens, and its extremes (a sequence's weight counts once per model token)."""
    moments = value["raw_weight"]
    count, mean = moments[..., 0], moments[..., 1]
    return {
        RAW_IS_MEAN: count * mean / (count + EPS),  # T[w_raw] = Σ m·w_raw / (N + 1e-8)
        RAW_IS_STD: population_stds(moments),
        RAW_IS_MIN: value["raw_min"],
        RAW_IS_MAX: value["raw_max"],
        RAW_IS_ESS: effective_sample_sizes(moments),
    }


RAW_IS_MEAN, RAW_IS_STD, RAW_IS_MIN, RAW_IS_MAX, RAW_IS_ESS = (
    metric.key
    for metric in (catalogue.IS_RAW_MEAN, catalogue.IS_RAW_STD, catalogue.IS_RAW_MIN, catalogue.IS_RAW_MAX,
                   catalogue.IS_RAW_ESS)
)  # fmt: skip


# --------------------------------------------------------------------------- §3 rejection sampling
class RejectionOptionAccumulator(CorrectionAccumulator):
    """§3 metrics ``rollout_rs_<option>_…`` of one option with its bounds."""

    REDUCTIONS: ClassVar[dict[str, str]] = {
        "tokens": "sum",
        "valid_rows": "sum",
        "stat_sum": "sum",  # Σ m·stat (row value broadcast for sequence options)
        "stat_max": "max",  # sequence options: over valid rows' values; token options: over model tokens
        "stat_min": "min",
        "high": "sum",  # sequence: #valid rows v > upper; token: #tokens stat > upper
        "low": "sum",
        "clamped": "moments",  # clamp(stat, lower, upper) over model tokens
        "row_value": "moments",  # v_i over valid rows
        "row_value_max": "max",
        "row_value_min": "min",
        "row_value_abs_max": "max",
        "row_high": "sum",  # #valid rows v_i > upper
        "row_low": "sum",
        "rejected_tokens": "sum",
        "rejected_rows": "sum",  # valid rows with a rejected model token
    }

    def __init__(self, option: RejectionOption) -> None:
        super().__init__()
        self.option = option

    def token_quantities(self) -> tuple[list[str], list[str]]:
        option = self.option
        base = f"rs_{option.statistic}"
        names = [base] if base in DERIVED else []
        if option.is_sequence:
            return names, []
        flags = [rs_high_name(option), *([] if option.statistic in GATE_STATISTICS else [rs_low_name(option)])]
        return list(dict.fromkeys([*names, *flags, rs_rejected_name(option)])), [rs_clamped_name(option)]

    def shared_stats(self, s: ChunkStats) -> dict[str, Array]:
        option = self.option
        valid = s.valid_rows
        statistic = rs_statistic(s, option)
        row_value = rs_row_value(s, option)
        row_high = s.group_sum_rows(valid & (row_value > option.upper))
        row_low = s.group_sum_rows(valid & (row_value < option.lower))
        row_value_max = s.group_max_rows(row_value, valid)
        row_value_min = s.group_min_rows(row_value, valid)
        if option.is_sequence:  # §3: max/min/fractions of sequence options over valid rows' values
            stat_max, stat_min, high, low = row_value_max, row_value_min, row_high, row_low
        else:  # token options: named derived flags (no token tensor on the numba engine)
            stat_max, stat_min = s.group_max(statistic), s.group_min(statistic)
            high = s.group_sum(rs_high_name(option))
            # a gate is ≥ 0 (clamped at 0, or |p − q|): none is below its lower bound 0, no flag counts them
            low = high * 0.0 if option.statistic in GATE_STATISTICS else s.group_sum(rs_low_name(option))
        if option.is_sequence:
            rejected_tokens, rejected_rows = rejection_counts(s, rs_keep(s, option).map(arrays.logical_not))
        else:
            rejected_tokens, rejected_rows = rejection_counts(s, s.row_sum(rs_rejected_name(option)))
        # Σ m·stat per row: n_i·v_i for sequence options, the cached S_i[k] for token options (no pass over tokens)
        stat_sums = s.row_sum(statistic) if option.is_sequence else statistic_row_sum(s, option.statistic)
        return {
            "tokens": s.group_tokens,
            "valid_rows": s.group_valid_rows,
            "stat_sum": s.group_sum_rows(stat_sums),
            "stat_max": stat_max,
            "stat_min": stat_min,
            "high": high,
            "low": low,
            "clamped": derived_moments(s, rs_clamped_name(option))
            if not option.is_sequence
            else s.group_moments(statistic.map(lambda stat: arrays.clamp(stat, option.lower, option.upper))),
            "row_value": s.group_moments_rows(row_value, valid),
            "row_value_max": row_value_max,
            "row_value_min": row_value_min,
            "row_value_abs_max": s.group_max_rows(abs(row_value), valid),
            "row_high": row_high,
            "row_low": row_low,
            "rejected_tokens": rejected_tokens,
            "rejected_rows": rejected_rows,
        }

    def _metrics(self, value: dict[str, Any]) -> dict[str, Any]:
        valid = value["valid_rows"]
        option = self.option
        denominator = token_denominator(value)
        # §3 fractions: sequence options over valid rows, token options T[·]
        share = (lambda count: count / valid) if option.is_sequence else (lambda count: count / denominator)
        metrics = {
            "mean": value["stat_sum"] / denominator,
            "max": value["stat_max"],
            "min": value["stat_min"],
            "fraction_high": share(value["high"]),
            "fraction_low": share(value["low"]) if option.has_lower else 0.0,  # §3: _low is 0.0 for k2/k3
            "std": population_stds(value["clamped"]),
        }
        seq_names = ["seq_mean", "seq_std", "seq_max", "seq_min", "seq_max_deviation", "seq_fraction_high"]
        if option.has_lower:
            seq_names.append("seq_fraction_low")
        seq_metrics = {
            "seq_mean": value["row_value"][..., 1],
            "seq_std": sample_stds(value["row_value"]),
            "seq_max": value["row_value_max"],
            "seq_min": value["row_value_min"],
            "seq_max_deviation": value["row_value_abs_max"],  # max |v|: deviation from 0
            "seq_fraction_high": value["row_high"] / valid,
            "seq_fraction_low": value["row_low"] / valid,
        }
        has_valid = valid > 0
        metrics.update({name: np.where(has_valid, seq_metrics[name], 0.0) for name in seq_names})  # §3: 0.0 if none
        metrics["masked_fraction"] = value["rejected_tokens"] / denominator  # §3 T[1 − keep]
        metrics["seq_masked_fraction"] = np.where(has_valid, value["rejected_rows"] / valid, 0.0)
        return {f"{PREFIX}rollout_rs_{option.option}_{name}": v for name, v in metrics.items()}


def k1_is_asymmetric(option: RejectionOption) -> bool:
    """A k1 option whose ratio bounds L, U are not reciprocal (L·U ≠ 1): verl keeps log L ≤ k1 ≤ log U with k1 = −log ρ,
    so it applies ρ ∈ [1/U, 1/L], not the [L, U] one reads in the config (verl #6377, closed unmerged)."""
    return option.k1_asymmetric


def k1_as_written(option: RejectionOption) -> RejectionOption:
    """The k1 option that keeps ρ ∈ [L, U] as written: −log U ≤ k1 ≤ −log L."""
    lower, upper = -option.upper, -option.lower
    spec = f"{math.exp(-option.upper)!r}_{math.exp(-option.lower)!r}"
    return RejectionOption(option.option, option.scope, option.statistic, lower, upper, spec)


class K1AsWrittenAccumulator(RejectionOptionAccumulator):
    """What an asymmetric k1 option would reject with ρ in [L, U] as written (``k1_as_written``), beside verl's own
    numbers (which stay verl's): ``summary/k1_as_written_token_fraction`` and ``_row_fraction`` of the option."""

    def __init__(self, option: RejectionOption) -> None:
        super().__init__(k1_as_written(option))

    def _metrics(self, value: dict[str, Any]) -> dict[str, Any]:
        valid = value["valid_rows"]
        return {
            K1_WRITTEN_TOKENS: value["rejected_tokens"] / token_denominator(value),
            K1_WRITTEN_ROWS: np.where(valid > 0, value["rejected_rows"] / np.maximum(valid, 1.0), 0.0),
        }


K1_WRITTEN_TOKENS, K1_WRITTEN_ROWS = catalogue.K1_WRITTEN_TOKENS.key, catalogue.K1_WRITTEN_ROWS.key


class DropCountAccumulator(CorrectionAccumulator):
    """Counts of model tokens, and of rows with a model token, that a keep rule drops (per step)."""

    REDUCTIONS: ClassVar[dict[str, str]] = {
        "tokens": "sum",
        "rows": "sum",
        "valid_rows": "sum",
        "rejected_tokens": "sum",
        "rejected_rows": "sum",  # rows (of all rows) with a rejected model token
    }

    @abstractmethod
    def kept_tokens(self, s: ChunkStats) -> PerToken:
        """Keep flag of every model token under the rule."""

    def rejected_per_row(self, s: ChunkStats) -> Array | None:
        """Rejected model tokens of each row from row flags and named token flags (``rejected_per_row`` of this
        module), or None: then counted from ``kept_tokens``."""
        return None

    def rejected_tokens(self, s: ChunkStats) -> Array:
        """Rejected model tokens of each row (float64 [R], whole numbers): from the named flags where one serves (no
        token array on the numba engine), else counted from ``kept_tokens``."""
        per_row = self.rejected_per_row(s)
        return s.row_sum(self.kept_tokens(s).map(arrays.logical_not)) if per_row is None else per_row

    def shared_stats(self, s: ChunkStats) -> dict[str, Array]:
        rejected_tokens, rejected_rows = rejection_counts(s, self.rejected_tokens(s))
        return {
            "tokens": s.group_tokens,
            "rows": s.group_rows,
            "valid_rows": s.group_valid_rows,
            "rejected_tokens": rejected_tokens,
            "rejected_rows": rejected_rows,
        }


class RejectionChainAccumulator(DropCountAccumulator):
    """§3 overall: ``rollout_rs_masked_fraction`` = T[1 − final]; ``rollout_rs_seq_masked_fraction`` =
    share of all rows with a rejected model token."""

    def __init__(self, options: tuple[RejectionOption, ...]) -> None:
        super().__init__()
        self.options = options

    def kept_tokens(self, s: ChunkStats) -> PerToken:
        return rs_final_keep(s, self.options)

    def rejected_per_row(self, s: ChunkStats) -> Array | None:
        return rejected_per_row(s, *rs_rejections(s, self.options))

    def token_quantities(self) -> tuple[list[str], list[str]]:
        return rs_quantities(self.options), []

    def _metrics(self, value: dict[str, Any]) -> dict[str, Any]:
        return {
            PREFIX + "rollout_rs_masked_fraction": value["rejected_tokens"] / token_denominator(value),
            PREFIX + "rollout_rs_seq_masked_fraction": value["rejected_rows"] / value["rows"],
        }
