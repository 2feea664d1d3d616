"""The reader's pipeline (io/reader.py DumpReader.chunks): a reader thread, a pool of threads that prepare chunks,
the caller. Chunks come out in file order, each prepared, whatever the pool's size; an error in any stage reaches
the caller; a caller that stops early leaves no thread behind; the analysis does not depend on the pool's size."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
from helpers.metrics import random_rows, write_dump

import rollout_diag as rd
from rollout_diag.io import reader as reader_module
from rollout_diag.io.reader import DumpReader

CPU = torch.device("cpu")


@pytest.fixture
def dump(tmp_path):
    rng = np.random.default_rng(3)
    path = tmp_path / "dump.parquet"
    write_dump(path, {step: random_rows(rng, 12) for step in range(4)}, row_group_size=5)
    return path


def _pipeline_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("rollout-diag")]


def _wait_for_no_pipeline_threads() -> None:
    deadline = time.monotonic() + 5.0
    while _pipeline_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _pipeline_threads()


def _fingerprints(path, prefetch: int, prepare=None) -> list[tuple]:
    reader = DumpReader([str(path)], chunk_tokens=40)
    return [
        (consumed, chunk.file_row, float(chunk.trainer.sum()), chunk.cache.get("prepared"))
        for chunk, consumed in reader.chunks(CPU, prefetch=prefetch, prepare=prepare)
    ]


def _mark(chunk) -> None:
    time.sleep(0.001 * (chunk.file_row[0] % 3))  # workers finish out of order
    chunk.cache["prepared"] = chunk.file_row[0]


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_chunks_come_out_in_file_order_each_prepared(dump, monkeypatch, workers):
    monkeypatch.setattr(reader_module, "_prepare_workers", lambda: workers)
    serial = _fingerprints(dump, prefetch=0, prepare=_mark)
    assert len(serial) > 4 and all(prepared is not None for *_, prepared in serial)
    assert _fingerprints(dump, prefetch=1, prepare=_mark) == serial
    _wait_for_no_pipeline_threads()


def test_an_error_in_prepare_reaches_the_caller_after_the_chunks_before_it(dump, monkeypatch):
    monkeypatch.setattr(reader_module, "_prepare_workers", lambda: 3)
    seen = []

    def failing(chunk) -> None:
        if chunk.file_row[0] >= 10:
            raise ValueError(f"bad chunk at row {chunk.file_row[0]}")

    reader = DumpReader([str(dump)], chunk_tokens=40)
    with pytest.raises(ValueError, match="bad chunk at row"):
        for chunk, _ in reader.chunks(CPU, prefetch=1, prepare=failing):
            seen.append(chunk.file_row[0])
    assert seen and max(seen) < 10
    _wait_for_no_pipeline_threads()


def test_a_caller_that_stops_early_leaves_no_thread(dump, monkeypatch):
    monkeypatch.setattr(reader_module, "_prepare_workers", lambda: 2)
    reader = DumpReader([str(dump)], chunk_tokens=40)
    chunks = reader.chunks(CPU, prefetch=1, prepare=_mark)
    next(chunks)
    chunks.close()
    _wait_for_no_pipeline_threads()


def test_the_analysis_does_not_depend_on_the_pool(dump, monkeypatch):
    documents = []
    for workers in (1, 3):
        monkeypatch.setattr(reader_module, "_prepare_workers", lambda workers=workers: workers)
        documents.append(rd.analyze(dump, device="cpu", chunk_tokens=50, top_k=5).to_json())
    assert documents[0] == documents[1]


def _most_at_once(reader: DumpReader) -> int:
    """The most chunks ``prepare`` ran on at the same time while ``reader`` was read."""
    lock, active, most = threading.Lock(), [0], [0]

    def slow(chunk) -> None:
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        time.sleep(0.01)
        with lock:
            active[0] -= 1

    for _ in reader.chunks(CPU, prefetch=1, prepare=slow):
        pass
    return most[0]


def test_a_worker_process_prepares_one_chunk_at_a_time(dump, monkeypatch):
    """Worker processes (a reader of one part) already use every core: their pool is one thread."""
    monkeypatch.setattr(reader_module, "_prepare_workers", lambda: 4)
    assert _most_at_once(DumpReader([str(dump)], chunk_tokens=40)) > 1
    groups = DumpReader([str(dump)]).files[0].parquet.metadata.num_row_groups
    part = DumpReader([str(dump)], chunk_tokens=40, parts={str(dump): list(range(groups))})
    assert _most_at_once(part) == 1
