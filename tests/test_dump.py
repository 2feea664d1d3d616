"""The Dump entry object: the options given once, read by every library call; errors when they are opened."""

from __future__ import annotations

import pytest
from dumps import random_rows, write_sequence_dump
from test_imports import loaded_after

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
