"""rollout-diag watch: follow a dump directory while it is written; the final state is analyze's."""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers.localize import assert_same

import rollout_diag as rd
from rollout_diag.drivers.watch import Watcher, watch


def batch(seed: int, rows: int = 5, width: int = 12, spread: float = 0.05) -> dict[str, Any]:
    """Right-padded [B, L] tensors with a mismatch of about ``spread`` nats per token."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, width + 1, (rows,), generator=generator)
    rollout = -torch.rand(rows, width, generator=generator, dtype=torch.float64) * 3.0
    trainer = (rollout + torch.randn(rows, width, generator=generator, dtype=torch.float64) * spread).clamp(max=0.0)
    positions = torch.arange(width).expand(rows, width)
    mask = (positions < lengths[:, None]).to(torch.int64)
    mask[:, 0] = 0  # a prompt token: an environment token inside the row
    return {
        "old_log_probs": trainer,
        "rollout_log_probs": rollout,
        "response_mask": mask,
        "lengths": lengths,
    }


def write_run(root: Path, steps: range, ranks: int = 2, spread=lambda step: 0.05, world_size: int | None = 2):
    writers = [rd.DumpWriter(root, rank=r, world_size=world_size, logprob_type="float64") for r in range(ranks)]
    for step in steps:
        for rank, writer in enumerate(writers):
            writer.write_step(step, **batch(1000 * step + rank, spread=spread(step)))
    for writer in writers:
        writer.close()


def same_as_analyze(result: rd.AnalysisResult, directory: Path) -> None:
    expected = rd.analyze(str(directory), device="cpu").to_json()
    assert_same(result.to_json(), expected, abs_tol=1e-300)


def run_watch(directory: Path, **options: Any) -> list:
    options.setdefault("interval", 0.02)
    options.setdefault("exit_after_idle", 0.3)
    options.setdefault("device", "cpu")
    return list(watch(directory, **options))


# ----------------------------------------------------------------------------------------------- the loop
def test_watch_beside_a_writer_ends_with_analyzes_result(tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    writer = threading.Thread(target=write_run, args=(root, range(12)), kwargs={"spread": lambda s: 0.02 * (1 + s)})
    writer.start()
    try:
        updates = run_watch(root, exit_after_idle=1.0)
    finally:
        writer.join()
    last = updates[-1]
    assert last.exit_code == 0 and last.ended.startswith("nothing new")
    same_as_analyze(last.result, root)
    reported = [report for update in updates for report in update.steps]
    assert sorted({r.step for r in reported}) == list(range(12))
    finals = {r.step: r for r in reported}
    for step in last.result.steps:  # each step's line carries the step's metrics as analyze computes them
        assert_same(finals[step.step].metrics, step.metrics, f"step {step.step}", abs_tol=1e-300)


def watcher(root: Path, **options: Any) -> Watcher:
    options.setdefault("device", "cpu")
    return Watcher(root, **options)


def reports_of(*updates) -> list[tuple[int, int]]:
    return [(report.step, report.revision) for update in updates for report in update.steps]


# ----------------------------------------------------------------------------------------------- robustness
def test_a_half_written_file_is_retried_not_an_error(tmp_path):
    root = tmp_path / "run"
    write_run(root, range(2))
    complete = (root / "step=1" / "rank-1.parquet").read_bytes()
    (root / "step=1" / "rank-1.parquet").write_bytes(complete[: len(complete) // 2])  # no footer yet
    follow = watcher(root)
    first = follow.poll()
    (note,) = first.notes
    assert "step=1/rank-1.parquet: not readable yet" in note and "retried" in note
    assert follow.poll().notes == []  # said once; the unchanged file is not read again
    (root / "step=1" / "rank-1.parquet").write_bytes(complete)
    second = follow.poll()
    assert second.changed and not second.notes
    same_as_analyze(follow.poll(final=True).result, root)


@pytest.mark.parametrize(("top_k", "reads"), [(1000, 8), (2, 8)])
def test_a_step_rewritten_by_a_resumed_run_replaces_its_earlier_state(tmp_path, monkeypatch, top_k, reads):
    """The old steps are taken out and only their files are read again (6, and the 2 of the new step). top_k 1000:
    the top lists never filled; 2: the rewritten steps held top rows that pushed others out, which come back (the
    files holding them are read again for their worst rows only)."""
    root = tmp_path / "run"
    write_run(root, range(6))
    follow = watcher(root, top_k=top_k)
    assert reports_of(follow.poll()) == [(s, 0) for s in range(6)]  # every step complete by its markers
    # the run resumes from the checkpoint of step 2: steps 3.. are written again, with other data
    writers = [rd.DumpWriter(root, rank=r, world_size=2, logprob_type="float64") for r in range(2)]
    for step in (3, 4, 5, 6):
        for rank, writer in enumerate(writers):
            writer.write_step(step, **batch(7 + 1000 * step + rank, rows=3 + step, spread=0.3))
    read = Watcher._read
    files_read = []
    monkeypatch.setattr(
        Watcher, "_read", lambda self, source, *args: files_read.append(source) or read(self, source, *args)
    )
    update = follow.poll()
    assert len(files_read) == reads
    assert any("rewritten; step(s) 3 replaced" in note for note in update.notes)
    assert reports_of(update) == [(3, 1), (4, 1), (5, 1), (6, 0)]
    expected = rd.analyze(str(root), device="cpu", top_k=top_k).to_json()
    assert_same(follow.poll(final=True).result.to_json(), expected, abs_tol=1e-300)


def test_a_rewrite_that_pushes_out_top_rows_rebuilds_them(tmp_path):
    """top_k=1: the rewritten step held the run's worst row; the next worst was pushed out, so every file is read
    again and the worst rows are still analyze's."""
    root = tmp_path / "run"
    write_run(root, range(4), spread=lambda step: 0.5 if step == 2 else 0.01)
    follow = watcher(root, top_k=1)
    follow.poll()
    with rd.DumpWriter(root, rank=0, world_size=2, logprob_type="float64") as writer:
        writer.write_step(2, **batch(99, spread=0.001))
    follow.poll(final=True)
    expected = rd.analyze(str(root), device="cpu", top_k=1).to_json()
    assert_same(follow.result.to_json(), expected, abs_tol=1e-300)


