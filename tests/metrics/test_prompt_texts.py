"""``PromptAccumulator(keep_texts=True)`` (``runs``): each prompt's id text, the same set for any chunking and merge
order, capped by distinct sampling on the keys."""

from __future__ import annotations

import pytest

from rollout_diag.io.prompts import text_key
from rollout_diag.io.reader import DumpReader
from rollout_diag.metrics import prompts as prompt_metrics
from rollout_diag.metrics.prompts import PromptAccumulator
from tests.helpers.prompts import matched_run_rows, write_prompt_dump


def _texts(path, chunk_tokens: int, parts: int) -> tuple[dict[int, str], int]:
    accumulators = [PromptAccumulator(keep_texts=True) for _ in range(parts)]
    for index, (chunk, _) in enumerate(DumpReader([str(path)], chunk_tokens=chunk_tokens).chunks("cpu", numpy=True)):
        accumulators[index % parts].update(chunk)
    merged = accumulators[-1]
    for other in reversed(accumulators[:-1]):
        merged.merge(other)
    return merged.evidence().texts, merged.text_level


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    rows = matched_run_rows(5, prompts=120, planted=1)
    return write_prompt_dump(tmp_path_factory.mktemp("texts") / "d.parquet", rows, row_group_size=31)


def test_every_prompt_keeps_its_id_text(path):
    texts, level = _texts(path, 1 << 22, 1)
    assert level == 0 and texts == {text_key(name): name for name in [*(f"p{k}" for k in range(120)), "x0"]}


@pytest.mark.parametrize(("chunk_tokens", "parts"), [(300, 1), (900, 3)])
def test_capped_texts_do_not_depend_on_chunking_or_merging(path, monkeypatch, chunk_tokens, parts):
    monkeypatch.setattr(prompt_metrics, "MAX_TEXTS", 40)
    whole, level = _texts(path, 1 << 22, 1)
    # 121 prompts: level 1 keeps ~60 (> 40), level 2 ~30: the keys whose low 2 bits are 0
    assert level >= 2 and 0 < len(whole) <= 40
    assert all(key & ((1 << level) - 1) == 0 for key in whole)
    assert _texts(path, chunk_tokens, parts) == (whole, level)


def test_texts_stay_empty_unless_asked_or_without_an_id_column(tmp_path, path):
    assert _texts_of(path, keep=False) == {}
    bare = write_prompt_dump(tmp_path / "bare.parquet", matched_run_rows(5, prompts=20), prompt_column=None)
    assert _texts_of(bare, keep=True) == {}  # token-id keys: no id text to keep


def _texts_of(path, *, keep: bool) -> dict[int, str]:
    accumulator = PromptAccumulator(keep_texts=keep)
    for chunk, _ in DumpReader([str(path)]).chunks("cpu", numpy=True):
        accumulator.update(chunk)
    return accumulator.evidence().texts
