"""Bad input, end to end through the CLI (issue 3, "Bad input"; ../shared/STYLE.md, errors.py).

A file that cannot be analysed: exit 1, exactly one ``Error:`` line naming the file (and the row, row group
and column where they apply), nothing on stdout, never a traceback; ``--debug`` shows the traceback.
A file with some bad rows: the rest analysed, each bad row listed in ``skipped``; ``--strict`` fails on it.
Also column detection, input expansion and the token layout, which decide what counts as bad.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from helpers.cli import error_line, invoke, runner
from helpers.dumps import (
    ALT_KEY_NAMES,
    NEMO_RL_NAMES,
    OPEN_INSTRUCT_NAMES,
    PRIME_RL_NAMES,
    SKYRL_NAMES,
    corrupt_row_group,
    random_rows,
    seq_row,
    sequence_table,
    token_table,
    write_sequence_dump,
    write_table,
    write_token_dump,
)
from hypothesis import given, settings
from hypothesis import strategies as st

import rollout_diag as rd
from rollout_diag.cli import app
from rollout_diag.errors import InputError

EPS = 1e-8  # METRICS.md Notation: verl's masked-mean denominator guard


# ------------------------------------------------------------------------------------------ helpers
def analyze_error(*args: object) -> str:
    return error_line(invoke("analyze", *args, "--device", "cpu"))


def analyze_json(*args: object) -> dict:
    result = invoke("analyze", *args, "--device", "cpu", "--format", "json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def assert_same_metrics(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    for name, value in expected.items():
        if value is None:
            assert actual[name] is None, name
        else:
            assert actual[name] == pytest.approx(value, rel=1e-12, abs=0.0), name


def assert_same_results(actual: dict, expected: dict) -> None:
    """Same run and per-step rows, tokens and metrics (rtol 1e-12: sums may be taken in another order)."""
    assert (actual["run"]["rows"], actual["run"]["tokens"]) == (expected["run"]["rows"], expected["run"]["tokens"])
    assert_same_metrics(actual["run"]["metrics"], expected["run"]["metrics"])
    assert [(s["step"], s["rows"], s["tokens"]) for s in actual["steps"]] == [
        (s["step"], s["rows"], s["tokens"]) for s in expected["steps"]
    ]
    for mine, theirs in zip(actual["steps"], expected["steps"], strict=True):
        assert_same_metrics(mine["metrics"], theirs["metrics"])


def base_rows() -> list[dict]:
    """Six rows over steps 0 and 1, each with a model token at position 1 (where the bad values go)."""
    rows = random_rows(7, steps=(0, 1), rows_per_step=3, min_length=4, max_length=8)
    for row in rows:
        row["mask"][1] = 1
    return rows


def replaced(values: list, position: int, value: object) -> list:
    out = list(values)
    out[position] = value
    return out


# ------------------------------------------------------------------------- files that cannot be read
def test_missing_rollout_column(tmp_path: Path) -> None:
    path = write_sequence_dump(tmp_path / "dump.parquet", base_rows(), names={"rollout": None})
    line = analyze_error(path)
    assert f"{path}: no rollout logprob column" in line
    assert "rollout_log_probs" in line and "vllm_logprobs" in line  # the names it looked for
    assert "--column rollout=" in line
    assert "old_log_probs" in line  # the columns the file has


def test_missing_trainer_column(tmp_path: Path) -> None:
    path = write_sequence_dump(tmp_path / "dump.parquet", base_rows(), names={"trainer": None})
    line = analyze_error(path)
    assert f"{path}: no trainer logprob column" in line
    assert "old_log_probs" in line and "action_log_probs" in line
    assert "--column trainer=" in line


def test_two_candidates_for_one_role_names_both(tmp_path: Path) -> None:
    table = sequence_table(base_rows())
    table = table.append_column("action_log_probs", table.column("old_log_probs"))
    path = write_table(tmp_path / "dump.parquet", table)
    line = analyze_error(path)
    assert str(path) in line
    assert "'old_log_probs'" in line and "'action_log_probs'" in line
    assert "trainer" in line
    assert "Hint:" in line and "--column trainer=" in line


def test_column_option_naming_a_missing_column(tmp_path: Path) -> None:
    path = write_sequence_dump(tmp_path / "dump.parquet", base_rows())
    line = analyze_error(path, "--column", "rollout=vllm_lp")
    assert f"{path}: column 'vllm_lp': no such column" in line
    assert "--column rollout=vllm_lp" in line
    assert "rollout_log_probs" in line  # the hint lists what the file has


@pytest.mark.parametrize("spec", ["rollout", "rollout=", "=vllm_logprobs"])
def test_column_option_bad_syntax(tmp_path: Path, spec: str) -> None:
    path = write_sequence_dump(tmp_path / "dump.parquet", base_rows())
    line = analyze_error(path, "--column", spec)
    assert f"--column '{spec}'" in line
    assert "role=name" in line


def test_column_option_unknown_role(tmp_path: Path) -> None:
    path = write_sequence_dump(tmp_path / "dump.parquet", base_rows())
    line = analyze_error(path, "--column", "logits=vllm_logprobs")
    assert "unknown role 'logits'" in line
    assert "rollout, trainer, mask" in line


@pytest.mark.parametrize(
    ("layout", "column", "cast_to", "found"),
    [
        pytest.param(
            sequence_table, "old_log_probs", pa.list_(pa.string()), ("list<float>", "string"), id="sequence_layout"
        ),
        pytest.param(
            token_table,
            "old_log_probs",
            pa.string(),
            ("expected float (token layout), found string",),
            id="token_layout",
        ),
        pytest.param(sequence_table, "step", pa.string(), ("integer step", "string"), id="step"),
    ],
)
def test_strings_in_a_typed_column(tmp_path: Path, layout, column: str, cast_to: pa.DataType, found: tuple) -> None:
    """Strings where log-probs (sequence or token layout) or the step should be: the file, the column, both types."""
    table = layout(base_rows())
    index = table.schema.get_field_index(column)
    table = table.set_column(index, column, table.column(index).cast(cast_to))
    path = write_table(tmp_path / "dump.parquet", table)
    line = analyze_error(path)
    assert f"{path}: column '{column}'" in line
    for part in found:
        assert part in line


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("step,sample_id,rollout_log_probs\n0,a,-0.5\n", "a CSV file, not Parquet"),
        ('{"step": 0, "tokens": [1, 2]}\n', "a JSON-lines file whose name says no trainer format, not Parquet"),
        ("step\tsample_id\n0\ta\n", "a tab-separated text file, not Parquet"),
    ],
)
def test_a_text_file_is_named_with_what_is_accepted(tmp_path: Path, text: str, found: str) -> None:
    """A CSV or unknown JSON-lines input is called what it is, not "not a readable Parquet file", and the message
    lists what rollout-diag reads."""
    path = tmp_path / "dump.parquet"
    path.write_text(text)
    line = analyze_error(path)
    assert f"{path}: {found}. rollout-diag reads Parquet dumps and the trainer formats prime-rl, " in line
    assert "--input-format" in line and "not a readable" not in line


@pytest.mark.parametrize("kind", ["truncated", "empty"])
def test_file_that_is_not_parquet(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "dump.parquet"
    if kind == "truncated":
        whole = write_sequence_dump(tmp_path / "whole.parquet", base_rows()).read_bytes()
        path.write_bytes(whole[: len(whole) // 2])
    else:
        path.write_bytes(b"")
    line = analyze_error(path)
    assert f"{path}: not a readable Parquet file" in line
    if kind == "empty":
        assert "0 bytes" in line


def test_file_with_zero_rows(tmp_path: Path) -> None:
    path = write_sequence_dump(tmp_path / "dump.parquet", [])
    line = analyze_error(path)
    assert f"{path}: no rows" in line


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("missing.parquet", "no such file or directory"),
        ("step_*.parquet", "no file matches this pattern"),
        ("folder", "directory holds no .parquet file"),
    ],
)
def test_inputs_that_name_no_parquet_file(tmp_path: Path, given: str, message: str) -> None:
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "notes.txt").write_text("not a dump")
    write_sequence_dump(tmp_path / "other.parquet", base_rows())  # present, but not what was asked for
    line = analyze_error(tmp_path / given)
    assert f"{tmp_path / given}: {message}" in line


def test_every_row_invalid(tmp_path: Path) -> None:
    rows = [{**row, "trainer": row["trainer"][:-1]} for row in base_rows()]
    path = write_sequence_dump(tmp_path / "dump.parquet", rows)
    line = analyze_error(path)
    assert f"{path}: every row was skipped (6 rows)" in line
    assert "row 0, column 'old_log_probs'" in line  # the first bad row, as an example


def test_no_model_token_in_any_row(tmp_path: Path) -> None:
    rows = [{**row, "mask": [0] * len(row["mask"])} for row in base_rows()]
    path = write_sequence_dump(tmp_path / "dump.parquet", rows)
    line = analyze_error(path)
    assert str(path) in line
    assert "column 'response_mask'" in line
    assert "no model token" in line and "6 rows" in line


def test_layouts_mixed_across_files(tmp_path: Path) -> None:
    sequence = write_sequence_dump(tmp_path / "a_sequence.parquet", base_rows())
    token = write_token_dump(tmp_path / "b_token.parquet", base_rows())
    line = analyze_error(sequence, token)
    assert "sequence layout" in line and "token layout" in line
    assert str(token) in line  # which file is the odd one out


def test_token_layout_without_sample_id(tmp_path: Path) -> None:
    path = write_token_dump(tmp_path / "dump.parquet", base_rows(), names={"sample_id": None})
    line = analyze_error(path)
    assert f"{path}: token layout" in line
    assert "--column sample_id=" in line


def test_invalid_utf8_sample_id_names_file_and_column(tmp_path: Path) -> None:
    table = sequence_table(base_rows())
    ids = [b"s0", b"s\xff1", b"s2", b"s3", b"s4", b"s5"]
    offsets = np.cumsum([0] + [len(sample) for sample in ids]).astype(np.int32)
    bad_ids = pa.Array.from_buffers(
        pa.string(), len(ids), [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"".join(ids))]
    )
    table = table.set_column(table.schema.get_field_index("sample_id"), "sample_id", bad_ids)
    path = write_table(tmp_path / "dump.parquet", table)
    line = analyze_error(path)
    assert str(path) in line
    assert "column 'sample_id'" in line


def test_undecodable_row_group_is_skipped_and_listed(tmp_path: Path) -> None:
    rows = random_rows(3, steps=(0, 1, 2), rows_per_step=4)
    path = write_sequence_dump(tmp_path / "dump.parquet", rows, row_group_size=4)
    corrupt_row_group(path, 1)
    expected = analyze_json(write_sequence_dump(tmp_path / "good.parquet", rows[:4] + rows[8:]))
    document = analyze_json(path)
    assert [(s["file"], s["row"], s["column"]) for s in document["skipped"]] == [
        (str(path), r, None) for r in range(4, 8)
    ]
    assert all("row group 1" in s["reason"] for s in document["skipped"])
    assert document["skipped_rows"] == 4
    assert any(f"{path}: row group 1 cannot be decoded" in w and "rows 4–7 skipped" in w for w in document["warnings"])
    assert_same_results(document, expected)


def test_undecodable_row_group_strict(tmp_path: Path) -> None:
    path = write_sequence_dump(tmp_path / "dump.parquet", random_rows(3, rows_per_step=4), row_group_size=4)
    corrupt_row_group(path, 1)
    line = analyze_error(path, "--strict")
    assert f"{path}: row group 1 cannot be decoded" in line
    assert "corrupt or truncated" in line


def test_subprocess_prints_one_line_without_traceback(tmp_path: Path) -> None:
    path = tmp_path / "dump.parquet"
    path.write_text("not parquet\n")
    command = [sys.executable, "-m", "rollout_diag.cli", "analyze", str(path), "--device", "cpu"]
    process = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert process.returncode == 1
    assert process.stdout == ""
    assert process.stderr.strip().splitlines() == [process.stderr.strip()]
    assert process.stderr.startswith(f"Error: {path}: a text file, not Parquet")
    assert "Traceback" not in process.stderr


def test_debug_lets_the_exception_through(tmp_path: Path) -> None:
    """With --debug the error is raised, not caught (Python then prints its traceback)."""
    path = tmp_path / "dump.parquet"
    path.write_text("not parquet\n")
    result = runner.invoke(app, ["analyze", str(path), "--device", "cpu", "--debug"])
    assert isinstance(result.exception, InputError)
    assert str(path) in str(result.exception)
    assert result.exc_info is not None and result.exc_info[2] is not None  # the traceback a user gets
    assert "Error:" not in result.stderr


# ---------------------------------------------------------------------------- partly bad files
# (id, how row 2 is spoiled, the column to be named, fragments of the reason)
BAD_ROWS = [
    (
        "ragged",
        lambda row: {**row, "trainer": row["trainer"][:-1]},
        "old_log_probs",
        ["differs from", "rollout_log_probs"],
    ),
    (
        "nan",
        lambda row: {**row, "trainer": replaced(row["trainer"], 1, math.nan)},
        "old_log_probs",
        ["NaN", "position 1"],
    ),
    (
        "null_element",
        lambda row: {**row, "trainer": replaced(row["trainer"], 1, None)},
        "old_log_probs",
        ["position 1"],
    ),
    (
        "inf",
        lambda row: {**row, "rollout": replaced(row["rollout"], 1, math.inf)},
        "rollout_log_probs",
        ["+inf", "position 1"],
    ),
    (
        "positive",
        lambda row: {**row, "rollout": replaced(row["rollout"], 1, 0.25)},
        "rollout_log_probs",
        ["positive logprob 0.25", "position 1"],
    ),
    (
        "positive_just_above_tolerance",
        lambda row: {**row, "trainer": replaced(row["trainer"], 1, 2e-6)},
        "old_log_probs",
        ["positive logprob 2e-06"],
    ),
    (
        "mask_2",
        lambda row: {**row, "mask": replaced(row["mask"], 1, 2)},
        "response_mask",
        ["mask value 2", "position 1"],
    ),
    ("null_rollout", lambda row: {**row, "rollout": None}, "rollout_log_probs", ["null list"]),
    ("null_trainer", lambda row: {**row, "trainer": None}, "old_log_probs", ["null list"]),
    ("null_mask", lambda row: {**row, "mask": None}, "response_mask", ["null list"]),
]
BAD_ROW = 2


def spoiled_rows(spoil) -> list[dict]:
    rows = base_rows()
    rows[BAD_ROW] = spoil(rows[BAD_ROW])
    return rows


@pytest.mark.parametrize(
    ("spoil", "column", "fragments"), [case[1:] for case in BAD_ROWS], ids=[c[0] for c in BAD_ROWS]
)
def test_bad_row_is_skipped_and_listed(tmp_path: Path, spoil, column: str, fragments: list[str]) -> None:
    path = write_sequence_dump(tmp_path / "dump.parquet", spoiled_rows(spoil))
    document = analyze_json(path)
    assert [(s["file"], s["row"], s["column"]) for s in document["skipped"]] == [(str(path), BAD_ROW, column)]
    for fragment in fragments:
        assert fragment in document["skipped"][0]["reason"]
    assert document["skipped_rows"] == 1
    assert document["run"]["rows"] == 5
    assert any("1 row(s) skipped" in warning for warning in document["warnings"])


@pytest.mark.parametrize(
    ("spoil", "column", "fragments"), [case[1:] for case in BAD_ROWS], ids=[c[0] for c in BAD_ROWS]
)
def test_bad_row_fails_under_strict(tmp_path: Path, spoil, column: str, fragments: list[str]) -> None:
    path = write_sequence_dump(tmp_path / "dump.parquet", spoiled_rows(spoil))
    line = analyze_error(path, "--strict")
    assert f"{path}: row {BAD_ROW}, column '{column}': " in line
    for fragment in fragments:
        assert fragment in line


def test_bad_rows_name_the_trainers_own_column(tmp_path: Path) -> None:
    """Under SkyRL's names the skipped list says action_log_probs / loss_mask, columns the user can find."""
    rows = base_rows()
    rows[1] = {**rows[1], "trainer": replaced(rows[1]["trainer"], 1, math.nan)}
    rows[4] = {**rows[4], "mask": replaced(rows[4]["mask"], 1, 3)}
    path = write_sequence_dump(tmp_path / "dump.parquet", rows, names=SKYRL_NAMES)
    document = analyze_json(path)
    assert sorted((s["row"], s["column"]) for s in document["skipped"]) == [(1, "action_log_probs"), (4, "loss_mask")]


