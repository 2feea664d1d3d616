"""Chunks that go back in steps (per-rank files each holding every step, the same file read twice, a shuffled input):
each starts a layer of the accumulator's table instead of merging into the whole table (engine/store.py StepStore),
and the layers are folded in one pass (StateTable.folded). The table, and every result, is the one merging chunk after
chunk into the whole table gave, bit for bit (but a NaN's sign: ``test_state_table_fast.assert_same_table``); the work
grows with the input, not with its square; and chunks that come in step order never start a layer."""

from __future__ import annotations

import copy
import itertools
import math
import random
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
import pytest
from helpers.dumps import random_rows, seq_row, write_sequence_dump
from helpers.tables import FAMILIES, assert_same_table, chunks, finalized, steps_of, table_specs
from helpers.tables import REDUCTIONS as EVERY_REDUCTION
from helpers.tables import _Family as TableFamily
from helpers.tables import _table as adversarial_table
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_diag.engine.state import Ragged, StateTable
from rollout_diag.engine.store import LAYERS, StepStore
from rollout_diag.metrics.outcome import CorrectionAnalysis
from rollout_diag.metrics.sweep import SweepAccumulator
from rollout_diag.presets import PRESETS

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NaN and ±inf in moments, as in real dumps


def _rows(seed: int) -> list[dict[str, Any]]:
    rows = random_rows(seed=seed, steps=(0, 1, 2, 3, 4), rows_per_step=7, max_length=40, env_share=0.35)
    rng = np.random.default_rng(seed)
    for row in rows[::4]:  # large divergence: rejections, truncations, vetoes, clamps
        row["rollout"] = [min(x - abs(rng.normal(0.0, 3.0)), 0.0) for x in row["rollout"]]
    rows.append(seq_row(2, "empty", [-0.5, -1.0], [-0.4, -1.1], [0, 0]))
    return rows


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> dict[str, str]:
    """``ordered``: rows in step order (each chunk starts at or after the previous one's last step); ``shuffled``:
    rows of a step spread over the file (most chunks go back in steps)."""
    folder = tmp_path_factory.mktemp("backward")
    ordered = sorted(_rows(31), key=lambda row: row["step"])
    shuffled = _rows(32)
    random.Random(32).shuffle(shuffled)
    return {
        "ordered": str(write_sequence_dump(folder / "ordered.parquet", ordered, row_group_size=9)),
        "shuffled": str(write_sequence_dump(folder / "shuffled.parquet", shuffled, row_group_size=9)),
    }


def assert_same(actual: Any, expected: Any, where: str = "") -> None:
    """Equal to the last bit (a NaN where a NaN was): stricter than the accumulator contract's rtol 1e-12, since a
    layer reduces each step's states in the order the whole-table merges did."""
    if isinstance(expected, dict):
        assert list(actual) == list(expected), f"{where}: keys differ"
        for key in expected:
            assert_same(actual[key], expected[key], f"{where}/{key}")
    elif isinstance(expected, Sequence) and not isinstance(expected, str):
        assert len(actual) == len(expected), where
        for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, f"{where}[{index}]")
    elif isinstance(expected, float):
        assert isinstance(actual, float), f"{where}: {actual!r}"
        same = (math.isnan(actual) and math.isnan(expected)) or (actual == expected and str(actual) == str(expected))
        assert same, f"{where}: {actual!r} != {expected!r}"
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


def fed(make: Callable[[], Any], sequence: Sequence[Any]) -> Any:
    accumulator = make()
    for chunk in sequence:
        accumulator.update(chunk)
    return accumulator


def merged_chunk_by_chunk(make: Callable[[], Any], sequence: Sequence[Any]) -> Any:
    """The whole-table path: one accumulator per chunk, merged in order (``merge``: the table so far merged with the
    chunk's, as ``append_table`` did for a chunk that went back)."""
    first = fed(make, sequence[:1])
    for chunk in sequence[1:]:
        first.merge(fed(make, [chunk]))
    return first


