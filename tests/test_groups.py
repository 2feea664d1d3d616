"""``--by`` (rollout_diag/groups.py): every group's metrics equal analysing that group's rows alone.

The reference for a group is the dump filtered with pyarrow to the group's rows and analysed by itself: the run
metrics and each step's metrics must agree at rtol 1e-12 (float64 sums taken in another order), whatever the
chunk size, the worker count, groups missing from some steps and null group values.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import jsonschema
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from helpers.dumps import random_rows, sequence_table, write_table
from helpers.groups import ENVS, assert_close, env_table
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout_diag import analyze, catalogue
from rollout_diag.cli import app
from rollout_diag.errors import ConfigError
from rollout_diag.groups import GroupSpec, parse_by
from rollout_diag.results import AnalysisResult
from tests.helpers.cli import runner

SCHEMA = Path(__file__).resolve().parent.parent / "schemas" / "result.schema.json"


@pytest.fixture(scope="module")
def dump(tmp_path_factory) -> tuple[Path, pa.Table]:
    table = env_table()
    path = write_table(tmp_path_factory.mktemp("groups") / "envs.parquet", table, row_group_size=13)
    return path, table


def alone(table: pa.Table, mask: pa.Array, folder: Path, name: str) -> AnalysisResult:
    path = write_table(folder / f"{name}.parquet", table.filter(mask), row_group_size=5)
    return analyze(path, device="cpu", chunk_tokens=64)


def assert_group_is_alone(group, reference: AnalysisResult) -> None:
    where = f"{group.column}={group.value}"
    assert (group.rows, group.tokens) == (reference.run.rows, reference.run.tokens), where
    assert_close(group.metrics, reference.run.metrics, where)
    # every family the group carries is there in full: only the localisation family (diag/) is left out, but for the
    # off-policy family's exact counts (bitwise-differing tokens, max |δ|)
    counts = {catalogue.MISMATCHED_TOKENS.key, catalogue.MISMATCHED_TOKEN_SHARE.key, catalogue.MAX_ABS_DELTA.key}
    expected = {k for k in reference.run.metrics if not k.startswith("diag/") or k in counts}
    assert expected == set(group.metrics), where
    assert [s.step for s in group.steps] == [s.step for s in reference.steps], where
    for mine, theirs in zip(group.steps, reference.steps, strict=True):
        assert (mine.rows, mine.tokens, mine.empty_rows) == (theirs.rows, theirs.tokens, theirs.empty_rows)
        assert_close(mine.metrics, theirs.metrics, f"{where} step {mine.step}")


def test_each_environment_equals_its_filtered_file(dump, tmp_path):
    path, table = dump
    result = analyze(path, device="cpu", by=["env_name"])
    values = [g.value for g in result.groups]
    assert sorted(values, key=str) == sorted([*ENVS, None], key=str)
    for group in result.groups:
        column = table.column("env_name")
        mask = pc.is_null(column) if group.value is None else pc.equal(column, group.value)
        assert_group_is_alone(group, alone(table, mask, tmp_path, str(group.value)))
    code = next(g for g in result.groups if g.value == "code")
    assert 1 not in [s.step for s in code.steps]  # empty in step 1: absent there, as in the filtered file
    assert sum(g.rows for g in result.groups) == result.run.rows
    assert sum(g.tokens for g in result.groups) == result.run.tokens
    assert math.isclose(sum(g.token_share for g in result.groups), 1.0)


def test_the_whole_result_does_not_change_with_by(dump):
    path, _ = dump
    plain, grouped = analyze(path, device="cpu"), analyze(path, device="cpu", by=["env_name", "reward:sign"])
    assert plain.run == grouped.run and plain.steps == grouped.steps and plain.verdicts == grouped.verdicts


def test_sign_and_bins_equal_filtering_by_value(dump, tmp_path):
    path, table = dump
    result = analyze(path, device="cpu", by=["reward:sign", "reward:bins=-0.5,0.5"])
    reward = table.column("reward")
    masks = {
        ("reward:sign", "negative"): pc.less(reward, 0.0),
        ("reward:sign", "zero"): pc.equal(reward, 0.0),
        ("reward:sign", "positive"): pc.greater(reward, 0.0),
        ("reward:bins=-0.5,0.5", "< -0.5"): pc.less(reward, -0.5),
        ("reward:bins=-0.5,0.5", "[-0.5, 0.5)"): pc.and_(pc.greater_equal(reward, -0.5), pc.less(reward, 0.5)),
        ("reward:bins=-0.5,0.5", ">= 0.5"): pc.greater_equal(reward, 0.5),
    }
    assert {(g.column, g.value) for g in result.groups} == set(masks)
    for group in result.groups:
        assert_group_is_alone(group, alone(table, masks[group.column, group.value], tmp_path, "bucket"))


def test_derived_response_length(dump, tmp_path):
    path, table = dump
    result = analyze(path, device="cpu", by=["response_length:bins=10"])
    masks = np.array([sum(row) for row in table.column("response_mask").to_pylist()])
    for group in result.groups:
        keep = masks < 10 if group.value == "< 10" else masks >= 10
        assert_group_is_alone(group, alone(table, pa.array(keep), tmp_path, "length"))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chunk_tokens=st.integers(min_value=7, max_value=900))
def test_chunk_size_changes_no_group(dump, chunk_tokens):
    path, _ = dump
    whole = analyze(path, device="cpu", by=["env_name"])
    chunked = analyze(path, device="cpu", by=["env_name"], chunk_tokens=chunk_tokens)
    assert [g.value for g in whole.groups] == [g.value for g in chunked.groups]
    for mine, theirs in zip(chunked.groups, whole.groups, strict=True):
        assert (mine.rows, mine.tokens) == (theirs.rows, theirs.tokens)
        assert_close(mine.metrics, theirs.metrics, f"chunk {chunk_tokens}")
        for a, b in zip(mine.steps, theirs.steps, strict=True):
            assert_close(a.metrics, b.metrics, f"chunk {chunk_tokens} step {a.step}")


def test_workers_change_no_group(dump):
    path, _ = dump
    one = analyze(path, device="cpu", by=["env_name"])
    three = analyze(path, device="cpu", by=["env_name"], workers=3)
    assert [(g.value, g.rows) for g in one.groups] == [(g.value, g.rows) for g in three.groups]
    for mine, theirs in zip(three.groups, one.groups, strict=True):
        assert_close(mine.metrics, theirs.metrics, "workers")


def test_a_file_without_the_column_is_the_null_group(dump, tmp_path):
    path, table = dump
    other = write_table(tmp_path / "other.parquet", sequence_table(random_rows(9, steps=(7,), rows_per_step=3)))
    result = analyze([path, other], device="cpu", by=["env_name"])
    null = next(g for g in result.groups if g.value is None)
    assert 7 in [s.step for s in null.steps] and null.rows == table.column("env_name").null_count + 3


def test_groups_in_json_match_the_schema_and_read_back(dump):
    path, _ = dump
    result = analyze(path, device="cpu", by=["env_name", "flag"])
    document = json.loads(json.dumps(result.to_json(), allow_nan=False))
    jsonschema.validate(document, json.loads(SCHEMA.read_text()))
    again = AnalysisResult.from_json(document)
    assert [(g.column, g.value, g.rows) for g in again.groups] == [(g.column, g.value, g.rows) for g in result.groups]
    assert {g.value for g in result.groups if g.column == "flag"} == {True, False}
    for group in result.groups:
        assert group.verdict["level"] in ("ok", "watch", "bad", "n/a") and group.verdict["sentence"]


def test_worst_group_first(dump):
    path, _ = dump
    order = {"bad": 0, "watch": 1, "ok": 2, "n/a": 3}
    groups = analyze(path, device="cpu", by=["env_name"]).groups
    keys = [(order[g.verdict["level"]], -g.metrics["rollout_corr/k3_kl"]) for g in groups]
    assert keys == sorted(keys)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("env_name", GroupSpec("env_name")),
        ("reward:sign", GroupSpec("reward", "sign")),
        ("response_length:bins=100,1000", GroupSpec("response_length", "bins", (100.0, 1000.0))),
    ],
)
def test_parse_by(text, expected):
    assert parse_by(text) == expected
    assert parse_by(text).label == text


@pytest.mark.parametrize("text", ["", ":sign", "reward:quartiles", "reward:bins=", "reward:bins=3,1", "x:bins=a"])
def test_parse_by_rejects(text):
    with pytest.raises(ConfigError, match="by"):
        parse_by(text)


def test_cli_table_and_errors(dump):
    path, _ = dump
    done = runner.invoke(app, ["analyze", str(path), "--by", "env_name"], env={"COLUMNS": "200"})
    assert done.exit_code == 0, done.output
    assert "By env_name (worst group first)" in done.output and "(null)" in done.output
    assert "Where: env_name=" in done.output
    unknown = runner.invoke(app, ["analyze", str(path), "--by", "environment"])
    assert unknown.exit_code == 1
    assert "no per-row column 'environment'" in unknown.output and "Traceback" not in unknown.output
    wrong = runner.invoke(app, ["analyze", str(path), "--by", "env_name:sign"])
    assert wrong.exit_code == 1 and "env_name:sign buckets numbers" in wrong.output


def test_groups_shown_are_capped_never_silently(tmp_path):
    rows = random_rows(3, steps=(0,), rows_per_step=30)
    table = sequence_table(rows).append_column("tag", pa.array([f"t{i:02d}" for i in range(30)]))
    path = write_table(tmp_path / "tags.parquet", table)
    done = runner.invoke(app, ["analyze", str(path), "--by", "tag"], env={"COLUMNS": "200"})
    assert done.exit_code == 0, done.output
    assert "+18 more group(s) of tag not shown" in done.output
    assert len(analyze(path, device="cpu", by=["tag"]).groups) == 30


def test_report_section_and_compare_presets(dump, tmp_path):
    from rollout_diag import compare_presets
    from rollout_diag.report import render_report

    path, _ = dump
    result = analyze(path, device="cpu", by=["env_name"])
    page = render_report(result)
    assert "Which group diverges?" in page and "groups-0-bars" in page and "groups-0-steps" in page
    assert "Which group diverges?" not in render_report(analyze(path, device="cpu"))
    comparison = compare_presets(path, ["decoupled_token_is"], device="cpu", by=["env_name"])
    assert [(g.value, g.rows) for g in comparison.groups] == [(g.value, g.rows) for g in result.groups]
    for mine, theirs in zip(comparison.groups, result.groups, strict=True):
        assert_close(mine.metrics, theirs.metrics, "compare-presets")
    done = runner.invoke(app, ["report", str(path), "--by", "env_name", "-o", str(tmp_path / "r.html")])
    assert done.exit_code == 0, done.output
    assert "Which group diverges?" in (tmp_path / "r.html").read_text()


def test_the_worst_group_is_named_on_the_first_screen(dump):
    from rollout_diag.render.analysis import first_screen
    from rollout_diag.results.wording import worst_group_line

    path, _ = dump
    result = analyze(path, device="cpu", by=["env_name", "reward:sign"])
    where = next(str(line) for line in first_screen(result) if str(line).startswith("Where: "))
    # the worst group of each spec (the first of its groups, worst first), beside the worst step, row and token
    for column in ("env_name", "reward:sign"):
        worst = next(g for g in result.groups if g.column == column)
        assert worst_group_line([worst]) in where
    plain = analyze(path, device="cpu")
    assert "is the worst group" not in " ".join(str(line) for line in first_screen(plain))  # without --by: none
