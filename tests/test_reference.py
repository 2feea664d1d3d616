"""Hand-computed checks of the float64 reference in tests/helpers/reference.py.

Every expected number is derived by hand from METRICS.md; the arithmetic sits in a comment
next to it.  E = 1e-8 is the masked-mean denominator guard (T and R_i divide by N + E, n_i + E).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers.reference import (
    debug_metrics,
    is_metrics,
    is_weights,
    offpolicy_metrics,
    rollout_kl_metrics,
    round_metrics,
    rs_keep,
    rs_metrics,
    rs_row_values,
)

E = 1e-8
exp, log, sqrt = math.exp, math.log, math.sqrt
P = "rollout_corr/"


def row(a, r, m):
    return (np.array(a, dtype=np.float64), np.array(r, dtype=np.float64), np.array(m, dtype=np.float64))


def masked_std(t_mean: float, t_mean_square: float, tokens: int) -> float:
    """§2/§3 "_std" from T[c] and T[c²] (denominators N + ε): the centred population std sqrt(Σc²/N − (Σc/N)²),
    i.e. T[c²] − T[c]² without the N·mean²·ε/(N+ε)² that verl's ε guards add."""
    scale = (tokens + E) / tokens
    return sqrt(t_mean_square * scale - (t_mean * scale) ** 2)


def is_moments_batch_a(tw: float, tw2: float, q0: float, q1: float) -> dict[str, float]:
    """§2's moments of batch_a's weights w from T[w], T[w²] and the two valid rows' q_i = R_i[w] (the empty row's
    q2 = 0): T[w]; the std; ESS = 1/T[(w/(T[w]+E))²] = (T[w] + E)²/T[w²]; the q_i's mean and std over the 3 rows;
    their min q2 = 0, and their max deviation |q2 − 1| = 1, which beats every valid row's |q_i − 1|."""
    q_mean = (q0 + q1 + 0.0) / 3
    return {
        P + "rollout_is_mean": tw,
        P + "rollout_is_std": masked_std(tw, tw2, 5),
        P + "rollout_is_eff_sample_size": (tw + E) ** 2 / tw2,
        P + "rollout_is_seq_mean": q_mean,
        P + "rollout_is_seq_std": sqrt(((q0 - q_mean) ** 2 + (q1 - q_mean) ** 2 + q_mean**2) / 2),
        P + "rollout_is_seq_min": 0.0,
        P + "rollout_is_seq_max_deviation": 1.0,
    }


def check(actual: dict[str, float], expected: dict[str, float]) -> None:
    """Same key set, every value within rel 1e-12 (NaN matches NaN)."""
    assert sorted(actual) == sorted(expected)
    for key, value in expected.items():
        assert actual[key] == pytest.approx(value, rel=1e-12, nan_ok=True), key


def check_rows(actual: list[np.ndarray], expected: list[list[float]]) -> None:
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected, strict=True):
        assert got.tolist() == pytest.approx(want, rel=1e-12)


def batch_a():
    """The main batch: B = 3 rows, N = 5 masked tokens, dyadic δ so that δ is exact.

    row0: δ = [0.5, −0.25]                      n0 = 2, one round
    row1: δ = [0.25, (6.0 under m = 0), 0.0, 1.0]  n1 = 3, two rounds [0.25] and [0.0, 1.0]
    row2: m = [0, 0]                            n2 = 0, the empty row
    """
    return [
        row([-1.0, -0.5], [-1.5, -0.25], [1, 1]),
        row([-2.0, -3.0, -1.0, -1.0], [-2.25, -9.0, -1.0, -2.0], [1, 0, 1, 1]),
        row([-0.5, -0.5], [-0.75, -0.75], [0, 0]),
    ]


def batch_c():
    """One row with δ = [30, 2] (S = 32): exercises every clamp20."""
    return [row([0.0, 0.0], [-30.0, -2.0], [1, 1])]


# ---------------------------------------------------------------------------
# §1 off-policy metrics
# ---------------------------------------------------------------------------


