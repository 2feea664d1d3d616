"""Result objects as polars DataFrames (``AnalysisResult.to_polars()``, ``ComparisonResult.to_polars()``): one
table per thing a user slices, one column per verl-named metric, float64 metrics (NaN where a value is undefined,
null where a step lacks the metric)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rollout_diag.errors import ConfigError
from rollout_diag.formatting import group_label

if TYPE_CHECKING:
    import pandas as pd
    import polars as pl

    from rollout_diag.results import AnalysisResult, ComparisonResult, GroupResult, StepResult


def _polars() -> Any:
    try:
        import polars
    except ImportError:  # a dependency, but an environment may lack it
        raise ConfigError("dataframes need polars.", hint="pip install 'polars>=1.0'.") from None
    return polars


def _frame(rows: Sequence[Mapping[str, Any]], leading: Mapping[str, Any] | None = None) -> pl.DataFrame:
    """Rows of dicts as a DataFrame: columns in first-seen order; metric columns (floats) as Float64."""
    pl = _polars()
    names: dict[str, None] = dict.fromkeys(leading or {})
    for row in rows:
        names.update(dict.fromkeys(row))
    schema = dict(leading or {})
    for name in names:
        if name in schema:
            continue
        values = [row.get(name) for row in rows]
        present = [v for v in values if v is not None]
        if present and all(isinstance(v, float) or (isinstance(v, int) and not isinstance(v, bool)) for v in present):
            schema[name] = pl.Float64 if any(isinstance(v, float) for v in present) else pl.Int64
        elif present and all(isinstance(v, bool) for v in present):
            schema[name] = pl.Boolean
        else:
            schema[name] = pl.String if all(isinstance(v, str) for v in present) else pl.Object
    columns = {}
    for name, dtype in schema.items():
        values = [row.get(name) for row in rows]
        if dtype == pl.Object:  # mixed scalars (an extra column holding numbers and text): shown as text
            values, dtype = [None if v is None else str(v) for v in values], pl.String
        columns[name] = pl.Series(name, values, dtype=dtype, strict=False)
    return pl.DataFrame(columns) if columns else pl.DataFrame()


def step_rows(steps: Iterable[StepResult], **leading: Any) -> list[dict[str, Any]]:
    """One dict per step: ``leading`` columns, step, rows, tokens, empty_rows, then every metric."""
    return [
        {**leading, "step": s.step, "rows": s.rows, "tokens": s.tokens, "empty_rows": s.empty_rows, **s.metrics}
        for s in steps
    ]


def steps_frame(steps: Sequence[StepResult]) -> pl.DataFrame:
    """The per-step table: one row per step, one column per verl-named metric (what ``--format parquet`` writes)."""
    pl = _polars()
    return _frame(step_rows(steps), {"step": pl.Int64, "rows": pl.Int64, "tokens": pl.Int64, "empty_rows": pl.Int64})


def group_rows(groups: Sequence[GroupResult]) -> list[dict[str, Any]]:
    """One dict per group (the run of its rows): column, value (as shown), counts, shares, verdict, metrics."""
    return [
        {
            "column": g.column,
            "value": group_label(g.value),
            "rows": g.rows,
            "tokens": g.tokens,
            "row_share": g.row_share,
            "token_share": g.token_share,
            "verdict": g.verdict.get("level", "n/a"),
            "most_divergent_round": g.most_divergent_round,
            **g.metrics,
        }
        for g in groups
    ]


GROUP_KEYS = {"column": "String", "value": "String", "step": "Int64", "rows": "Int64", "tokens": "Int64"}


def group_steps_frame(groups: Sequence[GroupResult]) -> pl.DataFrame:
    """One row per group and step: column, value, step, rows, tokens, empty_rows, every metric; then one row per
    group with a null step: the group's run (what ``--format parquet`` writes beside the steps with ``--by``)."""
    pl = _polars()
    rows = []
    for g in groups:
        rows += step_rows(g.steps, column=g.column, value=group_label(g.value))
    for g in groups:
        rows.append(
            {"column": g.column, "value": group_label(g.value), "step": None, "rows": g.rows, "tokens": g.tokens}
            | {"empty_rows": sum(s.empty_rows for s in g.steps), **g.metrics}
        )
    return _frame(rows, {name: getattr(pl, dtype) for name, dtype in GROUP_KEYS.items()})


