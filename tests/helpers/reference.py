"""Slow, obvious float64 reference for the metrics defined in METRICS.md.

Written only from METRICS.md (the contract), cross-checked by reading verl's
``verl/trainer/ppo/rollout_corr_helper.py`` and ``verl/utils/debug/metrics.py`` and
SkyRL's ``compute_approx_kl``.  Where those differ from METRICS.md a comment says so and
this file follows METRICS.md.

Every public function takes ``rows``: a list of ``(trainer, rollout, mask)`` tuples of
1-D float64 arrays of equal length per row (trainer = ``a`` = old_log_probs, rollout =
``r``, mask = ``m`` in {0, 1}).  All rows together are ONE batch (one training step).

Style: plain Python loops over Python floats, each formula written once, next to the
METRICS.md section it comes from.  No torch, no vectorisation.  Only tokens with m = 1 are
ever read, so values under m = 0 (padding, tool tokens) can be anything, even inf/NaN —
verl gets the same effect with ``torch.where(mask, values, 0)`` in ``masked_sum``.

Steps with no masked token (N = 0) "have no metrics" (§1): every function except
``debug_metrics`` (whose §5 defines that case) raises ValueError for them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

EPS = 1e-8  # Notation: verl adds 1e-8 to every masked-mean denominator.
SAFETY_BOUND = 20.0  # Notation: clamp20(x) = clamp(x, -20, 20).

OFFPOLICY = "rollout_corr/"
Row = tuple[np.ndarray, np.ndarray, np.ndarray]
PerRow = list[list[float]]  # one list per row, one value per masked token, in token order


# ---------------------------------------------------------------------------
# Notation helpers (METRICS.md "Notation")
# ---------------------------------------------------------------------------


def clamp(x: float, lo: float, hi: float) -> float:
    """torch.clamp semantics: min(max(x, lo), hi) (so lo > hi gives hi)."""
    return min(max(x, lo), hi)


def clamp20(x: float) -> float:
    return clamp(x, -SAFETY_BOUND, SAFETY_BOUND)


def exp_inf(x: float) -> float:
    """exp that overflows to inf like torch/numpy instead of raising OverflowError."""
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def check_rows(rows: Sequence[Row]) -> list[tuple[list[float], list[float], list[int]]]:
    """Validate the rows and turn them into plain Python lists."""
    checked = []
    for index, (trainer, rollout, mask) in enumerate(rows):
        a, r, m = np.asarray(trainer), np.asarray(rollout), np.asarray(mask)
        if a.ndim != 1 or a.shape != r.shape or a.shape != m.shape:
            raise ValueError(f"row {index}: trainer, rollout and mask must be 1-D of equal length")
        if any(float(x) not in (0.0, 1.0) for x in m):
            raise ValueError(f"row {index}: mask values must be 0 or 1")
        checked.append(([float(x) for x in a], [float(x) for x in r], [int(x) for x in m]))
    return checked


def per_token(rows: Sequence[Row], value: Callable[[float, float], float]) -> PerRow:
    """value(a, r) at every masked token, grouped by row (empty list for an empty row)."""
    return [[value(a[t], r[t]) for t in range(len(m)) if m[t] == 1] for a, r, m in check_rows(rows)]


def log_ratio(a: float, r: float) -> float:
    """Notation: δ = a − r (= log ρ)."""
    return a - r


def token_count(per_row: PerRow) -> int:
    """Notation: N = Σ_i n_i."""
    return sum(len(values) for values in per_row)


def token_mean(per_row: PerRow) -> float:
    """Notation: T[x] = Σ m·x / (N + 1e-8)."""
    total = 0.0
    for values in per_row:
        for x in values:
            total += x
    return total / (token_count(per_row) + EPS)


def row_mean(values: list[float]) -> float:
    """Notation: R_i[x] = Σ_t m·x / (n_i + 1e-8); 0 for an empty row."""
    return row_sum(values) / (len(values) + EPS)


def row_sum(values: list[float]) -> float:
    """Notation: S_i[x] = Σ_t m·x."""
    total = 0.0
    for x in values:
        total += x
    return total


def plain_mean(values: list[float]) -> float:
    """Unweighted mean (mean_i over rows, or over valid rows when given only those)."""
    return row_sum(values) / len(values)


def sample_std(values: list[float]) -> float:
    """Notation: std over rows is the unbiased (n−1) sample std; 0 when fewer than 2 values."""
    if len(values) < 2:
        return 0.0
    mean = plain_mean(values)
    squares = 0.0
    for x in values:
        squares += (x - mean) ** 2
    return math.sqrt(squares / (len(values) - 1))


def masked_population_std(per_row: PerRow) -> float:
    """§2/§3 "_std": sqrt(max(T[c²] − T[c]², 0)) if N > 1 else 0 (population, T-based)."""
    if token_count(per_row) <= 1:
        return 0.0
    mean = token_mean(per_row)
    mean_square = token_mean([[c * c for c in values] for values in per_row])
    return math.sqrt(max(mean_square - mean * mean, 0.0))


def centred_population_std(per_row: PerRow) -> float:
    """§2/§3 "_std" as computed: sqrt(Σ(c − mean)² / N) with mean = Σc / N if N > 1 else 0 — T[c²] − T[c]²
    without the N·mean²·ε/(N+ε)² that verl's 1e-8 guards add (constant c gives exactly 0)."""
    count = token_count(per_row)
    if count <= 1:
        return 0.0
    mean = sum(c for values in per_row for c in values) / count
    return math.sqrt(sum((c - mean) ** 2 for values in per_row for c in values) / count)


