"""What a notebook shows for a result (``_repr_html_``): the verdict, where the mismatch sits (the terminal's "Where:"
lines, worded by rollout_diag/results/wording.py: the worst step, round, row, token and group of each ``--by`` spec)
and the key metrics, as the first screen of ``analyze`` says them; not a dump of the dataclass."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from rollout_diag import catalogue
from rollout_diag.catalogue import short_name
from rollout_diag.formatting import number, selection_sentence
from rollout_diag.results.wording import where

if TYPE_CHECKING:
    from rollout_diag.results import AnalysisResult, ComparisonResult

LEVEL_COLOR = {"bad": "#cf222e", "watch": "#bf8700", "ok": "#1a7f37"}


def _level(level: str) -> str:
    color = LEVEL_COLOR.get(level, "#6e7781")
    return f'<b style="color:{color}">{html.escape(level.upper())}</b>'


def analysis_html(result: AnalysisResult) -> str:
    """An HTML fragment: header, verdict sentence, "where" lines (the worst group per --by among them), the
    key-metrics table."""
    level, sentence = (result.verdict.level, result.verdict.sentence) if result.verdict else ("n/a", "")
    parts = [
        "<div>",
        f"<b>rollout-diag analyze</b>: {len(result.inputs)} file(s), {number(result.run.rows)} rows, "
        f"{number(result.run.tokens)} model tokens, {len(result.steps)} step(s)<br>",
    ]
    if result.selection:
        parts.append(f"{html.escape(selection_sentence(result.selection))}<br>")
    parts.append(f"Verdict: {_level(level)} — {html.escape(sentence)}")
    places = where(result)  # as the terminal's "Where:" says it (rollout_diag/results/wording.py)
    if places:
        parts.append("<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in places) + "</ul>")
    rows = "".join(
        f"<tr><td>{html.escape(short_name(v.metric))}</td><td style='text-align:right'>{html.escape(number(v.value))}"
        f"</td><td>{_level(v.level)}</td><td style='text-align:right'>{html.escape(number(v.watch))}</td>"
        f"<td style='text-align:right'>{html.escape(number(v.bad))}</td></tr>"
        for v in result.verdicts
    )
    parts.append(
        "<table><thead><tr><th>key metric</th><th>value</th><th>verdict</th><th>watch ≥</th><th>bad ≥</th></tr>"
        f"</thead><tbody>{rows}</tbody></table>"
    )
    parts.append("<small>Tables: <code>result.to_polars()</code>; everything: <code>result.to_json()</code>.</small>")
    parts.append("</div>")
    return "".join(parts)


def _answer_html(result: ComparisonResult) -> str:
    """The comparison's answer first, as the terminal says it: the data's verdict, then the recommended preset or why
    none is recommended (a table of presets alone reads as if any of them would do)."""
    level, sentence = (result.verdict.level, result.verdict.sentence) if result.verdict else ("n/a", "")
    recommendation = result.recommendation
    if recommendation is not None and recommendation.preset is not None:
        reasons = html.escape("; ".join(recommendation.reasons))
        answer = f"Recommended: <b>{html.escape(recommendation.preset)}</b> ({reasons})"
    elif result.recommendation_withheld:
        answer = f"No recommendation: {html.escape(result.recommendation_withheld)}"
    else:
        answer = html.escape(recommendation.summary() if recommendation is not None else "No recommendation.")
    return f"Verdict: {_level(level)} — {html.escape(sentence)}<br>{answer}<br>"


def comparison_html(result: ComparisonResult) -> str:
    """An HTML fragment: the verdict and the recommendation (or why it is withheld), then one row per preset with its
    run-level rejected shares and IS effective sample size."""
    metrics = (catalogue.REJECTED_TOKEN_FRACTION, catalogue.REJECTED_ROW_FRACTION, catalogue.IS_EFF_SAMPLE_SIZE)

    def value(run: dict, metric: catalogue.Metric) -> str:
        found = run.get(metric.key)
        return number(run.get(catalogue.legacy_twin(metric).key) if found is None else found)

    rows = "".join(
        f"<tr><td>{html.escape(p.name)}</td><td>{html.escape(p.mode)}</td>"
        + "".join(f"<td style='text-align:right'>{html.escape(value(p.run.metrics, m))}</td>" for m in metrics)
        + f"<td>{'intrusive' if p.intrusive else ''}</td></tr>"
        for p in result.presets
    )
    head = "".join(f"<th>{html.escape(short_name(m.key))}</th>" for m in metrics)
    return (
        f"<div>{_answer_html(result)}"
        f"<b>rollout-diag compare-presets</b>: {len(result.presets)} preset(s) on {len(result.inputs)} file(s)"
        f"<table><thead><tr><th>preset</th><th>mode</th>{head}<th></th></tr></thead><tbody>{rows}</tbody></table>"
        "<small>Tables: <code>result.to_polars()</code>.</small></div>"
    )