def test_offpolicy_metrics_batch_a():
    # R_i[a]: row0 (−1 − 0.5)/(2+E) = −1.5/(2+E); row1 (−2 − 1 − 1)/(3+E) = −4/(3+E); row2 0 (empty)
    # R_i[r]: row0 (−1.5 − 0.25)/(2+E) = −1.75/(2+E); row1 (−2.25 − 1 − 2)/(3+E) = −5.25/(3+E); row2 0
    # d_i = R_i[r] − R_i[a]: d0 = −0.25/(2+E), d1 = −1.25/(3+E), d2 = 0 (empty row: ppl 1, d 0)
    d0, d1 = -0.25 / (2 + E), -1.25 / (3 + E)
    expected = {
        # mean_i exp(−R_i[a]) = (e^{1.5/(2+E)} + e^{4/(3+E)} + e^0) / 3
        P + "training_ppl": (exp(1.5 / (2 + E)) + exp(4 / (3 + E)) + 1.0) / 3,
        # mean_i (−R_i[a]) = (1.5/(2+E) + 4/(3+E) + 0) / 3
        P + "training_log_ppl": (1.5 / (2 + E) + 4 / (3 + E)) / 3,
        # (e^{1.75/(2+E)} + e^{5.25/(3+E)} + 1) / 3
        P + "rollout_ppl": (exp(1.75 / (2 + E)) + exp(5.25 / (3 + E)) + 1.0) / 3,
        P + "rollout_log_ppl": (1.75 / (2 + E) + 5.25 / (3 + E)) / 3,
        # T[r − a] = −Σδ/(5+E) = −(0.5 − 0.25 + 0.25 + 0 + 1)/(5+E)
        P + "kl": -1.5 / (5 + E),
        # T[e^δ − δ − 1] over δ = 0.5, −0.25, 0.25, 0, 1 (the δ = 6 under m = 0 is ignored)
        P + "k3_kl": ((exp(0.5) - 1.5) + (exp(-0.25) - 0.75) + (exp(0.25) - 1.25) + 0.0 + (exp(1) - 2)) / (5 + E),
        P + "log_ppl_diff": (d0 + d1 + 0.0) / 3,
        P + "log_ppl_abs_diff": (abs(d0) + abs(d1) + 0.0) / 3,
        P + "log_ppl_diff_max": 0.0,  # d0 ≈ −0.125, d1 ≈ −0.417, the empty row's d2 = 0 wins
        P + "log_ppl_diff_min": d1,
        P + "ppl_ratio": (exp(d0) + exp(d1) + 1.0) / 3,  # empty row adds e^0 = 1
        # T[e^{2δ}] − 1 = (e^1 + e^−0.5 + e^0.5 + e^0 + e^2)/(5+E) − 1
        P + "chi2_token": (exp(1) + exp(-0.5) + exp(0.5) + 1.0 + exp(2)) / (5 + E) - 1,
        # S = [0.25, 1.25, 0] → mean(e^0.5, e^2.5, e^0) − 1
        P + "chi2_seq": (exp(0.5) + exp(2.5) + 1.0) / 3 - 1,
        # T[|δ|] = (0.5 + 0.25 + 0.25 + 0 + 1)/(5+E)
        "mismatch/logprob_abs_diff": 2.0 / (5 + E),
    }
    check(offpolicy_metrics(batch_a()), expected)


def test_offpolicy_chi2_clamps_at_20_but_k3_does_not():
    # δ = [30, 2], S = 32
    metrics = offpolicy_metrics(batch_c())
    # chi2_token: clamp20(30) = 20 → (e^40 + e^4)/(2+E) − 1
    assert metrics[P + "chi2_token"] == pytest.approx((exp(40) + exp(4)) / (2 + E) - 1, rel=1e-12)
    # chi2_seq: clamp20(32) = 20 → e^40 − 1
    assert metrics[P + "chi2_seq"] == pytest.approx(exp(40) - 1, rel=1e-12)
    # k3_kl unclamped: (e^30 − 31 + e^2 − 3)/(2+E)
    assert metrics[P + "k3_kl"] == pytest.approx((exp(30) - 31 + exp(2) - 3) / (2 + E), rel=1e-12)


