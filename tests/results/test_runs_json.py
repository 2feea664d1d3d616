"""``runs --format json`` read back: the RunsResult it was written from (every field, the per-step values too), the
same terminal tables, checked against schemas/runs.schema.json with the one-line errors of the other loaders."""

from __future__ import annotations

import dataclasses
import io
import json
import math

import pytest
from rich.console import Console

import rollout_diag as rd
from rollout_diag.drivers.dump import Dump
from rollout_diag.drivers.runs import RunSpec, compare_dumps
from rollout_diag.errors import InputError
from rollout_diag.render.export import to_json_text
from rollout_diag.render.runs import runs_tables
from rollout_diag.results import RunsResult, load_result, load_results, result_from_json
from tests.helpers.prompts import matched_run_rows, write_prompt_dump
from tests.helpers.runs import write_run
from tests.helpers.schema import validator

KNOBS = {"base": {"r3": "off", "tp": 8}, "r3": {"r3": "on", "tp": 8}, "tp4": {"r3": "off", "tp": 4}}


@pytest.fixture(scope="module")
def knob_runs(tmp_path_factory):
    """Three runs, pair effects, a --max-ratio gate that fails; no prompt identity (prompts null)."""
    root = tmp_path_factory.mktemp("runs-json")
    paths = {
        "base": write_run(root / "base.parquet", 1),
        "r3": write_run(root / "r3.parquet", 2, scale=0.25),
        "tp4": write_run(root / "tp4.parquet", 3, scale=2.0),
    }
    specs = [RunSpec(name, Dump(str(path)), KNOBS[name]) for name, path in paths.items()]
    return compare_dumps(specs, max_ratios={"k3_kl": 2.0}, replicates=200, workers=1, metadata_knobs=False)


@pytest.fixture(scope="module")
def prompt_runs(tmp_path_factory):
    """Three runs sharing prompts, two planted outliers: the prompts matched across runs are in the document."""
    root = tmp_path_factory.mktemp("runs-prompts-json")
    specs = [
        RunSpec(name, Dump(str(write_prompt_dump(root / f"{name}.parquet", matched_run_rows(seed, planted=2)))), {})
        for name, seed in (("base", 1), ("tp4", 2), ("fp8", 3))
    ]
    return compare_dumps(specs, replicates=200, workers=1, metadata_knobs=False)


def _terminal(result: RunsResult) -> str:
    sink = io.StringIO()
    Console(file=sink, width=100, color_system=None, soft_wrap=False).print(runs_tables(result))
    return sink.getvalue()


def _saved(result: RunsResult, path) -> None:
    path.write_text(to_json_text(result.to_json()), encoding="utf-8")  # what `runs -f json -o FILE` writes


@pytest.mark.parametrize("fixture", ["knob_runs", "prompt_runs"])
def test_write_load_equal(fixture, request, tmp_path):
    original = request.getfixturevalue(fixture)
    path = tmp_path / "runs.json"
    _saved(original, path)
    validator("runs.schema.json").validate(json.loads(path.read_text(encoding="utf-8")))
    loaded = load_result(path)
    assert isinstance(loaded, RunsResult)
    assert loaded == original  # every field, the per-step arrays included
    assert loaded.step_records() == original.step_records()  # the Parquet export's rows
    assert _terminal(loaded) == _terminal(original)
    assert to_json_text(loaded.to_json()) == path.read_text(encoding="utf-8")
    assert rd.load_result(str(path)) == original  # the library's name
    assert result_from_json(json.loads(path.read_text(encoding="utf-8"))) == original


def test_what_the_fixtures_cover(knob_runs, prompt_runs):
    assert knob_runs.gates and not knob_runs.passed and knob_runs.prompts is None
    assert {effect.method for effect in knob_runs.effects} == {"pair"}
    assert any(effect.difference is not None for effect in knob_runs.effects)
    assert prompt_runs.prompts is not None and prompt_runs.prompts.listed
    assert all(len(steps.step) > 1 for steps in knob_runs.steps)


def test_a_document_without_steps_reads_back_without_them(knob_runs):
    document = knob_runs.to_json()
    del document["steps"]  # as written before the per-step values were in it
    loaded = RunsResult.from_json(document)
    assert loaded.steps == [] and loaded.runs == knob_runs.runs and loaded.effects == knob_runs.effects


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda d: d["runs"][1].update(rows="3"),
            "field 'runs[1].rows': expected a whole number, found a string ('3').",
        ),
        (lambda d: d["effects"][0].pop("knob"), "field 'effects[0].knob': missing."),
        (lambda d: d.pop("baseline"), "field 'baseline': missing."),
        (lambda d: d["bootstrap"].update(level=2), "field 'bootstrap.level': expected < 1, found a number (2)."),
        (lambda d: d["steps"][0].update(rows=[1]), "field 'steps': run 'base' has"),
        (lambda d: d.update(schema_version=99), "result has schema_version 99"),
    ],
)
def test_a_bad_document_is_one_line_naming_the_file_and_field(knob_runs, tmp_path, change, message):
    document = json.loads(to_json_text(knob_runs.to_json()))
    change(document)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(InputError) as caught:
        load_result(path)
    text = str(caught.value)
    assert "\n" not in text.strip()
    assert text.startswith(f"{path}: not a `runs --format json` result: ")
    assert message in text


def test_unreadable_and_other_documents(tmp_path, knob_runs):
    broken = tmp_path / "broken.json"
    broken.write_text("{", encoding="utf-8")
    with pytest.raises(InputError) as caught:
        load_result(broken)
    assert str(caught.value).startswith(f"{broken}: not a readable JSON file")
    other = tmp_path / "other.json"
    other.write_text('{"rows": []}', encoding="utf-8")
    with pytest.raises(InputError) as caught:
        load_result(other)
    assert str(caught.value) == f"{other}: not the --format json output of analyze, compare-presets or runs."
    saved = tmp_path / "runs.json"
    _saved(knob_runs, saved)
    with pytest.raises(InputError) as caught:
        load_results([saved])  # the analysis report's loader takes one analyze and one compare-presets result
    assert str(caught.value).startswith(f"{saved}: a `runs` result; its report is drawn by `runs --report`")


def test_values_without_a_number_come_back_as_nan_and_print_alike(knob_runs, tmp_path):
    """NaN and ±inf are written as null (schema: number or null) and read as NaN: the document and the tables of the
    loaded result are the original's."""
    run = knob_runs.runs[1]
    nan_metric = dataclasses.replace(run.metrics[0], value=math.nan, low=-math.inf, high=math.inf)
    runs = [*knob_runs.runs[:1], dataclasses.replace(run, metrics=[nan_metric, *run.metrics[1:]]), *knob_runs.runs[2:]]
    effects = [dataclasses.replace(knob_runs.effects[0], low=-math.inf, high=2.0), *knob_runs.effects[1:]]
    gates = [dataclasses.replace(knob_runs.gates[0], ratio=math.nan), *knob_runs.gates[1:]]
    original = dataclasses.replace(knob_runs, runs=runs, effects=effects, gates=gates)
    path = tmp_path / "runs.json"
    _saved(original, path)
    loaded = load_result(path)
    assert isinstance(loaded, RunsResult)
    assert math.isnan(loaded.runs[1].metrics[0].value) and math.isnan(loaded.effects[0].low)
    assert to_json_text(loaded.to_json()) == path.read_text(encoding="utf-8")
    assert _terminal(loaded) == _terminal(original)
