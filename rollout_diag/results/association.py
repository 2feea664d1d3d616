"""Mismatch against the trainer's own columns (``AnalysisResult.trainer_columns``; computed by
``rollout_diag/metrics/association.py``, judged by ``rollout_diag/decisions/association.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from rollout_diag.results.shapes import JsonItem, each, item_json, json_as, json_float, json_number, optional

# A statistic: a float written by ``json_number``, read back as a float (null or absent: NaN).
_STATISTIC = json_as(write=json_number, read=json_float, absent=None)
# A judgement (decisions/association.py): False until judged, and where a document lacks it.
_JUDGED = json_as(read=bool)


@dataclass(frozen=True)
class ColumnAssociation(JsonItem):
    """Spearman's ρ of row |log-ppl diff| with one trainer column over the sampled rows that have a value, its 95 %
    interval (Fisher z), and what the report draws: the points (up to 2 000 rows) or a binned 2-D histogram."""

    role: str  # reward, advantage, entropy or response_length
    column: str  # the dump column read ("response_length (model tokens)": counted from the mask)
    rows: int = field(metadata=json_as(read=int))
    spearman: float = field(metadata=_STATISTIC)
    ci_low: float = field(metadata=_STATISTIC)
    ci_high: float = field(metadata=_STATISTIC)
    points: dict[str, list[float]] | None = None  # {"x": column values, "y": row |log-ppl diff|}
    histogram: dict[str, list] | None = None  # {"x_edges", "y_edges" (log-spaced), "counts" [y bin][x bin]}
    significant: bool = field(default=False, metadata=_JUDGED)


@dataclass(frozen=True)
class GroupWorstRows(JsonItem):
    """Per GRPO group (``column``: uid, group_id or prompt_id, within a step): whether the group's worst row (largest
    |log-ppl diff|) is its highest-``ranked_by`` sample, over the ``groups`` groups of 2 rows or more whose values
    differ; ``expected``: the count by chance; ``p_value``: the chance of ``worst_is_best`` or more."""

    column: str
    ranked_by: str
    groups_seen: int = field(metadata=json_as(read=int))
    groups: int = field(metadata=json_as(read=int))
    worst_is_best: int = field(metadata=json_as(read=int))
    expected: float = field(metadata=_STATISTIC)
    p_value: float = field(metadata=_STATISTIC)
    overflow: bool = field(default=False, metadata=_JUDGED)  # too many groups to track: no count
    significant: bool = field(default=False, metadata=_JUDGED)


@dataclass(frozen=True)
class TrainerColumns(JsonItem):
    """Row mismatch against the dump's reward, advantage, entropy, response length and GRPO groups: ``rows`` rows
    with a model token and a trainer column, ``sampled_rows`` of them (at most ``sample_limit``, chosen by a hash of
    file and row with ``seed``) behind the correlations; the group rule counts every row. Made from
    ``TrainerColumnsTracker.finalize``'s numbers with ``from_json``, as from the JSON ``to_json`` wrote."""

    rows: int = field(metadata=json_as(read=int))
    sampled_rows: int = field(metadata=json_as(read=int))
    sample_limit: int = field(metadata=json_as(read=int))
    seed: int = field(metadata=json_as(read=int))
    correlations: list[ColumnAssociation] = field(
        default_factory=list,
        metadata=json_as(write=each(item_json), read=lambda raw: each(ColumnAssociation.from_json)(raw or [])),
    )
    groups: GroupWorstRows | None = field(default=None, metadata=json_as(write=optional(item_json)))

    def judged(self, correlations: list[bool], groups: bool) -> TrainerColumns:
        """A copy with each correlation's and the group rule's ``significant`` set (decisions/association.py)."""
        return replace(
            self,
            correlations=[
                replace(item, significant=flag) for item, flag in zip(self.correlations, correlations, strict=True)
            ],
            groups=None if self.groups is None else replace(self.groups, significant=groups),
        )
