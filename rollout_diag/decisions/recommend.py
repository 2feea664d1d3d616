""" "Which correction should I turn on?": a recommendation from a preset comparison, with its rule and reasons.

The rule (docs/recommendation.md gives the reasons): among presets that correct something (IS weights or
rejection) and that on this data reweight or drop at least one token, keep those that compare-presets does not call
intrusive (``decisions.intrusive.intrusive_reasons``: at
most 10 % of model tokens dropped, IS effective sample size ≥ 0.5) and whose IS weights stay in verl's healthy band
(mean IS weight within [0.5, 2]); recommend the least intrusive of them. Intrusiveness orders presets by the
share of model tokens dropped, then of sequences dropped, then by how far the IS weights are from uniform
(1 − ESS; a preset without IS weights has no ESS and ranks after every preset whose ESS was measured: "no weights" is
not "uniform weights"). Pure functions over a ComparisonResult (its ``--format json`` dict works too).

No correction is recommended (``withheld_reason``) when the data shows a pipeline bug, when trainer and rollout agree
exactly, when the data is too small to choose (the verdict's little-data rule: ``LITTLE_DATA_TOKENS`` model tokens or
fewer, or ``LITTLE_DATA_ROWS`` row), or when the verdict is ok: then no correction is needed.

Differences below a noise bound are ties (``TIE_*``): among presets that tie with the least intrusive one, verl's
current presets go before the legacy family, then the less intrusive. Every family is judged like for like: the
legacy helper (§8) reports its mean IS weight before truncation, so a legacy preset's band test uses the interval
its used weights lie in (its truncation or mask bounds), and its raw mean is marked ``raw``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rollout_diag import catalogue
from rollout_diag.decisions.intrusive import INTRUSIVE_MIN_ESS, INTRUSIVE_REJECTED_FRACTION, intrusive_reasons
from rollout_diag.decisions.levels import judge
from rollout_diag.decisions.verdict import FIX_FIRST, LITTLE_DATA_ROWS, LITTLE_DATA_TOKENS
from rollout_diag.results import AnalysisResult, ComparisonResult, Hint, OverallVerdict, Recommendation, SkippedData

IS_MEAN_BAND = (0.5, 2.0)  # verl's warning band for rollout_is_mean (docs/algo/rollout_corr.md)
# Noise bounds: two presets whose numbers differ by less than these are tied (docs/recommendation.md).
TIE_ESS = 0.01  # ESS: a 1 % difference in effective batch size is below what any run can tell apart
TIE_TOKENS_DROPPED = 0.001  # 0.1 percentage point of model tokens
TIE_ROWS_DROPPED = 0.01  # 1 percentage point of sequences (a batch of a few hundred rows moves by single rows)
RULE = (
    "the least intrusive preset that corrects (IS weights or rejection), drops at most {rejected:.0%} of model "
    "tokens, keeps the IS effective sample size at or above {ess:g} and the mean IS weight within [0.5, 2]; "
    "intrusiveness = share of tokens dropped, then of sequences dropped, then 1 − ESS (no IS weights: after every "
    "measured ESS); a preset that neither reweights nor drops a token on this data is no candidate"
)
IDLE = "neither reweights nor drops a single token on this data"


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
    legacy: bool = False  # the §8 legacy family: its is_mean is the raw mean, before truncation
    used_weights: tuple[float, float] | None = None  # legacy: the interval the weights the trainer uses lie in
    acts: bool = True  # on this data it reweights (some IS weight ≠ 1) or drops at least one token

    @property
    def key(self) -> tuple[float, float, float]:
        """Intrusiveness: tokens dropped, sequences dropped, 1 − ESS (no ESS: after every measured one)."""
        return (self.tokens_dropped, self.rows_dropped, math.inf if self.ess is None else 1.0 - self.ess)


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
        legacy = bool(config.get("legacy_is"))
        used = _used_weights(config) if legacy else None
        if is_mean is not None and not _in_band(is_mean, used):
            raw = " raw (before truncation)" if legacy else ""
            problems.append(f"mean IS weight {is_mean:.3g}{raw} outside [0.5, 2]")
        tokens_dropped = _metric(metrics, catalogue.REJECTED_TOKEN_FRACTION) or 0.0
        rows_dropped = _metric(metrics, catalogue.REJECTED_ROW_FRACTION) or 0.0
        acts = tokens_dropped > 0 or rows_dropped > 0 or (importance and _reweights(metrics))
        if (importance or rejection) and not acts:
            problems.append(IDLE)
        out.append(
            PresetStanding(
                name=str(_attr(preset, "name")),
                mode=str(_attr(preset, "mode", "")),
                corrects=importance or rejection,
                tokens_dropped=tokens_dropped,
                rows_dropped=rows_dropped,
                ess=ess,
                is_mean=is_mean,
                setting=_setting(config),
                problems=tuple(problems),
                legacy=legacy,
                used_weights=used,
                acts=acts,
            )
        )
    return out


def _reweights(metrics: Mapping[str, Any]) -> bool:
    """Whether some IS weight differs from 1: its min or max is not exactly 1 (unknown without them: assume it
    does, so that only a preset known to change nothing loses its candidacy)."""
    low = _weight_metric(metrics, catalogue.IS_MIN)
    high = _weight_metric(metrics, catalogue.IS_MAX)
    return low is None or high is None or low != 1.0 or high != 1.0


def _used_weights(config: Mapping[str, Any]) -> tuple[float, float]:
    """The interval a legacy preset's used weights lie in: its truncation bounds, narrowed by its mask bounds in
    mask modes (the weights the trainer multiplies by; the helper's own metrics are taken before)."""
    lower, upper = config.get("legacy_is_threshold") or (0.0, math.inf)
    if config.get("legacy_is_mode") in ("mask", "both"):
        mask_lower, mask_upper = config.get("legacy_is_mask_threshold") or (lower, upper)
        if config.get("legacy_is_mode") == "mask":
            return float(mask_lower), float(mask_upper)
        return max(float(lower), float(mask_lower)), min(float(upper), float(mask_upper))
    return float(lower), float(upper)


def _in_band(is_mean: float, used: tuple[float, float] | None) -> bool:
    """verl's band test on the mean of the weights used: on the mean itself, or, for a legacy preset whose metrics
    are raw, on the interval its used weights lie in (fails only when that interval lies outside the band)."""
    low, high = IS_MEAN_BAND
    if used is None:
        return low <= is_mean <= high
    return used[1] >= low and used[0] <= high


def _ties(item: PresetStanding, best: PresetStanding) -> bool:
    """Within the noise bound of ``best`` on every intrusiveness number."""
    if abs(item.tokens_dropped - best.tokens_dropped) >= TIE_TOKENS_DROPPED:
        return False
    if abs(item.rows_dropped - best.rows_dropped) >= TIE_ROWS_DROPPED:
        return False
    if item.ess is None or best.ess is None:  # no IS weights ties only with no IS weights, never with an ESS of 1
        return item.ess is None and best.ess is None
    return abs(item.ess - best.ess) < TIE_ESS


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
    """Preset names, least intrusive first, the presets that correct nothing (no IS, no rejection) last, as the
    terminal table lists them (ties keep the comparison's order)."""
    ranked = standings(comparison)
    return [item.name for item in sorted(ranked, key=lambda item: (not item.corrects, *item.key))]


def recommend(comparison: Any, presets: Sequence[Any] | None = None) -> Recommendation:
    """The recommendation for this comparison, among ``presets`` (some of its presets) when given (see the module
    docstring for the rule)."""
    rejected, min_ess = _limits(comparison, INTRUSIVE_REJECTED_FRACTION, INTRUSIVE_MIN_ESS)
    rule = RULE.format(rejected=rejected, ess=min_ess)
    ranked = sorted(standings(comparison, presets), key=lambda item: item.key)
    order = [item.name for item in sorted(ranked, key=lambda item: not item.corrects)]  # as --sort intrusiveness
    correcting = [item for item in ranked if item.corrects]
    passing = [item for item in correcting if not item.problems]
    note = _note(_attr(comparison, "presets") or [] if presets is None else presets)
    if not passing:
        closest = next((item for item in correcting if item.acts), correcting[0] if correcting else None)
        reasons = [_none_passes(correcting)] if correcting else []
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
    tied = [item for item in passing if _ties(item, passing[0])]
    chosen = min(tied, key=lambda item: (item.legacy, item.key))  # verl's current presets first, then less intrusive
    ties: list[str] = []  # one name per setting: a preset in another mode with the same numbers is not repeated
    for item in tied:
        if item is not chosen and not _same(item, chosen) and not any(_same(item, t) for t in tied if t.name in ties):
            ties.append(item.name)
    equivalent = [item.name for item in passing if item is not chosen and _same(item, chosen)]
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
        ties=ties,
        tie_reason=_tie_reason(chosen, [item for item in tied if item.name in ties]),
    )


