"""The result contract (rollout_diag/results/): typed results read back from their JSON, the JSON unchanged by
the typed sweep rows, and the report taking typed results at its boundary."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import rollout_diag as rd
from rollout_diag.drivers.passes import open_reader, run_chunks
from rollout_diag.errors import ConfigError, InputError
from rollout_diag.metrics.sweep import SweepAccumulator, sweep_tables
from rollout_diag.report import render_report
from rollout_diag.results import ComparisonResult, PresetResult, StepResult, SweepOption, SweepResult, SweepStep

SAMPLE = Path(__file__).resolve().parents[2] / "sample_data" / "textgenrnn_bf16_vs_fp32.parquet"


@pytest.fixture(scope="module")
def tables() -> tuple[list[dict], list[dict]]:
    """The sweep accumulator's own tables (plain dicts) on the bundled dump: what the JSON held before typing."""
    sweep = SweepAccumulator()
    run_chunks(open_reader(str(SAMPLE), None, strict=False, chunk_tokens=4096), [sweep.update], "cpu")
    run, steps = sweep_tables(sweep, (0.01, 0.05))
    return run, list(steps)  # the per-step tables are computed when read


@pytest.fixture(scope="module")
def comparison() -> ComparisonResult:
    return rd.compare_presets(str(SAMPLE), ["decoupled_token_is", "decoupled_k3_rs", "decoupled_geo_rs"], device="cpu")


def test_typed_sweep_rows_write_the_accumulator_tables_unchanged(tables):
    run, steps = tables
    assert any(row.get("curve") for row in run) and any("default_share" in row for row in run)
    assert any(row["verl_default"] is None for row in run), "rows without verl's default keep their keys absent"
    for row in run:
        typed = SweepOption.from_json(row)
        assert typed.to_json() == row and list(typed.to_json()) == list(row)  # same keys, same order
    assert [SweepStep.from_json(entry).to_json() for entry in steps] == steps


def test_threshold_sweep_returns_typed_rows(tables):
    result = rd.threshold_sweep(str(SAMPLE), targets=(0.01, 0.05), device="cpu")
    assert isinstance(result, SweepResult) and all(isinstance(option, SweepOption) for option in result.run)
    assert all(isinstance(step, SweepStep) for step in result.steps)
    document = json.loads(json.dumps(result.to_json()))
    assert document["run"] == json.loads(json.dumps(tables[0]))
    assert document["steps"] == json.loads(json.dumps(tables[1]))


def test_comparison_reads_back_from_its_json(comparison):
    document = json.loads(json.dumps(comparison.to_json()))
    back = ComparisonResult.from_json(document)
    assert back.to_json() == document
    assert all(isinstance(option, SweepOption) for option in back.sweep)
    assert [p.intrusive_reasons for p in back.presets] == [p.intrusive_reasons for p in comparison.presets]
    assert back.preset("decoupled_k3_rs").run.metrics == comparison.preset("decoupled_k3_rs").run.metrics


def test_comparison_from_json_rejects_another_document():
    with pytest.raises(InputError, match="not a `compare-presets --format json` result"):
        ComparisonResult.from_json({"run": {}, "steps": []})
    with pytest.raises(InputError, match="not a `compare-presets --format json` result"):
        ComparisonResult.from_json({"inputs": [], "columns": {}, "presets": [], "intrusive": "high"})


def test_preset_result_json_round_trip():
    run = StepResult(None, 4, 100, {"summary/rejected_token_fraction": 0.2})
    preset = PresetResult("k3", {"rollout_rs": "seq_mean_k3"}, "decoupled", [], run, ("drops 20.0 % of tokens",))
    document = preset.to_json()
    assert document["intrusive"] is True and PresetResult.from_json(document) == preset


def test_report_of_a_comparison_takes_no_second_comparison(comparison):
    html = render_report(comparison)
    assert '<section id="presets">' in html
    with pytest.raises(ConfigError, match="one comparison"):
        render_report(comparison, comparison=comparison)


