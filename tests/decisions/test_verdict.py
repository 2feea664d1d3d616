"""The overall verdict (issue 19): one object in the result, the same in JSON, the terminal's first lines and the
report banner; pipeline bugs take over; length-aware; a few outliers told from a broad mismatch.

The altered copies are built from the bundled samples by tests/helpers/verdicts.py (each with one known bug).
"""

from __future__ import annotations

import html
import io
import json
import math
import re
from functools import partial
from pathlib import Path

import jsonschema
import pytest
from helpers.verdicts import (
    MULTITURN,
    REAL,
    concatenated,
    identical,
    long_rows,
    mask_dropped,
    one_row,
    processed,
    shifted,
)
from rich.console import Console

import rollout_diag as rd
from rollout_diag import catalogue
from rollout_diag.decisions.analysis import ROUND_STANDS_OUT, anomaly_check, divergent_round
from rollout_diag.decisions.verdict import LITTLE_DATA_TOKENS, overall_verdict
from rollout_diag.render.analysis import render_analysis
from rollout_diag.report import render_report
from rollout_diag.results import AnalysisResult, Hint, OverallVerdict

REPO = Path(__file__).resolve().parents[2]
RESULT_SCHEMA = json.loads((REPO / "schemas" / "result.schema.json").read_text())


def terminal(result: AnalysisResult, width: int = 200) -> list[str]:
    stream = io.StringIO()
    Console(file=stream, width=width, color_system=None, soft_wrap=False).print(render_analysis(result))
    return stream.getvalue().splitlines()


def banner(result: AnalysisResult) -> str:
    """The report's verdict banner as text."""
    page = render_report(result)
    found = re.search(r'<div class="overall [a-z]+">(.*?)</div>', page, re.S)
    assert found, "the report has no verdict banner"
    return html.unescape(re.sub(r"<[^>]+>", " ", found.group(1)))


def squash(text: str) -> str:
    return " ".join(text.split())


def agree(result: AnalysisResult) -> dict:
    """The JSON verdict, after checking that the terminal's first lines and the report banner say the same."""
    document = json.loads(json.dumps(result.to_json(), allow_nan=False))
    jsonschema.validate(document, RESULT_SCHEMA)
    verdict = document["verdict"]
    lines = terminal(result)
    assert lines[2].startswith(f"Verdict: {verdict['level'].upper()}"), lines[2]
    head = squash(" ".join(lines[2:12]))
    assert squash(verdict["sentence"]) in head
    shown = squash(banner(result))
    assert f"Verdict: {verdict['level']}" in shown and squash(verdict["sentence"]) in shown
    for finding in verdict["findings"]:  # printed directly under the verdict, in both
        assert f"↳ {finding}:" in head and finding in shown
    for note in verdict["notes"]:
        assert squash(note) in head and squash(note) in shown
    return verdict


@pytest.fixture(scope="module")
def altered(tmp_path_factory) -> dict[str, AnalysisResult]:
    folder = tmp_path_factory.mktemp("altered")
    makers = {
        "shifted": shifted,
        "processed": processed,
        "mask_dropped": mask_dropped,
        "concatenated": concatenated,
        "long_rows": long_rows,
        "one_row": one_row,
        "identical": identical,
        # 6 350 tokens per row, δ ~ N(−σ²/2, σ²) with σ = 0.08: a row's log-weight S ~ N(−20.3, 6.4²), so nearly every
        # row's exp(2S) is ≈ 0 and chi2_seq ≈ −1 while the weights are degenerate
        "long_degenerate": partial(long_rows, length=6350, rows=24, sigma=0.08, shift=-0.0032),
    }
    return {name: rd.analyze(str(make(folder / f"{name}.parquet")), device="cpu") for name, make in makers.items()}


@pytest.fixture(scope="module")
def samples() -> dict[str, AnalysisResult]:
    return {path.name: rd.analyze(str(path), device="cpu") for path in (REAL, MULTITURN)}


