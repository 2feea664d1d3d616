"""The dialects at the trainers' current code, hand-computed (arithmetic in the comments): AReaL at cbff54d and its
traps, verl@b178a3c against today's verl, prime-rl's ipo loss and its filtered empty rows.

Sources: areal-project/AReaL cbff54d645d2 ``areal/utils/functional/functional.py`` (apply_rejection_sampling,
compute_binary_kl_divergence, ppo_actor_loss_fn), ``areal/trainer/ppo/actor.py`` (grpo_loss_fn),
``areal/utils/stats_tracker.py``; verl-project/verl b178a3cd56f5 and 1dda039b9c63
``verl/trainer/ppo/rollout_corr_helper.py`` (compute_is_metrics); PrimeIntellect-ai/prime-rl 559b44772e47
``src/prime_rl/trainer/rl/loss.py`` (ipo_loss_fn, compute_loss) and ``src/prime_rl/orchestrator/train_sink.py``.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
import pytest
from helpers.dialect_dumps import one_step, write_dump

import rollout_diag as rd
from rollout_diag.metrics.dialects.areal import NOTE_DROPPED, NOTE_NAN, NOTE_UNDERFLOW, ArealAccumulator, Gate

A = "ppo_actor/update/"


def f32(x: float) -> float:
    return float(np.float32(x))


def exp32(x: float) -> float:
    return float(np.float32(math.exp(x)))


def dialect(path, name: str) -> dict[str, float]:
    return rd.analyze(str(path), device="cpu", dialect=name).run.dialects.get(name, {})


# ------------------------------------------------------------------------------------------------- AReaL
def test_areal_kpop_filters_a_token_with_logprob_zero_for_a_nan_score(tmp_path):
    """Three loss-mask tokens (a, r): (0.0, −0.1), (−1, −1), (−0.5, −0.6).

    Token 0: p = e^0 = 1; the clamp to 1 − 1e-8 is a no-op in float32 (1 − 1e-8 rounds to 1.0), so KL(p‖q) has
    (1 − p)·log((1 − p)/(1 − q)) = 0·log 0 = 0·(−inf) = NaN; NaN ≤ 2 is false: filtered, though |δ| is only 0.1.
    Token 1: p = q: KL 0, kept. Token 2: p = e^−0.5 = 0.6065, q = e^−0.6 = 0.5488: KL(p‖q) ≈ 0.0067, kept.
    behave_imp_weight = e^δ over the two kept tokens: (e^0 + e^0.1) / 2 = (1 + 1.10517) / 2 = 1.05259;
    rs_filtered_fraction = behave_filtered_ratio/avg = 1/3.
    """
    path = one_step(tmp_path / "k.parquet", [([0.0, -1.0, -0.5], [-0.1, -1.0, -0.6], [1, 1, 1])])
    kpop = dialect(path, "areal:kpop")
    assert kpop[NOTE_NAN] == 1.0
    assert kpop[A + "rs_filtered_fraction"] == pytest.approx(1 / 3, rel=1e-15)
    assert kpop[A + "behave_filtered_ratio/avg"] == pytest.approx(1 / 3, rel=1e-15)
    delta2 = f32(-0.5) - f32(-0.6)  # float32 subtraction, as AReaL's
    assert kpop[A + "behave_imp_weight/avg"] == pytest.approx((1.0 + exp32(f32(delta2))) / 2, rel=1e-12)
    assert kpop[A + "behave_imp_weight/avg"] == pytest.approx(1.05259, abs=1e-5)
    assert kpop[A + "behave_approx_kl/max"] == pytest.approx(f32(delta2), rel=1e-12)  # token 0's 0.1 is out
    # logp_diff is over the whole loss mask, filtered or not: r − a = (−0.1, 0, −0.1), mean −0.2/3
    assert kpop[A + "logp_diff/avg"] == pytest.approx(-0.2 / 3, rel=1e-6)
    # the ratio gate (areal) keeps all three: e^0.1 ≤ 5
    ratio = dialect(path, "areal")
    assert (ratio[NOTE_NAN], ratio[A + "rs_filtered_fraction"]) == (0.0, 0.0)


def test_areal_kpop_filters_identical_certain_tokens_and_the_whole_sequence_at_sequence_level(tmp_path):
    """a = r = 0.0 (both sides certain, no mismatch at all): p = q = 1, KL = 1·log 1 + 0·log(0/0) = NaN, filtered.
    At sequence level (agg mean) one NaN token makes the row's mean NaN: all its tokens go. Row 0 = [(0, 0),
    (−1, −1.1), (−2, −2)], row 1 = [(−1, −1), (−0.5, −0.5)]: token level filters 1 of 5, sequence level 3 of 5."""
    rows = [([0.0, -1.0, -2.0], [0.0, -1.1, -2.0], [1, 1, 1]), ([-1.0, -0.5], [-1.0, -0.5], [1, 1])]
    path = one_step(tmp_path / "s.parquet", rows)
    token = dialect(path, "areal:kpop")
    assert token[A + "rs_filtered_fraction"] == pytest.approx(1 / 5, rel=1e-15)

    class SequenceKPop(ArealAccumulator):
        GATE: ClassVar[Gate] = Gate(metric="binary_kl", upper=2.0, level="sequence")

    accumulator = SequenceKPop()
    for chunk, _ in rd.DumpReader([str(path)]).chunks("cpu"):
        accumulator.update(chunk)
    sequence = accumulator.finalize_run()
    assert sequence[A + "rs_filtered_fraction"] == pytest.approx(3 / 5, rel=1e-15)
    assert sequence[NOTE_NAN] == 1.0  # the one NaN token; its two row-mates are filtered with it
    assert sequence[A + "behave_imp_weight/avg"] == 1.0  # row 1: δ = 0, e^0 = 1


def test_areal_masked_token_ratio_counts_positions_not_gated_tokens(tmp_path):
    """Rows of 4 positions (mask 1 1 0 0) and 2 (mask 1 1), nothing gated: masked_token_ratio = 1 − 4/6 = 1/3 while
    rs_filtered_fraction = 0. With prompts of 10 positions each (a ``prompt_len`` column): 1 − 4/26 = 11/13."""
    row0 = {"trainer": np.full(4, -1.0, np.float32), "rollout": np.full(4, -1.0, np.float32)}
    row1 = {"trainer": np.full(2, -1.0, np.float32), "rollout": np.full(2, -1.0, np.float32)}
    masks = [np.array([1, 1, 0, 0], np.int8), np.array([1, 1], np.int8)]
    plain = [{**row, "mask": mask} for row, mask in zip([row0, row1], masks, strict=True)]
    write_dump(tmp_path / "m.parquet", {0: plain}, row_group_size=10)
    d = dialect(tmp_path / "m.parquet", "areal")
    assert d[A + "masked_token_ratio"] == pytest.approx(1 / 3, rel=1e-15)
    assert d[A + "rs_filtered_fraction"] == 0.0
    write_dump(tmp_path / "p.parquet", {0: [{**row, "prompt_len": 10} for row in plain]}, row_group_size=10)
    assert dialect(tmp_path / "p.parquet", "areal")[A + "masked_token_ratio"] == pytest.approx(11 / 13, rel=1e-15)


def test_areal_drops_an_infinite_max_and_counts_an_underflowed_weight_as_filtered(tmp_path):
    """KPop keeps (a, r) = (−20, −110): e^−20 = 2.1e-9 and e^−110 both clamp to p = q = 1e-8, KL 0. Its float32
    weight e^90 overflows to +inf (float32 max ≈ e^88.72): behave_imp_weight/max and kl_div_dual/max are +inf, and
    stats_tracker drops both keys; the avg stays (+inf). The second row is (−1, −1), weight 1.

    With the ratio gate (areal), (a, r) = (−110, −5): δ = −105, e^−105 underflows to 0 in float32 (below ≈ e^−103.97);
    0 ≤ 5 keeps it, but behave_mask needs weight > 0: it counts in behave_filtered_ratio (1/2) and not in
    rs_filtered_fraction (0)."""
    path = one_step(tmp_path / "i.parquet", [([-20.0], [-110.0], [1]), ([-1.0], [-1.0], [1])])
    kpop = dialect(path, "areal:kpop")
    assert A + "behave_imp_weight/max" not in kpop and A + "compute_logp/kl_div_dual/max" not in kpop
    assert kpop[A + "behave_imp_weight/avg"] == math.inf
    assert kpop[A + "behave_imp_weight/min"] == 1.0
    assert kpop[A + "compute_logp/kl_div_taylor/max"] == pytest.approx(90.0**2 / 2, rel=1e-6)  # (a − r)²/2 = 4050
    assert kpop[NOTE_DROPPED] == 2.0
    path = one_step(tmp_path / "u.parquet", [([-110.0], [-5.0], [1]), ([-1.0], [-1.0], [1])])
    ratio = dialect(path, "areal")
    assert ratio[NOTE_UNDERFLOW] == 1.0
    assert ratio[A + "behave_filtered_ratio/avg"] == 0.5
    assert ratio[A + "rs_filtered_fraction"] == 0.0
    assert ratio[A + "behave_imp_weight/avg"] == 1.0  # only the (−1, −1) token is in behave_mask


def test_areal_at_4aef98d_keeps_its_old_numbers(tmp_path):
    """areal@4aef98d is the dialect as it was (float64, the two behave_* keys); areal is cbff54d (float32, more keys).
    δ = ln 2 on one token: old behave_imp_weight/avg = 2 from float64 values; new from float32 ones."""
    ln2 = math.log(2.0)
    path = one_step(tmp_path / "o.parquet", [([ln2 - 1.0], [-1.0], [1])])
    old, new = dialect(path, "areal@4aef98d"), dialect(path, "areal")
    assert sorted(old) == sorted(
        A + f"{n}/{s}" for n in ("behave_approx_kl", "behave_imp_weight") for s in ("avg", "min", "max")
    )
    delta64 = float(np.float32(ln2 - 1.0)) + 1.0  # the stored float32 trainer value, minus −1 in float64
    assert old[A + "behave_approx_kl/avg"] == delta64
    assert new[A + "behave_approx_kl/avg"] == f32(np.float32(ln2 - 1.0) - np.float32(-1.0))
    assert set(old) < set(new)


# -------------------------------------------------------------------------------------------------- verl
def test_verl_b178a3c_takes_rollout_is_before_truncation_and_today_after(tmp_path):
    """One row, token ratios w_raw = (4, 0.25, 1) (δ = ln 4, ln 0.25, 0), U = 2 (TIS).

    b178a3c: mean = (4 + 0.25 + 1)/3 = 1.75; max 4; min 0.25; std on c = clamp(w_raw, 1/2, 2) = (2, 0.5, 1):
    mean 7/6, population variance ((5/6)² + (2/3)² + (1/6)²)/3 = (25 + 16 + 1)/108 = 7/18, std 0.623610.
    Today (1dda039b9, the decoupled_token_is preset): w = min(w_raw, 2) = (2, 0.25, 1): mean 3.25/3 = 1.083333,
    max 2; std on clamp(w, 0, 2) = (2, 0.25, 1): mean 13/12, variance (11² + 10² + 1²)/(144·3) = 222/432, 0.716860.
    The fractions above / below the bounds read the raw weights in both: 1/3 and 1/3."""
    path = one_step(
        tmp_path / "v.parquet", [([math.log(4.0) - 2.0, math.log(0.25) - 2.0, -2.0], [-2.0] * 3, [1, 1, 1])]
    )
    old = dialect(path, "verl@b178a3c")
    tol = 1e-6  # the stored float32 logprobs make the ratios 4 and 0.25 to 1e-7
    assert old["rollout_corr/rollout_is_mean"] == pytest.approx(1.75, rel=tol)
    assert old["rollout_corr/rollout_is_max"] == pytest.approx(4.0, rel=tol)
    assert old["rollout_corr/rollout_is_min"] == pytest.approx(0.25, rel=tol)
    assert old["rollout_corr/rollout_is_std"] == pytest.approx(math.sqrt(7 / 18), rel=tol)
    assert old["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(1 / 3, rel=1e-7)
    assert old["rollout_corr/rollout_is_seq_mean"] == pytest.approx(1.75, rel=tol)  # q_0 = R_0[w_raw]
    today = rd.compare_presets(str(path), ["decoupled_token_is"], device="cpu")
    metrics = next(p for p in today.presets if p.name == "decoupled_token_is").run.metrics
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(3.25 / 3, rel=tol)
    assert metrics["rollout_corr/rollout_is_max"] == pytest.approx(2.0, rel=tol)
    assert metrics["rollout_corr/rollout_is_std"] == pytest.approx(math.sqrt(222 / 432), rel=tol)
    # verl's other keys are the same in both dialects
    plain = dialect(path, "verl")
    assert {k: v for k, v in old.items() if "rollout_is" not in k} == pytest.approx(plain, rel=0, abs=0, nan_ok=True)


def test_verl_b178a3c_sequence_level(tmp_path):
    """rollout_is sequence, U = 2: s_0 = ln 4 + ln 0.25 + ln 3 = ln 3 (w_raw = 3 on its 3 tokens), row 1 s = ln 0.5
    (one token, w_raw 0.5). mean = (3·3 + 0.5)/4 = 2.375 (today: (2·3 + 0.5)/4 = 1.625); max e^{ln 3} = 3, min 0.5;
    fractions over the rows: high [ln 3 > ln 2] = 1/2, low [ln 0.5 < ln 0.5] = 0; q = (3, 0.5): seq_mean 1.75,
    seq_std |3 − 0.5|/√2 = 1.767767, seq_fraction_high 1/2."""
    rows = [
        ([math.log(4.0) - 2.0, math.log(0.25) - 2.0, math.log(3.0) - 2.0], [-2.0] * 3, [1, 1, 1]),
        ([math.log(0.5) - 2.0], [-2.0], [1]),
    ]
    d = dialect(one_step(tmp_path / "s.parquet", rows), "verl@b178a3c:seq")
    tol = 1e-6
    assert d["rollout_corr/rollout_is_mean"] == pytest.approx(2.375, rel=tol)
    assert (d["rollout_corr/rollout_is_max"], d["rollout_corr/rollout_is_min"]) == pytest.approx((3.0, 0.5), rel=tol)
    assert d["rollout_corr/rollout_is_ratio_fraction_high"] == 0.5
    assert d["rollout_corr/rollout_is_seq_mean"] == pytest.approx(1.75, rel=tol)
    assert d["rollout_corr/rollout_is_seq_std"] == pytest.approx(2.5 / math.sqrt(2), rel=tol)
    assert d["rollout_corr/rollout_is_seq_fraction_high"] == 0.5


# ---------------------------------------------------------------------------------------------- prime-rl
def k3_of(p_a: float, p_r: float) -> float:
    """exp(δ) − δ − 1 of the float32 logprobs as stored."""
    delta = f32(math.log(p_a)) - f32(math.log(p_r))
    return math.exp(delta) - delta - 1


def test_prime_rl_leaves_a_filtered_empty_row_out_not_seven_eighths(tmp_path):
    """Eight rows: seven with A = +1 and tokens (p_a, p_r) = (0.9, 0.6) (+0.3 > 0.2: DPPO-masked) and (0.6, 0.5)
    (+0.1: kept); the eighth filtered: A = 0 and no trained token (the orchestrator zeroed its rl weights), which
    compute_loss skips (``if bool(rl_mask.any())``). prime-rl: masked_mismatch_kl/mean = k3(ln 1.5) = 0.094535,
    unmasked = k3(ln 1.2) = 1.2 − 0.182322 − 1 = 0.017678, std 0, min = max. Counting the empty row as a 0 sample
    gave 7/8 of each mean (0.082718 and 0.015468) and min 0."""
    full = {
        "trainer": np.log(np.array([0.9, 0.6])).astype(np.float32),
        "rollout": np.log(np.array([0.6, 0.5])).astype(np.float32),
        "mask": np.ones(2, np.int8),
        "advantage": 1.0,
        "env": "math",
    }
    empty = {**full, "mask": np.zeros(2, np.int8), "advantage": 0.0}
    write_dump(tmp_path / "f.parquet", {0: [full] * 7 + [empty]}, row_group_size=3)
    d = dialect(tmp_path / "f.parquet", "prime-rl")
    masked, kept = k3_of(0.9, 0.6), k3_of(0.6, 0.5)
    assert masked == pytest.approx(0.094535, abs=1e-6) and kept == pytest.approx(0.017678, abs=1e-6)
    # prime-rl's own aggregation: the stacked values of the 7 samples compute_loss ran
    samples = [masked] * 7
    assert d["masked_mismatch_kl/mean"] == pytest.approx(sum(samples) / len(samples), rel=1e-12)
    assert d["masked_mismatch_kl/mean"] != pytest.approx(7 / 8 * masked, rel=1e-3)  # the old, diluted value
    assert d["unmasked_mismatch_kl/mean"] == pytest.approx(kept, rel=1e-12)
    assert (d["masked_mismatch_kl/min"], d["masked_mismatch_kl/std"]) == (pytest.approx(masked, rel=1e-12), 0.0)
    assert d["is_masked/mean"] == 0.5 and d["is_masked_high/min"] == 0.5


def test_prime_rl_ipo_masks_both_sides_without_reading_advantages(tmp_path):
    """ipo_loss_fn, ipo_threshold 0.1: tokens (0.9, 0.6) |+0.3| and (0.3, 0.6) |−0.3| masked, (0.55, 0.5) |0.05| kept.
    masked_mismatch_kl = (k3(ln 1.5) + k3(ln 0.5))/2 = (0.094535 + 0.193147)/2 = 0.143841;
    unmasked = k3(ln 1.1) = 1.1 − 0.095310 − 1 = 0.004690; is_masked = 2/3. A second, empty row is no sample."""
    p_a, p_r = [0.9, 0.3, 0.55], [0.6, 0.6, 0.5]
    rows = [
        ([math.log(p) for p in p_a], [math.log(p) for p in p_r], [1, 1, 1]),
        ([-1.0], [-1.0], [0]),
    ]
    d = dialect(one_step(tmp_path / "ipo.parquet", rows), "prime-rl:ipo")
    masked = (k3_of(0.9, 0.6) + k3_of(0.3, 0.6)) / 2
    assert masked == pytest.approx(0.143841, abs=1e-6)
    assert d["masked_mismatch_kl/mean"] == pytest.approx(masked, rel=1e-12)
    assert d["unmasked_mismatch_kl/mean"] == pytest.approx(k3_of(0.55, 0.5), rel=1e-12)
    assert d["is_masked/mean"] == pytest.approx(2 / 3, rel=1e-15)
    assert "is_masked_high/mean" not in d and "masked_advantage_positive/mean" not in d
    assert math.isnan(d["is_masked/std"])  # one sample: torch's std is NaN


# ------------------------------------------------------------------------------------------------ sentences
def test_the_differences_name_areals_traps_and_verls_two_meanings(tmp_path):
    from rollout_diag.decisions import dialects as decisions
    from rollout_diag.decisions.dialects import differences
    from rollout_diag.metrics.dialects import areal

    assert (decisions.AREAL_NAN, decisions.AREAL_UNDERFLOW, decisions.AREAL_DROPPED) == (
        areal.NOTE_NAN,
        areal.NOTE_UNDERFLOW,
        areal.NOTE_DROPPED,
    )
    path = one_step(tmp_path / "t.parquet", [([0.0, -20.0, -1.0], [-0.1, -110.0, -1.0], [1, 1, 1])])
    run = rd.analyze(str(path), device="cpu", dialect="areal:kpop,verl@b178a3c").run
    text = " ".join(differences(run))
    assert "1 token(s) with a logprob of 0.0 get a NaN binary-KL score" in text
    assert "2 infinite /min or /max value(s) are dropped" in text
    assert "one key, two meanings: verl@b178a3c's rollout_is_mean" in text
    clean = rd.analyze(str(one_step(tmp_path / "c.parquet", [([-1.0], [-1.0], [1])])), device="cpu", dialect="areal")
    clean_text = " ".join(differences(clean.run))
    assert "NaN" not in clean_text and "dropped" not in clean_text and "two meanings" not in clean_text
