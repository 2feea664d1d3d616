"""The finalize side of many short steps (issue 20, item 3: 200 000 one-row steps under 1.5 GB): a family's columns
are made a block of steps at a time without keeping each block's dense state alive, and ``step_table`` finalizes one
family at a time; the values are those of the step-by-step finalize, digit for digit."""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest
import torch
from helpers.dumps import write_sequence_dump
from helpers.steps import tiny_rows
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_diag.decisions import trends
from rollout_diag.drivers.engine import _family_groups, step_table
from rollout_diag.drivers.passes import Analysis, run_chunks
from rollout_diag.io.reader import DumpReader
from rollout_diag.metrics.base import _owned
from rollout_diag.results import MetricColumns

STEPS = 40_000  # ten blocks of 4 096 steps


@pytest.fixture(scope="module")
def analysis(tmp_path_factory) -> Analysis:
    path = write_sequence_dump(tmp_path_factory.mktemp("finalize") / "tiny.parquet", tiny_rows(STEPS, seed=5))
    analysis = Analysis()
    run_chunks(DumpReader([str(path)]), [analysis.update], torch.device("cpu"), prepare=analysis.prepare)
    return analysis


def test_a_strided_column_is_copied_and_others_are_kept() -> None:
    block = np.arange(40.0).reshape(10, 4)
    column = block[:, 2]
    owned = _owned(column)
    assert owned.base is None and np.array_equal(owned, column)
    own = np.arange(5.0)
    assert _owned(own) is own
    contiguous = np.arange(20.0)[5:10]  # a slice of a table's own column: alive anyway
    assert _owned(contiguous) is contiguous
    scalar = np.broadcast_to(np.float64(2.5), (1_000,))  # a scalar metric: no memory to keep
    assert _owned(scalar) is scalar


def test_rounds_columns_over_many_blocks_keep_no_block_alive(analysis) -> None:
    rounds = analysis.rounds
    steps = rounds.store.steps
    rounds.finalize_columns(steps)  # names interned, caches filled
    tracemalloc.start()
    try:
        columns = rounds.finalize_columns(steps)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    held = sum(
        np.asarray(value).nbytes + present.nbytes for present, values in columns.groups for value in values.values()
    )
    # one block's dense state (8 fields x 4 096 steps x 65 round buckets x 8 B = 17 MB) and the output, twice over
    # (the blocks and their join); keeping three strided columns of each block alive held 3 x 40 000 x 65 x 8 B more
    block = 8 * 4096 * (rounds.max_rounds + 1) * 8
    assert peak < block + 3 * held + 8 * 2**20, (peak, block, held)


def test_rounds_columns_over_many_blocks_are_the_step_by_step_values(analysis) -> None:
    rounds = analysis.rounds
    expected = rounds.finalize_steps()
    columns = rounds.finalize_columns(rounds.store.steps)
    assert len(expected) == STEPS
    for index, (step, values) in enumerate(expected.items()):
        row = columns.row(index)
        assert list(row) == list(values), step
        for name, value in values.items():
            assert row[name] == value or (math.isnan(row[name]) and math.isnan(value)), (step, name)


def test_step_table_family_by_family_equals_all_families_at_once(analysis) -> None:
    steps = analysis.offpolicy.store.steps
    at_once = MetricColumns(
        [group for family in analysis.families for group in family.finalize_columns(steps).groups], steps.shape[0]
    )
    table = step_table(analysis)
    assert [tuple(values) for _, values in table.metrics.groups] == [tuple(values) for _, values in at_once.groups]
    for (present, values), (their_present, theirs) in zip(table.metrics.groups, at_once.groups, strict=True):
        assert np.array_equal(present, their_present)
        for name, column in values.items():
            assert np.array_equal(column, theirs[name], equal_nan=True), name
    for index in (0, 1, 4_095, 4_096, STEPS - 1):
        assert table.metrics.row(index) == at_once.row(index) or repr(table.metrics.row(index)) == repr(
            at_once.row(index)
        )


def test_family_groups_are_read_once(analysis) -> None:
    steps = analysis.offpolicy.store.steps
    groups = _family_groups(analysis.families[:2], steps)
    first = list(groups)
    assert first and list(groups) == []  # a generator: a second reader gets nothing, never stale columns


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(st.floats(0.0, 50.0), st.just(0.0), st.just(math.nan), st.floats(-1.0, 0.0)), min_size=9, max_size=90
    ),
    st.integers(1, 40),
)
def test_window_baselines_by_blocks_equal_all_at_once(listed, block) -> None:
    values = np.array(listed, dtype=np.float64)
    whole = trends._window_baselines(values, trends.ANOMALY_WINDOW, trends.ANOMALY_SPREAD)
    saved = trends.BASELINE_BLOCK
    trends.BASELINE_BLOCK = block
    try:
        blocked = trends._window_baselines(values, trends.ANOMALY_WINDOW, trends.ANOMALY_SPREAD)
    finally:
        trends.BASELINE_BLOCK = saved
    for mine, theirs in zip(blocked, whole, strict=True):
        assert mine.tobytes() == theirs.tobytes()  # the same digits, NaN where NaN
