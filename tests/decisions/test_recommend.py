""" "Which correction should I turn on?": the recommendation rule, intrusiveness order, CLI, JSON and report."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import invoke, succeeded
from helpers.schema import validator

from rollout_diag.decisions.recommend import by_intrusiveness, recommend, sort_by_intrusiveness
from rollout_diag.render.presets import corrects
from rollout_diag.results import ComparisonResult, PresetResult, StepResult

SAMPLE = Path(__file__).resolve().parents[2] / "sample_data" / "textgenrnn_bf16_vs_fp32.parquet"
CALM = {"rollout_corr/k3_kl": 1e-4, "rollout_corr/chi2_token": 1e-3, "rollout_corr/chi2_seq": 0.1}


def preset(name: str, mode: str = "decoupled", *, is_: str | None = None, rs: str | None = None, **run: float) -> Any:
    config = {
        "rollout_is": is_,
        "rollout_is_threshold": 2.0 if is_ else None,
        "rollout_is_batch_normalize": False,
        "rollout_rs": rs,
        "rollout_rs_threshold": "0.01" if rs else None,
    }
    metrics = {**CALM, **{key.replace("__", "/"): value for key, value in run.items()}}
    return PresetResult(name, config, mode, [], StepResult(None, 10, 100, metrics))


def comparison(*presets: Any) -> ComparisonResult:
    return ComparisonResult(inputs=["x"], columns={}, presets=list(presets))


def dropped(tokens: float, rows: float) -> dict[str, float]:
    return {"summary__rejected_token_fraction": tokens, "summary__rejected_row_fraction": rows}


def importance(ess: float, mean: float = 1.0) -> dict[str, float]:
    return {"rollout_corr__rollout_is_eff_sample_size": ess, "rollout_corr__rollout_is_mean": mean}


HAND = comparison(
    preset("disabled", "metrics only", **dropped(0, 0)),
    preset("seq_is", is_="sequence", **dropped(0, 0), **importance(0.80)),
    preset("token_is", is_="token", **dropped(0, 0), **importance(0.99)),
    preset("token_is_bypass", "bypass, reinforce", is_="token", **dropped(0, 0), **importance(0.99)),
    preset("k3_rs", rs="seq_mean_k3", **dropped(0.02, 0.05)),
    preset("geo_rs", rs="seq_mean_k1", **dropped(0.40, 0.50)),
    preset("wild_is", is_="sequence", **dropped(0, 0), **importance(0.30)),
)


def test_the_least_intrusive_correcting_preset_that_meets_the_rule_is_chosen() -> None:
    found = recommend(HAND)
    assert found.preset == "token_is"
    assert found.equivalent == ["token_is_bypass"]  # same settings, another mode: same numbers offline
    assert found.runner_up == "seq_is" and "0.8 (chosen: 0.99)" in found.runner_up_reason
    reasons = dict(found.not_chosen)
    assert reasons["k3_rs"] == "drops 2.00% of model tokens (chosen: 0.00%)"
    assert reasons["geo_rs"] == "drops 40.0% of model tokens (> 10%)"  # compare.py's intrusive rule, imported
    assert reasons["wild_is"] == "IS effective sample size 0.3 (< 0.5)"
    assert "disabled" not in reasons  # corrects nothing: never a candidate
    # least intrusive first, the presets that correct nothing last (as --sort intrusiveness lists them)
    assert found.order == ["token_is", "token_is_bypass", "seq_is", "wild_is", "k3_rs", "geo_rs", "disabled"]
    assert found.note  # every key metric ok: metrics only is defensible, and the output says so


def test_an_is_mean_outside_verls_band_and_no_candidate_at_all() -> None:
    skewed = comparison(preset("token_is", is_="token", **dropped(0, 0), **importance(0.9, mean=2.5)))
    found = recommend(skewed)
    assert found.preset is None and found.runner_up == "token_is"
    assert "mean IS weight 2.5 outside [0.5, 2]" in found.runner_up_reason
    nothing = recommend(comparison(preset("disabled", "metrics only", **dropped(0, 0))))
    assert nothing.preset is None and "corrects anything" in nothing.reasons[0]


def test_sorting_by_intrusiveness_works_on_objects_and_json() -> None:
    names = by_intrusiveness(HAND)
    assert [p.name for p in sort_by_intrusiveness(HAND).presets] == names
    document = HAND.to_json()
    assert by_intrusiveness(document) == names
    assert [p["name"] for p in sort_by_intrusiveness(document)["presets"]] == names
    assert recommend(document).to_json() == recommend(HAND).to_json()


@pytest.fixture(scope="module")
def sample_comparison() -> dict:
    return json.loads(succeeded(invoke("compare-presets", SAMPLE, "--device", "cpu", "-f", "json", "--preset", "all")))


def test_compare_presets_json_carries_the_recommendation(sample_comparison: dict) -> None:
    validator("comparison.schema.json").validate(sample_comparison)
    found = sample_comparison["recommendation"]
    # on the real bf16 dump token-level truncated IS drops nothing and keeps the highest ESS
    assert found["preset"] == "decoupled_token_is" and found["runner_up"] == "decoupled_seq_is"
    assert dict((e["preset"], e["reason"]) for e in found["not_chosen"])["decoupled_geo_rs"].startswith("drops 59.9")
    assert sorted(found["order"]) == sorted(p["name"] for p in sample_comparison["presets"])


def test_terminal_opens_with_the_answer_and_sorts_by_intrusiveness(sample_comparison: dict) -> None:
    output = succeeded(invoke("compare-presets", SAMPLE, "--device", "cpu", "--sort", "intrusiveness"))
    # the answer first: the data's verdict, then the recommendation and its reason (issue 19)
    assert output.startswith("Verdict: ")
    assert output.index("Recommendation: decoupled_token_is") < output.index("Rollout-correction presets")
    tail = output[output.index("Why decoupled_token_is") :]
    assert "runner-up: decoupled_seq_is" in tail and "rule:" in tail
    order = sample_comparison["recommendation"]["order"]
    # the table lists the presets least intrusive first, one row per group of identical numbers (the others in
    # its caption), presets that correct nothing last
    table = output[output.index("Rollout-correction presets") :]
    table = table[: table.index("(continued")] if "(continued" in table else table
    shown = [match.group(1) for match in re.finditer(r"^│ [! ] (\S+)", table, re.MULTILINE)]
    config = {p["name"]: p["config"] for p in sample_comparison["presets"]}
    ranked = [name for name in order if name in shown]
    assert shown == [n for n in ranked if corrects(config[n])] + [n for n in ranked if not corrects(config[n])]
    assert set(order) <= set(re.sub(r"[,;.]", " ", output).split())  # every preset named, in a row or a caption
    document = json.loads(
        succeeded(invoke("compare-presets", SAMPLE, "--device", "cpu", "-f", "json", "--sort", "intrusiveness"))
    )
    # the JSON in the table's order: correcting presets least intrusive first, those that correct nothing last
    listed = [p["name"] for p in document["presets"]]
    assert listed == [n for n in order if corrects(config[n])] + [n for n in order if not corrects(config[n])]
    assert set(listed[-2:]) == {"disabled", "bypass_ppo_clip"}


def test_the_recommendation_is_among_the_chosen_presets_only() -> None:
    chosen = [p for p in HAND.presets if p.name in ("seq_is", "k3_rs")]
    found = recommend(HAND, chosen)
    assert (found.preset, found.runner_up, found.order) == ("seq_is", "k3_rs", ["seq_is", "k3_rs"])


def legacy(name: str, mode: str = "truncate", bounds: tuple[float, float] = (0.5, 2.0), **run: float) -> Any:
    config = {
        "legacy_is": "token",
        "legacy_is_mode": mode,
        "legacy_is_threshold": bounds,
        "legacy_is_mask_threshold": bounds,
        "legacy_is_veto_threshold": (None, None),
    }
    metrics = {**CALM, **{key.replace("__", "/"): value for key, value in run.items()}}
    return PresetResult(name, config, "decoupled", [], StepResult(None, 10, 100, metrics))


def legacy_importance(ess: float, mean: float = 1.0) -> dict[str, float]:
    return {"mismatch__rollout_is_eff_sample_size": ess, "mismatch__rollout_is_mean": mean}


def test_a_difference_below_the_noise_bound_is_a_tie_that_goes_to_verls_current_presets() -> None:
    """The issue's case: legacy_token_truncate beat decoupled_token_is on an ESS difference of 1e-4."""
    tied = comparison(
        legacy("legacy_token_truncate", **dropped(0, 0), **legacy_importance(0.9997)),
        preset("decoupled_token_is", is_="token", **dropped(0, 0), **importance(0.9996)),
    )
    found = recommend(tied)
    assert found.preset == "decoupled_token_is" and found.ties == ["legacy_token_truncate"]
    assert "noise bound" in found.tie_reason and "before the legacy family" in found.tie_reason
    assert dict([(found.runner_up, found.runner_up_reason)])["legacy_token_truncate"].startswith("tied within")
    apart = comparison(
        legacy("legacy_token_truncate", **dropped(0, 0), **legacy_importance(0.999)),
        preset("decoupled_token_is", is_="token", **dropped(0, 0), **importance(0.95)),
    )
    assert recommend(apart).preset == "legacy_token_truncate" and not recommend(apart).ties


