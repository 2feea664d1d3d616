"""compare-presets in the terminal: the answer first (the data's verdict, the recommendation and its reason), then
the table: one row per distinct effect (presets with identical numbers share a row, named beneath the table), run
values first and each preset's configuration after them, intrusive presets highlighted, presets that correct nothing
(no IS, no rejection) last."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import RenderableType

from rollout_diag import catalogue
from rollout_diag.render.format import number, percent, plain
from rollout_diag.render.summary import recommendation_line, verdict_lines
from rollout_diag.render.table import Column, FitTable, Num
from rollout_diag.results import ComparisonResult, PresetResult
from rollout_diag.results.wording import k1_bounds_line

INTRUSIVE_STYLE = "bold red"
INTRUSIVE_MARK = "!"  # in the text itself, so logs and pipes (no colour) show it too
RAW_MARK = " raw"  # verl reports sequence-level rollout_is_max before truncation: the raw max ρ
COLUMNS = (
    Column("preset", "left", key=True),
    Column("tok rejected"),
    Column("seq rejected"),
    Column("IS mean"),
    Column("IS max"),
    Column("ESS"),
    Column("bn factor"),
    Column("tokens kept"),
    Column("mode", "left", wrap=True, fold_width=20),
    Column("IS", "left", wrap=True),
    Column("RS", "left", wrap=True),
)


def answer_block(result: ComparisonResult) -> list[RenderableType]:
    """The first lines: the data's verdict (as ``analyze`` opens), its pipeline findings, then the recommendation
    and its reason, or why it is withheld."""
    alarm = result.verdict is not None and result.verdict.cause == "pipeline"
    line = recommendation_line(result.recommendation, result.recommendation_withheld, alarm)
    return [*verdict_lines(result.verdict, (), result.skipped_data), line]


def presets_table(result: ComparisonResult) -> FitTable:
    """One row per group of presets with identical run values (``name (+N identical)``), correcting presets
    first; intrusive rows marked ``!`` and in bold red (see the caption)."""
    normalised = any(catalogue.IS_BATCH_NORM_FACTOR.key in p.run.metrics for p in result.presets)
    columns = [c for c in COLUMNS if normalised or c.header != "bn factor"]
    chi2 = result.presets[0].run.metrics.get(catalogue.CHI2_TOKEN.key) if result.presets else None
    caption = (
        f"rejected = model tokens given no gradient (RS rejection, IcePop zero weight, legacy mask/veto). "
        f"{INTRUSIVE_MARK} and bold red: intrusive (drops > {result.intrusive_rejected_fraction:.0%} of tokens or "
        f"ESS < {result.intrusive_min_ess:g}). IS max is the largest weight after truncation;{RAW_MARK} = raw max ρ "
        f"before truncation (verl's sequence-level rollout_is_max; on legacy presets mean and max, as the legacy "
        f"helper reports them). χ² token of the data, the same under every "
        f"preset: {number(chi2)}."
    )
    grouped = groups(result.presets, normalised)
    shared = [f"{g[0].name} also stands for {', '.join(p.name for p in g[1:])}" for g in grouped if len(g) > 1]
    if shared:
        caption += " +N: N more presets with the same numbers share the row: " + "; ".join(shared) + "."
    if any(not corrects(p.config) for p in result.presets):
        caption += " Presets that correct nothing (no IS, no rejection) come last."
    table = FitTable("Rollout-correction presets on this data (whole run)", columns, caption=caption)
    for group in grouped:
        preset = group[0]
        metrics = preset.run.metrics
        is_max_value = _is_metric(metrics, catalogue.IS_MAX)
        is_mean_value = _is_metric(metrics, catalogue.IS_MEAN)
        legacy = bool(preset.config.get("legacy_is"))  # the §8 helper reports its weights before truncation
        raw_max = (preset.config.get("rollout_is") == "sequence" or legacy) and is_max_value is not None
        raw_mean = legacy and is_mean_value is not None
        name = f"{INTRUSIVE_MARK} {preset.name}" if preset.intrusive else f"  {preset.name}"
        cells: list[str | Num] = [
            name + (f" +{len(group) - 1}" if len(group) > 1 else ""),
            percent(metrics.get(catalogue.REJECTED_TOKEN_FRACTION.key)),
            percent(metrics.get(catalogue.REJECTED_ROW_FRACTION.key)),
            Num(is_mean_value, digits=5, suffix=RAW_MARK if raw_mean else ""),
            Num(is_max_value, suffix=RAW_MARK if raw_max else ""),
            Num(_is_metric(metrics, catalogue.IS_EFF_SAMPLE_SIZE)),
        ]
        if normalised:
            cells.append(Num(metrics.get(catalogue.IS_BATCH_NORM_FACTOR.key)))
        cells.append(Num(_count(metrics.get(catalogue.TOKENS_KEPT.key))))
        modes = list(dict.fromkeys(member.mode for member in group))
        cells += [" / ".join(modes), is_setting(preset.config), rs_setting(preset.config)]
        table.add_row(*cells, style=INTRUSIVE_STYLE if preset.intrusive else None)
    return table


def k1_bounds_lines(result: ComparisonResult) -> list[RenderableType]:
    """One line per distinct asymmetric k1 setting (verl applies ρ ∈ [1/U, 1/L]; what [L, U] would reject)."""
    lines: dict[str, str] = {}
    for preset in result.presets:
        line = k1_bounds_line(preset.name, preset.config, preset.run.metrics)
        if line is not None:
            lines.setdefault(line.partition(": ")[2], line)
    return [plain(f"• {line}", style="dim") for line in lines.values()]


def raw_applied_table(result: ComparisonResult) -> FitTable | None:
    """The IS presets' weights before truncation (``summary/is_raw_*``) beside verl's ``rollout_is_*`` on the weights
    it applies, one row per distinct IS setting (level, threshold); None when no preset sets IS weights."""
    rows: dict[str, PresetResult] = {}
    for preset in result.presets:
        if preset.run.metrics.get(catalogue.IS_RAW_MEAN.key) is not None:
            rows.setdefault(is_setting(preset.config), preset)
    if not rows:
        return None
    columns = [Column("IS", "left", key=True)]
    for label, _, _ in catalogue.IS_RAW_APPLIED:
        columns += [Column(f"{label} raw"), Column(f"{label} applied")]
    caption = (
        "raw = w_raw = exp(clamp20(δ)) (token) or exp(clamp20(s_i)) (sequence) before truncation or IcePop, over "
        "model tokens (summary/is_raw_*); applied = verl's rollout_is_* on the weights it applies (its "
        "sequence-level max and min are of the raw weights too)."
    )
    table = FitTable("IS weights before and after truncation (whole run)", columns, caption=caption)
    for setting, preset in rows.items():
        metrics = preset.run.metrics
        cells: list[str | Num] = [setting]
        for label, raw_key, applied_key in catalogue.IS_RAW_APPLIED:
            digits = 5 if label == "mean" else 4
            cells += [Num(metrics.get(raw_key), digits=digits), Num(metrics.get(applied_key), digits=digits)]
        table.add_row(*cells)
    return table


def groups(presets: Sequence[PresetResult], normalised: bool = True) -> list[list[PresetResult]]:
    """Presets with identical effect on this data (every value of the table the same, and the same intrusive
    mark), in the comparison's order of their first member; groups of presets that correct nothing last."""
    by_effect: dict[tuple, list[PresetResult]] = {}
    for preset in presets:
        by_effect.setdefault(_effect(preset, normalised), []).append(preset)
    ordered = list(by_effect.values())
    return [g for g in ordered if corrects(g[0].config)] + [g for g in ordered if not corrects(g[0].config)]