# ----------------------------------------------------------------------------------------------- short reprs
def _public_results(path: str, tmp_path: Path) -> dict[str, object]:
    """Every result type the public API returns (and the results they hold), on the dump at ``path``."""
    from rollout_diag.drivers.watch import StepReport, WatchUpdate

    analysis, comparison = rd.analyze_and_compare(path, ["decoupled_token_is", "decoupled_k3_rs"], device="cpu")
    difference = rd.diff_runs(path, path, device="cpu", replicates=100)
    first = analysis.worst_rows[0]
    update = WatchUpdate(
        analysis, "bad", "x" * 100_000, [StepReport(0, 0, 1, 1, {}, "ok")] * 5_000, ["note"] * 5_000, [], 1.0, True, []
    )
    return {
        "analysis": analysis,
        "comparison": comparison,
        "preset": comparison.presets[0],
        "recommendation": comparison.recommendation,
        "step": analysis.steps[0],
        "run": analysis.run,
        "sweep": rd.threshold_sweep(path, device="cpu"),
        "row": rd.inspect_row(path, first.sample_id, step=first.step, device="cpu"),
        "whole row": rd.inspect_row(path, first.sample_id, step=first.step, whole_row=True, device="cpu"),
        "check": rd.check_run(path, [rd.Gate("rollout_corr/k3_kl", "max", 1e-9)], per_step=True, device="cpu"),
        "diff": difference,
        "row stats": difference.a.rows,
        "convert": rd.convert(path, tmp_path / "converted"),
        "watch update": update,
        "step report": update.steps[0],
        "group": analysis.groups[0] if analysis.groups else None,
    }


def _large_dump(tmp_path: Path) -> str:
    """Many steps, a 60 000-token row and 2 000-character sample ids and file name: a repr that echoed any of them
    (a StepResult per step, a row's tokens, a whole id) would pass 1 000 characters many times over."""
    from helpers.dumps import random_rows, write_sequence_dump

    rows = random_rows(3, steps=range(300), rows_per_step=2, max_length=40)
    for row in rows:
        row["sample_id"] = f"{row['sample_id']}-" + "i" * 2_000
    rows[5]["rollout"] = rows[5]["rollout"] * (60_000 // len(rows[5]["rollout"]) + 1)
    rows[5]["trainer"] = rows[5]["trainer"] * (60_000 // len(rows[5]["trainer"]) + 1)
    rows[5]["mask"] = rows[5]["mask"] * (60_000 // len(rows[5]["mask"]) + 1)
    return str(write_sequence_dump(tmp_path / ("d" * 200) / "large.parquet", rows))


@pytest.mark.parametrize("dump", ["sample", "large"])
def test_every_result_repr_is_short_and_leads_with_the_answer(tmp_path, dump):
    path = str(SAMPLE) if dump == "sample" else _large_dump(tmp_path)
    results = _public_results(path, tmp_path)
    for name, result in results.items():
        if result is None:
            continue
        text = repr(result)
        assert len(text) <= 1_000, (name, len(text))
        assert text.startswith(f"<{type(result).__name__}: "), (name, text[:80])
    analysis, comparison = results["analysis"], results["comparison"]
    level = analysis.verdict.level
    assert repr(analysis).startswith(f"<AnalysisResult: verdict {level} ({analysis.verdict.cause}): ")
    assert f"{analysis.run.rows:,} rows, {analysis.run.tokens:,} model tokens, {len(analysis.steps):,} steps" in repr(
        analysis
    )
    assert f"{analysis.skipped_rows:,} rows skipped" in repr(analysis)
    key = "rollout_corr/k3_kl"
    worst = max(analysis.steps, key=lambda step: step.metrics[key])
    assert f"worst step {worst.step} (k3_kl {worst.metrics[key]:.4g})" in repr(analysis)
    answer = comparison.recommendation.preset if comparison.recommendation else None
    assert (f"recommended {answer}" if answer else "no recommendation") in repr(comparison)
    row = results["row"]
    assert f"tokens {row.start:,}–{row.start + len(row.mask):,} of " in repr(row)


def test_comparison_notebook_view_starts_with_the_verdict_and_the_recommendation(comparison):
    page = comparison._repr_html_()
    verdict, answer, table = page.index("Verdict:"), page.index("Recommended:"), page.index("<table>")
    assert verdict < answer < table and comparison.recommendation.preset in page[answer:table]
    withheld = dataclasses.replace(comparison, recommendation=None, recommendation_withheld="the data is too small")
    page = withheld._repr_html_()
    assert page.index("Verdict:") < page.index("No recommendation: the data is too small") < page.index("<table>")
