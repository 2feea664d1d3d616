"""The probability gates (rollout_diag/presets.py GATE_STATISTICS, engine/formulas.py gate_values): AReaL's KPop,
OpenRLHF's binary_kl gating and prime-rl's ipo (TV), against float64 references written from each trainer's code
(tests/helpers/reference.py gate_divergence: AReaL areal-project/AReaL@cbff54d areal/utils/functional/functional.py
compute_binary_kl_divergence; OpenRLHF #1339 PolicyLoss; prime-rl PrimeIntellect-ai/prime-rl@559b447
src/prime_rl/trainer/rl/loss.py ipo_loss_fn), hand-computed cases, the ends p → 0 and p → 1, the built-in presets'
rejections, and the presets file's OpenRLHF grammar."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from helpers.presets import random_steps, write_dump
from helpers.reference import gate_divergence

import rollout_diag as rd
from rollout_diag.engine.choice import use_engine
from rollout_diag.engine.formulas import gate_values
from rollout_diag.errors import ConfigError
from rollout_diag.presets import GATE_PRESETS, PRESETS, load_presets_file, openrlhf_settings


def gates(trainer: list[float], rollout: list[float]) -> np.ndarray:
    return np.stack(gate_values(np.array(trainer, dtype=np.float64), np.array(rollout, dtype=np.float64)))


def test_hand_computed_gates():
    # p = 0.5 (a = log 0.5), q = 0.25 (r = log 0.25):
    # KL(B(p)‖B(q)) = 0.5·log(0.5/0.25) + 0.5·log(0.5/0.75) = 0.5·0.693147 + 0.5·(−0.405465) = 0.143841
    # KL(B(q)‖B(p)) = 0.25·log(0.25/0.5) + 0.75·log(0.75/0.5) = −0.173287 + 0.304099 = 0.130812
    # kpop = max = 0.143841; bkl = KL(B(q)‖B(p)) = 0.130812; tv = |0.5 − 0.25| = 0.25
    kpop, bkl, tv = gates([math.log(0.5)], [math.log(0.25)])[:, 0]
    assert kpop == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(2 / 3), rel=1e-14)
    assert bkl == pytest.approx(0.25 * math.log(0.5) + 0.75 * math.log(1.5), rel=1e-14)
    assert tv == pytest.approx(0.25, rel=1e-15)
    assert kpop == pytest.approx(0.1438410362258904, rel=1e-12) and bkl == pytest.approx(0.13081203594113702, rel=1e-12)
    # equal probabilities: every gate exactly 0
    assert gates([-0.7], [-0.7]).tolist() == [[0.0], [0.0], [0.0]]


def test_the_ends_are_finite_and_not_negative():
    # p → 0 (a = −800: exp underflows to 0, clamped to eps) and p → 1 (a = 0: p = 1, clamped to 1 − eps), either side
    ends = [0.0, -1e-300, -1e-12, -1e-9, -1e-6, -13.0, -40.0, -800.0]
    trainer = [a for a in ends for _ in ends]
    rollout = [r for _ in ends for r in ends]
    values = gates(trainer, rollout)
    assert np.isfinite(values).all() and (values >= 0).all()
    # the largest a clamp allows: both at opposite ends, KL(B(1 − ε)‖B(ε)) ≈ log(1/ε) (18.42 for AReaL's 1e-8)
    assert values[0].max() == pytest.approx((1 - 2e-8) * math.log((1 - 1e-8) / 1e-8), rel=1e-9)
    assert values[1].max() == pytest.approx((1 - 2e-6) * math.log((1 - 1e-6) / 1e-6), rel=1e-9)
    assert values[2].max() == 1.0


def test_nearby_policies_give_a_small_positive_kl_not_a_rejected_negative_one():
    # OpenRLHF #1354: a = −1.0, r = −0.99999 gave ≈ −4.49e-8 in float32; the float64 value is ≈ 2.89e-11
    _, bkl, _ = gates([-1.0], [-0.99999])[:, 0]
    assert bkl == pytest.approx(gate_divergence(-1.0, -0.99999, "bkl"), rel=1e-6)
    assert 2.8e-11 < bkl < 3.0e-11


def test_gates_equal_the_trainers_formulas_in_float64():
    rng = np.random.default_rng(3)
    rollout = np.concatenate([-rng.exponential(2.0, 4000), [-1e-12, -1e-7, -16.0, -25.0]])
    trainer = rollout + rng.normal(0, 0.3, rollout.size) * rng.choice([1e-6, 1e-2, 1.0, 5.0], rollout.size)
    trainer = np.minimum(trainer, 0.0)
    values = gates(trainer.tolist(), rollout.tolist())
    for row, kind in enumerate(("kpop", "bkl", "tv")):
        expected = np.array([gate_divergence(a, r, kind) for a, r in zip(trainer, rollout, strict=True)])
        # the reference divides p/q where we use δ = a − r: equal within roundoff of the log's argument
        np.testing.assert_allclose(values[row], expected, rtol=1e-9, atol=1e-15, err_msg=kind)


def test_the_built_in_gate_presets_follow_their_peers():
    kpop, seq_bkl, ipo = (preset.rejection[0] for preset in GATE_PRESETS)
    assert (kpop.option, kpop.upper) == ("token_kpop", 2.0)  # AReaL examples/math/gsm8k_kpop.yaml at cbff54d
    assert (seq_bkl.option, seq_bkl.upper) == ("seq_mean_bkl", 5e-3)  # OpenRLHF FlashREINFORCE's delta
    assert (ipo.option, ipo.upper) == ("token_tv", 0.1)  # prime-rl IPOLossConfig.ipo_threshold default
    assert all(not option.has_lower for option in (kpop, seq_bkl, ipo))
    for preset in GATE_PRESETS:
        assert preset.name in PRESETS and ("@" in preset.description or "#" in preset.description)


@pytest.mark.parametrize("engine", ["numba", "torch"])
def test_compare_presets_rejects_what_the_references_reject(tmp_path, engine):
    steps = random_steps(5)
    path = tmp_path / "gates.parquet"
    write_dump(path, steps)
    thresholds = {"token_kpop": 0.005, "seq_mean_bkl": 0.001, "token_tv": 0.02}
    presets = [rd.preset_from_options(option, rollout_rs=option, rollout_rs_threshold=str(u)) for option, u in
               thresholds.items()]  # fmt: skip
    with use_engine(engine):
        result = rd.compare_presets(path, presets, device="cpu", chunk_tokens=37)
    # the dump holds float32 logprobs: the reference reads the same values
    rows = [(np.float32(a).astype(np.float64), np.float32(r).astype(np.float64), m) for rows_ in steps.values()
            for a, r, m in rows_]  # fmt: skip
    for preset, (option, upper) in zip(result.presets, thresholds.items(), strict=True):
        kind = option.rpartition("_")[2]
        values = [[gate_divergence(a[t], r[t], kind) for t in range(len(m)) if m[t] == 1] for a, r, m in rows]
        if option.startswith("token_"):
            rejected = sum(v > upper for row in values for v in row) / sum(len(row) for row in values)
        else:
            # a rejected row's model tokens all count (T[1 − keep])
            rejected = sum(len(row) for row in values if row and sum(row) / len(row) > upper) / sum(map(len, values))
        measured = preset.run.metrics[f"rollout_corr/rollout_rs_{option}_masked_fraction"]
        assert 0 < rejected < 1
        assert measured == pytest.approx(rejected, rel=1e-9), option  # T[x] divides by N + 1e-8


def test_binary_kl_is_verls_6800_spelling_of_the_token_kpop_gate():
    preset = rd.preset_from_options("kpop", rollout_rs="binary_kl", rollout_rs_threshold="0.1")
    assert preset.rejection[0].option == "token_kpop"


def test_presets_file_takes_openrlhfs_grammar(tmp_path):
    path = tmp_path / "presets.json"
    path.write_text(
        json.dumps(
            {
                "flash": {"is_correction_level": "seq", "is_correction_gating": "binary_kl",
                          "is_correction_threshold": 5e-3},
                "tv": {"is_correction_level": "token", "is_correction_gating": "tv", "is_correction_threshold": [0.1]},
                "icepop": {"is_correction_level": "token"},
                "seq_ratio": {"is_correction_level": "seq", "is_correction_threshold": "0.5 2.0"},
                "tis": {"is_correction_level": "token", "is_correction_mode": "clip", "is_correction_threshold": 3},
                "verl_style": {"rollout_rs": "seq_mean_bkl", "rollout_rs_threshold": 0.005},
            }
        )
    )  # fmt: skip
    presets = load_presets_file(path)
    assert presets["flash"].rejection == presets["verl_style"].rejection
    assert presets["tv"].rejection[0].option == "token_tv" and presets["tv"].rejection[0].upper == 0.1
    icepop = presets["icepop"].importance  # OpenRLHF's default band [0.5, 5.0]
    assert (icepop.level, icepop.icepop, icepop.lower, icepop.upper) == ("token", True, 0.5, 5.0)
    # the geometric mean of ρ in [0.5, 2] is verl's seq_mean_k1 (k1 = −log ρ) kept in [log(1/2), log(1/0.5)]
    seq = presets["seq_ratio"].rejection[0]
    assert (seq.option, seq.lower, seq.upper) == ("seq_mean_k1", math.log(0.5), math.log(2.0))
    assert (presets["tis"].importance.icepop, presets["tis"].importance.upper) == (False, 3.0)
    assert presets["flash"].mode == "openrlhf"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"is_correction_level": "sequence"}, "is_correction_level 'sequence': choose off, token or seq"),
        ({"is_correction_level": "seq", "is_correction_gating": "kl"}, "is_correction_gating 'kl': choose ratio"),
        ({"is_correction_level": "seq", "is_correction_gating": "tv"}, "takes an upper bound only (LOW 0)"),
        ({"is_correction_level": "seq", "is_correction_mode": "clip"}, "clip needs is_correction_level token"),
        ({"is_correction_level": "token", "is_correction_threshold": [1, 2, 3]}, "expected [LOW] HIGH"),
        ({"is_correction_level": "token", "is_correction_threshold": "2 1"}, "need 0 ≤ LOW ≤ HIGH"),
        ({"is_correction_level": "token", "rollout_is": "token"}, "cannot be combined with rollout_is"),
        ({"is_correction_level": "token", "is_correction_mode": "clip", "is_correction_threshold": [0.5, 2]},
         "has no verl equivalent"),
    ],
)  # fmt: skip
def test_bad_openrlhf_grammar_is_one_line(tmp_path, settings, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"mine": settings}))
    with pytest.raises(ConfigError) as caught:
        load_presets_file(path)
    assert message in str(caught.value) and "preset 'mine'" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_openrlhf_off_is_a_preset_that_only_measures():
    assert openrlhf_settings({"is_correction_level": "off"}) == {}
