"""Mismatch against the trainer's own columns (``AnalysisResult.trainer_columns``; computed by
``rollout_diag/metrics/association.py``, judged by ``rollout_diag/decisions/association.py``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from rollout_diag.results.rows import json_number


def _number(value: Any) -> float:
    return math.nan if value is None else float(value)


@dataclass(frozen=True)
class ColumnAssociation:
    """Spearman's ρ of row |log-ppl diff| with one trainer column over the sampled rows that have a value, its 95 %
    interval (Fisher z), and what the report draws: the points (up to 2 000 rows) or a binned 2-D histogram."""

    role: str  # reward, advantage, entropy or response_length
    column: str  # the dump column read ("response_length (model tokens)": counted from the mask)
    rows: int
    spearman: float
    ci_low: float
    ci_high: float
    points: dict[str, list[float]] | None = None  # {"x": column values, "y": row |log-ppl diff|}
    histogram: dict[str, list] | None = None  # {"x_edges", "y_edges" (log-spaced), "counts" [y bin][x bin]}
    significant: bool = False  # decisions/association.py

    def to_json(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "column": self.column,
            "rows": self.rows,
            "spearman": json_number(self.spearman),
            "ci_low": json_number(self.ci_low),
            "ci_high": json_number(self.ci_high),
            "points": self.points,
            "histogram": self.histogram,
            "significant": self.significant,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ColumnAssociation:
        return cls(
            role=raw["role"],
            column=raw["column"],
            rows=int(raw["rows"]),
            spearman=_number(raw.get("spearman")),
            ci_low=_number(raw.get("ci_low")),
            ci_high=_number(raw.get("ci_high")),
            points=raw.get("points"),
            histogram=raw.get("histogram"),
            significant=bool(raw.get("significant", False)),
        )


@dataclass(frozen=True)
class GroupWorstRows:
    """Per GRPO group (``column``: uid, group_id or prompt_id, within a step): whether the group's worst row (largest
    |log-ppl diff|) is its highest-``ranked_by`` sample, over the ``groups`` groups of 2 rows or more whose values
    differ; ``expected``: the count by chance; ``p_value``: the chance of ``worst_is_best`` or more."""

    column: str
    ranked_by: str
    groups_seen: int
    groups: int
    worst_is_best: int
    expected: float
    p_value: float
    overflow: bool = False  # too many groups to track: no count
    significant: bool = False  # decisions/association.py

    def to_json(self) -> dict[str, Any]:
        return {
            "column": self.column,
            "ranked_by": self.ranked_by,
            "groups_seen": self.groups_seen,
            "groups": self.groups,
            "worst_is_best": self.worst_is_best,
            "expected": json_number(self.expected),
            "p_value": json_number(self.p_value),
            "overflow": self.overflow,
            "significant": self.significant,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> GroupWorstRows:
        return cls(
            column=raw["column"],
            ranked_by=raw["ranked_by"],
            groups_seen=int(raw["groups_seen"]),
            groups=int(raw["groups"]),
            worst_is_best=int(raw["worst_is_best"]),
            expected=_number(raw.get("expected")),
            p_value=_number(raw.get("p_value")),
            overflow=bool(raw.get("overflow", False)),
            significant=bool(raw.get("significant", False)),
        )


@dataclass(frozen=True)
class TrainerColumns:
    """Row mismatch against the dump's reward, advantage, entropy, response length and GRPO groups: ``rows`` rows
    with a model token and a trainer column, ``sampled_rows`` of them (at most ``sample_limit``, chosen by a hash of
    file and row with ``seed``) behind the correlations; the group rule counts every row."""

    rows: int
    sampled_rows: int
    sample_limit: int
    seed: int
    correlations: list[ColumnAssociation] = field(default_factory=list)
    groups: GroupWorstRows | None = None

    @classmethod
    def of(cls, numbers: dict[str, Any]) -> TrainerColumns:
        """From ``TrainerColumnsTracker.finalize``'s numbers (or the JSON ``to_json`` wrote)."""
        return cls(
            rows=int(numbers["rows"]),
            sampled_rows=int(numbers["sampled_rows"]),
            sample_limit=int(numbers["sample_limit"]),
            seed=int(numbers["seed"]),
            correlations=[ColumnAssociation.from_json(item) for item in numbers.get("correlations") or []],
            groups=None if numbers.get("groups") is None else GroupWorstRows.from_json(numbers["groups"]),
        )

    from_json = of

    def to_json(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "sampled_rows": self.sampled_rows,
            "sample_limit": self.sample_limit,
            "seed": self.seed,
            "correlations": [item.to_json() for item in self.correlations],
            "groups": None if self.groups is None else self.groups.to_json(),
        }

    def judged(self, correlations: list[bool], groups: bool) -> TrainerColumns:
        """A copy with each correlation's and the group rule's ``significant`` set (decisions/association.py)."""
        return replace(
            self,
            correlations=[
                replace(item, significant=flag) for item, flag in zip(self.correlations, correlations, strict=True)
            ],
            groups=None if self.groups is None else replace(self.groups, significant=groups),
        )
