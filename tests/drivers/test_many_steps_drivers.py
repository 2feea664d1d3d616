"""``diff``, ``check`` and ``compare-presets`` on many steps (issue 20): what their drivers keep and drop.

- ``diff`` gives each side ``RowPass.summary``, the run-level part of ``RowPass.result``: its numbers must be
  ``result``'s (run metrics, rounds, positions, groups, step counts, the data's warnings), and the diff made from
  summaries must be the diff made from full results, JSON for JSON.
- ``check`` and ``compare-presets`` drop the analysis once their result is built (its per-step state was most of
  their peak on 200 000 steps): checked by what is still alive when the next stage runs.
- ``build_result``'s warnings make the per-step counts only when a warning reads them; ``step_levels_of`` shares a
  ``levels`` dict between the steps judged alike.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import weakref
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from helpers.dumps import random_rows, sequence_table, write_sequence_dump, write_table

from rollout_diag.decisions.check import DEFAULT_GATES
from rollout_diag.decisions.diff import DiffSide, diff
from rollout_diag.decisions.verdict import step_levels, step_levels_of
from rollout_diag.drivers import check as check_driver
from rollout_diag.drivers import compare as compare_driver
from rollout_diag.drivers import engine
from rollout_diag.drivers.check import check_run
from rollout_diag.drivers.compare import compare_presets
from rollout_diag.drivers.diff import diff_runs
from rollout_diag.drivers.rowpass import row_pass
from rollout_diag.errors import DataError
from rollout_diag.presets import resolve_presets
from rollout_diag.results import StepResult, StepTable


def _rows_with_gaps(seed: int) -> list[dict]:
    """Rows over 12 steps, step 5 without any model token and two empty rows elsewhere, an env_name per row."""
    rows = random_rows(seed, steps=range(12), rows_per_step=3, max_length=20)
    for index, row in enumerate(rows):
        row["env_name"] = ("math", "code", None)[index % 3]
        if row["step"] == 5 or index in (7, 20):
            row["mask"] = [0] * len(row["mask"])
    return rows


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("manysteps")
    paths = []
    for name, seed in (("a", 3), ("b", 4)):
        rows = _rows_with_gaps(seed)
        table = sequence_table(rows).append_column("env_name", pa.array([row["env_name"] for row in rows], pa.string()))
        paths.append(write_table(folder / f"{name}.parquet", table, row_group_size=7))
    return paths[0], paths[1]


def _same_summary(summary, full, findings: bool = True) -> None:
    """``summary`` holds ``full``'s numbers; from a ``row_pass(findings=False)``, without the dialects (and their
    sentence on the empty rows' dilution, the end of a warning)."""
    if findings:
        assert summary.run == full.run
    else:
        assert summary.run == dataclasses.replace(full.run, dialects={})
        assert full.run.dialects
    assert summary.rounds == full.rounds
    assert list(summary.positions) == list(full.positions)
    assert repr(summary.groups) == repr(full.groups)  # NaN metrics: equal as text (repr gives every digit)
    assert isinstance(summary.steps, StepTable)
    assert [(s.step, s.rows, s.tokens, s.empty_rows) for s in summary.steps] == [
        (s.step, s.rows, s.tokens, s.empty_rows) for s in full.steps
    ]
    assert all(not step.metrics for step in summary.steps)  # no per-step metric columns
    # the data's warnings, in build_result's order; build_result adds the judgements' after them
    if findings:
        assert summary.warnings == full.warnings[: len(summary.warnings)]
    else:
        assert all(whole.startswith(part) for part, whole in zip(summary.warnings, full.warnings, strict=False))
    assert any("no model token" in warning for warning in summary.warnings)
    for name in ("inputs", "columns", "layout", "format", "device", "skipped", "skipped_rows"):
        assert getattr(summary, name) == getattr(full, name)


@pytest.mark.parametrize("steps", [None, (2, 8), (None, 4), (6, None)])
def test_summary_holds_the_numbers_of_the_full_result(dumps, steps) -> None:
    done = row_pass([str(dumps[0])], presets=resolve_presets(None), device="cpu", by=["env_name"])
    _same_summary(done.summary(steps), done.result(steps))
    lean = row_pass([str(dumps[0])], presets=resolve_presets(None), device="cpu", by=["env_name"], findings=False)
    _same_summary(lean.summary(steps), done.result(steps), findings=False)
    assert lean.all_rows.rows == done.all_rows.rows
    with pytest.raises(RuntimeError, match="findings=False"):
        lean.result(steps)


def test_a_pass_without_findings_gathers_no_hint_evidence_worst_rows_or_dialects(dumps) -> None:
    lean = row_pass([str(dumps[0])], device="cpu", findings=False)
    assert lean.analysis.hint_evidence.store.steps.shape[0] == 0
    assert not lean.analysis.worst.worst_rows()
    assert lean.analysis.run_result().dialects == {}


