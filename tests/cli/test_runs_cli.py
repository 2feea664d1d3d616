"""``rollout-diag runs`` on the command line: the tables fit 80 columns, JSON, Parquet, the report, the ratio gate's
exit code, one-line errors."""

from __future__ import annotations

import json

import polars as pl
import pytest

from rollout_diag.cli import app
from tests.helpers.cli import error_line, invoke, runner, succeeded
from tests.helpers.runs import write_run
from tests.helpers.schema import validator


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs_cli")
    return write_run(root / "a.parquet", 1, steps=6), write_run(root / "b.parquet", 2, steps=6, scale=3.0)


def test_table_json_parquet_report(two, tmp_path):
    a, b = two
    narrow = runner.invoke(
        app, ["runs", f"base={a}", f"fp8={b}", "--knob", "kv=bf16,fp8", "--workers", "1"], env={"COLUMNS": "80"}
    )
    text = succeeded(narrow)
    assert text.splitlines()[0].startswith("kv=fp8 raised k3_kl")
    assert max(len(line) for line in text.splitlines()) <= 80  # no table split into "(continued)" parts either
    assert "continued" not in text
    out = tmp_path / "runs.json"
    succeeded(invoke("runs", f"base={a}", f"fp8={b}", "-f", "json", "-o", out, "--workers", "1"))
    document = json.loads(out.read_text())
    validator("runs.schema.json").validate(document)
    assert [run["name"] for run in document["runs"]] == ["base", "fp8"]
    table = tmp_path / "runs.parquet"
    report = tmp_path / "runs.html"
    succeeded(invoke("runs", f"base={a}", f"fp8={b}", "-f", "parquet", "-o", table, "--report", report))
    frame = pl.read_parquet(table)
    assert frame.height == 2 * 6 and {"run", "step", "knob:run", "rollout_corr/k3_kl"} <= set(frame.columns)
    page = report.read_text()
    assert "runs-forest" in page and "runs-curves" in page


def test_ratio_gate_exit_code(two):
    a, b = two
    failed = invoke("runs", f"base={a}", f"cand={b}", "--max-ratio", "k3_kl=2", "--workers", "1")
    assert failed.exit_code == 3 and "FAIL" in failed.output
    passed = invoke("runs", f"base={b}", f"cand={a}", "--max-ratio", "k3_kl=2", "--workers", "1")
    assert passed.exit_code == 0


def test_errors_are_one_line(two, tmp_path):
    a, b = two
    assert "3 values for 2 runs" in error_line(invoke("runs", f"x={a}", f"y={b}", "--knob", "tp=1,2,3"))
    assert "no run has that name" in error_line(invoke("runs", f"x={a}", f"y={b}", "--baseline", "z"))
    assert "no such key metric" in error_line(invoke("runs", f"x={a}", f"y={b}", "--max-ratio", "nope=2"))
    assert "give --output" in error_line(invoke("runs", f"x={a}", f"y={b}", "-f", "parquet"))


def test_prompts_matched_across_runs_on_the_command_line(tmp_path):
    from tests.helpers.prompts import matched_run_rows, write_prompt_dump

    paths = [
        write_prompt_dump(tmp_path / f"{name}.parquet", matched_run_rows(seed, prompts=150, planted=2))
        for name, seed in (("a", 1), ("b", 2), ("c", 3))
    ]
    out = tmp_path / "repro.jsonl"
    runs = [f"{name}={path}" for name, path in zip("abc", paths, strict=True)]
    narrow = runner.invoke(app, ["runs", *runs, "--workers", "1", "--export-repro", str(out)], env={"COLUMNS": "80"})
    text = succeeded(narrow)
    assert max(len(line) for line in text.splitlines()) <= 80 and "continued" not in text
    said = " ".join(text.split())  # the lines as the terminal wraps them, joined
    assert "2 in the worst 1 % in every run they appear in (deterministic outliers)" in said
    assert "Prompts matched across runs: row mismatch" in text
    assert "12 rows of 2 prompts in the worst 1 % in every run they appear in" in narrow.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted({(line["run"], line["prompt"]) for line in lines}) == [(r, p) for r in "abc" for p in ("x0", "x1")]
    document = json.loads(succeeded(invoke("runs", *runs, "--workers", "1", "-f", "json")))
    validator("runs.schema.json").validate(document)
    assert [item["prompt"] for item in document["prompts"]["matrix"] if item["listed"]] in (["x0", "x1"], ["x1", "x0"])


def test_runs_without_a_prompt_identity_say_so_in_one_line(two, tmp_path):
    a, b = two
    text = succeeded(invoke("runs", f"a={a}", f"b={b}", "--workers", "1"))
    assert len([line for line in text.splitlines() if line.startswith("Prompts")]) == 1
    assert "Prompts: no prompt identity in the runs" in " ".join(text.split())
    result = invoke("runs", f"a={a}", f"b={b}", "--workers", "1", "--export-repro", tmp_path / "r.jsonl")
    assert result.exit_code == 1 and result.stdout == ""
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: --export-repro") and "prompt identity" in last
