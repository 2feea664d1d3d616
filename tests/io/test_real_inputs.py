"""Inputs users really have, hostile directories, --workers,
option validation, warnings that stop silent wrong answers, and a fast ``inspect``."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from helpers.cli import one_error_line
from helpers.dumps import (
    random_rows,
    seq_row,
    sequence_table,
    token_table,
    write_sequence_dump,
    write_table,
    write_token_dump,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rollout_diag as rd
from rollout_diag.cli import app
from rollout_diag.io.sources import expand_inputs
from rollout_diag.paths import natural_key
from tests.helpers.cli import runner

LAYOUT_KEYS = ("inputs", "layout", "columns")  # what differs between two files of the same data, by design


def analyze(path: Path | str | list, **options) -> dict:
    return rd.analyze(path if isinstance(path, list) else str(path), device="cpu", **options).to_json()


def without(document: dict, *keys: str) -> dict:
    return {key: value for key, value in document.items() if key not in keys}


def worst_rows_by_id(document: dict) -> list[tuple]:
    """The worst rows without their file and file row (which differ between layouts by design)."""
    return [
        (r["criterion"], r["value"], r["step"], r["sample_id"], r["length"], r["model_tokens"])
        for r in document["worst_rows"]
    ]


def assert_same_analysis(actual: dict, expected: dict) -> None:
    """Every run and step number equal to the last bit, and the same worst rows and tokens by sample id."""
    assert actual["run"] == expected["run"]
    assert actual["steps"] == expected["steps"]
    assert actual["rounds"] == expected["rounds"]
    assert worst_rows_by_id(actual) == worst_rows_by_id(expected)
    strip = ("file", "row")
    assert [without(t, *strip) for t in actual["worst_tokens"]] == [
        without(t, *strip) for t in expected["worst_tokens"]
    ]


def cli(*args: object):
    result = runner.invoke(app, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"exception escaped the CLI: {result.exception!r}") from result.exception
    assert "Traceback" not in result.output
    return result


# ---------------------------------------------------------------- token layout = sequence layout, exactly
rows_strategy = st.lists(
    st.tuples(
        st.integers(0, 3),  # step
        st.lists(
            st.tuples(
                st.floats(-30.0, 0.0, width=32),  # trainer logprob
                st.floats(-30.0, 0.0, width=32),  # rollout logprob
                st.sampled_from([0, 1, 1, 1]),  # mask
            ),
            min_size=1,
            max_size=9,
        ),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(drawn=rows_strategy, int_ids=st.booleans())
def test_token_layout_equals_sequence_layout_exactly(tmp_path: Path, drawn: list, int_ids: bool) -> None:
    rows = []
    for index, (step, tokens) in enumerate(sorted(drawn, key=lambda item: item[0])):
        trainer, rollout, mask = (list(values) for values in zip(*tokens, strict=True))
        if not any(mask):
            mask[0] = 1  # a step needs a model token somewhere to have metrics; empty rows are tested elsewhere
        rows.append(seq_row(step, index if int_ids else f"id-{index}", rollout, trainer, mask))
    sequence = analyze(write_sequence_dump(tmp_path / "sequence.parquet", rows))
    token = analyze(write_token_dump(tmp_path / "token.parquet", rows, shuffle_seed=1))
    assert token["layout"] == "token"
    assert_same_analysis(token, sequence)


def test_token_layout_equals_sequence_layout_on_a_basic_file(tmp_path: Path) -> None:
    # The last sequence of a token-layout file used to form a chunk of its own: sums rounded differently.
    rows = random_rows(0, steps=(0, 1, 2), rows_per_step=5, with_token_ids=True)
    sequence = analyze(write_sequence_dump(tmp_path / "sequence.parquet", rows))
    token = analyze(write_token_dump(tmp_path / "token.parquet", rows))
    assert_same_analysis(token, sequence)


# ------------------------------------------------------------------------------ dictionary-encoded strings
POLARS_CATEGORICAL = pa.dictionary(pa.uint32(), pa.large_string())  # what polars writes for Categorical/Enum


def categorical(array: pa.Array) -> pa.Array:
    return pc.cast(array, pa.large_string()).dictionary_encode().cast(POLARS_CATEGORICAL)


def categorical_lists(array: pa.ListArray) -> pa.Array:
    return pa.ListArray.from_arrays(array.offsets, categorical(array.flatten()), mask=array.is_null())


def with_categoricals(table: pa.Table, lists: bool) -> pa.Table:
    table = table.set_column(
        table.schema.get_field_index("sample_id"), "sample_id", categorical(table.column("sample_id").combine_chunks())
    )
    tokens = table.column("tokens").combine_chunks()
    encoded = categorical_lists(tokens) if lists else categorical(tokens)
    return table.set_column(table.schema.get_field_index("tokens"), "tokens", encoded)


@pytest.mark.parametrize("layout", ["sequence", "token"])
def test_dictionary_encoded_sample_ids_and_tokens_read_like_plain_strings(tmp_path: Path, layout: str) -> None:
    rows = random_rows(3, steps=(0, 1), rows_per_step=4, with_token_ids=True)
    for row in rows:
        row["tokens"] = [f"t{i % 3}" for i in range(len(row["rollout"]))]
    table = sequence_table(rows) if layout == "sequence" else token_table(rows)
    plain = write_table(tmp_path / "plain.parquet", table)
    encoded = write_table(tmp_path / "categorical.parquet", with_categoricals(table, lists=layout == "sequence"))
    schema = pq.read_schema(encoded)
    assert pa.types.is_dictionary(schema.field("sample_id").type)
    expected, actual = analyze(plain), analyze(encoded)
    assert_same_analysis(actual, expected)
    assert [r["sample_id"] for r in actual["worst_rows"]] == [r["sample_id"] for r in expected["worst_rows"]]
    tokens = rd.inspect_row(str(encoded), actual["worst_rows"][0]["sample_id"], step=actual["worst_rows"][0]["step"])
    assert tokens.token == [f"t{i % 3}" for i in range(len(tokens.mask))]


# ------------------------------------------------------------------------------------------ null step
def test_null_step_skips_that_row_in_the_sequence_layout(tmp_path: Path) -> None:
    rows = random_rows(5, steps=(0, 1), rows_per_step=3)
    table = sequence_table(rows)
    steps = table.column("step").to_pylist()
    steps[2] = None
    table = table.set_column(table.schema.get_field_index("step"), "step", pa.array(steps, pa.int64()))
    document = analyze(write_table(tmp_path / "null_step.parquet", table))
    assert document["skipped_rows"] == 1
    assert document["skipped"][0] == {
        "file": str(tmp_path / "null_step.parquet"),
        "row": 2,
        "column": "step",
        "reason": "null step",
    }
    expected = analyze(write_sequence_dump(tmp_path / "without.parquet", rows[:2] + rows[3:]))
    assert document["run"] == expected["run"] and document["steps"] == expected["steps"]


@pytest.mark.parametrize("where", ["inside", "first", "last"])
def test_null_step_skips_its_sequence_in_the_token_layout(tmp_path: Path, where: str) -> None:
    rows = random_rows(6, steps=(0, 1), rows_per_step=3, min_length=3)
    table = token_table(rows)
    sequence = {"first": 0, "inside": 2, "last": len(rows) - 1}[where]
    first_token = sum(len(row["rollout"]) for row in rows[:sequence])
    null_token = first_token + 1
    steps = table.column("step").to_pylist()
    steps[null_token] = None
    table = table.set_column(table.schema.get_field_index("step"), "step", pa.array(steps, pa.int64()))
    path = write_table(tmp_path / "null_step.parquet", table)
    document = analyze(path)
    assert document["skipped_rows"] == 1
    assert document["skipped"][0] == {"file": str(path), "row": null_token, "column": "step", "reason": "null step"}
    expected = analyze(write_sequence_dump(tmp_path / "without.parquet", rows[:sequence] + rows[sequence + 1 :]))
    assert document["run"] == expected["run"] and document["steps"] == expected["steps"]
    assert "null step" in one_error_line(cli("analyze", path, "--strict", "--device", "cpu"))


# ------------------------------------------------------------------------------------------ no mask column
def test_no_mask_column_is_said_loudly_with_the_token_count(tmp_path: Path) -> None:
    rows = random_rows(8, steps=(0, 1), rows_per_step=3, env_share=0.0)
    path = write_sequence_dump(tmp_path / "no_mask.parquet", rows, names={"mask": None})
    tokens = sum(len(row["rollout"]) for row in rows)
    warnings = analyze(path)["warnings"]
    assert any(f"no mask column: all {tokens} tokens treated as model tokens" in w for w in warnings)
    # rollout logprobs of exactly 0.0 on confident tokens (trainer near 0 too) are no sign of environment tokens
    assert any(row["rollout"].count(0.0) for row in rows)
    assert not any("environment tokens" in w for w in warnings)


def test_no_mask_column_with_zero_rollout_logprobs_suggests_the_mask(tmp_path: Path) -> None:
    rows = random_rows(9, steps=(0, 1), rows_per_step=4, env_share=0.3)
    zeros = 0
    for row in rows:  # what engines write where they produced no logprob: 0.0 on environment tokens
        for position, mask in enumerate(row["mask"]):
            if not mask:
                row["rollout"][position] = 0.0
                zeros += row["trainer"][position] < np.log(0.5)
        row["attention_mask"] = row["mask"]
    table = sequence_table(rows, names={"mask": None})
    table = table.append_column("env_mask", pa.array([row["mask"] for row in rows], pa.list_(pa.int8())))
    path = write_table(tmp_path / "env.parquet", table)
    tokens = sum(len(row["rollout"]) for row in rows)
    warnings = analyze(path)["warnings"]
    assert any(f"all {tokens} tokens treated as model tokens" in w for w in warnings)
    (hint,) = [w for w in warnings if "environment tokens" in w]
    assert hint.startswith(f"{zeros} of those {tokens} tokens")  # counted exactly
    assert "--column mask=env_mask" in hint
    # with the mask named, the warnings go and the numbers are those of the masked file
    named = analyze(path, columns={"mask": "env_mask"})
    assert not any("mask column" in w for w in named["warnings"])
    assert named["run"] == analyze(write_sequence_dump(tmp_path / "masked.parquet", rows))["run"]


def test_no_mask_warning_counts_only_the_files_without_one(tmp_path: Path) -> None:
    rows = random_rows(10, steps=(0,), rows_per_step=3)
    with_mask = write_sequence_dump(tmp_path / "a.parquet", rows)
    without_mask = write_sequence_dump(tmp_path / "b.parquet", random_rows(11, steps=(1,)), names={"mask": None})
    tokens = pq.read_table(without_mask).column("rollout_log_probs").combine_chunks().flatten().__len__()
    warnings = analyze([str(with_mask), str(without_mask)])["warnings"]
    assert any(f"no mask column in {without_mask}: all {tokens} tokens" in w for w in warnings)


# ------------------------------------------------------------------------------------------ duplicates
def test_duplicate_step_and_sample_id_across_files_is_counted(tmp_path: Path) -> None:
    rows = random_rows(12, steps=(0, 1), rows_per_step=3)
    first = write_sequence_dump(tmp_path / "a.parquet", rows)
    second = write_sequence_dump(tmp_path / "b.parquet", rows[:2] + random_rows(13, steps=(5,), rows_per_step=2))
    warnings = analyze(str(tmp_path))["warnings"]
    (duplicate,) = [w for w in warnings if w.startswith("duplicate (step, sample_id)")]
    assert "4 rows share their (step, sample_id) with another row (2 keys)" in duplicate
    assert f"{first}:0 and {second}:0" in duplicate and "--row FILE:ROW" in duplicate


def test_duplicate_rows_within_a_file_and_none_without_ids(tmp_path: Path) -> None:
    rows = random_rows(14, steps=(0,), rows_per_step=4)
    rows[3] = {**rows[3], "sample_id": rows[1]["sample_id"]}
    path = write_sequence_dump(tmp_path / "dup.parquet", rows)
    assert any("2 rows share" in w and f"{path}:1 and {path}:3" in w for w in analyze(path)["warnings"])
    no_ids = write_sequence_dump(tmp_path / "no_ids.parquet", rows, names={"sample_id": None})
    again = write_sequence_dump(tmp_path / "no_ids_again.parquet", rows, names={"sample_id": None})
    assert not any("duplicate" in w for w in analyze([str(no_ids), str(again)])["warnings"])  # row numbers


def reference_row_key(step: int, sample_id: str) -> int:
    """FNV-1a (64-bit: offset 0xcbf29ce484222325, prime 0x100000001b3) over the step's 8 little-endian bytes and the
    id's UTF-8 bytes, then splitmix64's finalizer: one byte at a time, in Python integers mod 2^64."""
    mask = (1 << 64) - 1
    key = 0xCBF29CE484222325
    for byte in step.to_bytes(8, "little", signed=True) + sample_id.encode("utf-8", "surrogatepass"):
        key = ((key ^ byte) * 0x100000001B3) & mask
    key = ((key ^ (key >> 30)) * 0xBF58476D1CE4E5B9) & mask
    key = ((key ^ (key >> 27)) * 0x94D049BB133111EB) & mask
    return key ^ (key >> 31)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(-(2**63), 2**63 - 1), st.text(max_size=12) | st.sampled_from(["", "a", "s1-2", "é"])),
        max_size=30,
    )
)
def test_row_keys_are_the_byte_by_byte_hash(rows) -> None:
    """io.readlog.row_keys (vectorised across rows, ids of mixed lengths, non-ASCII, empty) equals the hash written
    one byte at a time, so every process, of any version with this code, keys a row alike."""
    from rollout_diag.io.readlog import row_keys

    steps = np.array([step for step, _ in rows], dtype=np.int64)
    keys = row_keys(steps, [sample_id for _, sample_id in rows])
    assert keys.dtype == np.uint64 and keys.tolist() == [reference_row_key(*row) for row in rows]


def test_row_keys_tell_rows_apart() -> None:
    """Keys of (step, id) pairs that share bytes differ: the step is fixed-width, an id's bytes are its own (a
    shorter id is not a longer one's prefix padded with zeros)."""
    from rollout_diag.io.readlog import row_keys

    pairs = [(1, "a"), (1, "a\x00"), (1, "ab"), (2, "a"), (1, ""), (0, "\x01a"), (256, "a"), (1, "b")]
    keys = row_keys(np.array([step for step, _ in pairs]), [sample_id for _, sample_id in pairs])
    assert len(set(keys.tolist())) == len(pairs)


