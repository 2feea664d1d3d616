""" "Which correction should I turn on?": a recommendation from a preset comparison, with its rule and reasons.

The rule (docs/recommendation.md gives the reasons): among presets that correct something (IS weights or
rejection), keep those that compare-presets does not call intrusive (``decisions.intrusive.intrusive_reasons``: at
most 10 % of model tokens dropped, IS effective sample size ≥ 0.5) and whose IS weights stay in verl's healthy band
(mean IS weight within [0.5, 2]); recommend the least intrusive of them. Intrusiveness orders presets by the
share of model tokens dropped, then of sequences dropped, then by how far the IS weights are from uniform
(1 − ESS). Pure functions over a ComparisonResult (its ``--format json`` dict works too).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rollout_diag import catalogue
from rollout_diag.decisions.intrusive import INTRUSIVE_MIN_ESS, INTRUSIVE_REJECTED_FRACTION, intrusive_reasons
from rollout_diag.decisions.verdict import FIX_FIRST
from rollout_diag.results import AnalysisResult, ComparisonResult, Hint, OverallVerdict, Recommendation
from rollout_diag.verdicts import judge

IS_MEAN_BAND = (0.5, 2.0)  # verl's warning band for rollout_is_mean (docs/algo/rollout_corr.md)
RULE = (
    "the least intrusive preset that corrects (IS weights or rejection), drops at most {rejected:.0%} of model "
    "tokens, keeps the IS effective sample size at or above {ess:g} and the mean IS weight within [0.5, 2]; "
    "intrusiveness = share of tokens dropped, then of sequences dropped, then 1 − ESS"
)


@dataclass(frozen=True)
class PresetStanding:
    """A preset's intrusiveness numbers over the run (None where the preset has no IS weights)."""

    name: str
    mode: str
    corrects: bool
    tokens_dropped: float
    rows_dropped: float
    ess: float | None
    is_mean: float | None
    setting: tuple[str, str]  # (IS setting, RS setting): presets with equal settings differ only in mode
    problems: tuple[str, ...]  # why it fails the rule (empty: it passes)

    @property
    def key(self) -> tuple[float, float, float]:
        return (self.tokens_dropped, self.rows_dropped, 0.0 if self.ess is None else 1.0 - self.ess)


def _attr(item: Any, name: str, default: Any = None) -> Any:
    return item.get(name, default) if isinstance(item, Mapping) else getattr(item, name, default)


def _metric(metrics: Mapping[str, Any], *rows: catalogue.Metric) -> float | None:
    """The first of ``rows`` the preset reports (not None, not NaN)."""
    for key in (row.key for row in rows):
        value = metrics.get(key)
        if value is not None and not (isinstance(value, float) and math.isnan(value)):
            return float(value)
    return None


def _weight_metric(metrics: Mapping[str, Any], metric: catalogue.Metric) -> float | None:
    """An IS metric of verl's helper or, for legacy presets, of the legacy helper (§8)."""
    return _metric(metrics, metric, catalogue.legacy_twin(metric))


def standings(comparison: Any, presets: Sequence[Any] | None = None) -> list[PresetStanding]:
    """Every preset of the comparison (or only ``presets``, some of its presets) with its intrusiveness numbers and
    rule problems, in the comparison's order."""
    limits = _limits(comparison, INTRUSIVE_REJECTED_FRACTION, INTRUSIVE_MIN_ESS)
    out = []
    for preset in _attr(comparison, "presets") or [] if presets is None else presets:
        config = _attr(preset, "config") or {}
        metrics = _attr(_attr(preset, "run") or {}, "metrics") or {}
        importance = bool(config.get("rollout_is") or config.get("legacy_is"))
        rejection = bool(config.get("rollout_rs"))
        ess = _weight_metric(metrics, catalogue.IS_EFF_SAMPLE_SIZE) if importance else None
        is_mean = _weight_metric(metrics, catalogue.IS_MEAN) if importance else None
        problems = list(intrusive_reasons(metrics, *limits))
        if is_mean is not None and not IS_MEAN_BAND[0] <= is_mean <= IS_MEAN_BAND[1]:
            problems.append(f"mean IS weight {is_mean:.3g} outside [0.5, 2]")
        out.append(
            PresetStanding(
                name=str(_attr(preset, "name")),
                mode=str(_attr(preset, "mode", "")),
                corrects=importance or rejection,
                tokens_dropped=_metric(metrics, catalogue.REJECTED_TOKEN_FRACTION) or 0.0,
                rows_dropped=_metric(metrics, catalogue.REJECTED_ROW_FRACTION) or 0.0,
                ess=ess,
                is_mean=is_mean,
                setting=_setting(config),
                problems=tuple(problems),
            )
        )
    return out


