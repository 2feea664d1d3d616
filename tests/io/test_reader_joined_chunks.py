"""Directory dumps of small files: small blocks joined into one chunk (``io/joining.Joiner``), small files decoded
ahead on threads (``DumpReader._decoded_files``).

A directory dump of one small file per step and rank (``DumpWriter``'s ``step=N/rank-R.parquet``, prime-rl's) is read
in chunks of the reader's size, not a chunk per file: every chunk costs the families a fixed few milliseconds. Each row
of a joined chunk keeps its file, row number, extra columns and token text; the results are the one-file results.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.dumps import corrupt_row_group, random_rows, seq_row, sequence_table, write_sequence_dump, write_table

import rollout_diag as rd
from rollout_diag.io import joining
from rollout_diag.io import reader as reader_module
from rollout_diag.io.reader import DumpReader
from rollout_diag.render.export import to_json_text
from rollout_diag.report import render_report

STEPS, RANKS = (1, 2, 9, 10), 4
RTOL, ATOL = 1e-12, 1e-15  # joining moves chunk boundaries: the accumulators' contract (test_accumulator_contract)


def rank_rows(step: int, rank: int) -> list[dict[str, Any]]:
    rows = random_rows(step * 100 + rank, steps=(step,), rows_per_step=3, with_token_ids=True)
    for index, row in enumerate(rows):
        row["sample_id"] = f"s{step}-r{rank}-{index}"
        row["tokens"] = [f"t{step}.{rank}.{index}.{p}" for p in range(len(row["trainer"]))]
    return rows


def with_reward(table: pa.Table, step: int, rank: int) -> pa.Table:
    reward = [float(step * 10 + rank) + index / 10 for index in range(table.num_rows)]
    return table.append_column("reward", pa.array(reward, pa.float64()))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``step=N/rank-R.parquet``: 16 files of 3 rows (≤ 36 tokens each), with token ids, token text and a reward."""
    root = tmp_path_factory.mktemp("joined") / "run"
    for step in STEPS:
        for rank in range(RANKS):
            table = with_reward(sequence_table(rank_rows(step, rank)), step, rank)
            write_table(root / f"step={step}" / f"rank-{rank}.parquet", table)
    return root


@pytest.fixture(scope="module")
def one_file(run: Path) -> Path:
    """The same rows, in the same order, in one file."""
    tables = [pq.read_table(run / f"step={step}" / f"rank-{rank}.parquet") for step in STEPS for rank in range(RANKS)]
    return write_table(run.parent / "one.parquet", pa.concat_tables(tables))


def read(path: Path, chunk_tokens: int, **options: Any) -> list[Any]:
    reader = DumpReader([str(path)], chunk_tokens=chunk_tokens)
    if options.pop("ahead", False):
        reader.read_ahead(2)
    return [chunk for chunk, _ in reader.chunks("cpu", numpy=True, **options)]


def test_small_files_are_read_in_chunks_of_the_readers_size(run: Path) -> None:
    files = sorted(run.rglob("*.parquet"))
    sizes = [
        sum(len(v) for v in pq.read_table(f, columns=["old_log_probs"])["old_log_probs"].to_pylist()) for f in files
    ]
    limit = 4 * (max(sizes) + 1)  # every file is a small block (under a quarter of the chunk size)
    chunks = read(run, limit, prefetch=0)
    tokens = [int(chunk.offsets[-1]) for chunk in chunks]
    assert sum(tokens) == sum(sizes)
    assert len(chunks) < len(files) / 2  # a chunk per file before
    assert all(t <= limit for t in tokens)
    assert all(t + max(sizes) > limit for t in tokens[:-1])  # each chunk but the last took files while they fit
    assert sum(len(set(chunk.file)) > 1 for chunk in chunks) >= len(chunks) - 1


@pytest.mark.parametrize("how", ["plain", "prefetched", "read ahead"])
def test_each_row_of_a_joined_chunk_keeps_its_file_row_values_extras_and_text(run: Path, how: str) -> None:
    options = {"plain": {"prefetch": 0}, "prefetched": {"prefetch": 2}, "read ahead": {"ahead": True}}[how]
    chunks = read(run, 160, **options)
    assert any(len(set(chunk.file)) > 1 for chunk in chunks)
    tables = {str(f): pq.read_table(f) for f in run.rglob("*.parquet")}
    seen = []
    for chunk in chunks:
        assert set(chunk.extra) == {"reward"}
        for row in range(chunk.rows):
            file, file_row = chunk.file[row], chunk.file_row[row]
            source = tables[file].slice(file_row, 1).to_pylist()[0]
            begin, end = int(chunk.offsets[row]), int(chunk.offsets[row + 1])
            mask = np.asarray(source["response_mask"], dtype=bool)
            assert chunk.sample_id[row] == source["sample_id"] and int(chunk.step[row]) == source["step"]
            assert chunk.trainer[begin:end].tolist() == np.where(mask, source["old_log_probs"], 0.0).tolist()
            assert chunk.rollout[begin:end].tolist() == np.where(mask, source["rollout_log_probs"], 0.0).tolist()
            assert chunk.mask[begin:end].tolist() == mask.tolist()
            assert chunk.token_ids[begin:end].tolist() == source["token_ids"]
            assert [chunk.token_text(row, p) for p in range(end - begin)] == source["tokens"]
            assert chunk.row_extra(row) == {"reward": source["reward"]}
            seen.append((file, file_row))
    assert seen == [(str(f), r) for f in sorted(run.rglob("*.parquet"), key=str_step) for r in range(3)]