# ------------------------------------------------------------------------------------------ pipeline bugs
@pytest.mark.parametrize(
    ("case", "first", "fix"),
    [
        ("shifted", "off_by_one", "off-by-one gather"),
        ("processed", "processed_logprobs", "same distribution"),
        ("mask_dropped", "no_mask", "--column mask="),
    ],
)
def test_a_pipeline_bug_takes_over_the_verdict(altered, case, first, fix):
    verdict = agree(altered[case])
    assert verdict["level"] == "bad" and verdict["cause"] == "pipeline"
    assert verdict["findings"][0] == first and fix in verdict["sentence"]
    assert "consider a rollout correction" not in verdict["sentence"]


def test_a_dropped_mask_also_shows_the_placeholder_zeros(altered):
    verdict = altered["mask_dropped"].verdict
    assert verdict.findings == ["no_mask", "dummy_logprobs"]


def test_isolated_exact_zeros_are_placeholders_too():
    """One exact 0.0 rollout logprob every 20 tokens where the trainer says p ≈ 0.05: no run, still flagged."""
    from rollout_diag.decisions.hints import Evidence, dummy_logprobs

    sums = {"dummy_zero": 50.0, "dummy_zero_run": 0.0, "copied": 0.0, "tokens": 1000.0}
    found = dummy_logprobs(Evidence(run=sums, steps={0: sums}))
    assert found is not None and "50 isolated" in found.message
    assert dummy_logprobs(Evidence(run=sums, steps={0: sums}), isolated=False) is None


def test_compare_presets_withholds_its_recommendation_on_a_pipeline_bug(tmp_path):
    path = shifted(tmp_path / "shifted.parquet")
    comparison = rd.compare_presets(str(path), ["decoupled_token_is", "decoupled_seq_is"], device="cpu")
    assert comparison.recommendation is None
    assert "pipeline bug (off_by_one" in comparison.recommendation_withheld
    document = json.loads(json.dumps(comparison.to_json(), allow_nan=False))
    assert document["recommendation"] is None and document["recommendation_withheld"].startswith("withheld")
    assert document["verdict"]["cause"] == "pipeline"
    schema = json.loads((REPO / "schemas" / "comparison.schema.json").read_text())
    resources = {f"rollout-diag/{p.name}": json.loads(p.read_text()) for p in (REPO / "schemas").glob("*.schema.json")}
    from referencing import Registry, Resource

    registry = Registry().with_resources((uri, Resource.from_contents(doc)) for uri, doc in resources.items())
    jsonschema.Draft202012Validator(schema, registry=registry).validate(document)
    from rollout_diag.render.presets import answer_block

    stream = io.StringIO()
    console = Console(file=stream, width=160, color_system=None, soft_wrap=False)
    for line in answer_block(comparison):
        console.print(line)
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("Verdict: BAD (pipeline bug)")
    assert any(line.startswith("Recommendation: withheld") for line in lines)
    page = render_report(comparison)
    assert "Recommendation:</strong> withheld" in page


# ------------------------------------------------------------------------------------------ clean data stays silent
def test_the_bundled_samples_raise_no_pipeline_finding(samples):
    for name, result in samples.items():
        verdict = agree(result)
        assert verdict["cause"] != "pipeline", name
        assert not {"off_by_one", "no_mask", "dummy_logprobs", "processed_logprobs"} & {h.id for h in result.hints}


def test_a_few_outliers_are_told_from_a_broad_mismatch(samples):
    """The multi-turn sample: 23 catastrophic tokens make k3_kl and χ² bad; without them both are ok."""
    result = samples[MULTITURN.name]
    metrics = result.run.metrics
    assert metrics[catalogue.CATASTROPHIC_TOKENS.key] == 23
    assert metrics[catalogue.K3_KL_WITHOUT_CATASTROPHIC.key] < catalogue.K3_KL.verdict.watch
    assert metrics[catalogue.CHI2_TOKEN_WITHOUT_CATASTROPHIC.key] < catalogue.CHI2_TOKEN.verdict.watch
    verdict = result.verdict
    assert verdict.level == "bad" and verdict.cause == "mismatch"
    assert "23 catastrophic token(s)" in verdict.sentence and "not a broad mismatch" in verdict.sentence


