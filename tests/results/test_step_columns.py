"""Per-step results held as columns (issue 20, item 3): ``analyze`` keeps every step's metrics and dialect values
in one column per key, not a dict per step, and gives exactly (same digits, keys, key order and types) what the
step-by-step finalize gives; the judgements read the columns and find what they found step by step."""

from __future__ import annotations

import copy
import math
import pickle
import random
from typing import ClassVar

import numpy as np
import pytest
import torch
from helpers import steps as many
from helpers.dumps import random_rows, seq_row, write_sequence_dump
from helpers.steps import tiny_rows
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_diag.decisions import trends
from rollout_diag.decisions.verdict import step_levels, step_levels_of
from rollout_diag.drivers.engine import analyze, step_table
from rollout_diag.drivers.passes import Analysis, run_chunks
from rollout_diag.drivers.sweep import threshold_sweep
from rollout_diag.engine.state import StateTable
from rollout_diag.io.reader import DumpReader
from rollout_diag.metrics.base import StepAccumulator
from rollout_diag.metrics.dialects import resolve
from rollout_diag.metrics.sweep import SweepAccumulator, sweep_tables
from rollout_diag.results import AnalysisResult, RowMetrics, StepResult, StepTable, SweepStep


def _plain(step: StepResult) -> StepResult:
    """The StepResult with plain dicts (what Analysis.step_results builds)."""
    dialects = {name: dict(values) for name, values in step.dialects.items()}
    return StepResult(step.step, step.rows, step.tokens, dict(step.metrics), step.empty_rows, dialects)


def _same(actual: dict, expected: dict, where: str) -> None:
    assert list(actual) == list(expected), where  # the same keys in the same order
    for key, value in expected.items():
        got = actual[key]
        assert type(got) is type(value), (where, key)
        assert got == value or (math.isnan(got) and math.isnan(value)), (where, key, got, value)


@pytest.fixture(scope="module")
def many_steps(tmp_path_factory) -> str:
    """2 000 one-row steps, a few steps with several rows, rounds and an empty row, and a step without model token."""
    rows = tiny_rows(2_000, seed=11)
    rows += random_rows(seed=4, steps=(2_000, 2_001, 2_002), rows_per_step=5, max_length=30, env_share=0.4)
    rows.append(seq_row(2_001, "empty", [-0.5, -1.0], [-0.4, -1.1], [0, 0]))
    rows.append(seq_row(2_003, "nothing", [-0.5], [-0.4], [0]))
    return str(write_sequence_dump(tmp_path_factory.mktemp("columns") / "many.parquet", rows, row_group_size=300))


def _analysis(path: str, dialect: str, chunk_tokens: int) -> Analysis:
    analysis = Analysis(dialects=resolve(dialect))
    reader = DumpReader([path], chunk_tokens=chunk_tokens)
    run_chunks(reader, [analysis.update], torch.device("cpu"), prepare=analysis.prepare)
    return analysis


@pytest.mark.parametrize("dialect", ["verl", "all"])
def test_step_columns_give_the_step_by_step_results_bit_for_bit(many_steps, dialect):
    analysis = _analysis(many_steps, dialect, chunk_tokens=1_000)
    expected = analysis.step_results()
    table = step_table(analysis)
    assert isinstance(table, StepTable) and len(table) == len(expected) == 2_004
    for mine, theirs in zip(table, expected, strict=True):
        where = f"step {theirs.step}"
        assert (mine.step, mine.rows, mine.tokens, mine.empty_rows) == (
            theirs.step,
            theirs.rows,
            theirs.tokens,
            theirs.empty_rows,
        )
        _same(dict(mine.metrics.items()), theirs.metrics, where)
        assert list(mine.dialects) == list(theirs.dialects), where
        for framework, values in theirs.dialects.items():
            _same(dict(mine.dialects[framework].items()), values, f"{where} {framework}")
        for key in theirs.metrics:  # single-key reads agree with the whole row
            assert key in mine.metrics
            assert mine.metrics.get(key) == theirs.metrics[key] or math.isnan(theirs.metrics[key])
        assert "no/such-metric" not in mine.metrics and mine.metrics.get("no/such-metric") is None
    assert table == [_plain(step) for step in table]  # a StepTable equals the list of plain StepResults


