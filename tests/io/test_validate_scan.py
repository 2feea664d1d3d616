"""The compiled validation scan (kernels.cpu.checked_model_values, io.packing.scanned_values) against the exact check.

The scan only flags: a block it passes must be one ``io.validate.validate_block`` finds nothing wrong with, and its
arrays must equal the tensors ``DumpReader._chunk`` builds without it; a block it flags goes through
``validate_block``, so bad input still gives the same one-line errors and skip records (checked here with both
engines, whose readers differ only by the scan).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_diag.engine.choice import use_engine
from rollout_diag.errors import DataError
from rollout_diag.io.decode import Block
from rollout_diag.io.packing import scanned_values
from rollout_diag.io.reader import DumpReader
from rollout_diag.io.readlog import ReadLog
from rollout_diag.io.validate import MAX_POSITIVE_LOGPROB, validate_block

CPU = torch.device("cpu")


def _edges(dtype: type) -> list[float]:
    """Values at and around the positive-logprob tolerance, in the block's own dtype."""
    limit = dtype(MAX_POSITIVE_LOGPROB)
    return [float(limit), float(np.nextafter(limit, dtype(1))), float(np.nextafter(limit, dtype(-1)))]


@st.composite
def blocks(draw) -> Block:
    """Blocks of 1–6 rows whose logprobs are mostly good, with NaN, ±inf, positive values and values at the
    tolerance sprinkled in, and masks of several dtypes (or none) with stray values (2, -1)."""
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    lengths = draw(st.lists(st.integers(0, 12), min_size=1, max_size=6))
    tokens = sum(lengths)
    special = [math.nan, math.inf, -math.inf, 0.25, 0.0, -0.0, *_edges(dtype)]
    value = st.one_of(st.floats(-30.0, 0.0), st.sampled_from(special)) if draw(st.booleans()) else st.floats(-30, 0)
    trainer = np.array(draw(st.lists(value, min_size=tokens, max_size=tokens)), dtype=dtype)
    rollout = np.array(draw(st.lists(value, min_size=tokens, max_size=tokens)), dtype=dtype)
    mask_dtype = draw(st.sampled_from([None, np.bool_, np.int8, np.uint8, np.int32, np.int64]))
    mask = None
    if mask_dtype is not None:
        choices = [0, 1] if mask_dtype is np.bool_ else [0, 1, 1, 1, 2] + ([-1] if mask_dtype in (np.int8,) else [])
        mask = np.array(draw(st.lists(st.sampled_from(choices), min_size=tokens, max_size=tokens)), dtype=mask_dtype)
    rows = len(lengths)
    return Block(
        file="memory",
        file_row=np.arange(rows, dtype=np.int64),
        step=np.zeros(rows, dtype=np.int64),
        sample_id=[str(i) for i in range(rows)],
        lengths=np.array(lengths, dtype=np.int64),
        trainer=trainer,
        rollout=rollout,
        mask=mask,
        names={"trainer": "old_log_probs", "rollout": "rollout_log_probs", "mask": "response_mask"},
    )


