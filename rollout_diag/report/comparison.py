"""The presets section: what each rollout-correction preset would do to this data, and the threshold sweep.

Reads a :class:`~rollout_diag.results.ComparisonResult` (a saved ``--format json`` document becomes one through
``ComparisonResult.from_json`` before it gets here); the intrusive marks are the comparison's own
(rollout_diag.decisions.intrusive).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from rollout_diag import catalogue
from rollout_diag.decisions.sweep import default_sentences
from rollout_diag.errors import ConfigError
from rollout_diag.formatting import number, percent
from rollout_diag.report import figures
from rollout_diag.report.markup import Column, Markup, code, escape, note, table
from rollout_diag.report.sections import Canvas, Section
from rollout_diag.report.series import MAX_TABLE_ROWS, finite
from rollout_diag.results import ComparisonResult, PresetResult, SweepOption
from rollout_diag.results.wording import k1_bounds_line

# Each value is read from the first key present: summary/ covers every family, rollout_corr/ is §2/§3, mismatch/ §8.
METRIC_KEYS = {
    "rejected": (catalogue.REJECTED_TOKEN_FRACTION.key, catalogue.RS_MASKED_FRACTION.key),
    "rejected_rows": (catalogue.REJECTED_ROW_FRACTION.key, catalogue.RS_SEQ_MASKED_FRACTION.key),
    **{
        what: (metric.key, catalogue.legacy_twin(metric).key)
        for what, metric in (
            ("ess", catalogue.IS_EFF_SAMPLE_SIZE),
            ("is_mean", catalogue.IS_MEAN),
            ("is_max", catalogue.IS_MAX),
        )
    },
    "batch_norm": (catalogue.IS_BATCH_NORM_FACTOR.key,),
}
PRESET_COLUMNS = (
    Column("preset"),
    Column("mode"),
    Column("importance sampling"),
    Column("rejection"),
    Column("tokens dropped", True, "share of model tokens rejected or zero-weighted (summary/rejected_token_fraction)"),
    Column("rows dropped", True, "share of rows with a dropped token (summary/rejected_row_fraction)"),
    Column("IS mean", True, "rollout_is_mean"),
    Column("IS max", True, "rollout_is_max"),
    Column("ESS", True, "rollout_is_eff_sample_size: 1 = uniform weights"),
)
BATCH_NORM_COLUMN = Column("batch-norm factor", True, "rollout_is_batch_norm_factor")


def select_presets(comparison: ComparisonResult, names: Sequence[str] | None) -> list[PresetResult]:
    """The comparison's presets, only ``names`` (in that order) when given; ConfigError for an unknown name."""
    if not names:
        return list(comparison.presets)
    by_name = {preset.name: preset for preset in comparison.presets}
    unknown = [name for name in names if name not in by_name]
    if unknown:
        raise ConfigError(
            f"preset(s) not in this comparison: {', '.join(unknown)}", hint=f"choose from {', '.join(by_name)}"
        )
    return [by_name[name] for name in names]


def presets_section(comparison: ComparisonResult, presets: Sequence[PresetResult], canvas: Canvas) -> Section:
    title = "Rollout-correction presets"
    if not presets:
        return Section("presets", title, note("No preset in this comparison."))
    batch_norm = any(_value(p.run.metrics, "batch_norm") is not None for p in presets)
    rows, classes = [], []
    for preset in presets:
        metrics = preset.run.metrics
        cells = _preset_cells(preset, metrics)
        rows.append([*cells, _number_cell(_value(metrics, "batch_norm"))] if batch_norm else cells)
        classes.append("intrusive" if preset.intrusive else "")
    columns = (*PRESET_COLUMNS, BATCH_NORM_COLUMN) if batch_norm else PRESET_COLUMNS
    chart = figures.presets_figure(
        [p.name for p in presets],
        [_value(p.run.metrics, "rejected") or 0.0 for p in presets],
        [_value(p.run.metrics, "rejected_rows") or 0.0 for p in presets],
        [_value(p.run.metrics, "ess") for p in presets],
    )
    intro = Markup(
        '<p class="lead">What each preset would do to this exact data (METRICS.md §2–§4, §8). Highlighted rows are '
        f"intrusive: they drop more than {comparison.intrusive_rejected_fraction:.0%} of model tokens or keep an IS "
        f"effective sample size below {comparison.intrusive_min_ess:g}. A preset without importance sampling has no "
        "ESS bar.</p>"
    )
    k1_lines: dict[str, str] = {}  # one per distinct setting and numbers (the first preset's name)
    for p in presets:
        if (line := k1_bounds_line(p.name, p.config, p.run.metrics)) is not None:
            k1_lines.setdefault(line.partition(": ")[2], line)
    k1_note = "".join(note(line) for line in k1_lines.values())
    body = [intro, table(columns, rows, classes), k1_note, canvas.plot("presets", chart), _raw_applied(presets)]
    body.append(_sweep(comparison.sweep, canvas))
    return Section("presets", title, "".join(body))


