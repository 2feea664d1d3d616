"""The live view of ``rollout-diag watch``: the run's verdict, the last steps and their trend, where the mismatch
sits, and what the watch noticed (new anomalies, pipeline findings, gate alerts), with the time since the last step.

:class:`WatchView` keeps what the updates said (bounded: the last steps and the last lines) and renders it as one
rich renderable; it reads results and the watch's updates, never computes a metric.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import TYPE_CHECKING

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from rollout_diag import catalogue
from rollout_diag.catalogue import short_name
from rollout_diag.render.format import level, number, plain
from rollout_diag.render.summary import most_divergent_round

if TYPE_CHECKING:
    from rollout_diag.drivers.watch import StepReport, WatchUpdate

KEY_METRICS = (catalogue.K3_KL.key, catalogue.CHI2_TOKEN.key, catalogue.LOG_PPL_ABS_DIFF.key)
SHOWN_STEPS = 8  # rows of the last-steps table
SPARK_STEPS = 40  # steps in the k3_kl sparkline
SHOWN_LINES = 8  # newest notes, anomalies, findings and alerts
SPARKS = "▁▂▃▄▅▆▇█"
CHANGE_RATIO = 1.2  # a step-to-step change of the headline metric worth an arrow


class WatchView:
    """What the live view shows, updated from each :class:`~rollout_diag.drivers.watch.WatchUpdate`."""

    def __init__(self, directory: str, clock=time.monotonic) -> None:
        self.directory = directory
        self.clock = clock
        self.update: WatchUpdate | None = None
        self.steps: deque[StepReport] = deque(maxlen=SPARK_STEPS)
        self.lines: deque[tuple[str, str]] = deque(maxlen=SHOWN_LINES)  # (style, text)
        self.last_step_at: float | None = None
        self.reported = 0

    def add(self, update: WatchUpdate) -> None:
        self.update = update
        for report in update.steps:
            if report.revision and any(kept.step == report.step for kept in self.steps):
                self.steps = deque((report if kept.step == report.step else kept for kept in self.steps), SPARK_STEPS)
            else:
                self.steps.append(report)
            self.reported += 1
            for anomaly in report.anomalies:
                self.lines.append(("yellow", f"anomaly {anomaly}"))
            for finding in report.findings:
                self.lines.append(("magenta", f"finding: {finding}"))
        if update.steps:
            self.last_step_at = self.clock()
        for note in update.notes:
            self.lines.append(("dim", note))
        for alert in update.alerts:
            self.lines.append(("bold red", alert))
        if update.ended:
            self.lines.append(("bold", update.ended))

    def __rich__(self) -> Group:
        parts: list = [self._header()]
        if self.steps:
            parts.append(self._steps_table())
        where = self._where()
        if where is not None:
            parts.append(where)
        if self.lines:
            parts.append(Panel(Group(*(plain(text, style) for style, text in self.lines)), title="events", expand=True))
        return Group(*parts)

    def _header(self) -> Panel:
        update = self.update
        head = Text()
        if update is None or update.result is None:
            head.append("waiting for the first step with model tokens…", style="dim")
        else:
            result = update.result
            head.append("verdict ")
            head.append_text(level(update.level))
            head.append(f"  {len(result.steps)} steps, {number(result.run.tokens)} model tokens")
            if self.steps:
                head.append(f"  ·  step {self.steps[-1].step}: ")
                head.append_text(level(self.steps[-1].level))
            head.append("\n")
            head.append_text(plain(update.sentence))
        status = Text("\n")
        since = "no step yet"
        if self.last_step_at is not None:
            since = f"last step {_ago(self.clock() - self.last_step_at)} ago"
        status.append(since, style="cyan")
        if update is not None and update.pending_steps:
            status.append(f"  ·  in progress: step {', '.join(map(str, update.pending_steps[-3:]))}", style="dim")
        head.append_text(status)
        return Panel(head, title=f"rollout-diag watch {self.directory}", expand=True)

    def _steps_table(self) -> Table:
        every = list(self.steps)
        headline = [r.metrics.get(KEY_METRICS[0]) for r in every]
        table = Table(
            title="last steps",
            title_justify="left",
            caption=f"{short_name(KEY_METRICS[0])}, last {len(every)} steps: {sparkline(headline)}",
            caption_justify="left",
            expand=False,
        )
        table.add_column("step", justify="right")
        table.add_column("level")
        for metric in KEY_METRICS:
            table.add_column(short_name(metric), justify="right")
        table.add_column("vs previous")
        first = max(0, len(every) - SHOWN_STEPS)
        for index in range(first, len(every)):
            report = every[index]
            cells = [Text(str(report.step) + (f" r{report.revision}" if report.revision else "")), level(report.level)]
            cells += [Text(number(report.metrics.get(metric))) for metric in KEY_METRICS]
            cells.append(change(headline[index - 1] if index else None, headline[index]))
            table.add_row(*cells)
        return table

    def _where(self) -> Text | None:
        update = self.update
        if update is None or update.result is None:
            return None
        result = update.result
        lines = Text()
        trend = next((t for t in result.trends if t.against == "step" and t.summary), None)
        if trend is not None:
            lines.append("trend: ", style="bold")
            lines.append_text(plain(trend.summary))
            lines.append("\n")
        chosen = most_divergent_round(result)
        if chosen is not None:
            label = f"≥ {chosen['round']}" if chosen.get("pooled") else str(chosen["round"])
            lines.append("most divergent round so far: ", style="bold")
            lines.append(
                f"{label} (mean |δ| {number(chosen['logprob_abs_diff_mean'])} over {number(chosen['token_count'])} "
                "tokens)\n"
            )
        return lines if lines.plain else None


def sparkline(values: list[float | None]) -> str:
    """One block character per value, scaled between the finite values' min and max (a gap for the others)."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return ""
    low, high = min(finite), max(finite)
    span = high - low
    out = []
    for value in values:
        if value is None or not math.isfinite(value):
            out.append(" ")
        else:
            index = 0 if span <= 0 else round((value - low) / span * (len(SPARKS) - 1))
            out.append(SPARKS[index])
    return "".join(out)


def change(before: float | None, now: float | None) -> Text:
    """An arrow for the change of the headline metric from the previous step: up (red) past 1.2×, down (green)."""
    if before is None or now is None or not (math.isfinite(before) and math.isfinite(now)) or before <= 0:
        return Text("")
    ratio = now / before
    if ratio >= CHANGE_RATIO:
        return Text(f"↑ {ratio:.2g}×", style="red")
    if ratio <= 1 / CHANGE_RATIO:
        return Text(f"↓ {ratio:.2g}×", style="green")
    return Text("→", style="dim")


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min {seconds % 60:02.0f} s"
    return f"{seconds // 3600:.0f} h {seconds % 3600 // 60:02.0f} min"


__all__ = ["WatchView", "change", "sparkline"]