@pytest.fixture
def layers_begun(monkeypatch) -> list[int]:
    """How many layers accumulators begin (one entry per ``StepStore._begin_layer`` call)."""
    begun: list[int] = []
    original = StepStore._begin_layer

    def counted(self, incoming):
        begun.append(1)
        return original(self, incoming)

    monkeypatch.setattr(StepStore, "_begin_layer", counted)
    return begun


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_chunks_that_go_back_give_what_merging_into_the_whole_table_gave(dumps, family, layers_begun):
    """The dump read twice (every chunk, then every chunk again), the chunks reversed, and in a random order: the
    same results, bit for bit, as merging each chunk into the whole table."""
    make = FAMILIES[family]
    small = chunks(dumps["shuffled"], chunk_tokens=83)
    assert len(small) > 8
    orders = {
        "twice": small + small,
        "reversed": small[::-1],
        "random": random.Random(5).sample(small, len(small)),
        "ordered file four times": chunks(dumps["ordered"], chunk_tokens=97) * 4,
    }
    for name, sequence in orders.items():
        begun = len(layers_begun)
        layered = fed(make, sequence)
        assert len(layers_begun) > begun, f"{name}: no chunk went back"
        assert_same(finalized(layered), finalized(merged_chunk_by_chunk(make, sequence)), f"{family} {name}")


def test_the_table_and_its_views_are_the_folded_one(dumps):
    """``steps`` (the step -> state view), ``restricted``, ``merge`` and ``run_state`` read the layers folded; a
    shallow copy (``restricted``) keeps its table while the original goes on."""
    small = chunks(dumps["shuffled"], chunk_tokens=83)
    sequence = small + small[::-1]
    layered = fed(SweepAccumulator, sequence)
    assert layered.step_store.layer_count, "the chunks left no layer to fold"
    reference = merged_chunk_by_chunk(SweepAccumulator, sequence)
    assert list(layered.steps) == list(reference.steps) and len(layered.steps) == len(reference.steps)
    assert not layered.step_store.layer_count  # read: folded into one table
    for (step, state), (their_step, theirs) in zip(layered.steps.items(), reference.steps.items(), strict=True):
        assert step == their_step
        for name in state:
            assert np.asarray(state[name]).tobytes() == np.asarray(theirs[name]).tobytes(), (step, name)

    layered = fed(SweepAccumulator, sequence)
    keep = np.array([step % 2 == 0 for step in reference.store.steps.tolist()])
    subset = layered.restricted(keep)
    expected = finalized(reference.restricted(keep))
    for chunk in small:  # the original goes on (and starts layers): the copy's table stays as it was
        layered.update(chunk)
    assert_same(finalized(subset), expected, "restricted")

    layered, other = fed(SweepAccumulator, sequence), fed(SweepAccumulator, small[::-1] + small)
    assert layered.step_store.layer_count and other.step_store.layer_count
    layered.merge(other)
    reference.merge(merged_chunk_by_chunk(SweepAccumulator, small[::-1] + small))
    assert_same(finalized(layered), finalized(reference), "merged")
    assert_same(layered.run_state()["tokens"].tolist(), reference.run_state()["tokens"].tolist())


def test_correction_accumulators_read_mid_run_take_every_layer(dumps):
    """CorrectionAnalysis hands its columns over (PresetColumns.hand_over: the table's pieces, finished layers
    included) when its accumulators are read, and chunk by chunk after that: the results are those of merging chunk
    after chunk into the whole table."""
    make = lambda: CorrectionAnalysis(list(PRESETS.values()))  # noqa: E731
    small = chunks(dumps["shuffled"], chunk_tokens=83)
    sequence = small + small[::-1]
    analysis = make()
    for index, chunk in enumerate(sequence):
        analysis.update(chunk)
        if index == len(small) + 2:  # layers held: the hand-over must pass them on
            assert analysis._table.step_store.layer_count
            analysis.accumulators  # noqa: B018
    assert_same(finalized(analysis), finalized(merged_chunk_by_chunk(make, sequence)))


