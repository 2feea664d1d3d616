"""Input hardening (issue 9, the input items): inputs users really have, hostile directories, --workers,
option validation, warnings that stop silent wrong answers, and a fast ``inspect``."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from dumps import (
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
from typer.testing import CliRunner

import rollout_diag as rd
from rollout_diag.cli import app

runner = CliRunner()
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


def error_line(result) -> str:
    assert result.exit_code == 1, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "internal error" not in lines[0]
    return lines[0]


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
    assert "null step" in error_line(cli("analyze", path, "--strict", "--device", "cpu"))