def test_a_rank_file_arriving_late_joins_its_step(tmp_path):
    root = tmp_path / "run"
    write_run(root, range(3))
    late = root / "step=1" / "rank-1.parquet"
    held = late.read_bytes()
    late.unlink()
    (root / "step=1" / "_COMPLETE-rank-1").unlink()
    follow = watcher(root)
    first = follow.poll()
    assert reports_of(first) == [(0, 0), (1, 0), (2, 0)]  # step 1 is final: a later step appeared
    late.write_bytes(held)
    second = follow.poll()
    assert any("joins step(s) 1" in note for note in second.notes)
    assert reports_of(second) == [(1, 1)]
    assert second.steps[0].rows == 10
    same_as_analyze(follow.poll(final=True).result, root)


def test_steps_are_final_by_completion_markers_or_a_later_step(tmp_path):
    root = tmp_path / "run"
    with rd.DumpWriter(root, rank=0, world_size=2) as rank0, rd.DumpWriter(root, rank=1, world_size=2) as rank1:
        rank0.write_step(0, **batch(1))
        follow = watcher(root)
        assert reports_of(follow.poll()) == []  # one rank of two: the step is not complete
        rank1.write_step(0, **batch(2))
        assert reports_of(follow.poll()) == [(0, 0)]  # both markers: complete
    with rd.DumpWriter(root / "other", rank=0) as single:  # no world size known: the next step finalizes
        single.write_step(0, **batch(3))
        follow = watcher(root / "other")
        assert reports_of(follow.poll()) == []
        single.write_step(1, **batch(4))
        assert reports_of(follow.poll()) == [(0, 0)]
        assert reports_of(follow.poll(final=True)) == [(1, 0)]
    assert not list((root / "other").rglob("_COMPLETE*"))


