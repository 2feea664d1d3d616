"""The report's "Why did it move?" section: per metric (k3_kl, mean |δ|) the change from the early to the late window
of steps, a stacked bar per factor (mix and within parts) and the table of parts with the bucket that moved most. It
reads the result's ``drift``; whether the change is beyond noise and what explains it were decided when the result
was built (decisions/drift.py)."""

from __future__ import annotations

import math

from rollout_diag.formatting import number
from rollout_diag.report import figures
from rollout_diag.report.markup import Column, Markup, escape, note, table
from rollout_diag.report.sections import Canvas, Section
from rollout_diag.results import AnalysisResult
from rollout_diag.results.wording import drift_name, drift_sentence, drift_steps


def drift_section(result: AnalysisResult, canvas: Canvas) -> Section | None:
    """None when the result has no drift (fewer than two steps)."""
    if not result.drift:
        return None
    first = result.drift[0]
    parts: list[str] = [
        Markup(
            f'<p class="lead">From steps {escape(drift_steps(first["from_steps"]))} to '
            f"{escape(drift_steps(first['to_steps']))}, each metric's change split per factor into a <b>mix</b> part "
            "(tokens moved between the factor's buckets: longer responses, more low-probability tokens) and a "
            "<b>within</b> part (each bucket's own mismatch moved); the two add up to the change (dotted line) for "
            "every factor. How to read it: <code>docs/drift.md</code>.</p>"
        )
    ]
    for index, entry in enumerate(result.drift):
        parts.append(_metric(index, entry, canvas))
    return Section("drift", "Why did it move?", "".join(parts))


def _metric(index: int, entry: dict, canvas: Canvas) -> str:
    name = drift_name(entry["metric"])
    sentence = drift_sentence(entry)
    low_high = entry.get("interval")
    interval = (
        "" if low_high is None else f", bootstrap interval of the change [{number(low_high[0])}, {number(low_high[1])}]"
    )
    said = (
        sentence
        if sentence
        else f"{name}: no change beyond noise ({number(entry['from'])} → {number(entry['to'])}{interval})."
    )
    factors = entry["factors"]
    body = [f"<h3>{escape(name)}</h3>", f"<p>{escape(said)}</p>"]
    title = f"{name}: {number(entry['from'])} → {number(entry['to'])} (change {number(entry['change'])})"
    body.append(
        canvas.plot(
            f"drift-{index}",
            figures.drift_figure(
                escape(title),
                [escape(f["factor"]) for f in factors],
                [f["mix"] for f in factors],
                [f["within"] for f in factors],
                entry["change"],
            ),
        )
    )
    rows = []
    for factor in factors:
        moved = max(factor["buckets"], key=_moved, default=None)
        change, mix = entry["change"], factor["mix"]
        finite = all(isinstance(v, float) and math.isfinite(v) for v in (change, mix)) and change != 0
        rows.append(
            (
                factor["factor"],
                mix,
                factor["within"],
                f"{100.0 * mix / change:.0f} %" if finite else "–",
                "—" if moved is None else _bucket_line(moved),
            )
        )
    columns = [
        Column("factor"),
        Column("mix", True),
        Column("within", True),
        Column("mix / change", True),
        Column("bucket that moved most (share, mean: early → late)"),
    ]
    body.append(table(columns, rows))
    if not sentence:
        body.append(note("Nothing in the terminal: the change is within the bootstrap's noise or under 25 %."))
    return "".join(body)


def _bucket_line(bucket: dict) -> str:
    def mean(value: float | None) -> str:
        return "–" if value is None else number(value)

    return (
        f"{bucket['bucket']}: {100.0 * bucket['from_share']:.1f} % → {100.0 * bucket['to_share']:.1f} % of tokens, "
        f"{mean(bucket['from_mean'])} → {mean(bucket['to_mean'])}"
    )


def _moved(bucket: dict) -> float:
    """How much a bucket moved the value (|mix| + |within|); a part without a value (null in a saved result) as 0."""
    parts = [abs(part) for part in (bucket["mix"], bucket["within"]) if part is not None and math.isfinite(part)]
    return sum(parts)
