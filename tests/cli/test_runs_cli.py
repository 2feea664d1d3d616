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
