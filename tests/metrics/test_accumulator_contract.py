"""The accumulator contract (issue 14): every family gives the same finalize() fed whole, chunked, merged in any
order and sharded over workers, to rtol 1e-12. One test per family, one shared procedure."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from helpers.dumps import random_rows, seq_row, write_sequence_dump
from helpers.tables import FAMILIES, chunks, finalized

RTOL = 1e-12
ATOL = 1e-15  # values that are 0 in exact arithmetic (a std of equal weights) come out at ~1e-17 either way


@pytest.fixture(scope="module")
def dump(tmp_path_factory) -> str:
    """4 steps, multi-turn masks, heavy mismatch in some rows, one row without a model token, rows of one step
    spread over the file (so chunks hold several steps and one step spans several chunks)."""
    rows = random_rows(seed=21, steps=(0, 1, 2, 3), rows_per_step=8, max_length=40, env_share=0.35)
    rng = np.random.default_rng(21)
    for row in rows[::5]:  # large divergence: rejections, truncations, vetoes, clamps
        row["rollout"] = [min(x - abs(rng.normal(0.0, 3.0)), 0.0) for x in row["rollout"]]
    rows.append(seq_row(2, "empty", [-0.5, -1.0], [-0.4, -1.1], [0, 0]))
    random.Random(21).shuffle(rows)
    return str(write_sequence_dump(tmp_path_factory.mktemp("contract") / "dump.parquet", rows, row_group_size=9))


def assert_close(actual: Any, expected: Any, where: str = "") -> None:
    if isinstance(expected, dict):
        assert set(actual) == set(expected), f"{where}: keys differ: {set(actual) ^ set(expected)}"
        for key in expected:
            assert_close(actual[key], expected[key], f"{where}/{key}")
    elif isinstance(expected, Sequence) and not isinstance(expected, str):  # lists, and tables read as lists
        assert len(actual) == len(expected), where
        for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_close(a, e, f"{where}[{index}]")
    elif isinstance(expected, float):
        if math.isnan(expected) or math.isinf(expected):
            assert actual == expected or (math.isnan(actual) and math.isnan(expected)), f"{where}: {actual}"
        else:
            assert math.isclose(actual, expected, rel_tol=RTOL, abs_tol=ATOL), f"{where}: {actual} != {expected}"
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


def merged(parts: list[Any]) -> Any:
    first = parts[0]
    for other in parts[1:]:
        first.merge(other)
    return first


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_whole_chunked_merged_in_any_order_and_sharded_agree(dump, family):
    make = FAMILIES[family]
    whole = make()
    for chunk in chunks(dump, chunk_tokens=1 << 20):
        whole.update(chunk)
    expected = finalized(whole)

    small = chunks(dump, chunk_tokens=83)  # does not divide any row or step
    assert len(small) > 8
    streamed = make()
    for chunk in small:
        streamed.update(chunk)
    assert_close(finalized(streamed), expected, f"{family} chunked")

    def fed(parts: list[list[Any]]) -> list[Any]:
        """One fresh accumulator per list of chunks (merging mutates its first part, so each check rebuilds)."""
        out = []
        for part in parts:
            accumulator = make()
            for chunk in part:
                accumulator.update(chunk)
            out.append(accumulator)
        return out

    reverse = list(range(len(small)))[::-1]
    for order in (reverse, random.Random(7).sample(range(len(small)), len(small))):
        per_chunk = fed([[small[i]] for i in order])
        assert_close(finalized(merged(per_chunk)), expected, f"{family} merged in order {order[:4]}…")

    for shard_count in (2, 3):  # workers: chunks dealt round-robin, results merged in several orders
        dealt = chunks(dump, chunk_tokens=71)
        for order in itertools.islice(itertools.permutations(range(shard_count)), 2):
            shards = fed([dealt[i::shard_count] for i in order])
            assert_close(finalized(merged(shards)), expected, f"{family} {shard_count} shards, order {order}")


def test_a_family_without_a_formula_is_refused_where_it_is_defined() -> None:
    from rollout_diag.metrics.base import StepAccumulator

    class Intermediate(StepAccumulator):  # no _stats yet: not a family, left abstract
        pass

    with pytest.raises(TypeError, match="Formless writes neither finalize_block nor _finalize"):

        class Formless(Intermediate):
            def _stats(self, chunk: Any) -> dict[str, Any]:
                return {}

    class Stepwise(Intermediate):  # _finalize alone is a formula
        def _stats(self, chunk: Any) -> dict[str, Any]:
            return {}

        def _finalize(self, state: Any) -> dict[str, float]:
            return {}

    assert Stepwise().finalize_block({}) is None
