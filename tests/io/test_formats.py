"""Trainer formats (io/formats): every importer reads one known dataset to the same per-step metrics as its
Parquet dump, `convert` round-trips, pickles are read without running their code, bad input is named.

The fixtures (tests/helpers/formats.py) lay the dataset out as each framework's writer does; the
reference is the same rows written by tests/helpers/dumps.py as Parquet, analysed by the Parquet reader.
"""

from __future__ import annotations

import json
import math
import pickle
import re
from collections import Counter
from pathlib import Path

import helpers.formats as ff
import jsonschema
import pyarrow.parquet as pq
import pytest
import torch
from helpers.cli import error_line, invoke
from helpers.dumps import encodings
from helpers.jsonl import file_lines, nemo_rl_line, prime_rl_line, read_rows

import rollout_diag as rd
from rollout_diag.io.convert import convert
from rollout_diag.io.formats import FORMAT_NAMES, DumpInputs

FORMATS = list(ff.WRITERS)
SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "schemas" / "result.schema.json").read_text())


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return ff.dataset()


@pytest.fixture(scope="module")
def reference(rows, tmp_path_factory) -> rd.AnalysisResult:
    path = ff.write_parquet(tmp_path_factory.mktemp("reference") / "dataset.parquet", rows)
    return rd.analyze(str(path), device="cpu")


@pytest.fixture(scope="module")
def dumps(rows, tmp_path_factory) -> dict[str, Path]:
    """Each format's dump of the dataset: the directory a user would point at."""
    root = tmp_path_factory.mktemp("formats")
    written = {}
    for name, writer in ff.WRITERS.items():
        writer(root / name, rows)
        written[name] = root / name
    return written


def assert_same_steps(actual: rd.AnalysisResult, expected: rd.AnalysisResult) -> None:
    """Same steps, rows, tokens and every metric (float64 sums in another chunk order: rtol 1e-12)."""
    assert [(s.step, s.rows, s.tokens, s.empty_rows) for s in actual.steps] == [
        (s.step, s.rows, s.tokens, s.empty_rows) for s in expected.steps
    ]
    for mine, theirs in zip([*actual.steps, actual.run], [*expected.steps, expected.run], strict=True):
        assert mine.metrics.keys() == theirs.metrics.keys()
        for name, value in theirs.metrics.items():
            got = mine.metrics[name]
            if math.isnan(value):
                assert math.isnan(got), (mine.step, name)
            else:
                assert got == pytest.approx(value, rel=1e-12, abs=1e-15), (mine.step, name)


# ------------------------------------------------------------------------------ same numbers
@pytest.mark.parametrize("name", FORMATS)
def test_each_importer_gives_the_parquet_metrics(name, dumps, reference):
    result = rd.analyze(str(dumps[name]), device="cpu", chunk_tokens=17)  # chunks that split steps
    assert result.format == name
    assert_same_steps(result, reference)
    jsonschema.validate(json.loads(json.dumps(result.to_json(), allow_nan=False)), SCHEMA)


def test_workers_read_an_importer_format_to_the_same_numbers(dumps, reference):
    result = rd.analyze(str(dumps["prime-rl"]), device="cpu", workers=2)
    assert result.format == "prime-rl"
    assert_same_steps(result, reference)


def assert_canonical_encodings(path: Path) -> None:
    """What convert writes, as DumpWriter does (io/columns.parquet_options): logprobs byte-stream-split under zstd,
    without a dictionary; the sample ids keep theirs."""
    found = encodings(path)
    for name in ("rollout_log_probs.list.element", "old_log_probs.list.element"):
        assert "BYTE_STREAM_SPLIT" in found[name] and "RLE_DICTIONARY" not in found[name], (name, found[name])
    assert "RLE_DICTIONARY" in found["sample_id"]


@pytest.mark.parametrize("name", FORMATS)
def test_convert_round_trip(name, dumps, reference, tmp_path):
    converted = convert(str(dumps[name]), tmp_path / "out.parquet")
    assert converted.format == name and converted.rows == 15 and converted.steps == list(ff.STEPS)
    assert pq.ParquetFile(tmp_path / "out.parquet").metadata.num_row_groups == len(ff.STEPS)  # one per step
    assert_canonical_encodings(tmp_path / "out.parquet")
    source = rd.analyze(str(dumps[name]), device="cpu")
    assert_same_steps(rd.analyze(str(tmp_path / "out.parquet"), device="cpu"), source)
    assert_same_steps(source, reference)


