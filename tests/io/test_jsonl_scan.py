"""The compiled JSON-lines scanner (io/jsonl/) against Python's json, the reference.

- numbers: every string it converts gives the double Python's json gives (correct rounding, -0, NaN/Infinity);
- lines: where it accepts a line, Python's json reads the same values; where Python's json refuses a line, it
  refuses it too (the line then goes through the format's own parser and its message);
- the importers: lines with bare NaN/Infinity (NeMo-RL) now take the fast path, with the same rows.
"""

from __future__ import annotations

import json
import math
import struct

import numpy as np
import pyarrow as pa
import pytest
from helpers.jsonl import bits, read_rows
from helpers.scanner import _SCHEMA, _convert, _scan_lines
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rollout_diag.io.formats import nemo_rl, prime_rl


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or struct.pack("<d", a) == struct.pack("<d", b)


def _check(strings: list[str]) -> int:
    values, ok = _convert(strings)
    for text, value, accepted in zip(strings, values, ok, strict=True):
        if accepted:
            assert _same(float(json.loads(text)), float(value)), text
    return int(ok.sum())


def test_numbers_are_converted_as_python_does():
    rng = np.random.default_rng(5)
    float32 = np.float32(-rng.exponential(1.0, 200_000)).astype(np.float64)
    doubles = rng.integers(0, 2**63 - 1, 200_000, dtype=np.int64).view(np.float64)
    doubles = doubles[np.isfinite(doubles) & (np.abs(doubles) >= 2.2250738585072014e-308)]
    strings = [repr(float(x)) for x in float32] + [repr(float(x)) for x in doubles]
    assert _check(strings) == len(strings)  # every shortest repr of a normal double is converted here
    decimals = []
    for _ in range(100_000):
        digits = "".join(map(str, rng.integers(0, 10, int(rng.integers(1, 20))))).lstrip("0") or "0"
        cut = int(rng.integers(0, len(digits) + 1))
        decimals.append(f"{'-' if rng.random() < 0.5 else ''}{digits[:cut] or '0'}.{digits[cut:] or '0'}")
        decimals.append(f"{digits}e{int(rng.integers(-330, 310))}")
    assert _check(decimals) > 0.9 * len(decimals)


def test_edge_numbers():
    edges = ["0", "-0", "0.0", "-0.0", "1e22", "1e23", "9007199254740993", "123456789012345678", "0.1",
             "2.2250738585072014e-308", "1.7976931348623157e308", "NaN", "Infinity", "-Infinity", "1E5", "1e+5",
             "4.9406564584124654e-324", "1e-400", "1e400", "12345678901234567890", "-9007199254740993.0"]  # fmt: skip
    values, ok = _convert(edges)
    converted = {text: float(value) for text, value, accepted in zip(edges, values, ok, strict=True) if accepted}
    assert repr(converted["-0"]) == "0.0"  # Python's json reads -0 as the integer 0
    assert repr(converted["-0.0"]) == "-0.0"
    assert math.isnan(converted["NaN"]) and converted["-Infinity"] == -math.inf
    for left in ("4.9406564584124654e-324", "1e-400", "1e400", "12345678901234567890"):  # subnormal, range, digits
        assert left not in converted
    _check(edges)


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_any_double_written_by_python_reads_back(value):
    _check([json.dumps(value), repr(value), f"{value:.17e}", f"{value:.6g}"])


@settings(max_examples=300, deadline=None)
@given(st.from_regex(r"-?(0|[1-9][0-9]{0,21})(\.[0-9]{1,21})?([eE][-+]?[0-9]{1,3})?", fullmatch=True))
def test_any_json_number(text):
    _check([text])


# ------------------------------------------------------------------ lines: accepted means Python reads the same


def _agrees(line: str, row: dict, written_null: np.ndarray) -> None:
    record = json.loads(line)  # accepted: Python reads it
    assert isinstance(record, dict)
    for k, field in enumerate(_SCHEMA):
        value = record.get(field.name)
        assert bool(written_null[k]) == (field.name in record and value is None)
        if field.type == pa.list_(pa.float64()) and isinstance(value, list):
            value = [None if v is None else float(v) for v in value]
        if field.name == "ff" and isinstance(value, list):
            value = [None if inner is None else [None if v is None else float(v) for v in inner] for inner in value]
        assert bits(row[field.name]) == bits(value), (line, field.name)


