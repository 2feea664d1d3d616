"""Skipped data is part of the answer (issue 39): rows skipped as invalid are counted "of" the input in the header,
said directly under the verdict with their reasons, and above 1 % of the rows or tokens they make the verdict a
pipeline bug (``invalid_rows``), withhold the recommendation and fail ``check`` (gate ``skipped_row_share``).

Every dump is built here: rows of 50 model tokens whose trainer logprobs are the rollout's plus a small noise, some
rows spoiled the way a broken writer spoils them.
"""

from __future__ import annotations

import html
import io
import json
import math
import re
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import jsonschema
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.cli import error_line, invoke
from rich.console import Console

import rollout_diag as rd
from rollout_diag.decisions.skipped import SKIPPED_SHARE_LIMIT, too_much_skipped
from rollout_diag.render.analysis import render_analysis
from rollout_diag.report import render_report
from rollout_diag.results import AnalysisResult, ComparisonResult, SkippedData

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
LENGTH = 50  # model tokens per row


def write_dump(path: Path, rows: int, spoil: dict[int, list[float]]) -> Path:
    """``rows`` rows of LENGTH tokens over 4 steps; row i's trainer logprobs replaced by ``spoil[i]`` where given."""
    rng = np.random.default_rng(7)
    records = []
    for index in range(rows):
        rollout = -rng.exponential(0.5, LENGTH)
        trainer = np.minimum(rollout + rng.normal(0.0, 0.02, LENGTH), 0.0).tolist()
        records.append(
            {
                "step": index * 4 // rows,
                "sample_id": f"s{index}",
                "rollout_log_probs": rollout.tolist(),
                "old_log_probs": spoil.get(index, trainer),
                "response_mask": [1] * LENGTH,
            }
        )
    pq.write_table(pa.Table.from_pylist(records), path)
    return path


@pytest.fixture(scope="module")
def half_nan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """64 of 128 rows with every trainer logprob NaN (a trainer side that never scored half the batch)."""
    return write_dump(
        tmp_path_factory.mktemp("half") / "half_nan.parquet", 128, {i: [math.nan] * LENGTH for i in range(1, 128, 2)}
    )


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A writer killed mid-write: 249 of 250 rows with trainer logprobs slightly above 0 (1e-3, not logprobs)."""
    return write_dump(
        tmp_path_factory.mktemp("killed") / "killed.parquet", 250, {i: [1e-3] * LENGTH for i in range(1, 250)}
    )


@pytest.fixture(scope="module")
def few(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1 of 200 rows NaN: 0.5 %, under the 1 % limit."""
    return write_dump(tmp_path_factory.mktemp("few") / "few.parquet", 200, {17: [math.nan] * LENGTH})


def terminal(result: AnalysisResult, width: int = 200) -> list[str]:
    stream = io.StringIO()
    Console(file=stream, width=width, color_system=None, soft_wrap=False).print(render_analysis(result))
    return stream.getvalue().splitlines()


def banner(page: str) -> str:
    found = re.search(r'<div class="overall [a-z]+">(.*?)</div>', page, re.S)
    assert found, "the report has no verdict banner"
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", found.group(1))).split())


# ----------------------------------------------------------------------------------------- the summary itself
def test_shares_and_words_of_a_hand_built_summary() -> None:
    # 3 of 400 rows = 0.75 % (under 1 %), but 300 of 20 000 tokens = 1.5 %: the tokens alone make it too much
    summary = SkippedData(3, 400, 300, 20_000, {"trainer logprobs NaN": 2, "rollout logprobs null": 1})
    assert summary.row_share == 3 / 400 and summary.token_share == 300 / 20_000
    assert too_much_skipped(summary)
    assert summary.line() == "3 of 400 rows (0.75 %) skipped: trainer logprobs NaN (2), rollout logprobs null (1)"
    assert summary.counts(397, 19_700) == "397 of 400 rows, 19,700 of 20,000 model tokens"
    # exactly at the limit is not above it: 4 of 400 rows = 1 %, 200 of 20 000 tokens = 1 %
    assert not too_much_skipped(SkippedData(4, 400, 200, 20_000, {"x": 4}))
    assert SKIPPED_SHARE_LIMIT == 0.01
    assert SkippedData().line() == "" and SkippedData().counts(5, 50) == "5 rows, 50 model tokens"


# ----------------------------------------------------------------------------------------- half the rows NaN
def test_half_nan_rows_make_a_pipeline_verdict(half_nan: Path) -> None:
    result = rd.analyze(half_nan, device="cpu")
    skipped = result.skipped_data
    # 64 rows × 50 tokens skipped of 128 × 50
    assert (skipped.rows, skipped.input_rows, skipped.tokens, skipped.input_tokens) == (64, 128, 3200, 6400)
    assert skipped.reasons == {"trainer logprobs NaN": 64}
    assert skipped.first is not None and skipped.first.row == 1 and skipped.first.column == "old_log_probs"
    assert result.verdict.level == "bad" and result.verdict.cause == "pipeline"
    assert result.verdict.findings[0] == "invalid_rows" and result.hints[0].id == "invalid_rows"
    lines = terminal(result)
    assert "64 of 128 rows, 3,200 of 6,400 model tokens" in lines[0]
    assert lines[2].startswith("Verdict: BAD (pipeline bug)")
    under = next(i for i, line in enumerate(lines) if line.startswith("  ↳ invalid_rows:"))
    assert under <= 5 and "64 of 128 rows (50 %) skipped: trainer logprobs NaN (all 64)" in lines[under]
    document = json.loads(json.dumps(result.to_json(), allow_nan=False))
    jsonschema.validate(document, json.loads((SCHEMAS / "result.schema.json").read_text()))
    assert document["skipped_data"]["row_share"] == 0.5 and document["skipped_data"]["reasons"] == {
        "trainer logprobs NaN": 64
    }
    assert AnalysisResult.from_json(document).skipped_data == skipped
    page = banner(render_report(result))
    assert "pipeline bug" in page and "64 of 128 rows (50 %) skipped: trainer logprobs NaN (all 64)" in page