def test_deleting_the_directory_ends_the_watch_with_one_line(tmp_path):
    root = tmp_path / "run"
    write_run(root, range(2))
    polls = []

    def sleep(_: float) -> None:
        polls.append(1)
        if len(polls) == 2:
            shutil.rmtree(root)

    updates = list(watch(root, interval=0.01, device="cpu", sleep=sleep))
    last = updates[-1]
    assert last.exit_code == 1 and last.ended == f"{root}: the directory was deleted or moved; the watch ends."
    assert last.result is not None and len(last.result.steps) == 2  # what was seen stays


def test_a_failing_gate_alerts_once_and_exit_on_fail_stops_at_once(tmp_path):
    root = tmp_path / "run"
    write_run(root, range(5), spread=lambda step: 0.5 if step >= 2 else 0.01)
    gate = rd.Gate("rollout_corr/k3_kl", "max", 0.01)
    updates = run_watch(root, gates=[gate], exit_on_fail=True)
    assert updates[-1].exit_code == 3 and "gate failed" in updates[-1].ended
    assert len(updates) == 1  # the first poll saw the failure
    alerts = updates[-1].alerts
    assert alerts[0].startswith("ALERT step 2: rollout_corr/k3_kl = ") and "above the limit 0.01" in alerts[0]
    updates = run_watch(root, gates=[gate], exit_after_idle=0.05)
    assert updates[-1].exit_code == 3 and updates[-1].ended.startswith("nothing new")
    every = [alert for update in updates for alert in update.alerts]
    assert len(every) == len(set(every)) == 4  # steps 2, 3, 4 and the run, each once
    assert run_watch(root, gates=[rd.Gate("rollout_corr/k3_kl", "max", 10.0)], exit_after_idle=0.05)[-1].exit_code == 0
    with pytest.raises(rd.ConfigError, match="no metric 'k4_kl'"):  # (k3 is a short name now: rollout_kl/k3)
        run_watch(root, gates=[rd.Gate("k4_kl", "max", 1.0)])
    once = run_watch(root, gates=[gate], exit_after_idle=None, max_polls=1)
    assert once[-1].exit_code == 3 and once[-1].ended == "1 poll done; the watch ends."


def test_prime_rl_steps_count_once_they_have_their_stable_marker(tmp_path):
    from helpers.formats import dataset, write_prime_rl

    exports = write_prime_rl(tmp_path, dataset(), stable=False)
    follow = watcher(exports)
    assert follow.poll().result is None  # no STABLE marker yet: nothing is read
    steps = sorted(path for path in exports.iterdir() if path.is_dir())
    (steps[0] / "STABLE").touch()
    first = follow.poll()
    assert [s.step for s in first.result.steps] == [int(steps[0].name.split("_")[1])]
    assert reports_of(first) == [(first.result.steps[0].step, 0)]  # STABLE: final at once
    for step in steps[1:]:
        (step / "STABLE").touch()
    follow.poll(final=True)
    same_as_analyze(follow.result, exports)


def test_a_nemo_rl_file_is_read_once_its_last_line_is_whole_and_it_stopped_growing(tmp_path):
    from helpers.formats import dataset, write_nemo_rl

    directory = write_nemo_rl(tmp_path / "nemo", dataset())
    files = sorted(directory.rglob("*.jsonl"))
    last = files[-1]
    text = last.read_text()
    last.write_text(text[: len(text) - 40])  # a partial JSON line: the trainer is still writing
    follow = watcher(directory)
    follow.poll()
    follow.poll()
    assert str(last) not in follow.files
    last.write_text(text)
    follow.poll()  # changed since the last poll: wait one more
    assert str(last) not in follow.files
    follow.poll(final=True)
    assert str(last) in follow.files
    same_as_analyze(follow.result, directory)


