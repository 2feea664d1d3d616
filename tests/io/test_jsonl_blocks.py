"""The JSON-lines fast path read in blocks, scanned in parts on several threads: the same rows, in file order,
wherever the reads and the parts cut.

- numbers: eight fraction digits at a time (io/jsonl/numbers.py) still converts exactly as Python's ``float()`` and
  leaves to Python exactly the numbers it left before (more than 19 significant digits);
- blocks: the file is read ``BLOCK_BYTES`` at a time and split at newlines into blocks, each scanned in parts of
  about ``PART_BYTES`` by a pool of threads; a read or a part that ends in the middle of a line (or of a number, or
  of a multi-byte character) changes nothing, and the rows come back in file order;
- counting: the compiled line count equals :func:`count_lines` and finds a carriage return in any read.
"""

from __future__ import annotations

import json
import math
import struct
from itertools import pairwise

import numpy as np
import pytest
from helpers.jsonl import file_lines, nemo_rl_line, prime_rl_line, read_rows
from helpers.scanner import _convert, _scan_lines
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout_diag.io.formats import base, nemo_rl, prime_rl


# ------------------------------------------------------------------ numbers: eight digits at a time
def _bits(value: float) -> bytes:
    return struct.pack("<d", value)


@pytest.mark.parametrize("zeros", [0, 1, 7, 8, 9, 15, 16, 17, 30])
def test_fraction_digits_are_read_eight_at_a_time_exactly(zeros):
    """Every count of significant digits 1-19 behind any run of leading zeros converts exactly; 20 and more are left
    to Python, as before."""
    rng = np.random.default_rng(zeros)
    strings, significant = [], []
    for count in range(1, 25):
        for _ in range(40):
            digits = str(int(rng.integers(1, 10))) + "".join(map(str, rng.integers(0, 10, count - 1)))
            for whole in ("0", "-0", "3"):
                for tail in ("", "e-5", "E+12"):
                    strings.append(f"{whole}.{'0' * zeros}{digits}{tail}")
                    significant.append(count + (zeros + 1 if whole == "3" else 0))
    values, ok = _convert(strings)
    for text, value, accepted, digits in zip(strings, values, ok, significant, strict=True):
        assert bool(accepted) == (digits <= 19), text
        if accepted:
            assert _bits(float(value)) == _bits(float(json.loads(text))), text


@settings(max_examples=200, deadline=None)
@given(st.lists(st.from_regex(r"-?[0-9]\.[0-9]{1,20}", fullmatch=True), min_size=1, max_size=9), st.booleans())
def test_a_list_of_long_fractions_reads_as_python_reads_it(numbers, spaced):
    """Eight-byte words run over the separators and the line's end: the values are still Python's."""
    line = '{"f": [' + (", " if spaced else ",").join(numbers) + "]}"
    scanned = _scan_lines([line])
    expected = [float(text) for text in numbers]
    if len(scanned.rows):
        assert [_bits(v) for v in scanned.table.column("f")[0].as_py()] == [_bits(v) for v in expected]
    else:  # left to Python only for a number of more than 19 significant digits
        assert any(len(text.lstrip("-").replace(".", "").lstrip("0")) > 19 for text in numbers)


def test_an_integer_part_then_many_fraction_digits():
    strings = ["12345678.123456789", "0.12345678", "0.123456789", "1.1234567", "99999999.99999999999",
               "0.99999999999999999", "0.99999999999999999999", "1.00000000000000000001", "-0.000000000000000000001",
               "5e-324", "0.0000000000000000000000000000000000000000000000000000000000000000001"]  # fmt: skip
    values, ok = _convert(strings)
    for text, value, accepted in zip(strings, values, ok, strict=True):
        if accepted:
            assert _bits(float(value)) == _bits(float(text)), text
    accepted = dict(zip(strings, ok.tolist(), strict=True))
    assert accepted["0.99999999999999999"] and accepted["-0.000000000000000000001"]
    assert not accepted["0.99999999999999999999"] and not accepted["1.00000000000000000001"]  # 20 and 21 digits
    assert not accepted["5e-324"]  # subnormal: Python's way


# ------------------------------------------------------------------ blocks: reads cut anywhere, rows in file order
_BLOCK_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _with_block_bytes(block_bytes: int, read, part_bytes: int = 1):
    saved = base.BLOCK_BYTES, base.PART_BYTES
    base.BLOCK_BYTES, base.PART_BYTES = block_bytes, part_bytes
    try:
        return read()
    finally:
        base.BLOCK_BYTES, base.PART_BYTES = saved