def test_empty_row_quirk_and_masked_garbage():
    # One real row δ = [0.5] plus an empty row whose logprobs are NaN/inf (never read).
    rows = [row([-1.0], [-1.5], [1]), row([math.nan, math.inf], [0.0, -math.inf], [0, 0])]
    metrics = offpolicy_metrics(rows)
    # training_ppl = (e^{1/(1+E)} + e^0)/2: the empty row enters with R = 0, ppl 1
    assert metrics[P + "training_ppl"] == pytest.approx((exp(1 / (1 + E)) + 1) / 2, rel=1e-12)
    # d0 = (−1.5 + 1)/(1+E) = −0.5/(1+E), d1 = 0 → log_ppl_diff = d0/2, max = 0
    assert metrics[P + "log_ppl_diff"] == pytest.approx(-0.5 / (1 + E) / 2, rel=1e-12)
    assert metrics[P + "log_ppl_diff_max"] == 0.0
    # chi2_seq = (e^{2·0.5} + e^0)/2 − 1
    assert metrics[P + "chi2_seq"] == pytest.approx((exp(1) + 1) / 2 - 1, rel=1e-12)


def test_no_masked_token_has_no_metrics():
    rows = [row([-1.0], [-1.0], [0])]
    for compute in (offpolicy_metrics, rollout_kl_metrics, round_metrics):
        with pytest.raises(ValueError):
            compute(rows)
    with pytest.raises(ValueError):
        is_metrics(rows, "token", 2.0)
    with pytest.raises(ValueError):
        rs_metrics(rows, ["token_k1"], ["2.0"])


# ---------------------------------------------------------------------------
# §5 debug metrics
# ---------------------------------------------------------------------------


def test_debug_metrics():
    # masked p_a = [0.2, 0.4 | 0.6], p_r = [0.3, 0.3 | 0.6]; row0 has two rounds, row2 is empty
    rows = [
        row([log(0.2), log(0.05), log(0.4)], [log(0.3), log(0.9), log(0.3)], [1, 0, 1]),
        row([log(0.6)], [log(0.6)], [1]),
        row([0.0, 0.0], [-5.0, -5.0], [0, 0]),
    ]
    expected = {
        "training/rollout_probs_diff_valid": 1.0,
        # |p_a − p_r| = [0.1, 0.1, 0.0]
        "training/rollout_probs_diff_max": 0.1,
        "training/rollout_probs_diff_mean": 0.2 / 3,
        # mean 1/15; deviations 1/30, 1/30, −2/30 → Σ² = 6/900; /(3 − 1) = 1/300
        "training/rollout_probs_diff_std": sqrt(1 / 300),
        # centred p_a = [−0.2, 0, 0.2], p_r = [−0.1, −0.1, 0.2]:
        # cov 0.02 + 0 + 0.04 = 0.06, var_a 0.08, var_r 0.06 → 0.06/sqrt(0.08·0.06) = sqrt(0.75)
        "training/rollout_actor_probs_pearson_corr": sqrt(0.75),
    }
    check(debug_metrics(rows), expected)


def test_debug_metrics_degenerate():
    one_token = debug_metrics([row([log(0.5)], [log(0.25)], [1])])
    # a single token: |0.5 − 0.25| = 0.25, std 0.0 (fewer than 2), correlation undefined
    check(
        one_token,
        {
            "training/rollout_probs_diff_valid": 1.0,
            "training/rollout_probs_diff_max": 0.25,
            "training/rollout_probs_diff_mean": 0.25,
            "training/rollout_probs_diff_std": 0.0,
            "training/rollout_actor_probs_pearson_corr": math.nan,
        },
    )
    no_token = debug_metrics([row([-1.0], [-2.0], [0])])
    check(
        no_token,
        {
            "training/rollout_probs_diff_valid": 0.0,
            "training/rollout_probs_diff_max": math.nan,
            "training/rollout_probs_diff_mean": math.nan,
            "training/rollout_probs_diff_std": math.nan,
            "training/rollout_actor_probs_pearson_corr": math.nan,
        },
    )


# ---------------------------------------------------------------------------
# §6 rollout-KL estimators
# ---------------------------------------------------------------------------