def str_step(path: Path) -> tuple[int, int]:
    return int(path.parent.name.split("=")[1]), int(path.stem.split("-")[1])


def test_blocks_whose_columns_differ_are_not_joined(tmp_path: Path) -> None:
    """A file without the reward column, or with it as text, starts a chunk of its own: a chunk's extra columns
    hold a value for each of its rows."""
    kinds = {0: "number", 1: "number", 2: None, 3: "text", 4: "text", 5: "number"}
    for rank, kind in kinds.items():
        table = sequence_table(rank_rows(1, rank))
        if kind == "number":
            table = with_reward(table, 1, rank)
        elif kind == "text":
            table = table.append_column("reward", pa.array([f"r{rank}"] * table.num_rows))
        write_table(tmp_path / f"rank-{rank}.parquet", table)
    chunks = read(tmp_path, 1 << 20, prefetch=0)
    assert [sorted({Path(f).stem for f in chunk.file}) for chunk in chunks] == [
        ["rank-0", "rank-1"],
        ["rank-2"],
        ["rank-3", "rank-4"],
        ["rank-5"],
    ]
    assert [list(chunk.extra) for chunk in chunks] == [["reward"], [], ["reward"], ["reward"]]


def test_a_joined_chunk_holds_at_most_max_block_steps_runs_of_one_step(
    run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(joining, "MAX_BLOCK_STEPS", 3)
    chunks = read(run, 1 << 20, prefetch=0)
    runs = [int(np.count_nonzero(np.diff(chunk.step))) + 1 for chunk in chunks]
    assert max(runs) == 3 and len(chunks) == 2  # steps 1, 2, 9 | 10 (each step's four files join as one run)


def test_only_small_blocks_are_joined(tmp_path: Path) -> None:
    """A block of a quarter of the chunk size or more is a chunk of its own (joining it would only copy it); the
    small ones around it join each other."""
    sizes = (10, 10, 40, 10, 10, 25, 24)
    for index, size in enumerate(sizes):
        row = seq_row(0, f"s{index}", [-0.5] * size, [-0.25] * size)
        write_table(tmp_path / f"part-{index}.parquet", sequence_table([row]))
    chunks = read(tmp_path, 100, prefetch=0)  # small: under 25 tokens
    assert [[Path(f).stem for f in chunk.file] for chunk in chunks] == [
        ["part-0", "part-1"],
        ["part-2"],
        ["part-3", "part-4"],
        ["part-5"],
        ["part-6"],
    ]


def close(actual: Any, expected: Any, where: str = "") -> None:
    if isinstance(expected, dict):
        assert set(actual) == set(expected), where
        for key in expected:
            close(actual[key], expected[key], f"{where}/{key}")
    elif isinstance(expected, list):
        assert len(actual) == len(expected), where
        for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
            close(a, e, f"{where}[{index}]")
    elif isinstance(expected, float) and math.isfinite(expected):
        assert math.isclose(actual, expected, rel_tol=RTOL, abs_tol=ATOL), f"{where}: {actual} != {expected}"
    else:
        assert actual == expected or (actual != actual and expected != expected), f"{where}: {actual} != {expected}"


@pytest.mark.parametrize("command", ["analyze", "compare_presets"])
def test_a_directory_dump_gives_the_one_file_results(run: Path, one_file: Path, command: str) -> None:
    function = getattr(rd, command)
    directory = function(str(run), device="cpu", chunk_tokens=160).to_json()
    single = function(str(one_file), device="cpu", chunk_tokens=160).to_json()
    close(placeless(directory), placeless(single))


def placeless(document: Any) -> Any:
    """``document`` without the rows' places (inputs, file, row): they differ by design; which rows they are does
    not."""
    if isinstance(document, dict):
        return {key: placeless(value) for key, value in document.items() if key not in ("inputs", "file", "row")}
    if isinstance(document, list):
        return [placeless(value) for value in document]
    return document


# ------------------------------------------------------------------------------ small files decoded ahead
def bad_directory(root: Path) -> Path:
    """Twelve small files, four of them with rows skipped while decoding (a null step, a trainer list longer than the
    rollout's, an undecodable row group) or validating (NaN)."""
    for index in range(12):
        rows = random_rows(index, steps=(index // 3,), rows_per_step=4)
        for row in rows:
            row["sample_id"] = f"f{index}-{row['sample_id']}"
        if index == 1:
            rows[2]["step"] = None
        if index == 4:
            rows[1]["trainer"] = [*rows[1]["trainer"], -0.5, -0.5]
        if index == 7:
            rows[3]["trainer"][0] = float("nan")
            rows[3]["mask"][0] = 1
        path = write_sequence_dump(root / f"part-{index}.parquet", rows, row_group_size=2)
        if index == 9:
            corrupt_row_group(path, 1)
    return root


def decoding_threads(monkeypatch: pytest.MonkeyPatch, threads: int, slow_first: bool = False) -> None:
    monkeypatch.setattr(reader_module, "_decoding_threads", lambda: threads)
    if slow_first:  # the first files finish last: their records must still come first
        decode = reader_module.read_sequences

        def slow(opened: Any, reading: Any) -> Any:
            if opened.source.path.endswith(("part-0.parquet", "part-1.parquet")):
                time.sleep(0.2)
            return decode(opened, reading)

        monkeypatch.setattr(reader_module, "read_sequences", slow)


@pytest.mark.parametrize("slow_first", [False, True])
def test_small_files_decoded_ahead_give_one_threads_result_and_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slow_first: bool
) -> None:
    run = bad_directory(tmp_path / "run")
    documents = {}
    for threads in (1, 3):
        with monkeypatch.context() as patch:
            decoding_threads(patch, threads, slow_first and threads > 1)
            documents[threads] = rd.analyze(str(run), device="cpu", chunk_tokens=4096).to_json()
    one, three = documents[1], documents[3]
    assert [(Path(s["file"]).stem, s["row"]) for s in one["skipped"]] == [
        ("part-1", 2),
        ("part-4", 1),
        ("part-7", 3),
        ("part-9", 2),
        ("part-9", 3),
    ]
    assert any("part-9.parquet: row group 1 cannot be decoded" in w for w in one["warnings"])
    assert to_json_text(three) == to_json_text(one)


def test_an_error_in_a_file_decoded_ahead_is_raised_in_its_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Strict reading stops at the first bad row in reading order, whichever thread decoded its file first."""
    run = bad_directory(tmp_path / "run")
    messages = []
    for threads in (1, 3):
        with monkeypatch.context() as patch:
            decoding_threads(patch, threads, slow_first=threads > 1)
            with pytest.raises(rd.RolloutDiagError) as raised:
                rd.analyze(str(run), device="cpu", strict=True)
            messages.append(str(raised.value))
    assert messages[0] == messages[1]
    assert "part-1.parquet" in messages[0] and "null step" in messages[0]


def test_workers_list_skipped_rows_in_reading_order(tmp_path: Path) -> None:
    """The records of workers that read other files are merged in reading order: part-9 before part-10."""
    run = bad_directory(tmp_path / "run")
    extra = random_rows(10, steps=(4,), rows_per_step=4)
    extra[0]["step"] = None
    write_sequence_dump(run / "part-10.parquet", extra)
    one = rd.analyze(str(run), device="cpu").to_json()
    two = rd.analyze(str(run), device="cpu", workers=2).to_json()
    order = [(Path(s["file"]).stem, s["row"]) for s in one["skipped"]]
    assert order[-3:] == [("part-9", 2), ("part-9", 3), ("part-10", 0)]
    assert [(Path(s["file"]).stem, s["row"]) for s in two["skipped"]] == order


# ------------------------------------------------------------------------------ naming a directory's files
def test_notes_and_the_report_name_a_directory_file_by_its_label(tmp_path: Path) -> None:
    """Every step's file is ``rank-0.parquet``: a note and the report's inputs say ``step=2/rank-0.parquet``, as the
    tables do; the report's title names the directory (rollout_diag/paths.py ``inputs_label``)."""
    run = tmp_path / "run"
    for step in (1, 2):
        rows = random_rows(step, steps=(step,), rows_per_step=3)
        if step == 2:
            rows[1]["mask"] = [0] * len(rows[1]["mask"])  # a row without a model token
        write_sequence_dump(run / f"step={step}" / "rank-0.parquet", rows)
    result = rd.analyze(str(run), device="cpu")
    note = next(w for w in result.warnings if "have no model token" in w)
    assert "step 2 sample 's2-1' (step=2/rank-0.parquet row 1)" in note
    html = render_report(result)
    assert f"rollout-diag report: {run}/ (2 files)" in html
    assert "step=1/rank-0.parquet, step=2/rank-0.parquet" in html


def test_workers_list_rows_without_a_model_token_in_reading_order(tmp_path: Path) -> None:
    for index in (8, 9, 10):
        rows = random_rows(index, steps=(0,), rows_per_step=3)
        for row in rows:
            row["sample_id"] = f"p{index}-{row['sample_id']}"
        rows[1]["mask"] = [0] * len(rows[1]["mask"])
        write_sequence_dump(tmp_path / f"part-{index}.parquet", rows)
    notes = [
        next(w for w in rd.analyze(str(tmp_path), device="cpu", workers=workers).warnings if "no model token" in w)
        for workers in (1, 2)
    ]
    assert notes[0] == notes[1]
    assert notes[0].index("part-9.parquet row 1") < notes[0].index("part-10.parquet row 1")
