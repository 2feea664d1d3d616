"""``rollout-diag watch``: follow a run while it trains."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from rollout_diag.cli.app import app
from rollout_diag.cli.boundary import fail
from rollout_diag.cli.layout import command
from rollout_diag.cli.options import Gates, Logging, Reading, argument
from rollout_diag.cli.output import console, refuse_overwriting_inputs

if TYPE_CHECKING:
    from rollout_diag.export.wandb import WandbTarget


class WatchFormat(str, Enum):
    live = "live"
    jsonl = "jsonl"


@app.command()
@command(
    "directory interval format report_file report_every gating exit_on_fail exit_after_idle column input_format "
    "trust_pickle device strict chunk_tokens wandb wandb_group wandb_run_id",
    device="cpu",  # a watch shares the machine with the training it follows
)
def watch(
    *,
    directory: Annotated[
        Path,
        argument(
            "The dump directory the trainer writes (DumpWriter's step=N/, prime-rl's token_exports/, NeMo-RL, slime "
            "or SkyRL step files).",
            "DIR",
        ),
    ],
    interval: Annotated[float, typer.Option("--interval", help="Seconds between two looks at DIR.")] = 2.0,
    format: Annotated[
        WatchFormat,
        typer.Option("--format", "-f", help="live (a terminal view) or jsonl (one JSON object per finished step)."),
    ] = WatchFormat.live,
    report_file: Annotated[
        Path | None,
        typer.Option("--report", help="Rewrite this HTML report (atomically) as steps finish.", metavar="FILE"),
    ] = None,
    report_every: Annotated[
        int, typer.Option("--report-every", help="Rewrite --report every N finished steps (and at the end).")
    ] = 10,
    gating: Gates,
    exit_on_fail: Annotated[
        bool, typer.Option("--exit-on-fail", help="Exit 3 as soon as a gate fails (a sidecar can stop the job).")
    ] = False,
    exit_after_idle: Annotated[
        float | None,
        typer.Option(
            "--exit-after-idle",
            help="Exit once nothing new arrived for this many seconds: 0, or 3 if a gate failed.",
            metavar="SECONDS",
        ),
    ] = None,
    reading: Reading,
    logging: Logging,
) -> None:
    """Follow a run while it trains: each new step is read once and merged into the run so far; a live view (or
    one JSON line per step) says the moment the mismatch goes wrong. A DIR the trainer has not made yet is waited
    for (the view says so; --exit-after-idle counts the wait). Exit 0, 3 when a gate failed, 1 for bad input or when
    DIR is deleted or moved.

    \b
    Examples:
      rollout-diag watch run/ --max k3_kl=1e-3 --report watch.html
      rollout-diag watch out/token_exports --gates default --exit-on-fail
      rollout-diag watch run/ -f jsonl --exit-after-idle 600 >> mismatch.jsonl
    """
    from rollout_diag.errors import InputError

    if directory.exists() and not directory.is_dir():
        raise InputError(f"{directory}: not a directory; watch follows a dump directory.")
    if report_every < 1:
        fail(f"--report-every {report_every}: must be a positive number of steps.")
    refuse_overwriting_inputs({"report": report_file}, [directory], gating.file())
    logging.check()
    from rollout_diag.drivers.watch import watch as follow

    chosen = gating.chosen()
    dump = reading.dump([directory], must_exist=False)  # a directory the trainer has not made yet is waited for
    updates = follow(dump, interval=interval, exit_after_idle=exit_after_idle, exit_on_fail=exit_on_fail, gates=chosen)
    writer = _ReportWriter(report_file, report_every, logging.target())
    try:
        if format is WatchFormat.jsonl:
            code = _watch_jsonl(updates, writer)
        else:
            code = _watch_live(updates, writer, str(directory))
    finally:
        writer.close()
    raise typer.Exit(code)


def _watch_jsonl(updates: Iterator[Any], writer: _ReportWriter) -> int:
    import json

    for update in updates:
        for report in update.steps:
            sys.stdout.write(json.dumps(report.to_json(), allow_nan=False) + "\n")
        sys.stdout.flush()
        for line in [*update.notes, *update.alerts]:
            typer.echo(line, err=True)
        writer.after(update)
        if update.ended:
            typer.echo(update.ended, err=True)
            return update.exit_code or 0
    return 0


def _watch_live(updates: Iterator[Any], writer: _ReportWriter, directory: str) -> int:
    from rich.live import Live
    from rich.text import Text

    from rollout_diag.render.watch import WatchView

    view = WatchView(directory)
    with Live(view, console=console(), refresh_per_second=2, transient=False) as live:
        for update in updates:
            view.add(update)
            for alert in update.alerts:
                live.console.print(Text(alert, style="bold red"))  # the style ends with the text, not the line
            live.refresh()
            writer.after(update)
            if update.ended:
                code = update.exit_code or 0
                break
        else:
            code = 0
    if update.ended:
        typer.echo(update.ended, err=True)
    return code


class _ReportWriter:
    """Rewrites the --report file every N finished steps and at the end, through a temporary file and a rename
    (a browser that reloads never sees half a file)."""

    def __init__(self, path: Path | None, every: int, wandb: WandbTarget | None = None) -> None:
        self.path = path
        self.every = every
        self.since = 0
        self.wandb = wandb  # --wandb: a WandbTarget, its run opened at the first finished step
        self.run: Any = None
        self.last: Any = None

    def after(self, update: Any) -> None:
        if self.wandb is not None and update.steps:
            if self.run is None:
                self.run = self.wandb.open("watch")
            for report in update.steps:  # a step revised after W&B took a later one is not logged again
                self.run.log_step(report.step, report.metrics, report.level)
        if update.result is not None:
            self.last = update.result
        if self.path is None or update.result is None:
            return
        self.since += len(update.steps)
        if self.since >= self.every or (update.ended and (self.since or not self.path.exists())):
            self.since = 0
            from rollout_diag.io.outputs import write_text
            from rollout_diag.report import render_report

            write_text(self.path, render_report(update.result, title=f"rollout-diag watch: {update.result.inputs[0]}"))

    def close(self) -> None:
        """The W&B run's summary (the run so far), the report as an artifact, and the run finished."""
        if self.run is None or self.wandb is None:  # the run is opened only with --wandb
            return
        try:
            if self.last is not None:
                self.run.summarize(self.last)
            if self.path is not None and self.path.exists():
                self.run.attach_report(self.path)
        finally:
            self.run.finish()
        typer.echo(f"logged {self.wandb.scalars:,} scalars to W&B project {self.wandb.project}", err=True)