@pytest.mark.parametrize(
    ("module", "line", "name"),
    [(prime_rl, prime_rl_line, "rank_0.jsonl"), (nemo_rl, nemo_rl_line, "train_data_step2.jsonl")],
    ids=["prime_rl", "nemo_rl"],
)
@_BLOCK_SETTINGS
@given(
    data=st.data(),
    block_bytes=st.integers(1, 600),
    part_bytes=st.integers(1, 300),
    batch_size=st.integers(1, 9),
    end=st.booleans(),
)
def test_reads_cut_anywhere_give_the_same_rows_in_order(
    module, line, name, data, block_bytes, part_bytes, batch_size, end, tmp_path_factory
):
    lines = data.draw(file_lines(line, min_size=1, max_size=20), label="lines")
    path = tmp_path_factory.mktemp("cut") / name
    path.write_text("\n".join(lines) + ("\n" if end else ""))
    reference = read_rows(module, path, False, batch_size)
    assert _with_block_bytes(block_bytes, lambda: read_rows(module, path, True, batch_size), part_bytes) == reference


def _prime_line(index: int, length: int) -> str:
    values = [-(index + 1) - k / 7 for k in range(length)]
    record = {"step": 1, "rank": 0, "export_sequence_idx": index, "loss_mask": [True] * length,
              "inference_logprobs": values, "trainer_logprobs": values, "env_name": "é"}  # fmt: skip
    return json.dumps(record, ensure_ascii=False)


@pytest.mark.parametrize(
    ("block_bytes", "part_bytes"), [(1, 1), (13, 1), (64, 1), (1000, 1), (1 << 20, 1), (1 << 20, 997)]
)
def test_many_blocks_on_every_thread_come_back_in_file_order(block_bytes, part_bytes, tmp_path, monkeypatch):
    """Hundreds of blocks (lines of different lengths, a multi-byte character in each, one bad line) scanned by the
    pool: every row in file order, the bad one where it was, and no line read by Python's json but the bad one."""
    monkeypatch.setattr(base, "BLOCK_BYTES", block_bytes)
    monkeypatch.setattr(base, "PART_BYTES", part_bytes)
    lines = [_prime_line(i, 1 + (i * 37) % 50) for i in range(300)]
    lines[123] = "{not json"
    path = tmp_path / "rank_0.jsonl"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    seen = []
    original = prime_rl._row
    monkeypatch.setattr(prime_rl, "_row", lambda line, index, step: seen.append(index) or original(line, index, step))
    rows = read_rows(prime_rl, path, True, 7)
    assert seen == [123]
    assert [row["sample_id"] for row in rows] == [f"rank0-{i}" if i != 123 else "line124" for i in range(300)]
    assert rows[201]["rollout_log_probs"][3] == repr(-(201 + 1) - 3 / 7)
    monkeypatch.setattr(prime_rl, "_row", original)
    assert rows == read_rows(prime_rl, path, False, 7)


def test_a_byte_that_is_not_utf8_still_raises_when_reads_cut_around_it(tmp_path, monkeypatch):
    good = json.dumps({"step": 1, "loss_mask": [True], "inference_logprobs": [-1.0], "trainer_logprobs": [-1.5]})
    path = tmp_path / "rank_0.jsonl"
    path.write_bytes((good + "\n").encode() * 5 + b'{"step":1,"env_name":"\xff"}\n' + (good + "\n").encode() * 5)
    for block_bytes, part_bytes in ((1, 1), (7, 1), (100, 1), (1 << 20, 1), (1 << 20, 1 << 20)):
        monkeypatch.setattr(base, "BLOCK_BYTES", block_bytes)
        monkeypatch.setattr(base, "PART_BYTES", part_bytes)
        with pytest.raises(UnicodeDecodeError):
            list(prime_rl.open_file(str(path)).iter_batches(batch_size=2))


def test_parts_cover_the_block_in_order_and_cut_only_at_line_ends(monkeypatch):
    monkeypatch.setattr(base, "PART_BYTES", 10)
    ends = np.cumsum([0, 3, 40, 1, 1, 25, 7, 2, 90, 5]).astype(np.int64) + 17
    parts = base._parts(ends, 100)
    assert parts[0][0] == 0 and parts[-1][1] == len(ends) - 1 and len(parts) > 3
    assert all(a < b for a, b in parts) and all(b == c for (_, b), (c, _) in pairwise(parts))
    few = base._parts(ends, 3)  # no more parts than asked: larger ones
    assert len(few) == 3 and few[0][0] == 0 and few[-1][1] == len(ends) - 1
    assert all(b == c for (_, b), (c, _) in pairwise(few))
    monkeypatch.setattr(base, "PART_BYTES", 1 << 20)
    assert base._parts(ends, 100) == [(0, len(ends) - 1)]


# ------------------------------------------------------------------ counting lines
@settings(max_examples=100, deadline=None)
@given(
    data=st.binary(max_size=300).map(lambda b: b.replace(b"\r", b"x")), at=st.integers(-1, 299), carriage=st.booleans()
)
def test_the_line_count_and_carriage_returns(data, at, carriage, tmp_path_factory):
    if carriage and 0 <= at < len(data):
        data = data[:at] + b"\r" + data[at + 1 :]
    path = tmp_path_factory.mktemp("c") / "f.jsonl"
    path.write_bytes(data)
    assert base._scan_lines(path) == (base.count_lines(path), b"\r" in data)


