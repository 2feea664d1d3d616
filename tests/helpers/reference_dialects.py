"""Slow, obvious float64 reference for every dialect (``rollout_diag/metrics/dialects/``).

Written from each framework's own code (the files and commits cited in the dialect modules), not from the
accumulators: each function lays the batch out as the framework sees it (a list of rows, or a padded matrix
where the framework pads) and repeats its arithmetic with plain loops over Python floats.

``rows``: a list of ``(trainer, rollout, mask)`` tuples of 1-D float64 arrays, one per sequence; all rows together
are one batch (one step). a = trainer, r = rollout logprob, δ = a − r. Every function returns ``{}`` for a
batch without any masked token (rollout-diag reports no metrics for such a step).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from helpers.reference import debug_metrics, offpolicy_metrics

Row = tuple[np.ndarray, np.ndarray, np.ndarray]


def masked(rows: Sequence[Row]) -> list[list[tuple[float, float]]]:
    """Per row, the (a, r) pairs of its masked tokens in order."""
    return [[(float(a[t]), float(r[t])) for t in range(len(m)) if m[t] == 1] for a, r, m in rows]


def flat(rows: Sequence[Row]) -> list[tuple[float, float]]:
    return [pair for row in masked(rows) for pair in row]


def total(values) -> float:
    out = 0.0
    for value in values:
        out += value
    return out


def unbiased_std(values: list[float]) -> float:
    """torch.Tensor.std: n − 1 in the denominator, NaN for one value."""
    if len(values) < 2:
        return math.nan
    mean = total(values) / len(values)
    return math.sqrt(total((v - mean) ** 2 for v in values) / (len(values) - 1))


def mean(values: Sequence[float]) -> float:
    return total(values) / len(values)


STATISTICS = {"mean": mean, "avg": mean, "std": unbiased_std, "min": min, "max": max}


def statistics(prefix: str, values: list[float], *names: str) -> dict[str, float]:
    """``<prefix>/<name>`` for each statistic ``names`` (mean or avg, std, min, max) of ``values``, in that order."""
    return {f"{prefix}/{name}": STATISTICS[name](values) for name in names}


def k3(x: float) -> float:
    return math.exp(x) - x - 1.0


# -------------------------------------------------------------------------------------------------- verl
def verl(rows: Sequence[Row]) -> dict[str, float]:
    """verl's names: tests/helpers/reference.py's §1 and §5 (checked there), plus the row means over valid rows."""
    tokens = flat(rows)
    if not tokens:
        return {}
    out = dict(offpolicy_metrics(rows))
    out.update(debug_metrics(rows))
    valid = [row for row in masked(rows) if row]
    diffs, values = [], {name: [] for name in ("training_ppl", "training_log_ppl", "rollout_ppl", "rollout_log_ppl")}
    more = {name: [] for name in ("log_ppl_diff", "log_ppl_abs_diff", "ppl_ratio", "chi2_seq")}
    for row in valid:
        mean_a = total(a for a, _ in row) / (len(row) + 1e-8)
        mean_r = total(r for _, r in row) / (len(row) + 1e-8)
        values["training_ppl"].append(math.exp(-mean_a))
        values["training_log_ppl"].append(-mean_a)
        values["rollout_ppl"].append(math.exp(-mean_r))
        values["rollout_log_ppl"].append(-mean_r)
        d = mean_r - mean_a
        diffs.append(d)
        more["log_ppl_diff"].append(d)
        more["log_ppl_abs_diff"].append(abs(d))
        more["ppl_ratio"].append(math.exp(d))
        seq = total(a - r for a, r in row)
        more["chi2_seq"].append(math.exp(2.0 * min(max(seq, -20.0), 20.0)))
    for name, series in {**values, **more}.items():
        out[f"rollout_corr/{name}@valid_rows"] = total(series) / len(series)
    out["rollout_corr/chi2_seq@valid_rows"] -= 1.0
    out["rollout_corr/log_ppl_diff_max@valid_rows"] = max(diffs)
    out["rollout_corr/log_ppl_diff_min@valid_rows"] = min(diffs)
    return out


# ---------------------------------------------------------------------------------------------- prime-rl
def prime_rl(
    rows: Sequence[Row], advantages: Sequence[float | None] | None = None, envs: Sequence[str | None] | None = None
) -> dict[str, float]:
    """loss.py: mismatch_kl = exp(δ) − δ − 1 at loss_mask tokens; utils.py: mean / std / min / max of all of them.

    With ``advantages`` (one per row, None for a row that is no sample): default_loss_fn per sample, then the same
    statistics over samples. With ``envs`` (one per row): train.py's mismatch_kl/<env>, the tokens of that
    environment's rows."""
    values = [k3(a - r) for a, r in flat(rows)]
    if not values:
        return {}
    out = statistics("mismatch_kl/all", values, "mean", "std", "min", "max")
    if advantages is not None:
        samples: dict[str, list[float]] = {
            name: []
            for name in (
                "masked_mismatch_kl",
                "unmasked_mismatch_kl",
                "is_masked",
                "is_masked_low",
                "is_masked_high",
                "masked_advantage_positive",
                "masked_advantage_negative",
            )
        }
        for pairs, advantage in zip(masked(rows), advantages, strict=True):
            # no advantage: no sample of these statistics; no trained token: compute_loss skips the sample
            # (``if bool(rl_mask.any())``: a filtered row's rl weights are all 0), it does not count as 0
            if advantage is None or not pairs:
                continue
            adv = float(advantage)
            n = n_masked = n_low = n_high = masked_positive = masked_negative = 0
            kl_masked = kl_kept = 0.0
            for a, r in pairs:
                probs_diff = math.exp(a) - math.exp(r)
                high, low = probs_diff > 0.2, probs_diff < -0.2
                is_masked = high if adv > 0 else low  # torch.where(advantages > 0, high, low)
                n += 1
                n_masked += is_masked
                n_high += adv > 0 and high
                n_low += adv < 0 and low
                if is_masked:
                    kl_masked += k3(a - r)
                    masked_positive += adv > 0
                    masked_negative += adv < 0
                else:
                    kl_kept += k3(a - r)
            # _safe_mean: Σ over the mask / max(count, 1)
            samples["masked_mismatch_kl"].append(kl_masked / max(n_masked, 1))
            samples["unmasked_mismatch_kl"].append(kl_kept / max(n - n_masked, 1))
            samples["is_masked"].append(n_masked / max(n, 1))
            samples["is_masked_low"].append(n_low / max(n, 1))
            samples["is_masked_high"].append(n_high / max(n, 1))
            # _safe_mean(advantages > 0 / < 0, drop_mask = loss_mask & is_masked)
            samples["masked_advantage_positive"].append(masked_positive / max(n_masked, 1))
            samples["masked_advantage_negative"].append(masked_negative / max(n_masked, 1))
        for name, series in samples.items() if any(samples.values()) else ():
            out.update(statistics(name, series, "mean", "std", "min", "max"))
    if envs is not None:
        by_env: dict[str, list[float]] = {}
        for pairs, env in zip(masked(rows), envs, strict=True):
            if env is not None:
                by_env.setdefault(env, []).extend(k3(a - r) for a, r in pairs)
        for env, series in sorted(by_env.items()):
            if series:
                out.update(statistics(f"mismatch_kl/{env}", series, "mean", "std", "min", "max"))
    return out


