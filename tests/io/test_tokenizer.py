"""``--tokenizer``: token ids shown as text in the worst tokens, ``inspect`` and the report, from a tokenizer built and
trained here with the ``tokenizers`` library itself (a byte-level BPE and a WordLevel), written as tokenizer.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollout_diag.cli import app
from rollout_diag.errors import ConfigError
from tests.helpers.cli import runner

tokenizers = pytest.importorskip("tokenizers", reason="the optional tokenizer extra is not installed")

import rollout_diag as rd  # noqa: E402
from rollout_diag.drivers.dump import Dump  # noqa: E402
from rollout_diag.io.tokenizer import load_tokenizer  # noqa: E402

WORDS = ["hello world café", "hello there world", "a tool said hello"]


@pytest.fixture(scope="module")
def bpe(tmp_path_factory) -> tuple[Path, object]:
    """A byte-level BPE (GPT-2's alphabet, as Llama 3 and Qwen use) trained on WORDS, with one special token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(WORDS * 20, trainer)
    path = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    tokenizer.save(str(path))
    return path, tokenizer


def test_byte_level_bpe_ids_become_their_text(bpe):
    path, tokenizer = bpe
    decoder = load_tokenizer(path)
    ids = tokenizer.encode("hello café<|im_end|>").ids
    assert [decoder.text(token_id) for token_id in ids] == ["hello", " café", "<|im_end|>"]
    # "é" is two bytes (c3 a9): the token of its first byte alone is no valid UTF-8, written as an escape
    assert decoder.text(tokenizer.token_to_id("Ã")) == "\\xc3"
    assert decoder.text(tokenizer.token_to_id("Ġ")) == " "  # byte 0x20 in GPT-2's alphabet
    assert decoder.text(10**6) is None  # outside the vocabulary: no text (tables show the id)


def test_word_level_and_byte_fallback(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2, "<0x0A>": 3}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    decoder = load_tokenizer(tmp_path)  # a model directory holding tokenizer.json
    assert decoder.texts([1, 2, 3, 0]) == ["hello", "world", "\n", "[UNK]"]  # <0x0A>: SentencePiece's byte fallback


def test_sentencepiece_word_boundary_is_a_space(tmp_path):
    from tokenizers import Tokenizer, decoders, models, normalizers

    # Llama 2's tokenizer.json: "▁" marks a word start, its decoder a Replace("▁", " ") then ByteFallback and Fuse
    tokenizer = Tokenizer(models.WordLevel({"<unk>": 0, "▁hello": 1, "lo": 2}, unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Replace(" ", "▁")
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    assert load_tokenizer(tmp_path / "tokenizer.json").texts([1, 2]) == [" hello", "lo"]


def test_a_name_is_looked_up_in_the_local_cache_only(bpe, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    model = tmp_path / "hf" / "hub" / "models--org--tiny"
    for snapshot in ("old", "main-sha"):
        (model / "snapshots" / snapshot).mkdir(parents=True)
    (model / "snapshots" / "main-sha" / "tokenizer.json").write_bytes(bpe[0].read_bytes())
    (model / "refs").mkdir()
    (model / "refs" / "main").write_text("main-sha\n")
    assert load_tokenizer("org/tiny").source == str(model / "snapshots" / "main-sha" / "tokenizer.json")
    with pytest.raises(ConfigError, match=r"no tokenizer.json of the model 'org/absent' in the local Hugging Face"):
        load_tokenizer("org/absent")


def sequence_dump(path: Path, tokenizer, with_text: bool = False) -> Path:
    """Two rows of ids from ``tokenizer``; the largest |δ| on the token " café" of row 1."""
    first = tokenizer.encode("hello world").ids
    second = tokenizer.encode("hello café<|im_end|>").ids
    rows = []
    for index, ids in enumerate((first, second)):
        trainer = [-0.5] * len(ids)
        rollout = [-0.5] * len(ids)
        rollout[0] = -0.55
        if index == 1:
            rollout[1] = -3.0  # " café": δ = 2.5
        row = {
            "step": 0,
            "sample_id": f"s{index}",
            "rollout_log_probs": rollout,
            "old_log_probs": trainer,
            "response_mask": [1] * len(ids),
            "token_ids": ids,
        }
        if with_text:
            row["tokens"] = [f"own{i}" for i in range(len(ids))]
        rows.append(row)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_cli_worst_tokens_inspect_and_report_show_text_and_id(bpe, tmp_path):
    path, tokenizer = bpe
    dump = sequence_dump(tmp_path / "run.parquet", tokenizer)
    cafe = tokenizer.encode("hello café").ids[1]  # byte-level BPE writes it "ĠcafÃ©"
    done = runner.invoke(app, ["analyze", str(dump), "--tokenizer", str(path)], env={"COLUMNS": "200"})
    assert done.exit_code == 0, done.output
    assert f" café #{cafe}" in done.stdout
    without = runner.invoke(app, ["analyze", str(dump)], env={"COLUMNS": "200"})
    assert f"#{cafe}" in without.stdout and "café" not in without.stdout  # ids only, as before
    document = json.loads(runner.invoke(app, ["analyze", str(dump), "--tokenizer", str(path), "-f", "json"]).stdout)
    assert document["worst_tokens"][0]["token"] == " café" and document["worst_tokens"][0]["token_id"] == cafe
    listed = runner.invoke(app, ["inspect", str(dump), "-s", "s1", "--tokenizer", str(path), "-f", "json"])
    assert json.loads(listed.stdout)["token"] == ["hello", " café", "<|im_end|>"]
    table = runner.invoke(app, ["inspect", str(dump), "-s", "s1", "--tokenizer", str(path)], env={"COLUMNS": "200"})
    assert "<|im_end|>" in table.stdout and f"#{cafe}" in table.stdout
    report = tmp_path / "r.html"
    done = runner.invoke(app, ["report", str(dump), "--tokenizer", str(path), "-o", str(report)])
    assert done.exit_code == 0, done.output
    assert "café" in report.read_text(encoding="utf-8")


def test_the_dumps_own_text_wins_and_the_library_takes_it_from_the_dump(bpe, tmp_path):
    path, tokenizer = bpe
    dump = sequence_dump(tmp_path / "own.parquet", tokenizer, with_text=True)
    result = rd.analyze(Dump([str(dump)], tokenizer=path, device="cpu"))
    assert result.worst_tokens[0].token == "own1"  # the dump's tokens column, not the tokenizer's " café"
    plain = sequence_dump(tmp_path / "ids.parquet", tokenizer)
    assert rd.analyze(Dump([str(plain)], tokenizer=path, device="cpu")).worst_tokens[0].token == " café"
    # a call that shows no token takes the Dump all the same
    assert rd.compare_presets(Dump([str(plain)], tokenizer=path, device="cpu"), ["disabled"]).presets


def test_errors_are_one_line(bpe, tmp_path, monkeypatch):
    dump = sequence_dump(tmp_path / "run.parquet", bpe[1])
    missing = runner.invoke(app, ["analyze", str(dump), "--tokenizer", str(tmp_path / "none" / "tokenizer.json")])
    assert missing.exit_code == 1 and "--tokenizer" in missing.output and "Traceback" not in missing.output
    assert len(missing.output.strip().splitlines()) == 1
    broken = tmp_path / "broken.json"
    broken.write_text("{}")
    done = runner.invoke(app, ["inspect", str(dump), "--tokenizer", str(broken)])
    assert done.exit_code == 1 and "not a tokenizer.json" in done.output and "Traceback" not in done.output
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(ConfigError, match="needs the tokenizers package"):
        load_tokenizer(bpe[0])
    done = runner.invoke(app, ["analyze", str(dump), "--tokenizer", str(bpe[0])])
    assert done.exit_code == 1 and "rollout-diag[tokenizer]" in done.output and "Traceback" not in done.output