def test_no_duplicate_warning_for_unique_rows(tmp_path: Path) -> None:
    path = write_sequence_dump(tmp_path / "unique.parquet", random_rows(15))
    assert not any("duplicate" in w for w in analyze(path)["warnings"])


# ------------------------------------------------------------------------------------------ --workers
@pytest.fixture(scope="module")
def mixed_directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Files whose columns differ (no step; SkyRL names; a tokens column the others lack), two of them
    duplicating each other's ids, one with glob characters in its name, several row groups each."""
    folder = tmp_path_factory.mktemp("mixed")
    write_sequence_dump(folder / "part[0].parquet", random_rows(20, steps=(0, 1)), row_group_size=3)
    write_sequence_dump(folder / "no_step.parquet", random_rows(21, steps=(0,)), names={"step": None})
    skyrl = {"rollout": "rollout_logprobs", "trainer": "action_log_probs", "mask": "loss_mask"}
    write_sequence_dump(folder / "skyrl.parquet", random_rows(22, steps=(2, 3)), names=skyrl, row_group_size=5)
    with_tokens = random_rows(23, steps=(1, 4))
    for row in with_tokens:
        row["tokens"] = [f"w{i}" for i in range(len(row["rollout"]))]
    write_sequence_dump(folder / "tokens.parquet", with_tokens, row_group_size=2)
    write_sequence_dump(folder / "no_mask.parquet", random_rows(24, steps=(5,)), names={"mask": None})
    return folder