# ----------------------------------------------------------------------------------------------- NeMo-RL
def nemo_rl(rows: Sequence[Row]) -> dict[str, float]:
    """loss_functions.py ClippedPGLossFn: masked_mean(x, mask, global_valid_toks) = Σ/(N + 1e-8); grpo.py for the
    per-sequence error (valid sequences) and the 1.05 alert."""
    tokens = flat(rows)
    if not tokens:
        return {}
    n = len(tokens)
    mult = total(math.exp(abs(r - a)) for a, r in tokens) / (n + 1e-8)
    # calculate_kl(logprobs, reference, k3): logr = reference − logprobs, kl = exp(logr) − 1 − logr
    gen_kl = total(math.exp(a - r) - 1 - (a - r) for a, r in tokens) / (n + 1e-8)  # logprobs = r, reference = a
    policy_kl = total(math.exp(r - a) - 1 - (r - a) for a, r in tokens) / (n + 1e-8)  # logprobs = a, reference = r
    js_terms = []
    for a, r in tokens:
        mixture = math.log(0.5 * math.exp(a) + 0.5 * math.exp(r))
        js_terms.append(0.5 * k3(a - mixture) + 0.5 * k3(r - mixture))
    js = total(js_terms) / (n + 1e-8)
    # "Off-policy (actor) importance-sampling correction", token level: nan_to_num(exp(prev − generation)) with
    # posinf → 0; "Metric: sampling importance ratio": masked_mean over mask with global_valid_toks
    weights = []
    for a, r in tokens:
        try:
            weights.append(math.exp(a - r))
        except OverflowError:
            weights.append(0.0)
    sampling_ratio = total(weights) / (n + 1e-8)
    per_seq = [total(math.exp(abs(r - a)) for a, r in row) / max(len(row), 1) for row in masked(rows) if row]
    return {
        "train/token_mult_prob_error": mult,
        "train/gen_kl_error": gen_kl,
        "train/policy_kl_error": policy_kl,
        "train/js_divergence_error": js,
        "train/sampling_importance_ratio": sampling_ratio,
        "train/max_seq_mult_prob_error": max(per_seq),
        "train/mean_seq_mult_prob_error": total(per_seq) / len(per_seq),
        "train/min_seq_mult_prob_error": min(per_seq),
        "alert: token_mult_prob_error > 1.05": 1.0 if mult > 1.05 else 0.0,
    }


