"""Presets (rollout_diag/presets.py): the 19 verl presets of METRICS.md §4, the legacy ones (§8), threshold
parsing and every error message."""

from __future__ import annotations

import json
import math
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollout_diag.errors import ConfigError
from rollout_diag.presets import (
    LEGACY_PRESETS,
    PRESETS,
    RS_OPTIONS,
    VERL_PRESETS,
    Preset,
    get_presets,
    load_presets_file,
    parse_bounds,
    parse_importance,
    parse_rejection,
    preset_from_options,
)

# METRICS.md §4, row by row: (rollout_is, is threshold, rollout_rs, rs threshold, mode).
GEO, K3 = ("seq_mean_k1", "0.999_1.001"), ("seq_mean_k3", "0.01")
SECTION_4 = {
    "decoupled_token_is": ("token", 2.0, None, None, "decoupled"),
    "decoupled_seq_is": ("sequence", 2.0, None, None, "decoupled"),
    "decoupled_token_icepop": ("token", "0.5_5.0", None, None, "decoupled"),
    "decoupled_seq_is_rs": ("sequence", 2.0, "seq_sum_k1", "0.5_2.0", "decoupled"),
    "decoupled_geo_rs": (None, None, *GEO, "decoupled"),
    "decoupled_geo_rs_seq_tis": ("sequence", 2.0, *GEO, "decoupled"),
    "decoupled_geo_rs_token_tis": ("token", 2.0, *GEO, "decoupled"),
    "decoupled_k3_rs": (None, None, *K3, "decoupled"),
    "decoupled_k3_rs_seq_tis": ("sequence", 2.0, *K3, "decoupled"),
    "decoupled_k3_rs_token_tis": ("token", 2.0, *K3, "decoupled"),
    "bypass_ppo_clip": (None, None, None, None, "bypass, ppo_clip"),
    "bypass_ppo_clip_geo_rs": (None, None, *GEO, "bypass, ppo_clip"),
    "bypass_ppo_clip_k3_rs": (None, None, *K3, "bypass, ppo_clip"),
    "bypass_pg_is": ("sequence", 2.0, None, None, "bypass, reinforce"),
    "bypass_pg_token_icepop": ("token", "0.5_5.0", None, None, "bypass, reinforce"),
    "bypass_pg_geo_rs": (None, None, *GEO, "bypass, reinforce"),
    "bypass_pg_geo_rs_seq_tis": ("sequence", 2.0, *GEO, "bypass, reinforce"),
    "bypass_pg_geo_rs_token_tis": ("token", 2.0, *GEO, "bypass, reinforce"),
    "disabled": (None, None, None, None, "metrics only"),
}


def test_all_19_verl_presets_have_section_4_values():
    assert [p.name for p in VERL_PRESETS] == list(SECTION_4)
    for name, (level, is_threshold, option, rs_threshold, mode) in SECTION_4.items():
        preset = PRESETS[name]
        assert preset.mode == mode
        assert preset.rollout_is == level
        assert preset.rollout_is_batch_normalize is False
        if level is None:
            assert preset.importance is None and preset.rollout_is_threshold is None
        else:
            assert preset.rollout_is_threshold == str(is_threshold)
            assert preset.importance.level == level
            if isinstance(is_threshold, float):  # TIS: U, L' = 1/U
                assert (preset.importance.upper, preset.importance.lower, preset.importance.icepop) == (2.0, 0.5, False)
            else:  # IcePop "0.5_5.0"
                assert (preset.importance.upper, preset.importance.lower, preset.importance.icepop) == (5.0, 0.5, True)
        if option is None:
            assert preset.rejection == () and preset.rollout_rs_threshold is None
        else:
            assert preset.rollout_rs == (option,) and preset.rollout_rs_threshold == rs_threshold
            (parsed,) = preset.rejection
            assert parsed.option == option
        assert preset.legacy is None


