"""The report's sections, each a function: result → HTML (escaped) plus the figures and strips it registers."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rollout_diag import catalogue
from rollout_diag.formatting import number, percent
from rollout_diag.glossary import sections
from rollout_diag.report import figures
from rollout_diag.report.figures import BLUE, GREY, RED, BarPanel, Figure, TrendPanel
from rollout_diag.report.markup import Column, Markup, code, escape, factor, note, table
from rollout_diag.report.series import (
    MAX_HEATMAP_COLUMNS,
    MAX_HEATMAP_ROUNDS,
    MAX_STEP_POINTS,
    MAX_TABLE_ROWS,
    bucket_bounds,
    decimate,
    finite,
    per_round_by_step,
    pool_rounds,
    step_series,
    weighted_buckets,
)
from rollout_diag.results import AnalysisResult, Rows, StepResult, StepTable
from rollout_diag.results import run_rows as whole_run

# The per-step trend panels, in order (title, sign and unit come from the catalogue: shares are drawn in %).
TREND_METRICS: tuple[catalogue.Metric, ...] = catalogue.with_role(catalogue.Role.TRENDED)
MAX_PRESET_LINES = 8
# Lines a trend panel draws beside its own metric's: the shares of model tokens past ln 2 and ln 5 beside the share
# past the catastrophic threshold (1 by default, between the two)
COMPANION_LINES = {
    catalogue.CATASTROPHIC_TOKEN_SHARE.key: (catalogue.EXTREME_FRAC_LN2, catalogue.EXTREME_FRAC_LN5),
}
# A trend panel's y-axis title: the catalogue's unit, in words where the bare unit would not read as one.
UNIT_TITLES = {catalogue.DIMENSIONLESS: "no unit", catalogue.SHARE: "share of model tokens"}


@dataclass(frozen=True)
class Section:
    anchor: str
    title: str
    body: str


@dataclass
class Canvas:
    """What the page's script draws: plotly figures by name, and token strips."""

    figures: dict[str, Figure] = field(default_factory=dict)
    strips: list[dict[str, Any]] = field(default_factory=list)

    def plot(self, name: str, figure: Figure) -> Markup:
        self.figures[name] = figure
        height = int(figure["layout"]["height"])  # reserved before drawing: the page does not jump
        return Markup(f'<div class="plot" id="plot-{name}" data-figure="{name}" style="height:{height}px"></div>')


# ------------------------------------------------------------------------------------------ trends
def trends_section(
    result: AnalysisResult, canvas: Canvas, rejection: dict[str, tuple[list[Any], list[float | None]]]
) -> Section:
    """Small multiples of the key metrics over steps (plus each preset's dropped-token share), anomalies marked."""
    # a StepTable's steps all have an id: read as it is, its series are read from its columns
    steps = result.steps if isinstance(result.steps, StepTable) else [s for s in result.steps if s.step is not None]
    title = "Per-step trends"
    if len(steps) < 2:
        return Section("trends", title, note(f"{len(steps)} step in this run: trends need at least two steps."))
    panels = [
        panel for panel in _metric_panels(result, steps) if any(v is not None for _, _, ys in panel.lines for v in ys)
    ]
    flagged = len({a.step for a in result.anomalies})
    intro = (
        f"{len(steps):,} steps. Red circles mark anomalies ({flagged} step(s) flagged): a value far above the median "
        "of the previous steps. Dotted lines are the verdict thresholds (shown when near the data). "
        "Drag to zoom, double-click to zoom out; the step axis is shared."
    )
    thinned = thinned_note(len(steps))
    body: list[str] = [
        Markup(f'<p class="lead">{escape(intro)}</p>'),
        canvas.plot("trends", figures.trends_figure(panels, thinned)),
    ]
    body.append(_anomaly_table(result))
    if rejection:
        body.append(_rejection_plot(rejection, canvas, thinned_note(len(steps), anomalies=False)))
    return Section("trends", title, "".join(body))


