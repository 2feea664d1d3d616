"""compare-presets, sweep and report through the command line, on the bundled real dump."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers.cli import TUNED, error_line, invoke, succeeded

from rollout_diag.presets import VERL_PRESETS as VERL

VERL_PRESETS = [preset.name for preset in VERL]

SAMPLE = Path(__file__).resolve().parents[2] / "sample_data" / "textgenrnn_bf16_vs_fp32.parquet"


@pytest.fixture(scope="module")
def comparison_json() -> dict:
    return json.loads(succeeded(invoke("compare-presets", SAMPLE, "--device", "cpu", "-f", "json")))


def test_compare_presets_table_lists_every_verl_preset_and_the_sweep() -> None:
    output = succeeded(invoke("compare-presets", SAMPLE, "--device", "cpu", "--preset", "verl"))
    for name in VERL_PRESETS:
        assert name in output
    assert "legacy_token_truncate" not in output
    assert "Threshold sweep" in output
    assert "seq_mean_k3 ≤ 0.01 rejects" in output


def test_compare_presets_json_agrees_with_the_sweep(comparison_json: dict) -> None:
    names = [preset["name"] for preset in comparison_json["presets"]]
    assert set(VERL_PRESETS) <= set(names) and any(name.startswith("legacy_") for name in names)
    k3_rs = next(p for p in comparison_json["presets"] if p["name"] == "decoupled_k3_rs")
    sweep = {row["option"]: row for row in comparison_json["sweep"]}
    # the preset's rejected row share and the sweep's share at verl's default are the same count of rows
    rows_rejected = k3_rs["run"]["metrics"]["rollout_corr/rollout_rs_seq_masked_fraction"]
    assert rows_rejected == pytest.approx(sweep["seq_mean_k3"]["default_share"])  # no empty rows in the sample


def test_compare_presets_csv_has_a_line_per_preset_and_step(comparison_json: dict) -> None:
    text = succeeded(invoke("compare-presets", SAMPLE, "--device", "cpu", "-f", "csv", "--preset", "verl"))
    rows = list(csv.DictReader(io.StringIO(text)))
    steps = len(comparison_json["steps"]["step"])
    assert len(rows) == len(VERL_PRESETS) * (steps + 1)
    assert {row["step"] for row in rows} == {"", *(str(s) for s in range(steps))}  # the run's step: null


def test_custom_preset_from_flags_and_file(tmp_path: Path) -> None:
    presets_file = tmp_path / "team.json"
    presets_file.write_text(json.dumps({"team_k3": {"rollout_rs": "seq_mean_k3", "rollout_rs_threshold": "0.005"}}))
    output = succeeded(
        invoke(
            "compare-presets",
            SAMPLE,
            "--device",
            "cpu",
            "-f",
            "json",
            "--presets-file",
            presets_file,
            "--rollout-is",
            "token",
            "--rollout-is-threshold",
            "0.5_5.0",
            "--rollout-rs",
            "seq_mean_k3,token_k1",
            "--rollout-rs-threshold",
            "0.01,0.5_2.0",
        )
    )
    presets = {preset["name"]: preset for preset in json.loads(output)["presets"]}
    assert {"team_k3", "custom", "decoupled_token_is"} <= set(presets)
    custom = presets["custom"]["run"]["metrics"]
    assert "rollout_corr/rollout_is_oob_ratio" in custom  # IcePop spec
    assert "rollout_corr/rollout_rs_token_k1_masked_fraction" in custom


def test_bad_threshold_spec_is_one_error_line() -> None:
    line = error_line(
        invoke(
            "compare-presets",
            SAMPLE,
            "--device",
            "cpu",
            "--rollout-rs",
            "seq_mean_k3",
            "--rollout-rs-threshold",
            "0.5_2.0",
        )
    )
    assert "seq_mean_k3" in line and "0.5_2.0" in line


def test_export_decisions_writes_one_row_per_preset_and_row(tmp_path: Path) -> None:
    out = tmp_path / "decisions.parquet"
    succeeded(
        invoke("compare-presets", SAMPLE, "--device", "cpu", "--preset", "decoupled_k3_rs", "--export-decisions", out)
    )
    table = pq.read_table(out)
    assert table.num_rows == pq.ParquetFile(SAMPLE).metadata.num_rows
    assert {"preset", "step", "sample_id", "kept"} <= set(table.column_names)


def test_sweep_json_and_bad_target() -> None:
    document = json.loads(succeeded(invoke("sweep", SAMPLE, "--device", "cpu", "-f", "json", "--target", "0.02")))
    assert document["targets"] == [0.02]
    for row in document["run"]:
        assert row["thresholds"][0]["share"] <= 0.02
    assert "--target" in error_line(invoke("sweep", SAMPLE, "--target", "5%"))


def test_report_from_dump_and_from_saved_json(tmp_path: Path) -> None:
    html = tmp_path / "report.html"
    succeeded(invoke("report", SAMPLE, "--device", "cpu", "-o", html, "--title", "run <7>", "--preset", "verl"))
    text = html.read_text()
    assert "run &lt;7&gt;" in text and "run <7>" not in text
    assert "decoupled_k3_rs" in text and "legacy_token_truncate" not in text
    saved = tmp_path / "analysis.json"
    succeeded(invoke("analyze", SAMPLE, "--device", "cpu", "-f", "json", "-o", saved))
    from_json = tmp_path / "from_json.html"
    succeeded(invoke("report", "--from-json", saved, "-o", from_json))
    assert "Per-step trends" in from_json.read_text()
    compared = tmp_path / "compare.json"
    succeeded(invoke("compare-presets", SAMPLE, "--device", "cpu", "-f", "json", "-o", compared))
    only_presets = tmp_path / "presets.html"
    succeeded(invoke("report", "--from-json", compared, "-o", only_presets, "--preset", "decoupled_k3_rs"))
    assert "decoupled_k3_rs" in only_presets.read_text()


def test_report_needs_an_input() -> None:
    assert "--from-json" in error_line(invoke("report"))


def test_analysis_knobs_reach_the_library() -> None:
    default = json.loads(succeeded(invoke("analyze", SAMPLE, "--device", "cpu", "-f", "json")))
    tuned = json.loads(succeeded(invoke("analyze", SAMPLE, "--device", "cpu", "-f", "json", *TUNED, "--workers", "2")))
    assert tuned["catastrophic_threshold"] == 0.2
    assert tuned["run"]["metrics"]["diag/catastrophic_tokens"] > default["run"]["metrics"]["diag/catastrophic_tokens"]
    assert len(tuned["worst_tokens"]) == 3
    assert max(r["round"] for r in tuned["rounds"]) == 2 and tuned["rounds"][-1]["pooled"]
    # --workers 2 changes nothing but the wall time
    assert tuned["run"]["metrics"]["rollout_corr/k3_kl"] == pytest.approx(
        default["run"]["metrics"]["rollout_corr/k3_kl"]
    )


@pytest.mark.parametrize("command", [("report", "-o"), ("analyze", "-f", "json", "-o")])
def test_unwritable_output_is_a_one_line_error(command: tuple[str, ...]) -> None:
    line = error_line(invoke(command[0], SAMPLE, "--device", "cpu", *command[1:], "/nonexistent/dir/out"))
    assert "/nonexistent/dir/out: No such file or directory." in line


def test_compare_presets_on_workers_equals_one_pass(tmp_path: Path) -> None:
    split_file = tmp_path / "row_groups.parquet"
    pq.write_table(pq.read_table(SAMPLE), split_file, row_group_size=16)  # 8 row groups: real parts
    one = json.loads(succeeded(invoke("compare-presets", split_file, "--device", "cpu", "-f", "json")))
    two = json.loads(
        succeeded(invoke("compare-presets", split_file, "--device", "cpu", "-f", "json", "--workers", "3"))
    )
    for first, second in zip(one["presets"], two["presets"], strict=True):
        for name, value in first["run"]["metrics"].items():
            assert second["run"]["metrics"][name] == pytest.approx(value, rel=1e-9, abs=1e-12), (first["name"], name)
    for first, second in zip(one["sweep"], two["sweep"], strict=True):
        thresholds = [t["threshold"] for t in second["thresholds"]]
        assert [t["threshold"] for t in first["thresholds"]] == pytest.approx(thresholds), first["option"]
    line = error_line(invoke("compare-presets", split_file, "--workers", "2", "--export-decisions", tmp_path / "d"))
    assert "--export-decisions" in line
