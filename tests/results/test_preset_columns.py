"""compare-presets held as columns (issue 20, item 3): the presets' per-step results read from the accumulators'
columns, the run-only sweep, and the columnar finalize of every correction family, each against what it replaces."""

from __future__ import annotations

import itertools
import math
import pickle

import numpy as np
import pytest
from helpers.presets import ALL_PRESETS, make_chunk, random_steps, write_dump
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_diag.drivers.compare import compare_presets
from rollout_diag.metrics.outcome import CorrectionAnalysis, PresetSteps
from rollout_diag.metrics.sweep import RunSweepAccumulator, SweepAccumulator
from rollout_diag.results import ComparisonResult, StepResult


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    path = tmp_path_factory.mktemp("columns") / "dump.parquet"
    write_dump(path, random_steps(seed=8))
    return path


def records_of(seed: int) -> list:
    return [(step, row) for step, rows in random_steps(seed).items() for row in rows]


def same_number(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("seed", [0, 8])
def test_columnar_finalize_gives_the_digits_of_finalizing_each_state(seed):
    """Every accumulator's block finalize equals ``_finalize`` of each step's state, bit for bit, key for key."""
    analysis = CorrectionAnalysis(ALL_PRESETS)
    analysis.update(make_chunk(records_of(seed)))
    for key, accumulator in analysis.accumulators.items():
        by_block = accumulator.finalize_steps()
        assert list(by_block) == accumulator.store.steps.tolist()
        for step, state in accumulator.steps.items():
            one = accumulator._finalize(state)
            assert list(by_block[step]) == list(one), key
            assert all(same_number(by_block[step][name], value) for name, value in one.items()), (key, step)


def test_preset_steps_equal_the_per_step_dicts(dump):
    """PresetResult.steps (columns read on access) equal what the dict-per-step code built: the step's §1 metrics,
    then each part's finalized metrics in part order."""
    result = compare_presets(dump, ALL_PRESETS, device="cpu", chunk_tokens=37, workers=1)
    analysis = CorrectionAnalysis(ALL_PRESETS)
    analysis.update(make_chunk(records_of(8)))
    finalized = analysis.finalize()
    for preset in result.presets:
        assert isinstance(preset.steps, PresetSteps)
        per_step, _ = finalized[preset.name]
        for step in preset.steps:
            names = list(per_step[step.step])  # after the step's §1 keys, in the parts' order
            assert list(step.metrics)[len(step.metrics) - len(names) :] == names, preset.name
            for name, value in per_step[step.step].items():
                assert step.metrics[name] == pytest.approx(value, rel=1e-12, abs=1e-300)
        assert preset.steps == list(preset.steps) and len(preset.steps) == len(list(preset.steps))
        assert preset.steps[-1] == list(preset.steps)[-1] and preset.steps[1:3] == list(preset.steps)[1:3]


def test_preset_steps_survive_json_and_pickle(dump):
    result = compare_presets(dump, ALL_PRESETS[:6], device="cpu", chunk_tokens=50, workers=1)
    loaded = ComparisonResult.from_json(result.to_json())
    for mine, theirs in zip(result.presets, loaded.presets, strict=True):
        assert all(isinstance(step, StepResult) for step in mine.steps)
        assert [s.to_json() for s in mine.steps] == [s.to_json() for s in theirs.steps]
    again = pickle.loads(pickle.dumps(result))
    assert [p.steps for p in again.presets] == [list(p.steps) for p in result.presets]


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), cuts=st.lists(st.integers(1, 30), min_size=1, max_size=5))
def test_run_sweep_holds_the_per_step_sweeps_run_state(seed, cuts):
    """The run-only sweep of compare-presets: the same histograms and token count as merging every step's state,
    and the same valid rows (as a multiset: the table sorts them), whatever the chunking."""
    records = records_of(seed)
    per_step, run_only = SweepAccumulator(), RunSweepAccumulator()
    bounds = sorted({min(c, len(records)) for c in np.cumsum(cuts)} | {0, len(records)})
    for start, stop in itertools.pairwise(bounds):
        chunk = make_chunk(records[start:stop])
        per_step.update(chunk)
        run_only.update(chunk)
    expected, actual = per_step.run_state(), run_only.run_state()
    assert run_only.store.steps.tolist() == [0]
    for name in ("positive", "negative", "tokens"):
        np.testing.assert_array_equal(actual[name], expected[name])
    order = lambda rows: rows[np.lexsort(rows.T[::-1])]  # noqa: E731
    np.testing.assert_array_equal(order(actual["rows"]), order(expected["rows"]))
    targets = (0.001, 0.01, 0.05)
    assert run_only.table(actual, targets, curve=True) == per_step.table(expected, targets, curve=True)


def same_table(a, b) -> bool:
    """Two StateTables with the same steps and the same bits in every column."""
    if not np.array_equal(a.steps, b.steps) or a.shapes != b.shapes or a.dense.keys() != b.dense.keys():
        return False
    return all(np.array_equal(a.dense[name], b.dense[name], equal_nan=True) for name in a.dense)


@pytest.mark.parametrize("seed", [1, 8])
def test_one_table_for_every_accumulator_gives_each_its_own_digits(seed):
    """CorrectionAnalysis feeds every accumulator's partial through one table (PresetColumns) and hands each its
    columns when read: the same tables, bit for bit, as feeding each accumulator every chunk itself, with steps that
    go on across chunks, steps that come back (rows of a step are not contiguous), and a read between updates."""
    records = records_of(seed)
    rng = np.random.default_rng(seed)
    chunks = [records[start : start + 9] for start in range(0, len(records), 9)]
    rng.shuffle(chunks)
    combined = CorrectionAnalysis(ALL_PRESETS)
    separate = CorrectionAnalysis(ALL_PRESETS)
    for index, records_of_chunk in enumerate(chunks):
        combined.update(make_chunk(records_of_chunk))
        if index == len(chunks) // 2:
            assert combined.accumulators  # a read hands the columns over; later chunks merge onto them
        chunk = make_chunk(records_of_chunk)
        separate.prepare(chunk)
        for accumulator in separate._accumulators.values():
            accumulator.update(chunk)
    assert len(combined.accumulators) > 10
    for key, accumulator in combined.accumulators.items():
        assert same_table(accumulator.store, separate._accumulators[key].store), key
    assert combined.finalize() == separate.finalize()
    merged = CorrectionAnalysis(ALL_PRESETS)
    merged.merge(pickle.loads(pickle.dumps(combined)))  # a worker's state, shipped and folded in
    assert merged.finalize() == combined.finalize()