def test_chunks_in_step_order_never_start_a_layer(dumps, monkeypatch):
    """The common input (chunks in step order, a step going on over chunks): the sealed and open parts only (the
    chunks going on with the open part folded into it when it is sealed or read); results bit for bit those of merging
    chunk after chunk into the whole table."""

    def refused(self, incoming):
        raise AssertionError("a chunk in step order started a layer")

    monkeypatch.setattr(StepStore, "_begin_layer", refused)
    ordered = chunks(dumps["ordered"], chunk_tokens=97)
    assert len(ordered) > 8 and all(  # in step order, some chunks going on with the previous one's last step
        int(later.groups.steps[0]) >= int(earlier.groups.steps[-1]) for earlier, later in itertools.pairwise(ordered)
    )
    assert any(
        int(later.groups.steps[0]) == int(earlier.groups.steps[-1]) for earlier, later in itertools.pairwise(ordered)
    )
    for family, make in FAMILIES.items():
        expected = finalized(merged_chunk_by_chunk(make, ordered))
        assert_same(finalized(fed(make, ordered)), expected, family)


@settings(max_examples=150, deadline=None)
@given(
    spans=table_specs(-3, 6, 7),
    empty=st.lists(st.integers(0, 7), max_size=2),
    seed=st.integers(0, 2**32 - 1),
)
def test_folding_tables_is_merging_them_one_after_another(spans, empty, seed):
    """StateTable.folded equals the chain of merges, bit for bit but a NaN's sign (NaN, ±inf and signed zeros where
    the chain puts them): steps shared by any number of tables, buckets hit or not, rows of a step in table order; a
    table without fields or without steps anywhere in the chain adds nothing."""
    rng = np.random.default_rng(seed)
    tables = []
    for first, gaps, hit in spans:
        tables.append(adversarial_table(rng, steps_of(first, gaps), hit))
    for index in sorted(empty, reverse=True):  # the empty table (no fields), or a chunk's without steps
        blank = StateTable.empty(EVERY_REDUCTION) if index % 2 else adversarial_table(rng, [0], 1.0).sliced(0, 0)
        tables.insert(min(index, len(tables)), blank)
    kept = copy.deepcopy(tables)
    chain = tables[0]
    for table in tables[1:]:
        chain = chain.merged(table)
    assert_same_table(StateTable.folded(tables), chain)
    for table, before in zip(tables, kept, strict=True):  # tables are shared (CHUNK_ONLY): never written to
        assert_same_table(table, before)


# ----------------------------------------------------------------------- the work: linear in the input
REDUCTIONS = {"count": "sum", "high": "max", "spread": "moments", "buckets": "sum", "rows": "concat"}


class _Family(TableFamily):
    REDUCTIONS: ClassVar[dict[str, str]] = REDUCTIONS


def _table(rng: np.random.Generator, steps: list[int], rows: int) -> StateTable:
    groups = len(steps)
    buckets = np.zeros((groups, 20))
    buckets[:, : int(rng.integers(1, 20))] = rng.normal(size=(groups, 1))
    spread = np.column_stack([np.ones(groups), rng.normal(size=(groups, 5))])
    partial = {
        "count": rng.normal(size=groups),
        "high": rng.normal(size=groups),
        "spread": spread,
        "buckets": buckets,
        "rows": Ragged(rng.normal(size=(rows, 3)), rng.integers(0, groups, rows)),
    }
    return StateTable.from_groups(REDUCTIONS, steps, partial)


def _entries(table: StateTable) -> int:
    """What a merge of ``table`` reads and copies: its steps, wide entries and rows."""
    sparse = sum(entries[0].shape[0] for entries in table.sparse.values())
    return table.steps.shape[0] + sparse + sum(entries[0].shape[0] for entries in table.ragged.values())


