"""DumpWriter: what a trainer writes is what analyze reads."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from helpers.dumps import encodings

import rollout_diag as rd


def test_padded_torch_batches_round_trip(tmp_path):
    path = tmp_path / "run.parquet"
    rollout = torch.tensor([[-1.0, -2.0, -0.5], [-0.25, -3.0, 0.0]], dtype=torch.bfloat16)
    trainer = torch.tensor([[-1.5, -2.0, -0.5], [-0.5, -3.5, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    with rd.DumpWriter(path) as dump:
        dump.write(7, rollout, trainer, mask, sample_ids=["a", "b"], lengths=[3, 2])
        dump.write(8, rollout, trainer, mask, sample_ids=["c", "d"])
    result = rd.analyze(str(path), device="cpu")
    assert [(s.step, s.rows, s.tokens) for s in result.steps] == [(7, 2, 4), (8, 2, 4)]
    row = rd.inspect_row(str(path), "b", device="cpu")
    assert row.mask == [1, 1]  # trimmed to length 2
    # bf16 rollout values survive exactly (they are representable in float32)
    assert row.rollout_logprob == [-0.25, -3.0]
    expected_kl = np.mean([0.5, 0.0, 0.25, 0.5])  # T[r − a] over the 4 model tokens of step 7
    assert result.steps[0].metrics["rollout_corr/kl"] == pytest.approx(expected_kl, rel=1e-6)


def test_shape_mismatch_is_a_clear_error(tmp_path):
    with rd.DumpWriter(tmp_path / "bad.parquet") as dump, pytest.raises(rd.ConfigError, match=r"\[B, L\]"):
        dump.write(0, np.zeros((2, 3)), np.zeros((2, 4)), np.ones((2, 3)))


# ----------------------------------------------------------------------------- issue 11: the trainer side
def batch(seed: int = 0, rows: int = 6, width: int = 9, dtype: torch.dtype = torch.float32):
    """Right-padded [B, L] tensors; the last row has no model token."""
    from helpers.trainers import padded_batch

    old, rollout, mask, lengths, _ = padded_batch(seed, rows=rows, width=width, dtype=dtype, empty_row=rows > 3)
    return {"old_log_probs": old, "rollout_log_probs": rollout, "response_mask": mask, "lengths": lengths}


def test_directory_mode_writes_one_file_per_step_and_rank_that_analyze_reads(tmp_path):
    root = tmp_path / "dump"
    with rd.DumpWriter(root, rank=0) as rank0, rd.DumpWriter(root, rank=1) as rank1:
        for step in (1, 2):
            assert rank0.write_step(step, **batch(step)) == root / f"step={step}" / "rank-0.parquet"
            rank1.write_step(step, **batch(10 + step))
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    assert files == [
        "step=1",
        "step=1/rank-0.parquet",
        "step=1/rank-1.parquet",
        "step=2",
        "step=2/rank-0.parquet",
        "step=2/rank-1.parquet",
    ]
    result = rd.analyze(str(root), device="cpu")
    assert [(s.step, s.rows) for s in result.steps] == [(1, 12), (2, 12)]
    # default ids <rank>-<row> never repeat across ranks: the only warning is about the rows without a model token
    assert [w for w in result.warnings if "no model token" not in w] == []
    ids = set(pq.read_table(root / "step=1" / "rank-1.parquet").column("sample_id").to_pylist())
    assert ids == {f"1-{row}" for row in range(6)}


def test_partition_option_and_suffix_choose_the_mode(tmp_path):
    with rd.DumpWriter(tmp_path / "run.parquet", partition="step") as dump:
        dump.write_step(0, **batch())
    assert (tmp_path / "run.parquet" / "step=0" / "rank-0.parquet").is_file()
    with rd.DumpWriter(tmp_path / "one.parquet") as dump:
        assert dump.write_step(0, **batch()) == tmp_path / "one.parquet"
    assert (tmp_path / "one.parquet").is_file()
    with pytest.raises(rd.ConfigError, match="partition='rank'"):
        rd.DumpWriter(tmp_path / "x", partition="rank")


def test_rank_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    with rd.DumpWriter(tmp_path / "dump") as dump:
        assert dump.write_step(0, **batch()).name == "rank-3.parquet"


def test_rewriting_a_step_replaces_it(tmp_path):
    """A run resumed from a checkpoint writes its steps again: each rank's file of the step is replaced."""
    with rd.DumpWriter(tmp_path / "dump") as dump:
        dump.write_step(4, **batch(0, rows=6))
        dump.write_step(4, **batch(1, rows=5))
    assert rd.analyze(str(tmp_path / "dump"), device="cpu").steps[0].rows == 5
    assert [p.name for p in (tmp_path / "dump" / "step=4").iterdir()] == ["rank-0.parquet"]