def test_convert_to_a_hive_directory(dumps, reference, tmp_path):
    result = invoke("convert", dumps["nemo-rl"], "-o", tmp_path / "hive", "--partition", "step")
    assert result.exit_code == 0, result.output
    assert "15 rows, 3 step(s) in 3 file(s), from 3 nemo-rl file(s)" in result.stdout
    assert sorted(p.parent.name for p in (tmp_path / "hive").rglob("*.parquet")) == ["step=1", "step=2", "step=3"]
    assert_canonical_encodings(next((tmp_path / "hive").rglob("*.parquet")))
    converted = rd.analyze(str(tmp_path / "hive"), device="cpu")
    assert converted.columns["step"] == "step (partition)"
    assert_same_steps(converted, reference)
    again = invoke("convert", dumps["nemo-rl"], "-o", tmp_path / "hive", "--partition", "step")
    assert "already exists" in error_line(again)


def test_convert_keeps_invalid_values_so_analyze_skips_the_same_rows(rows, tmp_path):
    bad = [dict(row) for row in rows]
    first_trained = bad[0]["mask"].index(1)
    bad[0]["rollout"] = [*bad[0]["rollout"]]
    bad[0]["rollout"][first_trained] = math.nan  # written as null by prime-rl
    ff.write_prime_rl(tmp_path / "p", bad)
    source = rd.analyze(str(tmp_path / "p"), device="cpu")
    convert(str(tmp_path / "p"), tmp_path / "out.parquet")
    converted = rd.analyze(str(tmp_path / "out.parquet"), device="cpu")
    assert source.skipped_rows == converted.skipped_rows == 1
    assert_same_steps(converted, source)


# ------------------------------------------------------------------------------ detection
def test_detected_format_is_in_the_json_and_the_header(dumps):
    document = json.loads(invoke("analyze", dumps["slime"], "--device", "cpu", "--format", "json").stdout)
    assert document["format"] == "slime"
    assert len(document["inputs"]) == 3 and all("/train_data/" in path for path in document["inputs"])
    assert "3 slime file(s), sequence layout" in invoke("analyze", dumps["slime"], "--device", "cpu").stdout


def test_input_format_forces_a_format_where_names_do_not_tell(dumps, reference, tmp_path):
    renamed = tmp_path / "export.json"  # neither the name nor the extension says prime-rl
    renamed.write_text("".join(p.read_text() for p in sorted(dumps["prime-rl"].rglob("rank_*.jsonl"))))
    result = rd.analyze(DumpInputs([renamed], "prime-rl"), device="cpu")
    assert result.format == "prime-rl" and result.run.rows == reference.run.rows
    line = error_line(invoke("analyze", renamed, "--device", "cpu"))  # named as what it is, with the way out
    assert "a JSON-lines file whose name says no trainer format, not Parquet" in line and "--input-format" in line


def test_unknown_format_name_and_mixed_formats_are_one_line_errors(dumps):
    assert "unknown format" in error_line(invoke("analyze", dumps["skyrl"], "--input-format", "orca"))
    line = error_line(invoke("analyze", dumps["skyrl"], dumps["verl"], "--device", "cpu"))
    assert "inputs mix formats" in line and "skyrl" in line and "verl" in line
    assert set(FORMAT_NAMES) == {"parquet", *FORMATS}


def test_steps_sort_by_number_not_by_name(rows, tmp_path):
    many = [{**row, "step": row["step"] * 5} for row in rows]  # steps 5, 10, 15: step_10 sorts before step_5
    ff.write_nemo_rl(tmp_path / "n", many)
    result = rd.analyze(str(tmp_path / "n"), device="cpu")
    assert [s.step for s in result.steps] == [5, 10, 15]
    assert [Path(p).name for p in result.inputs] == [f"train_data_step{s}.jsonl" for s in (5, 10, 15)]


# ------------------------------------------------------------------------------ prime-rl specifics
def test_prime_rl_reads_only_stable_steps_and_says_which_were_left_out(rows, tmp_path):
    ff.write_prime_rl(tmp_path / "p", rows)
    (tmp_path / "p" / "token_exports" / "step_3" / "STABLE").unlink()
    result = rd.analyze(str(tmp_path / "p"), device="cpu")
    assert [s.step for s in result.steps] == [1, 2]
    assert any("without a STABLE marker" in w and "step_3" in w for w in result.warnings)


