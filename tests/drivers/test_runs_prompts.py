"""``runs``: prompts matched across runs. Three runs share a pool of prompt ids; two planted prompts carry a large δ on
every row in every run (deterministic outliers, NeMo-RL #2100) and are listed, with too few rows a run for the
single-run rule; clean runs list none; without a prompt identity, or without a prompt in two runs, nothing is
matched; the matched values against a float64 reference, and the same for any chunking or process split; the
``--export-repro`` lines against the dumps."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rollout_diag.decisions.prompts import EXTREME_MAX_CHANCE, matched_prompts, prompt_findings
from rollout_diag.drivers.dump import Dump
from rollout_diag.drivers.repro import MAX_ROWS_PER_PROMPT, export_runs_repro
from rollout_diag.drivers.runs import RunSpec, compare_dumps, read_run
from rollout_diag.io.prompts import TOKENS_SOURCE
from tests.helpers.prompts import matched_run_rows, write_prompt_dump
from tests.helpers.schema import validator

NAMES = ("base", "tp4", "fp8")
SEEDS = (1, 2, 3)


def _write(root, planted=0, first=(0, 0, 0), **options):
    made = {}
    for name, seed, start in zip(NAMES, SEEDS, first, strict=True):
        rows = matched_run_rows(seed, planted=planted, first=start)
        made[name] = (write_prompt_dump(root / f"{name}.parquet", rows, row_group_size=97, **options), rows)
    return made


def _compare(made, **options):
    specs = [RunSpec(name, Dump(str(path), **options.pop("dump", {})), {}) for name, (path, _) in made.items()]
    return compare_dumps(specs, replicates=200, metadata_knobs=False, **{"workers": 1, **options})


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    made = _write(tmp_path_factory.mktemp("matched"), planted=2)
    return made, _compare(made)


def test_the_planted_deterministic_outliers_are_listed(planted):
    made, result = planted
    prompts = result.prompts
    assert prompts.identity == "column prompt_id" and prompts.runs == list(NAMES) and prompts.without == []
    assert prompts.shared == prompts.in_every_run == 302  # 300 clean prompts and 2 planted, in every run
    assert prompts.outliers == 2
    listed = prompts.listed
    assert sorted(item.prompt for item in listed) == ["x0", "x1"]
    assert prompts.matrix[:2] == listed  # listed first
    for item in listed:
        assert item.runs == list(NAMES)
        assert all(cell.worst and cell.rows == 2 for cell in item.cells)
        # chance: Π share_r^2 over 3 runs, each share ≈ 1 % of 604 rows: ~1e-12, times 302 candidates ≪ 1 %
        shares = [worst.share for worst in prompts.worst]
        assert item.chance == pytest.approx(np.prod(np.square(shares)), rel=1e-9)
        assert item.chance * prompts.shared <= EXTREME_MAX_CHANCE
    # the single-run rule cannot list them: two rows a run give share² × 302 prompts ≈ 0.03 > 1 %
    for name, (path, _) in made.items():
        findings = prompt_findings(read_run(Dump(str(path)), ()).prompts)
        assert findings is not None and findings.extreme == [], name
    # the rest of the matrix: clean prompts, none of them in the worst 1 % in every run
    assert len(prompts.matrix) == 50 and prompts.matrix_cut == 302 - 50
    assert not any(item.listed for item in prompts.matrix[2:])
    assert all(item.prompt[0] in "px" for item in prompts.matrix)  # every prompt by its id text, none by its key
    validator("runs.schema.json").validate(json.loads(json.dumps(result.to_json())))


def _reference(rows, prompt):
    """Float64 row scores of ``prompt``'s rows: |Σ rollout / n − Σ trainer / n| over the model tokens."""
    scores = []
    for row in rows:
        if row["prompt_id"] != prompt:
            continue
        model = np.array(row["response_mask"], bool)
        rollout = np.array(row["rollout_log_probs"], np.float32).astype(np.float64)[model]
        trainer = np.array(row["old_log_probs"], np.float32).astype(np.float64)[model]
        scores.append(abs(rollout.sum() / model.sum() - trainer.sum() / model.sum()))
    return np.array(scores)


def test_matched_values_against_a_float64_reference(planted):
    made, result = planted
    for item in result.prompts.matrix[:5]:
        for name, (_, rows) in made.items():
            cell = item.cell(name)
            expected = _reference(rows, item.prompt)
            assert cell.rows == expected.shape[0] == 2
            assert cell.score_mean == pytest.approx(expected.mean(), rel=1e-9, abs=1e-12)
            assert cell.score_min == pytest.approx(expected.min(), rel=1e-9, abs=1e-12)
            assert cell.score_max == pytest.approx(expected.max(), rel=1e-9, abs=1e-12)
            assert cell.steps == sorted({row["step"] for row in rows if row["prompt_id"] == item.prompt})