def _effect(preset: PresetResult, normalised: bool) -> tuple:
    metrics = preset.run.metrics
    values = [
        percent(metrics.get(catalogue.REJECTED_TOKEN_FRACTION.key)),
        percent(metrics.get(catalogue.REJECTED_ROW_FRACTION.key)),
        number(_is_metric(metrics, catalogue.IS_MEAN), 5),
        number(_is_metric(metrics, catalogue.IS_MAX)),
        preset.config.get("rollout_is") == "sequence",
        number(_is_metric(metrics, catalogue.IS_EFF_SAMPLE_SIZE)),
        number(metrics.get(catalogue.IS_BATCH_NORM_FACTOR.key)) if normalised else None,
        number(_count(metrics.get(catalogue.TOKENS_KEPT.key))),
    ]
    return (*values, preset.intrusive, corrects(preset.config))


def corrects(config: Mapping[str, Any]) -> bool:
    """Whether a preset corrects anything: importance sampling (verl's or legacy) or a rejection option."""
    return bool(config.get("rollout_is") or config.get("legacy_is") or config.get("rollout_rs"))


def _is_metric(metrics: Mapping[str, float], metric: catalogue.Metric) -> float | None:
    """An IS metric of verl's helper, or of the legacy helper (§8) for legacy presets."""
    value = metrics.get(metric.key)
    return metrics.get(catalogue.legacy_twin(metric).key) if value is None else value


def _count(value: float | None) -> int | None:
    return None if value is None else int(value)


def is_setting(config: Mapping[str, Any]) -> str:
    """IS level and threshold as the table shows it: ``token 2.0``, ``token 0.5_5.0 +bn``, legacy bounds."""
    if config.get("rollout_is"):
        text = f"{config['rollout_is']} {config['rollout_is_threshold']}"
        return text + (" +bn" if config.get("rollout_is_batch_normalize") else "")
    if config.get("legacy_is"):
        lower, upper = config["legacy_is_threshold"]
        text = f"{config['legacy_is']} {config['legacy_is_mode']} [{lower:g}, {upper:g}]"
        mask_lower, mask_upper = config["legacy_is_mask_threshold"]
        if config["legacy_is_mode"] != "truncate" and (mask_lower, mask_upper) != (lower, upper):
            text += f" mask [{mask_lower:g}, {mask_upper:g}]"
        veto_lower, veto_upper = config["legacy_is_veto_threshold"]
        if veto_lower is not None or veto_upper is not None:
            low = "0" if veto_lower is None else f"{veto_lower:g}"
            high = "∞" if veto_upper is None else f"{veto_upper:g}"
            text += f" veto [{low}, {high}]"
        return text
    return "–"


def rs_setting(config: Mapping[str, Any]) -> str:
    """RS options and thresholds: ``seq_mean_k3 0.01``, or ``a,b 0.01,0.5_2.0`` for a chain."""
    if not config.get("rollout_rs"):
        return "–"
    return f"{config['rollout_rs']} {config['rollout_rs_threshold']}"
