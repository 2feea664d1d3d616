"""``runs``: many runs, each with its knobs; per run its key metrics with intervals, verdict and onset step; per
knob what it did to each key metric; ``--max-ratio`` gates against the baseline run.

Pure functions over each run's run-level analysis and per-row sums (:class:`RunInput`). The intervals are
``diff``'s bootstrap: rows resampled with replacement within each step, run i drawing from child i of
``np.random.SeedSequence(seed)`` (so two runs give exactly ``diff``'s numbers). A knob's effect on a metric is:

- **pair**: where two runs differ in that knob alone and the design has no run to spare (one run per level change
  away from the baseline, the usual ablation), metric(to) / metric(from) and the interval of that ratio;
- **fit**: otherwise a least-squares fit of log(metric) = b0 + Σ_knob b_level over all runs (each knob's level
  against the baseline run's; multiplicative effects, no interactions), exp(b_level) with its interval from the
  same fit on every bootstrap replicate.

An effect is *detectable* when its interval excludes 1. The onset step of a run is the first step from which its
onset metric (k3_kl) differs from the baseline run's at the same step beyond noise (|difference| > z·SE, the SE of
each step's ratio estimator from its rows, z of the interval's level) on ``ONSET_PERSIST`` consecutive shared steps
in one direction.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from rollout_diag import catalogue
from rollout_diag.decisions.check import full_names
from rollout_diag.decisions.diff import (
    DEFAULT_LEVEL,
    DEFAULT_REPLICATES,
    DEFAULT_SEED,
    bootstrap_values,
    percentile_interval,
)
from rollout_diag.decisions.prompts import matched_prompts
from rollout_diag.decisions.rowmetrics import RowMetric, by_step, rejected_share, row_metric
from rollout_diag.decisions.verdict import overall_verdict
from rollout_diag.errors import ConfigError, option_name
from rollout_diag.results import (
    AnalysisResult,
    KnobEffect,
    PromptEvidence,
    RatioGate,
    RowStats,
    RunMetric,
    RunsResult,
    RunSteps,
    RunSummary,
)

ONSET_PERSIST = 3  # consecutive shared steps beyond noise, in one direction, that make an onset
RUN_KNOB = "run"  # the knob every run gets when none is given: each run against the baseline
ROUNDING = 1e-12  # a ratio within this of 1 is float64 summation order


def run_metrics() -> tuple[RowMetric, ...]:
    """The key metrics ``runs`` reports: the catalogue's rows with the role ``runs`` (each with a row formula), in
    its order. A metric joins by that role in its row (e.g. an extreme-token share once it has a row formula)."""
    return tuple(row_metric(row) for row in catalogue.with_role(catalogue.Role.RUNS))


@dataclass(frozen=True)
class RunState:
    """What one run's pass leaves for the comparison (picklable: ``runs --state-dir`` keeps it): the run-level
    analysis (``RowPass.summary``), its per-row sums (with the catastrophic count, ``row_pass(catastrophic_rows=True)``)
    and its per-prompt evidence (``row_pass(prompts=True)``, bounded: ``metrics/prompts.py``; None: not gathered)."""

    summary: AnalysisResult
    rows: RowStats
    prompts: PromptEvidence | None = None


@dataclass(frozen=True, kw_only=True)
class RunInput(RunState):
    """One run as ``runs`` reads it: its state, its name and its knobs (name → value as text)."""

    name: str
    knobs: Mapping[str, str]


def compare_runs(
    runs: Sequence[RunInput],
    *,
    baseline: str | None = None,
    presets: Sequence[str] = (),
    max_ratios: Mapping[str, float] | None = None,
    replicates: int = DEFAULT_REPLICATES,
    level: float = DEFAULT_LEVEL,
    seed: int = DEFAULT_SEED,
) -> RunsResult:
    """Every run's key metrics (and each preset in ``presets``: its dropped-token share) with bootstrap intervals,
    verdict and onset step against ``baseline`` (default: the first run); each knob's effect on each metric; the
    ``max_ratios`` gates (metric, short or full name → largest allowed run / baseline ratio); the prompts matched
    across runs (``decisions.prompts.matched_prompts``).
    Raises ConfigError for fewer than two runs, repeated names, an unknown baseline, a run without a knob another
    gives, knobs that always change together (their effects cannot be told apart), an unknown metric or preset."""
    names = [run.name for run in runs]
    base = check_options(names, baseline, presets, max_ratios, replicates, level)
    knobs = _knobs(runs)
    metrics = [*run_metrics(), *_preset_metrics(runs, presets)]
    keys = [metric.name for metric in metrics]
    values = np.array([[_value(metric, run) for metric in metrics] for run in runs])
    streams = np.random.SeedSequence(seed).spawn(len(runs))
    draws = np.stack(
        [
            bootstrap_values(run.rows, metrics, replicates, np.random.default_rng(stream))
            for run, stream in zip(runs, streams, strict=True)
        ],
        axis=1,
    )  # [replicates, runs, metrics]
    index = names.index(base)
    onset_metric = catalogue.K3_KL.key
    summaries = []
    for position, run in enumerate(runs):
        metrics_of = [
            RunMetric(key, float(values[position, m]), *percentile_interval(draws[:, position, m], level))
            for m, key in enumerate(keys)
        ]
        onset = None if position == index else onset_step(runs[index].rows, run.rows, metrics[0], level)
        summaries.append(_summary(run, knobs[position], metrics_of, onset))
    effects = knob_effects(names, knobs, base, keys, values, draws, level)
    gates = _gates(names, base, keys, values, draws, max_ratios or {}, level)
    steps = [_steps(run, metrics) for run in runs]
    warnings = [
        f"{run.name}: only {run.rows.rows} sequences; the intervals are rough below 30."
        for run in runs
        if run.rows.rows < 30
    ]
    return RunsResult(
        runs=summaries,
        effects=effects,
        steps=steps,
        baseline=base,
        metrics=keys,
        onset_metric=onset_metric,
        answer=answer(effects, onset_metric, level),
        replicates=replicates,
        level=level,
        seed=seed,
        gates=gates,
        warnings=warnings,
        prompts=matched_prompts([(run.name, run.prompts) for run in runs]),
    )


def check_options(
    names: Sequence[str],
    baseline: str | None,
    presets: Sequence[str] = (),
    max_ratios: Mapping[str, float] | None = None,
    replicates: int = DEFAULT_REPLICATES,
    level: float = DEFAULT_LEVEL,
) -> str:
    """The options of :func:`compare_runs` checked before anything is read; returns the baseline's name. Raises
    ConfigError as ``compare_runs`` does."""
    if len(names) < 2:
        raise ConfigError(f"runs compares two or more runs, not {len(names)}.", hint="give NAME=DUMP for each run.")
    if replicates < 100:
        raise ConfigError(f"{option_name('replicates')}={replicates}: use at least 100 bootstrap replicates.")
    if not 0.0 < level < 1.0:
        raise ConfigError(f"{option_name('level')}={level}: the interval's level must lie in (0, 1), e.g. 0.95.")
    repeated = sorted({name for name in names if list(names).count(name) > 1})
    if repeated:
        raise ConfigError(f"run name {repeated[0]!r} given twice; give each run its own name (NAME=DUMP).")
    base = names[0] if baseline is None else baseline
    if base not in names:
        raise ConfigError(f"{option_name('baseline')}={base!r}: no run has that name (runs: {', '.join(names)}).")
    keys = [metric.name for metric in run_metrics()] + [rejected_share(name).name for name in presets]
    for given in max_ratios or {}:
        _gate_metric(given, keys)
    return base


def _gate_metric(given: str, metrics: Sequence[str]) -> str:
    found = [given] if given in metrics else full_names(given, metrics)
    if len(found) != 1:
        raise ConfigError(
            f"{option_name('max_ratio')} {given}: "
            + ("no such key metric" if not found else f"ambiguous ({', '.join(found)})")
            + f"; runs reports {', '.join(catalogue.short_name(m) for m in metrics)}."
        )
    return found[0]


def _knobs(runs: Sequence[RunInput]) -> list[dict[str, str]]:
    """Each run's knobs as text; a knob one run gives, every run must give. No knob at all: ``run`` = its name."""
    given = list(dict.fromkeys(name for run in runs for name in run.knobs))
    if not given:
        return [{RUN_KNOB: run.name} for run in runs]
    for run in runs:
        missing = [name for name in given if name not in run.knobs]
        if missing:
            raise ConfigError(
                f"run {run.name!r} has no value for knob {missing[0]!r} (another run gives one).",
                hint="give every run every knob (--knob NAME=V1,V2,… in the runs' order, or a knobs file).",
            )
    return [{name: str(run.knobs[name]) for name in given} for run in runs]


