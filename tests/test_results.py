"""The result contract (rollout_diag/results.py): typed results read back from their JSON, the JSON unchanged by
the typed sweep rows, and the report taking typed results at its boundary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import rollout_diag as rd
from rollout_diag.drivers.passes import open_reader, run_chunks
from rollout_diag.errors import ConfigError, InputError
from rollout_diag.metrics.sweep import SweepAccumulator, sweep_tables
from rollout_diag.report import render_report
from rollout_diag.results import ComparisonResult, PresetResult, StepResult, SweepOption, SweepResult, SweepStep

SAMPLE = Path(__file__).resolve().parent.parent / "sample_data" / "textgenrnn_bf16_vs_fp32.parquet"


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
