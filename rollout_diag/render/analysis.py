"""Rich tables for an AnalysisResult: verdicts, run metrics, steps, rounds, warnings, skipped rows."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from rollout_diag.render.format import level, number, percent
from rollout_diag.render.hints import hint_lines
from rollout_diag.results import AnalysisResult, StepResult
from rollout_diag.verdicts import RULES, judge

STEP_COLUMNS = (
    ("rollout_corr/kl", "kl"),
    ("rollout_corr/k3_kl", "k3_kl"),
    ("rollout_corr/chi2_token", "χ² token"),
    ("rollout_corr/chi2_seq", "χ² seq"),
    ("rollout_corr/log_ppl_abs_diff", "|log-ppl diff|"),
    ("training/rollout_probs_diff_mean", "probs diff"),
    ("mismatch/logprob_abs_diff", "|δ| mean"),
    ("diag/catastrophic_tokens", "catastr."),
)
ROWS_SHOWN = 10
STEPS_SHOWN_EACH_END = 5  # long runs: first, last and worst steps unless --all-steps


def render_analysis(result: AnalysisResult, all_steps: bool = False) -> RenderableType:
    parts: list[RenderableType] = [header(result), verdict_table(result), metrics_table(result.run)]
    if len(result.steps) > 1:
        parts.append(steps_table(result.steps, all_steps))
    if result.rounds:
        parts.append(rounds_table(result.rounds))
    if result.positions:
        parts.append(positions_table(result.positions))
    if result.worst_rows:
        parts.append(worst_rows_table(result))
    if result.worst_tokens:
        parts.append(worst_tokens_table(result))
    parts.extend(findings(result))
    parts.extend(hint_lines(result))
    if result.skipped_rows:
        parts.append(skipped_table(result))
    for warning in result.warnings:
        parts.append(Text(f"warning: {warning}", style="yellow"))
    return Group(*parts)


def header(result: AnalysisResult) -> Text:
    columns = ", ".join(f"{role}={name}" for role, name in result.columns.items())
    return Text.from_markup(
        f"[bold]rollout-diag analyze[/]  {len(result.inputs)} file(s), {result.layout} layout, "
        f"{number(result.run.rows)} rows, {number(result.run.tokens)} model tokens, "
        f"{len(result.steps)} step(s), device {result.device}\n[dim]columns: {columns}[/]"
    )


def verdict_table(result: AnalysisResult) -> Table:
    table = Table(title="Verdict (whole run)", title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("verdict")
    table.add_column("watch ≥ / bad ≥", justify="right")
    table.add_column("steps watch/bad", justify="right")
    table.add_column("what it measures")
    for verdict in result.verdicts:
        per_step = [
            judge(step.metrics, tuple(r for r in RULES if r.metric == verdict.metric))[0] for step in result.steps
        ]
        watch = sum(v.level == "watch" for v in per_step)
        bad = sum(v.level == "bad" for v in per_step)
        table.add_row(
            verdict.metric,
            number(verdict.value),
            level(verdict.level),
            f"{number(verdict.watch)} / {number(verdict.bad)}",
            f"{watch}/{bad}",
            verdict.meaning,
        )
    return table


def metrics_table(run: StepResult) -> Table:
    table = Table(title="All metrics (whole run, every row as one batch)", title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in run.metrics.items():
        if not name.startswith("per_round/round_"):
            table.add_row(name, number(value))
    return table


def worst_steps(steps: Sequence[StepResult], metric: str = "rollout_corr/k3_kl", count: int = 5) -> list[StepResult]:
    scored = [s for s in steps if metric in s.metrics]
    return sorted(scored, key=lambda s: s.metrics[metric], reverse=True)[:count]


def steps_table(steps: Sequence[StepResult], all_steps: bool) -> Table:
    if all_steps or len(steps) <= 3 * STEPS_SHOWN_EACH_END:
        shown, title = list(steps), "Per step"
    else:
        chosen = {s.step for s in steps[:STEPS_SHOWN_EACH_END]} | {s.step for s in steps[-STEPS_SHOWN_EACH_END:]}
        chosen |= {s.step for s in worst_steps(steps, count=STEPS_SHOWN_EACH_END)}
        shown = [s for s in steps if s.step in chosen]
        title = (
            f"Per step: first {STEPS_SHOWN_EACH_END}, last {STEPS_SHOWN_EACH_END} and worst "
            f"{STEPS_SHOWN_EACH_END} by k3_kl of {len(steps)} (--all-steps for every step)"
        )
    worst = {s.step for s in worst_steps(steps, count=1)}
    table = Table(title=title, title_justify="left")
    for heading in ("step", "rows", "tokens", *(label for _, label in STEP_COLUMNS), "verdict"):
        table.add_column(heading, justify="left" if heading == "verdict" else "right")
    previous = None
    for step in shown:
        if previous is not None and step.step is not None and steps.index(step) != steps.index(previous) + 1:
            table.add_row("…", *[""] * (len(STEP_COLUMNS) + 3))
        levels = [v.level for v in judge(step.metrics)]
        worst_level = next((lvl for lvl in ("bad", "watch", "ok") if lvl in levels), "n/a")
        marker = " ◀ worst" if step.step in worst else ""
        table.add_row(
            str(step.step),
            number(step.rows),
            number(step.tokens),
            *(number(step.metrics.get(name)) for name, _ in STEP_COLUMNS),
            level(worst_level) + marker,
        )
        previous = step
    return table


def rounds_table(rounds: Sequence[dict]) -> Table:
    table = Table(title="Per round (multi-turn; round k = k-th run of model tokens in a row)", title_justify="left")
    for heading in ("round", "tokens", "rows", "|δ| mean", "kl", "k3_kl", "χ² token", "max |δ|", "catastr."):
        table.add_column(heading, justify="right")
    most = max(rounds, key=lambda r: (r["logprob_abs_diff_mean"], -r["round"]))["round"]
    for row in rounds:
        label = f"≥ {row['round']}" if row["pooled"] else str(row["round"])
        table.add_row(
            label + (" ◀" if row["round"] == most else ""),
            number(row["token_count"]),
            number(row["seq_count"]),
            number(row["logprob_abs_diff_mean"]),
            number(row["kl"]),
            number(row["k3_kl"]),
            number(row["chi2_token"]),
            number(row["max_abs_diff"]),
            number(row["catastrophic_count"]),
        )
    return table


def positions_table(positions: Sequence[dict]) -> Table:
    table = Table(title="Per token position (log2 buckets of the index within the row)", title_justify="left")
    for heading in ("positions", "tokens", "|δ| mean", "k3_kl", "catastrophic"):
        table.add_column(heading, justify="right")
    for row in positions:
        if row["step"] is None:
            table.add_row(
                row["bucket"],
                number(row["token_count"]),
                number(row["logprob_abs_diff_mean"]),
                number(row["k3_kl"]),
                percent(row["catastrophic_share"]),
            )
    return table


def worst_rows_table(result: AnalysisResult, criterion: str = "log_ppl_abs_diff") -> Table:
    rows = [r for r in result.worst_rows if r.criterion == criterion][:ROWS_SHOWN]
    table = Table(
        title=f"Worst rows by |log-ppl diff| (top {len(rows)}; all criteria in --format json; "
        "rollout-diag inspect FILE --sample ID shows one token by token)",
        title_justify="left",
    )
    for heading in (
        "step",
        "sample_id",
        "file:row",
        "tokens",
        "rounds",
        "worst round",
        "log-ppl diff",
        "max |δ|",
        "Σ k3",
        "catastr.",
    ):
        table.add_column(heading, justify="left" if heading in ("sample_id", "file:row") else "right")
    for row in rows:
        table.add_row(
            str(row.step),
            Text(row.sample_id),
            Text(f"{_short(row.file)}:{row.row}"),
            f"{row.model_tokens}/{row.length}",
            str(row.rounds),
            str(row.worst_round),
            number(row.log_ppl_diff),
            number(row.max_abs_diff),
            number(row.k3_sum),
            str(row.catastrophic_count),
        )
    return table


def worst_tokens_table(result: AnalysisResult) -> Table:
    tokens = result.worst_tokens[:ROWS_SHOWN]
    table = Table(title=f"Worst tokens by |δ| (top {len(tokens)})", title_justify="left")
    for heading in (
        "step",
        "sample_id",
        "pos",
        "round",
        "token",
        "trainer logp",
        "rollout logp",
        "δ",
        "p trainer",
        "p rollout",
    ):
        table.add_column(heading, justify="left" if heading in ("sample_id", "token") else "right")
    for token in tokens:
        text = token.token if token.token is not None else (None if token.token_id is None else f"#{token.token_id}")
        table.add_row(
            str(token.step),
            Text(token.sample_id),
            str(token.position),
            str(token.round),
            Text(repr(text)[1:-1] if text is not None else "–"),
            number(token.trainer_logprob),
            number(token.rollout_logprob),
            number(token.log_ratio),
            number(token.trainer_prob, 3),
            number(token.rollout_prob, 3),
        )
    return table


def findings(result: AnalysisResult) -> list[RenderableType]:
    """One line per trend the data shows and per anomalous step."""
    lines: list[RenderableType] = []
    for trend in result.trends:
        if trend.summary:
            lines.append(Text(f"trend: {trend.summary}", style="bold"))
    for anomaly in result.anomalies[:ROWS_SHOWN]:
        lines.append(
            Text(
                f"anomaly: step {anomaly.step}: {anomaly.metric} = {number(anomaly.value)}, "
                f"{anomaly.factor:.1f}× the median of the previous steps ({number(anomaly.baseline)})",
                style="yellow",
            )
        )
    if len(result.anomalies) > ROWS_SHOWN:
        lines.append(Text(f"… {len(result.anomalies) - ROWS_SHOWN} more anomalies in --format json", style="yellow"))
    return lines


def _short(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def skipped_table(result: AnalysisResult) -> Table:
    shown = result.skipped[:20]
    more = result.skipped_rows - len(shown)
    title = f"Skipped rows: {result.skipped_rows}" + (
        f" (first {len(shown)} listed; all in --format json)" if more > 0 else ""
    )
    table = Table(title=title, title_justify="left", title_style="yellow")
    for heading in ("file", "row", "column", "reason"):
        table.add_column(heading)
    for record in shown:
        table.add_row(record.file, "–" if record.row is None else str(record.row), record.column or "–", record.reason)
    return table