@pytest.mark.parametrize("workers", [2, 4])
def test_workers_give_the_one_process_result_on_mixed_files(mixed_directory: Path, workers: int) -> None:
    one = analyze(str(mixed_directory))
    many = analyze(str(mixed_directory), workers=workers)
    assert many["inputs"] == one["inputs"] and str(mixed_directory / "part[0].parquet") in one["inputs"]
    assert sorted(many["warnings"]) == sorted(one["warnings"])
    assert any("no mask column" in w for w in one["warnings"])
    for mine, theirs in [(many["run"], one["run"]), *zip(many["steps"], one["steps"], strict=True)]:
        assert (mine.get("step"), mine["rows"], mine["tokens"]) == (
            theirs.get("step"),
            theirs["rows"],
            theirs["tokens"],
        )
        assert mine["metrics"].keys() == theirs["metrics"].keys()
        for name, value in theirs["metrics"].items():
            assert mine["metrics"][name] == pytest.approx(value, rel=1e-12, abs=1e-300, nan_ok=True), name
    assert [r["sample_id"] for r in many["worst_rows"]] == [r["sample_id"] for r in one["worst_rows"]]


def test_workers_take_a_file_whose_name_looks_like_a_glob(tmp_path: Path) -> None:
    path = write_sequence_dump(tmp_path / "part[0].parquet", random_rows(25), row_group_size=4)
    assert analyze(path, workers=2)["run"]["rows"] == analyze(path)["run"]["rows"] == 12