def test_rejection_bounds_in_metric_space():
    (geo,) = PRESETS["decoupled_geo_rs"].rejection
    assert (geo.scope, geo.statistic, geo.has_lower) == ("seq_mean", "k1", True)
    assert geo.lower == math.log(0.999) and geo.upper == math.log(1.001)
    (k3,) = PRESETS["decoupled_k3_rs"].rejection
    assert (k3.scope, k3.statistic, k3.lower, k3.upper, k3.has_lower) == ("seq_mean", "k3", 0.0, 0.01, False)
    (seq_sum,) = PRESETS["decoupled_seq_is_rs"].rejection
    assert (seq_sum.lower, seq_sum.upper) == (math.log(0.5), math.log(2.0))
    # §3: a single U on a k1 option means L = 1/U
    (single,) = parse_rejection("token_k1", "2.0")
    assert single.lower == math.log(0.5) and single.upper == math.log(2.0)


def test_legacy_presets_parse_with_documented_defaults():
    names = [p.name for p in LEGACY_PRESETS]
    assert all(name.startswith("legacy_") for name in names)
    token = PRESETS["legacy_token_truncate"].legacy
    assert (token.level, token.mode, token.upper, token.lower) == ("token", "truncate", 2.0, 0.5)
    assert (token.veto_lower, token.veto_upper) == (1e-4, None)  # verl's one-sided veto default
    geometric = PRESETS["legacy_geometric_mask"].legacy
    assert (geometric.level, geometric.mode, geometric.lower, geometric.upper) == ("geometric", "mask", 0.999, 1.001)
    assert (geometric.mask_lower, geometric.mask_upper) == (0.999, 1.001)  # mask bounds default to the IS ones
    both = PRESETS["legacy_token_both"].legacy  # xtuner: threshold (5, 0), mask (5, 0.5), veto (20, 0)
    assert (both.upper, both.lower, both.mask_upper, both.mask_lower) == (5.0, 0.0, 5.0, 0.5)
    assert (both.veto_lower, both.veto_upper) == (0.0, 20.0)
    assert {p.legacy.level for p in LEGACY_PRESETS} == {"token", "sequence", "geometric"}
    assert {p.legacy.mode for p in LEGACY_PRESETS} == {"truncate", "mask", "both"}


def test_rs_options_are_the_eleven_of_section_3_and_the_gates_in_every_scope():
    assert set(RS_OPTIONS) == {
        *(f"{scope}_{k}" for scope in ("token", "seq_sum", "seq_mean") for k in ("k1", "k2", "k3")),
        "seq_max_k2",
        "seq_max_k3",
        *(f"{scope}_{k}" for scope in ("token", "seq_sum", "seq_mean", "seq_max") for k in ("kpop", "bkl", "tv")),
    }


def test_get_presets_by_name_group_and_default():
    assert [p.name for p in get_presets(None)] == list(PRESETS)
    assert len(get_presets(["verl"])) == 19
    assert [p.name for p in get_presets(["legacy"])] == [p.name for p in LEGACY_PRESETS]
    assert [p.name for p in get_presets(["disabled", "decoupled_k3_rs", "disabled"])] == ["disabled", "decoupled_k3_rs"]
    with pytest.raises(
        ConfigError, match=r"presets=nope: unknown preset\. Known: all, verl, legacy, gates, decoupled_token_is"
    ):
        get_presets(["nope"])


def test_custom_preset_from_cli_strings():
    preset = preset_from_options(
        "mine",
        rollout_is="token",
        rollout_is_threshold="0.5_5.0",
        rollout_rs="seq_mean_k3,token_k1",
        rollout_rs_threshold="0.01,0.5_2.0",
        batch_normalize=True,
    )
    assert preset.importance.icepop and preset.importance.batch_normalize
    assert [o.option for o in preset.rejection] == ["seq_mean_k3", "token_k1"]
    assert preset.rejection[1].lower == math.log(0.5)
    assert preset.config() == {
        "mode": "custom",
        "rollout_is": "token",
        "rollout_is_threshold": "0.5_5.0",
        "rollout_is_batch_normalize": True,
        "rollout_rs": "seq_mean_k3,token_k1",
        "rollout_rs_threshold": "0.01,0.5_2.0",
    }
    # verl's default IS threshold applies when only the level is given; numbers are accepted
    assert preset_from_options(rollout_is="sequence").importance.upper == 2.0
    assert preset_from_options(rollout_rs=["seq_max_k2"], rollout_rs_threshold=0.5).rejection[0].upper == 0.5


