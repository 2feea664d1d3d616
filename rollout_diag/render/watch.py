"""The live view of ``rollout-diag watch``: a header that leads with the last steps (each with the metric that set
its level), then the run's verdict and the step rises the analysis found; the last steps' table; where the mismatch
sits; the pipeline findings (each once, its numbers updated in place); and what the watch noticed (gate alerts, new
anomalies, notes), newest first, so that on a short screen the cut falls on the oldest.

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
from rollout_diag.results.wording import most_divergent_round

if TYPE_CHECKING:
    from rollout_diag.drivers.watch import StepReport, WatchUpdate

KEY_METRICS = (catalogue.K3_KL.key, catalogue.CHI2_TOKEN.key, catalogue.LOG_PPL_ABS_DIFF.key)
SHOWN_STEPS = 8  # rows of the last-steps table
SPARK_STEPS = 40  # steps in the k3_kl sparkline
SHOWN_LINES = 8  # newest notes, anomalies and alerts
HEADER_STEPS = 3  # steps the header leads with, newest first
HEADER_SET_BY = 2  # metrics named per step in the header (all of them in --format jsonl's level_set_by)
SPARKS = "▁▂▃▄▅▆▇█"
# a step-to-step change of the headline metric worth an arrow: 10 % either way (a run rising 13 % a step doubles in
# 6 steps; the arrow is the first place it shows)
CHANGE_RATIO = 1.1


class WatchView:
    """What the live view shows, updated from each :class:`~rollout_diag.drivers.watch.WatchUpdate`."""

    def __init__(self, directory: str, clock=time.monotonic) -> None:
        self.directory = directory
        self.clock = clock
        self.update: WatchUpdate | None = None
        self.steps: deque[StepReport] = deque(maxlen=SPARK_STEPS)
        self.lines: deque[tuple[str, str]] = deque(maxlen=SHOWN_LINES)  # (style, text), oldest first
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
        findings = self._findings()
        if findings is not None:
            parts.append(findings)
        if self.lines:
            newest_first = [plain(text, style) for style, text in reversed(self.lines)]
            parts.append(Panel(Group(*newest_first), title="events, newest first", expand=True))
        return Group(*parts)

    def _findings(self) -> Panel | None:
        """The run's pipeline findings as the latest result words them: one line each, however many steps passed."""
        result = None if self.update is None else self.update.result
        if result is None or not result.hints:
            return None
        lines = [plain(f"{hint.id}: {hint.message}", "magenta") for hint in result.hints]
        return Panel(Group(*lines), title="findings (updated in place)", expand=True)

    def _header(self) -> Panel:
        update = self.update
        head = Text()
        if update is None or update.result is None:
            head.append("waiting for the first step with model tokens…", style="dim")
        else:
            result = update.result
            if self.steps:
                head.append_text(self._last_steps())
                head.append("\n")
            head.append("run: verdict ")
            head.append_text(level(update.level))
            head.append(f"  {len(result.steps)} steps, {number(result.run.tokens)} model tokens\n")
            head.append_text(plain(update.sentence))
            for trend in result.trends:
                if trend.against == "step" and trend.headline:
                    head.append("\n")
                    head.append_text(plain(trend.headline, "bold red"))
        status = Text("\n")
        since = "no step yet"
        if self.last_step_at is not None:
            since = f"last step {_ago(self.clock() - self.last_step_at)} ago"
        status.append(since, style="cyan")
        if update is not None and update.pending_steps:
            status.append(f"  ·  in progress: step {', '.join(map(str, update.pending_steps[-3:]))}", style="dim")
        head.append_text(status)
        return Panel(head, title=f"rollout-diag watch {self.directory}", expand=True)

    def _last_steps(self) -> Text:
        """ "step 44: bad (k3_kl) · step 43: watch (k3_kl, chi2_token) · step 42: ok", newest first."""
        line = Text()
        for index, report in enumerate(reversed(list(self.steps)[-HEADER_STEPS:])):
            line.append(" · " if index else "")
            line.append(f"step {report.step}: ", style="bold")
            line.append_text(level(report.level))
            if report.set_by:  # the first two metrics that set it (catalogue order: k3_kl first), then how many more
                names = [short_name(metric) for metric in report.set_by]
                more = f" +{len(names) - HEADER_SET_BY}" if len(names) > HEADER_SET_BY else ""
                line.append(f" ({', '.join(names[:HEADER_SET_BY])}{more})")
        return line

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
        # a change point the header's rises do not already say
        trend = next((t for t in result.trends if t.against == "step" and t.summary and not t.headline), None)
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
    """An arrow for the change of the headline metric from the previous step: up (red) from 1.1×, down (green) to
    1/1.1×, the ratio to 3 digits ("↑ 1.13×")."""
    if before is None or now is None or not (math.isfinite(before) and math.isfinite(now)) or before <= 0:
        return Text("")
    ratio = now / before
    if ratio >= CHANGE_RATIO:
        return Text(f"↑ {ratio:.3g}×", style="red")
    if ratio <= 1 / CHANGE_RATIO:
        return Text(f"↓ {ratio:.3g}×", style="green")
    return Text("→", style="dim")


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min {seconds % 60:02.0f} s"
    return f"{seconds // 3600:.0f} h {seconds % 3600 // 60:02.0f} min"


__all__ = ["WatchView", "change", "sparkline"]
