"""StateTable's fast paths (a chunk going on with the open step, a run of steps kept) equal its general paths bit for
bit: the same entries, the same values, the same reductions in the same order (mine, then theirs)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.dumps import random_rows, write_sequence_dump
from helpers.tables import REDUCTIONS, _table, assert_same_table, steps_of, table_specs
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_diag.drivers.passes import Analysis
from rollout_diag.engine.state import StateTable, merge_moments
from rollout_diag.engine.store import OPEN_STEPS, StepStore
from rollout_diag.io.reader import DumpReader
from rollout_diag.metrics.debug import DebugAccumulator
from rollout_diag.metrics.offpolicy import OffPolicyAccumulator

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NaN and ±inf in moments, as in real dumps


sorted_steps = st.lists(st.integers(-5, 40), min_size=1, max_size=6, unique=True).map(sorted)


@settings(max_examples=150, deadline=None)
@given(
    mine=sorted_steps,
    later=st.lists(st.integers(1, 9), max_size=5),
    seed=st.integers(0, 2**32 - 1),
    hits=st.tuples(*[st.sampled_from([0.0, 0.1, 0.5, 1.0, -1.0])] * 2),
)
def test_merging_a_table_that_goes_on_with_my_last_step_equals_the_general_merge(mine, later, seed, hits):
    """Both sides hitting every bucket of the shared step, buckets 0…k (the usual chunk), some, or none."""
    rng = np.random.default_rng(seed)
    theirs = [mine[-1]]
    for gap in later:
        theirs.append(theirs[-1] + gap)
    table, other = _table(rng, mine, hits[0]), _table(rng, theirs, hits[1])
    assert_same_table(table.merged(other), table._merged_general(other))


@settings(max_examples=150, deadline=None)
@given(
    steps=sorted_steps,
    seed=st.integers(0, 2**32 - 1),
    hit=st.sampled_from([0.0, 0.2, 1.0]),
    bounds=st.tuples(st.integers(0, 7), st.integers(0, 7)),
    keep=st.lists(st.booleans(), min_size=6, max_size=6),
)
def test_a_run_of_steps_is_sliced_as_the_general_subset_picks_it(steps, seed, hit, bounds, keep):
    table = _table(np.random.default_rng(seed), steps, hit)
    count = len(steps)
    begin, end = min(bounds), max(bounds)
    run = np.zeros(count, dtype=bool)
    run[begin:end] = True
    assert_same_table(table.subset(run), table._subset_general(run))
    assert_same_table(table.sliced(min(begin, count), min(end, count)), table._subset_general(run))
    chosen = np.array(keep[:count])  # any choice: a run or not
    assert_same_table(table.subset(chosen), table._subset_general(chosen))


@settings(max_examples=100, deadline=None)
@given(
    chunks=table_specs(-3, 3, 10),
    seed=st.integers(0, 2**32 - 1),
    open_steps=st.sampled_from([1, 2, OPEN_STEPS]),
)
def test_chunks_in_any_order_give_the_table_of_the_general_merge(chunks, seed, open_steps):
    """Chunks as a reader gives them (each starting at, after or, for a shuffled input, before the previous one's
    last step): the store's table (sealed parts, open part, whatever its bound) equals folding every chunk's
    table in with the general merge."""
    _fold(chunks, seed, open_steps)


def _fold(chunks: list[tuple[int, list[int], float]], seed: int, open_steps: int) -> None:
    rng = np.random.default_rng(seed)
    store = StepStore(StateTable.empty(REDUCTIONS), open_steps=open_steps)
    expected = StateTable.empty(REDUCTIONS)
    last = 0
    for shift, gaps, hit in chunks:
        steps = steps_of(last + shift, gaps)  # shift < 0: out of order; 0: the same step goes on; > 0: new steps
        incoming = _table(rng, steps, hit)
        store.append(incoming)
        expected = expected._merged_general(incoming) if expected.shapes else incoming
        last = steps[-1]
    assert_same_table(store.table, expected)


def test_accumulators_of_a_chunk_only_family_share_one_table_per_chunk(tmp_path):
    """analyze's §1 and §5 and verl's dialect (which reports them again) build each chunk's table once, and their
    tables stay equal to one another and to an accumulator fed alone; a subclass does not share its parent's."""

    class Narrowed(OffPolicyAccumulator):  # a subclass may compute something else: it never takes §1's table
        def _stats(self, chunk):
            return {name: value * 2.0 for name, value in super()._stats(chunk).items()}

    rows = random_rows(seed=4, steps=(0, 1, 2), rows_per_step=6, max_length=30, env_share=0.3)
    path = write_sequence_dump(tmp_path / "dump.parquet", rows, row_group_size=5)
    analysis = Analysis()
    verl = analysis.dialect.families["verl"]
    alone, debug_alone, narrowed = OffPolicyAccumulator(), DebugAccumulator(), Narrowed()
    built = []
    original = StateTable.from_groups

    def counted(reductions, steps, partial):
        table = original(reductions, steps, partial)
        built.append(reductions)
        return table

    for chunk, _ in DumpReader([str(path)], chunk_tokens=64).chunks("cpu"):
        built.clear()
        StateTable.from_groups = counted  # type: ignore[method-assign]
        try:
            analysis.update(chunk)
        finally:
            StateTable.from_groups = original  # type: ignore[method-assign]
        assert built.count(OffPolicyAccumulator.REDUCTIONS) == 1
        assert built.count(DebugAccumulator.REDUCTIONS) == 1
        narrowed.update(chunk)
        chunk.cache.clear()
        alone.update(chunk)
        debug_alone.update(chunk)
    assert_same_table(verl.families[0].store, analysis.offpolicy.store)
    assert_same_table(analysis.offpolicy.store, alone.store)
    assert_same_table(verl.families[1].store, debug_alone.store)
    assert_same_table(analysis.family["debug"].store, debug_alone.store)
    doubled = narrowed.store.dense["rows"]
    np.testing.assert_array_equal(doubled, 2.0 * alone.store.dense["rows"])


moment_values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1.0, 3.0, 1e308, -1e308, 5e-324]),
)


@settings(max_examples=400, deadline=None)
@given(a=st.lists(moment_values, min_size=6, max_size=6), b=st.lists(moment_values, min_size=6, max_size=6))
def test_one_pair_of_moments_merges_as_the_vectorised_merge(a, b):
    """The merge of one step's moments (Python floats) gives the bits of the vectorised merge, NaN, ±inf, signed
    zeros and overflow included."""
    mine, theirs = np.array([a, a]), np.array([b, b])  # two rows: the vectorised path
    vectorised = merge_moments(mine, theirs)[:1]
    one = merge_moments(mine[:1], theirs[:1])
    assert one.dtype == vectorised.dtype and one.shape == vectorised.shape == (1, 6)
    assert one.tobytes() == vectorised.tobytes(), (one, vectorised)
    assert merge_moments(mine[0], theirs[0]).tobytes() == vectorised[0].tobytes()