def test_prime_rl_bad_lines_are_skipped_by_line_and_strict_fails_on_the_first(rows, tmp_path):
    exports = ff.write_prime_rl(tmp_path / "p", rows)
    rank_file = exports / "step_2" / "rank_0.jsonl"
    lines = rank_file.read_text().splitlines()
    record = json.loads(lines[1])
    trained = record["loss_mask"].index(True)
    record["trainer_logprobs"][trained] = None  # what the exporter writes for a non-finite value
    lines[1] = json.dumps(record)
    lines.insert(0, '{"step": 2, "inference_logprobs": [')  # a truncated write
    rank_file.write_text("\n".join(lines) + "\n")
    result = rd.analyze(str(tmp_path / "p"), device="cpu")
    assert result.skipped_rows == 2
    described = [s.describe() for s in result.skipped]
    assert described[0].startswith(f"{rank_file}, row 0: not JSON")
    assert described[1] == f"{rank_file}, row 2, column 'old_log_probs': NaN (or null) logprob at position {trained}"
    assert result.steps[1].rows == 5 - 1
    line = error_line(invoke("analyze", tmp_path / "p", "--device", "cpu", "--strict"))
    assert f"{rank_file}: row 0: not JSON" in line


def test_prime_rl_weight_streams_narrow_the_trained_tokens(rows, tmp_path):
    exports = ff.write_prime_rl(tmp_path / "p", rows[:1])
    rank_file = exports / "step_1" / "rank_0.jsonl"
    record = json.loads(rank_file.read_text())
    weights = [0.0 if i == record["loss_mask"].index(True) else 1.0 for i in range(len(record["loss_mask"]))]
    record["rl_weights"] = weights  # a ce token among the trained ones: it has no sampling logprob
    rank_file.write_text(json.dumps(record) + "\n")
    result = rd.analyze(str(tmp_path / "p"), device="cpu")
    assert result.run.tokens == sum(rows[0]["mask"]) - 1


def test_prime_rl_advantages_and_env_names_reach_the_prime_rl_dialect(rows, tmp_path):
    """Each record's advantages and env_name ride along per row: --dialect prime-rl gives the DPPO values and
    mismatch_kl/<env> of tests/helpers/reference_dialects.py on the same rows; a row whose trained tokens carry
    advantages of both signs has no advantage (null) and is no sample of the DPPO values."""
    import numpy as np
    from helpers.reference_dialects import prime_rl as reference

    finite = [row for row in rows if all(math.isfinite(v) for v in (*row["rollout"], *row["trainer"]))]
    exports = ff.write_prime_rl(tmp_path / "p", finite, ranks=1)
    expected_rows: dict[int, list] = {}
    for step_dir in sorted(exports.glob("step_*")):
        path = step_dir / "rank_0.jsonl"
        records = [json.loads(line) for line in path.read_text().splitlines()]
        for index, record in enumerate(records):
            length = len(record["loss_mask"])
            advantage = [1.5, -0.5, 0.0, None][index % 4]
            if advantage is None:  # mixed signs over the trained tokens
                record["advantages"] = [1.0 if position % 2 else -1.0 for position in range(length)]
                trained = [p for p, keep in enumerate(record["loss_mask"]) if keep]
                mixed = len({record["advantages"][p] for p in trained}) > 1
                advantage = None if mixed else (record["advantages"][trained[0]] if trained else 0.0)
            else:
                record["advantages"] = [advantage] * length
            record["env_name"] = ["math", "code"][index % 2]
            row = finite[[r["sample_id"] for r in finite].index(_sample_of(finite, record))]
            expected_rows.setdefault(record["step"], []).append((row, advantage, record["env_name"]))
        path.write_text("".join(json.dumps(record) + "\n" for record in records))
    result = rd.analyze(str(exports), device="cpu", dialect="prime-rl")
    for step in result.steps:
        entries = expected_rows[step.step]
        as_reference = [
            (np.asarray(r["trainer"], np.float64), np.asarray(r["rollout"], np.float64), np.asarray(r["mask"]))
            for r, _, _ in entries
        ]
        expected = reference(as_reference, [a for _, a, _ in entries], [e for _, _, e in entries])
        actual = step.dialects["prime-rl"]
        assert sorted(actual) == sorted(expected)
        assert "is_masked/mean" in actual and "mismatch_kl/math/mean" in actual
        for name, value in expected.items():
            if math.isnan(value):
                assert math.isnan(actual[name]), name
            else:
                assert actual[name] == pytest.approx(value, rel=1e-9, abs=1e-12), name


def _sample_of(rows: list[dict], record: dict) -> str:
    """The dataset row a prime-rl record was written from (its response token ids follow the prompt's)."""
    response = record["token_ids"][ff.PROMPT_LENGTH :]
    (found,) = [row["sample_id"] for row in rows if row["step"] == record["step"] and row["token_ids"] == response]
    return found