def test_repeated_rs_options_are_dropped_as_verl_does():
    parsed = parse_rejection("seq_mean_k3,seq_mean_k3,token_k2", "0.01,0.3")
    assert [o.option for o in parsed] == ["seq_mean_k3", "token_k2"]


# -------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rollout_is": "token", "rollout_is_threshold": ""}, "rollout_is_threshold '': empty threshold."),
        ({"rollout_is": "token", "rollout_is_threshold": "  "}, "rollout_is_threshold '': empty threshold."),
        ({"rollout_is": "token", "rollout_is_threshold": "two"}, "rollout_is_threshold 'two': 'two' is not a number."),
        ({"rollout_is": "token", "rollout_is_threshold": "nan"}, "'nan' is not a finite number."),
        ({"rollout_is": "token", "rollout_is_threshold": "0"}, "the upper bound must be > 0, got 0."),
        ({"rollout_is": "token", "rollout_is_threshold": "-2"}, "the upper bound must be > 0, got -2."),
        ({"rollout_is": "token", "rollout_is_threshold": "0_5"}, "the lower bound must be > 0, got 0."),
        ({"rollout_is": "token", "rollout_is_threshold": "5_0.5"}, "the lower bound 5 exceeds the upper bound 0.5."),
        ({"rollout_is": "token", "rollout_is_threshold": "1_2_3"}, "expected a number U or 'L_U' (one '_')."),
        ({"rollout_is": "token", "rollout_is_threshold": "_2"}, "'' is not a number."),
        ({"rollout_is": "geometric"}, "rollout_is 'geometric': unknown level; choose token or sequence."),
        ({"rollout_is": "tokens"}, "rollout_is 'tokens': unknown level"),
        (
            {"rollout_is_threshold": "2.0"},
            "rollout_is_threshold / rollout_is_batch_normalize given without rollout_is.",
        ),
        ({"batch_normalize": True}, "given without rollout_is"),
        ({"rollout_rs": "seq_mean_k3"}, "rollout_rs 'seq_mean_k3' needs rollout_rs_threshold."),
        ({"rollout_rs_threshold": "0.01"}, "rollout_rs_threshold '0.01' given without rollout_rs."),
        ({"rollout_rs": "seq_mean_k3", "rollout_rs_threshold": ""}, "rollout_rs_threshold '': empty threshold."),
        ({"rollout_rs": "seq_mean_k3", "rollout_rs_threshold": "0.01,"}, "empty entry between commas."),
        ({"rollout_rs": "seq_mean_k3,", "rollout_rs_threshold": "0.01"}, "rollout_rs 'seq_mean_k3,': empty option."),
        ({"rollout_rs": "seq_mean_k3", "rollout_rs_threshold": "x"}, "for seq_mean_k3 'x': 'x' is not a number."),
        ({"rollout_rs": "seq_mean_k3", "rollout_rs_threshold": "0"}, "the upper bound must be > 0, got 0."),
        ({"rollout_rs": "token_k1", "rollout_rs_threshold": "-1_2"}, "the lower bound must be > 0, got -1."),
        ({"rollout_rs": "token_k1", "rollout_rs_threshold": "2_0.5"}, "lower bound 2 exceeds the upper bound 0.5."),
        (
            {"rollout_rs": "seq_mean_k3", "rollout_rs_threshold": "0.5_2"},
            "rollout_rs_threshold for seq_mean_k3 '0.5_2': k2/k3 options take one upper bound, not 'L_U'.",
        ),
        (
            {"rollout_rs": "token_k2", "rollout_rs_threshold": "0.5_2"},
            "for token_k2 '0.5_2': k2/k3 options take one upper bound",
        ),
        (
            {"rollout_rs": "seq_mean_k3,token_k1", "rollout_rs_threshold": "0.01,0.5_2,3"},
            "rollout_rs_threshold '0.01,0.5_2,3': 3 entries for 2 options (seq_mean_k3, token_k1); "
            "give one shared entry or one per option.",
        ),
        ({"rollout_rs": "seq_foo_k3", "rollout_rs_threshold": "1"}, "rollout_rs option 'seq_foo_k3': unknown; choose"),
        ({"rollout_rs": "binary_kl_k9", "rollout_rs_threshold": "1"}, "rollout_rs option 'binary_kl_k9': unknown"),
        ({"rollout_rs": "seq_max_k1", "rollout_rs_threshold": "2"}, "rollout_rs option 'seq_max_k1' does not exist"),
    ],
)
def test_bad_specs_raise_one_line_config_errors(kwargs, message):
    with pytest.raises(ConfigError) as caught:
        preset_from_options("bad", **kwargs)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_bad_preset_settings():
    with pytest.raises(ConfigError, match="preset name 'a b'"):
        Preset("a b")
    with pytest.raises(ConfigError, match=r"legacy_\* settings .* cannot be combined"):
        Preset("x", rollout_is="token", legacy_is="token", legacy_is_threshold="2")
    with pytest.raises(ConfigError, match="legacy_is 'tok': unknown level"):
        Preset("x", legacy_is="tok", legacy_is_threshold="2")
    with pytest.raises(ConfigError, match="legacy_is_mode 'clip': unknown mode; choose truncate, mask, both"):
        Preset("x", legacy_is_mode="clip", legacy_is_threshold="2")
    with pytest.raises(ConfigError, match="legacy_is_threshold is required"):
        Preset("x", legacy_is="token")
    with pytest.raises(ConfigError, match="legacy_is_veto_threshold '-1': must be > 0"):
        Preset("x", legacy_is="token", legacy_is_threshold="2", legacy_is_veto_threshold="-1")
    with pytest.raises(ConfigError, match="expected a number or a string"):
        parse_bounds(True, "rollout_is_threshold")


