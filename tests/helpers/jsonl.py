"""prime-rl and NeMo-RL JSON lines (hypothesis), odd and spoiling ones among them, and reading them back."""

from __future__ import annotations

import json
import math
from pathlib import Path

from hypothesis import strategies as st

_ODD_LINES = ["", "   ", "not json", "[1, 2]", "3", "{}", "\ufeff{}"]  # each read by Python's json alone


_SPOILING_LINES = [  # malformed (or, for pyarrow's reader once, block-spoiling) lines the scanner leaves to Python
    '{"a": 1} {"b": 2}',
    '{"a": 1,}',
    '{"s": "\\ud800"}',
    '{"k": 1, "k": 2}',
]


_PLAIN = st.one_of(st.floats(-1e6, 1e6).map(lambda x: x + 0.0), st.integers(-9, 9))  # + 0.0: no -0.0


# values where Arrow and Python's json could part: -0, -0.0, integers beyond 2**53, huge and tiny magnitudes
_EDGES = st.sampled_from([0.0, -0.0, -0, 1e300, -1e-300, 2.0**53 + 2, 9007199254740993, -(2**60), 2**63 + 1])


def _numbers(draw):
    """Plain numbers, or (one line in four) plain numbers mixed with edge values."""
    edges = st.one_of(_EDGES, st.floats(allow_nan=False, allow_infinity=False))
    return st.one_of(_PLAIN, edges) if draw(st.integers(0, 3)) == 0 else _PLAIN


def _weird(draw, valid, spoil):
    """Mostly ``valid``; now and then null, a missing field or (``spoil``) a value of another type."""
    kind = draw(st.integers(0, 79))
    if kind == 0:
        return "missing"
    if kind == 1:
        return None
    if kind == 2 and spoil:
        return draw(st.sampled_from(["text", True, 1.5, [[1]], {"x": 1}, [None], []]))
    return valid


@st.composite
def prime_rl_line(draw, spoil: bool) -> str:
    if draw(st.integers(0, 29)) == 0:
        return draw(st.sampled_from(_ODD_LINES + (_SPOILING_LINES if spoil else [])))
    length = draw(st.integers(0, 6))
    numbers = _numbers(draw)

    def logprobs():
        values = draw(st.lists(st.one_of(numbers, st.none()), min_size=length, max_size=length))
        return values if draw(st.integers(0, 9)) else [*values, 0.5]  # now and then ragged

    def weights():
        choice = draw(st.integers(0, 4))
        if choice == 0:
            return [None] * length
        if choice == 1:
            return draw(
                st.lists(st.one_of(st.sampled_from([0.0, 1.0, 0.5, -1]), st.none()), min_size=length, max_size=length)
            )
        if choice == 2:
            return draw(st.lists(st.sampled_from([0.0, 1.0]), max_size=length + 1))
        return "missing"

    def advantages():
        choice = draw(st.integers(0, 3))
        if choice == 0:  # GRPO: one value over the whole row
            return [draw(st.sampled_from([1.5, -0.5, 0.0, -0.0, 2, -(2**60)]))] * length
        if choice == 1:  # per token, signs may differ, nulls
            return draw(st.lists(st.one_of(numbers, st.none()), min_size=length, max_size=length))
        if choice == 2:
            return draw(st.lists(numbers, max_size=length + 1))
        return "missing"

    record = {
        "step": _weird(draw, draw(st.integers(1, 3)), spoil),
        "rank": _weird(draw, draw(st.integers(0, 2)), spoil),
        "export_sequence_idx": _weird(draw, draw(st.integers(0, 50)), spoil),
        "env_name": "math NaN",  # a string holding a literal the fast path must leave to Python
        "token_ids": _weird(draw, draw(st.lists(st.integers(0, 2**40), min_size=length, max_size=length)), spoil),
        "loss_mask": _weird(draw, draw(st.lists(st.booleans(), min_size=length, max_size=length)), spoil),
        "inference_logprobs": _weird(draw, logprobs(), spoil),
        "trainer_logprobs": _weird(draw, logprobs(), spoil),
        "rl_weights": weights(),
        "ref_kl_weights": weights(),
        "advantages": _weird(draw, advantages(), spoil),
    }
    if draw(st.integers(0, 3)):
        record["env_name"] = draw(st.sampled_from(["math", "code", None, "missing"]))
    record = {key: value for key, value in record.items() if value != "missing"}
    return json.dumps(record, separators=(",", ":"), allow_nan=False)


@st.composite
def nemo_rl_line(draw, spoil: bool) -> str:
    if draw(st.integers(0, 29)) == 0:
        return draw(st.sampled_from(_ODD_LINES + (_SPOILING_LINES if spoil else [])))
    width = draw(st.integers(0, 6))
    length = draw(st.integers(-1, width + 1)) if draw(st.integers(0, 4)) == 0 else draw(st.integers(0, width))
    finite = _numbers(draw)
    if draw(st.integers(0, 4)) == 0:  # bare NaN / Infinity, as NeMo-RL writes them
        finite = st.one_of(finite, st.sampled_from([math.nan, math.inf, -math.inf]))

    def batch(values):
        return _weird(draw, [values] if draw(st.integers(0, 39)) else [values, values], spoil)

    record = {
        "content": [["prompt with Infinity in it" if not draw(st.integers(0, 4)) else "prompt", "response"]],
        "input_lengths": batch(length),
        "token_ids": batch(draw(st.lists(st.integers(0, 1000), min_size=width, max_size=width))),
        "token_loss_mask": batch(draw(st.lists(st.sampled_from([0, 1, 1, 1, 0.5, 2]), min_size=width, max_size=width))),
        "sample_loss_mask": batch(draw(st.sampled_from([1.0, 1, 0.0, 0.25]))),
        "advantages": [[0.5] * width],
        "generation_logprobs": batch(draw(st.lists(finite, min_size=width, max_size=width))),
        "prev_logprobs": batch(draw(st.lists(finite, min_size=width, max_size=width))),
        "idx": _weird(draw, draw(st.integers(0, 99)), spoil),
    }
    record = {key: value for key, value in record.items() if value != "missing"}
    return json.dumps(record)


def file_lines(line, **size) -> st.SearchStrategy[list[str]]:
    """The lines of one file: ``line`` (prime_rl_line or nemo_rl_line) drawn with spoiling lines allowed in the whole
    file or in none of it; ``size``: st.lists' min_size / max_size."""
    return st.booleans().flatmap(lambda spoil: st.lists(line(spoil), **size))


def bits(value):
    """Values comparable bit for bit: floats by repr (NaN equals NaN, -0.0 differs from 0.0)."""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list):
        return [bits(item) for item in value]
    if isinstance(value, dict):
        return {key: bits(item) for key, item in value.items()}
    return value


def read_rows(module, path: Path, fast: bool, batch_size: int) -> list[dict]:
    """The rows of a prime-rl or NeMo-RL file (``module``: its importer) read with or without the compiled scanner
    (``fast``), as ``bits``; every row the file's metadata counts."""
    opened = module.open_file(str(path), fast=fast)
    rows = [row for batch in opened.iter_batches(batch_size=batch_size) for row in batch.to_pylist()]
    assert len(rows) == opened.metadata.num_rows
    return bits(rows)
