"""``--by COLUMN``: the key metric families per group of rows (an environment, a reward sign, a length bucket), in the
same pass as the whole analysis.

One pass, state per group: each chunk is seen a second time through a *view* whose step groups are (group, step)
pairs instead of steps. The view shares the chunk's tensors, token quantities, segment sums and row sums (none of
which depend on how rows are grouped), so only the per-group reductions are added. Every family keys its state by
whatever the chunk's step groups are; splitting that state by group afterwards gives, for each group, exactly the
per-step states that analysing the group's rows alone accumulates (up to float64 summation order: rtol 1e-12).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING

import numpy as np

from rollout_diag import catalogue
from rollout_diag.decisions.verdict import group_verdict
from rollout_diag.engine import arrays
from rollout_diag.engine.arrays import Array
from rollout_diag.engine.stats import stats
from rollout_diag.errors import ConfigError, option_name
from rollout_diag.io.chunk import Chunk, StepGroups, extra_value
from rollout_diag.metrics.base import StepAccumulator
from rollout_diag.metrics.families import FAMILIES

if TYPE_CHECKING:
    from rollout_diag.io.reader import DumpReader
from rollout_diag.metrics.rounds import DEFAULT_MAX_ROUNDS
from rollout_diag.results import ExtraValue, GroupResult, StepResult

# Per-row values derived from the tokens, usable as --by columns like a dump column.
DERIVED = {
    "response_length": "model tokens (mask 1) in the row",
    "num_rounds": "rounds (runs of model tokens) in the row",
}
BUCKETINGS = ("sign", "bins")
SIGN_LABELS = ("negative", "zero", "positive")
MAX_GROUPS = 10_000  # state per group: a bound keeps memory bounded (a sample id is no grouping column)


@dataclass(frozen=True)
class GroupSpec:
    """One ``--by``: a column (a dump column or one of DERIVED), optionally bucketed: ``sign`` (negative / zero /
    positive) or ``bins`` at the given edges (``[-inf, e1)``, ``[e1, e2)``, …, ``[ek, inf)``)."""

    column: str
    bucket: str | None = None
    edges: tuple[float, ...] = ()

    @property
    def label(self) -> str:
        """The spec as written on the command line, the ``column`` of each group in results."""
        if self.bucket is None:
            return self.column
        if self.bucket == "sign":
            return f"{self.column}:sign"
        return f"{self.column}:bins={','.join(_edge(e) for e in self.edges)}"

    def bucket_labels(self) -> list[str]:
        if self.bucket == "sign":
            return list(SIGN_LABELS)
        edges = [_edge(e) for e in self.edges]
        return [f"< {edges[0]}"] + [f"[{a}, {b})" for a, b in pairwise(edges)] + [f">= {edges[-1]}"]


def _edge(value: float) -> str:
    return f"{value:g}"


def parse_by(text: str) -> GroupSpec:
    """``COLUMN``, ``COLUMN:sign`` or ``COLUMN:bins=E1,E2,…`` (increasing edges); raises ConfigError."""
    column, sep, how = text.partition(":")
    column = column.strip()
    if not column:
        raise ConfigError(f"{option_name('by')} {text!r}: name a column, e.g. env_name or reward:sign.")
    if not sep:
        return GroupSpec(column)
    how = how.strip()
    if how == "sign":
        return GroupSpec(column, "sign")
    name, eq, values = how.partition("=")
    if name.strip() == "bins" and eq:
        try:
            edges = tuple(float(v) for v in values.split(","))
        except ValueError:
            edges = ()
        if edges and all(math.isfinite(e) for e in edges) and all(a < b for a, b in pairwise(edges)):
            return GroupSpec(column, "bins", edges)
        raise ConfigError(f"{option_name('by')} {text}: bins= takes increasing finite edges, e.g. bins=0,100,1000.")
    raise ConfigError(
        f"{option_name('by')} {text}: unknown bucketing {how!r} (use {column}:sign or {column}:bins=E1,E2)."
    )


def check_columns(specs: Sequence[GroupSpec], available: Sequence[str]) -> None:
    """Raises ConfigError naming a ``--by`` column that is neither a per-row dump column nor a derived one."""
    for spec in specs:
        if spec.column not in available and spec.column not in DERIVED:
            known = ", ".join([*available, *DERIVED]) or "none"
            raise ConfigError(f"{option_name('by')} {spec.label}: no per-row column '{spec.column}' (have: {known}).")


def group_specs(by: Sequence[str | GroupSpec], reader: DumpReader) -> tuple[GroupSpec, ...]:
    """``--by`` values parsed and checked against the per-row columns ``reader`` (a DumpReader) carries."""
    specs = tuple(spec if isinstance(spec, GroupSpec) else parse_by(spec) for spec in by)
    if specs:
        check_columns(specs, reader.row_columns())
    return specs


def _row_values(spec: GroupSpec, chunk: Chunk) -> list[ExtraValue]:
    """The raw value of the spec's column in every row of ``chunk`` (None for null)."""
    if spec.column == "response_length":
        return [int(v) for v in stats(chunk).row_tokens.tolist()]
    if spec.column == "num_rounds":
        return [int(v) for v in stats(chunk).rounds_per_row.tolist()]
    values = chunk.extra.get(spec.column)
    if values is None:  # a file without the column: its rows form the null group
        return [None] * chunk.rows
    array = getattr(values, "array", None)  # text or nullable columns stay Arrow arrays (io/reader.py)
    raw = array.to_pylist() if array is not None else np.asarray(values).tolist()  # numeric columns: numpy arrays
    return [extra_value(v) for v in raw]