def _none_passes(correcting: Sequence[PresetStanding]) -> str:
    """Why no correcting preset meets the rule."""
    if all(not item.acts for item in correcting):
        return f"every correcting preset {IDLE}"
    return "every correcting preset drops too many tokens, leaves too low an ESS or changes nothing on this data"


def _tie_reason(chosen: PresetStanding, tied: Sequence[PresetStanding]) -> str:
    if not tied:
        return ""
    names = ", ".join(item.name for item in tied)
    bound = (
        f"tied with {names} within the noise bound (ESS within {TIE_ESS:g}, dropped tokens within "
        f"{TIE_TOKENS_DROPPED:.1%}, sequences within {TIE_ROWS_DROPPED:.0%})"
    )
    if any(item.legacy for item in tied) and not chosen.legacy:
        return f"{bound}: verl's current presets go before the legacy family"
    return f"{bound}: the less intrusive"


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
        reasons.append(f"mean IS weight {item.is_mean:.4g}{' raw (before truncation)' if item.legacy else ''}")
    return reasons


def _why_not(item: PresetStanding, chosen: PresetStanding) -> str:
    """Why ``item`` lost to ``chosen``: its rule problems, else the first intrusiveness number that is worse."""
    if item.problems:
        return "; ".join(item.problems)
    if _ties(item, chosen):
        if item.legacy and not chosen.legacy:
            return "tied within the noise bound; verl's current presets go before the legacy family"
        return "tied within the noise bound; the chosen one is less intrusive"
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