def indicator(condition: bool) -> float:
    return 1.0 if condition else 0.0


def require_tokens(rows: Sequence[Row]) -> None:
    """§1: a step with N = 0 has no metrics (verl raises/asserts on an all-zero mask)."""
    if token_count(per_token(rows, log_ratio)) == 0:
        raise ValueError("step has no masked token (N = 0): no metrics")


def scatter(rows: Sequence[Row], per_row: PerRow) -> list[np.ndarray]:
    """Put per-masked-token values back at their positions; 0.0 where m = 0."""
    full_rows = []
    for (_, _, m), values in zip(check_rows(rows), per_row, strict=True):
        full = np.zeros(len(m), dtype=np.float64)
        masked_positions = [t for t in range(len(m)) if m[t] == 1]
        for position, value in zip(masked_positions, values, strict=True):
            full[position] = value
        full_rows.append(full)
    return full_rows


# ---------------------------------------------------------------------------
# §1 Off-policy metrics
# ---------------------------------------------------------------------------


def offpolicy_metrics(rows: Sequence[Row]) -> dict[str, float]:
    """§1 (keys rollout_corr/<name>) plus §7's mismatch/logprob_abs_diff = T[|δ|]."""
    require_tokens(rows)
    trainer = per_token(rows, lambda a, r: a)
    rollout = per_token(rows, lambda a, r: r)
    deltas = per_token(rows, log_ratio)
    mean_a = [row_mean(values) for values in trainer]  # R_i[a]; 0 for empty rows (ppl 1)
    mean_r = [row_mean(values) for values in rollout]  # R_i[r]
    d = [mr - ma for ma, mr in zip(mean_a, mean_r, strict=True)]  # d_i = R_i[r] − R_i[a]
    seq_log_ratio = [row_sum(values) for values in deltas]  # S_i[δ]
    return {
        OFFPOLICY + "training_ppl": plain_mean([exp_inf(-x) for x in mean_a]),  # mean_i exp(−R_i[a])
        OFFPOLICY + "training_log_ppl": plain_mean([-x for x in mean_a]),  # mean_i (−R_i[a])
        OFFPOLICY + "rollout_ppl": plain_mean([exp_inf(-x) for x in mean_r]),  # mean_i exp(−R_i[r])
        OFFPOLICY + "rollout_log_ppl": plain_mean([-x for x in mean_r]),  # mean_i (−R_i[r])
        OFFPOLICY + "kl": token_mean(per_token(rows, lambda a, r: r - a)),  # T[r − a]
        # k3_kl = T[exp(δ) − δ − 1], deliberately unclamped
        OFFPOLICY + "k3_kl": token_mean([[exp_inf(x) - x - 1.0 for x in v] for v in deltas]),
        OFFPOLICY + "log_ppl_diff": plain_mean(d),  # mean_i d_i
        OFFPOLICY + "log_ppl_abs_diff": plain_mean([abs(x) for x in d]),  # mean_i |d_i|
        OFFPOLICY + "log_ppl_diff_max": max(d),  # max_i d_i (empty rows take part with d_i = 0)
        OFFPOLICY + "log_ppl_diff_min": min(d),  # min_i d_i
        OFFPOLICY + "ppl_ratio": plain_mean([exp_inf(x) for x in d]),  # mean_i exp(d_i)
        # chi2_token = T[exp(2·clamp20(δ))] − 1 (verl squares exp(clamp20(δ)); same value up to 1 ulp)
        OFFPOLICY + "chi2_token": token_mean([[math.exp(2.0 * clamp20(x)) for x in v] for v in deltas]) - 1.0,
        # chi2_seq = mean_i exp(2·clamp20(S_i[δ])) − 1 (empty rows contribute exp(0) = 1)
        OFFPOLICY + "chi2_seq": plain_mean([math.exp(2.0 * clamp20(s)) for s in seq_log_ratio]) - 1.0,
        "mismatch/logprob_abs_diff": token_mean([[abs(x) for x in v] for v in deltas]),  # §7: T[|δ|]
    }


# ---------------------------------------------------------------------------
# Counts of model tokens by |δ| (rollout-diag's own keys: exactness, extreme tokens, tolerance bands)
# ---------------------------------------------------------------------------

BANDS = ("1e-3", "1e-2", "1e-1")