def test_the_diff_of_summaries_is_the_diff_of_full_results(dumps) -> None:
    """JSON for JSON, with --by groups and presets: what ``diff_runs`` now builds against the full results."""
    result = diff_runs(str(dumps[0]), str(dumps[1]), device="cpu", replicates=200, by=["env_name"])
    sides = []
    for path in dumps:
        done = row_pass([str(path)], presets=resolve_presets(None), device="cpu", by=["env_name"])
        sides.append(DiffSide(result.a.label if path == dumps[0] else result.b.label, done.result(), done.row_stats()))
    reference = diff(sides[0], sides[1], replicates=200)
    document = result.to_json()
    expected = reference.to_json()
    document.pop("groups")  # the groups' lines come from the same rows and group metrics (tested below)
    expected.pop("groups")
    assert json.dumps(document) == json.dumps(expected)
    for side, full in zip((result.a, result.b), sides, strict=True):
        assert repr(side.result.groups) == repr(full.result.groups)


def test_a_one_dump_diff_reads_summaries_of_the_two_ranges(dumps) -> None:
    result = diff_runs(str(dumps[0]), steps_a=(0, 4), steps_b=(5, 11), device="cpu", replicates=100)
    done = row_pass([str(dumps[0])], presets=resolve_presets(None), device="cpu")
    for side, steps in ((result.a, (0, 4)), (result.b, (5, 11))):
        full = done.result(steps)
        assert (side.result.run, side.result.rounds, list(side.result.positions)) == (
            dataclasses.replace(full.run, dialects={}),
            full.rounds,
            list(full.positions),
        )
        assert [s.step for s in side.result.steps] == list(range(steps[0], steps[1] + 1))


def test_summary_strict_refuses_a_step_without_model_token(dumps) -> None:
    done = row_pass([str(dumps[0])], device="cpu", strict=True)
    with pytest.raises(DataError, match="have no model token") as full:
        done.result()
    with pytest.raises(DataError, match="have no model token") as summary:
        done.summary()
    assert str(summary.value) == str(full.value)


def test_warnings_make_per_step_counts_only_when_a_warning_reads_them(tmp_path: Path, monkeypatch) -> None:
    """Without a step lacking tokens or an empty row, the per-step StepResults are never made (200 000 of them
    were ~55 MB and seconds); with them, the warnings are ``Analysis.warnings`` of those counts."""
    path = write_sequence_dump(tmp_path / "clean.parquet", random_rows(1, steps=range(6)))
    done = row_pass([str(path)], device="cpu")
    made = []
    original = engine.step_counts

    def counted(steps):
        made.append(len(steps))
        return original(steps)

    monkeypatch.setattr(engine, "step_counts", counted)
    done.result()
    assert made == []
    rows = random_rows(2, steps=range(6))
    rows[4]["mask"] = [0] * len(rows[4]["mask"])
    gapped = row_pass([str(write_sequence_dump(tmp_path / "gapped.parquet", rows))], device="cpu")
    result = gapped.result()
    assert made == [6]
    steps = [StepResult(s.step, s.rows, s.tokens, {}, s.empty_rows) for s in result.steps]
    notes = gapped.analysis.warnings(steps)
    assert notes and all(note in result.warnings for note in notes)


def test_check_drops_the_analysis_before_the_gates_run(dumps, monkeypatch) -> None:
    passes = []
    original_pass, original_check = check_driver.row_pass, check_driver.check

    def keep(*args, **kwargs):
        done = original_pass(*args, **kwargs)
        passes.append(done)
        return done

    def gates(*args, **kwargs):
        assert passes[0].analysis is None, "the analysis is still held while the gates run"
        return original_check(*args, **kwargs)

    monkeypatch.setattr(check_driver, "row_pass", keep)
    monkeypatch.setattr(check_driver, "check", gates)
    result = check_run(str(dumps[0]), list(DEFAULT_GATES), per_step=True, device="cpu", by=["env_name"])
    assert any(outcome.group is not None for outcome in result.outcomes)


def test_compare_presets_drops_the_analysis_once_the_base_result_is_built(dumps, monkeypatch) -> None:
    analyses = []
    original_build, original_judge = compare_driver.build_result, compare_driver.judge_comparison

    def build(analysis, *args, **kwargs):
        analyses.append(weakref.ref(analysis))
        return original_build(analysis, *args, **kwargs)

    def judge(*args, **kwargs):
        gc.collect()
        assert analyses[0]() is None, "the analysis outlived its result"
        return original_judge(*args, **kwargs)

    monkeypatch.setattr(compare_driver, "build_result", build)
    monkeypatch.setattr(compare_driver, "judge_comparison", judge)
    compare_presets(str(dumps[0]), device="cpu", workers=1)


def test_steps_judged_alike_share_one_levels_dict() -> None:
    rng = np.random.default_rng(5)
    count = 3000
    keys = ("rollout_corr/k3_kl", "rollout_corr/chi2_token", "rollout_corr/log_ppl_abs_diff")
    values = {key: rng.choice([1e-6, 1e-3, 1.0, np.nan], count) for key in keys}
    steps = [StepResult(i, 1, 1, {key: float(values[key][i]) for key in keys}) for i in range(count)]
    levels = step_levels_of(steps)
    assert levels == step_levels([(step.step, step.metrics) for step in steps])
    distinct = {json.dumps(entry["levels"]) for entry in levels}
    assert len({id(entry["levels"]) for entry in levels}) == len(distinct) < count
    assert [list(entry["levels"]) for entry in levels[:2]] == [
        list(step_levels([(0, steps[0].metrics)])[0]["levels"])
    ] * 2
