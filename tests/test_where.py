"""``--where`` and ``--steps`` (rollout_diag/selection.py): the result equals analysing the pre-filtered file; rows
that do not match are left out before their token lists are decoded; bad predicates are one-line errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jsonschema
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from helpers.dumps import random_rows, sequence_table, token_table, write_table
from helpers.groups import assert_close, env_table

from rollout_diag import analyze, compare_presets
from rollout_diag.cli import app
from rollout_diag.errors import ConfigError, DataError
from rollout_diag.io.reader import DumpReader
from rollout_diag.selection import RowSelection, selection
from tests.helpers.cli import runner

SCHEMAS = Path(__file__).resolve().parent.parent / "schemas"


@pytest.fixture(scope="module")
def dump(tmp_path_factory) -> tuple[Path, pa.Table]:
    table = env_table(1)
    return write_table(tmp_path_factory.mktemp("where") / "envs.parquet", table, row_group_size=11), table


def assert_same(result, reference) -> None:
    assert (result.run.rows, result.run.tokens) == (reference.run.rows, reference.run.tokens)
    assert_close(result.run.metrics, reference.run.metrics, "run")
    assert [s.step for s in result.steps] == [s.step for s in reference.steps]
    for mine, theirs in zip(result.steps, reference.steps, strict=True):
        assert_close(mine.metrics, theirs.metrics, f"step {mine.step}")
    assert [(w.sample_id, w.value) for w in result.worst_rows] == [(w.sample_id, w.value) for w in reference.worst_rows]


@pytest.mark.parametrize(
    ("where", "mask"),
    [
        ("reward > 0", lambda t: pc.greater(t["reward"], 0.0)),
        (
            "reward > 0 AND env_name = 'math'",
            lambda t: pc.and_(pc.greater(t["reward"], 0.0), pc.equal(t["env_name"], "math")),
        ),
        ("env_name IS NULL OR flag", lambda t: pc.or_(pc.is_null(t["env_name"]), t["flag"])),
        (
            "env_name IN ('code', 'search') AND step BETWEEN 1 AND 3",
            lambda t: pc.and_(
                pc.is_in(t["env_name"], pa.array(["code", "search"])),
                pc.and_(pc.greater_equal(t["step"], 1), pc.less_equal(t["step"], 3)),
            ),
        ),
    ],
)
def test_where_equals_the_prefiltered_file(dump, tmp_path, where, mask):
    path, table = dump
    filtered = table.filter(pc.fill_null(mask(table), False))
    reference = analyze(write_table(tmp_path / "filtered.parquet", filtered), device="cpu")
    result = analyze(path, device="cpu", where=where)
    assert_same(result, reference)
    assert result.selection == {
        "where": where,
        "rows_kept": filtered.num_rows,
        "rows_left_out": table.num_rows - filtered.num_rows,
    }


def test_steps_equal_the_prefiltered_file(dump, tmp_path):
    path, table = dump
    for first, last in ((1, 3), (None, 2), (3, None), (2, 2)):
        keep = np.ones(table.num_rows, dtype=bool)
        step = table["step"].to_numpy()
        keep &= step >= (first if first is not None else -1)
        keep &= step <= (last if last is not None else 10**9)
        reference = analyze(write_table(tmp_path / "steps.parquet", table.filter(pa.array(keep))), device="cpu")
        result = analyze(path, device="cpu", steps=(first, last))
        assert_same(result, reference)
        assert result.selection["steps"] == [first, last]


def test_where_with_workers_and_groups(dump, tmp_path):
    path, table = dump
    one = analyze(path, device="cpu", where="reward >= 0", by=["env_name"])
    two = analyze(path, device="cpu", where="reward >= 0", by=["env_name"], workers=2)
    assert_same(two, one)
    assert one.selection == two.selection
    math_rows = table.filter(pc.and_(pc.greater_equal(table["reward"], 0.0), pc.equal(table["env_name"], "math")))
    reference = analyze(write_table(tmp_path / "math.parquet", math_rows), device="cpu")
    group = next(g for g in one.groups if g.value == "math")
    assert_close(group.metrics, reference.run.metrics, "math group under --where")


def test_rows_left_out_are_not_decoded(dump, monkeypatch):
    """The reader flattens the token lists only of matching rows: count the rows that reach list flattening."""
    import rollout_diag.io.decode as decode_module

    path, table = dump
    seen = []
    original = decode_module.pc.list_flatten

    def counting(array, *args, **kwargs):
        seen.append(len(array))
        return original(array, *args, **kwargs)

    monkeypatch.setattr(decode_module.pc, "list_flatten", counting)
    result = analyze(path, device="cpu", where="env_name = 'code'")
    matching = pc.sum(pc.fill_null(pc.equal(table["env_name"], "code"), False)).as_py()
    assert result.run.rows == matching
    assert max(seen) <= matching  # every list column flattened held matching rows only
    assert sum(seen) % matching == 0  # rollout, trainer, mask (and token ids, text): each once per matching row


def test_token_layout(tmp_path):
    rows = random_rows(2, steps=(0, 1, 2), rows_per_step=5)
    table = token_table(rows)
    sequences = sorted({(r["step"], r["sample_id"]) for r in rows})
    reward = {key: float(i % 3) - 1.0 for i, key in enumerate(sequences)}
    values = [reward[(s, i)] for s, i in zip(table["step"].to_pylist(), table["sample_id"].to_pylist(), strict=True)]
    path = write_table(tmp_path / "tokens.parquet", table.append_column("reward", pa.array(values)))
    result = analyze(path, device="cpu", where="reward > 0")
    kept = [r for r in rows if reward[(r["step"], r["sample_id"])] > 0]
    reference = analyze(write_table(tmp_path / "kept.parquet", sequence_table(kept)), device="cpu")
    assert_same(result, reference)


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("rewrd > 0", "column 'rewrd': no such per-row column"),
        ("old_log_probs < 0", "column 'old_log_probs': one value per token, not per row"),
        ("env_name > 3", "column 'env_name' is string"),
        ("reward", "not a condition"),
        ("reward >", "not a SQL condition"),
    ],
)
def test_bad_predicates_are_one_line_errors(dump, where, message):
    path, _ = dump
    with pytest.raises(ConfigError, match=message):
        analyze(path, device="cpu", where=where)
    done = runner.invoke(app, ["analyze", str(path), "--where", where])
    assert done.exit_code == 1 and message in done.output and "Traceback" not in done.output
    assert len(done.output.strip().splitlines()) == 1


def test_nothing_matches(dump):
    path, _ = dump
    with pytest.raises(DataError, match="no row matches where 'reward > 99'"):
        analyze(path, device="cpu", where="reward > 99")


def test_selection_sentence():
    from rollout_diag.formatting import selection_sentence

    assert selection_sentence({"steps": [6, None], "rows_kept": 77, "rows_left_out": 691}) == (
        "Rows (steps from 6): 77 kept, 691 left out (not decoded)."
    )
    assert selection_sentence({"where": "x > 0", "steps": [None, 5], "rows_kept": 1, "rows_left_out": 0}) == (
        "Rows (where x > 0, steps up to 5): 1 kept, 0 left out (not decoded)."
    )
    assert "(step 4)" in selection_sentence({"steps": [4, 4]})


def test_selection_arguments():
    assert not RowSelection()
    with pytest.raises(ConfigError, match="first step is after the last"):
        selection(steps=(5, 2))
    with pytest.raises(ConfigError, match="empty predicate"):
        selection(where=" ")


def test_cli_analyze_compare_and_json(dump, tmp_path):
    path, _ = dump
    done = runner.invoke(app, ["analyze", str(path), "--where", "reward > 0", "--steps", "1:3"], env={"COLUMNS": "200"})
    assert done.exit_code == 0, done.output
    assert "Rows (where reward > 0, steps 1 to 3):" in done.output
    out = tmp_path / "result.json"
    done = runner.invoke(app, ["analyze", str(path), "--where", "reward > 0", "--by", "env_name", "-o", str(out)])
    assert done.exit_code == 0, done.output
    document = json.loads(out.read_text())
    jsonschema.validate(document, json.loads((SCHEMAS / "result.schema.json").read_text()))
    assert document["selection"]["where"] == "reward > 0"
    comparison = compare_presets(path, ["decoupled_token_is"], device="cpu", where="reward > 0", by=["env_name"])
    assert comparison.selection["where"] == "reward > 0" and comparison.groups
    from helpers.schema import validator

    validator("comparison.schema.json").validate(json.loads(json.dumps(comparison.to_json(), allow_nan=False)))
    bad = runner.invoke(app, ["compare-presets", str(path), "--steps", "3:1"])
    assert bad.exit_code == 1 and "first step is after the last" in bad.output


def test_reader_hook_is_called_per_batch(dump):
    path, _ = dump
    reader = DumpReader([str(path)])
    reader.select(lambda batch, steps: steps % 2 == 0)
    rows = sum(chunk.rows for chunk, _ in reader.chunks("cpu"))
    assert rows == sum(1 for s in pa.parquet.read_table(path)["step"].to_pylist() if s % 2 == 0)
    assert math.isclose(reader.log.rows_selected_out + rows, reader.log.total_rows)
