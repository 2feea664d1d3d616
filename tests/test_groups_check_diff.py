"""``check --by`` and ``diff --by``: every group is judged (and compared) as its rows alone would be.

The reference for a group is the dump filtered with pyarrow to the group's rows: ``check`` on that file gives the
values each group's outcomes must carry, ``diff`` of the two filtered files the values of each group's line
(rtol 1e-12: float64 sums taken in another order).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from xml.etree import ElementTree

import jsonschema
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from helpers.dumps import write_table
from helpers.groups import ENVS, RTOL, env_table

from rollout_diag import analyze
from rollout_diag.cli import app
from rollout_diag.decisions.check import MAX, Gate, load_gates
from rollout_diag.decisions.skipped import SKIPPED_ROW_SHARE as SKIPPED
from rollout_diag.drivers.check import check_run
from rollout_diag.drivers.diff import diff_runs
from rollout_diag.groups import group_name
from tests.helpers.cli import runner

SCHEMAS = Path(__file__).resolve().parent.parent / "schemas"
K3 = "rollout_corr/k3_kl"


@pytest.fixture(scope="module")
def dump(tmp_path_factory) -> tuple[Path, pa.Table]:
    table = env_table()
    return write_table(tmp_path_factory.mktemp("bycheck") / "envs.parquet", table, row_group_size=13), table


def env_mask(table: pa.Table, value: str | None) -> pa.Array:
    column = table.column("env_name")
    return pc.is_null(column) if value is None else pc.equal(column, value)


def filtered(table: pa.Table, value: str | None, folder: Path, name: str) -> Path:
    return write_table(folder / f"{name}.parquet", table.filter(env_mask(table, value)), row_group_size=5)


def close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=RTOL, abs_tol=RTOL)


def one_group_limit(path: Path) -> tuple[str, float]:
    """(the worst environment, a k3_kl limit that only it exceeds: not the run, not another group)."""
    result = analyze(path, device="cpu", by=["env_name"])
    ranked = sorted(result.groups, key=lambda g: -g.metrics[K3])
    below = max(ranked[1].metrics[K3], result.run.metrics[K3])
    assert ranked[0].metrics[K3] > below
    return group_name("env_name", ranked[0].value), (ranked[0].metrics[K3] + below) / 2


def test_every_group_outcome_equals_checking_the_filtered_file(dump, tmp_path):
    path, table = dump
    gates = [*load_gates("default"), Gate(K3, MAX, 1e-3)]
    result = check_run(path, gates, per_step=True, by=["env_name"], device="cpu")
    whole = check_run(path, gates, per_step=True, device="cpu")
    assert [o for o in result.outcomes if o.group is None] == whole.outcomes  # all rows: as without --by
    names = {o.group for o in result.outcomes if o.group is not None}
    assert names == {f"env_name={v}" for v in ENVS} | {"env_name=(null)"}
    for value in [*ENVS, None]:
        name = "env_name=(null)" if value is None else f"env_name={value}"
        alone = check_run(filtered(table, value, tmp_path, str(value)), gates, per_step=True, device="cpu")
        # skipped_row_share is the whole input's: judged on the run, never per group
        expected = {(o.gate.metric, o.gate.limit, o.step): o for o in alone.outcomes if o.gate.metric != SKIPPED}
        mine = {(o.gate.metric, o.gate.limit, o.step): o for o in result.outcomes if o.group == name}
        assert set(mine) == set(expected), name
        for key, outcome in mine.items():
            assert close(outcome.value, expected[key].value), (name, key, outcome.value, expected[key].value)
            assert outcome.status == expected[key].status, (name, key)
    code = [o.step for o in result.outcomes if o.group == "env_name=code" and o.step is not None]
    assert 1 not in code  # no 'code' row in step 1: no outcome there


def test_a_gate_only_one_group_fails_fails_the_check_and_names_it(dump, tmp_path):
    path, _ = dump
    worst, limit = one_group_limit(path)
    plain = runner.invoke(app, ["check", str(path), "--device", "cpu", "--max", f"k3_kl={limit!r}"])
    assert plain.exit_code == 0, plain.output
    out, junit = tmp_path / "check.json", tmp_path / "check.xml"
    args = ["check", str(path), "--device", "cpu", "--max", f"k3_kl={limit!r}", "--by", "env_name", "--by"]
    args += ["reward:sign", "--per-step", "--max", "token_mult_prob_error=1.05", "-f", "json", "-o", str(out)]
    args += ["--junit", str(junit)]
    result = runner.invoke(app, args)
    assert result.exit_code == 3, result.output
    document = json.loads(out.read_text())
    jsonschema.validate(document, json.loads((SCHEMAS / "check.schema.json").read_text()))
    failed_run = [o for o in document["outcomes"] if o["status"] == "fail" and o["step"] is None]
    by_env = [o for o in failed_run if o["metric"] == K3 and not (o["group"] or "").startswith("reward")]
    assert [o["group"] for o in by_env] == [worst]  # neither all rows nor another environment
    assert by_env[0]["message"].startswith(f"{worst} run: {K3}")
    assert {o["group"] for o in document["outcomes"]} >= {None, worst, "reward:sign=negative"}
    suite = ElementTree.parse(junit).getroot().find("testsuite")
    cases = suite.findall("testcase")
    assert len(cases) == len(document["outcomes"]) == int(suite.get("tests"))
    keys = [(case.get("classname"), case.get("name")) for case in cases]
    assert len(set(keys)) == len(keys)
    assert any(
        case.find("failure") is not None and case.get("classname") == f"rollout-diag.{worst}.run" for case in cases
    )


def test_check_table_names_the_failing_group(dump):
    path, _ = dump
    worst, limit = one_group_limit(path)
    result = runner.invoke(
        app,
        ["check", str(path), "--device", "cpu", "--max", f"k3_kl={limit!r}", "--by", "env_name"],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 3
    assert "FAIL: 1 of 2 gates failed, in 1 of 6 checks" in result.output and worst in result.output


# ----------------------------------------------------------------------------------------- diff --by
def same_metric(mine, theirs, where: str) -> None:
    for name in ("a", "b", "difference", "low", "high"):
        assert close(getattr(mine, name), getattr(theirs, name)), (where, mine.metric, name)
    assert mine.verdict == theirs.verdict, (where, mine.metric)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> tuple[Path, pa.Table, Path, pa.Table]:
    folder = tmp_path_factory.mktemp("bydiff")
    a = env_table(0)
    b = env_table(1)
    b = b.filter(pc.fill_null(pc.not_equal(b.column("env_name"), "search"), True))  # no 'search' row in B
    return write_table(folder / "a.parquet", a, row_group_size=13), a, write_table(folder / "b.parquet", b), b


def test_each_group_equals_diffing_the_filtered_files(two_runs, tmp_path):
    path_a, a, path_b, b = two_runs
    result = diff_runs(path_a, path_b, by=["env_name"], device="cpu", replicates=200, seed=3)
    plain = diff_runs(path_a, path_b, device="cpu", replicates=200, seed=3)
    for mine, theirs in zip(result.metrics, plain.metrics, strict=True):  # all rows: as without --by
        same_metric(mine, theirs, "all rows")
    assert {g.value for g in result.groups} == {*ENVS, None}
    for value in ("math", "code", None):
        group = next(g for g in result.groups if g.value == value)
        alone = diff_runs(
            filtered(a, value, tmp_path, f"a{value}"),
            filtered(b, value, tmp_path, f"b{value}"),
            device="cpu",
            replicates=200,
            seed=3,
        )
        assert (group.rows_a, group.rows_b) == (alone.a.result.run.rows, alone.b.result.run.rows)
        assert (group.tokens_a, group.tokens_b) == (alone.a.result.run.tokens, alone.b.result.run.tokens)
        assert [m.metric for m in group.metrics] == [m.metric for m in alone.metrics]
        for mine, theirs in zip(group.metrics, alone.metrics, strict=True):
            same_metric(mine, theirs, str(value))
    search = next(g for g in result.groups if g.value == "search")
    assert search.rows_b == 0 and all(math.isnan(m.b) and m.verdict == "n/a" for m in search.metrics)
    changes = [g.change for g in result.groups if math.isfinite(g.change)]
    assert changes == sorted(changes, reverse=True) and result.groups[-1].value == "search"


def test_one_dump_split_by_steps_groups_equal_the_filtered_file(dump, tmp_path):
    path, table = dump
    result = diff_runs(path, steps_a=(0, 1), steps_b=(2, 4), by=["env_name"], device="cpu", replicates=100)
    for group in result.groups:
        alone = diff_runs(
            filtered(table, group.value, tmp_path, str(group.value)),
            steps_a=(0, 1),
            steps_b=(2, 4),
            device="cpu",
            replicates=100,
        )
        assert (group.rows_a, group.rows_b) == (alone.a.result.run.rows, alone.b.result.run.rows)
        for mine, theirs in zip(group.metrics, alone.metrics, strict=True):
            same_metric(mine, theirs, str(group.value))


def test_diff_by_json_validates_and_the_table_lists_the_groups(two_runs, tmp_path):
    path_a, _, path_b, _ = two_runs
    out = tmp_path / "diff.json"
    args = ["diff", str(path_a), str(path_b), "--device", "cpu", "--replicates", "100", "--by", "env_name"]
    result = runner.invoke(app, [*args, "-f", "json", "-o", str(out)])
    assert result.exit_code == 0, result.output
    document = json.loads(out.read_text())
    jsonschema.validate(document, json.loads((SCHEMAS / "diff.schema.json").read_text()))
    assert {g["value"] for g in document["groups"]} == {*ENVS, None}
    assert all(len(g["metrics"]) == len(document["metrics"]) for g in document["groups"])
    table = runner.invoke(app, args, env={"COLUMNS": "220"})
    assert table.exit_code == 0, table.output
    assert "By env_name, B against A" in table.output
    assert all(name in table.output for name in (*ENVS, "(null)"))


def test_an_unknown_by_column_is_a_one_line_error(two_runs):
    path_a, _, path_b, _ = two_runs
    for args in (
        ["check", str(path_a), "--max", "k3_kl=1", "--by", "env"],
        ["diff", str(path_a), str(path_b), "--by", "env"],
    ):
        result = runner.invoke(app, [*args, "--device", "cpu"])
        assert result.exit_code == 1, result.output
        assert "--by env: no per-row column 'env'" in result.output and "Traceback" not in result.output


def test_group_outcomes_do_not_depend_on_the_chunk_size(dump):
    path, _ = dump
    gates = [*load_gates("default"), Gate(K3, MAX, 1e-3)]
    big = check_run(path, gates, per_step=True, by=["env_name", "reward:sign"], device="cpu")
    small = check_run(path, gates, per_step=True, by=["env_name", "reward:sign"], device="cpu", chunk_tokens=37)
    assert [(o.gate, o.group, o.step, o.status) for o in big.outcomes] == [
        (o.gate, o.group, o.step, o.status) for o in small.outcomes
    ]
    assert all(close(x.value, y.value) for x, y in zip(big.outcomes, small.outcomes, strict=True))