_VALUE = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(),
        st.text(max_size=5),
    ),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=12,
)


@st.composite
def _line(draw) -> str:
    record = {}
    for name in draw(st.lists(st.sampled_from(["i", "s", "f", "n", "b", "ff", "x", "y"]), max_size=8, unique=True)):
        good = {
            "i": st.integers(-(10**17), 10**17),
            "s": st.text(max_size=6),
            "f": st.lists(st.one_of(st.floats(), st.integers(-(2**60), 2**60), st.none()), max_size=5),
            "n": st.lists(st.one_of(st.integers(-(10**17), 10**17), st.none()), max_size=5),
            "b": st.lists(st.one_of(st.booleans(), st.none()), max_size=5),
            "ff": st.lists(st.one_of(st.none(), st.lists(st.one_of(st.floats(), st.none()), max_size=3)), max_size=3),
        }.get(name, _VALUE)
        record[name] = draw(st.one_of(good, _VALUE) if draw(st.integers(0, 4)) == 0 else good)
    text = json.dumps(record, ensure_ascii=draw(st.booleans()), separators=draw(st.sampled_from([None, (",", ":")])))
    if draw(st.integers(0, 2)) == 0 and text:  # break it: drop, double or insert a character
        at = draw(st.integers(0, len(text) - 1))
        how = draw(st.integers(0, 2))
        extra = draw(st.sampled_from(list('{}[],:" 0-.eE\\nNItfu')))
        text = text[:at] + (text[at + 1 :] if how == 0 else text[at] + text[at:] if how == 1 else extra + text[at:])
    return text.replace("\n", " ").replace("\r", " ")


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_line(), min_size=1, max_size=6))
# found by hypothesis on 339727f: a list of nulls after rows with more items ended the scan with a numba ValueError
@example(
    lines=[
        ' {"i": 0, "ff": [null, null], "s": "", "x": null}',
        ' {"i": 0, "ff": [null, null], "s": "", "x": null}',
        '{"i": 0, "ff": [null], "s": "","x": null}',
    ]
)
def test_accepted_lines_read_as_python_reads_them(lines):
    scanned = _scan_lines(lines)
    rows = scanned.table.to_pylist()
    for row, index, written_null in zip(rows, scanned.rows, scanned.written_null, strict=True):
        _agrees(lines[index], row, written_null)
    for index, line in enumerate(lines):
        if index not in set(scanned.rows.tolist()):
            continue
        json.loads(line)


@pytest.mark.parametrize(
    "line",
    [
        "",
        "   ",
        "[]",
        "3",
        '{"i": 1,}',
        '{"i": 1} {"i": 2}',
        '{"i": 1, "i": 2}',  # Python keeps the last: left to it
        '{"\\u0069": 1}',  # an escaped key equal to "i"
        '{"i": 01}',
        '{"f": [1.]}',
        '{"f": [.5]}',
        '{"f": [1e]}',
        '{"f": [-]}',
        '{"f": [nan]}',
        '{"f": [-NaN]}',
        '{"f": [1, 2,]}',
        '{"f": [true]}',
        '{"n": [1.0]}',
        '{"n": [12345678901234567890]}',
        '{"b": [1]}',
        '{"i": "1"}',
        '{"s": "a\\nb"}',  # an escape in a string read: left to Python
        '{"x": "\x01"}',  # a control character in a string
        '{"x": "\\q"}',
        '{"x": [1, 2}',
        '{"x": {"a" 1}}',
        '{"ff": [1]}',
        "\ufeff{}",
        '{"i": 1}}',
        '{"x": ' + "[" * 70 + "]" * 70 + "}",
    ],
)
def test_lines_left_to_python(line):
    assert not len(_scan_lines([line]).rows)