def _bucket(spec: GroupSpec, value: ExtraValue, file: str) -> tuple[tuple, ExtraValue]:
    """(sort key, group value) of one row's value under ``spec``."""
    if value is None:
        return (1,), None
    if spec.bucket is None:
        return (0, value), value
    if isinstance(value, (bool, str)):
        raise ConfigError(
            f"{file}: column '{spec.column}': {spec.label} buckets numbers, the column holds {type(value).__name__}."
        )
    if spec.bucket == "sign":
        index = 0 if value < 0 else (1 if value == 0 else 2)
    else:
        index = int(np.searchsorted(np.asarray(spec.edges), float(value), side="right"))
    return (0, index), spec.bucket_labels()[index]


def _view(chunk: Chunk, keys: tuple, row_group: Array) -> Chunk:
    """``chunk`` with (group, step) pairs as its step groups; tensors and row-level statistics shared."""
    view = chunk.regrouped(StepGroups(steps=keys, row_group=row_group))
    view.cache = {"stats": stats(chunk).regrouped(view)}
    return view


@dataclass
class GroupedAnalysis:
    """The key families (``FAMILIES`` reported per group: §1 off-policy, §5 debug, rollout-KL, per round) per
    (group, step), for one GroupSpec."""

    spec: GroupSpec
    max_rounds: int = DEFAULT_MAX_ROUNDS
    catastrophic: float = 1.0
    families: tuple[StepAccumulator, ...] = field(init=False)  # FAMILIES' per-group ones, in their order
    values: dict[tuple, ExtraValue] = field(default_factory=dict)  # sort key -> group value
    # (sort key, step) -> the integer the families key its state by while reading (first seen, first numbered)
    ids: dict[tuple, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.families = tuple(
            family.make(self.max_rounds, self.catastrophic) for family in FAMILIES if family.per_group
        )

    def update(self, chunk: Chunk) -> None:
        ids: dict[tuple, int] = {}
        row_group = np.empty(chunk.rows, dtype=np.int64)
        memo: dict[ExtraValue, tuple[tuple, ExtraValue]] = {}
        for row, (value, step) in enumerate(zip(_row_values(self.spec, chunk), chunk.step.tolist(), strict=True)):
            found = memo.get(value)
            if found is None:
                found = memo[value] = _bucket(self.spec, value, chunk.file[row])  # a chunk may span files
            sort_key, group_value = found
            self.values.setdefault(sort_key, group_value)
            key = (sort_key, step)
            row_group[row] = ids.setdefault(key, len(ids))
        if len(self.values) > MAX_GROUPS:
            raise ConfigError(
                f"{option_name('by')} {self.spec.label}: more than {MAX_GROUPS} groups; bucket the column "
                f"({self.spec.column}:sign or {self.spec.column}:bins=…) or pick a coarser one."
            )
        numbered = np.array([self.ids.setdefault(key, len(self.ids)) for key in ids], dtype=np.int64)
        order = np.argsort(numbered)  # step groups in ascending order, as a chunk's own steps are
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        view = _view(chunk, tuple(numbered[order].tolist()), arrays.like(rank[row_group], chunk.step))
        for family in self.families:
            family.update(view)

    def merge(self, other: GroupedAnalysis) -> None:
        # the other part numbered its (group, step) pairs in its own order: renamed to this part's numbers first
        rename = np.empty(len(other.ids), dtype=np.int64)
        for key, number in other.ids.items():
            rename[number] = self.ids.setdefault(key, len(self.ids))
        for mine, theirs in zip(self.families, other.families, strict=True):
            renamed = copy.copy(theirs)
            renamed.store = theirs.store.relabeled(rename)
            mine.merge(renamed)
        for key, value in other.values.items():
            self.values.setdefault(key, value)

    def restricted(self, keep: Callable[[int], bool]) -> GroupedAnalysis:
        """A shallow copy whose families hold only the (group, step) pairs whose step ``keep`` accepts."""
        numbers = np.array([number for key, number in self.ids.items() if keep(key[1])], dtype=np.int64)
        part = copy.copy(self)
        part.families = tuple(family.restricted(np.isin(family.store.steps, numbers)) for family in self.families)
        return part

    def split(self, family: StepAccumulator) -> dict[tuple, StepAccumulator]:
        """One accumulator per group, keyed by step as analysing the group's rows alone keys it."""
        by_group: dict[tuple, list[tuple[int, int]]] = {}
        for (sort_key, step), number in self.ids.items():
            by_group.setdefault(sort_key, []).append((number, step))
        out: dict[tuple, StepAccumulator] = {}
        held = family.store.steps
        for sort_key, pairs in by_group.items():
            numbers = np.array([number for number, _ in pairs], dtype=np.int64)
            keep = np.isin(held, numbers)
            if not keep.any():
                continue
            step_of = np.zeros(len(self.ids), dtype=np.int64)
            step_of[numbers] = [step for _, step in pairs]
            single = family.restricted(keep)
            single.store = single.store.relabeled(step_of)
            out[sort_key] = single
        return out

    def results(self, total_rows: int, total_tokens: int) -> list[GroupResult]:
        """One GroupResult per group, the worst (by verdict, then k3_kl) first."""
        split = [self.split(family) for family in self.families]
        offpolicy = split[0]
        results = []
        for sort_key in offpolicy:
            parts = [by_group[sort_key] for by_group in split if sort_key in by_group]
            run_state = offpolicy[sort_key].run_state()
            assert run_state is not None, "a group is made by its first row"
            rows, tokens = int(run_state["rows"]), int(run_state["tokens"])
            metrics: dict[str, float] = {}
            for part in parts:
                metrics.update(part.finalize_run())
            per_step: dict[int, dict[str, float]] = {}
            for part in parts:
                for step, values in part.finalize_steps().items():
                    per_step.setdefault(step, {}).update(values)
            steps = []
            for step, state in sorted(offpolicy[sort_key].steps.items()):
                steps.append(
                    StepResult(
                        step, int(state["rows"]), int(state["tokens"]), per_step.get(step, {}), int(state["empty_rows"])
                    )
                )
            best = metrics.get(catalogue.ROUNDS_PREFIX + "most_divergent_round")
            results.append(
                GroupResult(
                    column=self.spec.label,
                    value=self.values[sort_key],
                    rows=rows,
                    tokens=tokens,
                    row_share=rows / total_rows if total_rows else 0.0,
                    token_share=tokens / total_tokens if total_tokens else 0.0,
                    metrics=metrics,
                    steps=steps,
                    verdict=group_verdict(metrics, rows=rows, tokens=tokens),
                    most_divergent_round=None if best is None else int(best),
                )
            )
        return sort_groups(results)


LEVEL_RANK = {"bad": 0, "watch": 1, "ok": 2, "n/a": 3}


def sort_groups(groups: Sequence[GroupResult]) -> list[GroupResult]:
    """Worst first: by verdict level, then by k3_kl (largest first), then by value."""

    def key(group: GroupResult) -> tuple:
        k3 = group.metrics.get(catalogue.K3_KL.key, math.nan)
        return (
            group.column,
            LEVEL_RANK.get(group.verdict.get("level", "n/a"), 3),
            -(k3 if math.isfinite(k3) else -math.inf),
            str(group.value),
        )

    return sorted(groups, key=key)


def group_name(column: str, value: ExtraValue) -> str:
    """How check and diff name a group: ``env_name=math``, ``reward:sign=negative``, ``env_name=(null)``."""
    return f"{column}=" + ("(null)" if value is None else str(value))


class GroupLabels:
    """Each row's group under every spec, in reading order (the order RowStatsCollector keeps rows in), so that
    ``check --by`` and ``diff --by`` can restrict the per-row sums to one group's rows."""

    def __init__(self, specs: Sequence[GroupSpec]) -> None:
        self.specs = tuple(specs)
        self.ids: list[dict[ExtraValue, int]] = [{} for _ in self.specs]  # group value -> id, per spec
        self.parts: list[list[np.ndarray]] = [[] for _ in self.specs]

    def update(self, chunk: Chunk) -> None:
        for index, spec in enumerate(self.specs):
            ids, memo = self.ids[index], dict[ExtraValue, int]()
            row_ids = np.empty(chunk.rows, dtype=np.int64)
            for row, value in enumerate(_row_values(spec, chunk)):
                found = memo.get(value)
                if found is None:
                    found = memo[value] = ids.setdefault(_bucket(spec, value, chunk.file[row])[1], len(ids))
                row_ids[row] = found
            self.parts[index].append(row_ids)

    def mask(self, column: str, value: ExtraValue) -> np.ndarray:
        """bool [rows]: the rows in group ``value`` of the spec labelled ``column``."""
        index = next(i for i, spec in enumerate(self.specs) if spec.label == column)
        parts = self.parts[index]
        if len(parts) != 1:  # joined once
            parts[:] = [np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)]
        ids = parts[0]
        wanted = self.ids[index].get(value)
        return ids == wanted if wanted is not None else np.zeros(ids.shape, dtype=bool)