def _metric_panels(result: AnalysisResult, steps: Sequence[StepResult]) -> list[TrendPanel]:
    panels = []
    for metric in TREND_METRICS:
        flagged = [a for a in result.anomalies if a.metric == metric.key]
        ids, values = step_series(steps, metric.key)
        ids, values = decimate(ids, values, keep={a.step for a in flagged})
        rule = metric.verdict
        companions = []
        for companion in COMPANION_LINES.get(metric.key, ()):
            series = decimate(*step_series(steps, companion.key))
            if any(value is not None for value in series[1]):
                companions.append((companion.title, *series))
        panels.append(
            TrendPanel(
                title=metric.title,
                lines=[(metric.title, ids, values), *companions],
                anomalies=[(a.step, a.value, _anomaly_text(a)) for a in flagged[: 4 * MAX_TABLE_ROWS]],
                thresholds=[("watch", rule.watch), ("bad", rule.bad)] if rule else [],
                signed=metric.signed,
                percent=metric.unit == catalogue.SHARE,
                unit=UNIT_TITLES.get(metric.unit, metric.unit),
            )
        )
    return panels


def _anomaly_text(anomaly: Any) -> str:
    value, baseline = number(anomaly.value), number(anomaly.baseline)
    resumed = f" (resume at step {anomaly.resume}: a restart's transient)" if anomaly.resume is not None else ""
    return f"step {anomaly.step}: {value} = {factor(anomaly.factor)}× the median {baseline}{resumed}"


def thinned_note(steps: int, anomalies: bool = True) -> str:
    """What a per-step line of ``steps`` steps keeps when decimated (``decimate``), to say on the plot; "" when every
    step is drawn."""
    if steps <= MAX_STEP_POINTS:
        return ""
    runs = MAX_STEP_POINTS // 2
    kept = "the first and last step and every anomaly" if anomalies else "and the first and last step"
    return (
        f"{steps:,} steps, thinned out: each line keeps the smallest and largest value of each of {runs:,} runs of "
        f"~{round(steps / runs):,} consecutive steps, {kept}"
    )


def _rejection_plot(
    rejection: dict[str, tuple[list[Any], list[float | None]]], canvas: Canvas, thinned: str = ""
) -> str:
    """Share of tokens each preset drops, per step: presets with identical series share one line."""
    groups: dict[tuple[Any, ...], list[str]] = {}
    for name, (steps, values) in rejection.items():
        groups.setdefault((tuple(steps), tuple(values)), []).append(name)
    ranked = sorted(groups.items(), key=lambda item: -sum(v or 0.0 for v in item[0][1]))
    lines = [
        (names[0] + (f" (+{len(names) - 1} identical)" if len(names) > 1 else ""), *decimate(list(xs), list(ys)))
        for (xs, ys), names in ranked[:MAX_PRESET_LINES]
    ]
    shown = f"the {MAX_PRESET_LINES} that drop the most of " if len(ranked) > MAX_PRESET_LINES else ""
    heading = f"Tokens dropped per step, per preset ({shown}{len(rejection)} presets that drop any)"
    panel = TrendPanel("", lines, legend=True, percent=True)
    return f"<h3>{escape(heading)}</h3>" + canvas.plot("rejection", figures.trends_figure([panel], thinned))


def _anomaly_table(result: AnalysisResult) -> str:
    if not result.anomalies:
        return note("No anomaly step: no step's metric stands far above the median of the steps before it.")
    shown = sorted(sorted(result.anomalies, key=lambda a: -a.factor)[:MAX_TABLE_ROWS], key=lambda a: (a.step, a.metric))
    more = len(result.anomalies) - len(shown)
    steps = len({a.step for a in result.anomalies})
    flags = len(result.anomalies) + result.anomalies_cut  # the result keeps only the largest flags
    heading = f"Anomalies: {flags} flag(s)" + (
        f" (the {len(shown)} largest factors shown, on {steps} step(s))"
        if more or result.anomalies_cut
        else f" on {steps} step(s)"
    )
    columns = [
        Column("step", True),
        Column("metric"),
        Column("value", True),
        Column("median before", True, "median of the previous steps' values"),
        Column("factor", True),
        Column("note", False, "a step right after a resumed run starts: the restart's transient, not a spike"),
    ]
    rows = [
        (
            a.step,
            code(a.metric),
            a.value,
            a.baseline,
            Markup(f"{escape(factor(a.factor))}×"),
            "" if a.resume is None else f"resume at step {a.resume}",
        )
        for a in shown
    ]
    return f'<details class="anomalies"><summary>{escape(heading)}</summary>{table(columns, rows)}</details>'