def extreme_and_band_shares(deltas: list[float]) -> dict[str, float]:
    """Shares of the given δ (no 1e-8): |δ| > ln 2, > ln 5, and ≤ each band."""
    n = len(deltas)
    out = {
        "extreme_frac_ln2": sum(abs(x) > math.log(2.0) for x in deltas) / n,
        "extreme_frac_ln5": sum(abs(x) > math.log(5.0) for x in deltas) / n,
    }
    for band in BANDS:
        out[f"band_token_share@{band}"] = sum(abs(x) <= float(band) for x in deltas) / n
    return out


def round_count_metrics(rows: Sequence[Row], max_rounds: int = 64) -> dict[str, float]:
    """Per round bucket (§7's pooling): extreme_frac_ln2/ln5 and band_token_share@ε over its tokens, band_seq_share@ε
    over the rows that reach it (every one of their bucket tokens within ε)."""
    require_tokens(rows)
    bucket_deltas: dict[int, list[float]] = {}
    bucket_row_max: dict[int, list[float]] = {}  # per bucket, each row's largest |δ| there
    for a, r, m in check_rows(rows):
        largest: dict[int, float] = {}
        for k, deltas in enumerate(split_rounds(a, r, m)):
            bucket = min(k, max_rounds)
            bucket_deltas.setdefault(bucket, []).extend(deltas)
            largest[bucket] = max([largest.get(bucket, 0.0), *(abs(x) for x in deltas)])
        for bucket, value in largest.items():
            bucket_row_max.setdefault(bucket, []).append(value)
    metrics: dict[str, float] = {}
    for k in sorted(bucket_deltas):
        prefix = f"per_round/round_{k}/"
        metrics.update({prefix + name: value for name, value in extreme_and_band_shares(bucket_deltas[k]).items()})
        for band in BANDS:
            within = [value <= float(band) for value in bucket_row_max[k]]
            metrics[prefix + f"band_seq_share@{band}"] = sum(within) / len(within)
    return metrics


def bits(value: float, float32: bool) -> bytes:
    """A logprob's bytes as compared: float64, or float32 where either column of the dump is float32."""
    return np.float32(value).tobytes() if float32 else np.float64(value).tobytes()


def count_metrics(rows: Sequence[Row], float32: bool = False) -> dict[str, float]:
    """mismatch/extreme_frac_*, mismatch/band_*_share@ε and diag/mismatched_tokens, its share, diag/max_abs_delta."""
    require_tokens(rows)
    deltas = per_token(rows, log_ratio)
    every = [x for values in deltas for x in values]
    differing = sum(
        bits(pair[0], float32) != bits(pair[1], float32)
        for values in per_token(rows, lambda a, r: (a, r))
        for pair in values
    )
    valid = [values for values in deltas if values]
    out = {"mismatch/" + name: value for name, value in extreme_and_band_shares(every).items()}
    for band in BANDS:  # valid rows whose every model token is within the band
        out[f"mismatch/band_seq_share@{band}"] = sum(max(abs(x) for x in v) <= float(band) for v in valid) / len(valid)
    out["diag/mismatched_tokens"] = float(differing)
    out["diag/mismatched_token_share"] = differing / len(every)
    out["diag/max_abs_delta"] = max(abs(x) for x in every)
    return out


# ---------------------------------------------------------------------------
# §5 verl debug metrics
# ---------------------------------------------------------------------------


def pearson(xs: list[float], ys: list[float]) -> float:
    """Pearson correlation; NaN with fewer than 2 points or a zero variance (like torch.corrcoef)."""
    if len(xs) < 2:
        return math.nan
    mean_x, mean_y = plain_mean(xs), plain_mean(ys)
    covariance = var_x = var_y = 0.0
    for x, y in zip(xs, ys, strict=True):
        covariance += (x - mean_x) * (y - mean_y)
        var_x += (x - mean_x) ** 2
        var_y += (y - mean_y) ** 2
    if var_x == 0.0 or var_y == 0.0:
        return math.nan
    return clamp(covariance / math.sqrt(var_x * var_y), -1.0, 1.0)  # torch.corrcoef clips to [-1, 1]


def debug_metrics(rows: Sequence[Row]) -> dict[str, float]:
    """§5: statistics of |p_a − p_r| and corr(p_a, p_r) over masked tokens, p = exp(logprob)."""
    probs_a = [p for row in per_token(rows, lambda a, r: math.exp(a)) for p in row]
    probs_r = [p for row in per_token(rows, lambda a, r: math.exp(r)) for p in row]
    if not probs_a:  # §5: no masked token → valid 0 and NaN values
        return {
            "training/rollout_probs_diff_valid": 0.0,
            "training/rollout_probs_diff_max": math.nan,
            "training/rollout_probs_diff_mean": math.nan,
            "training/rollout_probs_diff_std": math.nan,
            "training/rollout_actor_probs_pearson_corr": math.nan,
        }
    diffs = [abs(pa - pr) for pa, pr in zip(probs_a, probs_r, strict=True)]
    return {
        "training/rollout_probs_diff_valid": 1.0,
        "training/rollout_probs_diff_max": max(diffs),
        "training/rollout_probs_diff_mean": plain_mean(diffs),
        # unbiased std; verl's torch.std gives NaN for one token, the brief asks for 0.0
        "training/rollout_probs_diff_std": sample_std(diffs),
        "training/rollout_actor_probs_pearson_corr": pearson(probs_a, probs_r),
    }


