"""The prompt identity (rollout_diag/io/prompts.py, the prompt_id role): keys against slow references, the column role
and its bad inputs, the token-id prefix."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import rollout_diag as rd
from rollout_diag.io import prompts
from rollout_diag.io.reader import DumpReader
from tests.helpers.cli import invoke, one_error_line
from tests.helpers.prompts import prompt_rows, prompt_table, write_prompt_dump

MASK64 = (1 << 64) - 1


def reference_text_key(value: object) -> int:
    """BLAKE2b-64 of the value's text, little-endian, as a signed int64 (0 → 1)."""
    unsigned = int.from_bytes(hashlib.blake2b(str(value).encode(), digest_size=8).digest(), "little")
    signed = unsigned - (1 << 64) if unsigned >= 1 << 63 else unsigned
    return signed or 1


def reference_prefix_key(ids: list[int]) -> int:
    """Σ (id + 1)·P^t mod 2^64, the length folded in, splitmix64's finaliser: plain Python integers."""
    base, salt = 0x9E3779B97F4A7C15, 0xD6E8FEB86659FD93
    total = sum((token + 1) * pow(base, t, 1 << 64) for t, token in enumerate(ids)) & MASK64
    z = total ^ ((len(ids) * salt) & MASK64)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    z ^= z >> 31
    signed = z - (1 << 64) if z >= 1 << 63 else z
    return signed or 1


def test_text_keys_match_the_reference_and_ignore_the_type():
    assert prompts.text_key("uid-7") == reference_text_key("uid-7")
    assert prompts.text_key(5) == prompts.text_key("5") == reference_text_key("5")
    keys, nulls = prompts.column_keys(pa.array(["a", None, "b", "a"]))
    assert nulls == 1 and keys[1] == prompts.NO_PROMPT
    assert keys[0] == keys[3] == reference_text_key("a") and keys[2] == reference_text_key("b")
    int_keys, _ = prompts.column_keys(pa.array([5, 6], pa.int32()))
    assert int_keys.tolist() == [reference_text_key(5), reference_text_key(6)]


def test_token_prefix_keys_match_the_reference():
    rng = np.random.default_rng(0)
    rows = [(rng.integers(0, 150_000, n).tolist(), lead) for n, lead in ((12, 5), (3, 3), (9, 0), (40, 17), (6, 6))]
    token_ids = np.concatenate([np.array(ids, dtype=np.int64) for ids, _ in rows])
    mask = np.concatenate([np.arange(len(ids)) >= lead for ids, lead in rows])
    offsets = np.concatenate([[0], np.cumsum([len(ids) for ids, _ in rows])]).astype(np.int64)
    keys = prompts.token_prefix_keys(token_ids, mask, offsets)
    # a row without a model token: its whole row is the prefix; a row that starts with one has none
    expected = [reference_prefix_key(ids[:lead]) if lead else prompts.NO_PROMPT for ids, lead in rows]
    assert keys.tolist() == expected
    # the same prefix under another response: the same key; one token changed: another
    again = prompts.token_prefix_keys(
        np.array([*rows[0][0][:5], 1, 2], np.int64), np.array([0] * 5 + [1, 1]), np.array([0, 7])
    )
    assert again[0] == keys[0]
    changed = prompts.token_prefix_keys(
        np.array([*rows[0][0][:4], 9, 1], np.int64), np.array([0] * 5 + [1]), np.array([0, 6])
    )
    assert changed[0] != keys[0]


def _keys(path, **options) -> tuple[list[int], str | None]:
    reader = DumpReader([str(path)], options.pop("columns", None), **options)
    keys, source = [], None
    for chunk, _ in reader.chunks("cpu"):
        if chunk.prompt_key is not None:
            keys += chunk.prompt_key.tolist()
            source = chunk.prompt_source
    return keys, source


