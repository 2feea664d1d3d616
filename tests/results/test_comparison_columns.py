"""The ``compare-presets --format json`` document of schema version 2: per-step values as columns (issue 20: 200 000
steps × 25 presets were ~12 GB as one object per step and preset). The top-level ``steps`` holds each step's counts
and §1 metrics once, each preset's ``steps`` its own keys; checked against the schema, against the Python objects
value for value, through the loader (and version 1 documents), and for one-line errors on a bad document."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jsonschema
import numpy as np
import polars as pl
import pytest
from helpers.cli import error_line, invoke, succeeded
from helpers.compare import _Corrections, comparison_text
from helpers.dumps import seq_row, write_sequence_dump
from helpers.schema import validator
from helpers.steps import tiny_rows

from rollout_diag.drivers.compare import compare_presets
from rollout_diag.errors import InputError
from rollout_diag.metrics.outcome import PresetSteps
from rollout_diag.render.export import comparison_json_pieces
from rollout_diag.results import (
    FIRST_SECTION,
    SCHEMA_VERSION,
    ComparisonResult,
    MetricColumns,
    PresetResult,
    PresetTable,
    StepResult,
    StepTable,
    load_results,
    result_from_json,
)

SAMPLE = Path(__file__).resolve().parents[2] / "sample_data" / "synthetic_multiturn.parquet"


@pytest.fixture(scope="module")
def odd_dump(tmp_path_factory) -> Path:
    """Tiny one-row steps, then a step without a model token (every value absent), a one-token step and a step
    without mismatch."""
    rows = tiny_rows(20)
    rows.append(seq_row(20, "masked", [-0.5, -0.2], [-0.4, -0.3], [0, 0]))
    rows.append(seq_row(21, "one", [-0.5], [-0.4], [1]))
    rows.append(seq_row(22, "same", [-0.5, -1.0], [-0.5, -1.0], [1, 1]))
    return write_sequence_dump(tmp_path_factory.mktemp("columns") / "odd.parquet", rows, row_group_size=7)


@pytest.fixture(scope="module")
def odd(odd_dump: Path) -> ComparisonResult:
    return compare_presets(str(odd_dump), device="cpu", workers=1)


def _text(result: ComparisonResult) -> str:
    return "".join(comparison_json_pieces(result))


def test_the_document_matches_the_schema(odd: ComparisonResult) -> None:
    document = json.loads(_text(odd))
    assert document["schema_version"] == SCHEMA_VERSION == 2
    validator("comparison.schema.json").validate(document)
    for bad in (
        lambda d: d["steps"].update({"summary/x": [None] * len(d["steps"]["step"])}),  # not a §1 key
        lambda d: d["presets"][0]["steps"].update({"training/x": [1.0] * len(d["steps"]["step"])}),
        lambda d: d["presets"][0]["steps"].pop("step"),
        lambda d: d["steps"]["rows"].__setitem__(0, None),
        lambda d: d.pop("steps"),
    ):
        broken = json.loads(_text(odd))
        bad(broken)
        with pytest.raises(jsonschema.ValidationError):
            validator("comparison.schema.json").validate(broken)


def test_the_columns_are_the_steps_value_for_value(odd: ComparisonResult) -> None:
    document = json.loads(_text(odd))
    top = document["steps"]
    first = list(odd.presets[0].steps)
    assert top["step"] == [step.step for step in first] == list(range(23))
    assert top["rows"] == [step.rows for step in first] and top["tokens"] == [step.tokens for step in first]
    assert top["empty_rows"] == [step.empty_rows for step in first]
    assert set(top) - {"step", "rows", "tokens", "empty_rows"} == FIRST_SECTION  # the 13 §1 keys, once
    assert top["rollout_corr/k3_kl"][20] is None  # the step without a model token has no value
    for preset, written in zip(odd.presets, document["presets"], strict=True):
        own = written["steps"]
        assert own["step"] == top["step"]
        assert not FIRST_SECTION & set(own)  # no preset repeats a §1 column
        steps = list(preset.steps)
        keys = {name: None for step in steps for name in step.metrics}
        assert set(keys) == (set(own) | FIRST_SECTION) - {"step"}
        for name in keys:
            column = top[name] if name in FIRST_SECTION else own[name]
            assert column == [step.metrics.get(name) for step in steps], (preset.name, name)  # no NaN on this data


def test_a_preset_loads_into_one_dataframe(odd: ComparisonResult) -> None:
    document = json.loads(_text(odd))
    frame = pl.DataFrame(document["presets"][3]["steps"])
    assert frame.height == 23 and frame.columns[0] == "step"
    assert frame.filter(pl.col("step") == 20).null_count().row(0)[1:] == (1,) * (frame.width - 1)
    both = pl.DataFrame(document["steps"]).join(frame, on="step")
    assert both.height == 23 and "rollout_corr/k3_kl" in both.columns


@pytest.mark.parametrize("source", ["odd", "sample"])
def test_the_document_reads_back(source: str, odd: ComparisonResult) -> None:
    result = odd if source == "odd" else compare_presets(str(SAMPLE), device="cpu", presets=["verl", "legacy"])
    text = _text(result)
    assert text == comparison_text(result.to_json())
    again = result_from_json(json.loads(text))
    assert isinstance(again, ComparisonResult)
    for mine, theirs in zip(result.presets, again.presets, strict=True):
        assert isinstance(theirs.steps, PresetTable)
        assert theirs.steps == list(mine.steps) and list(mine.steps) == theirs.steps, mine.name
        assert [list(step.metrics) for step in theirs.steps] == [list(step.metrics) for step in mine.steps]
        assert theirs.run == mine.run and theirs.config == mine.config
    assert again.recommendation == result.recommendation and again.step_levels == result.step_levels
    assert _text(again) == text  # written again: the same bytes


def test_a_version_1_document_still_loads(odd: ComparisonResult) -> None:
    """Version 1 wrote each preset's steps as a list of step objects (``PresetResult.to_json``)."""
    current = odd.to_json()
    old = {**current, "schema_version": 1, "presets": [preset.to_json() for preset in odd.presets]}
    del old["steps"]
    assert (
        isinstance(old["presets"][0]["steps"], list)
        and "rollout_corr/k3_kl" in old["presets"][0]["steps"][0]["metrics"]
    )
    read = ComparisonResult.from_json(json.loads(json.dumps(old)))
    for mine, theirs in zip(odd.presets, read.presets, strict=True):
        assert theirs.steps == list(mine.steps)
    assert _text(read) == _text(odd)  # written again as version 2: the same document


