"""The Dump entry object: the options given once, read by every library call; errors when they are opened."""

from __future__ import annotations

import pytest
from helpers.dumps import random_rows, write_sequence_dump
from helpers.imports import loaded_after

import rollout_diag as rd


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    rows = random_rows(3, steps=range(3), rows_per_step=5, max_length=30)
    return str(write_sequence_dump(tmp_path_factory.mktemp("dump") / "dump.parquet", rows, row_group_size=4))


def test_a_dump_gives_what_the_options_give(path):
    dump = rd.Dump([path], device="cpu", chunk_tokens=37)
    by_dump = rd.analyze(dump, top_k=3)
    by_options = rd.analyze(path, device="cpu", chunk_tokens=37, top_k=3)
    assert by_dump.to_json() == by_options.to_json()
    swept = rd.threshold_sweep(dump)  # the same Dump again: each call opens its own reader
    assert swept.run == rd.threshold_sweep(path, device="cpu", chunk_tokens=37).run
    compared = rd.compare_presets(dump, ["decoupled_k3_rs"])
    expected = rd.compare_presets(path, ["decoupled_k3_rs"], device="cpu", chunk_tokens=37)
    assert compared.presets[0].run.metrics == expected.presets[0].run.metrics


def test_an_option_given_twice_must_agree(path):
    dump = rd.Dump(path, device="cpu", strict=True)
    assert rd.analyze(dump, strict=True).run.rows == 15  # the same value twice is fine
    with pytest.raises(rd.ConfigError, match=r"strict=False disagrees with the Dump's strict=True"):
        rd.analyze(dump, strict=False)


def test_opened_fails_at_once_without_torch(tmp_path):
    with pytest.raises(rd.InputError, match="no such file"):
        rd.Dump([str(tmp_path / "missing.parquet")]).opened()
    code = (
        "import rollout_diag as rd\n"
        f"try:\n    rd.Dump([{str(tmp_path / 'missing.parquet')!r}]).opened()\nexcept rd.InputError:\n    pass"
    )
    assert "torch" not in loaded_after(code)


def test_an_opened_reader_serves_one_call(path):
    dump = rd.Dump([path], device="cpu").opened()
    first = rd.analyze(dump)
    second = rd.analyze(dump)  # the reader opened ahead was used up: a new one is opened
    assert first.run.metrics == second.run.metrics


def test_a_dump_without_a_chunk_size_reads_each_calls_own(path, monkeypatch):
    from rollout_diag.drivers.dump import DEFAULT_CHUNK_TOKENS, PRESET_CHUNK_TOKENS
    from rollout_diag.io.reader import DumpReader

    sizes = []
    chunks = DumpReader.chunks

    def recording(reader, *args, **kwargs):
        sizes.append(reader.chunk_tokens)
        return chunks(reader, *args, **kwargs)

    monkeypatch.setattr(DumpReader, "chunks", recording)
    dump = rd.Dump([path], device="cpu", workers=1)
    rd.analyze(dump)
    rd.compare_presets(dump, ["decoupled_k3_rs"])
    rd.compare_presets(dump.opened(), ["decoupled_k3_rs"])  # a reader opened ahead takes the call's size too
    rd.analyze(dump, chunk_tokens=37)
    rd.analyze(rd.Dump([path], device="cpu", workers=1, chunk_tokens=37))
    assert sizes == [DEFAULT_CHUNK_TOKENS, PRESET_CHUNK_TOKENS, PRESET_CHUNK_TOKENS, 37, 37]


@pytest.mark.parametrize("size", [0, -5, 2.5, True])
def test_a_bad_chunk_size_given_beside_a_dump_is_a_config_error(path, size):
    with pytest.raises(rd.ConfigError, match=r"chunk_tokens=.*: must be a positive whole number of tokens"):
        rd.compare_presets(rd.Dump([path], device="cpu"), ["decoupled_k3_rs"], chunk_tokens=size)