# ------------------------------------------------------------------------------------------------- slime
def slime(rows: Sequence[Row]) -> dict[str, float]:
    """cp_utils.get_sum_of_sample_mean: Σ_i (Σ m·x)/clamp_min(n_i, 1); divided by the global batch size (samples),
    or with --calculate-per-token-loss the token sum divided by num_tokens = Σ_i clamp_min(n_i, 1)."""
    per_row = masked(rows)
    if not any(per_row):
        return {}
    sample_means = [total(abs(a - r) for a, r in row) / max(len(row), 1) for row in per_row]
    token_sum = total(abs(a - r) for row in per_row for a, r in row)
    num_tokens = total(max(len(row), 1) for row in per_row)
    return {
        "train/train_rollout_logprob_abs_diff": total(sample_means) / len(per_row),
        "train/train_rollout_logprob_abs_diff (--calculate-per-token-loss)": token_sum / num_tokens,
    }


# ------------------------------------------------------------------------------------------------- SkyRL
def skyrl(rows: Sequence[Row]) -> dict[str, float]:
    """trainer.py: |rollout − action| at loss_mask > 0; off_policy_correction_utils.py: is_ratio over the padded
    [B, L] tensor (L = longest row), is_ratio * loss_mask for std / max / min, masked_mean for the mean."""
    tokens = flat(rows)
    if not tokens:
        return {}
    diffs = [abs(r - a) for a, r in tokens]
    longest = max(len(m) for _, _, m in rows)
    padded: list[float] = []  # is_ratio * loss_mask, cell by cell
    for a, r, m in rows:
        for t in range(longest):
            if t < len(m) and m[t] == 1:
                padded.append(math.exp(min(max(float(a[t]) - float(r[t]), -20.0), 20.0)))
            else:
                padded.append(0.0)
    ratios = [math.exp(min(max(a - r, -20.0), 20.0)) for a, r in tokens]
    return {
        "policy/rollout_train_logprobs_abs_diff_mean": total(diffs) / len(diffs),
        "policy/rollout_train_logprobs_abs_diff_std": unbiased_std(diffs),
        "policy/rollout_train_logprobs_abs_diff_max": max(diffs),
        "policy/rollout_train_logprobs_abs_diff_min": min(diffs),
        "policy/loss_metrics/is_ratio_mean": total(ratios) / max(len(ratios), 1),
        "policy/loss_metrics/is_ratio_std": unbiased_std(padded),
        "policy/loss_metrics/is_ratio_max": max(padded),
        "policy/loss_metrics/is_ratio_min": min(padded),
    }


