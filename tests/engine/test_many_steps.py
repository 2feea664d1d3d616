"""Many tiny steps (issue 20, item 3): per-step state is sized by what a step holds, every command handles a dump
of thousands of one-row steps and gives, for each step, what that step alone gives; and ``--workers auto``."""

from __future__ import annotations

import math
import random
import statistics

import numpy as np
import pytest
import torch
from helpers.dumps import random_rows, seq_row, write_sequence_dump
from helpers.steps import REDUCTIONS, _chunk, _table, tiny_rows
from hypothesis import given, settings
from hypothesis import strategies as st

import rollout_diag as rd
from rollout_diag.decisions import trends
from rollout_diag.decisions.check import Gate
from rollout_diag.drivers import distributed
from rollout_diag.drivers.check import check_run
from rollout_diag.drivers.diff import diff_runs
from rollout_diag.drivers.passes import Analysis, run_chunks
from rollout_diag.drivers.sweep import threshold_sweep
from rollout_diag.engine.state import Sparse, StateTable, merge_states
from rollout_diag.io.reader import DumpReader
from rollout_diag.metrics.base import StepAccumulator
from rollout_diag.report import render_report
from rollout_diag.results import Anomaly, StepResult

RTOL = 1e-12


def close(actual, expected, where: str = "") -> None:
    if isinstance(expected, dict):
        assert set(actual) == set(expected), f"{where}: {set(actual) ^ set(expected)}"
        for key in expected:
            close(actual[key], expected[key], f"{where}/{key}")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), where
        for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
            close(a, e, f"{where}[{index}]")
    elif isinstance(expected, float) and math.isfinite(expected):
        assert math.isclose(actual, expected, rel_tol=RTOL, abs_tol=1e-15), f"{where}: {actual} != {expected}"
    else:
        assert actual == expected or (actual != actual and expected != expected), f"{where}: {actual} != {expected}"


# ------------------------------------------------------------------------------- the table against dicts of states
SHAPES = {"pair": (2,), "buckets": (20,), "bucket_max": (12,), "bucket_moments": (10, 6), "spread": (6,)}


def _reference(chunks: list[tuple[list[int], dict]]) -> dict[int, dict]:
    """The old layout: one dict of arrays per step, merged with merge_states chunk after chunk."""
    states: dict[int, dict] = {}
    for steps, partial in chunks:
        for group, step in enumerate(steps):
            state = {
                name: np.asarray(value[group], dtype=np.float64) for name, value in partial.items() if name != "rows"
            }
            ragged = partial["rows"]
            state["rows"] = ragged.values[ragged.group == group].reshape(-1, 3)
            states[step] = state if step not in states else merge_states(states[step], state, REDUCTIONS)
    return states


def _assert_state(actual: dict, expected: dict, where: str) -> None:
    assert set(actual) == set(expected)
    for name in expected:
        a, e = np.asarray(actual[name]), np.asarray(expected[name])
        if name == "rows":  # concatenation order within a step follows the merge order; the set is what counts
            a, e = a[np.lexsort(a.T[::-1])] if a.size else a, e[np.lexsort(e.T[::-1])] if e.size else e
        assert a.shape == e.shape, f"{where} {name}: {a.shape} != {e.shape}"
        np.testing.assert_allclose(a, e, rtol=RTOL, atol=1e-13, err_msg=f"{where} {name}")


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), shards=st.integers(1, 4))
def test_table_equals_one_state_per_step_whatever_the_chunking_and_merge_order(seed, shards):
    rng = random.Random(seed)
    chunks = [_chunk(rng) for _ in range(rng.randint(1, 8))]
    expected = _reference(chunks)
    dealt = [_table(chunks[i::shards]) for i in range(shards)]
    rng.shuffle(dealt)
    table = dealt[0]
    for other in dealt[1:]:
        table = table.merged(other)
    assert table.steps.tolist() == sorted(expected)
    for step, state in table.states(block=3):  # blocks that do not divide the steps
        _assert_state(state, expected[step], f"step {step}")
        _assert_state(table.state(step), expected[step], f"state({step})")
    run = None
    for step in sorted(expected):
        run = expected[step] if run is None else merge_states(run, expected[step], REDUCTIONS)
    _assert_state(table.total(), run, "run")
    keep = np.array([step % 2 == 0 for step in table.steps.tolist()])
    for step, state in table.subset(keep).states():
        assert step % 2 == 0
        _assert_state(state, expected[step], f"subset step {step}")


def test_sparse_partials_equal_dense_ones():
    rng = random.Random(5)
    steps, partial = _chunk(rng)
    dense = StateTable.from_groups(REDUCTIONS, steps, partial)
    given_sparse = dict(partial)
    for name in ("pair", "buckets", "bucket_max", "bucket_moments"):
        reduction = REDUCTIONS[name]
        tail = (6,) if reduction == "moments" else ()
        flat = np.asarray(partial[name]).reshape(len(steps), -1, *tail)
        group, bucket = np.nonzero(np.ones(flat.shape[:2], dtype=bool))  # every entry, identities included
        given_sparse[name] = Sparse(group, bucket, flat[group, bucket], SHAPES[name])
    sparse = StateTable.from_groups(REDUCTIONS, steps, given_sparse)
    for (step, mine), (_, theirs) in zip(sparse.states(), dense.states(), strict=True):
        _assert_state(mine, theirs, f"step {step}")