# ------------------------------------------------------------------------------------------ rounds
def rounds_section(result: AnalysisResult, canvas: Canvas) -> Section:
    title = "Multi-turn rounds"
    rounds = sorted(result.rounds, key=lambda r: r["round"])
    if not rounds:
        return Section("rounds", title, note("No per-round data in this result."))
    intro = Markup(
        '<p class="lead">A round is the k-th run of model tokens in a row; environment/tool tokens (mask 0) '
        "separate rounds. Mismatch that grows with the round index points at state carried across turns.</p>"
    )
    body: list[str] = [intro, *_trend_notes(result, "round")]
    if len(rounds) == 1:
        body.append(note("Every row has a single round (no environment segment between model tokens)."))
    labels = [_round_label(r) for r in rounds]
    # red only for the round the analysis found standing out (support rule, a gap beyond the rounds' scatter, not
    # one token's); grey for the rounds below the support rule, which are never named however tall their bar
    found = result.divergent_round
    most = found.round if found is not None and found.stands_out else None
    unsupported = set(found.unsupported) if found is not None else set()
    hover = _bar_hovers("round", labels, rounds, _round_lines)
    panels = [
        BarPanel(
            f"mean |δ| per round ({'most divergent in red' if most is not None else 'none stands out'}"
            + ("; grey: too few tokens or rows to be named" if unsupported else "")
            + ")",
            [_value(r, "logprob_abs_diff_mean") for r in rounds],
            hover,
            [RED if r["round"] == most else GREY if r["round"] in unsupported else BLUE for r in rounds],
        ),
        BarPanel("k3_kl per round", [_value(r, "k3_kl") for r in rounds], hover, BLUE),
        _tokens_panel("model tokens per round", rounds, hover),
    ]
    body.append(canvas.plot("rounds", figures.bars_figure(labels, panels, "round")))
    heatmap = _round_heatmap(result, {r["round"]: label for r, label in zip(rounds, labels, strict=True)}, canvas)
    if heatmap:
        body.append(heatmap)
    return Section("rounds", title, "".join(body))


def wide_range(values: list[float | None]) -> bool:
    """Worth a log axis: the positive values span more than two decades."""
    positive = [v for v in values if v is not None and v > 0]
    return bool(positive) and max(positive) > 100 * min(positive)


def _round_label(row: dict[str, Any]) -> str:
    return f"≥ {row['round']}" if row.get("pooled") else str(row["round"])


def _number(value: Any) -> float:
    return value if finite(value) else -math.inf


def _value(row: Mapping[str, Any], key: str) -> float | None:
    value = row.get(key)
    return value if finite(value) else None


def _bar_hovers(
    kind: str,
    labels: Sequence[str],
    rows: Sequence[Mapping[str, Any]],
    lines: Callable[[Mapping[str, Any]], tuple[str, str]],
) -> list[str]:
    """Each bar's hover text: ``kind`` and the bar's label, the row's mean |δ| and k3_kl, then the row's two
    ``lines`` (an extreme, the counts)."""
    texts = []
    for label, row in zip(labels, rows, strict=True):
        extreme, counts = lines(row)
        mean, k3 = number(row.get("logprob_abs_diff_mean"), 4), number(row.get("k3_kl"), 4)
        texts.append(f"{kind} {escape(label)}<br>mean |δ| {mean}<br>k3_kl {k3}<br>{extreme}<br>{counts}")
    return texts


def _round_lines(row: Mapping[str, Any]) -> tuple[str, str]:
    counts = f"{number(row.get('token_count'))} tokens in {number(row.get('seq_count'))} rows"
    return f"max |δ| {number(row.get('max_abs_diff'), 4)}", counts


def _position_lines(row: Mapping[str, Any]) -> tuple[str, str]:
    return f"catastrophic {percent(row.get('catastrophic_share'))}", f"{number(row.get('token_count'))} tokens"


def _tokens_panel(title: str, rows: Sequence[Mapping[str, Any]], hover: list[str]) -> BarPanel:
    """The bars of the rows' model tokens (a log axis when they span more than two decades)."""
    tokens = [_value(row, "token_count") for row in rows]
    return BarPanel(title, tokens, hover, GREY, log=wide_range(tokens), count=True)