def test_analyze_holds_no_dict_per_step(many_steps):
    """The result's steps are columns: each step reads its metrics through a view, none holds a dict of its own."""
    result = analyze(many_steps, device="cpu", workers=1)
    assert isinstance(result.steps, StepTable)
    assert all(isinstance(step.metrics, RowMetrics) for step in result.steps)
    assert all(isinstance(values, RowMetrics) for step in result.steps for values in step.dialects.values())
    assert result.steps[5] is result.steps[5]  # a step is one object (renderers key steps by identity)
    # a saved result reads back as plain dicts with the same numbers; pickles and copies are plain dicts too
    loaded = AnalysisResult.from_json(result.to_json())
    assert [_plain(s).to_json() for s in result.steps] == [s.to_json() for s in loaded.steps]
    for copied in (pickle.loads(pickle.dumps(result.steps)), copy.deepcopy(result.steps)):
        assert [s.to_json() for s in copied] == [s.to_json() for s in result.steps]
    assert type(pickle.loads(pickle.dumps(result.steps[3].metrics))) is dict


@pytest.mark.parametrize("chunk_tokens", [97, 4_096])
def test_step_columns_do_not_depend_on_the_chunking(many_steps, chunk_tokens):
    whole = step_table(_analysis(many_steps, "verl", chunk_tokens=1 << 20))
    chunked = step_table(_analysis(many_steps, "verl", chunk_tokens=chunk_tokens))
    for mine, theirs in zip(chunked, whole, strict=True):
        assert list(mine.metrics) == list(theirs.metrics)
        for key, value in theirs.metrics.items():
            assert math.isclose(mine.metrics[key], value, rel_tol=1e-12, abs_tol=1e-15) or (
                math.isnan(value) and math.isnan(mine.metrics[key])
            ), (theirs.step, key)


def test_judgements_over_columns_equal_those_step_by_step(many_steps):
    """Step levels, anomalies and the step trend read one column per metric: the same as over plain dicts."""
    result = analyze(many_steps, device="cpu", workers=1)
    plain = [_plain(step) for step in result.steps]
    assert step_levels_of(result.steps) == step_levels([(s.step, s.metrics) for s in plain]) == result.step_levels
    assert step_levels_of(plain) == result.step_levels
    found = trends.find_anomalies(plain)
    assert found  # every 7th step has a catastrophic token: the data has anomalies to find
    assert trends.find_anomalies(result.steps) == found
    assert trends.step_trend(result.steps) == trends.step_trend(plain)


def test_a_nan_or_missing_judged_value_is_not_applicable_over_columns():
    steps = [StepResult(i, 1, 4, {"rollout_corr/k3_kl": value}) for i, value in enumerate([math.nan, 0.5, 1e9])]
    steps.append(StepResult(3, 1, 0, {}))
    assert step_levels_of(steps) == step_levels([(s.step, s.metrics) for s in steps])
    assert np.asarray([entry["levels"]["rollout_corr/k3_kl"] for entry in step_levels_of(steps)])[[0, 3]].tolist() == [
        "n/a",
        "n/a",
    ]


@pytest.mark.parametrize("chunk_tokens", [97, 1 << 20])
def test_position_rows_held_as_columns_are_the_rows_step_by_step(many_steps, chunk_tokens):
    """analyze's per-step position rows (one per step and bucket hit) come from columns, a block of steps at a time:
    the same rows, keys, values, types and order as ``position_rows`` builds one dict at a time."""
    analysis = _analysis(many_steps, "verl", chunk_tokens=chunk_tokens)
    expected = analysis.positions.position_rows()
    rows = analysis.positions.position_table()
    assert not isinstance(rows, list) and len(rows) == len(expected) > 2_000
    for mine, theirs in zip(rows, expected, strict=True):
        assert list(mine.items()) == list(theirs.items())
        assert [type(v) for v in mine.values()] == [type(v) for v in theirs.values()]
    assert rows[len(rows) - 1] == expected[-1] and rows[0] == expected[0] and rows[-3:] == expected[-3:]
    assert rows == expected and pickle.loads(pickle.dumps(rows)) == expected