def _raw_applied(presets: Sequence[PresetResult]) -> str:
    """The IS presets' weights before truncation (summary/is_raw_*) beside verl's rollout_is_* of the applied ones,
    one row per IS setting; empty when no preset sets IS weights."""
    settings: dict[str, PresetResult] = {}
    for preset in presets:
        if preset.run.metrics.get(catalogue.IS_RAW_MEAN.key) is not None:
            settings.setdefault(_is_config(preset.config), preset)
    if not settings:
        return ""
    columns = [Column("IS")]
    for label, raw_key, applied_key in catalogue.IS_RAW_APPLIED:
        columns += [Column(f"{label} raw", True, raw_key), Column(f"{label} applied", True, applied_key)]
    rows = []
    for setting, preset in settings.items():
        metrics = preset.run.metrics
        cells: list[object] = [setting]
        for _, raw_key, applied_key in catalogue.IS_RAW_APPLIED:
            cells += [_number_cell(metrics.get(raw_key)), _number_cell(metrics.get(applied_key))]
        rows.append(cells)
    intro = Markup(
        "<h3>IS weights before and after truncation</h3><p>raw: w_raw = exp(clamp20(δ)) per token, exp(clamp20(s_i)) "
        "per sequence, before truncation or IcePop, over model tokens (<code>summary/is_raw_*</code>); applied: "
        "verl's <code>rollout_is_*</code> of the weights it applies.</p>"
    )
    return intro + table(columns, rows, [""] * len(rows))


@runtime_checkable
class StepColumns(Protocol):
    """Steps that read a metric over every step from their columns (the pass's ``metrics.outcome.PresetSteps``)."""

    def step_ids(self) -> list[Any]: ...

    def metric(self, key: str) -> list[Any]: ...


def rejection_by_step(presets: Sequence[PresetResult]) -> dict[str, tuple[list[Any], list[float | None]]]:
    """Preset name → (steps, share of tokens dropped per step), for presets that drop anything."""
    lines = {}
    for preset in presets:
        steps = preset.steps
        if isinstance(steps, StepColumns):  # a pass's PresetSteps: read from its columns, no step built
            values = _first_finite([steps.metric(key) for key in METRIC_KEYS["rejected"]])
            if any(values):
                lines[preset.name] = (steps.step_ids(), values)
            continue
        values = [_value(step.metrics, "rejected") for step in steps]
        if any(values):
            lines[preset.name] = ([step.step for step in steps], values)
    return lines


def _first_finite(columns: Sequence[list[Any]]) -> list[Any]:
    """Per step, the first of ``columns``' values that is finite (None where none is), as ``_value`` picks: found a
    column at a time (200 000 steps × 19 presets were 4 million generators)."""
    count = len(columns[0]) if columns else 0
    try:
        usable = [np.isfinite(np.array(column, dtype=np.float64)) for column in columns]  # None reads as NaN
    except (TypeError, ValueError):  # a value that is not a number: one step at a time
        return [next((value for value in values if finite(value)), None) for values in zip(*columns, strict=True)]
    pick = np.full(count, -1)
    for index in range(len(columns) - 1, -1, -1):  # the first column that is finite wins
        pick[usable[index]] = index
    out: list[Any] = [None] * count
    for index, column in enumerate(columns):
        for at in np.flatnonzero(pick == index).tolist():
            out[at] = column[at]
    return out


def _value(metrics: Mapping[str, Any], what: str) -> float | None:
    for key in METRIC_KEYS[what]:
        value = metrics.get(key)
        if finite(value):
            return value
    return None


def _preset_cells(preset: PresetResult, metrics: Mapping[str, Any]) -> list[object]:
    config = preset.config
    description = config.get("description") or ""
    name = f'<span title="{escape(description, limit=300)}">{escape(preset.name, limit=80)}</span>'
    if preset.intrusive:
        reasons = "; ".join(preset.intrusive_reasons)
        name += f' <span class="badge watch" title="{escape(reasons, limit=300)}">intrusive</span>'
    return [
        Markup(name),
        preset.mode or "–",
        _is_config(config),
        _rs_config(config),
        _percent_cell(_value(metrics, "rejected")),
        _percent_cell(_value(metrics, "rejected_rows")),
        # the legacy helper (§8) reports its mean and max before truncation: marked raw, as in the terminal
        *(_raw_cell(_value(metrics, what), bool(config.get("legacy_is"))) for what in ("is_mean", "is_max")),
        _number_cell(_value(metrics, "ess")),
    ]


def _raw_cell(value: float | None, raw: bool) -> object:
    return f"{number(value, 4)} raw" if raw and value is not None else _number_cell(value)


def _number_cell(value: float | None) -> object:
    return "–" if value is None else value