# ------------------------------------------------------------------------------------------ symlink loops
def test_symlink_loops_in_a_directory_are_skipped_with_a_warning(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_sequence_dump(run / "a.parquet", random_rows(30))
    write_sequence_dump(run / "sub" / "b.parquet", random_rows(31, steps=(5,)))
    (run / "sub" / "back").symlink_to(run, target_is_directory=True)  # sub/back -> run: a loop
    (run / "self").symlink_to(run / "self")  # a link to itself
    (run / "again").symlink_to(run / "sub", target_is_directory=True)  # no loop: the same files once
    for typed in (str(run), f"{run}/**/*.parquet"):
        document = analyze(typed)
        assert document["inputs"] == [str(run / "a.parquet"), str(run / "again" / "b.parquet")] or document[
            "inputs"
        ] == [str(run / "a.parquet"), str(run / "sub" / "b.parquet")]
        loops = [w for w in document["warnings"] if "symlink loop" in w]
        assert any(w.endswith(f"/back: symlink loop (leads back to {run.resolve()}); skipped.") for w in loops), typed
        assert f"{run / 'self'}: symlink loop; skipped." in loops or typed.endswith("*.parquet")
    result = cli("analyze", f"{run}/**/*.parquet", "--device", "cpu", "-f", "json")
    assert result.exit_code == 0


def test_a_directory_dump_is_read_in_step_order(tmp_path: Path) -> None:
    """``step=10/`` after ``step=9/``, not after ``step=1/`` (text order): each chunk then goes on from the one
    before, and files and rows are listed in the order the run wrote them. Globs list theirs the same way."""
    run = tmp_path / "run"
    for step in (1, 2, 9, 10, 11):
        for rank in (0, 1, 10, 2):
            write_sequence_dump(
                run / f"step={step}" / f"rank-{rank}.parquet", random_rows(step * 100 + rank, steps=(step,))
            )
    expected = [
        str(run / f"step={step}" / f"rank-{rank}.parquet") for step in (1, 2, 9, 10, 11) for rank in (0, 1, 2, 10)
    ]
    assert analyze(run)["inputs"] == expected
    assert analyze(f"{run}/step=*/*.parquet")["inputs"] == expected
    assert [s.path for s in expand_inputs([run / "step=*"])] == expected


def test_natural_order_compares_digit_runs_as_numbers_and_breaks_ties_by_text() -> None:
    names = ["a10", "a9", "a09", "b1", "a", "a1b2", "a1b10", "10", "9", "a²"]
    assert sorted(names, key=natural_key) == ["9", "10", "a", "a1b2", "a1b10", "a09", "a9", "a10", "a²", "b1"]


# ------------------------------------------------------------------------------------------ option checks
@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--max-rounds", "1000000000", "--max-rounds 1000000000: must be a whole number from 1 to 4096."),
        ("--max-rounds", "0", "--max-rounds 0: must be"),
        ("--workers", "0", "--workers 0: must be a whole number from 1 to 1024."),
        ("--workers", "100000", "--workers 100000: must be"),
        ("--backend", "foo", "--backend foo: choose process or ray."),
        ("--top-k", "0", "--top-k 0: must be a whole number from 1 to 1000."),
        ("--top-k", "1000000", "--top-k 1000000: must be"),
        ("--chunk-tokens", "0", "--chunk-tokens 0: must be a positive whole number of tokens."),
        ("--catastrophic", "inf", "--catastrophic inf: must be a positive, finite"),
    ],
)
def test_options_out_of_range_are_one_line_errors(tmp_path: Path, option: str, value: str, message: str) -> None:
    path = write_sequence_dump(tmp_path / "ok.parquet", random_rows(32))
    assert message in one_error_line(cli("analyze", path, option, value, "--device", "cpu"))