# --------------------------------------------------------------------------------------------------- TRL
def trl(rows: Sequence[Row], clip_max: float = 3.0) -> dict[str, float]:
    """grpo_trainer.py, mode sequence_mask: per sequence exp(Σ (old − sampling)·mask), 0 above clip_max; the
    ratio statistics over every sequence, the |δ| statistics over masked tokens."""
    tokens = flat(rows)
    if not tokens:
        return {}
    deltas = [abs(a - r) for a, r in tokens]
    sequence_ratios = []
    for row in masked(rows):
        try:
            ratio = math.exp(total(a - r for a, r in row))
        except OverflowError:
            ratio = math.inf
        sequence_ratios.append(0.0 if ratio > clip_max else ratio)
    return {
        **statistics("sampling/sampling_logp_difference", deltas, "mean", "max"),
        **statistics("sampling/importance_sampling_ratio", sequence_ratios, "min", "mean", "max"),
    }


# -------------------------------------------------------------------------------------------------- ROLL
def roll_segments(m: np.ndarray) -> list[tuple[int, int]]:
    """compute_segment_masked_mean: [start, end) of every maximal run of mask 1."""
    out, start = [], None
    for t in range(len(m)):
        if m[t] == 1 and start is None:
            start = t
        if m[t] != 1 and start is not None:
            out.append((start, t))
            start = None
    if start is not None:
        out.append((start, len(m)))
    return out


def roll(rows: Sequence[Row]) -> dict[str, float]:
    """train_infer_corrections.py: per-token tensors at four granularities, each reduced by agg_loss
    seq-mean-token-mean: Σ over rows with a masked token of masked_mean(row) / (max(valid rows, 1) + 1e-8)."""
    if not flat(rows):
        return {}
    levels = ("token", "geometric", "sequence", "segment")
    sums = {f"{kind}_{level}": 0.0 for kind in ("ratio", "diff") for level in levels}
    valid_rows = 0
    for a, r, m in rows:
        length = len(m)
        n = sum(1 for t in range(length) if m[t] == 1)
        if n == 0:
            continue  # masked_mean(dim=-1) is 0 and valid_samples weighs it 0
        valid_rows += 1
        log_ratio = [float(a[t]) - float(r[t]) for t in range(length)]
        diff = [math.exp(float(a[t])) - math.exp(float(r[t])) for t in range(length)]
        tensors: dict[str, list[float]] = {}
        geo = total(log_ratio[t] for t in range(length) if m[t] == 1) / (n + 1e-8)
        seq = total(log_ratio[t] for t in range(length) if m[t] == 1)
        diff_geo = total(diff[t] for t in range(length) if m[t] == 1) / (n + 1e-8)
        diff_seq = total(diff[t] for t in range(length) if m[t] == 1)
        tensors["ratio_token"] = [math.exp(x) for x in log_ratio]
        tensors["ratio_geometric"] = [math.exp(geo)] * length
        tensors["ratio_sequence"] = [math.exp(seq)] * length
        tensors["diff_token"] = diff
        tensors["diff_geometric"] = [diff_geo] * length
        tensors["diff_sequence"] = [diff_seq] * length
        segment_log, segment_diff = [0.0] * length, [0.0] * length
        for start, end in roll_segments(m):
            span = end - start
            mean_log = total(log_ratio[start:end]) / (span + 1e-8)
            mean_diff = total(diff[start:end]) / (span + 1e-8)
            for t in range(start, end):
                segment_log[t], segment_diff[t] = mean_log, mean_diff
        tensors["ratio_segment"] = [math.exp(x) for x in segment_log]
        tensors["diff_segment"] = segment_diff
        for name, values in tensors.items():
            sums[name] += total(values[t] for t in range(length) if m[t] == 1) / (n + 1e-8)
    denominator = max(float(valid_rows), 1.0) + 1e-8
    return {f"actor/train_infer_{name}_mean": value / denominator for name, value in sums.items()}