def _round_heatmap(result: AnalysisResult, labels: dict[int, str], canvas: Canvas) -> str:
    # a StepTable's steps all have an id: read as it is, per_round_by_step reads its round columns
    steps = result.steps if isinstance(result.steps, StepTable) else [s for s in result.steps if s.step is not None]
    table_by_round = pool_rounds(per_round_by_step(steps))
    if len(steps) < 2 or len(table_by_round) < 2:
        return ""
    pooled = len(table_by_round) > MAX_HEATMAP_ROUNDS
    row_labels = [f"≥ {k}" if pooled and k == MAX_HEATMAP_ROUNDS else labels.get(k, str(k)) for k in table_by_round]
    if isinstance(steps, StepTable):
        step_ids = steps.step_ids.tolist()
    else:
        step_ids = [s.step for s in steps if s.step is not None]
    heading = "Mean |δ| per round over steps"
    rows = list(table_by_round.values())
    return _heatmap_over_steps("rounds-by-step", heading, "round", row_labels, step_ids, rows, canvas)


def _heatmap_over_steps(
    name: str,
    heading: str,
    row_title: str,
    row_labels: list[str],
    step_ids: list[int],
    rows: list[tuple[list[float | None], list[float]]],
    canvas: Canvas,
) -> str:
    """A mean-|δ| heatmap, one row per label, (mean per step, tokens per step) merged into bounded step columns."""
    bounds = bucket_bounds(len(step_ids), MAX_HEATMAP_COLUMNS)
    merged = [weighted_buckets(means, tokens, bounds) for means, tokens in rows]
    figure = figures.step_heatmap(
        row_labels,
        [step_ids[start] for start, _ in bounds],
        [[value for value, _ in row] for row in merged],
        [[total for _, total in row] for row in merged],
        row_title,
        bounds[0][1] - bounds[0][0],
    )
    return f"<h3>{escape(heading)}</h3>" + canvas.plot(name, figure)


def _trend_notes(result: AnalysisResult, against: str) -> list[Markup]:
    notes = []
    for trend in result.trends:
        if against in trend.against and trend.summary:
            notes.append(Markup(f'<p class="finding">{escape(trend.summary)}</p>'))
        elif against in trend.against:
            notes.append(
                note(
                    f"{trend.metric} vs {trend.against}: slope {trend.slope:.3g} "
                    f"(95 % CI {trend.ci_low:.3g} … {trend.ci_high:.3g}, {trend.points} points): no significant trend."
                )
            )
    return notes


# ------------------------------------------------------------------------------------------ positions
def positions_section(result: AnalysisResult, canvas: Canvas) -> Section:
    title = "Position in the response"
    run_rows = sorted(whole_run(result.positions), key=lambda p: p.get("start", 0))
    if not run_rows:
        return Section("positions", title, note("No position data in this result."))
    labels = [str(p.get("bucket", p.get("start"))) for p in run_rows]
    hover = _bar_hovers("positions", labels, run_rows, _position_lines)
    panels = [
        BarPanel("mean |δ| by position bucket", [_value(p, "logprob_abs_diff_mean") for p in run_rows], hover, BLUE),
        BarPanel(
            f"share of catastrophic tokens (|δ| > {result.catastrophic_threshold:g})",
            [_value(p, "catastrophic_share") for p in run_rows],
            hover,
            RED,
            percent=True,
            empty=f"none: no model token has |δ| > {result.catastrophic_threshold:g}",
        ),
        _tokens_panel("model tokens", run_rows, hover),
    ]
    intro = Markup(
        '<p class="lead">Token index within the response (environment tokens counted), in log2 buckets 0, 1, '
        "2–3, 4–7, … Mismatch rising with position is long-context drift.</p>"
    )
    body: list[str] = [
        intro,
        *_trend_notes(result, "position"),
        canvas.plot("positions", figures.bars_figure(labels, panels, "position")),
    ]
    body.append(_position_heatmap(result, labels, canvas))
    return Section("positions", title, "".join(body))


# per label: (mean |δ| per step, None where the step has none; tokens per step)
HeatRows = dict[str, tuple[list[float | None], list[float]]]


def _empty_rows(labels: list[str], steps: int) -> HeatRows:
    return {label: ([None] * steps, [0.0] * steps) for label in labels}


def _position_heatmap(result: AnalysisResult, labels: list[str], canvas: Canvas) -> str:
    read = _position_columns(result.positions, labels)
    if read is None:
        step_ids = sorted({p["step"] for p in result.positions if p.get("step") is not None})
    else:
        step_ids, rows = read
    if len(step_ids) < 2:
        return ""
    if read is None:
        column = {step: i for i, step in enumerate(step_ids)}
        rows = _empty_rows(labels, len(step_ids))
        for p in result.positions:
            label = str(p.get("bucket", p.get("start")))
            if p.get("step") is None or label not in rows:
                continue
            means, tokens = rows[label]
            means[column[p["step"]]] = _value(p, "logprob_abs_diff_mean")
            tokens[column[p["step"]]] = float(p.get("token_count") or 0)
    heading = "Mean |δ| per position bucket over steps"
    return _heatmap_over_steps("positions-by-step", heading, "positions", labels, step_ids, list(rows.values()), canvas)