def test_parse_importance_tis_and_icepop():
    tis = parse_importance("token", 2.0)
    assert (tis.upper, tis.lower, tis.icepop) == (2.0, 0.5, False)
    icepop = parse_importance("sequence", "0.5_5.0", batch_normalize=True)
    assert (icepop.upper, icepop.lower, icepop.icepop, icepop.batch_normalize) == (5.0, 0.5, True, True)
    assert parse_importance("token", "1_1").lower == 1.0  # L = U is allowed


# ----------------------------------------------------------------------------------- presets files
def test_presets_file_yaml_and_json(tmp_path):
    yaml_file = tmp_path / "team.yaml"
    yaml_file.write_text(
        "presets:\n"
        "  k3_strict:\n"
        "    rollout_is: token\n"
        "    rollout_is_threshold: 2.0\n"
        "    rollout_rs: [seq_mean_k3, token_k1]\n"
        "    rollout_rs_threshold: [0.005, 0.5_2.0]\n"
        "    rollout_is_batch_normalize: true\n"
        "    mode: decoupled\n"
        "  old_geo:\n"
        "    legacy_is: geometric\n"
        "    legacy_is_mode: mask\n"
        "    legacy_is_threshold: 0.99_1.01\n"
    )
    presets = load_presets_file(yaml_file)
    assert list(presets) == ["k3_strict", "old_geo"]
    strict = presets["k3_strict"]
    assert strict.rollout_is_threshold == "2.0" and strict.rollout_rs_threshold == "0.005,0.5_2.0"
    assert strict.importance.batch_normalize and strict.mode == "decoupled"
    assert presets["old_geo"].legacy.upper == 1.01
    json_file = tmp_path / "team.json"
    json_file.write_text(json.dumps({"k3": {"rollout_rs": "seq_mean_k3", "rollout_rs_threshold": 0.02}}))
    assert load_presets_file(json_file)["k3"].rejection[0].upper == 0.02
    assert [p.name for p in get_presets(["k3", "disabled"], extra=load_presets_file(json_file))] == ["k3", "disabled"]