# ---------------------------------------------------------------------------
# §6 Rollout-KL estimators (SkyRL)
# ---------------------------------------------------------------------------

# §6: per token x = a − r.  SkyRL's k3 additionally clamps x to ±20 and the result to
# [−10, 10]; METRICS.md has no clamp, so none here.
ROLLOUT_KL_ESTIMATORS: dict[str, Callable[[float], float]] = {
    "k1": lambda x: x,
    "abs": lambda x: abs(x),
    "k2": lambda x: 0.5 * x * x,
    "k3": lambda x: exp_inf(-x) - 1.0 + x,
}


def rollout_kl_metrics(rows: Sequence[Row]) -> dict[str, float]:
    """§6: mean over ALL rows of R_i[estimator] (row mean first, then batch mean)."""
    require_tokens(rows)
    deltas = per_token(rows, log_ratio)
    metrics = {}
    for name, estimator in ROLLOUT_KL_ESTIMATORS.items():
        # R_i uses the +1e-8 denominator (empty row → 0); SkyRL divides by max(n_i, 1) instead
        row_values = [row_mean([estimator(x) for x in values]) for values in deltas]
        metrics[f"rollout_kl/{name}"] = plain_mean(row_values)
    return metrics


# ---------------------------------------------------------------------------
# §7 Per-round (multi-turn) metrics
# ---------------------------------------------------------------------------


def split_rounds(a: list[float], r: list[float], m: list[int]) -> list[list[float]]:
    """§7: δ of each maximal run of consecutive m = 1 tokens, in order."""
    rounds: list[list[float]] = []
    inside_round = False
    for t in range(len(m)):
        if m[t] == 1:
            if not inside_round:
                rounds.append([])
            rounds[-1].append(a[t] - r[t])
        inside_round = m[t] == 1
    return rounds


def round_metrics(rows: Sequence[Row], max_rounds: int = 64) -> dict[str, float]:
    """§7: per-round mismatch; rounds >= max_rounds pooled into bucket max_rounds."""
    require_tokens(rows)
    bucket_deltas: dict[int, list[float]] = {}
    bucket_rows: dict[int, int] = {}
    num_rounds_max = 0
    for a, r, m in check_rows(rows):
        rounds = split_rounds(a, r, m)
        num_rounds_max = max(num_rounds_max, len(rounds))  # unpooled count
        buckets_of_row = set()
        for k, deltas in enumerate(rounds):
            bucket = min(k, max_rounds)
            bucket_deltas.setdefault(bucket, []).extend(deltas)
            buckets_of_row.add(bucket)
        for bucket in buckets_of_row:  # a row counts once per bucket, even when pooled
            bucket_rows[bucket] = bucket_rows.get(bucket, 0) + 1

    metrics: dict[str, float] = {}
    abs_diff_means = {}
    for k in sorted(bucket_deltas):
        deltas = bucket_deltas[k]
        prefix = f"per_round/round_{k}/"
        abs_diff_means[k] = plain_mean([abs(x) for x in deltas])  # plain mean, no 1e-8
        metrics[prefix + "logprob_abs_diff_mean"] = abs_diff_means[k]
        metrics[prefix + "token_count"] = float(len(deltas))
        metrics[prefix + "seq_count"] = float(bucket_rows[k])
        metrics[prefix + "k3_kl"] = plain_mean([exp_inf(x) - x - 1.0 for x in deltas])
        metrics[prefix + "kl"] = plain_mean([-x for x in deltas])  # r − a = −δ
        metrics[prefix + "max_abs_diff"] = max(abs(x) for x in deltas)
        metrics[prefix + "chi2_token"] = plain_mean([math.exp(2.0 * clamp20(x)) for x in deltas]) - 1.0
    metrics["per_round/num_rounds_max"] = float(num_rounds_max)
    # highest abs-diff mean among rounds with support; iterating k upwards with ">" keeps the smallest k on ties
    token_counts = {k: len(deltas) for k, deltas in bucket_deltas.items()}
    min_tokens = min(ROUND_SUPPORT_TOKENS, ROUND_SUPPORT_SHARE * max(token_counts.values()))
    min_rows = min(ROUND_SUPPORT_ROWS, math.ceil(ROUND_SUPPORT_SHARE * max(bucket_rows.values())))
    most_divergent = None
    for k in sorted(abs_diff_means):
        if token_counts[k] < min_tokens or bucket_rows[k] < min_rows:
            continue
        if most_divergent is None or abs_diff_means[k] > abs_diff_means[most_divergent]:
            most_divergent = k
    if most_divergent is not None:
        metrics["per_round/most_divergent_round"] = float(most_divergent)
    return metrics