def _families(analysis: Analysis) -> list[StepAccumulator]:
    families = [f for f in vars(analysis).values() if isinstance(f, StepAccumulator)]
    for dialect in analysis.dialect.families.values():
        families += [f for f in getattr(dialect, "families", [dialect]) if isinstance(f, StepAccumulator)]
    return families


def test_finalize_over_columns_gives_the_step_by_step_digits(tmp_path):
    """Families that finalize a block of steps at once give exactly (bit for bit, same key order) what their
    per-step ``_finalize`` gives: steps with rounds pooled, empty rows and a step without any model token."""
    rows = random_rows(seed=8, steps=tuple(range(12)), rows_per_step=5, max_length=30, env_share=0.4)
    rows += tiny_rows(9)
    rows.append(seq_row(3, "empty", [-0.5, -1.0], [-0.4, -1.1], [0, 0]))
    rows.append(seq_row(40, "nothing", [-0.5], [-0.4], [0]))  # a step with no model token
    path = write_sequence_dump(tmp_path / "mixed.parquet", rows, row_group_size=7)
    analysis = Analysis(max_rounds=3, dialects=("verl",))
    run_chunks(
        DumpReader([str(path)], chunk_tokens=97), [analysis.update], torch.device("cpu"), prepare=analysis.prepare
    )
    for family in _families(analysis):
        by_columns = family.finalize_steps()
        one_by_one = {step: family._finalize(state) for step, state in family.store.states()}
        assert list(by_columns) == list(one_by_one)
        for step, expected in one_by_one.items():
            actual = by_columns[step]
            assert list(actual) == list(expected), (type(family).__name__, step)
            for key, value in expected.items():
                assert actual[key] == value or (math.isnan(actual[key]) and math.isnan(value)), (key, step)
                assert type(actual[key]) is float


# ------------------------------------------------------------------------------- many tiny steps through every command
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """60 one-row steps, and each of a few steps alone in its own file (the one-step-at-a-time reference)."""
    folder = tmp_path_factory.mktemp("tiny")
    rows = tiny_rows(60)
    alone = {step: str(write_sequence_dump(folder / f"step{step}.parquet", [rows[step]])) for step in (0, 7, 13, 30)}
    return str(write_sequence_dump(folder / "many.parquet", rows, row_group_size=16)), alone


def test_state_of_twenty_thousand_one_row_steps_is_small(tmp_path):
    steps = 20_000
    path = write_sequence_dump(tmp_path / "many.parquet", tiny_rows(steps), row_group_size=4096)
    analysis = Analysis()
    run_chunks(DumpReader([str(path)]), [analysis.update], torch.device("cpu"), prepare=analysis.prepare)
    families = _families(analysis)
    held = sum(family.store.nbytes() for family in families)
    # one dict of float64 arrays per step, as before: every field at its full shape plus ~112 bytes of array header
    old_layout = sum(
        steps * sum(math.prod(shape) * 8 + 112 for shape in family.store.shapes.values()) for family in families
    )
    assert all(len(family.steps) == steps for family in families)
    # ~2 kB a step, whatever the round, position and histogram buckets allow (the exact counts by |δ| added 166 bytes:
    # 10 scalars of the off-policy family, 8 round-bucket fields; the drift family ~0.15 kB: its length bucket and row
    # group, Σ k3 per probability bucket)
    assert held < 2_400 * steps
    assert held * 8 < old_layout, (held, old_layout)


def test_every_step_of_a_many_step_dump_is_what_that_step_alone_gives(tiny):
    many, alone = tiny
    result = rd.analyze(many, device="cpu")
    assert [s.step for s in result.steps] == list(range(60))
    by_step = {s.step: s for s in result.steps}
    for step, path in alone.items():
        single = rd.analyze(path, device="cpu")
        close(by_step[step].metrics, single.steps[0].metrics, f"step {step}")
        close(by_step[step].dialects, single.steps[0].dialects, f"step {step} dialects")
        close([r for r in result.positions if r["step"] == step], [r for r in single.positions if r["step"] == step])


def test_compare_presets_and_sweep_per_step_match_one_step_alone(tiny):
    many, alone = tiny
    comparison = rd.compare_presets(many, device="cpu")
    sweep = threshold_sweep(many, device="cpu")
    sweep_steps = {s.step: s for s in sweep.steps}
    for step, path in alone.items():
        single = rd.compare_presets(path, device="cpu")
        for mine, theirs in zip(comparison.presets, single.presets, strict=True):
            close(next(s for s in mine.steps if s.step == step).metrics, theirs.steps[0].metrics, f"{mine.name} {step}")
        single_sweep = threshold_sweep(path, device="cpu")
        close(sweep_steps[step].to_json(), single_sweep.steps[0].to_json(), f"sweep {step}")