@pytest.mark.parametrize(
    ("text", "suffix", "message"),
    [
        ("{", ".json", "not valid JSON (line 1"),
        ("a: [", ".yaml", "not valid YAML"),
        ("[]", ".json", "expected a mapping of preset names to settings."),
        ('{"x": 3}', ".json", "preset 'x': expected a mapping of settings, got int."),
        ('{"x": {"rollout_iss": "token"}}', ".json", "preset 'x': unknown key(s) rollout_iss; known:"),
        ('{"disabled": {}}', ".json", "preset 'disabled': the name is a built-in preset"),
        ('{"x": {"rollout_is": "token", "rollout_is_threshold": "5_1"}}', ".json", "preset 'x': rollout_is_threshold"),
        ('{"x": {"rollout_is": "token", "rollout_is_batch_normalize": "yes"}}', ".json", "must be true or false"),
    ],
)
def test_bad_presets_files(tmp_path, text, suffix, message):
    path = tmp_path / f"p{suffix}"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_presets_file(path)
    assert message in str(caught.value)
    assert str(path) in str(caught.value)


def test_presets_file_missing(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_presets_file(tmp_path / "none.yaml")


def test_yaml_without_pyyaml_says_what_to_install(tmp_path, monkeypatch):
    path = tmp_path / "p.yaml"
    path.write_text("x: {rollout_is: token}\n")
    monkeypatch.setitem(sys.modules, "yaml", None)  # import yaml now raises ImportError
    with pytest.raises(ConfigError) as caught:
        load_presets_file(path)
    assert "pip install pyyaml" in str(caught.value) and "rollout-diag[yaml]" in str(caught.value)


# ---------------------------------------------------------------------------------------- hypothesis
@given(st.text(max_size=12))
def test_any_threshold_text_parses_or_raises_config_error(text):
    """No spec crashes with anything but ConfigError, and what parses obeys §2's bounds."""
    try:
        parsed = parse_importance("token", text)
    except ConfigError as error:
        assert "\n" not in str(error)
        return
    assert parsed.upper > 0 and parsed.lower > 0
    assert parsed.lower <= parsed.upper if parsed.icepop else parsed.lower == 1.0 / parsed.upper


@given(
    st.sampled_from(RS_OPTIONS),
    st.one_of(
        st.floats(max_value=0, allow_nan=False).map(str),  # ≤ 0
        st.text(alphabet="abcxyz!", min_size=1, max_size=5),  # non-numeric
        st.tuples(st.floats(1.01, 100), st.floats(0.01, 1.0)).map(lambda b: f"{b[0]}_{b[1]}"),  # lower > upper
        st.just(""),
    ),
)
def test_bad_rs_specs_always_raise(option, spec):
    with pytest.raises(ConfigError):
        parse_rejection(option, spec)


@given(st.sampled_from([o for o in RS_OPTIONS if not o.endswith("k1")]), st.floats(0.01, 10), st.floats(0.01, 10))
def test_underscore_on_k2_k3_always_raises(option, lower, upper):
    with pytest.raises(ConfigError, match=r"(k2/k3|kpop/bkl/tv) options take one upper bound"):
        parse_rejection(option, f"{min(lower, upper)}_{max(lower, upper)}")


@given(st.lists(st.sampled_from(RS_OPTIONS), min_size=1, max_size=4, unique=True), st.integers(2, 6))
def test_wrong_number_of_entries_always_raises(options, entries):
    if entries == len(options):
        entries += 1
    thresholds = ",".join(["0.5_2" if o.endswith("k1") else "0.5" for o in options][:1] * entries)
    with pytest.raises(ConfigError, match=f"{entries} entries for {len(options)} options"):
        parse_rejection(options, thresholds)


def test_choose_presets_puts_your_presets_beside_the_built_in_ones():
    from rollout_diag.presets import choose_presets, get_presets

    built_in = [p.name for p in get_presets(None)]
    assert choose_presets() is None  # every built-in preset
    assert choose_presets(["verl"]) == ["verl"]
    custom = choose_presets(rollout_rs="seq_mean_k3", rollout_rs_threshold="0.02")
    assert [getattr(p, "name", p) for p in custom[:-1]] == built_in and len(custom) == len(built_in) + 1
    named = choose_presets(["decoupled_k3_rs"], rollout_rs="seq_mean_k3", rollout_rs_threshold="0.02")
    assert named[0] == "decoupled_k3_rs" and len(named) == 2  # names picked: no built-ins added