@pytest.mark.parametrize(
    "options", [{"workers": 0}, {"backend": "foo", "workers": 2}, {"backend": "foo"}, {"chunk_tokens": 0}]
)
def test_library_rejects_bad_options_for_every_command(tmp_path: Path, options: dict) -> None:
    path = str(write_sequence_dump(tmp_path / "ok.parquet", random_rows(33)))
    named = rf"^({'|'.join(options)})="  # the library names its own keyword argument, not a CLI flag
    with pytest.raises(rd.ConfigError, match=named):
        rd.analyze(path, device="cpu", **options)
    with pytest.raises(rd.ConfigError, match=named):
        rd.compare_presets(path, ["verl"], device="cpu", **options)


# ------------------------------------------------------------------------------------------ inspect
def test_inspect_row_selects_every_row_the_tables_print(tmp_path: Path) -> None:
    rows = random_rows(40, steps=(0, 1), rows_per_step=3)
    first = write_sequence_dump(tmp_path / "a.parquet", rows)
    second = write_sequence_dump(tmp_path / "b.parquet", rows, row_group_size=2)  # the same ids again
    document = analyze([str(first), str(second)])
    assert any(w.startswith("duplicate (step, sample_id)") for w in document["warnings"])
    with pytest.raises(rd.DataError, match="names 2 rows"):
        rd.inspect_row([str(first), str(second)], rows[4]["sample_id"], step=rows[4]["step"], device="cpu")
    for shown in document["worst_rows"]:
        place = f"{Path(shown['file']).name}:{shown['row']}"  # what the worst-rows table prints
        tokens = rd.inspect_row([str(first), str(second)], row=place, device="cpu")
        assert (tokens.file, tokens.row, tokens.sample_id) == (shown["file"], shown["row"], shown["sample_id"])
        assert tokens.rollout_logprob == pytest.approx(
            [v if m else 0.0 for v, m in zip(rows[shown["row"]]["rollout"], rows[shown["row"]]["mask"], strict=True)]
        )
    line = one_error_line(cli("inspect", first, second, "--row", "c.parquet:1", "--device", "cpu"))
    assert "--row c.parquet:1: no input file named c.parquet" in line
    assert "has rows 0 to 5" in one_error_line(cli("inspect", first, "--row", "a.parquet:6", "--device", "cpu"))


