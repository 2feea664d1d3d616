"""Running the CLI in-process the way a user would: its output, its one-line errors."""

from __future__ import annotations

from typer.testing import CliRunner, Result

from rollout_diag.cli import app

WIDTH = 160

# options that move analyze's numbers off their defaults, as analyze, compare-presets and report all take them
TUNED = ("--catastrophic", "0.2", "--top-k", "3", "--max-rounds", "2")


runner = CliRunner()


def invoke(*args: object, width: int = WIDTH) -> Result:
    """Run the CLI in-process ``width`` columns wide; an exception escaping the app is a traceback a user would see."""
    result = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": str(width)})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"exception escaped the CLI: {result.exception!r}\n{result.output}") from result.exception
    assert "Traceback" not in result.output
    return result


def succeeded(result: Result) -> str:
    assert result.exit_code == 0, result.output
    return result.stdout


def one_error_line(result: Result) -> str:
    """Exit 1 and one ``Error:`` line on stderr, no internal error (bad input is the user's to fix, not a bug to
    report); stdout unchecked (error_line: empty)."""
    assert result.exit_code == 1, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "internal error" not in lines[0]
    return lines[0]


def error_line(result: Result) -> str:
    """The single ``Error:`` line of a failed run (one_error_line), with nothing on stdout."""
    line = one_error_line(result)
    assert result.stdout == ""
    return line