def test_among_ties_of_one_family_the_less_intrusive_wins() -> None:
    tied = comparison(
        preset("token_icepop", is_="token", **dropped(0.0002, 0.001), **importance(0.999)),
        preset("token_is", is_="token", **dropped(0, 0), **importance(0.995)),
    )
    found = recommend(tied)
    assert found.preset == "token_is" and found.ties == ["token_icepop"] and "less intrusive" in found.tie_reason


def test_legacy_presets_are_judged_on_the_weights_they_use() -> None:
    """A legacy preset truncating into [0.5, 2] reports its raw mean (4.06): not rejected for it; one whose used
    weights lie wholly outside the band is."""
    truncated = recommend(comparison(legacy("legacy_trunc", **dropped(0, 0), **legacy_importance(0.9, mean=4.06))))
    assert truncated.preset == "legacy_trunc"
    assert "mean IS weight 4.06 raw (before truncation)" in truncated.reasons
    outside = recommend(
        comparison(legacy("legacy_far", bounds=(2.5, 5.0), **dropped(0, 0), **legacy_importance(0.9, mean=4.06)))
    )
    assert outside.preset is None and "4.06 raw (before truncation) outside [0.5, 2]" in outside.runner_up_reason


def test_legacy_raw_values_are_marked_raw_in_the_terminal_and_the_report() -> None:
    import io

    from rich.console import Console

    from rollout_diag.render.presets import presets_table
    from rollout_diag.report import render_report

    hand = comparison(legacy("legacy_trunc", **dropped(0, 0), **legacy_importance(0.9, mean=4.06)))
    hand = ComparisonResult(
        inputs=["x"],
        columns={},
        presets=[
            PresetResult(
                p.name,
                p.config,
                p.mode,
                [StepResult(0, 10, 100, p.run.metrics)],
                StepResult(None, 10, 100, {**p.run.metrics, "mismatch/rollout_is_max": 9.5}),
            )
            for p in hand.presets
        ],
    )
    stream = io.StringIO()
    Console(file=stream, width=200, color_system=None).print(presets_table(hand))
    assert "4.06 raw" in stream.getvalue() and "9.5 raw" in stream.getvalue()
    page = render_report(hand)
    assert "4.06 raw" in page and "9.5 raw" in page


