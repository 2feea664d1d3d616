"""Hardening, third round (issue 21, the I/O items): outputs that would destroy an input, atomic outputs, huge
rows in ``inspect``, malformed saved results, stray Parquet files beside a dump, and small inputs."""

from __future__ import annotations

from pathlib import Path

import pytest
from dumps import random_rows, write_sequence_dump
from typer.testing import CliRunner

from rollout_diag.cli import app

runner = CliRunner()


def cli(*args: object, env: dict | None = None):
    result = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "160", **(env or {})})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"exception escaped the CLI: {result.exception!r}\n{result.output}") from result.exception
    assert "Traceback" not in result.output
    return result


def error_line(result) -> str:
    assert result.exit_code == 1, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "internal error" not in lines[0]
    return lines[0]


@pytest.fixture
def dump(tmp_path: Path) -> Path:
    return write_sequence_dump(tmp_path / "run.parquet", random_rows(0, steps=(0, 1), rows_per_step=3))


# ------------------------------------------------------------------ small inputs
@pytest.mark.parametrize("uri", ["s3://bucket/run/", "gs://bucket/run.parquet", "hf://datasets/x", "file:///tmp/x"])
def test_a_remote_uri_is_a_one_line_error(uri: str) -> None:
    line = error_line(cli("analyze", uri))
    assert uri.rstrip("/") in line and "URIs are not read" in line, line


def test_a_remote_uri_in_the_library_and_as_output(dump: Path, tmp_path: Path) -> None:
    import rollout_diag as rd

    with pytest.raises(rd.RolloutDiagError, match="URIs are not read"):
        rd.analyze("s3://bucket/run.parquet", device="cpu")
