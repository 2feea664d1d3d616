"""Progress where people look (rollout_diag/progress.py): lines every few seconds on a fake clock; the library's
``progress=`` callback and ``progress=True``; the CLI's lines in a pipe for long inputs and silence for short ones."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from rollout_diag import analyze
from rollout_diag.progress import LineProgress

SAMPLE = Path(__file__).resolve().parent.parent / "sample_data" / "synthetic_multiturn.parquet"


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_line_every_interval_and_a_last_one():
    clock, stream = FakeClock(), io.StringIO()
    progress = LineProgress(stream, interval=5.0, clock=clock)
    progress(10, 100)  # at once: nothing (short runs stay silent)
    clock.now += 4.9
    progress(20, 100)
    assert stream.getvalue() == ""
    clock.now += 0.2  # 5.1 s
    progress(25, 100)
    clock.now += 1.0
    progress(30, 100)  # within the interval of the last line: nothing
    clock.now += 5.0
    progress(50, 100)
    clock.now += 0.5
    progress(100, 100)  # done: a last line, whatever the interval
    lines = stream.getvalue().splitlines()
    assert lines == [
        "rollout-diag: reading 25 / 100 rows (25%), 5 s elapsed, about 15 s left",
        "rollout-diag: reading 50 / 100 rows (50%), 11 s elapsed, about 11 s left",
        "rollout-diag: reading 100 / 100 rows (100%), 12 s elapsed",
    ]


def test_silent_when_the_run_is_short():
    clock, stream = FakeClock(), io.StringIO()
    progress = LineProgress(stream, clock=clock)
    for done in range(0, 101, 10):
        clock.now += 0.1
        progress(done, 100)
    assert stream.getvalue() == ""


def test_long_durations():
    progress = LineProgress(io.StringIO(), clock=FakeClock())
    assert progress.line(1, 4, 600.0).endswith("10 min elapsed, about 30 min left")
    assert progress.line(1, 2, 7200.0).endswith("2.0 h elapsed, about 2.0 h left")
    assert progress.line(5, 0, 1.0) == "rollout-diag: reading 5 / 0 rows, 1 s elapsed"


def test_library_callback_sees_every_row():
    calls = []
    result = analyze(SAMPLE, device="cpu", chunk_tokens=4096, progress=lambda done, total: calls.append((done, total)))
    assert len(calls) > 1
    totals = {total for _, total in calls}
    assert totals == {768} and calls[-1][0] == 768 == result.run.rows
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)


def test_progress_true_prints_lines(monkeypatch, capsys):
    clock = FakeClock()

    def ticking() -> float:
        clock.now += 3.0  # every call moves 3 s on: the pass prints lines
        return clock.now

    monkeypatch.setattr("rollout_diag.progress.time.monotonic", ticking)
    analyze(SAMPLE, device="cpu", chunk_tokens=4096, progress=True)
    err = capsys.readouterr().err
    assert "rollout-diag: reading" in err and "768 / 768 rows (100%)" in err


@pytest.mark.parametrize(("size", "expected"), [(1 << 10, type(None)), (64 << 20, LineProgress)])
def test_cli_prints_lines_in_a_pipe_for_long_inputs(tmp_path, monkeypatch, size, expected):
    from rollout_diag.cli import output as cli

    monkeypatch.setattr(cli, "_size", lambda path: size)
    monkeypatch.setattr(cli.sys.stderr, "isatty", lambda: False, raising=False)
    with cli.progress_bar([tmp_path / "dump.parquet"]) as progress:
        assert isinstance(progress, expected)