def test_memory_keeps_no_token_data_per_file(tmp_path):
    root = tmp_path / "run"
    write_run(root, range(3))
    follow = watcher(root)
    follow.poll(final=True)
    for record in follow.files.values():
        assert record.rows is None  # per-row sums only when a gate needs them
        assert sum(keys.nbytes for keys in record.log.row_keys) == 8 * 5  # 8 bytes a row


# ----------------------------------------------------------------------------------------------- command line
def cli(*args: object):
    from typer.testing import CliRunner

    from rollout_diag.cli import app

    result = CliRunner().invoke(app, ["watch", *map(str, args)], env={"COLUMNS": "120"})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"exception escaped the CLI: {result.exception!r}") from result.exception
    assert "Traceback" not in result.output
    return result


def test_jsonl_prints_one_parsable_line_per_finished_step_and_gates_exit_3(tmp_path):
    root = tmp_path / "run"
    write_run(root, range(4), spread=lambda step: 0.5 if step == 3 else 0.01)
    report = tmp_path / "report.html"
    common = ("--interval", "0.02", "--exit-after-idle", "0.1", "-f", "jsonl")
    result = cli(root, *common, "--max", "rollout_corr/k3_kl=0.01", "--report", report, "--report-every", "2")
    assert result.exit_code == 3, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["step"] for line in lines] == [0, 1, 2, 3]
    expected = rd.analyze(str(root), device="cpu")
    for line, step in zip(lines, expected.steps, strict=True):
        assert line["rows"] == step.rows and line["revision"] == 0
        assert line["metrics"]["rollout_corr/k3_kl"] == pytest.approx(step.metrics["rollout_corr/k3_kl"], rel=1e-12)
    assert lines[0]["level"] == "ok" and lines[3]["alerts"][0].startswith("ALERT step 3: rollout_corr/k3_kl")
    alerts = [line for line in result.stderr.splitlines() if line.startswith("ALERT")]
    assert len(alerts) == 2 and alerts[1].startswith("ALERT run:")  # step 3, then the run: one line each
    assert result.stderr.splitlines()[-1].startswith("nothing new for")
    assert report.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # the temporary file was renamed
    schema = json.loads((Path(__file__).resolve().parents[2] / "schemas" / "watch.schema.json").read_text())
    import jsonschema

    for line in lines:
        jsonschema.validate(line, schema)
    passing = cli(root, *common, "--max", "rollout_corr/k3_kl=10")
    assert passing.exit_code == 0
    failing_at_once = cli(root, *common, "--max", "rollout_corr/k3_kl=0.01", "--exit-on-fail")
    assert failing_at_once.exit_code == 3 and "--exit-on-fail" in failing_at_once.stderr


def test_cli_bad_input_is_one_error_line(tmp_path):
    waiting = cli(tmp_path / "nowhere", "--exit-after-idle", "0", "-f", "jsonl")  # waited for, not an error
    assert waiting.exit_code == 0 and "no such directory yet; waiting for the trainer" in waiting.stderr
    (tmp_path / "file").write_text("x")
    not_a_directory = cli(tmp_path / "file")
    assert not_a_directory.exit_code == 1 and not_a_directory.stderr.strip() == (
        f"Error: {tmp_path / 'file'}: not a directory; watch follows a dump directory."
    )
    (tmp_path / "run").mkdir()
    unknown = cli(tmp_path / "run", "--max", "k4_kl=1", "--exit-after-idle", "0")
    assert unknown.exit_code == 0  # no data: no metric to judge a gate against yet, nothing fails
    write_run(tmp_path / "run", range(1))
    for option, value in (("--interval", "0"), ("--exit-after-idle", "-1"), ("--report-every", "0")):
        bad = cli(tmp_path / "run", option, value)
        assert (
            bad.exit_code == 1
            and bad.stderr.startswith(f"Error: {option} {value}")
            and len(bad.stderr.splitlines()) == 1
        )
    unknown = cli(tmp_path / "run", "--max", "k4_kl=1", "--exit-after-idle", "0")
    assert unknown.exit_code == 1 and unknown.stderr.startswith("Error: gate k4_kl ≤ 1: no metric 'k4_kl'")