def _setting(config: Mapping[str, Any]) -> tuple[str, str]:
    importance = ""
    if config.get("rollout_is"):
        importance = (
            f"{config['rollout_is']} {config.get('rollout_is_threshold')} {config.get('rollout_is_batch_normalize')}"
        )
    elif config.get("legacy_is"):
        importance = repr(sorted((k, str(v)) for k, v in config.items() if k.startswith("legacy_")))
    rejection = f"{config.get('rollout_rs')} {config.get('rollout_rs_threshold')}" if config.get("rollout_rs") else ""
    return importance, rejection


def _limits(comparison: Any, rejected: float, ess: float) -> tuple[float, float]:
    nested = _attr(comparison, "intrusive") or {}
    return (
        float(_attr(comparison, "intrusive_rejected_fraction") or _attr(nested, "rejected_fraction") or rejected),
        float(_attr(comparison, "intrusive_min_ess") or _attr(nested, "min_ess") or ess),
    )


def by_intrusiveness(comparison: Any) -> list[str]:
    """Preset names, least intrusive first (ties keep the comparison's order)."""
    ranked = standings(comparison)
    return [item.name for item in sorted(ranked, key=lambda item: item.key)]


def recommend(comparison: Any, presets: Sequence[Any] | None = None) -> Recommendation:
    """The recommendation for this comparison, among ``presets`` (some of its presets) when given (see the module
    docstring for the rule)."""
    rejected, min_ess = _limits(comparison, INTRUSIVE_REJECTED_FRACTION, INTRUSIVE_MIN_ESS)
    rule = RULE.format(rejected=rejected, ess=min_ess)
    ranked = sorted(standings(comparison, presets), key=lambda item: item.key)
    order = [item.name for item in ranked]
    correcting = [item for item in ranked if item.corrects]
    passing = [item for item in correcting if not item.problems]
    note = _note(_attr(comparison, "presets") or [] if presets is None else presets)
    if not passing:
        closest = correcting[0] if correcting else None
        reasons = ["every correcting preset drops too many tokens or leaves too low an ESS"] if correcting else []
        return Recommendation(
            None,
            rule,
            reasons or ["no preset in the comparison corrects anything (IS or rejection)"],
            runner_up=None if closest is None else closest.name,
            runner_up_reason="" if closest is None else f"least intrusive, but {'; '.join(closest.problems)}",
            not_chosen=[(item.name, "; ".join(item.problems)) for item in correcting[1:]],
            note=note,
            order=order,
        )
    chosen = passing[0]
    equivalent = [item.name for item in passing[1:] if _same(item, chosen)]
    others = [item for item in correcting if item is not chosen and item.name not in equivalent]
    runner = next((item for item in others if not item.problems), None)
    return Recommendation(
        chosen.name,
        rule,
        _strengths(chosen),
        runner_up=None if runner is None else runner.name,
        runner_up_reason="" if runner is None else _why_not(runner, chosen),
        not_chosen=_not_chosen([item for item in others if item is not runner], chosen, runner),
        equivalent=equivalent,
        note=note,
        order=order,
    )


def _not_chosen(
    items: Sequence[PresetStanding], chosen: PresetStanding, runner: PresetStanding | None
) -> list[tuple[str, str]]:
    """Why each preset lost; a preset with the settings and numbers of one named before it (the runner-up
    included) says so instead."""
    out: list[tuple[str, str]] = []
    seen: list[PresetStanding] = [] if runner is None else [runner]
    for item in items:
        twin = next((earlier for earlier in seen if _same(item, earlier)), None)
        out.append((item.name, f"as {twin.name}, in {item.mode} mode" if twin else _why_not(item, chosen)))
        seen.append(item)
    return out


