"""The ``rollout-diag`` Typer app: its commands in the README's order, its options before the command (--version,
--engine) and the console script's entry point. Each command lives in a module of its own beside this one and adds
itself to ``app`` (``rollout_diag.cli`` imports them all)."""

from __future__ import annotations

import os
import sys
from enum import Enum
from typing import Annotated, Any, NoReturn

import typer
from typer.core import TyperGroup

from rollout_diag.cli.coercion import light_coercion
from rollout_diag.process import exit_now, one_blas_thread

one_blas_thread()  # before anything a command imports loads numpy (rollout_diag.process)

# The README's order:
COMMAND_ORDER = (
    "analyze",
    "compare-presets",
    "sweep",
    "report",
    "inspect",
    "check",
    "diff",
    "runs",
    "watch",
    "convert",
)


class CommandsInReadmeOrder(TyperGroup):
    """``--help`` lists the commands in the README's order, each with its whole first paragraph (never cut "...")."""

    def list_commands(self, ctx: Any) -> list[str]:
        names = super().list_commands(ctx)
        return sorted(names, key=lambda name: COMMAND_ORDER.index(name) if name in COMMAND_ORDER else len(names))

    def get_command(self, ctx: Any, name: str) -> Any:
        command = super().get_command(ctx, name)
        if command is not None and command.short_help is None and command.help:
            command.short_help = " ".join(command.help.strip().split("\n\n")[0].split())
        if command is not None:
            light_coercion(command.get_params(ctx))  # its options and its --help (made and kept by get_params)
        return command

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        light_coercion(self.get_params(ctx))  # the group's own options (--engine, --help)
        return super().parse_args(ctx, args)


app = typer.Typer(
    cls=CommandsInReadmeOrder,
    name="rollout-diag",
    help="Diagnose training–inference logprob mismatch in RL for LLMs, offline, from Parquet dumps.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)


def print_version(value: bool) -> None:
    if value:
        from rollout_diag import __version__

        typer.echo(f"rollout-diag {__version__}")
        raise typer.Exit(0)


class Engine(str, Enum):
    """The per-token engines (rollout_diag.engine.choice.ENGINES)."""

    auto = "auto"
    numba = "numba"
    torch = "torch"


@app.callback()
def root(
    context: typer.Context,
    version: Annotated[
        bool, typer.Option("--version", callback=print_version, is_eager=True, help="Print the version and exit.")
    ] = False,
    engine: Annotated[
        Engine,
        typer.Option(
            "--engine",
            envvar="ROLLOUT_DIAG_ENGINE",
            help="Per-token engine of every reading command: numba (compiled CPU kernels), torch (any device, what "
            "runs on CUDA) or auto (numba on the CPU, torch on a GPU; and torch for an input under 4M tokens and 4096 "
            "rows where the command loads torch anyway: inspect). Before the command: "
            "rollout-diag --engine torch analyze ….",
        ),
    ] = Engine.auto,
) -> None:
    """Diagnose training–inference logprob mismatch in RL for LLMs, offline, from Parquet dumps."""
    before = os.environ.get("ROLLOUT_DIAG_ENGINE")
    os.environ["ROLLOUT_DIAG_ENGINE"] = engine.value  # read where each chunk is computed (rollout_diag.engine.kernels)
    context.call_on_close(lambda: _restore_environment("ROLLOUT_DIAG_ENGINE", before))


def _restore_environment(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def main() -> NoReturn:
    """Console-script entry point."""
    # A narrow pipe (CI logs, `| less`) should not wrap tables into unreadable columns.
    if not sys.stdout.isatty() and "COLUMNS" not in os.environ:
        os.environ["COLUMNS"] = "160"
    try:
        app()
    except SystemExit as done:
        exit_now(done.code)
    exit_now(0)