def withheld_reason(
    verdict: OverallVerdict | None,
    hints: Sequence[Hint] = (),
    skipped: SkippedData | None = None,
    *,
    rows: int | None = None,
    tokens: int | None = None,
) -> str | None:
    """Why no preset is recommended on this data (None: recommend one), in this order: a pipeline bug (a correction
    would hide it); trainer and rollout identical, or the verdict ok (no correction needed); too little data to
    choose (``rows`` rows and ``tokens`` model tokens, when given: the verdict's little-data rule). Rows skipped as
    invalid (``skipped``) are said with their count and reasons."""
    if verdict is None:
        return None
    if verdict.cause == "pipeline":
        first = next((hint for hint in hints if hint.id in verdict.findings), None)
        what = verdict.findings[0] if first is None else first.id
        fix = FIX_FIRST.get(what, "fix the pipeline")
        lost = f": {skipped.line()}" if what == "invalid_rows" and skipped is not None and skipped.rows else ""
        return (
            f"withheld: the data shows a pipeline bug ({', '.join(verdict.findings)}){lost}. First, {fix}; then "
            "compare the presets again (a correction would hide the bug)."
        )
    if verdict.cause == "identical":
        return (
            "no correction needed: trainer and rollout logprobs are identical on every model token, so every preset "
            "leaves the batch as it is."
        )
    if rows is not None and tokens is not None and (tokens <= LITTLE_DATA_TOKENS or rows <= LITTLE_DATA_ROWS):
        return (
            f"withheld: too little data to choose a correction ({tokens} model tokens in {rows} "
            f"row{'s' if rows != 1 else ''}; the choice needs more than {LITTLE_DATA_TOKENS} model tokens and more "
            f"than {LITTLE_DATA_ROWS} row: one token moves a level, and one row's sequence weight is its own mean, "
            "an ESS of 1 by construction). Compare the presets on a larger dump."
        )
    if verdict.level == "ok":
        return (
            "no correction needed: every key mismatch metric is ok (the verdict above), so run with metrics only "
            "(preset disabled) and watch the per-step trend; the table shows what each preset would do."
        )
    return None


def judge_comparison(comparison: ComparisonResult, analysis: AnalysisResult) -> ComparisonResult:
    """``comparison`` with the judgement of its data (``analysis``: the overall verdict, the key metrics' and the
    steps' levels) and the recommendation, or why it is withheld."""
    withheld = withheld_reason(
        analysis.verdict, analysis.hints, analysis.skipped_data, rows=analysis.run.rows, tokens=analysis.run.tokens
    )
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
