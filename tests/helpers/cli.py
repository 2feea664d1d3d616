"""Running the CLI in-process the way a user would: its output, its one-line errors."""

from __future__ import annotations

from typer.testing import CliRunner, Result

from rollout_diag.cli import app

WIDTH = 160


runner = CliRunner()


def invoke(*args: object) -> Result:
    """Run the CLI in-process at a fixed width; an exception escaping the app is a traceback a user would see."""
    result = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": str(WIDTH)})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"exception escaped the CLI: {result.exception!r}\n{result.output}") from result.exception
    assert "Traceback" not in result.output
    return result


def succeeded(result: Result) -> str:
    assert result.exit_code == 0, result.output
    return result.stdout


def error_line(result: Result) -> str:
    assert result.exit_code == 1, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert result.stdout == ""
    return lines[0]


def one_error_line(result) -> str:
    """Exit 1 and one ``Error:`` line on stderr, no internal error; stdout unchecked (error_line: empty)."""
    assert result.exit_code == 1, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "internal error" not in lines[0]
    return lines[0]