def test_rollout_kl_metrics_batch_a():
    # x = δ: row0 [0.5, −0.25], row1 [0.25, 0, 1], row2 empty (R_2 = 0, still counts in the /3)
    expected = {
        # R0 = 0.25/(2+E), R1 = 1.25/(3+E)
        "rollout_kl/k1": (0.25 / (2 + E) + 1.25 / (3 + E) + 0.0) / 3,
        # R0 = 0.75/(2+E), R1 = 1.25/(3+E)
        "rollout_kl/abs": (0.75 / (2 + E) + 1.25 / (3 + E)) / 3,
        # ½x²: row0 0.125 + 0.03125 = 0.15625; row1 0.03125 + 0 + 0.5 = 0.53125
        "rollout_kl/k2": (0.15625 / (2 + E) + 0.53125 / (3 + E)) / 3,
        # e^{−x} − 1 + x: row0 (e^−0.5 − 0.5) + (e^0.25 − 1.25); row1 (e^−0.25 − 0.75) + 0 + e^−1
        "rollout_kl/k3": (
            ((exp(-0.5) - 0.5) + (exp(0.25) - 1.25)) / (2 + E) + ((exp(-0.25) - 0.75) + 0.0 + exp(-1)) / (3 + E)
        )
        / 3,
    }
    check(rollout_kl_metrics(batch_a()), expected)


# ---------------------------------------------------------------------------
# §7 per-round metrics
# ---------------------------------------------------------------------------


def test_round_metrics_batch_a():
    # round 0: δ = [0.5, −0.25] (row0) + [0.25] (row1); round 1: δ = [0.0, 1.0] (row1)
    expected = {
        "per_round/round_0/logprob_abs_diff_mean": 1.0 / 3,  # (0.5 + 0.25 + 0.25)/3
        "per_round/round_0/token_count": 3.0,
        "per_round/round_0/seq_count": 2.0,
        "per_round/round_0/k3_kl": ((exp(0.5) - 1.5) + (exp(-0.25) - 0.75) + (exp(0.25) - 1.25)) / 3,
        "per_round/round_0/kl": -0.5 / 3,  # mean(r − a) = −(0.5 − 0.25 + 0.25)/3
        "per_round/round_0/max_abs_diff": 0.5,
        "per_round/round_0/chi2_token": (exp(1) + exp(-0.5) + exp(0.5)) / 3 - 1,
        "per_round/round_1/logprob_abs_diff_mean": 0.5,  # (0 + 1)/2
        "per_round/round_1/token_count": 2.0,
        "per_round/round_1/seq_count": 1.0,
        "per_round/round_1/k3_kl": (0.0 + (exp(1) - 2)) / 2,
        "per_round/round_1/kl": -0.5,
        "per_round/round_1/max_abs_diff": 1.0,
        "per_round/round_1/chi2_token": (1.0 + exp(2)) / 2 - 1,
        "per_round/num_rounds_max": 2.0,
        "per_round/most_divergent_round": 1.0,  # 0.5 > 1/3
    }
    check(round_metrics(batch_a()), expected)


def test_round_pooling_beyond_max_rounds():
    rows = [
        # three rounds δ = [0.5], [0.25], [1.0]; the δ = 9 tokens are under m = 0
        row([0.0] * 5, [-0.5, -9.0, -0.25, -9.0, -1.0], [1, 0, 1, 0, 1]),
        row([0.0, 0.0], [-0.75, -0.75], [1, 1]),  # one round δ = [0.75, 0.75]
    ]
    # max_rounds = 1: bucket 0 = [0.5, 0.75, 0.75]; bucket 1 = rounds 1 and 2 of row0 = [0.25, 1.0]
    expected = {
        "per_round/round_0/logprob_abs_diff_mean": 2.0 / 3,  # (0.5 + 0.75 + 0.75)/3
        "per_round/round_0/token_count": 3.0,
        "per_round/round_0/seq_count": 2.0,
        "per_round/round_0/k3_kl": ((exp(0.5) - 1.5) + 2 * (exp(0.75) - 1.75)) / 3,
        "per_round/round_0/kl": -2.0 / 3,
        "per_round/round_0/max_abs_diff": 0.75,
        "per_round/round_0/chi2_token": (exp(1) + 2 * exp(1.5)) / 3 - 1,
        "per_round/round_1/logprob_abs_diff_mean": 0.625,  # (0.25 + 1)/2
        "per_round/round_1/token_count": 2.0,
        "per_round/round_1/seq_count": 1.0,  # row0 counted once although it has rounds 1 and 2
        "per_round/round_1/k3_kl": ((exp(0.25) - 1.25) + (exp(1) - 2)) / 2,
        "per_round/round_1/kl": -0.625,
        "per_round/round_1/max_abs_diff": 1.0,
        "per_round/round_1/chi2_token": (exp(0.5) + exp(2)) / 2 - 1,
        "per_round/num_rounds_max": 3.0,  # unpooled
        "per_round/most_divergent_round": 0.0,  # 2/3 > 0.625
    }
    check(round_metrics(rows, max_rounds=1), expected)