def test_every_k_writes_only_multiples_of_k(tmp_path):
    with rd.DumpWriter(tmp_path / "dump", every=3) as dump:
        written = [dump.write_step(step, **batch(step)) for step in range(7)]
    assert [w is not None for w in written] == [True, False, False, True, False, False, True]
    assert [s.step for s in rd.analyze(str(tmp_path / "dump"), device="cpu").steps] == [0, 3, 6]
    with pytest.raises(rd.ConfigError, match="every=0"):
        rd.DumpWriter(tmp_path / "x", every=0)


def test_write_is_an_alias_of_write_step(tmp_path):
    tensors = batch(5)
    with rd.DumpWriter(tmp_path / "a.parquet") as old_api, rd.DumpWriter(tmp_path / "b.parquet") as new_api:
        old_api.write(
            0,
            tensors["rollout_log_probs"],
            tensors["old_log_probs"],
            tensors["response_mask"],
            lengths=tensors["lengths"],
        )
        new_api.write_step(0, **tensors)
    assert pq.read_table(tmp_path / "a.parquet").equals(pq.read_table(tmp_path / "b.parquet"))


def test_programmer_errors_raise_config_error(tmp_path):
    tensors = batch()
    with rd.DumpWriter(tmp_path / "dump") as dump:
        with pytest.raises(rd.ConfigError, match="sample_ids: 5 ids for a batch of 6 rows"):
            dump.write_step(0, **tensors, sample_ids=["a", "b", "c", "d", "e"])
        with pytest.raises(rd.ConfigError, match="missing rollout_log_probs"):
            dump.write_step(0, old_log_probs=tensors["old_log_probs"], response_mask=tensors["response_mask"])
        with pytest.raises(TypeError):
            dump.write_step(0, tensors["old_log_probs"], tensors["rollout_log_probs"], tensors["response_mask"])
        swapped = {**tensors, "old_log_probs": tensors["response_mask"], "response_mask": tensors["old_log_probs"]}
        with pytest.raises(rd.ConfigError, match=r"old_log_probs: torch\.int64 values"):
            dump.write_step(0, **swapped)
        with pytest.raises(rd.ConfigError, match=r"token_ids: expected integer \[B, L\]"):
            dump.write_step(0, **tensors, token_ids=torch.zeros(6, 2, dtype=torch.int64))
        with pytest.raises(rd.ConfigError, match="extra column 'reward': expected one value per row"):
            dump.write_step(0, **tensors, extra={"reward": [1.0, 2.0]})
        with pytest.raises(rd.ConfigError, match="extra column 'uid'"):
            dump.write_step(0, **tensors, extra={"uid": list(range(6))})
        with pytest.raises(rd.ConfigError, match=r"step=1\.5"):
            dump.write_step(1.5, **tensors)
    assert not any((tmp_path / "dump").iterdir())  # nothing half-written
    with pytest.raises(rd.ConfigError, match="closed"):
        dump.write_step(0, **tensors)