def test_lines_it_reads():
    lines = [
        "{}",
        ' { "i" : -0 , "f" : [ NaN , -Infinity , Infinity , null , -0 , 1E2 ] } ',
        '{"x": {"a": [1, {"b": null}], "c": "\\u00e9\\"\\\\"}, "s": "é", "ff": [null, [], [1.5, null]]}',
        '{"i": null, "f": null, "n": [null, 5], "b": [true, false, null]}',
    ]
    scanned = _scan_lines(lines)
    assert scanned.rows.tolist() == [0, 1, 2, 3]
    for row, index, written_null in zip(scanned.table.to_pylist(), scanned.rows, scanned.written_null, strict=True):
        _agrees(lines[index], row, written_null)


# ------------------------------------------------------------------ the importers: NaN / Infinity lines stay fast
def _nemo_line(index: int, values: list[float]) -> str:
    record = {
        "input_lengths": [len(values)],
        "token_ids": [list(range(len(values)))],
        "token_loss_mask": [[0] + [1] * (len(values) - 1)],
        "sample_loss_mask": [1.0],
        "generation_logprobs": [values],
        "prev_logprobs": [[v * 0.5 for v in values]],
        "idx": index,
    }
    return json.dumps(record)  # allow_nan: bare NaN / Infinity, as NeMo-RL writes them


def test_nemo_rl_non_finite_lines_take_the_fast_path(tmp_path, monkeypatch):
    lines = [_nemo_line(i, [0.0, -0.5, math.nan if i % 2 else -math.inf, math.inf, -1.25]) for i in range(7)]
    path = tmp_path / "train_data_step3.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    reference = read_rows(nemo_rl, path, False, 3)
    monkeypatch.setattr(nemo_rl, "_row", lambda *args: pytest.fail("a line went to Python's json"))
    assert read_rows(nemo_rl, path, True, 3) == reference


def test_bad_lines_alone_go_to_the_line_parser(tmp_path, monkeypatch):
    """Good lines are read fast, each bad one by prime-rl's own parser (its message, its row number)."""
    good = json.dumps({"step": 2, "loss_mask": [True, False], "inference_logprobs": [-1.0, None],
                       "trainer_logprobs": [-0.5, -2.0], "env_name": "math"})  # fmt: skip
    lines = [good, "{not json", good, '{"step": 2, "loss_mask": [1, 0], "inference_logprobs": [], '
             '"trainer_logprobs": []}', "", good, '{"step": 2.5}']  # fmt: skip
    path = tmp_path / "rank_0.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    reference = read_rows(prime_rl, path, False, 3)
    seen = []
    original = prime_rl._row
    monkeypatch.setattr(prime_rl, "_row", lambda line, index, step: seen.append(index) or original(line, index, step))
    assert read_rows(prime_rl, path, True, 3) == reference
    assert seen == [1, 3, 4, 6]
    reasons = {row["_skip_reason"] for row in reference if row["_skip_reason"]}
    assert any(reason.startswith("not JSON") for reason in reasons) and "blank line" in reasons


_INTEGER_TEXTS = [
    *("0", "-0", "7", "-7", "01", "00", "-", "--1", "1.0", "1.", "1e2", "1E2", "-1e-2"),
    *("123456789012345678", "-123456789012345678", "1234567890123456789", "9223372036854775807"),
    *("99999999999999999999999", "NaN", "Infinity", "-Infinity", "true", "1x", "0x1", "+1", "1 "),
]


@pytest.mark.parametrize("text", _INTEGER_TEXTS)
def test_integer_fields_take_only_an_integer_literal_of_at_most_18_digits(text):
    """An integer field (and an integer list item) is read only where Python's json gives an int of at most 18 digits
    (a fraction or an exponent is a float to Python, longer integers are left to it); -0 reads as 0."""
    lines = [f'{{"i": {text}}}', f'{{"n": [{text}]}}', f'{{"n": [1, {text}, 2]}}']
    scanned = _scan_lines(lines)
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    readable = isinstance(value, int) and not isinstance(value, bool) and len(str(abs(value))) <= 18
    assert scanned.rows.tolist() == ([0, 1, 2] if readable else [])
    if readable:
        rows = scanned.table.to_pylist()
        assert (rows[0]["i"], rows[1]["n"], rows[2]["n"]) == (value, [value], [1, value, 2])