def test_most_divergent_round_tie_takes_smallest():
    # rounds δ = [0.5] and [−0.5]: abs means tie at 0.5 → round 0
    metrics = round_metrics([row([0.0, 0.0, 0.0], [-0.5, 0.0, 0.5], [1, 0, 1])])
    assert metrics["per_round/most_divergent_round"] == 0.0


# ---------------------------------------------------------------------------
# §2 importance sampling
# ---------------------------------------------------------------------------


def test_token_tis_batch_a():
    # w_raw = e^δ = [e^0.5, e^−0.25 | e^0.25, 1, e^1]; TIS U = 2 truncates e^1 ≈ 2.718 to 2
    tw = (exp(0.5) + exp(-0.25) + exp(0.25) + 1 + 2) / (5 + E)  # T[w]
    tw2 = (exp(1) + exp(-0.5) + exp(0.5) + 1 + 4) / (5 + E)  # T[w²]
    q0 = (exp(0.5) + exp(-0.25)) / (2 + E)  # ≈ 1.214
    q1 = (exp(0.25) + 1 + 2) / (3 + E)  # ≈ 1.428; |q1 − 1| ≈ 0.43 < |q2 − 1| = 1
    expected = {
        **is_moments_batch_a(tw, tw2, q0, q1),
        P + "rollout_is_max": 2.0,
        P + "rollout_is_min": exp(-0.25),
        P + "rollout_is_ratio_fraction_high": 1 / (5 + E),  # only e^1 > 2
        P + "rollout_is_ratio_fraction_low": 0.0,  # nothing < L' = 1/2
        P + "rollout_is_seq_max": q1,
        # R_i[w_raw] ≈ [1.21, 1.67, 0]: none > 2; the empty row's 0 < 1/2
        P + "rollout_is_seq_fraction_high": 0.0,
        P + "rollout_is_seq_fraction_low": 1 / 3,
    }
    check(is_metrics(batch_a(), "token", 2.0), expected)
    check_rows(is_weights(batch_a(), "token", 2.0), [[exp(0.5), exp(-0.25)], [exp(0.25), 0, 1, 2], [0, 0]])


def test_token_tis_batch_normalisation():
    tw = (exp(0.5) + exp(-0.25) + exp(0.25) + 1 + 2) / (5 + E)  # f = T[w], as above
    metrics = is_metrics(batch_a(), "token", 2.0, batch_normalize=True)
    assert metrics[P + "rollout_is_batch_norm_factor"] == pytest.approx(tw, rel=1e-12)
    assert metrics[P + "rollout_is_mean"] == pytest.approx(tw, rel=1e-12)  # metrics before normalising
    weights = is_weights(batch_a(), "token", 2.0, batch_normalize=True)
    check_rows(weights, [[exp(0.5) / tw, exp(-0.25) / tw], [exp(0.25) / tw, 0, 1 / tw, 2 / tw], [0, 0]])


def test_token_icepop_batch_a():
    # IcePop [0.5, 2]: e^1 ≈ 2.718 > 2 is zeroed; w = [e^0.5, e^−0.25 | e^0.25, 1, 0]
    tw = (exp(0.5) + exp(-0.25) + exp(0.25) + 1 + 0) / (5 + E)
    tw2 = (exp(1) + exp(-0.5) + exp(0.5) + 1 + 0) / (5 + E)
    q0 = (exp(0.5) + exp(-0.25)) / (2 + E)  # ≈ 1.214
    q1 = (exp(0.25) + 1 + 0) / (3 + E)  # ≈ 0.761
    expected = {
        **is_moments_batch_a(tw, tw2, q0, q1),
        P + "rollout_is_max": exp(0.5),
        P + "rollout_is_min": 0.0,  # the zeroed token
        P + "rollout_is_ratio_fraction_high": 1 / (5 + E),
        P + "rollout_is_ratio_fraction_low": 0.0,
        P + "rollout_is_seq_max": q0,
        P + "rollout_is_seq_fraction_high": 0.0,  # R_i[w_raw] ≈ [1.21, 1.67, 0]
        P + "rollout_is_seq_fraction_low": 1 / 3,  # empty row
        P + "rollout_is_oob_ratio": 1 / (5 + E),  # T[w_raw < 0.5 or w_raw > 2]: only e^1
    }
    check(is_metrics(batch_a(), "token", 2.0, lower=0.5), expected)
    check_rows(is_weights(batch_a(), "token", 2.0, lower=0.5), [[exp(0.5), exp(-0.25)], [exp(0.25), 0, 1, 0], [0, 0]])