def test_inspect_step_alone_shows_the_worst_row_of_that_step(tmp_path: Path) -> None:
    rows = random_rows(41, steps=(0, 1, 2), rows_per_step=4)
    path = write_sequence_dump(tmp_path / "run.parquet", rows, row_group_size=4)
    for step in (0, 1, 2):
        expected = analyze(
            write_sequence_dump(tmp_path / f"only{step}.parquet", [r for r in rows if r["step"] == step])
        )
        worst = next(r for r in expected["worst_rows"] if r["criterion"] == "log_ppl_abs_diff")
        assert rd.inspect_row(str(path), step=step, device="cpu").sample_id == worst["sample_id"]
    run_worst = next(r for r in analyze(path)["worst_rows"] if r["criterion"] == "log_ppl_abs_diff")
    assert rd.inspect_row(str(path), device="cpu").sample_id == run_worst["sample_id"]
    with pytest.raises(rd.DataError, match="in step 9"):
        rd.inspect_row(str(path), step=9, device="cpu")


@pytest.mark.parametrize("layout", ["sequence", "token"])
def test_inspect_reads_only_the_row_groups_that_can_hold_the_row(tmp_path: Path, layout: str) -> None:
    rows = random_rows(42, steps=tuple(range(8)), rows_per_step=2)
    writer = write_sequence_dump if layout == "sequence" else write_token_dump
    size = 2 if layout == "sequence" else 16
    path = writer(tmp_path / "run.parquet", rows, row_group_size=size)
    reader = rd.DumpReader(str(path))
    reader.narrow(step=5, sample_id="s5-1")
    groups = reader.parts[str(path)]
    assert 0 < len(groups) < pq.ParquetFile(path).metadata.num_row_groups // 2
    tokens = rd.inspect_row(str(path), "s5-1", step=5, device="cpu")
    assert tokens.trainer_logprob == pytest.approx(
        [v if m else 0.0 for v, m in zip(rows[11]["trainer"], rows[11]["mask"], strict=True)]
    )