def _work(monkeypatch, tables: Sequence[StateTable]) -> tuple[int, int, StateTable, StateTable]:
    """(entries every merge and fold read, those the whole-table merges read, the accumulator's table, the whole-table
    merges' table) for ``tables`` fed in turn."""
    read = [0]

    def counted(name: str, original):
        def run(self, other):
            read[0] += _entries(self) + _entries(other)
            return original(self, other)

        monkeypatch.setattr(StateTable, name, run)

    originals = {name: getattr(StateTable, name) for name in ("_merged_general", "_merged_touching")}
    for name, original in originals.items():
        counted(name, original)
    if hasattr(StateTable, "folded"):  # the one pass over every layer
        fold = StateTable.folded

        def folded(cls, layers):
            read[0] += sum(_entries(layer) for layer in layers)
            return fold(layers)

        monkeypatch.setattr(StateTable, "folded", classmethod(folded))
    family = _Family()
    for table in tables:
        family.append_table(table)
    table = family.store
    work = read[0]
    for name, original in originals.items():
        monkeypatch.setattr(StateTable, name, original)
    expected, whole = tables[0], 0
    for incoming in tables[1:]:
        whole += _entries(expected) + _entries(incoming)
        expected = expected._merged_general(incoming)
    return work, whole, table, expected


def _same_table(actual: StateTable, expected: StateTable) -> None:
    assert actual.steps.tobytes() == expected.steps.tobytes()
    for name in expected.dense:
        assert actual.dense[name].tobytes() == expected.dense[name].tobytes(), name
    for name in expected.sparse:
        for a, e in zip(actual.sparse[name], expected.sparse[name], strict=True):
            assert a.tobytes() == e.tobytes(), name
    for name in expected.ragged:
        for a, e in zip(actual.ragged[name], expected.ragged[name], strict=True):
            assert a.tobytes() == e.tobytes(), name


def _files(count: int, steps: int = 12, per_chunk: int = 3) -> list[StateTable]:
    """``count`` files' chunks, each file covering steps 0…steps-1 (rank files, or one file read ``count`` times),
    chunks of ``per_chunk`` steps, a step going on from one chunk into the next."""
    rng = np.random.default_rng(count)
    out = []
    for _ in range(count):
        for first in range(0, steps, per_chunk - 1):
            out.append(_table(rng, list(range(first, min(first + per_chunk, steps))), rows=40))
    return out


def test_files_that_repeat_the_steps_cost_what_they_hold(monkeypatch):
    """F files each covering every step: the entries merges read grow linearly with F (merging each chunk into the
    whole table, whose rows grow with F, read them quadratically); the table is that of the whole-table merges."""
    work = {}
    for count in (4, 16):
        work[count], _, table, expected = _work(monkeypatch, _files(count))
        _same_table(table, expected)
    one_file = sum(_entries(table) for table in _files(1))
    assert work[16] <= 12 * 16 * one_file, work  # a few copies of each entry, whatever F
    assert work[16] < 6 * work[4], work  # linear: 4×; quadratic: ~16×


def test_steps_that_come_in_reverse_cost_what_they_hold(monkeypatch):
    """Chunks of disjoint steps coming last step first (files read newest first): each goes back, the table grows
    with every chunk; the work stays linear (the first layer doubles from fold to fold), and the table is that of the
    whole-table merges."""
    rng = np.random.default_rng(3)
    work = {}
    for count in (50, 400):
        tables = [_table(rng, [step], rows=4) for step in range(count, 0, -1)]
        work[count], _, table, expected = _work(monkeypatch, tables)
        _same_table(table, expected)
    assert work[400] < 12 * work[50], work  # linear: 8×; quadratic: ~64×


def test_every_chunk_going_back_to_one_step_holds_few_layers(monkeypatch):
    """A large table, then small chunks each back at step 0 (the worst case: every layer spans the same steps, and
    together they stay smaller than the first): at most ``LAYERS`` finished layers, folded once per ``LAYERS`` chunks
    (merging each chunk into the whole table read the table every chunk), and the table of the whole-table merges."""
    bound = LAYERS
    rng = np.random.default_rng(4)
    tables = [_table(rng, list(range(200)), rows=2000)]
    tables += [_table(rng, [0, 1, 2], rows=2) for _ in range(3 * bound)]
    family, held = _Family(), []
    for table in tables:
        family.append_table(table)
        held.append(family.step_store.layer_count)
    assert max(held) == bound, max(held)  # the bound, not the bytes, decided
    work, whole, table, expected = _work(monkeypatch, tables)
    _same_table(table, expected)
    assert work < whole / 10, (work, whole)