def _is_config(config: Mapping[str, Any]) -> str:
    level = config.get("rollout_is")
    if not level:
        return _legacy_config(config)
    threshold = config.get("rollout_is_threshold")
    normalize = " + batch norm" if config.get("rollout_is_batch_normalize") else ""
    return f"{level} {threshold}{normalize}" if threshold is not None else f"{level}{normalize}"


def _legacy_config(config: Mapping[str, Any]) -> str:
    """§8 presets: level, mode and bounds, e.g. "token truncate [0.5, 2.0]"."""
    level = config.get("legacy_is")
    if not level:
        return "–"
    bounds = config.get("legacy_is_threshold")
    return " ".join(str(part) for part in (level, config.get("legacy_is_mode"), bounds) if part is not None)


def _rs_config(config: Mapping[str, Any]) -> str:
    options = config.get("rollout_rs")
    if not options:
        return _veto(config.get("legacy_is_veto_threshold"))
    threshold = config.get("rollout_rs_threshold")
    return f"{options} {threshold}" if threshold is not None else str(options)


def _veto(bounds: Any) -> str:
    """§8 per-token veto bounds [lower, upper] (None = unbounded) as "veto ρ < 0.0001" or "veto ρ ∉ [0, 20]"."""
    if not isinstance(bounds, (list, tuple)) or len(bounds) != 2:
        return "–" if not bounds else f"veto {bounds}"
    lower, upper = bounds
    if upper is None:
        return f"veto ρ < {lower:g}" if lower is not None else "–"
    return f"veto ρ ∉ [{lower or 0:g}, {upper:g}]"


def _percent_cell(value: float | None) -> str:
    return percent(value)


# ------------------------------------------------------------------------------------------ sweep
def _sweep(sweep: Sequence[SweepOption], canvas: Canvas) -> str:
    """The run-level sweep: verl's defaults in words, one share-vs-threshold curve per option."""
    if not sweep:
        return ""
    curves, marks, ratios = [], [], []
    for item in sweep:
        name = f"{item.option} {item.level}"
        own = _marks(item, name)
        thresholds, shares = _curve(item, own)
        if thresholds:
            curves.append((name, thresholds, shares))
            ratios.append(is_ratio(item.option))
        marks.extend(own)
    parts = ["<h3>Threshold sweep</h3>"]
    sentences = default_sentences(sweep)
    parts.extend(f'<p class="finding">{escape(text, limit=300)}</p>' for text in sentences[:MAX_TABLE_ROWS])
    if curves:
        parts.append(
            '<p class="note">Share rejected against the threshold, for the whole run, one chart per option '
            "(each on its own threshold scale; ratio thresholds U, of IS and k1 options, spaced by ln U). "
            "Diamonds: verl defaults and the thresholds that hit the target shares.</p>"
        )
        parts.append(canvas.plot("sweep", figures.sweep_figure(curves[:16], marks[:200], ratios[:16])))
    else:
        parts.append(_sweep_table(sweep))
    return "".join(parts)


def is_ratio(option: str) -> bool:
    """Options whose threshold is a ratio (IS truncation, k1 bounds U with L = 1/U): drawn on a log axis."""
    return option.startswith("is_") or option.endswith("_k1")


def _curve(item: SweepOption, marks: Sequence[tuple[str, float, float]] = ()) -> tuple[list[float], list[float]]:
    """(thresholds, shares) of the option's share-vs-threshold curve, finite points only, through its marks
    (verl's default and the targets' thresholds are points of the same curve: a default below the curve's first
    threshold would otherwise float beside it)."""
    points = sorted(
        {(float(p.threshold), float(p.share)) for p in item.curve or [] if finite(p.threshold) and finite(p.share)}
        | ({(x, y) for _, x, y in marks} if item.curve else set())
    )
    return [x for x, _ in points], [y for _, y in points]


def _marks(item: SweepOption, name: str) -> list[tuple[str, float, float]]:
    """verl's default threshold and the thresholds found for the target shares, as points on the curve."""
    marks = []
    if finite(item.default_threshold) and finite(item.default_share):
        marks.append((f"{name}: verl default {item.verl_default}", float(item.default_threshold), item.default_share))
    for entry in item.thresholds:
        if entry.target * item.count < 1:  # less than one token or sequence: no threshold rejects that little
            continue
        if finite(entry.threshold) and finite(entry.share):
            marks.append((f"{name}: ≤ {entry.target:g}", float(entry.threshold), float(entry.share)))
    return marks


def _sweep_table(options: Sequence[SweepOption]) -> str:
    """When no option has a curve (too few distinct values): the options' scalar fields as a table."""
    items = [option.to_json() for option in options]
    keys = list(dict.fromkeys(k for item in items for k, v in item.items() if _scalar(v)))[:12]
    rows = [[_sweep_cell(item.get(key)) for key in keys] for item in items[:MAX_TABLE_ROWS]]
    return table([Column(key, False) for key in keys], rows)


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _sweep_cell(value: Any) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return "–"
    return code(value) if isinstance(value, str) else ("–" if value is None else value)
