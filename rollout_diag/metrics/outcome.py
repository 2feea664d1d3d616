"""What each preset would drop (``summary/…``) and :class:`CorrectionAnalysis`: the correction accumulators
of every chosen preset (METRICS.md §2, §3, §8), deduplicated and fed in one pass.

Presets that share a part share its accumulator: the 19 presets of §4 need 3 IS accumulators, 3 RS
options, 3 option chains and 5 drop rules (14 accumulators for 19 presets).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rollout_diag import catalogue
from rollout_diag.engine.arrays import Array
from rollout_diag.engine.choice import expect_presets
from rollout_diag.engine.formulas import derived
from rollout_diag.engine.state import StateTable
from rollout_diag.engine.stats import ChunkStats, PerToken, stats
from rollout_diag.io.chunk import Chunk
from rollout_diag.memory import trim_heap
from rollout_diag.metrics.base import KeyGroup, State, StepAccumulator
from rollout_diag.metrics.correction import (
    CorrectionAccumulator,
    DropCountAccumulator,
    ImportanceAccumulator,
    K1AsWrittenAccumulator,
    RejectionChainAccumulator,
    RejectionOptionAccumulator,
    icepop_inside,
    prepare_derived,
    rejected_per_row,
    rs_final_keep,
    rs_quantities,
    rs_rejections,
)
from rollout_diag.metrics.legacy import LegacyAccumulator, legacy_keep, legacy_rejections, mask_name, veto_name
from rollout_diag.presets import ImportanceSampling, LegacyCorrection, Preset, RejectionOption
from rollout_diag.results import Column, ColumnSource, ItemSequence, StepResult

SUMMARY = catalogue.SUMMARY_PREFIX


# --------------------------------------------------------------------------- what a preset drops
@dataclass(frozen=True)
class DropRule:
    """Everything that takes a model token out of the gradient under a preset: §3 rejection, a zero IcePop
    weight (§2), the legacy mask/veto (§8). Presets with equal rules share one OutcomeAccumulator."""

    rejection: tuple[RejectionOption, ...] = ()
    icepop: ImportanceSampling | None = None
    legacy: LegacyCorrection | None = None

    @classmethod
    def of(cls, preset: Preset) -> DropRule:
        importance = preset.importance
        icepop = importance if importance is not None and importance.icepop else None
        legacy = preset.legacy if preset.legacy is not None and (preset.legacy.masks or preset.legacy.vetoes) else None
        return cls(preset.rejection, icepop, legacy)

    def kept_tokens(self, s: ChunkStats) -> PerToken:
        """Keep flag of every model token under this rule."""

        def compute() -> PerToken:
            keep = rs_final_keep(s, self.rejection)
            if self.icepop is not None:
                keep = s.both(keep, icepop_inside(s, self.icepop))
            if self.legacy is not None:
                keep = s.both(keep, legacy_keep(s, self.legacy))
            return keep

        return s.memo(("drop_rule", self), compute)


class OutcomeAccumulator(DropCountAccumulator):
    """``summary/…``: model tokens and rows a preset would drop (our keys, not verl's): the table's
    "% tokens rejected", "% sequences rejected" and "tokens kept"."""

    def __init__(self, rule: DropRule) -> None:
        super().__init__()
        self.rule = rule

    def kept_tokens(self, s: ChunkStats) -> PerToken:
        return self.rule.kept_tokens(s)

    def rejected_per_row(self, s: ChunkStats) -> Array | None:
        rule = self.rule
        rows, flags = rs_rejections(s, rule.rejection)
        if rule.icepop is not None and rule.icepop.level == "token":
            flags.append(derived("token_is_weight", "outside", rule.icepop.lower, rule.icepop.upper))
        elif rule.icepop is not None:
            outside = ~icepop_inside(s, rule.icepop).values
            rows = outside if rows is None else rows | outside
        if rule.legacy is not None:
            legacy_rows, legacy_flags = legacy_rejections(s, rule.legacy)
            rows = legacy_rows if rows is None else rows | legacy_rows
            flags += legacy_flags
        return rejected_per_row(s, rows, flags)

    def token_quantities(self) -> tuple[list[str], list[str]]:
        rule = self.rule
        names = rs_quantities(rule.rejection)
        if rule.icepop is not None and rule.icepop.level == "token":
            names.append(derived("token_is_weight", "outside", rule.icepop.lower, rule.icepop.upper))
        if rule.legacy is not None:
            names.append(veto_name(rule.legacy))
            if rule.legacy.masks and rule.legacy.level == "token":
                names.append(mask_name(rule.legacy))
        return names, []

    def _metrics(self, value: dict[str, Any]) -> dict[str, Any]:
        tokens, valid = value["tokens"], value["valid_rows"]
        return {
            SUMMARY + "tokens_rejected": value["rejected_tokens"],
            SUMMARY + "tokens_kept": tokens - value["rejected_tokens"],
            SUMMARY + "rejected_token_fraction": value["rejected_tokens"] / tokens,
            SUMMARY + "rows_rejected": value["rejected_rows"],
            # base.sequence_share over columns: 0.0 where no row has a model token
            SUMMARY + "rejected_row_fraction": np.where(valid > 0, value["rejected_rows"] / valid, 0.0),
        }


# --------------------------------------------------------------------------- all presets
class PresetColumns(StepAccumulator):
    """Every correction accumulator's per-chunk partial state in one table (columns ``"<part>/<name>"``), so a chunk
    costs one table build and one merge instead of one per accumulator. Each column is reduced and merged by its own
    accumulator's reduction, on the same steps, in the same order: ``hand_over`` gives every accumulator the same
    table, digit for digit, as feeding it each chunk itself would."""

    def __init__(self, parts: Sequence[CorrectionAccumulator]) -> None:
        self.parts = list(parts)
        self.REDUCTIONS = {  # type: ignore[misc]  # per instance: the preset shapes the state
            f"{index}/{name}": reduction
            for index, part in enumerate(self.parts)
            for name, reduction in part.REDUCTIONS.items()
        }
        super().__init__()

    def _stats(self, chunk: Chunk) -> dict[str, Any]:
        s = stats(chunk)
        return {
            f"{index}/{name}": value
            for index, part in enumerate(self.parts)
            for name, value in part.shared_stats(s).items()
        }

    def _finalize(self, state: State) -> dict[str, float]:
        return {}  # no metrics of its own: each accumulator finalizes its columns after ``hand_over``

    def hand_over(self) -> None:
        """Give each accumulator the columns fed so far, and start empty again. Each accumulator takes them as the
        chunks' tables would have reached it: the table's pieces (``StepStore.pieces``: each finished layer's parts,
        then the sealed parts, steps no later chunk reached, in order, then the open part), appended in turn
        (``append_table``: a layer's parts are disjoint, so nothing is added, nothing copied; a layer's first part
        starts a layer again; each accumulator joins or folds its pieces when read, one at a time, as it did when fed
        chunk by chunk)."""
        tables = self.step_store.pieces()
        self.store = StateTable.empty(self.REDUCTIONS)
        for index, part in enumerate(self.parts):
            prefix = f"{index}/"

            def own(columns: dict[str, Any], prefix: str = prefix) -> dict[str, Any]:
                return {name[len(prefix) :]: value for name, value in columns.items() if name.startswith(prefix)}

            for table in tables:
                if table.shapes:
                    shapes, dense, sparse, ragged = (
                        own(table.shapes),
                        own(table.dense),
                        own(table.sparse),
                        own(table.ragged),
                    )
                    part.append_table(StateTable(part.REDUCTIONS, shapes, table.steps, dense, sparse, ragged))


class CorrectionAnalysis:
    """The correction accumulators of a list of presets, deduplicated, fed in one pass.

    ``update(chunk)`` feeds every distinct accumulator once (they share the chunk's ``ChunkStats``);
    ``merge`` folds in another CorrectionAnalysis built from the same presets (another chunk range or worker).
    """

    def __init__(self, presets: Sequence[Preset]) -> None:
        self.presets = list(presets)
        self._accumulators: dict[Hashable, CorrectionAccumulator] = {}
        self._finalized: dict[Hashable, tuple[np.ndarray, list[KeyGroup]]] = {}  # step_columns, per accumulator
        self.parts: dict[str, list[Hashable]] = {}
        for preset in self.presets:
            parts: list[Hashable] = []
            if preset.importance is not None:
                parts.append(self._add(("is", preset.importance), ImportanceAccumulator, preset.importance))
            for option in preset.rejection:
                parts.append(self._add(("rs", option), RejectionOptionAccumulator, option))
            if (asymmetric := preset.asymmetric_k1) is not None:
                parts.append(self._add(("k1_as_written", asymmetric), K1AsWrittenAccumulator, asymmetric))
            if preset.rejection:
                parts.append(self._add(("rs_chain", preset.rejection), RejectionChainAccumulator, preset.rejection))
            if preset.legacy is not None:
                parts.append(self._add(("legacy", preset.legacy), LegacyAccumulator, preset.legacy))
            rule = DropRule.of(preset)
            parts.append(self._add(("outcome", rule), OutcomeAccumulator, rule))
            self.parts[preset.name] = parts
        self.token_quantities()  # registers every derived quantity in this process and thread
        expect_presets()  # their compiled pass: compiled ahead where the numba engine runs and its cache lacks it
        self._table = PresetColumns(list(self._accumulators.values()))
        self._read = False  # the accumulators were read: each chunk is handed over as it comes
        self._runs: dict[Hashable, dict[str, float]] | None = None  # ``settle``'s run metrics

    def _add(self, key: Hashable, kind: Callable[[Any], CorrectionAccumulator], config: Any) -> Hashable:
        if key not in self._accumulators:
            self._accumulators[key] = kind(config)
        return key

    @property
    def accumulators(self) -> dict[Hashable, CorrectionAccumulator]:
        """One accumulator per distinct part, each holding every chunk ``update`` has fed (``PresetColumns`` hands
        them their columns when they are read; once read, after every chunk, so that each accumulator merges chunk
        by chunk, in the order it would have been fed them)."""
        self._table.hand_over()
        self._read = True
        return self._accumulators

    def prepare(self, chunk: Chunk, histogram: bool = False) -> None:
        """Every accumulator's derived token quantities in one compiled pass (numba engine; a no-op on torch's), and
        with ``histogram`` the run sweep's histogram of c: what the reader's prepare pool runs (``Pass.prepare``),
        off the thread that calls ``update``."""
        prepare_derived(stats(chunk), *self.token_quantities(), histogram=histogram)

    def token_quantities(self) -> tuple[list[str], list[str]]:
        """(derived token quantities, those with moments) of every accumulator (``__init__`` registers them, so the
        prepare pool's thread only looks them up)."""
        names: list[str] = []
        moments: list[str] = []
        for accumulator in self._accumulators.values():
            own_names, own_moments = accumulator.token_quantities()
            names += own_names
            moments += own_moments
        return names, moments

    def update(self, chunk: Chunk) -> None:
        self._refuse_settled()
        self.prepare(chunk)  # a no-op where the prepare pool did it
        self._table.update(chunk)
        if self._read:
            self._table.hand_over()

    def merge(self, other: CorrectionAnalysis) -> None:
        self._refuse_settled()
        other._refuse_settled()
        for key, accumulator in self.accumulators.items():
            accumulator.merge(other.accumulators[key])

    def settle(self) -> None:
        """Finalize every accumulator into its run metrics and per-step columns (``finalize_run``, ``step_columns``),
        one accumulator at a time, and drop its per-step state: 200 000 steps × 26 accumulators hold ~680 MB of
        state against ~410 MB of columns, and the state is no longer needed. Call after the last ``update`` /
        ``merge``; the results read afterwards are the same, digit for digit (the same finalization, done earlier).
        """
        if self._runs is not None:
            return
        runs: dict[Hashable, dict[str, float]] = {}
        pool = _ArrayPool()
        for key, accumulator in self.accumulators.items():
            runs[key] = accumulator.finalize_run()
            steps, groups = self._columns(key)
            # presets share many columns bit for bit (an option's statistic under other thresholds, the steps, the
            # masks, columns of zeros): one array each (200 000 one-row steps: 194 of 252 columns, ~0.35 GB)
            self._finalized[key] = (
                pool.shared(steps),
                [(pool.shared(present), {k: pool.shared(v) for k, v in values.items()}) for present, values in groups],
            )
            del steps, groups
            accumulator.store = StateTable.empty(accumulator.REDUCTIONS)
            trim_heap()  # the state's small per-chunk arrays: their pages back before the next columns are made
        self._runs = runs

    def _refuse_settled(self) -> None:
        if self._runs is not None:
            raise RuntimeError("CorrectionAnalysis.settle() dropped the per-step states: nothing can be added to them")

    def finalize_run(self) -> dict[str, dict[str, float]]:
        """Per preset name: its run metrics, each accumulator finalized once."""
        runs = self._runs
        if runs is None:
            runs = {key: accumulator.finalize_run() for key, accumulator in self.accumulators.items()}
        out: dict[str, dict[str, float]] = {}
        for preset in self.presets:
            run: dict[str, float] = {}
            for key in self.parts[preset.name]:
                run.update(runs[key])
            out[preset.name] = run
        return out

    def step_columns(self, name: str) -> list[tuple[np.ndarray, list[KeyGroup]]]:
        """Preset ``name``'s per-step metrics as columns, one entry per part (in ``finalize``'s order): (the part's
        steps, sorted int64 [S]; its key groups: bool [S] steps that report the keys, key -> float64 [S]). Each
        accumulator is finalized once, on first use, a block of steps at a time (``finalize_block``): no dict per
        step. Call it after the last ``update`` / ``merge``."""
        return [self._columns(key) for key in self.parts[name]]

    def _columns(self, key: Hashable) -> tuple[np.ndarray, list[KeyGroup]]:
        found = self._finalized.get(key)
        if found is None:
            accumulator = self.accumulators[key]
            blocks: list[list[KeyGroup]] = []
            for steps, columns in accumulator.store.blocks():
                size = len(steps)
                blocks.append(
                    [
                        (reports, {k: np.broadcast_to(np.asarray(v, np.float64), (size,)) for k, v in values.items()})
                        for reports, values in accumulator.finalize_block(columns)
                    ]
                )
            groups = [
                (
                    np.concatenate([block[g][0] for block in blocks]),
                    {k: np.concatenate([block[g][1][k] for block in blocks]) for k in blocks[0][g][1]},
                )
                for g in range(len(blocks[0]) if blocks else 0)
            ]
            found = self._finalized[key] = (accumulator.store.steps, groups)
        return found

    def finalize(self) -> dict[str, tuple[dict[int, dict[str, float]], dict[str, float]]]:
        """Per preset name: ({step: metrics}, run metrics), each accumulator finalized once."""
        self._refuse_settled()
        steps = {key: accumulator.finalize_steps() for key, accumulator in self.accumulators.items()}
        runs = {key: accumulator.finalize_run() for key, accumulator in self.accumulators.items()}
        out = {}
        for preset in self.presets:
            per_step: dict[int, dict[str, float]] = {}
            run: dict[str, float] = {}
            for key in self.parts[preset.name]:
                for step, metrics in steps[key].items():
                    per_step.setdefault(step, {}).update(metrics)
                run.update(runs[key])
            out[preset.name] = (per_step, run)
        return out


class _ArrayPool:
    """Arrays already seen, to hand back one of them for an array equal to it bit for bit (dtype, shape and bytes:
    NaN payloads and signed zeros told apart). Arrays handed out are read, never written."""

    SAMPLE = 64  # elements of an array's fingerprint

    def __init__(self) -> None:
        self._seen: dict[tuple[str, tuple[int, ...], bytes], list[np.ndarray]] = {}

    def shared(self, array: np.ndarray) -> np.ndarray:
        if not isinstance(array, np.ndarray) or array.dtype == object or not array.flags.c_contiguous:
            return array
        flat = array.reshape(-1)
        raw = flat.view(np.uint8)
        key = (array.dtype.str, array.shape, flat[:: max(1, flat.size // self.SAMPLE)].tobytes() + flat[-1:].tobytes())
        kept = self._seen.setdefault(key, [])
        for other in kept:
            if np.array_equal(other.reshape(-1).view(np.uint8), raw):
                return other
        kept.append(array)
        return array


# --------------------------------------------------------------------------- per-step results as columns
class PresetSteps(ItemSequence[StepResult]):
    """``PresetResult.steps`` of one preset: each step's §1 metrics (``rollout_corr/`` keys of the analysis's step)
    followed by the preset's own, built when read from the pass's columns (``CorrectionAnalysis.step_columns``, made on
    first read). Nothing per step is kept: 200 000 steps × 25 presets cost the accumulators' columns, not 5 million
    dicts. Equal to the list of StepResults it stands for."""

    def __init__(self, base: Sequence[StepResult], corrections: CorrectionAnalysis, name: str) -> None:
        self.base, self.corrections, self.name = base, corrections, name
        self._parts: list[tuple[np.ndarray, list[KeyGroup]]] | None = None

    def __len__(self) -> int:
        return len(self.base)

    def item(self, index: int) -> StepResult:
        return self._step(index, self.base[index])

    def __iter__(self) -> Iterator[StepResult]:
        for index, step in enumerate(self.base):
            yield self._step(index, step)

    def _step(self, index: int, offpolicy: StepResult) -> StepResult:
        metrics: dict[str, float] = {}
        for at, groups in self._columns():
            position = int(at[index])
            if position < 0:
                continue
            for reports, values in groups:
                if reports[position]:
                    metrics.update((key, float(column[position])) for key, column in values.items())
        return with_metrics(offpolicy, metrics)

    def step_ids(self) -> list[Any]:
        """Each step's id, as ``[step.step for step in self]``."""
        ids = getattr(self.base, "step_ids", None)
        return ids.tolist() if isinstance(ids, np.ndarray) else [step.step for step in self.base]

    def metric(self, key: str) -> list[Any]:
        """Each step's value of ``key`` (None where it has none), as ``[step.metrics.get(key) for step in self]``,
        read from the columns without building a step: a figure over 200 000 steps reads one column."""
        count = len(self)
        found = np.zeros(count, dtype=bool)
        values = np.full(count, np.nan)
        for at, groups in self._columns():  # in _step's order: a later group's value wins
            for reports, columns in groups:
                if key not in columns:
                    continue
                here = at >= 0
                here[here] = np.asarray(reports, dtype=bool)[at[here]]
                values[here] = np.asarray(columns[key], dtype=np.float64)[at[here]]
                found |= here
        out: list[Any] = [value if hit else None for value, hit in zip(values.tolist(), found.tolist(), strict=True)]
        if key.startswith(catalogue.OFFPOLICY_PREFIX):  # the step's own §1 value where the preset has none
            missing = np.flatnonzero(~found)
            column = getattr(self.base, "float_column", None)  # a StepTable's float column: no step is built
            read = column(key) if column is not None else None
            if read is None:
                for index in missing.tolist():
                    out[index] = self.base[index].metrics.get(key)
            else:
                hits = missing[read[0][missing]]
                for index, value in zip(hits.tolist(), read[1][hits].tolist(), strict=True):
                    out[index] = value
        return out

    def json_columns(self) -> dict[str, Column]:
        """The preset's own metrics (its parts' keys, in the order a step lists them) as the comparison document's
        columns (``results.comparison_columns``): each key read from the parts that report it, in ``_step``'s order (a
        later part's value wins), named by the arrays it is read from, so that presets sharing a part share it."""
        ids = getattr(self.base, "step_ids", None)
        sources: dict[str, list[ColumnSource]] = {}
        names: dict[str, list[tuple[int, ...]]] = {}
        for (at, groups), (steps, _) in zip(self._columns(), self.corrections.step_columns(self.name), strict=True):
            for reports, values in groups:
                for key, column in values.items():
                    sources.setdefault(key, []).append((at, reports, column))
                    names.setdefault(key, [(id(ids),)]).append((id(steps), id(reports), id(column)))
        return {key: Column(len(self), found, tuple(names[key])) for key, found in sources.items()}

    def _columns(self) -> list[tuple[np.ndarray, list[KeyGroup]]]:
        """Per part of the preset: (position in the part's columns of each base step, −1 where absent; key groups)."""
        if self._parts is None:
            ids = getattr(self.base, "step_ids", None)  # a StepTable's own column: no StepResult per step is built
            if not isinstance(ids, np.ndarray):
                ids = np.array([step.step for step in self.base], dtype=np.int64)
            self._parts = []
            for steps, groups in self.corrections.step_columns(self.name):
                at = np.searchsorted(steps, ids)
                found = at < steps.shape[0]
                found[found] = steps[at[found]] == ids[found]
                self._parts.append((np.where(found, at, -1), groups))
        return self._parts

    def __repr__(self) -> str:
        return f"PresetSteps({self.name!r}, {len(self)} steps)"


def with_metrics(offpolicy: StepResult, metrics: Mapping[str, float]) -> StepResult:
    """The step's §1 metrics (``rollout_corr/`` keys only) followed by the preset's own."""
    own = {name: value for name, value in offpolicy.metrics.items() if name.startswith(catalogue.OFFPOLICY_PREFIX)}
    return StepResult(offpolicy.step, offpolicy.rows, offpolicy.tokens, {**own, **metrics}, offpolicy.empty_rows)