def test_the_sums_without_catastrophic_tokens_match_a_direct_computation(samples):
    import numpy as np
    import pyarrow.parquet as pq

    table = pq.read_table(MULTITURN, columns=["rollout_log_probs", "old_log_probs", "response_mask"]).to_pydict()
    deltas = []
    for r, a, m in zip(table["rollout_log_probs"], table["old_log_probs"], table["response_mask"], strict=True):
        keep = np.asarray(m) == 1
        deltas.append(np.asarray(a, np.float64)[keep] - np.asarray(r, np.float64)[keep])
    delta = np.concatenate(deltas)
    kept = delta[np.abs(delta) <= 1.0]
    k3 = np.sum(np.expm1(kept) - kept) / (kept.size + 1e-8)
    chi2 = np.sum(np.exp(2 * np.clip(kept, -20, 20))) / (kept.size + 1e-8) - 1
    metrics = samples[MULTITURN.name].run.metrics
    assert math.isclose(metrics[catalogue.K3_KL_WITHOUT_CATASTROPHIC.key], k3, rel_tol=1e-9)
    assert math.isclose(metrics[catalogue.CHI2_TOKEN_WITHOUT_CATASTROPHIC.key], chi2, rel_tol=1e-9)


# ------------------------------------------------------------------------------------------ length-aware
def test_long_rows_are_not_bad_on_chi2_seq_alone(altered):
    result = altered["long_rows"]
    levels = {v.metric: v.level for v in result.verdicts}
    assert levels[catalogue.CHI2_SEQ.key] == "bad" and levels[catalogue.K3_KL.key] == "ok"
    verdict = agree(result)
    assert verdict["level"] == "ok" and catalogue.CHI2_SEQ.key not in verdict["metrics"]
    note = "degenerate at a mean of 8192 tokens per row: prefer token-level correction"
    assert any(note in text for text in verdict["notes"])
    assert all(entry["level"] == "ok" for entry in result.step_levels)


def test_real_tokens_in_8k_rows_are_not_bad(altered):
    verdict = agree(altered["concatenated"])
    assert verdict["level"] != "bad" and verdict["cause"] != "pipeline"


def test_a_negative_chi2_gets_a_note_and_is_never_large():
    metrics = {catalogue.K3_KL.key: 1e-4, catalogue.CHI2_TOKEN.key: -0.5, catalogue.CHI2_SEQ.key: -0.05}
    verdict = overall_verdict(metrics, rows=100, tokens=10_000)
    assert verdict.level == "ok"
    assert sum("is negative" in note for note in verdict.notes) == 2


# 100 rows of 100 tokens, k3_kl 1e-4: σ² = 100 · 2e-4 = 0.02; one standard error of a log-normal ρ's mean of ρ² over
# 100 rows = sqrt((e^0.12 − e^0.04) / 100) = sqrt((1.127497 − 1.040811) / 100) = 0.02944, so 3 SE = 0.0883
@pytest.mark.parametrize(
    ("chi2_seq", "k3", "reading"),
    [
        (-0.05, 1e-4, "within the sampling noise of 100 rows (±0.02944"),  # −0.05 ≥ −0.0883: noise
        (-0.2, 1e-4, "below what sampling noise over 100 rows explains"),  # −0.2 < −0.0883, σ² small: a shift
        (-0.6, 1e-4, "near −1: what degenerate sequence weights give"),  # ≤ −0.5: at least half the rows ≈ 0
        (-0.1, 1e-2, "(negative): what degenerate sequence weights give"),  # σ² = 100 · 0.02 = 2 > 1
    ],
)
def test_a_negative_chi2_seq_is_read_from_the_row_count_and_the_spread(chi2_seq, k3, reading):
    metrics = {catalogue.K3_KL.key: k3, catalogue.CHI2_SEQ.key: chi2_seq}
    notes = [n for n in overall_verdict(metrics, rows=100, tokens=10_000).notes if n.startswith("chi2_seq")]
    assert len(notes) == 1 and reading in notes[0], notes
    degenerate = "degenerate at a mean of 100 tokens per row: prefer token-level correction" in notes[0]
    assert degenerate == ("degenerate sequence weights" in reading)
    assert ("read as ≈ 0" in notes[0]) == reading.startswith("within")


