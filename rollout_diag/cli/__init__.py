"""The ``rollout-diag`` command line: thin Typer commands over the library, one module per command or family
(``analyze``, ``presets``: compare-presets and sweep, ``report``, ``inspect``, ``check``, ``diff``, ``runs``,
``watch``, ``convert``), over the shared pieces: ``options`` (every option declared once, the option groups),
``layout`` (``@command``: where each command shows them), ``boundary`` (``RolloutDiagError`` -> one ``Error:`` line,
exit 1), ``output`` (progress, --format, --output), ``app`` (the Typer app and ``main``). Nothing in the package
imports the command line."""

from rollout_diag.cli.app import app, main  # first: the process tuned before a command's imports load numpy

# each command module adds its command to the app
from rollout_diag.cli import analyze, check, convert, diff, inspect, presets, report, runs, watch  # isort: skip
from rollout_diag.cli.options import CHUNK_TOKENS
from rollout_diag.process import exit_now

__all__ = [
    "CHUNK_TOKENS",
    "analyze",
    "app",
    "check",
    "convert",
    "diff",
    "exit_now",
    "inspect",
    "main",
    "presets",
    "report",
    "runs",
    "watch",
]
