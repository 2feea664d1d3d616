"""The terminal view of an AnalysisResult: verdict line and where first, then every table, fitted to the width.

Every string from the data goes through ``plain``/``safe_markup`` (control characters visible, no markup);
tables are ``FitTable``s (no number or name is ever cut); metric names are short (``k3_kl``) with a legend
that gives verl's full name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from rich.console import Group, RenderableType
from rich.markup import escape as escape_markup
from rich.text import Text

from rollout_diag import catalogue
from rollout_diag.catalogue import lookup, parse_round_key, round_quantity, short_name
from rollout_diag.formatting import token_cell
from rollout_diag.paths import file_label, file_labels
from rollout_diag.render.format import extra_cell, level, number, percent, plain, visible
from rollout_diag.render.hints import hint_lines
from rollout_diag.render.summary import verdict_lines
from rollout_diag.render.table import Column, FitTable, Num, Nums
from rollout_diag.results import AnalysisResult, ExtraValue, RowMetrics, StepResult, StepTable, extra_names, run_rows
from rollout_diag.results.wording import HEADLINE, extreme_prompts_line, most_divergent_round, where, worst_step

# The per-step table's metric columns: kl, the judged metrics (the step's verdict column shows their level), the
# catastrophic token count.
STEP_METRICS = tuple(
    metric.key for metric in (catalogue.KL, *catalogue.with_role(catalogue.Role.JUDGED), catalogue.CATASTROPHIC_TOKENS)
)
# The per-round table's metric columns, in order (a result's rounds table names them by their quantity).
ROUND_COLUMNS = (
    catalogue.ROUND_TOKEN_COUNT,
    catalogue.ROUND_SEQ_COUNT,
    catalogue.ROUND_ABS_DIFF_MEAN,
    catalogue.ROUND_KL,
    catalogue.ROUND_K3_KL,
    catalogue.ROUND_CHI2_TOKEN,
    catalogue.ROUND_MAX_ABS_DIFF,
)
ROWS_SHOWN = 10
EXTRAS_SHOWN = 4  # extra dump columns (reward, advantage, …) in the worst-rows table; every one in --format json
EXTRA_TEXT_SHOWN = 40  # characters of a text extra in that table (a label fits; the whole value in --format json)
STEPS_SHOWN_EACH_END = 5  # long runs: first, last and worst steps unless --all-steps


def render_analysis(result: AnalysisResult, all_steps: bool = False) -> RenderableType:
    parts: list[RenderableType] = [header(result), *first_screen(result), verdict_table(result)]
    parts.append(metrics_table(result.run))
    if len(result.steps) > 1:
        parts.append(steps_table(result.steps, all_steps, result.step_levels))
    if len(result.rounds) > 1:
        parts.append(rounds_table(result))
    elif result.rounds:  # a table of one row says less than this line
        parts.append(
            Text("Per round: single-turn data (every row is one run of model tokens): one round.", style="dim")
        )
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
        parts.append(plain(f"warning: {warning}", style="yellow"))
    parts.append(legend(result))
    return Group(*parts)


def header(result: AnalysisResult) -> Text:
    columns = ", ".join(f"{role}={name}" for role, name in result.columns.items())
    text = Text("rollout-diag analyze", style="bold")
    text.append(
        f": {len(result.inputs)} {result.format} file(s), {result.layout} layout, "
        f"{result.skipped_data.counts(result.run.rows, result.run.tokens)}, {len(result.steps)} step(s), "
        f"device {result.device}\n"
    )
    text.append_text(plain(f"columns: {columns}", style="dim"))
    return text


def first_screen(result: AnalysisResult) -> list[RenderableType]:
    """The overall verdict (as the report's banner says it) with its pipeline findings and notes under it, then one
    line with where the mismatch sits."""
    lines = verdict_lines(result.verdict, result.hints, result.skipped_data)
    places = where(result)
    if places:
        lines.append(plain("Where: " + "; ".join(places) + "."))
    return lines


def verdict_table(result: AnalysisResult) -> FitTable:
    table = FitTable(
        "Key metrics (whole run)",
        [
            Column("metric", "left", key=True),
            Column("value"),
            Column("verdict", "left"),
            Column("watch ≥"),
            Column("bad ≥"),
            Column("steps watch/bad"),
        ],
    )
    for verdict in result.verdicts:
        per_step = [entry["levels"].get(verdict.metric) for entry in result.step_levels]
        table.add_row(
            short_name(verdict.metric),
            Num(verdict.value),
            level(verdict.level),
            Num(verdict.watch),
            Num(verdict.bad),
            f"{per_step.count('watch')} / {per_step.count('bad')}",
        )
    return table


def metrics_table(run: StepResult) -> FitTable:
    """Every run metric, grouped by verl's prefix (the group row gives the full name's first part)."""
    table = FitTable(
        "All metrics (whole run, every row as one batch)",
        [Column("metric", "left", key=True), Column("value"), Column("note", "left", wrap=True)],
    )
    family = None
    for name, value in run.metrics.items():
        if parse_round_key(name) is not None:
            continue
        prefix, _, leaf = name.rpartition("/")
        if prefix != family:
            table.add_row(Text(f"{prefix}/", style="bold"), "", "")
            family = prefix
        row = lookup(name)
        table.add_row(f"  {leaf}", Num(value), "" if row is None else row.note)
    return table


def steps_table(steps: Sequence[StepResult], all_steps: bool, levels: Sequence[dict] = ()) -> FitTable:
    count = len(steps)
    ids = steps.step_ids.tolist() if isinstance(steps, StepTable) else [step.step for step in steps]
    if all_steps or count <= 3 * STEPS_SHOWN_EACH_END:
        shown, title = list(range(count)), "Per step"
    else:
        present, read = _metric_reads(steps, HEADLINE, range(count))
        values: list[float] = read.tolist() if isinstance(read, np.ndarray) else read
        ranked = sorted((at for at in range(count) if present[at]), key=values.__getitem__, reverse=True)
        ends = [*range(STEPS_SHOWN_EACH_END), *range(count - STEPS_SHOWN_EACH_END, count)]
        chosen = {ids[at] for at in [*ends, *ranked[:STEPS_SHOWN_EACH_END]]}
        shown = [at for at in range(count) if ids[at] in chosen]
        title = (
            f"Per step: first {STEPS_SHOWN_EACH_END}, last {STEPS_SHOWN_EACH_END} and worst "
            f"{STEPS_SHOWN_EACH_END} by {short_name(HEADLINE)} of {count} (--all-steps for every step)"
        )
    worst = worst_step(steps)
    columns = [Column("step", key=True), Column("rows"), Column("tokens")]
    columns += [Column(short_name(name)) for name in STEP_METRICS]
    table = FitTable(title, [*columns, Column("verdict", "left")])
    step_level = {entry["step"]: entry["level"] for entry in levels}
    verdicts: dict[str, Text] = {}  # one Text per level, shared by its rows (the worst step's is its own)

    def verdict(at: int) -> Text:
        named = step_level.get(ids[at], "n/a")
        if worst is not None and ids[at] == worst.step:
            text = level(named)
            text.append(" ◀ worst")
            return text
        if (shared := verdicts.get(named)) is None:
            shared = verdicts[named] = level(named)
        return shared

    runs: list[range] = []  # the shown steps as runs of consecutive steps, a "⋮" row between two runs
    for at in shown:
        if runs and runs[-1].stop == at:
            runs[-1] = range(runs[-1].start, at + 1)
        else:
            runs.append(range(at, at + 1))
    for part, run in enumerate(runs):
        if part:
            table.add_row("⋮", *[""] * (len(columns)))
        table.add_rows(
            [str(ids[at]) for at in run],
            *(_counts(steps, name, run) for name in ("rows", "tokens")),
            *(_metric_nums(steps, name, run) for name in STEP_METRICS),
            [verdict(at) for at in run],
        )
    return table


def _counts(steps: Sequence[StepResult], name: str, run: range) -> Nums:
    """The steps' ``rows`` or ``tokens`` in ``run``: a StepTable's column, else read step by step."""
    if isinstance(steps, StepTable):
        return Nums(getattr(steps, name)[run.start : run.stop])
    return Nums([getattr(steps[at], name) for at in run])


def _metric_nums(steps: Sequence[StepResult], name: str, run: range) -> Nums:
    """The cells of metric ``name`` over the steps in ``run`` (a dash where a step has none)."""
    present, values = _metric_reads(steps, name, run)
    return Nums(values, present if isinstance(present, np.ndarray) else np.array(present, dtype=bool))


def _metric_reads(
    steps: Sequence[StepResult], name: str, run: range
) -> tuple[np.ndarray | list[bool], np.ndarray | list[Any]]:
    """(whether each step in ``run`` has metric ``name``, ``step.metrics.get(name)`` of each): a StepTable's float64
    column (NaN where absent), else read step by step."""
    if isinstance(steps, StepTable) and (read := steps.float_column(name)) is not None:
        present, values = read
        return present[run.start : run.stop], values[run.start : run.stop]
    if isinstance(steps, StepTable):  # a step's values read alone, without building every step
        picked: list = [RowMetrics(steps.metrics, at) for at in run]
    else:
        picked = [steps[at].metrics for at in run]
    return [name in metrics for metrics in picked], [metrics.get(name) for metrics in picked]


def rounds_table(result: AnalysisResult) -> FitTable:
    table = FitTable(
        "Per round (multi-turn; round k = k-th run of model tokens in a row)",
        [
            Column("round", key=True),
            *(Column(metric.title) for metric in ROUND_COLUMNS),
            Column("catastrophic"),
        ],
    )
    named = most_divergent_round(result)
    for row in result.rounds:
        label = f"≥ {row['round']}" if row["pooled"] else str(row["round"])
        table.add_row(
            label + (" ◀ most" if named is not None and row["round"] == named.round else ""),
            *(Num(row[round_quantity(metric)]) for metric in ROUND_COLUMNS),
            Num(row["catastrophic_count"]),
        )
    return table


def positions_table(positions: Sequence[dict]) -> FitTable:
    table = FitTable(
        "Per token position (log2 buckets of the index within the row)",
        [Column("positions", key=True), Column("tokens"), Column("|δ| mean"), Column("k3_kl"), Column("catastrophic")],
    )
    for row in run_rows(positions):  # the whole run's rows: no per-step row is made
        table.add_row(
            row["bucket"],
            Num(row["token_count"]),
            Num(row["logprob_abs_diff_mean"]),
            Num(row["k3_kl"]),
            percent(row["catastrophic_share"]),
        )
    return table


def worst_rows_table(result: AnalysisResult, criterion: str = "log_ppl_abs_diff") -> FitTable:
    kept = [r for r in result.worst_rows if r.criterion == criterion]
    rows = kept[:ROWS_SHOWN]
    extras = extra_names(rows)
    shown = extras[:EXTRAS_SHOWN]
    hidden = len(extras) - len(shown)
    more = f"; {hidden} more extra column{'s' if hidden > 1 else ''} in --format json" if hidden else ""
    text = {name: any(isinstance(row.extra.get(name), str) for row in rows) for name in shown}
    values = [row.extra.get(name) for row in rows for name in shown]
    long_text = any(isinstance(value, str) and len(value) > EXTRA_TEXT_SHOWN for value in values)
    more += "; long extra text cut, whole in --format json" if long_text else ""
    table = FitTable(
        f"Worst rows by |log-ppl diff| ({_top(len(rows), len(kept))}; every kept row and criterion in --format json; "
        f"rollout-diag inspect FILE --sample ID shows one token by token{more})",
        [
            Column("step", key=True),
            Column("sample_id", "left", key=True, wrap=True),
            Column("file:row", "left", wrap=True, fold_width=40),
            Column("tokens"),
            Column("rounds"),
            Column("worst round"),
            Column("log-ppl diff"),
            Column("max |δ|"),
            Column("Σ k3"),
            Column("catastrophic"),
            # column names come from the dump: shown as text, never read as markup
            *(
                Column(escape_markup(visible(name)), "left" if text[name] else "right", wrap=text[name], fold_width=16)
                for name in shown
            ),
        ],
    )
    labels = file_labels(result.inputs)
    for row in rows:
        table.add_row(
            str(row.step),
            row.sample_id,
            f"{labels.get(row.file) or file_label(row.file, result.inputs)}:{row.row}",
            f"{row.model_tokens}/{row.length}",
            str(row.rounds),
            str(row.worst_round),
            Num(row.log_ppl_diff),
            Num(row.max_abs_diff),
            Num(row.k3_sum),
            str(row.catastrophic_count),
            *(_extra_text(row.extra[name]) if name in row.extra else "" for name in shown),
        )
    return table


def _top(shown: int, kept: int) -> str:
    """``top 10``, or ``top 10 of the 50 that --top-k kept`` when --top-k kept more than the terminal shows."""
    return f"top {shown}" if kept <= shown else f"top {shown} of the {kept} that --top-k kept"


def _extra_text(value: ExtraValue) -> str:
    shown = extra_cell(value)
    return shown if len(shown) <= EXTRA_TEXT_SHOWN else shown[: EXTRA_TEXT_SHOWN - 1] + "…"


def worst_tokens_table(result: AnalysisResult) -> FitTable:
    tokens = result.worst_tokens[:ROWS_SHOWN]
    table = FitTable(
        f"Worst tokens by |δ| ({_top(len(tokens), len(result.worst_tokens))}"
        + ("; all in --format json)" if len(result.worst_tokens) > len(tokens) else ")"),
        [
            Column("step", key=True),
            Column("sample_id", "left", key=True, wrap=True),
            Column("pos", key=True),
            Column("round"),
            Column("token", "left", wrap=True),
            Column("trainer logp"),
            Column("rollout logp"),
            Column("δ"),
            Column("p trainer"),
            Column("p rollout"),
        ],
    )
    for token in tokens:
        text = token_cell(token.token, token.token_id)
        table.add_row(
            str(token.step),
            token.sample_id,
            str(token.position),
            str(token.round),
            "–" if text is None else text,
            Num(token.trainer_logprob),
            Num(token.rollout_logprob),
            Num(token.log_ratio),
            Num(token.trainer_prob),
            Num(token.rollout_prob),
        )
    return table


def findings(result: AnalysisResult) -> list[RenderableType]:
    """One line per trend the data shows, then the anomalous steps, largest factor first."""
    lines: list[RenderableType] = []
    for trend in result.trends:
        if trend.summary:
            lines.append(plain(f"trend: {trend.summary}", style="bold"))
    prompts = extreme_prompts_line(result)
    if prompts is not None:
        lines.append(plain(f"prompts: {prompts}", style="bold"))
    ranked = sorted(result.anomalies, key=lambda a: -a.factor)
    for anomaly in ranked[:ROWS_SHOWN]:
        lines.append(
            plain(
                f"anomaly: step {anomaly.step}: {short_name(anomaly.metric)} = {number(anomaly.value)}, "
                f"{anomaly.factor:.3g}× the median of the previous steps ({number(anomaly.baseline)})"
                + (f" — resume at step {anomaly.resume}, not a spike" if anomaly.resume is not None else ""),
                style="yellow",
            )
        )
    if result.anomaly_check:
        lines.append(plain(f"anomaly: {result.anomaly_check}", style="dim"))
    if len(ranked) > ROWS_SHOWN:
        kept = "all" if not result.anomalies_cut else f"the {len(ranked)} largest"
        smaller = len(ranked) - ROWS_SHOWN + result.anomalies_cut
        lines.append(Text(f"and {smaller} smaller anomalies ({kept} in --format json)", style="yellow"))
    return lines


def skipped_table(result: AnalysisResult) -> FitTable:
    shown = result.skipped[:20]
    more = result.skipped_rows - len(shown)
    title = f"Skipped rows: {result.skipped_rows}" + (
        f" (first {len(shown)} listed; all in --format json)" if more > 0 else ""
    )
    table = FitTable(
        title,
        [
            Column("file", "left", wrap=True),
            Column("row"),
            Column("column", "left", wrap=True),
            Column("reason", "left", wrap=True),
        ],
    )
    for record in shown:
        table.add_row(record.file, "–" if record.row is None else str(record.row), record.column or "–", record.reason)
    return table


def legend(result: AnalysisResult) -> Text:
    """Short names used above → verl's full names (as in --format json)."""
    names = [v.metric for v in result.verdicts]
    names += [name for name in STEP_METRICS if name not in names]
    entries = [f"{short_name(name)} = {name}" for name in names if short_name(name) != name]
    return Text(
        "Names: "
        + "; ".join(entries)
        + ". Numbers: 4 significant digits; in a column in which any value is below 0.01 or from 10,000 up, the "
        "values below 1 are written in scientific notation (1.013e-3 = 0.001013).",
        style="dim",
    )
