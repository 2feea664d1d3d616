"""The Ray backend (optional extra ``rollout-diag[ray]``) gives the one-process result; skipped without Ray."""

from __future__ import annotations

import pytest
from helpers.dumps import random_rows, write_sequence_dump
from helpers.localize import assert_same

import rollout_diag as rd

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    rows = random_rows(7, steps=range(6), rows_per_step=9, max_length=40)
    path = write_sequence_dump(tmp_path_factory.mktemp("ray") / "dump.parquet", rows, row_group_size=5)
    yield str(path)
    ray.shutdown()


def without_places(document: dict) -> dict:
    document = dict(document)
    for key in ("inputs", "warnings"):
        document.pop(key, None)
    return document


def test_analyze_on_ray_workers_equals_one_process(dump):
    local = rd.analyze(dump, device="cpu")
    on_ray = rd.analyze(dump, device="cpu", workers=3, backend="ray")
    # float64 sums merged in another order round differently: equal to 1e-12 relative (assert_same)
    assert_same(without_places(local.to_json()), without_places(on_ray.to_json()))


def test_compare_presets_on_ray_workers_equals_one_process(dump):
    local = rd.compare_presets(dump, ["decoupled_k3_rs", "decoupled_seq_is"], device="cpu")
    on_ray = rd.compare_presets(dump, ["decoupled_k3_rs", "decoupled_seq_is"], device="cpu", workers=2, backend="ray")
    assert_same([p.run.metrics for p in local.presets], [p.run.metrics for p in on_ray.presets])


def test_a_workers_error_arrives_as_the_same_one_line(tmp_path, dump):
    broken = {**random_rows(2, steps=[1], rows_per_step=1)[0], "trainer": None}  # a null list: skipped, or --strict
    bad = write_sequence_dump(tmp_path / "bad.parquet", [*random_rows(1, steps=[0], rows_per_step=4), broken])
    with pytest.raises(rd.DataError) as local:
        rd.analyze(str(bad), device="cpu", strict=True)
    with pytest.raises(rd.DataError) as on_ray:
        rd.analyze(str(bad), device="cpu", strict=True, workers=2, backend="ray")
    assert str(on_ray.value) == str(local.value)


def test_runs_on_ray_equals_one_process(tmp_path_factory, dump):
    """``runs --backend ray``: each run a Ray task, the same result as the runs read one after another (a run's pass
    is whole in one task: the same sums in the same order, so the documents are equal)."""
    from rollout_diag.drivers.runs import RunSpec, compare_dumps

    other = random_rows(8, steps=range(6), rows_per_step=9, max_length=40)
    second = write_sequence_dump(tmp_path_factory.mktemp("ray-runs") / "b.parquet", other, row_group_size=5)
    specs = [
        RunSpec("a", rd.Dump(dump, device="cpu"), {"tp": 8}),
        RunSpec("b", rd.Dump(str(second), device="cpu"), {"tp": 4}),
    ]
    local = compare_dumps(specs, replicates=200, workers=1, metadata_knobs=False)
    on_ray = compare_dumps(specs, replicates=200, workers=2, backend="ray", metadata_knobs=False)
    assert on_ray.to_json() == local.to_json()
    assert on_ray == local
