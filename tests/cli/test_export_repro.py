"""``analyze --export-repro FILE``: the fixture's contents against the dump, its bounds, the refusals, the JSON."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq

from rollout_diag.drivers.repro import MAX_ROWS_PER_PROMPT
from rollout_diag.results import AnalysisResult
from tests.helpers.cli import invoke, one_error_line, succeeded
from tests.helpers.prompts import prompt_rows, write_prompt_dump


def _dump(tmp_path, **options):
    made = prompt_rows(4, extreme=2, new_per_step=20, recurring_per_step=20, **options)
    return write_prompt_dump(tmp_path / "d.parquet", made), made


def test_the_fixture_holds_the_extreme_prompts_rows_as_dumped(tmp_path):
    path, _ = _dump(tmp_path, extreme_group=1)
    out = tmp_path / "repro.jsonl"
    result = invoke("analyze", path, "--export-repro", out, "-f", "json")
    document = json.loads(succeeded(result))
    assert "16 rows of 2 prompts that are extreme every time" in result.stderr
    listed = [item["prompt"] for item in document["prompts"]["extreme"]]
    assert sorted(listed) == ["x0", "x1"]
    AnalysisResult.from_json(document)  # the schema holds
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 16 and [line["prompt"] for line in lines] == [p for p in listed for _ in range(8)]
    table = pq.read_table(path).to_pylist()
    for line in lines:
        source = table[line["row"]]
        assert line["sample_id"] == source["sample_id"] and line["step"] == source["step"]
        assert line["token_ids"] == source["token_ids"]
        assert line["response_mask"] == source["response_mask"]
        model = np.array(source["response_mask"], bool)
        # the model tokens' logprobs as dumped (float32, read back as float64); mask-0 tokens are written as 0.0
        np.testing.assert_array_equal(np.array(line["old_log_probs"])[model], np.array(source["old_log_probs"])[model])
        np.testing.assert_array_equal(
            np.array(line["rollout_log_probs"])[model], np.array(source["rollout_log_probs"])[model]
        )
        assert not any(np.array(line["rollout_log_probs"])[~model])
        assert line["row_score"] >= document["prompts"]["worst_threshold"]
        assert line["prompt_key"] == next(
            i["key"] for i in document["prompts"]["extreme"] if i["prompt"] == line["prompt"]
        )
    assert sorted(line["step"] for line in lines if line["prompt"] == "x0") == list(range(8))


def test_at_most_a_few_rows_per_prompt(tmp_path):
    path, _ = _dump(tmp_path, extreme_group=2)  # 16 rows per prompt
    out = tmp_path / "repro.jsonl"
    succeeded(invoke("analyze", path, "--export-repro", out))
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    per_prompt = {}
    for line in lines:
        per_prompt[line["prompt"]] = per_prompt.get(line["prompt"], 0) + 1
    assert per_prompt and all(count == MAX_ROWS_PER_PROMPT for count in per_prompt.values())


def test_no_extreme_prompt_writes_an_empty_file(tmp_path):
    path = write_prompt_dump(tmp_path / "d.parquet", prompt_rows(5))
    out = tmp_path / "repro.jsonl"
    result = invoke("analyze", path, "--export-repro", out)
    succeeded(result)
    assert out.read_text() == "" and "no prompt is extreme every time" in result.stderr


def test_an_input_as_the_fixture_is_refused(tmp_path):
    path, _ = _dump(tmp_path)
    line = one_error_line(invoke("analyze", path, "--export-repro", path))
    assert "--export-repro" in line and "input" in line


def test_a_dump_without_a_prompt_identity_is_one_line(tmp_path):
    sample = tmp_path / "s.parquet"
    made = prompt_rows(5)
    for row in made:
        row["response_mask"] = [1] * len(row["response_mask"])
    write_prompt_dump(sample, made, prompt_column=None)
    line = one_error_line(invoke("analyze", sample, "--export-repro", tmp_path / "r.jsonl"))
    assert "no prompt identity" in line and "--column prompt_id=NAME" in line
    assert not (tmp_path / "r.jsonl").exists()