def _preset_metrics(runs: Sequence[RunInput], presets: Sequence[str]) -> list[RowMetric]:
    for name in presets:
        lacking = [run.name for run in runs if name not in run.rows.rejected]
        if lacking:
            raise ConfigError(f"preset {name!r}: run {lacking[0]!r} was read without it.")
    return [rejected_share(name) for name in presets]


def _value(metric: RowMetric, run: RunInput) -> float:
    """The value ``analyze`` reports for the run, else the metric of its row sums (as ``diff``)."""
    reported = run.summary.run.metrics.get(metric.name)
    return float(reported) if reported is not None else metric.value(run.rows)


def _summary(run: RunInput, knobs: dict[str, str], metrics: list[RunMetric], onset: int | None) -> RunSummary:
    summary = run.summary
    verdict = overall_verdict(
        summary.run.metrics,
        rows=summary.run.rows,
        tokens=summary.run.tokens,
        catastrophic_threshold=summary.catastrophic_threshold,
    )
    return RunSummary(
        name=run.name,
        knobs=knobs,
        inputs=list(summary.inputs),
        rows=summary.run.rows,
        tokens=summary.run.tokens,
        steps=int(np.unique(run.rows.step).shape[0]),
        verdict=verdict.level,
        verdict_sentence=verdict.sentence,
        metrics=metrics,
        onset_step=onset,
    )