# most_divergent_round support: ≥ min(200, ⅒ of the most tokens any round has) tokens from
# ≥ min(3, ⌈⅒ of the most rows any round has⌉) rows
ROUND_SUPPORT_TOKENS = 200
ROUND_SUPPORT_ROWS = 3
ROUND_SUPPORT_SHARE = 0.1


# ---------------------------------------------------------------------------
# §2 Importance-sampling weights
# ---------------------------------------------------------------------------


def is_bounds(upper: float, lower: float | None) -> tuple[float, float, bool]:
    """§2 threshold spec → (U, L', is_icepop); L' = L for IcePop, else 1/U."""
    if not upper > 0:
        raise ValueError(f"IS upper threshold must be > 0, got {upper}")
    if lower is None:
        return float(upper), 1.0 / upper, False
    if not lower > 0:
        raise ValueError(f"IS lower threshold must be > 0, got {lower}")
    if lower > upper:
        raise ValueError(f"IS lower threshold {lower} exceeds upper threshold {upper}")
    return float(upper), float(lower), True


def raw_is_weights(rows: Sequence[Row], level: str) -> PerRow:
    """§2: w_raw at masked tokens; token: exp(clamp20(δ)), sequence: exp(clamp20(S_i[δ]))."""
    deltas = per_token(rows, log_ratio)
    if level == "token":
        return [[math.exp(clamp20(x)) for x in values] for values in deltas]
    if level == "sequence":
        return [[math.exp(clamp20(row_sum(values)))] * len(values) for values in deltas]
    raise ValueError(f"rollout_is must be 'token' or 'sequence', got {level!r}")


def applied_is_weight(w_raw: float, upper: float, lower: float, icepop: bool) -> float:
    """§2: TIS w = min(w_raw, U); IcePop w = w_raw if L ≤ w_raw ≤ U else 0."""
    if icepop:
        return w_raw if lower <= w_raw <= upper else 0.0
    return min(w_raw, upper)


def _is_weights_and_metrics(
    rows: Sequence[Row], level: str, upper: float, lower: float | None, batch_normalize: bool
) -> tuple[PerRow, dict[str, float]]:
    require_tokens(rows)
    upper, lower_prime, icepop = is_bounds(upper, lower)
    raw = raw_is_weights(rows, level)
    weights = [[applied_is_weight(w, upper, lower_prime, icepop) for w in values] for values in raw]
    metrics: dict[str, float] = {}
    metrics["rollout_is_mean"] = token_mean(weights)  # T[w]

    if level == "token":
        masked_weights = [w for values in weights for w in values]
        metrics["rollout_is_max"] = max(masked_weights)  # over masked tokens
        metrics["rollout_is_min"] = min(masked_weights)
        metrics["rollout_is_ratio_fraction_high"] = token_mean([[indicator(w > upper) for w in v] for v in raw])
        metrics["rollout_is_ratio_fraction_low"] = token_mean([[indicator(w < lower_prime) for w in v] for v in raw])
    else:
        # s_i = S_i[δ] over ALL rows, unclamped (an empty row has s_i = 0)
        seq_log_ratio = [row_sum(values) for values in per_token(rows, log_ratio)]
        metrics["rollout_is_max"] = math.exp(min(max(seq_log_ratio), SAFETY_BOUND))  # exp(min(max s, 20))
        metrics["rollout_is_min"] = math.exp(min(seq_log_ratio))  # exp(min s), no clamp
        # verl takes log U / log L' of a float32 tensor; the float64 log is used here
        metrics["rollout_is_ratio_fraction_high"] = plain_mean([indicator(s > math.log(upper)) for s in seq_log_ratio])
        metrics["rollout_is_ratio_fraction_low"] = plain_mean(
            [indicator(s < math.log(lower_prime)) for s in seq_log_ratio]
        )

    # c = clamp(w, 0, U) (a no-op for both TIS and IcePop weights, kept to mirror §2)
    clamped = [[clamp(w, 0.0, upper) for w in values] for values in weights]
    metrics["rollout_is_std"] = centred_population_std(clamped)
    mean_clamped = token_mean(clamped)
    normalised_square = token_mean([[(c / (mean_clamped + EPS)) ** 2 for c in v] for v in clamped])
    # ESS = 1 / T[(c / (T[c] + 1e-8))²]; all-zero IcePop weights give 1/0: inf here, verl raises
    metrics["rollout_is_eff_sample_size"] = 1.0 / normalised_square if normalised_square > 0 else math.inf

    seq_weights = [row_mean(values) for values in weights]  # q_i = R_i[w], all rows
    metrics["rollout_is_seq_mean"] = plain_mean(seq_weights)
    metrics["rollout_is_seq_std"] = sample_std(seq_weights)
    metrics["rollout_is_seq_max"] = max(seq_weights)
    metrics["rollout_is_seq_min"] = min(seq_weights)
    metrics["rollout_is_seq_max_deviation"] = max(abs(q - 1.0) for q in seq_weights)
    raw_seq_weights = [row_mean(values) for values in raw]  # R_i[w_raw]; empty rows 0 → "low"
    metrics["rollout_is_seq_fraction_high"] = plain_mean([indicator(q > upper) for q in raw_seq_weights])
    metrics["rollout_is_seq_fraction_low"] = plain_mean([indicator(q < lower_prime) for q in raw_seq_weights])

    if icepop:  # oob = T[w_raw < L or w_raw > U]
        metrics["rollout_is_oob_ratio"] = token_mean(
            [[indicator(w < lower_prime or w > upper) for w in v] for v in raw]
        )

    if batch_normalize:
        if level == "token":
            factor = token_mean(weights)  # f = T[w]
        else:
            valid_seq_weights = [q for q, values in zip(seq_weights, weights, strict=True) if values]
            factor = row_sum(valid_seq_weights) / max(len(valid_seq_weights), EPS)
        if factor > EPS:
            weights = [[w / factor for w in values] for values in weights]
            metrics["rollout_is_batch_norm_factor"] = factor
        else:
            metrics["rollout_is_batch_norm_factor"] = 1.0

    return weights, {OFFPOLICY + key: value for key, value in metrics.items()}