def test_long_rows_with_chi2_seq_near_minus_one_get_the_degenerate_sentence(altered):
    result = altered["long_degenerate"]
    chi2 = result.run.metrics[catalogue.CHI2_SEQ.key]
    assert -1.0 <= chi2 < -0.99  # exp(2S) ≈ 0 for S ~ N(−20.3, 6.4²) in all 24 rows (measured: −0.999999999)
    verdict = agree(result)
    note = next(text for text in verdict["notes"] if text.startswith("chi2_seq"))
    assert "near −1" in note and "degenerate at a mean of 6350 tokens per row: prefer token-level correction" in note
    assert "no spread" not in note and "read as ≈ 0" not in note


def test_identical_logprobs_agree_exactly_and_say_nothing_else(altered):
    result = altered["identical"]
    assert result.run.metrics[catalogue.LOGPROB_ABS_DIFF.key] == 0.0
    verdict = agree(result)
    assert (verdict["level"], verdict["cause"], verdict["notes"]) == ("ok", "identical", [])
    assert "agree exactly" in verdict["sentence"] and f"{result.run.tokens} model tokens" in verdict["sentence"]
    head = "\n".join(terminal(result)[:8])
    # no χ² of −4e-13 read as a finding, no "worst step 0 (k3_kl 0)": identical logprobs have no worst place
    assert "is negative" not in head and "worst step" not in head and "Where:" not in head
    grouped = rd.analyze(str(result.inputs[0]), device="cpu", by=["num_rounds"])  # nor a worst group of k3_kl 0
    assert grouped.groups and "Where:" not in "\n".join(terminal(grouped)[:8])


def test_little_data_says_so(altered):
    verdict = agree(altered["one_row"])
    assert any("judged on little data" in note and "in 1 row" in note for note in verdict["notes"])
    big = overall_verdict({catalogue.K3_KL.key: 1e-4}, rows=50, tokens=LITTLE_DATA_TOKENS + 1)
    assert not big.notes


def test_the_verdict_is_a_pure_function_of_metrics_and_hints():
    metrics = {catalogue.K3_KL.key: 0.02}
    mismatch = overall_verdict(metrics, rows=10, tokens=5000)
    assert (mismatch.level, mismatch.cause, mismatch.metrics) == ("bad", "mismatch", [catalogue.K3_KL.key])
    hint = Hint("processed_logprobs", "…", {})
    pipeline = overall_verdict(metrics, [hint], rows=10, tokens=5000)
    assert (pipeline.level, pipeline.cause, pipeline.findings) == ("bad", "pipeline", ["processed_logprobs"])
    clean = overall_verdict({catalogue.K3_KL.key: 1e-4}, [Hint("low_probability", "…", {})], rows=10, tokens=5000)
    assert (clean.level, clean.cause) == ("ok", "none")


def test_the_verdict_round_trips_through_json(samples):
    result = samples[REAL.name]
    again = AnalysisResult.from_json(json.loads(json.dumps(result.to_json())))
    assert again.verdict == result.verdict and isinstance(again.verdict, OverallVerdict)
    assert again.step_levels == result.step_levels and again.divergent_round == result.divergent_round


# ------------------------------------------------------------------------------------------ anomalies, rounds
def test_the_anomaly_rule_says_when_it_cannot_apply():
    assert anomaly_check(6) == "anomaly check needs 9+ steps; this run has 6"
    assert anomaly_check(1) == "" and anomaly_check(9) == ""


def test_a_short_run_says_the_anomaly_check_did_not_run(samples):
    result = samples[REAL.name]  # 4 steps
    assert result.anomaly_check == "anomaly check needs 9+ steps; this run has 4"
    assert any("anomaly check needs 9+ steps; this run has 4" in line for line in terminal(result))
    assert "Anomaly check needs 9+ steps; this run has 4" in render_report(result)