def knob_effects(
    names: Sequence[str],
    knobs: Sequence[Mapping[str, str]],
    baseline: str,
    metrics: Sequence[str],
    values: np.ndarray,
    draws: np.ndarray,
    level: float,
) -> list[KnobEffect]:
    """Each varying knob's level (against the baseline run's) on each metric: the pair ratio where the design is
    saturated and two runs differ in that knob alone, else the least-squares fit of log(metric) (module docstring).
    ``values`` [runs, metrics], ``draws`` [replicates, runs, metrics]. Raises ConfigError when knobs are
    confounded (the design matrix has less than full column rank)."""
    reference = knobs[names.index(baseline)]
    varying = [name for name in reference if len({run[name] for run in knobs}) > 1]
    columns = [
        (knob, level_name)
        for knob in varying
        for level_name in dict.fromkeys(run[knob] for run in knobs)
        if level_name != reference[knob]
    ]
    if not columns:
        return []
    design = np.array(
        [[1.0] + [float(run[knob] == level_name) for knob, level_name in columns] for run in knobs], dtype=np.float64
    )
    if np.linalg.matrix_rank(design) < design.shape[1]:
        raise ConfigError(
            f"knobs {_confounded(design, columns)} change together across the runs: their effects cannot be told "
            "apart.",
            hint="add a run that changes one of them alone, or drop one of the knobs.",
        )
    saturated = design.shape[0] == design.shape[1]
    projection = np.linalg.pinv(design)  # [parameters, runs]
    effects = []
    for m, metric in enumerate(metrics):
        logs, log_draws = _logs(values[:, m]), _logs(draws[:, :, m])
        coefficients = projection @ logs
        replicated = log_draws @ projection.T  # [replicates, parameters]
        for column, (knob, level_name) in enumerate(columns, start=1):
            pair = _pair(knobs, names, reference, knob, level_name) if saturated else None
            if pair is not None:
                a, b = pair
                effects.append(
                    _pair_effect(knob, reference[knob], level_name, metric, names, a, b, values, draws, m, level)
                )
                continue
            if not math.isfinite(coefficients[column]):
                effects.append(_unknown(knob, reference[knob], level_name, metric))
                continue
            low, high = percentile_interval(replicated[:, column], level)
            ratio = math.exp(coefficients[column])
            low, high = (math.exp(low), math.exp(high)) if math.isfinite(low) else (math.nan, math.nan)
            effects.append(
                KnobEffect(knob, reference[knob], level_name, metric, ratio, low, high, _detectable(low, high), "fit")
            )
    return effects


