"""``convert`` takes a Dump as every reading call does: its column overrides and options are used, an option given
both ways must agree, and a reading option convert cannot honour is refused before anything is read or written."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from helpers.dumps import random_rows, write_sequence_dump

import rollout_diag as rd

RENAMED = {"rollout": "vllm_logprobs", "trainer": "old_logprobs"}


@pytest.fixture(scope="module")
def renamed(tmp_path_factory):
    """A dump whose logprob columns need overrides (the Dump carries them)."""
    rows = random_rows(5, steps=range(3), rows_per_step=7, max_length=30)
    return write_sequence_dump(tmp_path_factory.mktemp("convert") / "run.parquet", rows, names=RENAMED)


def test_a_dump_converts_as_its_paths_and_options_do(renamed, tmp_path):
    by_options = rd.convert(renamed, tmp_path / "a.parquet", columns=RENAMED)
    by_dump = rd.convert(rd.Dump(renamed, columns=RENAMED), tmp_path / "b.parquet")
    assert (by_dump.rows, by_dump.steps, by_dump.inputs, by_dump.format) == (
        by_options.rows,
        by_options.steps,
        by_options.inputs,
        by_options.format,
    )
    assert pq.read_table(tmp_path / "b.parquet").equals(pq.read_table(tmp_path / "a.parquet"))
    same = rd.convert(rd.Dump(renamed, columns=RENAMED), tmp_path / "c.parquet", columns=RENAMED)  # given twice, equal
    assert same.rows == by_dump.rows


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"workers": 4}, "workers=4: convert cannot honour it"),
        ({"backend": "ray"}, "backend='ray': convert cannot honour it"),
        ({"device": "cpu"}, "device='cpu': convert cannot honour it"),
        ({"chunk_tokens": 4096}, "chunk_tokens=4096: convert cannot honour it"),
    ],
)
def test_a_dump_option_convert_cannot_honour_is_refused(renamed, tmp_path, options, said):
    with pytest.raises(rd.ConfigError) as caught:
        rd.convert(rd.Dump(renamed, columns=RENAMED, **options), tmp_path / "out.parquet")
    assert said in str(caught.value)
    assert not (tmp_path / "out.parquet").exists()


def test_an_option_given_both_ways_must_agree(renamed, tmp_path):
    with pytest.raises(rd.ConfigError, match=r"strict=True disagrees with the Dump's strict=False"):
        rd.convert(rd.Dump(renamed, columns=RENAMED), tmp_path / "out.parquet", strict=True)
    with pytest.raises(
        rd.ConfigError, match=r"input_format='nemo-rl' disagrees with the Dump's input_format='parquet'"
    ):
        rd.convert(
            rd.Dump(renamed, columns=RENAMED, input_format="parquet"), tmp_path / "out.parquet", input_format="nemo-rl"
        )
