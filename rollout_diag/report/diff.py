"""Report sections of the decisions: run A against run B (``report A --vs B``) and the preset recommendation.

Both read finished result objects (DiffResult, Recommendation); nothing is computed here but layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rollout_diag.formatting import change, number, percent
from rollout_diag.report.figures import BLUE, RED, Figure, axis, base_layout
from rollout_diag.report.markup import Column, Markup, escape, note, table
from rollout_diag.report.sections import Canvas, Section
from rollout_diag.results import run_rows

DIFF_COLUMNS = (
    Column("metric"),
    Column("A", True),
    Column("B", True),
    Column("B vs A", True, "how many times lower or higher B is than A"),
    Column("B − A", True),
    Column("interval", True, "bootstrap interval of B − A over sequences (rows resampled within steps)"),
    Column("verdict", False, "lower is better for every metric"),
)
PRESET_COLUMNS = (
    Column("preset"),
    Column("A", True, "share of model tokens dropped"),
    Column("B", True),
    Column("B − A", True),
    Column("interval", True),
)


def diff_section(result: Any, canvas: Canvas) -> Section:
    """A/B: the key metrics with intervals and verdicts, per-round and per-position curves of both runs, and the
    presets whose share of dropped tokens moved by more than the interval."""
    level = f"{result.level:.0%}"
    intro = Markup(
        f'<p class="lead">A: <code>{escape(result.a.label)}</code> ({result.a.result.run.rows} sequences), '
        f"B: <code>{escape(result.b.label)}</code> ({result.b.result.run.rows} sequences). Intervals: {level} "
        f"bootstrap of B − A, {result.replicates} resamples of the sequences within each step (seed {result.seed}). "
        "Lower is better for every metric; <em>no detectable change</em> means the interval contains 0.</p>"
    )
    rows, classes = [], []
    for metric in result.metrics:
        rows.append(
            [
                metric.metric,
                number(metric.a, 4),
                number(metric.b, 4),
                change(metric.a, metric.b),
                number(metric.difference, 3),
                f"[{number(metric.low, 3)}, {number(metric.high, 3)}]",
                metric.verdict,
            ]
        )
        classes.append("intrusive" if metric.verdict == "worse" else "")
    body: list[str] = [intro, table(DIFF_COLUMNS, rows, classes)]
    body.append(_curves(result, "rounds", "round", "round", canvas))
    body.append(_curves(result, "positions", "bucket", "position (log2 bucket)", canvas))
    grouped = result.changed_preset_groups
    if grouped:
        body.append(Markup(f"<h3>Presets whose share of dropped tokens changed (beyond the {level} interval)</h3>"))
        preset_rows = [
            [_names(group), percent(p.a), percent(p.b), percent(p.difference), f"[{percent(p.low)}, {percent(p.high)}]"]
            for group in grouped
            for p in group[:1]
        ]
        body.append(table(PRESET_COLUMNS, preset_rows))
    elif result.presets:
        body.append(note(f"No preset's share of dropped tokens changed by more than its {level} interval."))
    for warning in result.warnings:
        body.append(note(f"warning: {warning}"))
    return Section("diff", "Run A against run B", "".join(body))


def _names(group: Sequence[Any]) -> str:
    """A group of presets with the same numbers as one row's name: the first, then the others in brackets."""
    others = ", ".join(p.preset for p in group[1:])
    return group[0].preset + (f" (+{len(group) - 1}: {others})" if others else "")


def _curves(result: Any, field: str, key: str, x_title: str, canvas: Canvas) -> str:
    """mean |δ| per round (or position bucket) of both runs, overlaid; a sentence when neither has any."""
    sides = []
    for name, side, color in (("A", result.a, BLUE), ("B", result.b, RED)):
        table_rows = run_rows(getattr(side.result, field))  # no per-step row made
        sides.append((name, side.label, color, table_rows))
    if not any(rows for *_, rows in sides):
        return note(f"No per-{key} data in either run.")
    labels = _labels([row for *_, rows in sides for row in rows], key)
    data = []
    for name, label, color, rows in sides:
        by_label = {str(row[key]): row for row in rows}
        values = [_mean_abs(by_label.get(x)) for x in labels]
        hover = [
            f"{escape(name)}: {x_title} {escape(x)}<br>mean |δ| {number(v, 4)}<br>"
            f"{number((by_label.get(x) or {}).get('token_count'))} tokens"
            for x, v in zip(labels, values, strict=True)
        ]
        data.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": f"{name}: {escape(label)}",
                "x": labels,
                "y": values,
                "line": {"color": color},
                "text": hover,
                "hoverinfo": "text",
            }
        )
    layout = base_layout(
        300,
        showlegend=True,
        legend={"orientation": "h", "y": 1.12},
        xaxis=axis(title={"text": x_title}, type="category"),
        yaxis=axis(title={"text": "mean |δ|"}, rangemode="tozero"),
    )
    figure: Figure = {"data": data, "layout": layout}
    return f"<h3>mean |δ| per {escape(key)}, A and B</h3>" + canvas.plot(f"diff-{field}", figure)


def _labels(rows: Sequence[dict[str, Any]], key: str) -> list[str]:
    ordered: dict[str, tuple[float, str]] = {}
    for row in rows:
        label = str(row[key])
        ordered.setdefault(label, (float(row.get("start", row.get(key, 0)) or 0), label))
    return [label for _, label in sorted(ordered.values(), key=lambda item: item[0])]


def _mean_abs(row: dict[str, Any] | None) -> float | None:
    return None if row is None else row.get("logprob_abs_diff_mean")


def recommendation_section(comparison: Any, presets: Sequence[Any] | None = None) -> Section:
    """Which correction to turn on: the comparison's recommendation (made over all its presets when it was built),
    its rule, the runner-up and the rest; or why it is withheld. ``presets``: the presets the report shows (a
    recommended preset outside them is said to be so)."""
    found = comparison.recommendation
    title = "Which correction should I turn on?"
    if comparison.recommendation_withheld:
        return Section("recommendation", title, f"<p><strong>{escape(comparison.recommendation_withheld)}</strong></p>")
    if found is None:
        return Section("recommendation", title, note("This result carries no recommendation (an older rollout-diag)."))
    if found.preset is None:
        head = "<p><strong>None of these presets meets the rule on this data.</strong></p>"
    else:
        shown = {str(getattr(preset, "name", "")) for preset in presets or ()}
        outside = " (not among the presets shown here)" if shown and found.preset not in shown else ""
        tie = f" ({escape(found.tie_reason)})" if found.tie_reason else ""
        head = (
            f"<p><strong>Recommended: <code>{escape(found.preset)}</code></strong>{escape(outside)} — "
            f"{escape('; '.join(found.reasons))}.{tie}</p>"
        )
    parts = [head, f'<p class="note">Rule: {escape(found.rule)}. Reasons: docs/recommendation.md.</p>']
    if found.equivalent:
        parts.append(f"<p>Same numbers in another mode: {escape(', '.join(found.equivalent))}.</p>")
    if found.runner_up:
        parts.append(f"<p>Runner-up: <code>{escape(found.runner_up)}</code> — {escape(found.runner_up_reason)}.</p>")
    if found.not_chosen:
        rows = [[name, reason] for name, reason in found.not_chosen]
        parts.append("<details><summary>Why not the others</summary>")
        parts.append(table((Column("preset"), Column("not chosen because")), rows))
        parts.append("</details>")
    if found.note:
        parts.append(note(found.note))
    return Section("recommendation", title, "".join(parts))