def test_data_problems_are_written_logged_once_and_skipped_by_analyze(tmp_path, caplog):
    tensors = batch(2)
    tensors["rollout_log_probs"][1, 0], tensors["response_mask"][1, 0] = 0.25, 1
    with caplog.at_level(logging.WARNING, logger="rollout_diag"), rd.DumpWriter(tmp_path / "dump") as dump:
        for step in range(3):
            dump.write_step(step, **tensors, sample_ids=["p0", "p0", "p1", "p1", "p2", "p2"])
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2, messages  # one per kind of problem, not one per step
    positive, repeated = sorted(messages, key=lambda message: "sample_ids repeat" in message)
    assert "row 1, column 'rollout_log_probs': positive logprob 0.25 at position 0 (logprobs are ≤ 0)" in positive
    assert "sample_ids repeat within a step" in repeated and "from_verl_batch" in repeated
    result = rd.analyze(str(tmp_path / "dump"), device="cpu")
    assert result.skipped_rows == 3
    assert "positive logprob 0.25 at position 0" in result.skipped[0].reason


def test_token_ids_and_extra_columns_are_written(tmp_path):
    tensors = batch(3)
    rows, width = tensors["response_mask"].shape
    token_ids = torch.arange(rows * width).reshape(rows, width)
    extra = {
        "advantage": torch.linspace(-1, 1, rows, dtype=torch.bfloat16),
        "reward": np.array([1.0, np.nan, 0.0, 1.0, 0.0, 1.0]),
        "policy_version": [7] * rows,
        "correct": np.array([True, False] * 3),
        "source": ["gsm8k"] * rows,
    }
    with rd.DumpWriter(tmp_path / "dump") as dump:
        dump.write_step(0, **tensors, token_ids=token_ids, extra=extra, sample_ids=[f"s{i}" for i in range(rows)])
    table = pq.read_table(tmp_path / "dump" / "step=0" / "rank-0.parquet")
    assert str(table.schema.field("token_ids").type) == "list<element: int32>"
    assert [str(table.schema.field(name).type) for name in extra] == ["double", "double", "int64", "bool", "string"]
    assert table.column("reward").to_pylist() == [1.0, None, 0.0, 1.0, 0.0, 1.0]  # NaN is written as null
    row = rd.inspect_row(str(tmp_path / "dump"), "s2", device="cpu")
    assert row.token_id == token_ids[2, : int(tensors["lengths"][2])].tolist()


def test_one_file_keeps_the_first_steps_columns(tmp_path):
    with rd.DumpWriter(tmp_path / "one.parquet") as dump:
        dump.write_step(0, **batch(), extra={"reward": [1.0] * 6})
        with pytest.raises(rd.ConfigError, match="use the directory mode"):
            dump.write_step(1, **batch())
    assert rd.analyze(str(tmp_path / "one.parquet"), device="cpu").run.rows == 6


def test_a_failed_write_in_directory_mode_is_logged_not_raised(tmp_path, monkeypatch, caplog):
    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    with rd.DumpWriter(tmp_path / "dump") as dump:
        monkeypatch.setattr(pq, "write_table", disk_full)
        with caplog.at_level(logging.WARNING, logger="rollout_diag"):
            assert dump.write_step(0, **batch()) is None
            assert dump.write_step(1, **batch()) is None
        monkeypatch.undo()
        dump.write_step(2, **batch())
    assert len(caplog.records) == 1 and "step 0 not written (" in caplog.records[0].getMessage()
    assert [s.step for s in rd.analyze(str(tmp_path / "dump"), device="cpu").steps] == [2]


KILLED_WRITER = """
import sys, time
import pyarrow.parquet as pq
import torch
import rollout_diag as rd

path = sys.argv[1]
rows = torch.arange(1, 5, dtype=torch.float32)[:, None]
tensors = dict(old_log_probs=-rows.expand(4, 8) / 10, rollout_log_probs=-rows.expand(4, 8) / 11,
               response_mask=torch.ones(4, 8, dtype=torch.int64))
dump = rd.DumpWriter(path)
for step in range(3):
    dump.write_step(step, **tensors)

def stall(self):  # the data is on disk, the footer is not: the kill lands mid-file
    print("writing", flush=True)
    time.sleep(600)

pq.ParquetWriter.close = stall
if dump.directory_mode:
    dump.write_step(3, **tensors)
else:
    dump.close()  # one file: three row groups written, the footer never
"""