def is_metrics(
    rows: Sequence[Row], level: str, upper: float, lower: float | None = None, batch_normalize: bool = False
) -> dict[str, float]:
    """§2 metrics (computed on w before batch normalisation), keys rollout_corr/rollout_is_*."""
    return _is_weights_and_metrics(rows, level, upper, lower, batch_normalize)[1]


def is_weights(
    rows: Sequence[Row], level: str, upper: float, lower: float | None = None, batch_normalize: bool = False
) -> list[np.ndarray]:
    """§2 final per-row weights (after batch normalisation if asked); 0 where m = 0."""
    return scatter(rows, _is_weights_and_metrics(rows, level, upper, lower, batch_normalize)[0])


# ---------------------------------------------------------------------------
# §3 Rejection sampling
# ---------------------------------------------------------------------------

RS_OPTIONS = (
    "token_k1", "token_k2", "token_k3",
    "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
    "seq_mean_k1", "seq_mean_k2", "seq_mean_k3",
    "seq_max_k2", "seq_max_k3",
    *(f"{scope}_{kind}" for kind in ("kpop", "bkl", "tv") for scope in ("token", "seq_sum", "seq_mean", "seq_max")),
)  # fmt: skip
GATES = ("kpop", "bkl", "tv")


def binary_kl(x: float, y: float, eps: float) -> float:
    """KL(Bernoulli(x) ‖ Bernoulli(y)) of probabilities clamped to [eps, 1 − eps], as the trainers write it:
    x·log(x/y) + (1 − x)·log((1 − x)/(1 − y)) (AReaL compute_binary_kl_divergence, areal-project/AReaL@cbff54d
    areal/utils/functional/functional.py; OpenRLHF #1339 PolicyLoss), here in float64 Python floats."""
    x, y = min(max(x, eps), 1.0 - eps), min(max(y, eps), 1.0 - eps)
    return x * math.log(x / y) + (1.0 - x) * math.log((1.0 - x) / (1.0 - y))


def gate_divergence(a: float, r: float, kind: str) -> float:
    """The probability gates of p = exp(a) (trainer), q = exp(r) (rollout):
    kpop = max(KL(B(p)‖B(q)), KL(B(q)‖B(p))), clamp 1e-8 (AReaL #1405 at cbff54d: metric "binary_kl");
    bkl = KL(B(q)‖B(p)), clamp 1e-6 (OpenRLHF #1339 gating "binary_kl": p = rollout, q = train in their names);
    tv = |p − q| (prime-rl ipo_loss_fn at PrimeIntellect-ai/prime-rl@559b447). Both KLs at least 0 (OpenRLHF #1354)."""
    p, q = math.exp(a), math.exp(r)
    if kind == "kpop":
        return max(binary_kl(p, q, 1e-8), binary_kl(q, p, 1e-8), 0.0)
    if kind == "bkl":
        return max(binary_kl(q, p, 1e-6), 0.0)
    return abs(p - q)


def rs_bounds(option: str, spec: str | float) -> tuple[float | None, float]:
    """§3 threshold entry → (lower, upper) in ratio space for k1, (None, U) for k2/k3."""
    spec = str(spec).strip()
    if option.endswith("k1"):
        if "_" in spec:
            parts = spec.split("_")
            if len(parts) != 2:
                raise ValueError(f"{option}: threshold {spec!r} must be 'L_U'")
            lower, upper = float(parts[0]), float(parts[1])
        else:
            upper = float(spec)
            lower = 1.0 / upper if upper > 0 else math.nan  # a single U means L = 1/U
        if not (lower > 0 and upper > 0):
            raise ValueError(f"{option}: thresholds must be positive, got {spec!r}")
        # verl does not check L <= U for RS; neither does METRICS.md, so neither do we
        return lower, upper
    if "_" in spec:
        raise ValueError(f"{option}: k2/k3 and gate options take a single upper bound, got {spec!r}")
    upper = float(spec)
    if not upper > 0:
        raise ValueError(f"{option}: threshold must be positive, got {spec!r}")
    return None, upper


