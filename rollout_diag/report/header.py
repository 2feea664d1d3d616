"""The top of the report: title, overall verdict, one card per key metric, run facts, and findings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rollout_diag import catalogue
from rollout_diag.formatting import number, percent
from rollout_diag.paths import file_labels, inputs_label
from rollout_diag.report.markup import badge, escape, factor
from rollout_diag.report.series import finite, step_series
from rollout_diag.results import AnalysisResult, ComparisonResult, OverallVerdict, StepResult, StepTable
from rollout_diag.results.wording import extreme_prompts_line, round_sentence, trainer_column_lines

if TYPE_CHECKING:  # a type only: report modules never call decisions' functions
    from rollout_diag.decisions.diff import DiffResult

MAX_INPUTS_SHOWN = 10


def header_html(
    result: AnalysisResult,
    title: str,
    generated: str,
    comparison: ComparisonResult | None = None,
    diff: DiffResult | None = None,
) -> str:
    return "".join(
        [
            f"<h1>{escape(title, limit=200)}</h1>",
            f'<p class="subtitle">{escape(generated)}</p>',
            overall_html(result, comparison, diff),
            _cards(result),
            _facts(result),
            _findings(result),
            _warnings(result),
        ]
    )


def overall_html(
    result: AnalysisResult, comparison: ComparisonResult | None = None, diff: DiffResult | None = None
) -> str:
    """The banner: the result's verdict (the first line of ``analyze``), its pipeline findings directly under it, its
    notes, with a comparison the recommendation (or why it is withheld) right after, and with ``report --vs`` the A/B
    answer (the question the page was asked for, not a section at the bottom of the page)."""
    verdict: OverallVerdict | None = result.verdict
    if verdict is None:
        text = "this result carries no verdict (an older rollout-diag)"
        return f'<div class="overall na">Verdict: – <span>{escape(text)}</span></div>'
    cause = " (pipeline bug)" if verdict.cause == "pipeline" else ""
    parts = [f"Verdict: {badge(verdict.level)}{escape(cause)} <span>{escape(verdict.sentence, limit=600)}</span>"]
    messages = {hint.id: hint.message for hint in result.hints}
    skipped = result.skipped_data
    items = (
        [f'<li class="skipped">{escape(skipped.line(), limit=600)}</li>']
        if skipped.rows and "invalid_rows" not in verdict.findings
        else []
    )
    items += [
        f"<li><code>{escape(finding)}</code>: {escape(messages.get(finding, 'see the hints'), limit=600)}</li>"
        for finding in verdict.findings
    ]
    items += [f'<li class="muted">note: {escape(note, limit=600)}</li>' for note in verdict.notes]
    if items:
        parts.append(f'<ul class="verdict-findings">{"".join(items)}</ul>')
    if comparison is not None:
        parts.append(f"<p>{recommendation_html(comparison)}</p>")
    if diff is not None:
        parts.append(
            f'<p class="ab-answer"><strong>A/B:</strong> {escape(diff.answer(), limit=600)} '
            '<a href="#diff">the intervals, per metric</a></p>'
        )
    return f'<div class="overall {_css(verdict.level)}">{"".join(parts)}</div>'


def recommendation_html(comparison: ComparisonResult) -> str:
    """One line: the recommended preset and its reason, none, or why it is withheld (as compare-presets prints it)."""
    found = comparison.recommendation
    if comparison.recommendation_withheld:
        return f"<strong>Recommendation:</strong> {escape(comparison.recommendation_withheld, limit=600)}"
    if found is None:
        return "<strong>Recommendation:</strong> – (this result carries none: an older rollout-diag)"
    if found.preset is None:
        return f"<strong>Recommendation:</strong> none — {escape('; '.join(found.reasons), limit=600)}"
    tie = f" ({escape(found.tie_reason, limit=400)})" if found.tie_reason else ""
    return (
        f"<strong>Recommendation: <code>{escape(found.preset)}</code></strong> — "
        f"{escape('; '.join(found.reasons), limit=600)}{tie}"
    )


def _css(level: str) -> str:
    return level if level in ("ok", "watch", "bad") else "na"


def _short(metric: str) -> str:
    """The report's name of a metric: its key without the family prefix (``rollout_probs_diff_mean``)."""
    return metric.split("/", 1)[-1]


def _cards(result: AnalysisResult) -> str:
    cards = []
    for verdict in result.verdicts:
        watch, bad = _steps_at_level(result, verdict.metric)
        steps = f"steps at watch / bad: {watch} / {bad}" if len(result.steps) > 1 else ""
        cards.append(
            f'<div class="card {_css(verdict.level)}"><div class="card-top"><span class="metric">'
            f"{escape(_short(verdict.metric))}</span>{badge(verdict.level)}</div>"
            f'<div class="value">{escape(number(verdict.value, 4))}</div>'
            f'<div class="muted">watch ≥ {escape(number(verdict.watch))} · bad ≥ {escape(number(verdict.bad))}</div>'
            f'<div class="meaning">{escape(verdict.meaning)}</div>'
            + (f'<div class="muted">{escape(steps)}</div>' if steps else "")
            + "</div>"
        )
    return f'<div class="cards">{"".join(cards)}</div>'