def analysis_frames(result: AnalysisResult) -> dict[str, pl.DataFrame]:
    """steps, run, rounds, positions, worst_rows (their extra columns as columns), worst_tokens, verdicts, groups
    (one row per group), group_steps (per group and step) and drift (per metric, factor and bucket); a table with no
    rows has no columns."""
    pl = _polars()
    worst_rows = []
    for row in result.worst_rows:
        fields = {k: v for k, v in dataclasses.asdict(row).items() if k != "extra"}
        fields.update({(k if k not in fields else f"extra.{k}"): v for k, v in row.extra.items()})
        worst_rows.append(fields)
    worst_tokens = [
        {**dataclasses.asdict(t), "trainer_prob": t.trainer_prob, "rollout_prob": t.rollout_prob}
        for t in result.worst_tokens
    ]
    return {
        "steps": steps_frame(result.steps),
        "run": _frame(step_rows([result.run])).drop("step"),
        "rounds": _frame([dict(r) for r in result.rounds]),
        "positions": _frame([dict(r) for r in result.positions]),
        "worst_rows": _frame(worst_rows),
        "worst_tokens": _frame(worst_tokens),
        "verdicts": _frame([dataclasses.asdict(v) for v in result.verdicts], {"value": pl.Float64}),
        "groups": _frame(group_rows(result.groups)),
        "group_steps": group_steps_frame(result.groups) if result.groups else pl.DataFrame(),
        "drift": _frame(drift_rows(result.drift)),
    }


def drift_rows(drift: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The result's ``drift`` flat: one row per metric, factor and bucket (docs/drift.md), its windows, the metric's
    change and the factor's parts beside the bucket's."""
    rows = []
    for entry in drift:
        for factor in entry["factors"]:
            for bucket in factor["buckets"]:
                rows.append(
                    {
                        "metric": entry["metric"],
                        "from_first": entry["from_steps"][0],
                        "from_last": entry["from_steps"][1],
                        "to_first": entry["to_steps"][0],
                        "to_last": entry["to_steps"][1],
                        "change": entry["change"],
                        "factor": factor["factor"],
                        "factor_mix": factor["mix"],
                        "factor_within": factor["within"],
                        **bucket,
                    }
                )
    return rows


def comparison_frames(result: ComparisonResult) -> dict[str, pl.DataFrame]:
    """presets (one row per preset: its run metrics), preset_steps (per preset and step), sweep (per option and
    target share), groups and group_steps (with ``--by``)."""
    pl = _polars()
    presets = [
        {"preset": p.name, "mode": p.mode, "intrusive": p.intrusive, **step_rows([p.run])[0]} for p in result.presets
    ]
    for row in presets:
        row.pop("step")
    sweep = [
        {
            "option": o.option,
            "level": o.level,
            "count": o.count,
            "target": t.target,
            "threshold": t.threshold,
            "share": t.share,
            "verl_default": o.verl_default,
            "default_share": o.default_share,
        }
        for o in result.sweep
        for t in o.thresholds
    ]
    preset_steps = [row for p in result.presets for row in step_rows(p.steps, preset=p.name)]
    return {
        "presets": _frame(presets),
        "preset_steps": _frame(preset_steps, {"preset": pl.String, "step": pl.Int64}),
        "sweep": _frame(sweep),
        "groups": _frame(group_rows(result.groups)),
        "group_steps": group_steps_frame(result.groups) if result.groups else pl.DataFrame(),
    }


def to_pandas(frames: Mapping[str, pl.DataFrame]) -> dict[str, pd.DataFrame]:
    """The same tables as pandas DataFrames; raises ConfigError saying what to install without pandas."""
    try:
        import pandas  # noqa: F401
    except ImportError:
        raise ConfigError("to_pandas() needs pandas.", hint="pip install pandas (or use to_polars()).") from None
    return {name: frame.to_pandas() for name, frame in frames.items()}