def parse_rs(options: list[str], thresholds: list[str]) -> list[tuple[str, float | None, float]]:
    """§3: options (all must pass) with one shared threshold or one per option."""
    unique_options: list[str] = []
    for option in options:
        if option not in RS_OPTIONS:
            raise ValueError(f"unknown rollout_rs option {option!r}")
        if option not in unique_options:  # verl drops repeated options (not in METRICS.md)
            unique_options.append(option)
    if not unique_options:
        raise ValueError("rollout_rs needs at least one option")
    if len(thresholds) == 1:
        thresholds = list(thresholds) * len(unique_options)
    if len(thresholds) != len(unique_options):
        raise ValueError("rollout_rs_threshold needs one entry, or one per option")
    return [(option, *rs_bounds(option, spec)) for option, spec in zip(unique_options, thresholds, strict=True)]


def token_divergence(delta: float, kind: str) -> float:
    """§3: k1 = −clamp20(δ), k2 = ½·clamp20(δ)², k3 = exp(clamp20(δ)) − 1 − clamp20(δ)."""
    x = clamp20(delta)
    if kind == "k1":
        return -x
    if kind == "k2":
        return 0.5 * x * x
    return math.exp(x) - 1.0 - x


def rs_token_stats(rows: Sequence[Row], option: str) -> PerRow:
    """Per-token divergence of the option's kind (k1/k2/k3) at masked tokens."""
    kind = option.rpartition("_")[2]
    if kind in GATES:
        return per_token(rows, lambda a, r: gate_divergence(a, r, kind))
    return [[token_divergence(x, kind) for x in values] for values in per_token(rows, log_ratio)]


def rs_row_values(rows: Sequence[Row], option: str) -> list[float]:
    """§3 row value v_i for every row: S_i[k], R_i[k], max (0 for an empty row), or R_i[stat]."""
    stats = rs_token_stats(rows, option)
    if option.startswith("seq_sum_"):
        return [row_sum(values) for values in stats]
    if option.startswith("seq_max_"):
        return [max(values) if values else 0.0 for values in stats]
    return [row_mean(values) for values in stats]  # seq_mean_* and token_* options


def rs_option_stats(rows: Sequence[Row], option: str) -> PerRow:
    """Per-token statistic: the token value, or the row value broadcast for sequence options."""
    if option.startswith("token_"):
        return rs_token_stats(rows, option)
    stats = rs_token_stats(rows, option)
    return [[v] * len(values) for v, values in zip(rs_row_values(rows, option), stats, strict=True)]


def rs_passes(value: float, option: str, lower: float | None, upper: float) -> bool:
    """§3: k1 keeps log L ≤ stat ≤ log U; k2/k3 keep stat ≤ U."""
    if option.endswith("k1"):
        return math.log(lower) <= value <= math.log(upper)
    return value <= upper


def rs_option_keep(rows: Sequence[Row], option: str, lower: float | None, upper: float) -> list[list[bool]]:
    """Keep flag per masked token (sequence options keep or reject the whole row)."""
    return [[rs_passes(x, option, lower, upper) for x in v] for v in rs_option_stats(rows, option)]


def _rs_option_metrics(rows: Sequence[Row], option: str, lower: float | None, upper: float) -> dict[str, float]:
    is_k1 = option.endswith("k1")
    # thresholds in metric space: k1 → (log L, log U); k2/k3 → (0, U)
    upper_m = math.log(upper) if is_k1 else upper
    lower_m = math.log(lower) if is_k1 else 0.0
    stats = rs_option_stats(rows, option)
    keep = rs_option_keep(rows, option, lower, upper)
    row_values = rs_row_values(rows, option)
    valid_values = [v for v, values in zip(row_values, stats, strict=True) if values]  # n_i > 0
    is_sequence = not option.startswith("token_")
    metrics: dict[str, float] = {}

    metrics["mean"] = token_mean(stats)  # T[stat]
    if is_sequence:  # over valid rows' values
        metrics["max"] = max(valid_values)
        metrics["min"] = min(valid_values)
        metrics["fraction_high"] = plain_mean([indicator(v > upper_m) for v in valid_values])
        low = plain_mean([indicator(v < lower_m) for v in valid_values])
    else:  # over masked tokens
        metrics["max"] = max(x for values in stats for x in values)
        metrics["min"] = min(x for values in stats for x in values)
        metrics["fraction_high"] = token_mean([[indicator(x > upper_m) for x in v] for v in stats])
        low = token_mean([[indicator(x < lower_m) for x in v] for v in stats])
    metrics["fraction_low"] = low if is_k1 else 0.0  # no low fraction for k2/k3
    metrics["std"] = centred_population_std([[clamp(x, lower_m, upper_m) for x in v] for v in stats])

    # over valid rows; verl: torch .std() (unbiased, n−1) when >1 value, else 0 — matches Notation
    if valid_values:
        metrics["seq_mean"] = plain_mean(valid_values)
        metrics["seq_std"] = sample_std(valid_values)
        metrics["seq_max"] = max(valid_values)
        metrics["seq_min"] = min(valid_values)
        metrics["seq_max_deviation"] = max(abs(v) for v in valid_values)  # deviation from 0
        metrics["seq_fraction_high"] = plain_mean([indicator(v > upper_m) for v in valid_values])
        if is_k1:
            metrics["seq_fraction_low"] = plain_mean([indicator(v < lower_m) for v in valid_values])
    else:  # unreachable: require_tokens guarantees a valid row
        for name in ("seq_mean", "seq_std", "seq_max", "seq_min", "seq_max_deviation", "seq_fraction_high"):
            metrics[name] = 0.0
        if is_k1:
            metrics["seq_fraction_low"] = 0.0

    metrics["masked_fraction"] = token_mean([[indicator(not k) for k in v] for v in keep])  # T[1 − keep]
    valid_keep = [v for v in keep if v]
    # over valid rows: share of rows with a rejected masked token
    metrics["seq_masked_fraction"] = plain_mean([indicator(not all(v)) for v in valid_keep]) if valid_keep else 0.0
    return {f"{OFFPOLICY}rollout_rs_{option}_{name}": value for name, value in metrics.items()}