def test_a_round_that_does_not_stand_out_is_not_painted_as_one(samples):
    real = samples[REAL.name]
    assert real.divergent_round is not None and not real.divergent_round.stands_out
    assert real.divergent_round.factor < ROUND_STANDS_OUT
    page = render_report(real)
    assert "No round stands out" in page and "most divergent in red" not in page
    multi = samples[MULTITURN.name]
    named = int(multi.run.metrics[catalogue.MOST_DIVERGENT_ROUND.key])
    assert multi.divergent_round.round == named and multi.divergent_round.stands_out


def test_divergent_round_reads_the_support_rules_choice():
    rounds = [
        {"round": 0, "pooled": False, "logprob_abs_diff_mean": 0.010, "token_count": 5000, "seq_count": 50},
        {"round": 1, "pooled": False, "logprob_abs_diff_mean": 0.030, "token_count": 1000, "seq_count": 50},
        {"round": 2, "pooled": False, "logprob_abs_diff_mean": 0.500, "token_count": 40, "seq_count": 2},  # no support
    ]
    found = divergent_round(rounds, {catalogue.MOST_DIVERGENT_ROUND.key: 1.0})
    # no max_abs_diff: the one-token test cannot apply (factor_without_largest None), the gap stands
    assert found.round == 1 and found.stands_out and found.factor_without_largest is None
    assert found.unsupported == [2]  # 40 tokens < min(200, 0.1 × 5000)
    assert divergent_round(rounds, {}) is None


def test_report_and_analyze_name_the_same_round_levels_and_recommendation(samples, tmp_path):
    """Both read the result: the most divergent round, the per-step levels, the recommendation."""
    for result in samples.values():
        text = "\n".join(terminal(result))
        page = html.unescape(render_report(result))
        found = result.divergent_round
        if found is not None and found.stands_out:
            assert f"most divergent round {found.round} " in text
            assert f"Most divergent round: {found.round} " in page
        counts = {}
        for entry in result.step_levels:
            for metric, level in entry["levels"].items():
                counts.setdefault(metric, [0, 0])
                counts[metric][0] += level == "watch"
                counts[metric][1] += level == "bad"
        for verdict in result.verdicts:
            watch, bad = counts[verdict.metric]
            assert f"steps at watch / bad: {watch} / {bad}" in page
    analysis, comparison = rd.analyze_and_compare(str(REAL), ["decoupled_token_is", "decoupled_seq_is"], device="cpu")
    page = html.unescape(render_report(analysis, comparison=comparison))
    assert f"Recommendation: {comparison.recommendation.preset}" in re.sub(r"<[^>]+>", "", page)


# ------------------------------------------------------------------------------------------ roles, once
def test_each_metrics_roles_are_declared_once_in_its_catalogue_row():
    from rollout_diag.decisions.levels import JUDGED
    from rollout_diag.decisions.rowmetrics import KEY_METRIC_NAMES, ROW_VALUES
    from rollout_diag.decisions.trends import ANOMALY_METRICS
    from rollout_diag.metrics.rowstats import ROW_SUMS
    from rollout_diag.report.sections import TREND_METRICS

    Role = catalogue.Role
    rows = list(catalogue.CATALOGUE.values())
    assert (
        {m.key for m in JUDGED}
        == {m.key for m in rows if m.verdict is not None}
        == set(catalogue.keys_with_role(Role.JUDGED))
    )
    # a row formula is what a bootstrap over rows resamples: diff's key metrics and runs' metrics have one
    resampled = {*catalogue.keys_with_role(Role.BOOTSTRAPPED), *catalogue.keys_with_role(Role.RUNS)}
    assert {m.key for m in rows if m.row is not None} == resampled
    assert catalogue.keys_with_role(Role.BOOTSTRAPPED) == KEY_METRIC_NAMES
    assert catalogue.keys_with_role(Role.ANOMALY) == ANOMALY_METRICS
    assert tuple(m.key for m in TREND_METRICS) == catalogue.keys_with_role(Role.TRENDED)
    for metric in catalogue.with_role(Role.BOOTSTRAPPED):
        formula = metric.row
        known = ROW_SUMS if formula.kind == "token" else (*ROW_VALUES, *(f"row_mean:{name}" for name in ROW_SUMS))
        assert formula.of in known, metric.key
    for metric in rows:
        assert all(role in Role.ALL for role, _ in metric.roles), metric.key