def test_sequence_tis_batch_a():
    # s = S_i[δ] = [0.25, 1.25, 0]; w_raw = e^{s_i} broadcast; TIS: row0 e^0.25, row1 min(e^1.25, 2) = 2
    tw = (2 * exp(0.25) + 3 * 2) / (5 + E)
    tw2 = (2 * exp(0.5) + 3 * 4) / (5 + E)
    q0, q1 = 2 * exp(0.25) / (2 + E), 6 / (3 + E)  # |q1 − 1| = 1 − 3E/(3+E) < |q2 − 1| = 1
    expected = {
        **is_moments_batch_a(tw, tw2, q0, q1),
        P + "rollout_is_max": exp(1.25),  # exp(min(max s, 20)): not truncated at U
        P + "rollout_is_min": 1.0,  # exp(min s) = exp(0) from the empty row
        P + "rollout_is_ratio_fraction_high": 1 / 3,  # only s1 = 1.25 > log 2
        P + "rollout_is_ratio_fraction_low": 0.0,  # nothing < log(1/2)
        P + "rollout_is_seq_max": q1,
        # R_1[w_raw] = 3e^1.25/(3+E) ≈ 3.49 > 2; the empty row's 0 < 1/2
        P + "rollout_is_seq_fraction_high": 1 / 3,
        P + "rollout_is_seq_fraction_low": 1 / 3,
    }
    check(is_metrics(batch_a(), "sequence", 2.0), expected)


def test_sequence_tis_batch_normalisation():
    # f = Σ_valid q_i / #valid = (2e^0.25/(2+E) + 6/(3+E)) / 2; the empty row is left out
    f = (2 * exp(0.25) / (2 + E) + 6 / (3 + E)) / 2
    metrics = is_metrics(batch_a(), "sequence", 2.0, batch_normalize=True)
    assert metrics[P + "rollout_is_batch_norm_factor"] == pytest.approx(f, rel=1e-12)
    weights = is_weights(batch_a(), "sequence", 2.0, batch_normalize=True)
    check_rows(weights, [[exp(0.25) / f, exp(0.25) / f], [2 / f, 0, 2 / f, 2 / f], [0, 0]])


def test_sequence_is_max_clamps_at_20():
    # s = 30 + 2 = 32: is_max = exp(min(32, 20)) = e^20, is_min = exp(32) is not clamped
    metrics = is_metrics(batch_c(), "sequence", 2.0)
    assert metrics[P + "rollout_is_max"] == pytest.approx(exp(20), rel=1e-12)
    assert metrics[P + "rollout_is_min"] == pytest.approx(exp(32), rel=1e-12)
    # w_raw = e^{clamp20(32)} = e^20 truncated to U = 2 on both tokens
    check_rows(is_weights(batch_c(), "sequence", 2.0), [[2.0, 2.0]])


def test_icepop_all_zeroed_has_infinite_ess():
    # δ = [1, 1] → w_raw = e ≈ 2.718 > 2 on both tokens → w = 0: T[w] = 0, ESS = 1/0
    metrics = is_metrics([row([0.0, 0.0], [-1.0, -1.0], [1, 1])], "token", 2.0, lower=0.5)
    assert metrics[P + "rollout_is_mean"] == 0.0
    assert metrics[P + "rollout_is_std"] == 0.0
    assert metrics[P + "rollout_is_eff_sample_size"] == math.inf
    assert metrics[P + "rollout_is_oob_ratio"] == pytest.approx(2 / (2 + E), rel=1e-12)


@pytest.mark.parametrize(
    ("level", "upper", "lower"),
    [
        ("token", 0.0, None),
        ("token", -2.0, None),
        ("token", 2.0, 0.0),
        ("token", 2.0, 3.0),
        ("geo", 2.0, None),
    ],
)
def test_is_bad_arguments(level, upper, lower):
    with pytest.raises(ValueError):
        is_metrics(batch_a(), level, upper, lower)