def test_a_preset_value_of_a_first_section_key_is_laid_over_it() -> None:
    """``with_metrics``: a part reporting a §1 key (none of verl's does) writes it in the preset's columns, where
    it has a value; read back, the step holds the preset's value in the §1 key's place."""
    groups = [(np.ones(3, dtype=bool), {"rollout_corr/k3_kl": np.array([1.0, 2.0, 3.0]), "training/x": np.zeros(3)})]
    base = StepTable(np.array([3, 4, 5]), np.ones(3), np.ones(3), np.zeros(3), MetricColumns(groups, 3))
    part = (
        np.array([4, 5]),
        [
            (
                np.array([True, False]),
                {"summary/y": np.array([5.0, 6.0]), "rollout_corr/k3_kl": np.array([math.inf, 9.0])},
            )
        ],
    )
    steps = PresetSteps(base, _Corrections([part]), "p")  # type: ignore[arg-type]
    config = dict.fromkeys(("rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize", "rollout_rs"))
    config["rollout_rs_threshold"] = None  # the settings every preset's config names (comparison.schema.json)
    preset = PresetResult("p", config, "m", steps, StepResult(None, 3, 3, {}))  # type: ignore[arg-type]
    result = ComparisonResult(["x"], {}, [preset], layout="sequence")
    document = json.loads(_text(result))
    assert document["steps"] == {
        "step": [3, 4, 5],
        "rows": [1, 1, 1],
        "tokens": [1, 1, 1],
        "empty_rows": [0, 0, 0],
        "rollout_corr/k3_kl": [1.0, 2.0, 3.0],
    }
    assert document["presets"][0]["steps"] == {
        "step": [3, 4, 5],
        "summary/y": [None, 5.0, None],
        "rollout_corr/k3_kl": [None, None, None],  # inf at step 4: null, as JSON writes a non-finite value
    }
    read = ComparisonResult.from_json(document).presets[0].steps
    assert [dict(step.metrics) for step in read] == [
        {"rollout_corr/k3_kl": 1.0},
        {"rollout_corr/k3_kl": 2.0, "summary/y": 5.0},  # null reads as no value: the §1 one shows through
        {"rollout_corr/k3_kl": 3.0},
    ]
    assert [dict(step.metrics) for step in steps][1] == {"rollout_corr/k3_kl": math.inf, "summary/y": 5.0}