def test_the_recommendation_lives_in_the_comparison_and_its_json() -> None:
    from rollout_diag.results import Recommendation

    found = recommend(HAND)
    carried = ComparisonResult(inputs=["x"], columns={}, presets=HAND.presets, recommendation=found)
    again = ComparisonResult.from_json(json.loads(json.dumps(carried.to_json())))
    assert isinstance(again.recommendation, Recommendation) and again.recommendation == found
    assert again.recommendation_withheld is None


# ------------------------------------------------------------------------------------------ no correction needed
def test_a_preset_that_changes_nothing_is_no_candidate_and_a_missing_ess_never_ties_as_one() -> None:
    hand = comparison(
        # seq_mean_k3 at 0.01 drops nothing and has no IS weights: it used to win as "ESS 1, less intrusive"
        preset("k3_rs", rs="seq_mean_k3", **dropped(0, 0)),
        preset("token_is", is_="token", **dropped(0, 0), **importance(0.995)),
        preset("seq_is", is_="sequence", **dropped(0, 0), **importance(0.48)),
    )
    found = recommend(hand)
    assert found.preset == "token_is" and found.ties == []
    assert dict(found.not_chosen)["k3_rs"] == "neither reweights nor drops a single token on this data"
    # an RS preset that drops a few tokens (within the 0.1-point tie bound) has no ESS: not tied with ESS 0.995
    dropping = comparison(
        preset("k3_rs", rs="seq_mean_k3", **dropped(0.0004, 0.004)),
        preset("token_is", is_="token", **dropped(0, 0), **importance(0.995)),
    )
    assert recommend(dropping).ties == [] and recommend(dropping).preset == "token_is"
    # IS weights all exactly 1 (min = max = 1) and nothing dropped: no candidate either
    unit = {"rollout_corr__rollout_is_min": 1.0, "rollout_corr__rollout_is_max": 1.0}
    idle = recommend(comparison(preset("token_is", is_="token", **dropped(0, 0), **importance(1.0), **unit)))
    assert idle.preset is None and "neither reweights nor drops" in idle.reasons[0]


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> dict[str, Path]:
    from helpers.verdicts import identical, long_rows, one_row

    folder = tmp_path_factory.mktemp("shapes")
    return {
        "identical": identical(folder / "identical.parquet"),
        "one_row": one_row(folder / "one_row.parquet"),  # 91 model tokens in one row
        "long_rows": long_rows(folder / "long_rows.parquet"),  # 16 rows of 8 192 tokens, δ ~ N(0, 0.02²)
    }


