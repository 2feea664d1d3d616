"""JSON output and dump files against the schemas in schemas/."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pyarrow.parquet as pq
import pytest
from helpers.schema import schema, validator

import rollout_diag as rd

SAMPLES = sorted((Path(__file__).resolve().parents[2] / "sample_data").glob("*.parquet"))


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_analyze_json_matches_the_result_schema(sample):
    document = json.loads(json.dumps(rd.analyze(str(sample), device="cpu").to_json(), allow_nan=False))
    jsonschema.validate(document, schema("result.schema.json"))


def test_the_schema_rejects_what_it_should():
    document = rd.analyze(str(SAMPLES[0]), device="cpu").to_json()
    document["run"]["metrics"]["not a metric"] = 1.0
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(document, schema("result.schema.json"))


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_sample_rows_match_the_dump_schema(sample):
    rows = pq.ParquetFile(sample).read_row_group(0).slice(0, 5).to_pylist()
    for row in rows:
        jsonschema.validate(row, schema("dump.schema.json"))


def test_compare_presets_json_matches_its_schema():
    comparison = rd.compare_presets(str(SAMPLES[0]), ["all"], device="cpu")
    document = json.loads(json.dumps(comparison.to_json(), allow_nan=False))
    validator("comparison.schema.json").validate(document)
    document["presets"][0]["run"]["metrics"]["training/x"] = 1.0  # not a preset metric family
    with pytest.raises(jsonschema.ValidationError):
        validator("comparison.schema.json").validate(document)


def test_sweep_json_matches_its_schema():
    document = json.loads(json.dumps(rd.threshold_sweep(str(SAMPLES[0]), device="cpu").to_json(), allow_nan=False))
    validator("sweep.schema.json").validate(document)