def test_inspect_around_a_position_of_a_long_row_lists_only_the_window(tmp_path: Path) -> None:
    length = 2_000_000
    rng = np.random.default_rng(43)
    trainer = -rng.exponential(1.0, length).astype(np.float32)
    rollout = (trainer + rng.normal(0, 0.01, length).astype(np.float32)).clip(max=0)
    rollout[1_234_567] = -30.0  # the largest |δ|
    long_row = pa.table(
        {
            "step": pa.array([0, 1], pa.int64()),
            "sample_id": ["long", "short"],
            "rollout_log_probs": pa.array([rollout, rollout[:5]], pa.list_(pa.float32())),
            "old_log_probs": pa.array([trainer, trainer[:5]], pa.list_(pa.float32())),
        }
    )
    path = write_table(tmp_path / "long.parquet", long_row, row_group_size=1)
    tokens = rd.inspect_row(str(path), "long", around=1_000_000, window=10, device="cpu")
    assert (tokens.start, tokens.row_length, len(tokens.mask)) == (999_995, length, 10)
    assert tokens.trainer_logprob == pytest.approx(trainer[999_995:1_000_005].astype(np.float64).tolist())
    centred = rd.inspect_row(str(path), "long", window=5, device="cpu")
    assert centred.start == 1_234_565 and centred.rollout_logprob[2] == -30.0
    document = json.loads(cli("inspect", path, "-s", "long", "--around", "7", "--window", "4", "-f", "json").stdout)
    assert (document["start"], document["row_length"], len(document["mask"])) == (5, length, 4)
    assert "the row has 5 tokens" in one_error_line(
        cli("inspect", path, "-s", "short", "--around", "5", "--device", "cpu")
    )
    assert "--window 0" in one_error_line(cli("inspect", path, "--window", "0", "--device", "cpu"))