def test_carriage_return_after_the_first_megabyte(tmp_path):
    path = tmp_path / "f.jsonl"
    path.write_bytes(b"{}\n" * 400_000 + b"{}\r\n" + b"{}")
    assert base._scan_lines(path) == (400_002, True)
    assert math.isclose(base.count_lines(path), 400_002)


@settings(max_examples=200, deadline=None)
@given(
    data=st.lists(
        st.sampled_from([b"\n", b"\r", b"\r\n", b"\n" * 9, b"\x8a", b"\x0b", b"\t", b"0123456789"]), max_size=600
    ).map(b"".join),
    upto=st.integers(0, 7000),
)
def test_newlines_and_returns_of_any_prefix(data, upto):
    """The compiled count (32 bytes at a time, the equal bytes summed per word) is exact for runs of newlines and
    carriage returns, and for their neighbours (0x8a, 0x0b), at any length."""
    from rollout_diag.io.jsonl import newlines_and_returns

    upto = min(upto, len(data))
    assert newlines_and_returns(base._readonly(data), upto) == (data[:upto].count(b"\n"), data[:upto].count(b"\r"))


# ------------------------------------------------------------------ finding line ends (eight bytes at a time)
@settings(max_examples=200, deadline=None)
@given(
    data=st.lists(st.sampled_from([b"\n", b"a", b"\x80", b"\xff", b"\r", b"\n\n", b"0123456789"]), max_size=400).map(
        b"".join
    ),
    cut=st.tuples(st.integers(0, 4000), st.integers(0, 4000)),
)
def test_line_ends_and_ascii_of_any_range(data, cut):
    """Every newline of ``data[start:stop]``, at any alignment, and whether that range is ASCII (a word at a time)."""
    from rollout_diag.io.jsonl import line_ends

    start, stop = sorted(min(c, len(data)) for c in cut)
    ends, ascii = line_ends(base._readonly(data), start, stop)
    assert ends.tolist() == [i + 1 for i in range(start, stop) if data[i] == 10]
    assert ascii == data[start:stop].isascii()


def test_line_ends_past_its_first_guess_of_lines():
    from rollout_diag.io.jsonl import line_ends

    data = b"{}\n" * 5000 + b"x"
    ends, ascii = line_ends(base._readonly(data), 1, len(data))
    assert ends.tolist() == list(range(3, 15001, 3)) and ascii


def test_read_buffers_are_reused_within_and_across_files(tmp_path, monkeypatch):
    """Reads that cut lines shorter than the buffers' slack keep the buffers, so the next file reads into the same
    three buffers."""
    monkeypatch.setattr(base, "BLOCK_BYTES", 4000)
    monkeypatch.setattr(base, "_SPARE_BUFFERS", [])
    lines = [_prime_line(i, 5) for i in range(40)]
    assert all(300 < len(line) < 450 for line in lines)  # reads of 4000 bytes cut lines shorter than the slack (500)
    path = tmp_path / "rank_0.jsonl"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    rows = read_rows(prime_rl, path, True, 7)
    assert len(base._SPARE_BUFFERS) == 1
    kept = base._SPARE_BUFFERS[0]
    assert [len(buffer) for buffer in kept] == [4501, 4501, 4501]
    assert read_rows(prime_rl, path, True, 7) == rows == read_rows(prime_rl, path, False, 7)
    assert len(base._SPARE_BUFFERS) == 1 and all(a is b for a, b in zip(base._SPARE_BUFFERS[0], kept, strict=True))


@settings(max_examples=100, deadline=None)
@given(
    data=st.lists(st.sampled_from([b"\n", b"\r", b"{}", b"\xc3\xa9", b"0123456789"]), max_size=300).map(b"".join),
    ranges=st.integers(1, 5),
)
def test_the_line_count_in_ranges_by_threads(data, ranges, tmp_path_factory):
    """A file counted in ranges (one thread each, cut anywhere, even inside a line) gives the count of one pass."""
    path = tmp_path_factory.mktemp("r") / "f.jsonl"
    path.write_bytes(data)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(base, "_COUNT_RANGE_BYTES", 1)
        patch.setattr(base, "_COUNT_THREADS", ranges)
        patch.setattr(base, "_COUNT_READ_BYTES", 7)  # several reads per range
        patch.setattr("rollout_diag.cores.available_cores", lambda: 8)
        assert base._scan_lines(path) == (base.count_lines(path), b"\r" in data)


def test_the_line_count_raises_what_a_counting_thread_raised(tmp_path, monkeypatch):
    """An error in another range's thread reaches the caller (open_input turns it into one line)."""
    monkeypatch.setattr(base, "_COUNT_RANGE_BYTES", 1)
    monkeypatch.setattr("rollout_diag.cores.available_cores", lambda: 2)
    path = tmp_path / "f.jsonl"
    path.write_bytes(b"{}\n" * 10)
    real = base._count_range

    def failing(where, start, stop):
        if start:
            raise OSError(5, "Input/output error")
        return real(where, start, stop)

    monkeypatch.setattr(base, "_count_range", failing)
    with pytest.raises(OSError, match="Input/output error"):
        base._scan_lines(path)