def test_half_nan_rows_withhold_the_recommendation(half_nan: Path) -> None:
    comparison = rd.compare_presets(half_nan, device="cpu")
    assert comparison.recommendation is None
    assert "invalid_rows" in comparison.recommendation_withheld
    assert "64 of 128 rows (50 %) skipped" in comparison.recommendation_withheld
    document = json.loads(json.dumps(comparison.to_json(), allow_nan=False))
    assert document["recommendation"] is None and document["skipped_data"]["rows"] == 64
    assert ComparisonResult.from_json(document).skipped_data == comparison.skipped_data
    out = invoke("compare-presets", half_nan, "--device", "cpu", "--preset", "verl")
    assert out.exit_code == 0, out.stderr
    head = " ".join(" ".join(out.stdout.splitlines()[:12]).split())  # the first lines, folded to the terminal
    assert head.startswith("Verdict: BAD (pipeline bug)")
    assert "↳ invalid_rows: 64 of 128 rows (50 %) skipped: trainer logprobs NaN (all 64)" in head
    assert "Recommendation: withheld" in head


def test_check_fails_on_half_nan_rows_in_text_json_and_junit(half_nan: Path, tmp_path: Path) -> None:
    junit = tmp_path / "check.xml"
    text = invoke("check", half_nan, "--device", "cpu", "--max", "k3_kl=1e-2", "--junit", junit)
    assert text.exit_code == 3
    # k3_kl passes; the default skipped_row_share gate (0.5 > 0.01) fails: 1 of 2 gates, 1 of 2 checks
    assert "FAIL: 1 of 2 gates failed, in 1 of 2 checks" in text.stdout
    assert "skipped_row_share" in text.stdout and "--strict" in text.stdout
    assert "64 of 128 rows (50 %) skipped: trainer logprobs NaN (all 64)" in text.stdout
    cases = ElementTree.parse(junit).getroot().find("testsuite").findall("testcase")
    failed = [case for case in cases if case.find("failure") is not None]
    assert [case.get("name") for case in failed] == ["skipped_row_share ≤ 0.01"]
    assert "--strict" in failed[0].find("failure").get("message")
    as_json = invoke("check", half_nan, "--device", "cpu", "--max", "k3_kl=1e-2", "-f", "json")
    assert as_json.exit_code == 3
    document = json.loads(as_json.stdout)
    jsonschema.validate(document, json.loads((SCHEMAS / "check.schema.json").read_text()))
    (outcome,) = [o for o in document["outcomes"] if o["metric"] == "skipped_row_share"]
    assert (outcome["value"], outcome["status"], outcome["step"]) == (0.5, "fail", None)
    assert document["failures"] == 1 and document["failed_gates"] == 1
    # a looser limit set by hand passes; --strict makes the first skipped row an error (exit 1)
    loose = invoke("check", half_nan, "--device", "cpu", "--max", "k3_kl=1e-2", "--max", "skipped_row_share=0.6")
    assert loose.exit_code == 0, loose.stdout
    strict = invoke("check", half_nan, "--device", "cpu", "--max", "k3_kl=1e-2", "--strict")
    assert strict.exit_code == 1 and "row 1" in error_line(strict)


# ----------------------------------------------------------------------------------------- a killed writer
def test_positive_logprobs_of_a_killed_writer_are_no_ok_verdict(killed: Path) -> None:
    result = rd.analyze(killed, device="cpu")
    assert result.skipped_data.reasons == {"trainer logprobs positive": 249}
    assert result.verdict.cause == "pipeline" and result.verdict.findings == ["invalid_rows"]
    lines = terminal(result)
    assert "1 of 250 rows, 50 of 12,500 model tokens" in lines[0]
    assert any("249 of 250 rows (99.6 %) skipped: trainer logprobs positive (all 249)" in line for line in lines[:6])


# ----------------------------------------------------------------------------------------- at most 1 % skipped
def test_a_few_skipped_rows_are_said_but_judge_nothing(few: Path) -> None:
    result = rd.analyze(few, device="cpu")
    assert result.skipped_data.row_share == 1 / 200
    assert result.verdict.cause != "pipeline" and "invalid_rows" not in [hint.id for hint in result.hints]
    lines = terminal(result)
    assert "199 of 200 rows, 9,950 of 10,000 model tokens" in lines[0]
    assert lines[3] == "  1 of 200 rows (0.5 %) skipped: trainer logprobs NaN (1)"  # directly under the verdict
    assert "1 of 200 rows (0.5 %) skipped" in banner(render_report(result))
    # not withheld for the skipped rows (the data is clean: ok, so "no correction needed", docs/recommendation.md)
    withheld = rd.compare_presets(few, device="cpu").recommendation_withheld
    assert withheld is not None and withheld.startswith("no correction needed") and "invalid_rows" not in withheld
    assert invoke("check", few, "--device", "cpu", "--max", "k3_kl=1e-2").exit_code == 0
    tight = invoke("check", few, "--device", "cpu", "--max", "k3_kl=1e-2", "--max", "skipped_row_share=1e-3")
    assert tight.exit_code == 3 and "skipped_row_share" in tight.stdout