# ---------------------------------------------------------------------------
# §3 rejection sampling
# ---------------------------------------------------------------------------


def test_rs_token_k1_single_upper_means_lower_is_reciprocal():
    # k1 = −δ = [−0.5, 0.25 | −0.25, 0, −1]; "2.0" → L = 1/2: keep log 0.5 ≤ k1 ≤ log 2 (|k1| ≤ 0.693)
    lo = log(0.5)
    tc = (-0.5 + 0.25 - 0.25 + 0 + lo) / (5 + E)  # T[clamp(k1, log 0.5, log 2)]: only −1 moves, to log 0.5
    tc2 = (0.25 + 0.0625 + 0.0625 + 0 + lo**2) / (5 + E)
    v0, v1 = -0.25 / (2 + E), -1.25 / (3 + E)  # R_i[k1] of the valid rows
    opt = P + "rollout_rs_token_k1_"
    expected = {
        opt + "mean": -1.5 / (5 + E),
        opt + "max": 0.25,
        opt + "min": -1.0,
        opt + "fraction_high": 0.0,
        opt + "fraction_low": 1 / (5 + E),  # −1 < log 0.5
        opt + "std": masked_std(tc, tc2, 5),
        opt + "seq_mean": (v0 + v1) / 2,
        opt + "seq_std": abs(v0 - v1) / sqrt(2),  # unbiased std of two values
        opt + "seq_max": v0,
        opt + "seq_min": v1,
        opt + "seq_max_deviation": 1.25 / (3 + E),  # max |v|
        opt + "seq_fraction_high": 0.0,
        opt + "seq_fraction_low": 0.0,  # v1 ≈ −0.417 > log 0.5 ≈ −0.693
        opt + "masked_fraction": 1 / (5 + E),
        opt + "seq_masked_fraction": 1 / 2,  # row1 of the 2 valid rows
        P + "rollout_rs_masked_fraction": 1 / (5 + E),
        P + "rollout_rs_seq_masked_fraction": 1 / 3,  # over all 3 rows, empty one included
    }
    check(rs_metrics(batch_a(), ["token_k1"], ["2.0"]), expected)
    check(rs_metrics(batch_a(), ["token_k1"], ["0.5_2.0"]), expected)
    check_rows(rs_keep(batch_a(), ["token_k1"], ["2.0"]), [[1, 1], [1, 0, 1, 0], [0, 0]])