def _steps_at_level(result: AnalysisResult, metric: str) -> tuple[int, int]:
    """Steps at watch and at bad level for ``metric``: the result's per-step levels, as ``analyze`` counts them."""
    levels = [entry["levels"].get(metric) for entry in result.step_levels]
    return levels.count("watch"), levels.count("bad")


def _facts(result: AnalysisResult) -> str:
    labels = file_labels(result.inputs)  # the shortest path ends that tell the inputs apart, as the tables print them
    names = [labels[path] or path for path in result.inputs]
    inputs = ", ".join(escape(name, limit=120) for name in names[:MAX_INPUTS_SHOWN])
    if len(names) > MAX_INPUTS_SHOWN:  # a directory dump: the directory and its count of files
        inputs = escape(inputs_label(list(result.inputs)), limit=160)
    run, skipped = result.run, result.skipped_data
    columns = ", ".join(
        f"{escape(role)} = <code>{escape(name, limit=80)}</code>" for role, name in result.columns.items()
    )
    facts = [
        ("inputs", inputs or "–"),
        (
            "rows",
            escape(number(run.rows) + (f" of {number(skipped.input_rows)}" if skipped.rows else ""))
            + (escape(f" ({number(run.empty_rows)} without a model token)") if run.empty_rows else ""),
        ),
        ("model tokens", escape(number(run.tokens) + (f" of {number(skipped.input_tokens)}" if skipped.rows else ""))),
        ("steps", escape(number(_with_ids(result.steps)))),
        ("layout", escape(result.layout or "–")),
        ("columns", columns or "–"),
        ("device", escape(result.device or "–")),
    ]
    if skipped.rows:
        facts.append(("skipped rows", escape(f"{skipped.rows:,} ({skipped.reason_text()}; analyze lists each row)")))
    items = "".join(f"<dt>{escape(key)}</dt><dd>{value}</dd>" for key, value in facts)
    return f'<dl class="facts">{items}</dl>'


def _findings(result: AnalysisResult) -> str:
    findings = [*_step_findings(result), *_where_findings(result)]
    findings.extend(trend.summary for trend in result.trends if trend.summary)
    prompts = extreme_prompts_line(result)
    if prompts is not None:
        findings.append(prompts.replace("--export-repro FILE", "analyze --export-repro FILE"))
    if not findings:
        return ""
    items = "".join(f"<li>{escape(text, limit=300)}</li>" for text in findings)
    return f'<h2 class="findings-title">What stands out</h2><ul class="findings">{items}</ul>'


def _step_findings(result: AnalysisResult) -> list[str]:
    metric = catalogue.K3_KL.key
    ids, values = step_series(result.steps, metric)  # None where not finite
    scored = [(value, step) for step, value in zip(ids, values, strict=True) if value is not None]
    findings = []
    run_value = result.run.metrics.get(metric)
    if len(scored) > 1 and run_value is not None and finite(run_value) and run_value > 0:
        value, step = max(scored, key=lambda pair: pair[0])  # the first of equal maxima, as step by step
        ratio = value / run_value
        findings.append(
            f"Worst step by {catalogue.K3_KL.short}: step {step} ({number(value, 4)}, {ratio:.1f}× the run value)."
        )
    if result.anomaly_check:
        findings.append(result.anomaly_check[0].upper() + result.anomaly_check[1:] + ".")
    if result.anomalies:
        top = max(result.anomalies, key=lambda a: a.factor)
        findings.append(
            f"{len({a.step for a in result.anomalies})} anomaly step(s); the largest: {_short(top.metric)} at step "
            f"{top.step} is {factor(top.factor)}× the median of the steps before it"
            + (f" (resume at step {top.resume}: a restart's transient)." if top.resume is not None else ".")
        )
    return findings


def _where_findings(result: AnalysisResult) -> list[str]:
    findings = []
    if result.divergent_round is not None:  # named by the analysis (support rule) and judged there
        findings.append(round_sentence(result.divergent_round))
    share = result.run.metrics.get(catalogue.CATASTROPHIC_TOKEN_SHARE.key)
    count = result.run.metrics.get(catalogue.CATASTROPHIC_TOKENS.key)
    if finite(share) and finite(count):
        findings.append(
            f"{number(count)} catastrophic token(s) (|δ| > {result.catastrophic_threshold:g}): "
            f"{percent(share)} of model tokens."
        )
    if result.worst_tokens:
        token = result.worst_tokens[0]
        findings.append(
            f"Largest |δ|: {token.log_ratio:+.3g} at step {token.step}, sample {token.sample_id}, "
            f"position {token.position} (round {token.round})."
        )
    # the relations to the trainer's columns that stand out (decisions/association.py), as the terminal words them
    findings.extend(line[0].upper() + line[1:] + "." for line in trainer_column_lines(result.trainer_columns))
    return findings


def _warnings(result: AnalysisResult) -> str:
    if not result.warnings:
        return ""
    items = "".join(f"<li>{escape(text, limit=400)}</li>" for text in result.warnings[:20])
    return f'<ul class="warnings">{items}</ul>'


def _with_ids(steps: Sequence[StepResult]) -> int:
    """How many of ``steps`` carry a step id (every step of a StepTable)."""
    return len(steps) if isinstance(steps, StepTable) else sum(step.step is not None for step in steps)