# ------------------------------------------------------------------------------ NeMo-RL specifics
def test_nemo_rl_bare_nan_and_infinity_are_read_and_skip_their_rows(rows, tmp_path):
    ff.write_nemo_rl(tmp_path / "n", rows)
    path = tmp_path / "n" / "train_data_step1.jsonl"
    lines = path.read_text().splitlines()
    for index, value in ((0, math.nan), (3, -math.inf)):
        record = json.loads(lines[index])
        trained = record["token_loss_mask"][0].index(1)
        record["prev_logprobs"][0][trained] = value
        lines[index] = json.dumps(record)  # bare NaN / -Infinity, as NeMo-RL writes them
    assert "NaN" in lines[0] and "-Infinity" in lines[3]
    path.write_text("\n".join(lines) + "\n")
    result = rd.analyze(str(tmp_path / "n"), device="cpu")
    assert [(s.row, s.column) for s in result.skipped] == [(0, "old_log_probs"), (3, "old_log_probs")]
    assert result.steps[0].rows == 3


def test_nemo_rl_filtered_sample_has_no_trained_token_and_missing_field_is_named(rows, tmp_path):
    ff.write_nemo_rl(tmp_path / "n", rows)
    path = tmp_path / "n" / "train_data_step2.jsonl"
    lines = path.read_text().splitlines()
    filtered = json.loads(lines[0])
    filtered["sample_loss_mask"] = [0.0]  # token mask 1s stay, as NeMo-RL leaves them
    lines[0] = json.dumps(filtered)
    broken = json.loads(lines[1])
    del broken["prev_logprobs"]
    lines[1] = json.dumps(broken)
    path.write_text("\n".join(lines) + "\n")
    result = rd.analyze(str(tmp_path / "n"), device="cpu")
    step = result.steps[1]
    assert (step.rows, step.empty_rows) == (4, 1)
    assert step.tokens == sum(sum(r["mask"]) for r in rows if r["step"] == 2) - sum(rows[5]["mask"]) - sum(
        rows[6]["mask"]
    )
    assert [s.describe() for s in result.skipped] == [f"{path}, row 1, column 'prev_logprobs': missing"]