def test_presets_of_other_steps_are_refused() -> None:
    one = PresetResult("a", {}, "m", [StepResult(0, 1, 1, {})], StepResult(None, 1, 1, {}))
    two = PresetResult("b", {}, "m", [StepResult(1, 1, 1, {})], StepResult(None, 1, 1, {}))
    with pytest.raises(ValueError, match="'b' holds other steps than 'a'"):
        ComparisonResult(["x"], {}, [one, two]).to_json()


def test_shared_columns_are_formatted_once_within_the_budget(odd: ComparisonResult, monkeypatch) -> None:
    """Presets that share a part write its columns from one text; with no budget for kept texts each is formatted
    again: the same bytes."""
    import rollout_diag.render.export as export

    made = []
    original = export.column_text

    def counted(column):
        made.append(column.identity)
        return original(column)

    monkeypatch.setattr(export, "column_text", counted)
    shared = _text(odd)
    once = len(made)
    monkeypatch.setattr(export, "TEXT_BUDGET", 0)
    assert _text(odd) == shared
    document = json.loads(shared)
    written = len(document["steps"]) + sum(len(preset["steps"]) for preset in document["presets"])
    assert len(made) - once == written and once < written / 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(schema_version=3), "schema_version 3, this rollout-diag reads up to 2: upgrade"),
        (lambda d: d.update(schema_version="2"), "field 'schema_version': expected a whole number"),
        (lambda d: d.pop("steps"), "field 'steps': missing"),
        (lambda d: d["steps"].update(rows=[1]), "field 'steps.rows': expected 23 values (one per step), found 1"),
        (
            lambda d: d["presets"][1]["steps"]["summary/tokens_kept"].pop(),
            "field 'presets[1].steps.summary/tokens_kept': expected 23 values (one per step), found 22",
        ),
        (
            lambda d: d["presets"][0]["steps"]["summary/tokens_kept"].__setitem__(2, "x"),
            "field 'presets[0].steps.summary/tokens_kept[2]': expected a number, found a string",
        ),
        (lambda d: d["presets"][0]["steps"].pop("step"), "field 'presets[0].steps.step': missing"),
        (
            lambda d: d["presets"][0]["steps"]["step"].reverse(),
            "field 'presets[0].steps.step': expected the steps of the top-level 'steps.step'",
        ),
        (lambda d: d["presets"][0].update(steps=[]), "field 'presets[0].steps': expected an object, found a list"),
        (lambda d: d["presets"][0].pop("name"), "field 'presets[0].name': missing"),
    ],
)
def test_a_bad_document_is_one_line(odd: ComparisonResult, tmp_path: Path, change, message: str) -> None:
    document = json.loads(_text(odd))
    change(document)
    with pytest.raises(InputError) as caught:
        ComparisonResult.from_json(document)
    assert caught.value.message.startswith("not a `compare-presets --format json` result: ")
    assert message in caught.value.message and "\n" not in caught.value.message
    saved = tmp_path / "c.json"
    saved.write_text(json.dumps(document))
    with pytest.raises(InputError) as caught:
        load_results([saved])
    assert caught.value.message.startswith(f"{saved}: ") and message in caught.value.message
    assert message in error_line(invoke("report", "--from-json", saved, "-o", tmp_path / "r.html"))


def test_the_cli_writes_the_columns_and_the_report_reads_them(odd_dump: Path, tmp_path: Path) -> None:
    saved = tmp_path / "c.json"
    succeeded(invoke("compare-presets", odd_dump, "--device", "cpu", "-f", "json", "-o", saved))
    document = json.loads(saved.read_text())
    validator("comparison.schema.json").validate(document)
    assert saved.read_text() == comparison_text(document)
    assert document["presets"][0]["steps"]["step"] == list(range(23))
    succeeded(invoke("report", "--from-json", saved, "-o", tmp_path / "r.html"))
    assert "<html" in (tmp_path / "r.html").read_text()[:500]
