"""The command line's one error boundary: a ``RolloutDiagError`` (and any unexpected error) becomes one ``Error:``
line and exit code 1, unless ``--debug`` asks for the traceback."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import typer

from rollout_diag.errors import RolloutDiagError
from rollout_diag.process import command_ended

GATE_FAILED = 3  # exit code of `check`, `runs` and `watch` when a gate fails (1 is bad input, 0 all pass)
# Library keyword arguments whose flag is not the argument's name with dashes (errors name options in library terms).
FLAGS = {
    "columns": "--column",
    "presets": "--preset",
    "targets": "--target",
    "sample_id": "--sample",
    "export_decisions_to": "--export-decisions",
    "whole_row": "--all",
}


def flag_of(option: str) -> str:
    """The command-line flag of a library option named in an error message."""
    return FLAGS.get(option, "--" + option.replace("_", "-"))


def fail(message: str) -> NoReturn:
    """One ``Error:`` line on stderr (the message's escapes made visible), then exit 1."""
    from rollout_diag.formatting import visible  # messages name files and columns: never raw escapes

    typer.echo(f"Error: {visible(message)}", err=True)
    raise typer.Exit(1)


@contextmanager
def errors_as_one_line(debug: bool) -> Iterator[None]:
    """Turn library errors (and unexpected ones) raised inside into one ``Error:`` line and exit 1 (``debug``: raise
    them as they are); at the end, whatever happened, the process as it was before the command read
    (``rollout_diag.process.command_ended``)."""
    try:
        yield
    except RolloutDiagError as exc:
        if debug:
            raise
        fail(exc.render(flag_of, " "))
    except KeyboardInterrupt:
        typer.echo("Interrupted.", err=True)
        raise typer.Exit(130) from None
    except (typer.Exit, typer.Abort):
        raise
    except OSError as exc:  # an output path that cannot be written (input errors are RolloutDiagErrors)
        if debug:
            raise
        fail(f"{exc.filename}: {exc.strerror}." if exc.filename else f"{exc}.")
    except Exception as exc:
        if debug:
            raise
        fail(
            f"internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback, and please report it)"
        )
    finally:
        command_ended()  # the collector as it was before Reading.open (rollout_diag.process)