def _logs(values: np.ndarray) -> np.ndarray:
    """log of positive values; NaN for zero, negative or non-finite ones (no ratio there)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.log(np.where(values > 0.0, values, np.nan))
    return np.where(np.isfinite(out), out, np.nan)


def _pair(
    knobs: Sequence[Mapping[str, str]], names: Sequence[str], reference: Mapping[str, str], knob: str, level_name: str
) -> tuple[int, int] | None:
    """Two runs, one at the baseline's level of ``knob`` and one at ``level_name``, equal in every other knob
    (the baseline run first where it is one of them)."""
    order = sorted(range(len(names)), key=lambda i: knobs[i] != reference)
    for a in order:
        if knobs[a][knob] != reference[knob]:
            continue
        for b in range(len(names)):
            if knobs[b][knob] == level_name and all(knobs[b][k] == knobs[a][k] for k in knobs[a] if k != knob):
                return a, b
    return None


def _pair_effect(
    knob: str,
    from_: str,
    to: str,
    metric: str,
    names: Sequence[str],
    a: int,
    b: int,
    values: np.ndarray,
    draws: np.ndarray,
    m: int,
    level: float,
) -> KnobEffect:
    value_a, value_b = float(values[a, m]), float(values[b, m])
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = draws[:, b, m] / draws[:, a, m]
    ratio = value_b / value_a if value_a != 0.0 and math.isfinite(value_a) and math.isfinite(value_b) else None
    low, high = percentile_interval(ratios, level) if ratio is not None else (math.nan, math.nan)
    diff_low, diff_high = percentile_interval(draws[:, b, m] - draws[:, a, m], level)
    return KnobEffect(
        knob,
        from_,
        to,
        metric,
        ratio,
        low,
        high,
        ratio is not None and _detectable(low, high),
        "pair",
        (names[a], names[b]),
        value_b - value_a,
        diff_low,
        diff_high,
    )


def _unknown(knob: str, from_: str, to: str, metric: str) -> KnobEffect:
    """No ratio: a run's value is 0 (or not finite) where a log or a division needs a positive one."""
    return KnobEffect(knob, from_, to, metric, None, math.nan, math.nan, False, "fit")


def _detectable(low: float, high: float) -> bool:
    return math.isfinite(low) and math.isfinite(high) and (low > 1.0 + ROUNDING or high < 1.0 - ROUNDING)


def _confounded(design: np.ndarray, columns: Sequence[tuple[str, str]]) -> str:
    """The knob levels the design cannot tell apart, named (the columns of a null vector of the design)."""
    _, _, right = np.linalg.svd(design)
    null = right[-1]
    named = [f"{knob}={value}" for (knob, value), weight in zip(columns, null[1:], strict=True) if abs(weight) > 1e-9]
    return " and ".join(named) if named else ", ".join(f"{k}={v}" for k, v in columns)


def onset_step(base: RowStats, run: RowStats, metric: RowMetric, level: float) -> int | None:
    """The first step from which ``metric`` of ``run`` differs from ``base``'s at the same step beyond noise:
    |m_run − m_base| > z·√(SE_run² + SE_base²) (z of ``level``; each SE the ratio estimator's, from the step's
    rows) on ``ONSET_PERSIST`` consecutive steps both runs hold with two rows or more (all of them when fewer
    remain), in one direction. None when no step departs so."""
    z = NormalDist().inv_cdf(0.5 + level / 2.0)
    steps_a, value_a, se_a = step_errors(base, metric)
    steps_b, value_b, se_b = step_errors(run, metric)
    shared, in_a, in_b = np.intersect1d(steps_a, steps_b, return_indices=True)
    difference = value_b[in_b] - value_a[in_a]
    noise = z * np.sqrt(se_a[in_a] ** 2 + se_b[in_b] ** 2)
    testable = np.isfinite(difference) & np.isfinite(noise)
    shared, difference, noise = shared[testable], difference[testable], noise[testable]
    sign = np.where(difference > noise, 1, np.where(difference < -noise, -1, 0))
    for start in range(shared.shape[0]):
        window = sign[start : start + ONSET_PERSIST]
        if window[0] != 0 and np.all(window == window[0]):
            return int(shared[start])
    return None