@pytest.mark.parametrize("name", ["prompt_id", "prompt_hash", "prompt_uid", "group_id", "uid"])
def test_built_in_prompt_column_names(tmp_path, name):
    made = prompt_rows(0, steps=2, new_per_step=2, recurring_per_step=1, group=2)
    table = prompt_table(made, prompt_column=name)
    if name == "uid":  # uid is a sample_id name too: beside a sample_id column, that role is ambiguous (as before)
        table = table.drop(["sample_id"])
    pq.write_table(table, tmp_path / "d.parquet")
    keys, source = _keys(tmp_path / "d.parquet")
    assert source == f"column {name}"
    assert keys == [reference_text_key(row["prompt_id"]) for row in made]


def test_the_first_prompt_name_wins_without_an_error(tmp_path):
    made = prompt_rows(0, steps=2, new_per_step=2, recurring_per_step=1, group=2)
    table = prompt_table(made).append_column("group_id", pa.array([f"g{i}" for i in range(len(made))]))
    pq.write_table(table, tmp_path / "d.parquet")
    keys, source = _keys(tmp_path / "d.parquet")
    assert source == "column prompt_id" and keys[0] == reference_text_key(made[0]["prompt_id"])


def test_without_a_column_the_prompt_tokens_identify_the_prompt(tmp_path):
    made = prompt_rows(0, steps=2, new_per_step=2, recurring_per_step=1, group=2)
    path = write_prompt_dump(tmp_path / "d.parquet", made, prompt_column=None)
    keys, source = _keys(path)
    assert source == prompts.TOKENS_SOURCE
    expected = [reference_prefix_key(row["token_ids"][: row["response_mask"].index(1)]) for row in made]
    assert keys == expected
    by_prompt = {}
    for row, key in zip(made, keys, strict=True):
        assert by_prompt.setdefault(row["prompt_id"], key) == key  # a recurring prompt: one key


def test_the_prompt_column_still_rides_with_the_worst_rows(tmp_path):
    made = prompt_rows(0, steps=2, new_per_step=2, recurring_per_step=1, group=2)
    path = write_prompt_dump(tmp_path / "d.parquet", made, prompt_column="group_id")
    result = rd.analyze(str(path), device="cpu")
    assert "group_id" in result.worst_rows[0].extra
    assert result.columns["prompt_id"] == "group_id"


def test_null_prompt_ids_are_analysed_and_counted(tmp_path):
    made = prompt_rows(0, steps=2, new_per_step=2, recurring_per_step=1, group=2)
    table = prompt_table(made)
    ids = table.column("prompt_id").to_pylist()
    ids[0] = ids[3] = None
    table = table.set_column(table.schema.get_field_index("prompt_id"), "prompt_id", pa.array(ids))
    pq.write_table(table, tmp_path / "d.parquet")
    result = rd.analyze(str(tmp_path / "d.parquet"), device="cpu")
    assert result.run.rows == len(made)
    assert result.prompts.rows_without == 2 and result.prompts.rows_keyed == len(made) - 2
    assert any("2 row(s) have a null prompt_id" in warning for warning in result.warnings)


def test_a_named_list_column_is_a_one_line_error(tmp_path):
    made = prompt_rows(0, steps=2, new_per_step=2, recurring_per_step=1, group=2)
    table = prompt_table(made).append_column("ragged", pa.array([[1, 2]] * len(made)))
    pq.write_table(table, tmp_path / "d.parquet")
    line = one_error_line(invoke("analyze", tmp_path / "d.parquet", "--column", "prompt_id=ragged"))
    assert "column 'ragged'" in line and "expected one integer or string prompt id per row" in line
    assert "list<int64>" in line


def test_a_found_list_column_is_no_prompt_id(tmp_path):
    # a dump that read before the role existed still reads: a group_id of lists is not taken as the prompt's
    made = prompt_rows(0, steps=2, new_per_step=2, recurring_per_step=1, group=2)
    table = prompt_table(made, prompt_column=None).append_column("group_id", pa.array([[1, 2]] * len(made)))
    pq.write_table(table, tmp_path / "d.parquet")
    _, source = _keys(tmp_path / "d.parquet")
    assert source == prompts.TOKENS_SOURCE  # the token prefix instead