def _same(item: PresetStanding, chosen: PresetStanding) -> bool:
    return item.setting == chosen.setting and item.key == chosen.key


def _strengths(item: PresetStanding) -> list[str]:
    reasons = [f"drops {item.tokens_dropped:.2%} of model tokens ({item.rows_dropped:.2%} of sequences)"]
    if item.ess is not None:
        reasons.append(f"IS effective sample size {item.ess:.4g}")
    if item.is_mean is not None:
        reasons.append(f"mean IS weight {item.is_mean:.4g}")
    return reasons


def _why_not(item: PresetStanding, chosen: PresetStanding) -> str:
    """Why ``item`` lost to ``chosen``: its rule problems, else the first intrusiveness number that is worse."""
    if item.problems:
        return "; ".join(item.problems)
    if item.tokens_dropped > chosen.tokens_dropped:
        return f"drops {item.tokens_dropped:.2%} of model tokens (chosen: {chosen.tokens_dropped:.2%})"
    if item.rows_dropped > chosen.rows_dropped:
        return f"drops {item.rows_dropped:.2%} of sequences (chosen: {chosen.rows_dropped:.2%})"
    if item.ess is not None and (chosen.ess is None or item.ess < chosen.ess):
        theirs = "no IS weights" if chosen.ess is None else f"{chosen.ess:.4g}"
        return f"IS effective sample size {item.ess:.4g} (chosen: {theirs})"
    return "as intrusive as the chosen preset; listed later in the comparison"


def _note(presets: Sequence[Any]) -> str:
    """A sentence when the data hardly needs a correction (every key metric of the run judged ok)."""
    if not presets:
        return ""
    metrics = _attr(_attr(presets[0], "run") or {}, "metrics") or {}
    verdicts = [verdict for verdict in judge(dict(metrics)) if verdict.level != "n/a"]
    if verdicts and all(verdict.level == "ok" for verdict in verdicts):
        return (
            "Every key mismatch metric of this run is ok: running with metrics only (preset disabled) is "
            "defensible; the recommendation is what to turn on if you want a correction."
        )
    return ""


def withheld_reason(verdict: OverallVerdict | None, hints: Sequence[Hint] = ()) -> str | None:
    """Why no preset is recommended on this data (None: recommend one): a pipeline bug, which a correction would
    hide."""
    if verdict is None or verdict.cause != "pipeline":
        return None
    first = next((hint for hint in hints if hint.id in verdict.findings), None)
    what = verdict.findings[0] if first is None else first.id
    fix = FIX_FIRST.get(what, "fix the pipeline")
    return (
        f"withheld: the data shows a pipeline bug ({', '.join(verdict.findings)}); {fix} first, then compare the "
        "presets again: a correction would hide the bug."
    )


def judge_comparison(comparison: ComparisonResult, analysis: AnalysisResult) -> ComparisonResult:
    """``comparison`` with the judgement of its data (``analysis``: the overall verdict, the key metrics' and the
    steps' levels) and the recommendation, or why it is withheld."""
    withheld = withheld_reason(analysis.verdict, analysis.hints)
    return replace(
        comparison,
        verdict=analysis.verdict,
        verdicts=list(analysis.verdicts),
        step_levels=list(analysis.step_levels),
        recommendation=None if withheld else recommend(comparison),
        recommendation_withheld=withheld,
    )


def sort_by_intrusiveness(comparison: Any) -> Any:
    """The comparison with its presets least intrusive first (a ComparisonResult or its JSON dict)."""
    rank = {name: index for index, name in enumerate(by_intrusiveness(comparison))}
    presets = sorted(_attr(comparison, "presets") or [], key=lambda preset: rank[str(_attr(preset, "name"))])
    if isinstance(comparison, Mapping):
        return {**comparison, "presets": presets}
    return replace(comparison, presets=presets)
