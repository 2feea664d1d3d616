"""compare-presets in the terminal: the answer first (the data's verdict, the recommendation and its reason), then
the table, one row per preset with its run values, intrusive presets highlighted."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import RenderableType

from rollout_diag import catalogue
from rollout_diag.render.format import number, percent
from rollout_diag.render.summary import recommendation_line, verdict_lines
from rollout_diag.render.table import Column, FitTable
from rollout_diag.results import ComparisonResult

INTRUSIVE_STYLE = "bold red"
INTRUSIVE_MARK = "!"  # in the text itself, so logs and pipes (no colour) show it too
RAW_MARK = " raw"  # verl reports sequence-level rollout_is_max before truncation: the raw max ρ
COLUMNS = (
    Column("preset", "left", key=True),
    Column("mode", "left", wrap=True, fold_width=10),
    Column("IS", "left", wrap=True),
    Column("RS", "left", wrap=True),
    Column("tok rejected"),
    Column("seq rejected"),
    Column("IS mean"),
    Column("IS max"),
    Column("ESS"),
    Column("bn factor"),
    Column("tokens kept"),
)


def answer_block(result: ComparisonResult) -> list[RenderableType]:
    """The first lines: the data's verdict (as ``analyze`` opens), its pipeline findings, then the recommendation
    and its reason, or why it is withheld."""
    return [*verdict_lines(result.verdict), recommendation_line(result.recommendation, result.recommendation_withheld)]


def presets_table(result: ComparisonResult) -> FitTable:
    """One row per preset with its run values; intrusive presets marked ``!`` and in bold red (see the caption)."""
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
    table = FitTable("Rollout-correction presets on this data (whole run)", columns, caption=caption)
    for preset in result.presets:
        metrics = preset.run.metrics
        is_max = number(_is_metric(metrics, catalogue.IS_MAX))
        is_mean = number(_is_metric(metrics, catalogue.IS_MEAN), 5)
        legacy = bool(preset.config.get("legacy_is"))  # the §8 helper reports its weights before truncation
        if (preset.config.get("rollout_is") == "sequence" or legacy) and is_max != "–":
            is_max += RAW_MARK
        if legacy and is_mean != "–":
            is_mean += RAW_MARK
        cells = [
            f"{INTRUSIVE_MARK} {preset.name}" if preset.intrusive else f"  {preset.name}",
            preset.mode,
            is_setting(preset.config),
            rs_setting(preset.config),
            percent(metrics.get(catalogue.REJECTED_TOKEN_FRACTION.key)),
            percent(metrics.get(catalogue.REJECTED_ROW_FRACTION.key)),
            is_mean,
            is_max,
            number(_is_metric(metrics, catalogue.IS_EFF_SAMPLE_SIZE)),
        ]
        if normalised:
            cells.append(number(metrics.get(catalogue.IS_BATCH_NORM_FACTOR.key)))
        cells.append(number(_count(metrics.get(catalogue.TOKENS_KEPT.key))))
        table.add_row(*cells, style=INTRUSIVE_STYLE if preset.intrusive else None)
    return table


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