def test_check_diff_and_report_handle_many_steps(tiny):
    many, _ = tiny
    checked = check_run(many, [Gate("rollout_corr/k3_kl", "max", 10.0)], per_step=True, device="cpu")
    assert sorted(o.step for o in checked.outcomes if o.step is not None) == list(range(60))
    compared = diff_runs(many, steps_a=(0, 29), steps_b=(30, 59), device="cpu", replicates=100)
    assert compared.to_json()
    analysis, comparison = rd.analyze_and_compare(many, device="cpu")
    html = render_report(analysis, comparison=comparison)
    assert "<html" in html.lower()


# ------------------------------------------------------------------------------- anomalies, vectorised over steps
def _anomalies_one_step_at_a_time(steps, metrics=trends.ANOMALY_METRICS, factor=3.0, window=30, spread=5.0):
    found = []
    for metric in metrics:
        history: list[float] = []
        for step in steps:
            value = step.metrics.get(metric)
            if value is None or math.isnan(value):
                continue
            recent = history[-window:]
            if len(recent) >= trends.ANOMALY_MIN_HISTORY:
                baseline = statistics.median(recent)
                threshold = trends.log_threshold(recent, spread)
                if baseline > 0 and threshold is not None and value > factor * baseline and math.log(value) > threshold:
                    found.append(Anomaly(int(step.step or 0), metric, value, baseline, value / baseline))
            history.append(value)
    return sorted(found, key=lambda a: (-a.factor, a.step, a.metric))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), count=st.integers(0, 90))
def test_find_anomalies_equals_the_step_by_step_rule(seed, count):
    rng = np.random.default_rng(seed)
    steps = []
    for index in range(count):
        metrics = {}
        for key in trends.ANOMALY_METRICS:
            draw = rng.random()
            if draw < 0.1:
                continue
            metrics[key] = (
                math.nan
                if draw < 0.15
                else 0.0
                if draw < 0.2
                else -1.0
                if draw < 0.22
                else float(rng.pareto(1.5) * (1 + 20 * (rng.random() < 0.05)))
            )
        steps.append(StepResult(index, 1, 4, metrics))
    assert trends.find_anomalies(steps) == _anomalies_one_step_at_a_time(steps)


# ------------------------------------------------------------------------------- --workers auto
@pytest.fixture(scope="module")
def split_dump(tmp_path_factory) -> str:
    rows = tiny_rows(48, seed=5)
    return str(write_sequence_dump(tmp_path_factory.mktemp("auto") / "groups.parquet", rows, row_group_size=8))


@pytest.mark.parametrize(
    ("cores", "device", "expected"), [(1, "cpu", 1), (2, "cpu", 1), (4, "cpu", 3), (16, "cpu", 6), (16, "meta", 1)]
)
def test_auto_workers_resolve_as_documented(monkeypatch, split_dump, cores, device, expected):
    monkeypatch.setattr("rollout_diag.cores.available_cores", lambda: cores)
    reader = DumpReader([split_dump])  # 6 row groups
    assert distributed.resolve_workers("auto", reader, torch.device(device)) == expected
    assert distributed.resolve_workers(1, reader, torch.device("cpu")) == 1


def test_auto_workers_give_the_one_process_result(monkeypatch, split_dump):
    calls = []
    real = distributed.run_parts

    def counting(reader, workers, *args, **kwargs):
        calls.append(workers)
        return real(reader, workers, *args, **kwargs)

    monkeypatch.setattr("rollout_diag.cores.available_cores", lambda: 4)
    monkeypatch.setattr(distributed, "run_parts", counting)
    one = rd.analyze(split_dump, device="cpu", workers=1)
    auto = rd.analyze(split_dump, device="cpu")  # the default is auto
    assert calls == [3]
    close([s.metrics for s in auto.steps], [s.metrics for s in one.steps])
    close(auto.run.metrics, one.run.metrics)


def test_check_per_step_splits_rows_by_one_sort_with_the_same_digits():
    # decisions.rowmetrics.by_step: one stable sort instead of a scan of every row per step (quadratic at 200 000
    # steps); each step's rows keep their order, so every value is the one a boolean mask per step gives
    from rollout_diag.decisions.rowmetrics import KEY_METRICS, by_step
    from rollout_diag.metrics.rowstats import ROW_SUMS
    from rollout_diag.results import RowStats

    rng = np.random.default_rng(11)
    count = 500
    step = rng.integers(0, 40, count)  # interleaved, as rows of several files arrive
    tokens = rng.integers(0, 30, count).astype(np.float64)
    sums = {name: rng.normal(size=count) * tokens for name in ROW_SUMS}
    sums["abs_log_ratio"] = np.abs(sums["abs_log_ratio"])
    sums["chi2_term"] = np.abs(sums["chi2_term"]) + tokens
    rows = RowStats(step, tokens, sums, {})
    for metric in KEY_METRICS:
        expected = {int(s): metric.value(rows.select(rows.step == s)) for s in np.unique(rows.step)}
        found = by_step(metric, rows)
        assert list(found) == list(expected)
        assert all(found[s] == expected[s] or (found[s] != found[s] and expected[s] != expected[s]) for s in found)
    assert by_step(KEY_METRICS[0], rows.select(np.zeros(count, dtype=bool))) == {}