def test_every_call_that_reads_a_dump_takes_one(path, tmp_path):
    dump = rd.Dump([path], device="cpu", chunk_tokens=37)
    gates = [rd.Gate("rollout_corr/k3_kl", "max", 10.0)]
    assert rd.check_run(dump, gates).to_json() == rd.check_run(path, gates, device="cpu", chunk_tokens=37).to_json()
    by_dumps = rd.diff_runs(dump, dump, replicates=100)
    assert by_dumps.to_json() == rd.diff_runs(path, path, device="cpu", chunk_tokens=37, replicates=100).to_json()
    one = rd.diff_runs(dump, steps_a=(0, 0), steps_b=(1, 2), replicates=100, device="cpu")  # agreeing: fine
    split = rd.diff_runs(path, steps_a=(0, 0), steps_b=(1, 2), replicates=100, device="cpu", chunk_tokens=37)
    assert one.to_json() == split.to_json()
    assert rd.inspect_row(dump, step=1) == rd.inspect_row(path, step=1, device="cpu", chunk_tokens=37)
    written = rd.export_decisions(dump, tmp_path / "decisions.parquet", ["decoupled_k3_rs"])
    assert written == rd.export_decisions(path, tmp_path / "again.parquet", ["decoupled_k3_rs"], device="cpu")


def test_diff_runs_reads_each_dump_with_its_own_options(path):
    with pytest.raises(rd.ConfigError, match=r"device='cuda' disagrees with the Dump's device='cpu'"):
        rd.diff_runs(rd.Dump(path, device="cpu"), path, device="cuda")
    with pytest.raises(rd.ColumnError):  # B's own column override: its reader cannot find the column
        rd.diff_runs(rd.Dump(path, device="cpu"), rd.Dump(path, device="cpu", columns={"rollout": "missing"}))


@pytest.mark.parametrize(
    ("call", "option", "value"),
    [
        (lambda dump: rd.threshold_sweep(dump), "workers", 4),
        (lambda dump: rd.check_run(dump, [rd.Gate("rollout_corr/k3_kl", "max", 1.0)]), "backend", "ray"),
        (lambda dump: rd.diff_runs(dump, dump), "workers", 2),
        (lambda dump: rd.inspect_row(dump), "strict", True),
        (lambda dump: rd.export_decisions(dump, "unwritten.parquet"), "workers", 3),
    ],
)
def test_an_option_a_call_cannot_honour_is_refused(path, call, option, value):
    with pytest.raises(rd.ConfigError, match=rf"^{option}={value!r}: \w+ cannot honour it") as refused:
        call(rd.Dump(path, device="cpu", **{option: value}))
    assert f"leave the Dump's {option} at" in str(refused.value)


def test_one_process_is_what_a_one_process_call_honours(path):
    swept = rd.threshold_sweep(rd.Dump(path, device="cpu", workers=1))
    assert swept.run == rd.threshold_sweep(rd.Dump(path, device="cpu", workers="auto")).run


def test_watch_takes_a_dump_of_its_directory(tmp_path):
    from rollout_diag.drivers.watch import Watcher

    directory = tmp_path / "run"
    watcher = Watcher(rd.Dump(directory, columns={"rollout": "vllm"}, device="cpu", strict=True, chunk_tokens=99))
    assert (watcher.directory, watcher.columns, watcher.strict, watcher.chunk_tokens) == (
        directory,
        {"rollout": "vllm"},
        True,
        99,
    )
    updates = list(rd.watch(rd.Dump(directory, device="cpu"), interval=0.01, max_polls=1, sleep=lambda _: None))
    assert updates[-1].exit_code == 0
    for options, refused in [({"workers": 3}, r"workers=3: watch cannot honour it"), ({"engine": "torch"}, "engine")]:
        with pytest.raises(rd.ConfigError, match=refused):
            Watcher(rd.Dump(directory, **options))
    with pytest.raises(rd.ConfigError, match="strict=False disagrees"):
        Watcher(rd.Dump(directory, strict=True), strict=False)
    with pytest.raises(rd.ConfigError, match="one dump directory"):
        Watcher(rd.Dump([directory, tmp_path / "other"]))
