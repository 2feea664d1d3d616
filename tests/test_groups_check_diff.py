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
from dumps import write_table
from test_groups import ENVS, RTOL, env_table
from typer.testing import CliRunner

from rollout_diag import analyze
from rollout_diag.cli import app
from rollout_diag.decisions.check import MAX, Gate, load_gates
from rollout_diag.engine import check_run
from rollout_diag.groups import group_name

SCHEMAS = Path(__file__).resolve().parent.parent / "schemas"
K3 = "rollout_corr/k3_kl"
runner = CliRunner()


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
        expected = {(o.gate.metric, o.gate.limit, o.step): o for o in alone.outcomes}
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
    assert "FAIL: 1 of 5 checks failed" in result.output and worst in result.output
