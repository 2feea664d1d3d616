"""When Python's cyclic garbage collector runs (rollout_diag.memory): the command line switches it off while a command
loads and back on where the chunks begin, the modules it loaded frozen out of its reach; the library and ``watch``
leave it as they find it; nothing stays frozen after a command."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from helpers.dumps import random_rows, write_sequence_dump
from typer.testing import CliRunner

import rollout_diag as rd
from rollout_diag import memory
from rollout_diag.cli import app
from rollout_diag.io.reader import DumpReader


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    """Whatever a test does, the next one finds the collector on and nothing frozen."""
    yield
    memory.end_deferral()
    gc.unfreeze()
    gc.enable()


@pytest.fixture
def dump(tmp_path: Path) -> Path:
    return write_sequence_dump(tmp_path / "run.parquet", random_rows(3, steps=range(6)), row_group_size=7)


@pytest.fixture
def collector_per_chunk(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool, int]]:
    """(collector on, objects frozen) as each chunk reaches the command's consumers."""
    seen: list[tuple[bool, int]] = []
    original = DumpReader.chunks

    def spy(self: DumpReader, *args: object, **kwargs: object) -> Iterator[object]:
        for item in original(self, *args, **kwargs):
            seen.append((gc.isenabled(), gc.get_freeze_count()))
            yield item

    monkeypatch.setattr(DumpReader, "chunks", spy)
    return seen


def invoke(*args: object) -> str:
    result = CliRunner().invoke(app, [str(arg) for arg in args], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    return result.stdout


def test_deferral_is_one_off_and_undone() -> None:
    assert not memory.collect_from_here()  # nothing deferred: nothing changes
    assert gc.isenabled() and gc.get_freeze_count() == 0
    assert memory.defer_collection() and not gc.isenabled()
    assert not memory.defer_collection()  # already deferred
    assert memory.collect_from_here() and gc.isenabled()
    assert gc.get_freeze_count() > 0
    assert not memory.collect_from_here()  # a second reader (watch's next step) freezes nothing more
    memory.end_deferral()
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_collector_switched_off_by_the_caller_stays_off() -> None:
    gc.disable()
    assert not memory.defer_collection()
    assert not memory.collect_from_here()
    memory.end_deferral()
    assert not gc.isenabled() and gc.get_freeze_count() == 0


def test_deferred_collection_is_undone_without_a_chunk() -> None:
    memory.defer_collection()
    memory.end_deferral()  # a command that failed before reading
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_command_opens_its_dump_with_the_collector_off_until_it_ends(dump: Path) -> None:
    from rollout_diag import process

    opened = process.open_for_reading(lambda: rd.Dump([str(dump)]).opened(), rd.Dump.input_size)
    assert isinstance(opened, rd.Dump) and not gc.isenabled()
    process.command_ended()  # a command that failed before reading
    assert gc.isenabled() and gc.get_freeze_count() == 0


@pytest.mark.parametrize("enabled", [True, False])
def test_the_library_leaves_the_collector_as_it_finds_it(dump: Path, enabled: bool) -> None:
    if not enabled:
        gc.disable()
    rd.analyze(str(dump), device="cpu")
    assert gc.isenabled() is enabled and gc.get_freeze_count() == 0


@pytest.mark.parametrize("command", ["analyze", "compare-presets"])
def test_the_cli_collects_while_the_chunks_flow_and_unfreezes_after(
    dump: Path, command: str, collector_per_chunk: list[tuple[bool, int]]
) -> None:
    invoke(command, dump, "--device", "cpu", "--chunk-tokens", "16", "-f", "json")
    assert len(collector_per_chunk) > 1
    assert all(enabled and frozen > 0 for enabled, frozen in collector_per_chunk), collector_per_chunk
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_workers_fork_with_the_collector_on(dump: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rollout_diag.drivers import distributed

    seen: list[tuple[bool, int]] = []
    original = distributed._run_processes

    def spy(*args: object) -> object:
        seen.append((gc.isenabled(), gc.get_freeze_count()))
        return original(*args)

    monkeypatch.setattr(distributed, "_run_processes", spy)
    invoke("analyze", dump, "--device", "cpu", "--workers", "2", "-f", "json")
    assert len(seen) == 1 and seen[0][0] and seen[0][1] > 0
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_command_that_fails_after_opening_the_dump_collects_again(dump: Path) -> None:
    result = CliRunner().invoke(app, ["analyze", str(dump), "--steps", "nine"])
    assert result.exit_code == 1 and result.stderr.startswith("Error: ")
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_watch_keeps_collecting(tmp_path: Path, collector_per_chunk: list[tuple[bool, int]]) -> None:
    root = tmp_path / "run"
    writer = rd.DumpWriter(root, rank=0, world_size=1, logprob_type="float64")
    for step in range(3):
        rollout = -np.random.default_rng(step).random((4, 9)) * 3.0
        writer.write_step(step, old_log_probs=rollout - 0.01, rollout_log_probs=rollout, response_mask=np.ones((4, 9)))
    writer.close()
    invoke("watch", root, "--interval", "0.02", "--exit-after-idle", "0.1", "-f", "jsonl")
    assert collector_per_chunk and all(enabled and frozen == 0 for enabled, frozen in collector_per_chunk)