def _kill_while_writing(path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "writing\n"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL


def test_sigkill_mid_step_leaves_every_finished_step_readable(tmp_path):
    _kill_while_writing(tmp_path / "dump")
    (half_written,) = (tmp_path / "dump" / "step=3").iterdir()
    assert half_written.name.startswith(".rank-0.parquet.")  # hidden: the reader never takes it for data
    result = rd.analyze(str(tmp_path / "dump"), device="cpu")
    assert [(s.step, s.rows, s.tokens) for s in result.steps] == [(0, 4, 32), (1, 4, 32), (2, 4, 32)]
    assert not result.skipped and not result.warnings


def test_sigkill_leaves_a_one_file_dump_unreadable_as_documented(tmp_path):
    _kill_while_writing(tmp_path / "run.parquet")
    with pytest.raises(rd.InputError, match="not a readable Parquet file"):
        rd.analyze(str(tmp_path / "run.parquet"), device="cpu")


def test_directory_dump_rows_are_labelled_so_inspect_finds_them(tmp_path):
    """Every step of a directory dump has a rank-0.parquet: tables label files by the path suffix that tells them
    apart (step=2/rank-0.parquet:3), and inspect --row takes that label back (the bare name is ambiguous)."""
    from typer.testing import CliRunner

    from rollout_diag.cli import app
    from rollout_diag.paths import file_labels

    root = tmp_path / "dump"
    with rd.DumpWriter(root, rank=0) as rank0:
        for step in (1, 2):
            rank0.write_step(step, **batch(step))
    result = rd.analyze(str(root), device="cpu")
    labels = file_labels(result.inputs)
    assert sorted(labels.values()) == ["step=1/rank-0.parquet", "step=2/rank-0.parquet"]
    worst = result.worst_rows[0]
    label = f"{labels[worst.file]}:{worst.row}"
    runner = CliRunner()
    table = runner.invoke(app, ["analyze", str(root), "--device", "cpu"], env={"COLUMNS": "200"})
    assert label in table.output
    shown = runner.invoke(app, ["inspect", str(root), "--row", label, "--format", "json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["sample_id"] == worst.sample_id
    ambiguous = runner.invoke(app, ["inspect", str(root), "--row", f"rank-0.parquet:{worst.row}"])
    assert ambiguous.exit_code == 1 and "2 input files named rank-0.parquet" in ambiguous.output


@pytest.mark.parametrize(("compression", "float_encoding"), [("zstd", "BYTE_STREAM_SPLIT"), ("snappy", "PLAIN")])
@pytest.mark.parametrize("one_file", [False, True])
def test_logprobs_are_written_without_a_dictionary(tmp_path, compression, float_encoding, one_file):
    """Logprobs rarely repeat (the bundled real dump: 25 263 distinct rollout values in 30 432 tokens): a dictionary
    made the files larger and slower to write and read (docs/benchmarks.md, session 14). Float columns go without one
    (byte-stream-split under zstd), every other column keeps Parquet's dictionary; the values read back unchanged."""
    tensors = batch(3)
    rows, width = tensors["response_mask"].shape
    target = tmp_path / ("one.parquet" if one_file else "dump")
    with rd.DumpWriter(target, compression=compression) as dump:
        dump.write_step(
            0, **tensors, token_ids=torch.zeros(rows, width, dtype=torch.long), extra={"reward": [0.5] * rows}
        )
    path = target if one_file else target / "step=0" / "rank-0.parquet"
    found = encodings(path)
    for name in ("rollout_log_probs.list.element", "old_log_probs.list.element"):
        assert float_encoding in found[name] and "RLE_DICTIONARY" not in found[name], (name, found[name])
    for name in ("step", "sample_id", "response_mask.list.element", "token_ids.list.element"):
        assert "RLE_DICTIONARY" in found[name], (name, found[name])
    assert "RLE_DICTIONARY" not in found["reward"]  # a float, if one per row
    table = pq.read_table(path)
    lengths = tensors["lengths"].tolist()
    for column in ("rollout_log_probs", "old_log_probs"):
        written = [tensors[column][row, :length].float().tolist() for row, length in enumerate(lengths)]
        assert table.column(column).to_pylist() == written