# ------------------------------------------------------------------------------------------------- AReaL
def areal(rows: Sequence[Row], upper: float = 5.0) -> dict[str, float]:
    """AReaL at 4aef98d (``areal@4aef98d``), in float64: functional.py apply_rejection_sampling (token, mask,
    ratio ≤ upper) and ppo_actor_loss_fn; stats_tracker:
    avg / min / max over the kept tokens, nothing when none is kept."""
    kept = [(a - r) for a, r in flat(rows) if math.exp(a - r) <= upper]
    if not flat(rows) or not kept:
        return {}
    weights = [math.exp(x) for x in kept]
    return {
        **statistics("ppo_actor/update/behave_approx_kl", kept, "avg", "min", "max"),
        **statistics("ppo_actor/update/behave_imp_weight", weights, "avg", "min", "max"),
    }


# ---------------------------------------------------------------------------------------------- OpenRLHF
def openrlhf(rows: Sequence[Row]) -> dict[str, float]:
    """loss.py: masked_mean(rollout − old, action_mask) = Σ/N."""
    tokens = flat(rows)
    if not tokens:
        return {}
    return {"train/vllm_kl": total(r - a for a, r in tokens) / len(tokens)}


def prime_rl_ipo(rows: Sequence[Row], envs: Sequence[str | None] | None = None) -> dict[str, float]:
    """loss.py ipo_loss_fn (prime-rl 559b447, #2798) with IPOLossConfig's ipo_threshold 0.1: is_masked =
    |exp(a) − exp(r)| > 0.1 on both sides, no advantage read; per sample (a row with a trained token) _safe_mean of
    k3 over masked / kept tokens and of is_masked; then mean / std / min / max over the samples."""
    out = {k: v for k, v in prime_rl(rows, None, envs).items()}
    if not out:
        return {}
    samples: dict[str, list[float]] = {"masked_mismatch_kl": [], "unmasked_mismatch_kl": [], "is_masked": []}
    for pairs in masked(rows):
        if not pairs:
            continue
        masked_kl = [k3(a - r) for a, r in pairs if abs(math.exp(a) - math.exp(r)) > 0.1]
        kept_kl = [k3(a - r) for a, r in pairs if not abs(math.exp(a) - math.exp(r)) > 0.1]
        samples["masked_mismatch_kl"].append(total(masked_kl) / max(len(masked_kl), 1))
        samples["unmasked_mismatch_kl"].append(total(kept_kl) / max(len(kept_kl), 1))
        samples["is_masked"].append(len(masked_kl) / len(pairs))
    for name, series in samples.items():
        out.update(statistics(name, series, "mean", "std", "min", "max"))
    return out


# ------------------------------------------------------------------------------------ AReaL @ cbff54d
def f32(x: float) -> np.float32:
    return np.float32(x)


def exp32(x: np.float32) -> np.float32:
    """float32 exp, correctly rounded (the float64 exp rounded), as the dialect takes it."""
    with np.errstate(all="ignore"):
        return np.float32(np.exp(np.float64(x)))


def log32(x: np.float32) -> np.float32:
    with np.errstate(all="ignore"):
        return np.float32(np.log(np.float64(x)))


def areal_binary_kl(log_p: np.float32, log_q: np.float32) -> np.float32:
    """functional.py compute_binary_kl_divergence, one token in float32: clamp(exp(·), 1e-8, 1 − 1e-8)."""
    with np.errstate(all="ignore"):
        p = min(max(exp32(log_p), f32(1e-8)), f32(1.0 - 1e-8))  # f32(1 − 1e-8) == 1.0
        q = min(max(exp32(log_q), f32(1e-8)), f32(1.0 - 1e-8))
        return p * log32(p / q) + (f32(1) - p) * log32((f32(1) - p) / (f32(1) - q))