def test_the_readme_excerpt_is_what_analyze_prints(samples):
    """README "What `analyze` prints" shows the real first lines: the verdict and the round phrase drift with code."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## What `analyze` prints") :]
    block = section[section.index("```\n") + 4 : section.index("\n```", section.index("```\n") + 4)]
    verdict_text = squash(block[: block.index("Where:")])
    result = samples[REAL.name]
    assert verdict_text == squash(f"Verdict: {result.verdict.level.upper()} — {result.verdict.sentence}")
    where = squash(block[block.index("Where:") : block.index("Key metrics")])
    head = squash(" ".join(terminal(result, width=120)[2:12]))
    assert where.rstrip("…").strip() in head


def test_one_token_cannot_make_a_round_stand_out():
    # round 1: mean |δ| 0.05 over 300 tokens, one of them |δ| 9 (Σ|δ| = 15); the others' mean 0.02 → 2.5×. Without
    # its largest token: (15 − 9) / 299 = 0.020067 → 1.003× the others: made by one token, not standing out
    rounds = [
        {"round": 0, "pooled": False, "logprob_abs_diff_mean": 0.02, "token_count": 3000, "seq_count": 30,
         "max_abs_diff": 0.3},
        {"round": 1, "pooled": False, "logprob_abs_diff_mean": 0.05, "token_count": 300, "seq_count": 30,
         "max_abs_diff": 9.0},
    ]  # fmt: skip
    found = divergent_round(rounds, {catalogue.MOST_DIVERGENT_ROUND.key: 1.0})
    assert found.factor == pytest.approx(2.5)
    assert found.factor_without_largest == pytest.approx((15 - 9) / 299 / 0.02)
    assert not found.stands_out and found.note == "made by one token: 1× the others without its largest |δ| (9)"
    # a broad gap: the largest token |δ| 0.3 leaves (15 − 0.3) / 299 = 0.04916 → 2.46×: it stands out, no note
    broad = divergent_round([rounds[0], {**rounds[1], "max_abs_diff": 0.3}], {catalogue.MOST_DIVERGENT_ROUND.key: 1.0})
    assert broad.stands_out and broad.note == "" and broad.unsupported == []


def test_the_round_chart_marks_rounds_below_the_support_rule_and_all_outputs_agree(samples):
    import dataclasses

    from rollout_diag.export.notebook import analysis_html
    from rollout_diag.report.figures import BLUE, GREY, RED
    from rollout_diag.report.sections import Canvas, rounds_section

    multi = samples[MULTITURN.name]
    named = multi.divergent_round.round
    tall = {**multi.rounds[-1], "round": 60, "pooled": False, "logprob_abs_diff_mean": 50.0, "token_count": 4,
            "seq_count": 1, "max_abs_diff": 60.0}  # fmt: skip
    rounds = [*multi.rounds, tall]  # the tallest bar, on 4 tokens of 1 row: below the support rule
    result = dataclasses.replace(multi, rounds=rounds, divergent_round=divergent_round(rounds, multi.run.metrics))
    assert result.divergent_round.round == named and 60 in result.divergent_round.unsupported
    canvas = Canvas()
    section = rounds_section(result, canvas)
    colours = canvas.figures["rounds"]["data"][0]["marker"]["color"]
    by_round = dict(zip([r["round"] for r in sorted(rounds, key=lambda r: r["round"])], colours, strict=True))
    assert by_round[named] == RED and by_round[60] == GREY
    others = set(by_round) - {named, 60} - set(result.divergent_round.unsupported)
    assert {by_round[r] for r in others} <= {BLUE}
    assert "grey: too few tokens or rows to be named" in str(canvas.figures["rounds"]) and section.body
    # the terminal, the report and the notebook name the same round, or none
    assert f"most divergent round {named} " in "\n".join(terminal(result))
    assert f"Most divergent round: {named} " in html.unescape(render_report(result))
    assert f"most divergent round {named} " in html.unescape(analysis_html(result))