LINUX = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts descriptors in /proc/self/fd (Linux)")


@LINUX
def test_a_directory_of_more_files_than_open_descriptors_is_read(tmp_path: Path) -> None:
    # Every file was kept open from its footer to the end: 300 files under a limit of 256 descriptors failed
    # ("Too many open files", as a traceback). Now a file is open only while its row groups are read.
    for i in range(300):
        write_sequence_dump(tmp_path / f"part-{i:04d}.parquet", random_rows(i, steps=[i // 30], rows_per_step=1))
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))\n"
        "import rollout_diag as rd\n"
        f"result = rd.analyze({str(tmp_path)!r}, device='cpu', workers=1)\n"
        "print(result.run.rows)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "300"


@LINUX
def test_a_read_file_lets_its_descriptor_and_buffers_go(tmp_path: Path) -> None:
    from rollout_diag.io.formats.base import ParquetSource

    path = write_sequence_dump(tmp_path / "big.parquet", random_rows(5, rows_per_step=300, max_length=600))
    pool = pa.default_memory_pool()
    # an earlier test's reading left to the collector (an error's traceback holds its frames) closes here: its
    # decoding threads finish and free their blocks before the count starts, not while this test counts
    before, descriptors = _settled(pool), len(os.listdir("/proc/self/fd"))
    source = ParquetSource(str(path))
    assert len(os.listdir("/proc/self/fd")) == descriptors  # the footer's handle is closed
    for batch in source.iter_batches(batch_size=64, row_groups=[0], columns=["old_log_probs"], use_threads=False):
        assert batch.num_rows > 0
    del batch
    assert len(os.listdir("/proc/self/fd")) == descriptors + 1
    # pyarrow 26's open file holds the row group's compressed column chunk (pyarrow 14's does not): gone once closed
    source.close()
    assert len(os.listdir("/proc/self/fd")) == descriptors
    # pyarrow's I/O threads hand their last buffers back just after the close returns (seen once in CI on a loaded
    # 2-core machine: 1.7 MB still counted): wait for the pool, a few seconds at most; a buffer the source keeps
    # never comes back, and fails here
    deadline = time.monotonic() + 5.0
    while pool.bytes_allocated() != before and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)
    assert pool.bytes_allocated() == before


def _settled(pool: pa.MemoryPool, seconds: float = 5.0) -> int:
    """The pool's bytes once they stop moving (an earlier test's threads may still be finishing), a few seconds at
    most."""
    deadline, last = time.monotonic() + seconds, -1
    while time.monotonic() < deadline:
        gc.collect()
        now = pool.bytes_allocated()
        if now == last:
            return now
        last = now
        time.sleep(0.05)
    return last


def test_a_file_rewritten_after_its_footer_was_read_is_an_input_error(tmp_path: Path) -> None:
    # Kept open, a file replaced meanwhile was read as it was; reopened by its path, the old footer's offsets would
    # point into the new file's bytes. So a file that changed says so, in one line.
    path = write_sequence_dump(tmp_path / "run.parquet", random_rows(1, rows_per_step=3))
    dump = rd.Dump([str(path)], device="cpu", workers=1).opened()  # the footer is read now
    write_sequence_dump(tmp_path / "new.parquet", random_rows(2, rows_per_step=5)).replace(path)
    with pytest.raises(rd.InputError, match=r"run\.parquet: the file changed while it was read"):
        rd.analyze(dump)
    assert rd.analyze(str(path), device="cpu", workers=1).run.rows == 15  # read again: the new file