def areal_cbff54d(
    rows: Sequence[Row], metric: str = "ratio", upper: float = 5.0, level: str = "token"
) -> dict[str, float]:
    """AReaL cbff54d: apply_rejection_sampling (action mask, agg mean), ppo_actor_loss_fn, grpo_loss_fn's stats
    and _log_proximal_approximation_stats, stats_tracker's avg / min / max (None, so absent, for an empty
    denominator or an infinite min / max) and scalars; every per-token value a float32 as AReaL's tensors are."""
    tokens = []  # (x, kept, nan_score) per loss-mask token, x = float32(a) − float32(r)
    positions = 0
    for a, r, m in rows:
        positions += len(m)
        row = [(f32(a[t]), f32(r[t])) for t in range(len(m)) if m[t] == 1]
        scores = []
        for a32, r32 in row:
            x = a32 - r32
            log_ratio = x if np.isfinite(x) else f32(0)
            ratio = exp32(log_ratio)
            if metric == "ratio":
                scores.append((ratio, log_ratio))
            else:
                kl = areal_binary_kl(a32, r32)
                rev = areal_binary_kl(r32, a32)
                scores.append((f32("nan") if np.isnan(kl) or np.isnan(rev) else max(kl, rev), log_ratio))
        if level == "sequence" and row:
            if metric == "ratio":
                mean_log = f32(sum(float(lr) for _, lr in scores) / len(scores))
                seq_metric = exp32(mean_log)
            else:
                seq_metric = f32(sum(float(v) for v, _ in scores) / len(scores))
            scores = [(seq_metric, mean_log if metric == "ratio" else lr) for _, lr in scores]
        for (a32, r32), (value, log_ratio) in zip(row, scores, strict=True):
            kept = bool(value <= f32(upper))
            weight = exp32(log_ratio) if kept else f32(0)
            tokens.append((a32 - r32, kept, bool(np.isnan(value)), weight))
    if not tokens:
        return {}
    behave = [(x, w) for x, kept, _, w in tokens if kept and w > 0]
    stats: dict[str, list[float]] = {
        "logp_diff": [float(-x) for x, *_ in tokens],
        "logp_abs_diff": [float(abs(-x)) for x, *_ in tokens],
        "behave_imp_weight": [float(w) for _, w in behave],
        "behave_approx_kl": [float(x) for x, _ in behave],
        "behave_filtered_ratio": [0.0 if kept and w > 0 else 1.0 for _, kept, _, w in tokens],
        "compute_logp/kl_div_direct": [float(-x) for x, _ in behave],
        "compute_logp/kl_div_taylor": [float(x * x / f32(2)) for x, _ in behave],
    }
    with np.errstate(over="ignore", invalid="ignore"):
        stats["compute_logp/kl_div_dual"] = [float(exp32(x) - f32(1) - x) for x, _ in behave]
    out: dict[str, float] = {}
    dropped = 0
    for name in (
        "logp_diff",
        "logp_abs_diff",
        "behave_imp_weight",
        "behave_approx_kl",
        "behave_filtered_ratio",
    ):
        dropped += areal_avg_min_max(out, name, stats[name])
    n = len(tokens)
    out["ppo_actor/update/masked_token_ratio"] = 1.0 - n / max(positions, 1)
    out["ppo_actor/update/rs_filtered_fraction"] = sum(not kept for _, kept, _, _ in tokens) / n
    for name in ("compute_logp/kl_div_direct", "compute_logp/kl_div_taylor", "compute_logp/kl_div_dual"):
        dropped += areal_avg_min_max(out, name, stats[name])
    out["note: tokens AReaL filters for a NaN binary-KL score (a logprob of 0.0)"] = float(
        sum(nan and not kept for _, kept, nan, _ in tokens)
    )
    out["note: kept tokens whose float32 weight underflows to 0 (counted as filtered)"] = float(
        sum(kept and not w > 0 for _, kept, _, w in tokens)
    )
    out["note: infinite /min or /max values AReaL drops"] = float(dropped)
    return out


def areal_avg_min_max(out: dict[str, float], name: str, values: list[float]) -> int:
    """stats_tracker: avg / min / max under ppo_actor/update/<name>; returns how many infinite extremes it drops."""
    if not values:
        return 0
    key = "ppo_actor/update/" + name
    out[key + "/avg"] = total(values) / len(values)
    dropped = 0
    for statistic, value in (("min", min(values)), ("max", max(values))):
        if math.isinf(value):
            dropped += 1
        else:
            out[f"{key}/{statistic}"] = value
    return dropped