def compared(path: Path) -> dict:
    document = json.loads(succeeded(invoke("compare-presets", path, "--device", "cpu", "-f", "json")))
    validator("comparison.schema.json").validate(document)
    return document


@pytest.mark.parametrize(
    ("shape", "why"),
    [
        ("identical", "no correction needed: trainer and rollout logprobs are identical on every model token"),
        ("one_row", "too little data to choose a correction (91 model tokens in 1 row;"),
        ("long_rows", "no correction needed: every key mismatch metric is ok"),
    ],
)
def test_no_correction_is_recommended_where_none_is_needed_or_the_data_cannot_choose(shapes, shape, why) -> None:
    document = compared(shapes[shape])
    assert document["recommendation"] is None and why in document["recommendation_withheld"]
    output = succeeded(invoke("compare-presets", shapes[shape], "--device", "cpu"))
    lines = output.splitlines()
    line = next(index for index, text in enumerate(lines) if text.startswith("Recommendation: "))
    assert " ".join(" ".join(lines[line : line + 3]).split()).find(why) > 0  # one line in the terminal (wrapped)
    assert line < next(index for index, text in enumerate(lines) if text.startswith("Rollout-correction presets"))


def test_on_long_rows_a_k3_preset_that_drops_nothing_is_never_recommended(shapes) -> None:
    document = compared(shapes["long_rows"])
    presets = {p["name"]: p["run"]["metrics"] for p in document["presets"]}
    assert presets["decoupled_k3_rs"]["summary/rejected_token_fraction"] == 0.0  # row mean k3 ≈ 2e-4 < 0.01
    found = recommend(document)  # what the rule picks if asked anyway (the comparison withholds: verdict ok)
    assert found.preset not in ("decoupled_k3_rs", "bypass_ppo_clip_k3_rs", "decoupled_geo_rs")
    assert dict(found.not_chosen)["decoupled_k3_rs"] == "neither reweights nor drops a single token on this data"
    assert "decoupled_k3_rs" not in found.ties


def test_the_report_says_no_correction_is_needed(shapes) -> None:
    import rollout_diag as rd
    from rollout_diag.report import render_report

    path = str(shapes["identical"])
    page = render_report(rd.analyze(path, device="cpu"), comparison=rd.compare_presets(path, device="cpu"))
    banner = page[: page.index("</div>", page.index('class="overall'))]
    assert "<strong>Recommendation:</strong> no correction needed" in banner and "agree exactly" in banner