def _unscanned_tensors(block: Block) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What DumpReader._chunk builds without the scan."""
    trainer = torch.tensor(block.trainer, dtype=torch.float64)
    rollout = torch.tensor(block.rollout, dtype=torch.float64)
    mask = torch.ones(len(block.trainer), dtype=torch.bool) if block.mask is None else torch.tensor(block.mask == 1)
    trainer.masked_fill_(~mask, 0.0)
    rollout.masked_fill_(~mask, 0.0)
    return trainer, rollout, mask


@settings(max_examples=300, deadline=None)
@given(blocks())
def test_the_scan_passes_exactly_the_blocks_the_exact_check_passes(block):
    log = ReadLog()
    with use_engine("numba"):
        scanned = scanned_values(block, "cpu")
    validated = validate_block(block, log, strict=False)
    exact_clean = not log.skipped and validated is block
    assert (scanned is not None) == exact_clean
    if scanned is not None:
        for values, theirs in zip(scanned, _unscanned_tensors(block), strict=True):
            mine = torch.from_numpy(values)
            assert mine.dtype == theirs.dtype
            assert torch.equal(mine, theirs)
            # bit for bit: zeroed environment tokens are +0.0, as masked_fill writes them
            if mine.dtype == torch.float64:
                assert torch.equal(mine.view(torch.int64), theirs.view(torch.int64))


def test_the_torch_engine_and_other_dtypes_take_the_exact_path():
    block = Block(
        file="memory",
        file_row=np.zeros(1, dtype=np.int64),
        step=np.zeros(1, dtype=np.int64),
        sample_id=["0"],
        lengths=np.array([2], dtype=np.int64),
        trainer=np.array([-1.0, -2.0]),
        rollout=np.array([-1.0, -2.0]),
        mask=np.array([1, 1], dtype=np.int8),
    )
    assert scanned_values(block, "cpu") is not None
    assert scanned_values(_with(block, trainer=block.trainer.astype(np.float16)), "cpu") is None
    assert scanned_values(_with(block, mask=np.array([1.0, 1.0])), "cpu") is None
    assert scanned_values(block, "meta") is None


def test_the_torch_engines_reader_never_scans(tmp_path, monkeypatch):
    """The reader scans only the numba engine's chunks (the engine it chose for the input, stamped on each chunk)."""
    import rollout_diag.io.reader as reader_module

    path = tmp_path / "dump.parquet"
    pq.write_table(pa.table({"step": [0], "rollout_log_probs": [[-1.0, -2.0]], "old_log_probs": [[-1.5, -2.0]]}), path)
    calls = []
    monkeypatch.setattr(reader_module, "scanned_values", lambda block, device_type: calls.append(1))
    for engine, scans in (("torch", 0), ("numba", 1)):
        calls.clear()
        with use_engine(engine):
            chunks = [chunk for chunk, _ in DumpReader(str(path)).chunks("cpu", prefetch=0)]
        assert [chunk.engine for chunk in chunks] == [engine] and len(calls) == scans


def _with(block: Block, **changes) -> Block:
    return Block(**{**block.__dict__, **changes})


# (how row 1 is spoiled: column, position, value)
SPOILS = [
    ("old_log_probs", 2, math.nan),
    ("old_log_probs", 0, None),
    ("rollout_log_probs", 2, math.inf),
    ("rollout_log_probs", 1, -math.inf),
    ("rollout_log_probs", 1, 0.25),
    ("old_log_probs", 2, 2e-6),
    ("response_mask", 1, 2),
    ("response_mask", 2, -1),
]


def _dump(path: Path, spoil: tuple[str, int, float | None], mask_type: pa.DataType) -> Path:
    rows = [
        {
            "step": 0,
            "sample_id": f"s{i}",
            "rollout_log_probs": [-0.5, -1.0, -1.5, -2.0],
            "old_log_probs": [-0.6, -1.1, -1.4, -2.0],
            "response_mask": [1, 1, 1, 0],
        }
        for i in range(4)
    ]
    column, position, value = spoil
    rows[1][column] = [value if k == position else v for k, v in enumerate(rows[1][column])]
    schema = pa.schema(
        [
            ("step", pa.int64()),
            ("sample_id", pa.string()),
            ("rollout_log_probs", pa.list_(pa.float32())),
            ("old_log_probs", pa.list_(pa.float32())),
            ("response_mask", pa.list_(mask_type)),
        ]
    )
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


def _read(path: Path, engine: str, strict: bool) -> tuple[list[tuple], list[float]]:
    with use_engine(engine):
        reader = DumpReader([str(path)], strict=strict)
        sums = [float(chunk.trainer.sum()) for chunk, _ in reader.chunks(CPU, prefetch=0)]
    return [(r.file, r.row, r.column, r.reason) for r in reader.log.skipped], sums


@pytest.mark.parametrize("spoil", SPOILS, ids=[f"{c}-{v}" for c, _, v in SPOILS])
@pytest.mark.parametrize("mask_type", [pa.int8(), pa.int64()], ids=["int8", "int64"])
def test_bad_values_give_the_same_records_and_errors_with_and_without_the_scan(tmp_path, spoil, mask_type):
    path = _dump(tmp_path / "dump.parquet", spoil, mask_type)
    records, sums = _read(path, "numba", strict=False)
    assert (records, sums) == _read(path, "torch", strict=False)
    assert [(row, column) for _, row, column, _ in records] == [(1, spoil[0])]
    errors = []
    for engine in ("numba", "torch"):
        with pytest.raises(DataError) as caught:
            _read(path, engine, strict=True)
        errors.append(str(caught.value))
    assert errors[0] == errors[1]
    assert f"{path}: row 1, column '{spoil[0]}': " in errors[0]
    assert "\n" not in errors[0]