# ------------------------------------------------------------------------------------ verl @ b178a3c
def verl_b178a3c(rows: Sequence[Row], level: str = "token", threshold: float = 2.0) -> dict[str, float]:
    """verl b178a3c rollout_corr_helper.py compute_rollout_correction_weights + compute_is_metrics: every metric on
    w_raw = exp(clamp(·, −20, 20))·mask before truncation; std / ESS on clamp(w_raw, 1/U, U); seq_* on
    masked_mean(w_raw, mask, axis=−1) over all rows (Σ/(n + 1e-8)). Plus verl's other keys (``verl``)."""
    out = verl(rows)
    if not out:
        return {}
    upper, lower = threshold, 1.0 / threshold
    clamp = lambda x: min(max(x, -20.0), 20.0)  # noqa: E731
    weights: list[list[float]] = []  # w_raw per masked token, per row
    log_sums = []
    for pairs in masked(rows):
        s = total(a - r for a, r in pairs)
        log_sums.append(s)
        if level == "token":
            weights.append([math.exp(clamp(a - r)) for a, r in pairs])
        else:
            weights.append([math.exp(clamp(s))] * len(pairs))
    flat_w = [w for row in weights for w in row]
    n = len(flat_w)
    is_metrics = {"rollout_is_mean": total(flat_w) / (n + 1e-8)}
    if level == "token":
        is_metrics["rollout_is_ratio_fraction_high"] = sum(w > upper for w in flat_w) / (n + 1e-8)
        is_metrics["rollout_is_ratio_fraction_low"] = sum(w < lower for w in flat_w) / (n + 1e-8)
        is_metrics["rollout_is_max"] = max(flat_w)
        is_metrics["rollout_is_min"] = min(flat_w)
    else:
        is_metrics["rollout_is_max"] = math.exp(min(max(log_sums), 20.0))
        is_metrics["rollout_is_min"] = math.exp(min(log_sums))
        is_metrics["rollout_is_ratio_fraction_high"] = sum(s > math.log(upper) for s in log_sums) / len(log_sums)
        is_metrics["rollout_is_ratio_fraction_low"] = sum(s < math.log(lower) for s in log_sums) / len(log_sums)
    clamped = [min(max(w, lower), upper) for w in flat_w]
    mean_c = total(clamped) / n
    # population std (rollout-diag's centred form of verl's T[c²] − T[c]², METRICS.md §2), 0 for one token
    is_metrics["rollout_is_std"] = math.sqrt(total((c - mean_c) ** 2 for c in clamped) / n) if n > 1 else 0.0
    t_c = total(clamped) / (n + 1e-8)
    is_metrics["rollout_is_eff_sample_size"] = 1.0 / (total((c / (t_c + 1e-8)) ** 2 for c in clamped) / (n + 1e-8))
    q = [total(row) / (len(row) + 1e-8) for row in weights]
    mean_q = total(q) / len(q)
    is_metrics["rollout_is_seq_mean"] = mean_q
    is_metrics["rollout_is_seq_std"] = unbiased_std(q) if len(q) > 1 else 0.0
    is_metrics["rollout_is_seq_max"] = max(q)
    is_metrics["rollout_is_seq_min"] = min(q)
    is_metrics["rollout_is_seq_max_deviation"] = max(abs(v - 1.0) for v in q)
    is_metrics["rollout_is_seq_fraction_high"] = sum(v > upper for v in q) / len(q)
    is_metrics["rollout_is_seq_fraction_low"] = sum(v < lower for v in q) / len(q)
    return {**out, **{"rollout_corr/" + name: value for name, value in is_metrics.items()}}


REFERENCES = {
    "verl": verl,
    "prime-rl": prime_rl,
    "nemo-rl": nemo_rl,
    "slime": slime,
    "skyrl": skyrl,
    "trl": trl,
    "roll": roll,
    "areal": areal_cbff54d,
    "openrlhf": openrlhf,
    "verl@b178a3c": verl_b178a3c,
    "verl@b178a3c:seq": lambda rows: verl_b178a3c(rows, "sequence"),
    "prime-rl:ipo": prime_rl_ipo,
    "areal:kpop": lambda rows: areal_cbff54d(rows, "binary_kl", 2.0),
    "areal@4aef98d": areal,
}