def _position_columns(positions: Sequence[dict[str, Any]], labels: list[str]) -> tuple[list[int], HeatRows] | None:
    """The heatmap's steps and (mean |δ|, tokens) per label and step, as ``_position_heatmap`` reads them row by row,
    from a Rows table's columns (its per-step rows: a column each, a step id each); None for other tables."""
    needed = ("step", "bucket", "logprob_abs_diff_mean", "token_count")
    if not isinstance(positions, Rows) or any(name not in positions.names for name in needed):
        return None
    column = {name: positions.columns[positions.names.index(name)] for name in needed}
    if column["step"].dtype.kind not in "iu" or any(row.get("step") is not None for row in positions.head):
        return None
    step_ids = np.unique(column["step"])
    at = np.searchsorted(step_ids, column["step"]).tolist()
    row_of = {label: index for index, label in enumerate(labels)}
    rows = _empty_rows(labels, len(step_ids))
    parts = [rows[label] for label in labels]
    for bucket, where, mean, tokens in zip(
        column["bucket"].tolist(),
        at,
        column["logprob_abs_diff_mean"].tolist(),
        column["token_count"].tolist(),
        strict=True,
    ):
        index = row_of.get(str(bucket))
        if index is not None:  # later rows of a step and label win, as row by row
            parts[index][0][where] = mean if finite(mean) else None
            parts[index][1][where] = float(tokens or 0)
    return step_ids.tolist(), rows


# ------------------------------------------------------------------------------------------ δ distribution
def delta_section(result: AnalysisResult, canvas: Canvas) -> Section:
    title = "Distribution of δ"
    histogram = getattr(result, "delta_histogram", None) or {}
    edges, counts = histogram.get("edges") or [], histogram.get("counts") or []
    if not counts or len(edges) != len(counts) + 1 or sum(counts) == 0:
        return Section("delta", title, note("This result has no δ histogram (it was made by an older rollout-diag)."))
    threshold = result.catastrophic_threshold
    share = result.run.metrics.get(catalogue.CATASTROPHIC_TOKEN_SHARE.key)
    count = result.run.metrics.get(catalogue.CATASTROPHIC_TOKENS.key)
    summary = (
        f"{number(count)} catastrophic tokens ({percent(share)} of model tokens) have |δ| > {threshold:g}, "
        f"i.e. a ratio ρ outside [{math.exp(-threshold):.3g}, {math.exp(threshold):.3g}]."
        if finite(share) and finite(count)
        else f"Catastrophic band: |δ| > {threshold:g}."
    )
    intro = Markup(
        f'<p class="lead">δ = trainer − rollout logprob over all model tokens, in signed log-spaced bins '
        f"(counts on a log scale). {escape(summary)} The red band marks the catastrophic tails.</p>"
    )
    return Section(
        "delta", title, intro + canvas.plot("delta", figures.delta_histogram_figure(edges, counts, threshold))
    )


# ------------------------------------------------------------------------------------------ glossary
def glossary_section() -> Section:
    parts: list[str] = [
        Markup(
            '<p class="lead">Notation: δ = a − r (trainer minus rollout logprob, log ρ); T[x] = mean over model '
            "tokens; R_i / S_i = mean / sum over row i's model tokens; mean_i = mean over the step's rows; "
            "d_i = R_i[r] − R_i[a]; clamp20 = clamp to [−20, 20].</p>"
        )
    ]
    columns = [Column("metric"), Column("formula"), Column("a high value means")]
    for heading, terms in sections().items():
        rows = [
            (_breakable(t.key), Markup(f'<span class="mono">{escape(t.formula)}</span>'), t.high_means) for t in terms
        ]
        parts.append(f'<h3>{escape(heading)}</h3><div class="glossary">{table(columns, rows)}</div>')
    return Section("glossary", "Glossary", "".join(parts))


def _breakable(name: str) -> Markup:
    """A metric name in code style that may wrap after '/' only (never mid-word)."""
    return Markup("<code>" + "/<wbr>".join(escape(part) for part in name.split("/")) + "</code>")
