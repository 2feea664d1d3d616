"""Step anomalies and trends: pure functions over finalized per-step and per-round values."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from rollout_diag import catalogue
from rollout_diag.results import Anomaly, StepResult, Trend, metric_column, step_ids

ANOMALY_METRICS = catalogue.keys_with_role(catalogue.Role.ANOMALY)
# These metrics are positive and heavy-tailed (a step's value is often one token's), so the baseline is robust
# and on a log scale: a step is flagged when its value is
ANOMALY_FACTOR = 3.0  # … above 3 × the median of the previous steps,
ANOMALY_SPREAD = 5.0  # … and its log above the median log + 5 robust spreads (1.4826 × the upper half's MAD),
ANOMALY_WINDOW = 30  # … both taken over at most 30 previous steps …
ANOMALY_MIN_HISTORY = 8  # … once at least 8 exist.
BASELINE_BLOCK = 8192  # steps whose windows are taken at once (_window_baselines)
ANOMALY_KEEP = 50  # the largest flags (by factor) kept in a result; the rest are counted as cut
MAD_TO_SIGMA = 1.4826  # a normal's σ / its median absolute deviation
CHANGE_MIN_SEGMENT = 5  # a drift change point needs 5 steps on each side
CHANGE_MIN_RATIO = 2.0  # … and the later mean at least 2 × the earlier one
CHANGE_MIN_T = 3.0  # … with Welch's t above 3
MIN_ROUND_TOKENS = 30  # rounds with fewer tokens are too noisy to enter the round trend
# The step trends users watch: k3_kl (what the verdict judges), mean |δ| (verl's mismatch/logprob_abs_diff: every
# token counts the same, so a broad rise shows) and k3_kl without the catastrophic tokens (a few of which can make
# k3_kl on their own and hide a broad rise under their noise).
STEP_TREND_METRICS = (
    catalogue.K3_KL.key,
    catalogue.LOGPROB_ABS_DIFF.key,
    catalogue.K3_KL_WITHOUT_CATASTROPHIC.key,
)
TREND_NAMES = {catalogue.LOGPROB_ABS_DIFF.key: "mean |δ|"}
# A rise over steps (rise_test) is said when Spearman's ρ of value with step has a one-sided p-value below
RISE_P = 0.01  # … 1 % …
RISE_MIN_RATIO = 1.5  # … and the last steps' median is at least 1.5 × the first steps' median,
RISE_MIN_STEPS = 8  # … over at least 8 steps.
RISE_PERMUTATIONS = 999  # permutations of the values over the steps that give the p-value …
RISE_EXACT_STEPS = 2000  # … up to this many steps (the normal limit of ρ beyond: permutations would cost n × 999)
RISE_SEED = 0


def log_threshold(history: Sequence[float], spread: float = ANOMALY_SPREAD) -> float | None:
    """median(log x) + spread × 1.4826 × the median of (log x − median) over the upper half, for the positive x of
    ``history``; None when fewer than ANOMALY_MIN_HISTORY are positive.

    The upper half's deviations measure the right tail the flag is about: for a lognormal series this is the
    usual MAD (median ± 5σ), for a Pareto one (log x exponential) it widens with the tail, so stationary
    heavy-tailed noise stays below it (tests/metrics/test_robust_statistics.py measures ≤ 1 % flagged).
    """
    logs = np.log(np.asarray([x for x in history if x > 0], dtype=np.float64))
    if logs.size < ANOMALY_MIN_HISTORY:
        return None
    centre = float(np.median(logs))
    above = logs[logs > centre] - centre
    deviation = float(np.median(above)) if above.size else 0.0
    return centre + spread * MAD_TO_SIGMA * deviation


def find_anomalies(
    steps: Sequence[StepResult],
    metrics: Sequence[str] = ANOMALY_METRICS,
    factor: float = ANOMALY_FACTOR,
    window: int = ANOMALY_WINDOW,
    spread: float = ANOMALY_SPREAD,
) -> list[Anomaly]:
    """Steps whose metric is above ``factor`` × the median of the previous ``window`` steps' values and above
    their robust log-scale threshold (:func:`log_threshold`); ranked by factor, largest first."""
    anomalies = []
    ids = step_ids(steps)
    for metric in metrics:
        present, column = metric_column(steps, metric)  # one column per metric: no walk over the steps' dicts
        kept = np.flatnonzero(present & ~np.isnan(column))
        if kept.shape[0] <= ANOMALY_MIN_HISTORY:
            continue
        values = column[kept]
        baseline, threshold = _window_baselines(values, window, spread)
        with np.errstate(divide="ignore", invalid="ignore"):
            flagged = (baseline > 0) & ~np.isnan(threshold) & (values > factor * baseline)
            flagged &= np.log(np.where(flagged, values, 1.0)) > threshold
        for index in np.flatnonzero(flagged).tolist():
            value = float(values[index])
            anomalies.append(
                Anomaly(int(ids[kept[index]]), metric, value, float(baseline[index]), value / baseline[index])
            )
    return sorted(anomalies, key=lambda a: (-a.factor, a.step, a.metric))


def _window_baselines(values: np.ndarray, window: int, spread: float) -> tuple[np.ndarray, np.ndarray]:
    """For each i, over the previous ``window`` values (NaN where fewer than ANOMALY_MIN_HISTORY): their median and
    :func:`log_threshold` (NaN where it is None), vectorised over i (a run can have 200 000 steps)."""
    count = values.shape[0]
    padded = np.concatenate([np.full(window, np.nan), values])
    recent = np.lib.stride_tricks.sliding_window_view(padded[:-1], window)  # row i: values[i-window:i]
    history = np.minimum(np.arange(count), window)
    baseline = np.full(count, np.nan)
    threshold = np.full(count, np.nan)
    ready = np.flatnonzero(history >= ANOMALY_MIN_HISTORY)
    if not ready.size:
        return baseline, threshold
    # a block of steps at a time: each row's arithmetic is its own, and the [steps, window] temporaries of a long
    # run (200 000 steps: ~50 MB each, five of them) stay a block's size
    for begin in range(0, ready.shape[0], BASELINE_BLOCK):
        at = ready[begin : begin + BASELINE_BLOCK]
        rows = recent[at]
        baseline[at] = _medians(rows)
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.where(rows > 0, np.log(np.where(rows > 0, rows, 1.0)), np.nan)
            centre = _medians(logs)
            above = np.where(logs > centre[:, None], logs - centre[:, None], np.nan)
        deviation = np.nan_to_num(_medians(above), nan=0.0)
        enough = np.count_nonzero(rows > 0, axis=1) >= ANOMALY_MIN_HISTORY
        threshold[at] = np.where(enough, centre + spread * MAD_TO_SIGMA * deviation, np.nan)
    return baseline, threshold


def _medians(rows: np.ndarray) -> np.ndarray:
    """The median of each row's non-NaN values, as statistics.median takes it (NaN for a row without any)."""
    ordered = np.sort(rows, axis=1)  # NaN sorts last
    count = np.count_nonzero(~np.isnan(rows), axis=1)
    low = np.take_along_axis(ordered, np.maximum((count - 1) // 2, 0)[:, None], axis=1)[:, 0]
    high = np.take_along_axis(ordered, np.minimum(count // 2, rows.shape[1] - 1)[:, None], axis=1)[:, 0]
    with np.errstate(invalid="ignore", over="ignore"):
        middle = np.where(count % 2 == 1, high, (low + high) / 2)
    return np.where(count > 0, middle, np.nan)


def keep_largest(anomalies: Sequence[Anomaly], limit: int = ANOMALY_KEEP) -> tuple[list[Anomaly], int]:
    """(the ``limit`` anomalies with the largest factor, how many were cut)."""
    ranked = sorted(anomalies, key=lambda a: (-a.factor, a.step, a.metric))
    return ranked[:limit], max(len(ranked) - limit, 0)


def t_quantile_975(dof: int) -> float:
    """97.5 % quantile of Student's t (Cornish–Fisher expansion; error < 1e-3 for dof ≥ 3)."""
    z = 1.959963984540054
    if dof <= 0:
        return math.inf
    if dof == 1:
        return 12.706204736174698
    if dof == 2:
        return 4.302652729749464
    d = float(dof)
    return (
        z
        + (z**3 + z) / (4 * d)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * d**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * d**3)
        + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * d**4)
    )


def least_squares(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float] | None:
    """(slope, ci_low, ci_high) of y on x with a 95 % t interval; None with fewer than 3 points."""
    n = len(xs)
    if n < 3:
        return None
    # numpy over the points (a run can have 200 000 steps, and three step trends are fitted)
    x, y = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    centred_x = x - x.mean()
    sxx = float(centred_x @ centred_x)
    if sxx == 0:
        return None
    slope = float(centred_x @ (y - y.mean())) / sxx
    intercept = float(y.mean()) - slope * float(x.mean())
    residuals = y - intercept - slope * x
    stderr = math.sqrt(float(residuals @ residuals) / (n - 2) / sxx)
    half = t_quantile_975(n - 2) * stderr
    return slope, slope - half, slope + half


def round_trend(rounds: Sequence[dict[str, Any]]) -> Trend | None:
    """Does mean |δ| grow with the round index? OLS over round means (pooled bucket and rounds < 30 tokens left out)."""
    points = [r for r in rounds if not r["pooled"] and r["token_count"] >= MIN_ROUND_TOKENS]
    fit = least_squares([float(r["round"]) for r in points], [r["logprob_abs_diff_mean"] for r in points])
    if fit is None:
        return None
    slope, low, high = fit
    summary = ""
    if low > 0:
        summary = f"mismatch grows with the turn: mean |δ| +{slope:.3g} per round (95 % CI {low:.3g} to {high:.3g})"
    elif high < 0:
        summary = f"mismatch shrinks with the turn: mean |δ| {slope:.3g} per round (95 % CI {low:.3g} to {high:.3g})"
    # named as the per-round quantity it fits over the rounds: per_round/logprob_abs_diff_mean
    metric = catalogue.ROUNDS_PREFIX + catalogue.round_quantity(catalogue.ROUND_ABS_DIFF_MEAN)
    return Trend(metric, "round", slope, low, high, len(points), summary)


def step_trends(steps: Sequence[StepResult], resumes: Mapping[int, int] | None = None) -> list[Trend]:
    """The step trend of each metric users watch (STEP_TREND_METRICS), those with at least 3 steps; ``resumes``
    (step → the resume it follows, ``decisions.resume.resume_windows``) are left out of the fit and said."""
    return [t for t in (step_trend(steps, metric, resumes) for metric in STEP_TREND_METRICS) if t is not None]


def label_resumes(anomalies: Sequence[Anomaly], resumes: Mapping[int, int]) -> list[Anomaly]:
    """Anomalies on the steps right after a resume, labelled with it (a restart's transient, not a spike)."""
    return [replace(a, resume=resumes[a.step]) if a.step in resumes else a for a in anomalies]


def _left_out(resumes: Mapping[int, int]) -> str:
    """ " (steps 90–92 after the resume at step 90 left out)" for the resumes of a trend's steps."""
    by_resume: dict[int, list[int]] = {}
    for step, resume in sorted(resumes.items()):
        by_resume.setdefault(resume, []).append(step)
    parts = [
        f"step{'s' if len(steps) > 1 else ''} {steps[0]}{f'–{steps[-1]}' if len(steps) > 1 else ''} after the resume "
        f"at step {resume}"
        for resume, steps in by_resume.items()
    ]
    return f" ({'; '.join(parts)} left out)"


def step_trend(
    steps: Sequence[StepResult], metric: str = catalogue.K3_KL.key, resumes: Mapping[int, int] | None = None
) -> Trend | None:
    """Slope of ``metric`` over steps (least squares, 95 % CI), its rank-correlation rise test (:func:`rise_test`),
    and the step after which it rose, when the data shows a change point; None with fewer than 3 steps.

    The change point is the split (≥ 5 steps each side) that minimises the within-segment squared error;
    it is reported only when the later mean is ≥ 2 × the earlier one with Welch's t > 3. Without one, a rise that
    passes :func:`rise_test` is the summary: "mean |δ| up 2.5× from step 0 to 44 (…)".
    """
    present, column = metric_column(steps, metric)
    kept = present & np.isfinite(column)
    note = ""
    if resumes:  # a restart's transient is no trend: its steps leave the fit
        all_ids = step_ids(steps)
        kept &= ~np.isin(all_ids, np.fromiter(resumes, dtype=np.int64))
        note = _left_out(resumes)
    ids = step_ids(steps)[kept].astype(np.float64)
    values = column[kept]
    fit = least_squares(ids, values)
    if fit is None:
        return None
    slope, low, high = fit
    rise = rise_test(ids, values)
    name = trend_name(metric)
    summary = ""
    change = change_point(values.tolist())
    if change is not None:
        index, before, after, t = change
        summary = (
            f"{name} rising since step {int(ids[index])}: mean {after:.3g} from there "
            f"vs {before:.3g} before ({after / before:.1f}×, Welch t = {t:.1f})"
        )
    if rise is None:
        return Trend(metric, "step", slope, low, high, int(ids.shape[0]), summary + note if summary else summary)
    headline = ""
    if rise["rising"]:
        headline = f"{name} up {_times(rise['ratio'])}× from step {rise['first_step']} to {rise['last_step']}"
        summary = summary or (
            f"{headline} (median of the first {rise['window']} steps {rise['level_before']:.3g} → of the last "
            f"{rise['window']} {rise['level_after']:.3g}; Spearman ρ = {rise['rank_correlation']:.2f}, "
            f"{rise['test']} p = {rise['p_value']:.2g})"
        )
    summary = summary + note if summary else summary
    return Trend(metric, "step", slope, low, high, int(ids.shape[0]), summary, headline=headline, **_rise_fields(rise))


def _times(ratio: float) -> str:
    """A ratio as a sentence says it: 2.5, 18, 120 (two significant digits, no exponent)."""
    return f"{ratio:.2g}" if ratio < 10 else f"{ratio:.0f}"


def trend_name(metric: str) -> str:
    """How a trend sentence names ``metric`` ("mean |δ|" for mismatch/logprob_abs_diff, else its short name)."""
    return TREND_NAMES.get(metric, catalogue.short_name(metric))


def _rise_fields(rise: dict[str, Any]) -> dict[str, Any]:
    return {key: rise[key] for key in ("rank_correlation", "p_value", "level_before", "level_after", "ratio")}


def rise_test(steps: np.ndarray, values: np.ndarray) -> dict[str, Any] | None:
    """Whether ``values`` rise over ``steps``; None with fewer than RISE_MIN_STEPS points.

    The test: Spearman's rank correlation ρ of value with step, one-sided p-value from RISE_PERMUTATIONS random
    permutations of the values over the steps (seeded: the same data gives the same p) up to
    RISE_EXACT_STEPS steps, from the normal limit ρ·√(n−1) beyond; and the size: the median of the last w steps
    over the median of the first w (w = max(3, n // 10); medians, so a few catastrophic steps neither make nor
    hide a rise). Rising = p < RISE_P and ratio ≥ RISE_MIN_RATIO.
    """
    count = int(values.shape[0])
    if count < RISE_MIN_STEPS:
        return None
    order = np.argsort(steps, kind="stable")
    steps, values = steps[order], values[order]
    step_ranks, value_ranks = _ranks(steps), _ranks(values)
    rho = _pearson(step_ranks, value_ranks)
    if count <= RISE_EXACT_STEPS:
        rng = np.random.default_rng(RISE_SEED)
        shuffled = rng.permuted(np.broadcast_to(value_ranks, (RISE_PERMUTATIONS, count)), axis=1)
        centred = step_ranks - step_ranks.mean()
        scale = math.sqrt(float(centred @ centred) * float(((value_ranks - value_ranks.mean()) ** 2).sum()))
        null = (shuffled - value_ranks.mean()) @ centred / scale if scale > 0 else np.zeros(RISE_PERMUTATIONS)
        p_value = (1 + int(np.count_nonzero(null >= rho - 1e-12))) / (RISE_PERMUTATIONS + 1)
        test = "permutation"
    else:
        p_value = 0.5 * math.erfc(rho * math.sqrt(count - 1) / math.sqrt(2))
        test = "normal-approximation"
    window = max(3, count // 10)
    before, after = float(np.median(values[:window])), float(np.median(values[-window:]))
    ratio = after / before if before > 0 else math.inf if after > 0 else math.nan
    return {
        "rank_correlation": rho,
        "p_value": p_value,
        "test": test,
        "window": window,
        "level_before": before,
        "level_after": after,
        "ratio": ratio,
        "first_step": int(steps[0]),
        "last_step": int(steps[-1]),
        "rising": bool(p_value < RISE_P and ratio >= RISE_MIN_RATIO and math.isfinite(ratio)),
    }


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n with ties given their average rank (as Spearman's ρ takes them)."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts = np.flatnonzero(np.concatenate([[True], ordered[1:] != ordered[:-1]]))
    ends = np.concatenate([starts[1:], [ordered.shape[0]]])
    average = (starts + ends + 1) / 2.0  # mean of the 1-based ranks start+1 … end
    ranks = np.empty(values.shape[0], dtype=np.float64)
    ranks[order] = np.repeat(average, ends - starts)
    return ranks


def _pearson(left: np.ndarray, right: np.ndarray) -> float:
    left, right = left - left.mean(), right - right.mean()
    scale = math.sqrt(float(left @ left) * float(right @ right))
    return float(left @ right) / scale if scale > 0 else 0.0


def change_point(values: Sequence[float]) -> tuple[int, float, float, float] | None:
    """(first index after the split, mean before, mean after, Welch t) for a significant rise, else None."""
    n = len(values)
    if n < 2 * CHANGE_MIN_SEGMENT:
        return None
    # Within-segment squared error for every split at once, from prefix sums (values are centred first).
    centred = np.asarray(values, dtype=np.float64) - float(np.mean(values))
    total, total_sq = np.cumsum(centred), np.cumsum(centred * centred)
    splits = np.arange(CHANGE_MIN_SEGMENT, n - CHANGE_MIN_SEGMENT + 1)
    left_n, right_n = splits.astype(np.float64), (n - splits).astype(np.float64)
    left_sum, left_sq = total[splits - 1], total_sq[splits - 1]
    right_sum, right_sq = total[-1] - left_sum, total_sq[-1] - left_sq
    sse = (left_sq - left_sum**2 / left_n) + (right_sq - right_sum**2 / right_n)
    split = int(splits[int(np.argmin(sse))])
    # numpy's two-pass moments (statistics.variance is exact but takes ~0.2 s per 100 000 steps, and three
    # metrics are trended now)
    before, after = np.asarray(values[:split], dtype=np.float64), np.asarray(values[split:], dtype=np.float64)
    mean_before, mean_after = float(before.mean()), float(after.mean())
    spread = math.sqrt(float(before.var(ddof=1)) / before.shape[0] + float(after.var(ddof=1)) / after.shape[0])
    t = (mean_after - mean_before) / spread if spread > 0 else math.inf
    if mean_before > 0 and mean_after >= CHANGE_MIN_RATIO * mean_before and t > CHANGE_MIN_T:
        return split, mean_before, mean_after, t
    return None