def test_skipped_rows_table_in_the_terminal(tmp_path: Path) -> None:
    path = write_sequence_dump(tmp_path / "dump.parquet", spoiled_rows(lambda row: {**row, "rollout": None}))
    result = invoke("analyze", path, "--device", "cpu", width=200)
    assert result.exit_code == 0, result.stderr
    assert "Skipped rows: 1" in result.stdout
    line = next(line for line in result.stdout.splitlines() if "null list" in line and "│" in line)  # the table's
    assert str(path) in line and f" {BAD_ROW} " in line and "rollout_log_probs" in line
    assert "warning: 1 row(s) skipped" in result.stdout


def test_bad_rows_leave_the_good_rows_numbers_unchanged(tmp_path: Path) -> None:
    good = random_rows(11, steps=(0, 1, 2), rows_per_step=5, min_length=3)
    spoiled = []
    for index, row in enumerate(good):
        spoiled.append(row)
        if index % 2 == 0:  # a bad copy of every other row, in the same step
            _, spoil, _, _ = BAD_ROWS[index // 2 % len(BAD_ROWS)]
            spoiled.append(spoil({**row, "mask": [1] * len(row["rollout"]), "sample_id": f"bad-{index}"}))
    path = write_sequence_dump(tmp_path / "spoiled.parquet", spoiled, row_group_size=7)
    document = analyze_json(path)
    expected = analyze_json(write_sequence_dump(tmp_path / "good.parquet", good))
    bad_rows = [i for i, row in enumerate(spoiled) if str(row["sample_id"]).startswith("bad-")]
    assert sorted(s["row"] for s in document["skipped"]) == bad_rows
    assert document["skipped_rows"] == len(bad_rows) == 8
    assert_same_results(document, expected)


def test_values_under_mask_0_are_ignored(tmp_path: Path) -> None:
    rows = base_rows()
    environment = [(i, p) for i, row in enumerate(rows) for p, m in enumerate(row["mask"]) if m == 0]
    assert len(environment) >= 3
    strange = [math.nan, math.inf, 5.0, None]
    odd = [dict(row) for row in rows]
    for k, (i, p) in enumerate(environment):
        odd[i] = {**odd[i], "trainer": replaced(odd[i]["trainer"], p, strange[k % 4])}
        odd[i] = {**odd[i], "rollout": replaced(odd[i]["rollout"], p, strange[(k + 1) % 4])}
    path = write_sequence_dump(tmp_path / "odd.parquet", odd)
    document = analyze_json(path, "--strict")
    assert document["skipped"] == [] and document["skipped_rows"] == 0
    assert not any("skipped" in warning for warning in document["warnings"])
    assert_same_results(document, analyze_json(write_sequence_dump(tmp_path / "plain.parquet", rows)))


def test_tiny_positive_logprob_within_tolerance_is_accepted(tmp_path: Path) -> None:
    rows = base_rows()
    rows[0] = {**rows[0], "trainer": replaced(rows[0]["trainer"], 1, 5e-7)}  # float noise of log(1)
    document = analyze_json(write_sequence_dump(tmp_path / "dump.parquet", rows), "--strict")
    assert document["skipped"] == []
    assert document["run"]["rows"] == 6


def test_duplicate_token_position_is_skipped(tmp_path: Path) -> None:
    table = token_table(base_rows())
    positions = table.column("position").to_pylist()
    positions[1] = positions[0]  # row 0 of the dump (sample s0-0) now has position 0 twice
    table = table.set_column(table.schema.get_field_index("position"), "position", pa.array(positions, pa.int64()))
    path = write_table(tmp_path / "dump.parquet", table)
    document = analyze_json(path)
    assert [(s["row"], s["column"]) for s in document["skipped"]] == [(0, "position")]
    assert "duplicate" in document["skipped"][0]["reason"]
    assert document["run"]["rows"] == 5


# ---------------------------------------------------------------------- rows and steps with no token
def test_step_without_model_token_among_good_steps(tmp_path: Path) -> None:
    rows = [
        *base_rows(),
        seq_row(5, "quiet-0", [-1.0, -2.0], [-1.0, -2.0], [0, 0]),
        seq_row(5, "quiet-1", [-1.0], [-1.0], [0]),
    ]
    path = write_sequence_dump(tmp_path / "dump.parquet", rows)
    document = analyze_json(path)
    assert any("no metrics" in warning and "steps 5" in warning for warning in document["warnings"])
    step = next(s for s in document["steps"] if s["step"] == 5)
    assert (step["rows"], step["tokens"], step["empty_rows"]) == (2, 0, 2)
    assert not any(name.startswith("rollout_corr/") for name in step["metrics"])
    # METRICS.md §5: a step with no masked token reports valid = 0 and NaN (null) for the rest.
    assert step["metrics"].pop("training/rollout_probs_diff_valid") == 0.0
    assert all(value is None for value in step["metrics"].values())
    assert [s["step"] for s in document["steps"]] == [0, 1, 5]


def test_step_without_model_token_fails_under_strict(tmp_path: Path) -> None:
    rows = [*base_rows(), seq_row(5, "quiet-0", [-1.0, -2.0], [-1.0, -2.0], [0, 0])]
    path = write_sequence_dump(tmp_path / "dump.parquet", rows)
    line = analyze_error(path, "--strict")
    assert str(path) in line
    assert "step(s) have no model token" in line and "steps 5" in line


def test_rows_without_model_token_count_in_row_means(tmp_path: Path) -> None:
    trainer_0, trainer_2 = [-0.5, -1.5, -0.25], [-2.0, -1.0]
    rows = [
        seq_row(0, "a", [-0.75, -1.25, -0.25], trainer_0, [1, 1, 0]),
        seq_row(0, "empty", [-3.0, -4.0], [-3.5, -4.5], [0, 0]),
        seq_row(0, "c", [-2.0, -0.5], trainer_2, [1, 1]),
    ]
    path = write_sequence_dump(tmp_path / "dump.parquet", rows)
    document = analyze_json(path)
    run = document["run"]
    assert (run["rows"], run["tokens"], run["empty_rows"]) == (3, 4, 1)
    assert document["skipped"] == []
    assert any(
        "1 row(s) have no model token" in w and "sample 'empty'" in w and "row 1" in w for w in document["warnings"]
    )
    # training_ppl = mean_i exp(−R_i[a]) over all 3 rows; the empty row has R = 0, so it adds exp(0) = 1.
    r_0 = (-0.5 - 1.5) / (2 + EPS)
    r_2 = (-2.0 - 1.0) / (2 + EPS)
    expected_ppl = (math.exp(-r_0) + 1.0 + math.exp(-r_2)) / 3
    assert run["metrics"]["rollout_corr/training_ppl"] == pytest.approx(expected_ppl, rel=1e-12)
    assert run["metrics"]["rollout_corr/training_log_ppl"] == pytest.approx((-r_0 + 0.0 - r_2) / 3, rel=1e-12)
    assert expected_ppl != pytest.approx((math.exp(-r_0) + math.exp(-r_2)) / 2, rel=1e-3)  # the quirk matters here


# ------------------------------------------------------------------------------ column detection
@pytest.fixture(scope="module")
def verl_result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    path = write_sequence_dump(tmp_path_factory.mktemp("verl") / "dump.parquet", random_rows(5))
    return analyze_json(path)


@pytest.mark.parametrize(
    "names",
    [SKYRL_NAMES, PRIME_RL_NAMES, NEMO_RL_NAMES, OPEN_INSTRUCT_NAMES, ALT_KEY_NAMES, {**SKYRL_NAMES, **ALT_KEY_NAMES}],
    ids=["skyrl", "prime-rl", "nemo-rl", "open-instruct", "global_step-uid", "skyrl-global_step-uid"],
)
def test_trainer_column_names_are_detected(tmp_path: Path, verl_result: dict, names: dict) -> None:
    path = write_sequence_dump(tmp_path / "dump.parquet", random_rows(5), names=names)
    document = analyze_json(path)
    expected_columns = {
        "rollout": "rollout_log_probs",
        "trainer": "old_log_probs",
        "mask": "response_mask",
        "step": "step",
        "sample_id": "sample_id",
        **names,
    }
    if "uid" in names.values():  # verl's uid is shared by a prompt's responses: it is the prompt id too
        expected_columns["prompt_id"] = "uid"
    assert document["columns"] == expected_columns
    assert_same_results(document, verl_result)


def test_column_option_overrides(tmp_path: Path, verl_result: dict) -> None:
    names = {
        "rollout": "lp_engine",
        "trainer": "lp_fsdp",
        "mask": "is_model",
        "step": "iteration",
        "sample_id": "request",
    }
    path = write_sequence_dump(tmp_path / "dump.parquet", random_rows(5), names=names)
    args = [item for role, name in names.items() for item in ("--column", f"{role}={name}")]
    document = analyze_json(path, *args)
    assert document["columns"] == names
    assert_same_results(document, verl_result)


def test_column_option_settles_two_candidates(tmp_path: Path, verl_result: dict) -> None:
    table = sequence_table(random_rows(5))
    table = table.append_column("vllm_logprobs", pa.array([[0.0]] * table.num_rows, pa.list_(pa.float32())))
    path = write_table(tmp_path / "dump.parquet", table)
    document = analyze_json(path, "-c", "rollout=rollout_log_probs")
    assert document["columns"]["rollout"] == "rollout_log_probs"
    assert_same_results(document, verl_result)


def test_missing_mask_means_all_ones(tmp_path: Path) -> None:
    rows = [{**row, "mask": [1] * len(row["rollout"])} for row in random_rows(5)]
    without = analyze_json(write_sequence_dump(tmp_path / "no_mask.parquet", rows, names={"mask": None}))
    with_ones = analyze_json(write_sequence_dump(tmp_path / "ones.parquet", rows))
    assert "mask" not in without["columns"]
    assert without["run"]["tokens"] == sum(len(row["rollout"]) for row in rows)
    assert_same_results(without, with_ones)


def test_missing_step_means_one_step(tmp_path: Path) -> None:
    rows = random_rows(5, steps=(0, 4, 9))
    document = analyze_json(write_sequence_dump(tmp_path / "dump.parquet", rows, names={"step": None}))
    assert "step" not in document["columns"]
    assert [(s["step"], s["rows"]) for s in document["steps"]] == [(0, len(rows))]
    single = analyze_json(write_sequence_dump(tmp_path / "one.parquet", [{**row, "step": 0} for row in rows]))
    assert_same_results(document, single)


def test_missing_sample_id_means_row_number(tmp_path: Path) -> None:
    rows = random_rows(5)
    path = write_sequence_dump(tmp_path / "dump.parquet", rows, names={"sample_id": None}, row_group_size=5)
    document = analyze_json(path, "--top-k", "50")
    assert "sample_id" not in document["columns"]
    assert document["worst_rows"]
    for worst in document["worst_rows"]:
        assert worst["sample_id"] == str(worst["row"])
    result = invoke("inspect", path, "--sample", "7", "--device", "cpu", "--format", "json")
    assert result.exit_code == 0, result.stderr
    row = json.loads(result.stdout)
    assert (row["row"], row["step"], row["mask"]) == (7, rows[7]["step"], rows[7]["mask"])


def make_hive(root: Path, rows: list[dict]) -> dict[int, list[dict]]:
    by_step: dict[int, list[dict]] = {}
    for row in rows:
        by_step.setdefault(row["step"], []).append(row)
    for step, step_rows in by_step.items():
        write_sequence_dump(root / f"step={step}" / "part-0.parquet", step_rows, names={"step": None})
    (root / "_SUCCESS").write_text("")
    return by_step


@pytest.mark.parametrize("given", ["run", "run/step=*/*.parquet", "run/*/part-0.parquet"])
def test_hive_partitions_give_the_step(tmp_path: Path, given: str) -> None:
    rows = random_rows(5, steps=(3, 4))
    make_hive(tmp_path / "run", rows)
    document = analyze_json(tmp_path / given)
    assert [(s["step"], s["rows"]) for s in document["steps"]] == [(3, 4), (4, 4)]
    assert document["columns"]["step"].startswith("step")
    assert document["inputs"] == [str(tmp_path / "run" / f"step={s}" / "part-0.parquet") for s in (3, 4)]
    assert_same_results(document, analyze_json(write_sequence_dump(tmp_path / "flat.parquet", rows)))


@pytest.mark.parametrize("given", ["run/step=*", "run/step=4"])
def test_partition_directory_named_directly_keeps_its_step(tmp_path: Path, given: str) -> None:
    make_hive(tmp_path / "run", random_rows(5, steps=(3, 4)))
    document = analyze_json(tmp_path / given)
    steps = [3, 4] if given.endswith("*") else [4]
    assert [s["step"] for s in document["steps"]] == steps


def test_several_files_and_globs_make_one_analysis(tmp_path: Path) -> None:
    rows = random_rows(9, steps=(0, 1, 2), rows_per_step=6)
    whole = analyze_json(write_sequence_dump(tmp_path / "whole.parquet", rows))
    parts = tmp_path / "parts"
    # Step 1 spans both files; the second file also holds step 2.
    write_sequence_dump(parts / "a.parquet", rows[:9], row_group_size=4)
    write_sequence_dump(parts / "b.parquet", rows[9:], row_group_size=5)
    for inputs in ([parts / "a.parquet", parts / "b.parquet"], [parts / "*.parquet"], [parts]):
        document = analyze_json(*inputs)
        assert document["inputs"] == [str(parts / "a.parquet"), str(parts / "b.parquet")]
        assert_same_results(document, whole)


def test_files_with_different_column_names_warn(tmp_path: Path) -> None:
    first = write_sequence_dump(tmp_path / "a.parquet", random_rows(1, steps=(0,)))
    second = write_sequence_dump(tmp_path / "b.parquet", random_rows(2, steps=(1,)), names=SKYRL_NAMES)
    document = analyze_json(first, second)
    assert [s["step"] for s in document["steps"]] == [0, 1]
    assert any(f"{second}: columns differ" in w and "action_log_probs" in w for w in document["warnings"])


# ---------------------------------------------------------------------------------- token layout
@pytest.mark.parametrize(
    ("shuffle_seed", "row_group_size", "chunk_tokens"),
    [(None, None, None), (3, None, None), (4, 7, 5), (5, 13, 17)],
    ids=["sorted", "shuffled", "shuffled-small-chunks", "shuffled-odd-chunks"],
)
def test_token_layout_gives_the_sequence_layout_results(
    tmp_path: Path, shuffle_seed: int | None, row_group_size: int | None, chunk_tokens: int | None
) -> None:
    rows = random_rows(21, steps=(0, 1, 2, 3), rows_per_step=5, with_token_ids=True)
    sequence = analyze_json(write_sequence_dump(tmp_path / "sequence.parquet", rows))
    path = write_token_dump(tmp_path / "token.parquet", rows, shuffle_seed=shuffle_seed, row_group_size=row_group_size)
    extra = [] if chunk_tokens is None else ["--chunk-tokens", chunk_tokens]
    token = analyze_json(path, *extra)
    assert token["layout"] == "token" and sequence["layout"] == "sequence"
    assert token["columns"]["position"] == "position"
    assert_same_results(token, sequence)
    assert [r["sample_id"] for r in token["worst_rows"]] == [r["sample_id"] for r in sequence["worst_rows"]]


def test_token_layout_sequence_split_by_another_is_an_error(tmp_path: Path) -> None:
    rows = base_rows()
    table = token_table([rows[0], rows[1]])
    first_row_again = table.num_rows
    table = pa.concat_tables([table, token_table([rows[0]])])
    path = write_table(tmp_path / "dump.parquet", table)
    line = analyze_error(path)
    assert f"{path}: row {first_row_again}, column 'sample_id'" in line
    assert "'s0-0'" in line and "appear again" in line
    assert "Hint:" in line and "sort" in line


# ----------------------------------------------------------------------------- random corruption
@pytest.fixture(scope="module")
def small_dump(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(where to write the corrupted copy, a valid dump of 12 rows in 3 row groups)."""
    folder = tmp_path_factory.mktemp("fuzz")
    valid = write_sequence_dump(folder / "valid.parquet", random_rows(2, with_token_ids=True), row_group_size=4)
    return folder / "corrupt.parquet", valid


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_corrupt_bytes_never_give_a_traceback(small_dump: tuple[Path, Path], data: st.DataObject) -> None:
    path, valid_path = small_dump
    valid = valid_path.read_bytes()
    corrupt = bytearray(valid)
    if data.draw(st.booleans(), label="truncate"):
        corrupt = corrupt[: data.draw(st.integers(0, len(valid) - 1), label="keep bytes")]
    flips = data.draw(st.lists(st.tuples(st.integers(0, len(valid) - 1), st.integers(0, 255)), max_size=8))
    for position, value in flips:
        if position < len(corrupt):
            corrupt[position] = value
    path.write_bytes(bytes(corrupt))
    result = invoke("analyze", path, "--device", "cpu", "--format", "json")
    assert result.exit_code in (0, 1)
    if result.exit_code == 1:
        assert str(path) in error_line(result)
    else:
        json.loads(result.stdout)


def test_default_sample_ids_stay_file_rows_when_rows_are_skipped(tmp_path: Path) -> None:
    rows = base_rows()
    rows[1] = {**rows[1], "trainer": rows[1]["trainer"][:-1]}  # row 1 is ragged and skipped
    path = write_sequence_dump(tmp_path / "no_ids.parquet", rows, names={"sample_id": None})
    document = json.loads(invoke("analyze", path, "--device", "cpu", "-f", "json").stdout)
    assert document["skipped"][0]["row"] == 1
    ids = {row["sample_id"] for row in document["worst_rows"]}
    assert "1" not in ids and ids <= {str(i) for i in range(len(rows))}
    worst = document["worst_rows"][0]
    assert worst["sample_id"] == str(worst["row"])  # the default id is the file row


def test_errors_speak_the_callers_terms(tmp_path: Path) -> None:
    """The library names its keyword arguments, the CLI its flags, for one and the same error."""
    path = write_sequence_dump(tmp_path / "dump.parquet", base_rows())
    with pytest.raises(rd.ConfigError) as caught:
        rd.analyze(path, max_rounds=0, device="cpu")
    assert str(caught.value).startswith("max_rounds=0: must be a whole number")
    assert "--" not in str(caught.value)
    with pytest.raises(rd.ColumnError) as caught:
        rd.analyze(path, columns={"rollout": "nope"}, device="cpu")
    assert "columns rollout=nope" in str(caught.value)
    assert analyze_error(path, "--max-rounds", "0").startswith("Error: --max-rounds 0: must be a whole number")
    assert "--column rollout=nope" in analyze_error(path, "--column", "rollout=nope")