def test_rs_chained_seq_mean_k3_and_token_k1():
    # seq_mean_k3 ≤ 0.1: k3 = e^δ − 1 − δ
    #   v0 = ((e^0.5 − 1.5) + (e^−0.25 − 0.75))/(2+E) ≈ 0.0888 → keep row0
    #   v1 = ((e^0.25 − 1.25) + 0 + (e − 2))/(3+E) ≈ 0.2508 → reject row1
    v0 = ((exp(0.5) - 1.5) + (exp(-0.25) - 0.75)) / (2 + E)
    v1 = ((exp(0.25) - 1.25) + 0.0 + (exp(1) - 2)) / (3 + E)
    tc = (2 * v0 + 3 * 0.1) / (5 + E)  # clamp(stat, 0, 0.1): row1's v1 → 0.1
    tc2 = (2 * v0**2 + 3 * 0.01) / (5 + E)
    k3 = P + "rollout_rs_seq_mean_k3_"
    # token_k1 with "1.5": keep log(1/1.5) ≤ k1 ≤ log 1.5 (|k1| ≤ 0.405): rejects k1 = −0.5 and −1
    lo = log(1 / 1.5)
    w0, w1 = -0.25 / (2 + E), -1.25 / (3 + E)  # R_i[k1]
    tk = (lo + 0.25 - 0.25 + 0 + lo) / (5 + E)  # clamp(k1, lo, log 1.5): −0.5 and −1 move to lo
    tk2 = (lo**2 + 0.0625 + 0.0625 + 0 + lo**2) / (5 + E)
    k1 = P + "rollout_rs_token_k1_"
    expected = {
        k3 + "mean": (2 * v0 + 3 * v1) / (5 + E),  # row value broadcast to its tokens
        k3 + "max": v1,
        k3 + "min": v0,
        k3 + "fraction_high": 1 / 2,  # valid rows with v > 0.1
        k3 + "fraction_low": 0.0,  # no low fraction for k3
        k3 + "std": masked_std(tc, tc2, 5),
        k3 + "seq_mean": (v0 + v1) / 2,
        k3 + "seq_std": (v1 - v0) / sqrt(2),
        k3 + "seq_max": v1,
        k3 + "seq_min": v0,
        k3 + "seq_max_deviation": v1,
        k3 + "seq_fraction_high": 1 / 2,
        k3 + "masked_fraction": 3 / (5 + E),  # row1's 3 tokens
        k3 + "seq_masked_fraction": 1 / 2,
        k1 + "mean": -1.5 / (5 + E),
        k1 + "max": 0.25,
        k1 + "min": -1.0,
        k1 + "fraction_high": 0.0,
        k1 + "fraction_low": 2 / (5 + E),
        k1 + "std": masked_std(tk, tk2, 5),
        k1 + "seq_mean": (w0 + w1) / 2,
        k1 + "seq_std": abs(w0 - w1) / sqrt(2),
        k1 + "seq_max": w0,
        k1 + "seq_min": w1,
        k1 + "seq_max_deviation": 1.25 / (3 + E),
        k1 + "seq_fraction_high": 0.0,
        k1 + "seq_fraction_low": 1 / 2,  # w1 ≈ −0.4167 < log(1/1.5) ≈ −0.4055
        k1 + "masked_fraction": 2 / (5 + E),
        k1 + "seq_masked_fraction": 1.0,  # both valid rows lose a token
        # final = m × keep_k3 × keep_k1: row0 [0, 1], row1 [0, ·, 0, 0] → 4 of 5 rejected
        P + "rollout_rs_masked_fraction": 4 / (5 + E),
        P + "rollout_rs_seq_masked_fraction": 2 / 3,
    }
    options, thresholds = ["seq_mean_k3", "token_k1"], ["0.1", "1.5"]
    check(rs_metrics(batch_a(), options, thresholds), expected)
    check_rows(rs_keep(batch_a(), options, thresholds), [[0, 1], [0, 0, 0, 0], [0, 0]])


def test_rs_row_values_of_empty_row_are_zero():
    # seq_max_k3: row0 max(e^0.5 − 1.5, e^−0.25 − 0.75) = e^0.5 − 1.5; row1 max(.., 0, e − 2) = e − 2
    assert rs_row_values(batch_a(), "seq_max_k3") == pytest.approx([exp(0.5) - 1.5, exp(1) - 2, 0.0], rel=1e-12)
    # seq_sum_k2: ½δ² sums: row0 0.125 + 0.03125; row1 0.03125 + 0 + 0.5; empty row 0
    assert rs_row_values(batch_a(), "seq_sum_k2") == pytest.approx([0.15625, 0.53125, 0.0], rel=1e-12)


def test_rs_seq_max_k3_shared_threshold():
    # seq_max_k3 ≤ 0.5: row0 e^0.5 − 1.5 ≈ 0.149 kept, row1 e − 2 ≈ 0.718 rejected
    metrics = rs_metrics(batch_a(), ["seq_max_k3"], ["0.5"])
    opt = P + "rollout_rs_seq_max_k3_"
    assert metrics[opt + "max"] == pytest.approx(exp(1) - 2, rel=1e-12)
    assert metrics[opt + "min"] == pytest.approx(exp(0.5) - 1.5, rel=1e-12)
    assert metrics[opt + "masked_fraction"] == pytest.approx(3 / (5 + E), rel=1e-12)
    assert opt + "seq_fraction_low" not in metrics
    check_rows(rs_keep(batch_a(), ["seq_max_k3"], ["0.5"]), [[1, 1], [0, 0, 0, 0], [0, 0]])


@pytest.mark.parametrize(
    ("options", "thresholds"),
    [
        (["token_k2"], ["0.5_2.0"]),  # k2/k3 take a single upper bound
        (["seq_max_k1"], ["2.0"]),  # not an option
        (["token_k1", "token_k3"], ["2.0", "0.1", "0.2"]),  # neither one nor one per option
        (["token_k1"], ["0.0_2.0"]),  # bounds must be positive
        (["token_k3"], ["-1"]),
    ],
)
def test_rs_bad_arguments(options, thresholds):
    with pytest.raises(ValueError):
        rs_metrics(batch_a(), options, thresholds)