@pytest.mark.parametrize("targets", [(0.001, 0.01, 0.05), (0.5, 0.2, 1e-6)])
def test_sweep_of_every_step_at_once_gives_each_step_own_table(many_steps, targets):
    """The per-step sweep, computed a block of steps at a time, is digit for digit (repr: every float exact, keys in
    order) each step's own ``table(state, targets, curve=False)``; ``sweep`` makes each step's objects when read."""
    sweep = SweepAccumulator()
    run_chunks(DumpReader([many_steps], chunk_tokens=1_000), [sweep.update], torch.device("cpu"))
    _, tables = sweep_tables(sweep, targets)
    expected = [
        {"step": step, "options": sweep.table(state, targets, curve=False)} for step, state in sweep.steps.items()
    ]
    assert len(tables) == len(expected) == 2_004
    assert [repr(table) for table in tables] == [repr(table) for table in expected]
    assert repr(tables[-1]) == repr(expected[-1])
    result = threshold_sweep(many_steps, targets=targets, device="cpu")
    assert not isinstance(result.steps, list)
    assert [step.to_json() for step in result.steps] == expected
    assert [repr(step) for step in result.to_json()["steps"]] == [repr(step) for step in expected]
    assert result.steps[3] == SweepStep.from_json(expected[3])


# ------------------------------------------------------------------------------- a chunk merges into the open steps
class _Family(StepAccumulator):
    REDUCTIONS: ClassVar[dict[str, str]] = many.REDUCTIONS

    def _stats(self, chunk):  # pragma: no cover - fed tables directly
        raise NotImplementedError

    def _finalize(self, state):  # pragma: no cover
        return {}


def _identical(a: StateTable, b: StateTable) -> None:
    """Bit for bit: the same steps, fields and entries."""
    assert np.array_equal(a.steps, b.steps)
    for name in b.dense:
        assert np.array_equal(a.dense[name], b.dense[name], equal_nan=True), name
    for name in b.sparse:
        for mine, theirs in zip(a.sparse[name], b.sparse[name], strict=True):
            assert np.array_equal(mine, theirs, equal_nan=True), name
    for name in b.ragged:
        for mine, theirs in zip(a.ragged[name], b.ragged[name], strict=True):
            assert np.array_equal(mine, theirs, equal_nan=True), name


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10_000), in_order=st.booleans(), read_between=st.booleans())
def test_merging_into_the_open_steps_equals_merging_into_the_whole_table(seed, in_order, read_between):
    """A chunk merges into the latest steps only (the earlier ones are sealed and joined when read): the table is bit
    for bit the one that merging each chunk into the whole table gives, in order, out of order, read in between."""
    rng = random.Random(seed)
    chunks = [many._chunk(rng) for _ in range(rng.randint(1, 9))]
    if in_order:  # as a reader gives them: each chunk starts at or after the previous one's last step
        chunks.sort(key=lambda chunk: chunk[0][0])
        chunks = [c for i, c in enumerate(chunks) if i == 0 or c[0][0] >= chunks[i - 1][0][-1]]
    family = _Family()
    for index, (steps, partial) in enumerate(chunks):
        family.append_table(StateTable.from_groups(many.REDUCTIONS, steps, partial))
        if read_between:
            _identical(family.store, many._table(chunks[: index + 1]))
    _identical(family.store, many._table(chunks))
    copied = copy.copy(family)  # a shallow copy (``restricted``) does not see later chunks
    before = copied.store
    later_steps, later = many._chunk(random.Random(seed))
    family.append_table(StateTable.from_groups(many.REDUCTIONS, [step + 100 for step in later_steps], later))
    _identical(copied.store, before)