def _final_keep(rows: Sequence[Row], parsed: list[tuple[str, float | None, float]]) -> list[list[bool]]:
    """§3: a masked token survives when every option keeps it (final mask = m × Π keeps)."""
    final = [[True] * len(values) for values in per_token(rows, log_ratio)]
    for option, lower, upper in parsed:
        option_keep = rs_option_keep(rows, option, lower, upper)
        for row_final, row_keep in zip(final, option_keep, strict=True):
            for t, kept in enumerate(row_keep):
                row_final[t] = row_final[t] and kept
    return final


def rs_metrics(rows: Sequence[Row], options: list[str], thresholds: list[str]) -> dict[str, float]:
    """§3 per-option metrics plus the overall rollout_rs_masked_fraction / _seq_masked_fraction."""
    require_tokens(rows)
    parsed = parse_rs(options, thresholds)
    metrics: dict[str, float] = {}
    for option, lower, upper in parsed:
        metrics.update(_rs_option_metrics(rows, option, lower, upper))
    final = _final_keep(rows, parsed)
    metrics[OFFPOLICY + "rollout_rs_masked_fraction"] = token_mean([[indicator(not k) for k in v] for v in final])
    # mean over ALL rows (empty rows count, as 0), unlike the per-option valid-row share
    metrics[OFFPOLICY + "rollout_rs_seq_masked_fraction"] = plain_mean([indicator(not all(v)) for v in final])
    return metrics


def rs_keep(rows: Sequence[Row], options: list[str], thresholds: list[str]) -> list[np.ndarray]:
    """§3 final mask per row: m × Π(option keeps), as 0.0/1.0 float64 arrays."""
    final = _final_keep(rows, parse_rs(options, thresholds))
    return scatter(rows, [[indicator(k) for k in v] for v in final])


# ---------------------------------------------------------------------------
# Our additions beside verl's numbers: IS weights before truncation, asymmetric k1 bounds as written
# ---------------------------------------------------------------------------


def raw_is_summary(rows: Sequence[Row], level: str) -> dict[str, float]:
    """summary/is_raw_*: verl's T[·], population std and ESS formulas, and the extremes, of w_raw over model tokens."""
    raw = raw_is_weights(rows, level)
    values = [w for row in raw for w in row]
    mean = token_mean(raw)
    count = len(values)
    plain = sum(values) / count
    std = math.sqrt(sum((w - plain) ** 2 for w in values) / count) if count > 1 else 0.0
    ess = 1.0 / token_mean([[(w / (mean + 1e-8)) ** 2 for w in row] for row in raw])
    keys = {"mean": mean, "std": std, "min": min(values), "max": max(values), "eff_sample_size": ess}
    return {f"summary/is_raw_{name}": value for name, value in keys.items()}


def k1_as_written(rows: Sequence[Row], option: str, lower: float, upper: float) -> dict[str, float]:
    """summary/k1_as_written_*: what the k1 option would reject keeping ρ in [L, U] as written, which is verl's k1 rule
    with bounds 1/U_1/L (verl keeps −log ρ in [log L, log U])."""
    metrics = rs_metrics(rows, [option], [f"{1.0 / upper!r}_{1.0 / lower!r}"])
    return {
        "summary/k1_as_written_token_fraction": metrics[f"{OFFPOLICY}rollout_rs_{option}_masked_fraction"],
        "summary/k1_as_written_row_fraction": metrics[f"{OFFPOLICY}rollout_rs_{option}_seq_masked_fraction"],
    }