def test_the_live_view_shows_verdict_steps_trend_round_and_events(tmp_path):
    from rich.console import Console

    from rollout_diag.render.watch import WatchView, sparkline

    root = tmp_path / "run"
    write_run(root, range(12), spread=lambda step: 0.02 if step < 8 else 0.4)
    clock = [100.0]
    view = WatchView(str(root), clock=lambda: clock[0])
    console = Console(width=110, record=True, color_system=None, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(view)
    waiting = console.export_text()
    assert "waiting for the first step" in waiting and "no step yet" in waiting
    for update in run_watch(root, gates=[rd.Gate("rollout_corr/k3_kl", "max", 0.01)], exit_after_idle=0.05):
        view.add(update)
    clock[0] += 75
    console.print(view)
    text = console.export_text()
    assert "verdict bad" in text and "12 steps" in text and "step 11: bad" in text
    assert "last step 1 min 15 s ago" in text
    for step in range(4, 12):  # the last 8 steps
        assert re.search(rf"│\s+{step} │", text)
    assert "k3_kl, last 12 steps: " + sparkline([0.0] * 8 + [1.0] * 4).replace("█", "") in text.replace("█", "")
    assert "ALERT step 8: rollout_corr/k3_kl" in text and "anomaly step" in text
    assert "nothing new for" in text
    assert sparkline([1.0, None, 3.0, float("nan")]) == "▁ █ "


def test_cli_ends_with_one_line_when_the_directory_goes(tmp_path, monkeypatch):
    root = tmp_path / "run"
    write_run(root, range(2))

    def sleep(_: float) -> None:  # the directory goes after the first poll, however long that poll took
        if root.exists():
            shutil.rmtree(root)

    monkeypatch.setitem(watch.__kwdefaults__, "sleep", sleep)
    result = cli(root, "--interval", "0.05", "-f", "jsonl")
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [f"{root}: the directory was deleted or moved; the watch ends."]
    assert [json.loads(line)["step"] for line in result.stdout.splitlines()] == [0, 1]


def test_a_rewritten_file_sharing_steps_with_others_takes_them_all_out_and_back(tmp_path):
    """Files holding several steps (DumpWriter's one-file mode): a.parquet has steps 0-1, b.parquet 1-2 and
    c.parquet 3. Rewriting a takes out steps 0-1, so b is read again, so step 2 is taken out too; c stays."""
    root = tmp_path / "run"
    root.mkdir()

    def write(name: str, steps: tuple[int, ...], seed: int) -> None:
        with rd.DumpWriter(root / name, logprob_type="float64") as writer:
            for step in steps:
                writer.write_step(step, **batch(seed + step))

    write("a.parquet", (0, 1), 0)
    write("b.parquet", (1, 2), 10)
    write("c.parquet", (3,), 20)
    follow = watcher(root)
    follow.poll()
    write("a.parquet", (0, 1), 30)
    update = follow.poll()
    assert reports_of(update) == [(0, 1), (1, 1), (2, 1)]
    assert sorted(follow.files) == sorted(str(root / name) for name in ("a.parquet", "b.parquet", "c.parquet"))
    same_as_analyze(follow.poll(final=True).result, root)


def test_watch_help_describes_every_option():
    import typer.main

    from rollout_diag.cli import app

    result = cli("--help")
    flat = "".join(result.stdout.split())
    command = typer.main.get_command(app).commands["watch"]
    for parameter in command.params:
        help_text = getattr(parameter, "help", None)
        assert help_text and "".join(help_text.split()) in flat, parameter.name


def test_dump_writer_marks_each_rank_complete_when_the_world_size_is_known(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with rd.DumpWriter(tmp_path / "run", rank=1) as writer:
        writer.write_step(4, **batch(0))
    marker = tmp_path / "run" / "step=4" / "_COMPLETE-rank-1"
    assert json.loads(marker.read_text()) == {"rank": 1, "world_size": 2, "rows": 5}
    assert sorted(p.name for p in marker.parent.iterdir()) == ["_COMPLETE-rank-1", "rank-1.parquet"]
    assert rd.analyze(str(tmp_path / "run"), device="cpu").inputs == [str(marker.parent / "rank-1.parquet")]
    with pytest.raises(rd.ConfigError, match="world_size=0: must be a positive integer"):
        rd.DumpWriter(tmp_path / "other", world_size=0)


@pytest.mark.parametrize("seed", [0, 1])
def test_any_arrival_order_with_rewrites_ends_with_analyzes_result(tmp_path, seed):
    """Rank files of 6 steps arrive in a shuffled order, some written twice (a resumed run), with polls at random
    moments and top_k 3 (so rewrites push rows out of the top lists): the end state is analyze's."""
    rng = np.random.default_rng(seed)
    root = tmp_path / "run"
    writes = [(step, rank, 0) for step in range(6) for rank in range(2)]
    again = zip(rng.integers(0, 6, 3).tolist(), rng.integers(0, 2, 3).tolist(), strict=True)
    writes += [(step, rank, 1) for step, rank in again]
    order = rng.permutation(len(writes))
    root.mkdir()
    follow = watcher(root, top_k=3)
    for index in order:
        step, rank, again = writes[index]
        with rd.DumpWriter(root, rank=rank, world_size=2, logprob_type="float64") as writer:
            writer.write_step(step, **batch(100 * step + 10 * rank + again, rows=3 + again, spread=0.05 + again))
        if rng.random() < 0.5:
            follow.poll()
    follow.poll(final=True)
    expected = rd.analyze(str(root), device="cpu", top_k=3).to_json()
    assert_same(follow.result.to_json(), expected, abs_tol=1e-300)


def test_a_watch_runs_the_kernels_however_small_each_file(tmp_path, monkeypatch, engines_seen):
    """A watched run keeps growing: its files are read by the compiled kernels on numpy chunks, loaded once, even
    where each file alone is under the small-input bound (which only a reading of tensor chunks heeds)."""
    from rollout_diag.engine.choice import ENVIRONMENT, SMALL_INPUT_ENVIRONMENT

    monkeypatch.delenv(ENVIRONMENT, raising=False)
    monkeypatch.setenv(SMALL_INPUT_ENVIRONMENT, str(10**9))
    seen = engines_seen
    write_run(tmp_path, range(2))
    run_watch(tmp_path)
    assert seen and set(seen) == {"KernelStats"}
    seen.clear()
    rd.compare_presets(str(tmp_path), device="cpu")  # numpy chunks too: the kernels at any size
    assert set(seen) == {"KernelStats"}


# ----------------------------------------------------------------------------------------------- issue 39: the view
def low_probability_batch(seed: int, spread: float, rows: int = 8, width: int = 48) -> dict[str, Any]:
    """A batch whose mismatch grows with the square of the rollout's surprisal: tokens with p < 0.1 (logp < −2.3)
    get a |δ| ≥ 40× that of tokens with p ≥ 0.5 (logp > −0.69), the low_probability finding's pattern."""
    generator = torch.Generator().manual_seed(seed)
    rollout = -torch.rand(rows, width, generator=generator, dtype=torch.float64) * 5.0
    noise = torch.randn(rows, width, generator=generator, dtype=torch.float64) * spread * rollout**2
    trainer = (rollout + noise).clamp(max=0.0)
    mask = torch.ones(rows, width, dtype=torch.int64)
    return {"old_log_probs": trainer, "rollout_log_probs": rollout, "response_mask": mask}


def frames_of(root: Path, steps: int, **options: Any) -> tuple[list[str], list]:
    """The live view after each update, as an 80-column terminal of 40 lines shows it (the rest is cut)."""
    from rich.console import Console

    from rollout_diag.render.watch import WatchView

    view = WatchView(str(root), clock=lambda: 0.0)
    frames, updates = [], []
    with rd.DumpWriter(root, rank=0, world_size=1, logprob_type="float64") as writer:
        follow = Watcher(root, device="cpu", **options)
        for step in range(steps):
            writer.write_step(step, **low_probability_batch(step, spread=0.004 * 1.3**step))
            update = follow.poll()
            updates.append(update)
            view.add(update)
            console = Console(width=80, record=True, color_system=None, file=open(os.devnull, "w"))  # noqa: SIM115
            console.print(view)
            frames.append("\n".join(console.export_text().splitlines()[:40]))
    return frames, updates


def test_frames_say_each_finding_once_newest_events_first_and_lead_with_the_last_steps(tmp_path):
    gate = rd.Gate("rollout_corr/k3_kl", "max", 1e-9)  # every step fails: one new alert per step
    frames, updates = frames_of(tmp_path / "run", 12, gates=[gate])
    found = [frame for frame in frames if "low_probability:" in frame]
    assert len(found) >= 6  # the planted finding shows from the first steps on
    for frame in found:  # once per frame, however many steps repeated it, its numbers those of the latest result
        assert frame.count("low_probability:") == 1 and frame.count("concentrated on low-probability") == 1
    said = [message for update in updates for report in update.steps for message in report.findings]
    assert sum("concentrated on low-probability" in message for message in said) == 1  # jsonl: said once
    alerted = [int(m.group(1)) for frame in frames[-1:] for m in re.finditer(r"ALERT step (\d+):", frame)]
    last = max(report.step for update in updates for report in update.steps)
    assert alerted and alerted[0] == last and alerted == sorted(alerted, reverse=True)  # newest first, on screen
    for frame, update in zip(frames, updates, strict=True):
        if update.steps:  # the header's first line: the last step reported, its level and what set it
            header = frame.splitlines()[1]
            assert re.search(rf"step {update.steps[-1].step}: (watch|bad) \(k3_kl", header)


def test_the_header_says_a_rise_and_arrows_show_a_13_percent_step(tmp_path):
    from rollout_diag.render.watch import change

    assert change(1.0, 1.13).plain == "↑ 1.13×"  # 13 % a step: the threshold is 10 %
    assert change(1.0, 1.16).plain == "↑ 1.16×"
    assert change(1.0, 1.05).plain == "→" and change(1.0, 1 / 1.05).plain == "→"
    assert change(1.0, 0.8).plain == "↓ 0.8×"
    frames, updates = frames_of(tmp_path / "run", 12)
    trends = {t.metric: t for t in updates[-1].result.trends if t.headline}
    assert "mismatch/logprob_abs_diff" in trends  # spread ×1.3 a step: mean |δ| rises 1.3¹¹ ≈ 18×
    header = frames[-1].split("╰", 1)[0]
    assert trends["mismatch/logprob_abs_diff"].headline in header and "from step 0 to 11" in header


def test_watch_waits_for_a_directory_the_trainer_has_not_made_yet(tmp_path):
    root = tmp_path / "later"

    def sleep(_: float) -> None:  # the trainer makes the directory and writes two steps after the second poll
        sleeps.append(_)
        if len(sleeps) == 2:
            write_run(root, range(2))

    sleeps: list[float] = []
    updates = list(watch(root, interval=0.01, exit_after_idle=5.0, max_polls=5, sleep=sleep, device="cpu"))
    assert updates[0].notes == [f"{root}: no such directory yet; waiting for the trainer to make it."]
    assert updates[1].notes == [] and updates[1].exit_code is None  # said once, and the watch goes on
    assert any(f"{root}: the directory appeared" in note for update in updates for note in update.notes)
    assert updates[-1].exit_code == 0 and reports_of(*updates) == [(0, 0), (1, 0)]
    idle = list(watch(tmp_path / "never", interval=0.01, exit_after_idle=0.0, sleep=lambda _: None, device="cpu"))
    assert idle[-1].exit_code == 0 and "nothing new for" in idle[-1].ended  # the idle rule ends a wait too
    (tmp_path / "file").write_text("x")
    with pytest.raises(rd.RolloutDiagError, match="not a directory"):
        Watcher(tmp_path / "file")