def step_errors(rows: RowStats, metric: RowMetric) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per step (ascending): the metric of its rows and the standard error of that ratio estimator,
    √(n/(n−1)·Σ_i (num_i − m·den_i)²) / Σ_i den_i (NaN for a step of one row)."""
    steps, owner, counts = np.unique(rows.step, return_inverse=True, return_counts=True)
    numerator, denominator = metric.numerator(rows), metric.denominator(rows)
    num = np.bincount(owner, numerator, minlength=steps.shape[0])
    den = np.bincount(owner, denominator, minlength=steps.shape[0]) + metric.eps
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = num / den
        residual = numerator - ratio[owner] * denominator
        spread = np.bincount(owner, residual**2, minlength=steps.shape[0]) * counts / (counts - 1.0)
        error = np.sqrt(spread) / den
    error[counts < 2] = np.nan
    return steps, ratio + metric.offset, error


def _gates(
    names: Sequence[str],
    baseline: str,
    metrics: Sequence[str],
    values: np.ndarray,
    draws: np.ndarray,
    limits: Mapping[str, float],
    level: float,
) -> list[RatioGate]:
    """``--max-ratio``: each other run's metric over the baseline's against its limit (a NaN ratio fails)."""
    gates = []
    base = names.index(baseline)
    for given, limit in limits.items():
        m = metrics.index(_gate_metric(given, metrics))
        for position, name in enumerate(names):
            if position == base:
                continue
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = float(values[position, m] / values[base, m]) if values[base, m] != 0.0 else math.inf
                low, high = percentile_interval(draws[:, position, m] / draws[:, base, m], level)
            passed = math.isfinite(ratio) and ratio <= limit
            if values[position, m] == 0.0 and values[base, m] == 0.0:
                ratio, passed = 1.0, True  # both exactly zero: nothing grew
            gates.append(RatioGate(name, metrics[m], float(limit), ratio, low, high, passed))
    return gates


def _steps(run: RunInput, metrics: Sequence[RowMetric]) -> RunSteps:
    steps, counts = np.unique(run.rows.step, return_counts=True)
    values = {}
    for metric in metrics:
        found = by_step(metric, run.rows)
        values[metric.name] = np.array([found[int(step)] for step in steps], dtype=np.float64)
    return RunSteps(run.name, steps.astype(np.int64), counts.astype(np.int64), values)


def answer(effects: Sequence[KnobEffect], metric: str, level: float) -> str:
    """The first line: which knob mattered most for ``metric`` (its largest detectable effect, factor and
    interval), and which knobs had no detectable effect on it."""
    on_metric = [effect for effect in effects if effect.metric == metric]
    short = catalogue.short_name(metric)
    if not on_metric:
        return f"no knob varies across the runs: nothing to attribute ({short} per run below)."
    detectable = [e for e in on_metric if e.detectable and e.ratio is not None]
    knobs = list(dict.fromkeys(e.knob for e in on_metric))
    silent = [knob for knob in knobs if not any(e.knob == knob for e in detectable)]
    if not detectable:
        return f"no knob had a detectable effect on {short} ({level:.0%} bootstrap intervals of each ratio hold 1)."
    top = max(detectable, key=lambda e: abs(math.log(e.ratio)))  # type: ignore[arg-type]
    said = f"{top.knob}={top.to} {_factor(top, short)}"
    if silent:
        said += f"; {', '.join(silent)} had no detectable effect"
    return said + "."


def _factor(effect: KnobEffect, short: str) -> str:
    """ "cut k3_kl 25× (interval 18–34×)" / "raised k3_kl 3.1× (interval 2.6–3.7×)"."""
    assert effect.ratio is not None
    if effect.ratio < 1.0:
        return f"cut {short} {_times(1.0 / effect.ratio)} (interval {_range(1.0 / effect.high, 1.0 / effect.low)})"
    return f"raised {short} {_times(effect.ratio)} (interval {_range(effect.low, effect.high)})"


def _times(value: float) -> str:
    return f"{value:.3g}×"


def _range(low: float, high: float) -> str:
    return f"{low:.3g}–{high:.3g}×"