# ------------------------------------------------------------------------------ pickles and torch files
class _TouchesAFile:
    """Unpickling this opens (creates) a file: what a malicious pickle would do, harmlessly."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def _skyrl_pickle(path: Path, rows: list[dict], metadata_extra: object) -> Path:
    state = ff.skyrl_state(rows[:3])
    state["metadata"]["extra"] = metadata_extra
    with ff.stand_in_module(
        "skyrl.backends.skyrl_train.training_batch",
        TrainingInputBatch=ff._TrainingInputBatch,
        _rebuild_tensor_batch=ff._rebuild_tensor_batch,
    ):
        batch = ff._TrainingInputBatch()
        batch.state = state
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(pickle.dumps(batch))
    return path


def test_a_pickle_that_would_run_code_is_refused_and_never_runs(rows, tmp_path):
    marker = tmp_path / "touched"
    path = _skyrl_pickle(tmp_path / "dumped_data" / "global_step_1_training_input.pkl", rows, _TouchesAFile(marker))
    line = error_line(invoke("analyze", tmp_path / "dumped_data", "--device", "cpu"))
    assert re.search(r"refused to unpickle [\w.]*open: not on the allowlist", line) and "--trust-pickle" in line
    assert not marker.exists()
    with pytest.raises(rd.InputError, match="refused to unpickle"):
        rd.analyze(DumpInputs([path], "skyrl"), device="cpu")
    assert not marker.exists()


def test_trust_pickle_lifts_the_allowlist(rows, tmp_path):
    path = _skyrl_pickle(tmp_path / "global_step_4_training_input.pkl", rows, Counter(a=1))
    assert "collections.Counter" in error_line(invoke("analyze", path, "--device", "cpu"))
    result = invoke("analyze", path, "--device", "cpu", "--trust-pickle", "--format", "json")
    document = json.loads(result.stdout)
    assert (document["format"], document["run"]["rows"], document["steps"][0]["step"]) == ("skyrl", 3, 4)


def test_skyrl_padding_rows_are_dropped_and_prompt_columns_never_read(rows, tmp_path):
    path = _skyrl_pickle(tmp_path / "global_step_2_training_input.pkl", rows, None)
    result = rd.analyze(str(path), device="cpu")
    assert result.run.rows == 3  # the pad_size copy of row 0 is not a sample
    assert result.run.tokens == sum(sum(row["mask"]) for row in rows[:3])


def test_a_verl_batch_that_is_not_a_consolidated_tensordict_is_refused(rows, tmp_path):
    with ff.stand_in_module("verl.protocol", DataProto=ff._DataProto):
        numpy_method = ff._DataProto(({"old_log_probs": None}, {}, {}))  # VERL_DATAPROTO_SERIALIZATION_METHOD=numpy
        (tmp_path / "step_1.pkl").write_bytes(pickle.dumps(numpy_method))
    line = error_line(invoke("analyze", tmp_path / "step_1.pkl", "--device", "cpu"))
    assert "not torch.save bytes" in line


def test_a_slime_file_needing_more_than_tensors_is_refused(tmp_path):
    from fractions import Fraction

    path = tmp_path / "train_data" / "0.pt"
    path.parent.mkdir()
    torch.save({"format_version": 2, "rollout_id": 0, "samples": [{"reward": Fraction(1, 3)}]}, path)
    line = error_line(invoke("analyze", tmp_path, "--device", "cpu"))
    assert str(path) in line and "more than tensors, lists and dicts" in line and "fractions.Fraction" in line


def test_slime_sample_without_rollout_logprobs_is_skipped_and_named(rows, tmp_path):
    ff.write_slime(tmp_path / "s", rows)
    path = tmp_path / "s" / "train_data" / "1.pt"
    payload = torch.load(path, weights_only=True)
    payload["samples"][2]["rollout_log_probs"] = None
    torch.save(payload, path)
    result = rd.analyze(str(tmp_path / "s"), device="cpu")
    assert [s.describe() for s in result.skipped] == [
        f"{path}, row 2, column 'rollout_log_probs': missing (not carried into training)"
    ]


# ------------------------------------------------------------------ JSON lines: the fast path equals Python's json
# prime-rl and NeMo-RL files are read in blocks by the compiled scanner (io/jsonl/), and
# line by line with Python's json where the scanner cannot vouch for a line. The reference is every line through
# Python's json (open_file(..., fast=False)); both must give the same batches, row for row and bit for bit.
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from rollout_diag.io.formats import nemo_rl, prime_rl  # noqa: E402

_FAST_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize(
    ("module", "line", "name"),
    [(prime_rl, prime_rl_line, "rank_0.jsonl"), (nemo_rl, nemo_rl_line, "train_data_step4.jsonl")],
    ids=["prime_rl", "nemo_rl"],
)
@_FAST_SETTINGS
@given(data=st.data(), batch_size=st.integers(1, 30), end=st.booleans())
def test_fast_path_equals_python_json(module, line, name, data, batch_size, end, tmp_path):
    lines = data.draw(file_lines(line, max_size=25), label="lines")
    path = tmp_path / name
    path.write_text("\n".join(lines) + ("\n" if end and lines else ""))
    assert read_rows(module, path, True, batch_size) == read_rows(module, path, False, batch_size)


@pytest.mark.parametrize("name", ["prime-rl", "nemo-rl"])
def test_well_formed_lines_take_the_fast_path(name, rows, tmp_path, monkeypatch):
    """The fixtures' files (as the trainers write them, no non-finite value) never reach Python's json."""
    module = {"prime-rl": prime_rl, "nemo-rl": nemo_rl}[name]
    finite = [row for row in rows if all(math.isfinite(v) for v in (*row["rollout"], *row["trainer"]))]
    ff.WRITERS[name](tmp_path / name, finite)
    calls = []
    monkeypatch.setattr(module, "_row", lambda *args: calls.append(args) or pytest.fail("line went to json"))
    files = sorted((tmp_path / name).rglob("*.jsonl"))
    assert files
    for path in files:
        opened = module.open_file(str(path))
        assert sum(batch.num_rows for batch in opened.iter_batches()) == opened.metadata.num_rows
    assert not calls


def test_fast_path_raises_on_bytes_that_are_not_utf8_as_text_reading_does(tmp_path):
    path = tmp_path / "rank_0.jsonl"
    path.write_bytes(b'{"step":1,"env_name":"\xff","loss_mask":[],"inference_logprobs":[],"trainer_logprobs":[]}\n')
    for fast in (True, False):
        with pytest.raises(UnicodeDecodeError):
            list(prime_rl.open_file(str(path), fast=fast).iter_batches())


def test_carriage_returns_split_lines_as_text_reading_does(tmp_path):
    record = json.dumps({"step": 1, "loss_mask": [True], "inference_logprobs": [-1.0], "trainer_logprobs": [-1.5]})
    path = tmp_path / "rank_0.jsonl"
    path.write_bytes((record + "\r\n" + record + "\r" + record + "\n").encode())
    assert read_rows(prime_rl, path, True, 4) == read_rows(prime_rl, path, False, 4)