@pytest.mark.parametrize("how", ["chunks", "processes"])
def test_matched_values_do_not_depend_on_chunking_or_processes(planted, how):
    made, whole = planted
    other = _compare(made, dump={"chunk_tokens": 700}) if how == "chunks" else _compare(made, workers=3)
    assert other.prompts.shared == whole.prompts.shared and other.prompts.outliers == whole.prompts.outliers
    assert [item.key for item in other.prompts.matrix] == [item.key for item in whole.prompts.matrix]
    for mine, theirs in zip(other.prompts.matrix, whole.prompts.matrix, strict=True):
        assert mine.listed == theirs.listed and mine.chance == pytest.approx(theirs.chance, rel=1e-12)
        for a, b in zip(mine.cells, theirs.cells, strict=True):
            assert (a.run, a.rows, a.worst, a.steps, a.tail) == (b.run, b.rows, b.worst, b.steps, b.tail)
            assert a.score_mean == pytest.approx(b.score_mean, rel=1e-12)
            assert (a.score_min, a.score_max) == (b.score_min, b.score_max)


def test_the_state_dir_keeps_the_prompts(planted, tmp_path):
    made, whole = planted
    first = _compare(made, state_dir=tmp_path)
    again = _compare(made, state_dir=tmp_path)  # every run from its saved state
    assert first.prompts == whole.prompts and again.prompts == whole.prompts


def test_the_export_holds_the_outliers_rows_in_every_run(planted, tmp_path):
    made, result = planted
    out = tmp_path / "repro.jsonl"
    written = export_runs_repro([(name, Dump(str(path))) for name, (path, _) in made.items()], out, result)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert written == len(lines) == 2 * 3 * 2  # 2 prompts × 3 runs × 2 rows, each ≤ MAX_ROWS_PER_PROMPT
    assert MAX_ROWS_PER_PROMPT >= 2
    assert [line["run"] for line in lines] == [name for name in NAMES for _ in range(4)]
    keys = {item.prompt: item.key for item in result.prompts.listed}
    for line in lines:
        assert set(line) >= {
            "run",
            "prompt",
            "prompt_key",
            "step",
            "token_ids",
            "rollout_log_probs",
            "old_log_probs",
            "response_mask",
        }
        assert line["prompt"] in ("x0", "x1") and line["prompt_key"] == keys[line["prompt"]]
        (source,) = [row for row in made[line["run"]][1] if row["sample_id"] == line["sample_id"]]
        assert line["step"] == source["step"] and line["token_ids"] == source["token_ids"]
        assert line["response_mask"] == source["response_mask"]
        model = np.array(source["response_mask"], bool)
        for side in ("rollout_log_probs", "old_log_probs"):
            dumped = np.array(source[side], np.float32).astype(np.float64)
            np.testing.assert_array_equal(np.array(line[side])[model], dumped[model])
        threshold = next(w.threshold for w in result.prompts.worst if w.run == line["run"])
        assert line["row_score"] >= threshold


def test_clean_runs_list_nothing(tmp_path):
    result = _compare(_write(tmp_path))
    assert result.prompts.shared == 300 and result.prompts.outliers == 0
    assert result.prompts.listed == []
    out = tmp_path / "repro.jsonl"
    specs = [(name, Dump(str(tmp_path / f"{name}.parquet"))) for name in NAMES]
    assert export_runs_repro(specs, out, result) == 0 and out.read_text() == ""


def test_token_ids_match_prompts_too(tmp_path):
    result = _compare(_write(tmp_path, planted=2, prompt_column=None))
    assert result.prompts.identity == TOKENS_SOURCE and result.prompts.outliers == 2
    assert len({item.prompt for item in result.prompts.listed}) == 2  # keys in hex: no id text


def test_silent_without_prompt_identity_or_recurrence(tmp_path):
    made = _write(tmp_path, first=(0, 1000, 2000))  # disjoint pools: no prompt in two runs
    disjoint = _compare(made).prompts
    assert disjoint.shared == 0 and disjoint.matrix == [] and disjoint.outliers == 0
    bare = {}
    for name, seed in zip(NAMES, SEEDS, strict=True):
        rows = matched_run_rows(seed, planted=2)
        for row in rows:  # no token ids and no id column: nothing says which prompt a row answers
            row["token_ids"] = list(range(len(row["response_mask"])))
            row["response_mask"] = [1] * len(row["response_mask"])
        bare[name] = (write_prompt_dump(tmp_path / f"bare-{name}.parquet", rows, prompt_column=None), rows)
    assert _compare(bare).prompts is None


def test_sampled_runs_match_on_the_prompts_every_run_followed(planted):
    """Run i's table as distinct sampling at level i leaves it (the prompts whose key has its low i bits 0): the
    matching follows the smallest sample's prompts."""
    made, _ = planted
    evidence = []
    for level, (name, (path, _)) in enumerate(made.items()):
        found = read_run(Dump(str(path)), ()).prompts
        keep = (found.cells.key & ((1 << level) - 1)) == 0
        cells = type(found.cells)(**{k: getattr(found.cells, k)[keep] for k in found.cells.__dataclass_fields__})
        evidence.append((name, type(found)(**{**found.__dict__, "cells": cells, "sampled_share": 0.5**level})))
    matched = matched_prompts(evidence)
    assert matched.sampled_share == 0.25
    keys = [int(item.key, 16) for item in matched.matrix]
    assert all(key & 3 == 0 for key in keys)
