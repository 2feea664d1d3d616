"""NeMo-RL ``train_data_step<N>.jsonl`` (GRPO writes it unless ``env.should_log_nemo_gym_responses`` is set).

Read from NVIDIA-NeMo/RL at commit 7ea279abfbeb698b092856d0dab61e7cf39bc909:
- ``nemo_rl/algorithms/grpo.py`` logs ``input_lengths``, ``token_ids``, ``token_loss_mask`` (the train
  data's ``token_mask``), ``sample_loss_mask`` (``sample_mask``), ``advantages``, ``generation_logprobs``
  and ``prev_logprobs`` to ``train_data_step{total_steps + 1}.jsonl`` in the log directory: steps are
  1-based and only in the file name.
- ``nemo_rl/utils/logger.py`` ``log_batched_dict_as_jsonl`` writes one line per sample from
  ``make_microbatch_iterator(1)``: every field is a length-1 batch list (``[[...]]`` for per-token
  fields, ``[n]`` for scalars), plus the sample's ``idx``; ``json.dumps`` with its default
  ``allow_nan=True``, so non-finite values appear as bare ``NaN``/``Infinity``/``-Infinity``, which
  Python's json reads (strict readers do not).
- Rows are right-padded to the batch's longest: trimmed here to ``input_lengths``.
- The loss, and ``token_mult_prob_error``, use ``token_mask[:, 1:] * sample_mask`` against
  ``prev_logprobs[:, 1:]``: position 0 holds a placeholder logprob of 0 (``lm_policy.get_logprobs``), so
  it is never a trained token here; a filtered sample (sample mask 0) keeps token mask 1s and has none.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from rollout_diag.io.formats.base import (
    FastLines,
    ParsedLines,
    Row,
    RowsFile,
    canonical_batch,
    jsonl_file,
    list_lengths,
    null_flags,
    number_in,
    only_items,
    prefixes,
    row_any,
)
from rollout_diag.io.formats.registry import TrainerFormat, register

NAME = "nemo-rl"
FILE_GLOB = "train_data_step*.jsonl"
REQUIRED_FIELDS = ("generation_logprobs", "prev_logprobs", "token_loss_mask", "input_lengths")


def looks_like(record: dict[str, Any]) -> bool:
    """A first record of this format: batch-wrapped generation and trainer logprobs."""
    value = record.get("generation_logprobs")
    return "prev_logprobs" in record and isinstance(value, list) and bool(value) and isinstance(value[0], list)


def step_of(path: Path) -> int | None:
    return number_in(path.name, r"^train_data_step(\d+)\.jsonl$")


def open_file(path: str, fast: bool = True) -> RowsFile:
    """The file's rows; ``fast=False`` reads every line with Python's json (the reference the fast path equals)."""
    return jsonl_file(path, step_of(Path(path)) or 0, _row, FAST if fast else None)


def _unwrap(record: dict[str, Any], field: str) -> Any:
    """The sample's value of a length-1 batch list; raises ValueError when the field is not one."""
    value = record.get(field)
    if not isinstance(value, list) or len(value) != 1:
        raise ValueError("missing" if field not in record else "not a length-1 batch list")
    return value[0]


class _Unreadable(Exception):
    """A line that is no row: the reason, and the field it lies in (None: the line as a whole)."""

    def __init__(self, reason: str, field: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.field = field


def _row(line: str, line_index: int, step: int) -> Row:
    sample_id = f"line{line_index + 1}"
    try:
        record = _record(line)
        if isinstance(record.get("idx"), int):
            sample_id = str(record["idx"])
        return _sample_row(record, step, sample_id)
    except _Unreadable as exc:
        return Row.unreadable(step, sample_id, exc.reason, exc.field)


def _record(line: str) -> dict[str, Any]:
    """The line's JSON object; raises _Unreadable for a blank line, bad JSON or another JSON value."""
    if not line.strip():
        raise _Unreadable("blank line")
    try:
        record = json.loads(line)  # accepts NaN / Infinity, as NeMo-RL writes them
    except ValueError as exc:
        raise _Unreadable(f"not JSON ({exc.args[0] if exc.args else exc})") from None
    if not isinstance(record, dict):
        raise _Unreadable("not a JSON object")
    return record


def _sample_row(record: dict[str, Any], step: int, sample_id: str) -> Row:
    """The row of one sample's record, its lists cut to ``input_lengths``; raises _Unreadable naming the field."""
    values = _fields(record)
    length = values["input_lengths"]
    if not isinstance(length, int) or length < 0:
        raise _Unreadable(f"input length {length!r} is not a count", "input_lengths")
    for field in ("generation_logprobs", "prev_logprobs", "token_loss_mask"):
        if not isinstance(values[field], list) or len(values[field]) < length:
            raise _Unreadable(f"shorter than input_lengths {length} (or not a list)", field)
    try:
        token_mask = np.asarray(values["token_loss_mask"][:length], dtype=float)
        sample_mask = float(values.get("sample_loss_mask", 1.0))
    except (TypeError, ValueError):
        raise _Unreadable("mask values are not numbers", "token_loss_mask") from None
    mask = token_mask * sample_mask
    if length:
        mask[0] = 0.0  # position 0's logprob is a placeholder (NeMo-RL slices [:, 1:])
    token_ids = values.get("token_ids")
    return Row(
        step=step,
        sample_id=sample_id,
        rollout=values["generation_logprobs"][:length],
        trainer=values["prev_logprobs"][:length],
        mask=_as_mask(mask),
        token_ids=token_ids[:length] if isinstance(token_ids, list) else None,
    )


def _fields(record: dict[str, Any]) -> dict[str, Any]:
    """Each field's sample value (the optional ones where present); raises _Unreadable for one not a batch list."""
    values: dict[str, Any] = {}
    for field in (*REQUIRED_FIELDS, "sample_loss_mask", "token_ids"):
        if field not in record and field in ("sample_loss_mask", "token_ids"):
            continue
        try:
            values[field] = _unwrap(record, field)
        except ValueError as exc:
            raise _Unreadable(str(exc), field) from None
    return values


def _as_mask(mask: np.ndarray) -> np.ndarray | list:
    """int8 0/1, or the float values when one is neither (the reader then names the bad value)."""
    if np.all((mask == 0) | (mask == 1)):
        return mask.astype(np.int8)
    return np.where(mask == 0, 0, np.where(mask == 1, 1, 2)).astype(np.int8)  # 2: not a mask value


# ------------------------------------------------------------------ the fast path (io/formats/base.py FastLines)
_LOGPROBS = ("generation_logprobs", "prev_logprobs")
_FAST_SCHEMA = pa.schema(
    [
        ("input_lengths", pa.list_(pa.int64())),
        ("token_loss_mask", pa.list_(pa.list_(pa.float64()))),
        ("sample_loss_mask", pa.list_(pa.float64())),
        ("generation_logprobs", pa.list_(pa.list_(pa.float64()))),
        ("prev_logprobs", pa.list_(pa.list_(pa.float64()))),
        ("token_ids", pa.list_(pa.list_(pa.int64()))),
        ("idx", pa.int64()),
    ]
)


def _fast_rows(parsed: ParsedLines, step: int) -> tuple[pa.RecordBatch, np.ndarray]:
    """The rows ``_row`` would give, for the lines where that is certain (the others are left to ``_row``)."""
    columns = parsed.columns
    ok = np.ones(parsed.rows, dtype=bool)
    for field in (*_LOGPROBS, "token_loss_mask", "input_lengths"):
        ok &= list_lengths(columns[field]) == 1
    absent = {}
    for field in ("sample_loss_mask", "token_ids"):
        lengths = list_lengths(columns[field])
        absent[field] = lengths == -1
        ok &= absent[field] | (lengths == 1)
        ok &= ~parsed.written_null[field]  # an explicit null is "not a length-1 batch list"
    # every list left is a length-1 batch list (or an absent optional one): take its one item
    some = pa.array(ok)
    every = ok.all()  # the usual block: no filter, which would copy every list
    first = {
        name: only_items(columns[name] if every else columns[name].filter(some))
        for name in _FAST_SCHEMA.names
        if name != "idx"
    }
    length = first["input_lengths"].fill_null(-1).to_numpy(zero_copy_only=False)
    good = length >= 0
    for field in (*_LOGPROBS, "token_loss_mask"):
        good &= list_lengths(first[field]) >= length
    good &= ~row_any(first["token_loss_mask"], null_flags(first["token_loss_mask"].values))
    sample_absent = absent["sample_loss_mask"][ok]
    good &= sample_absent | first["sample_loss_mask"].is_valid().to_numpy(zero_copy_only=False)
    ok[np.flatnonzero(ok)[~good]] = False

    if not good.all():
        keep = pa.array(good)
        first = {name: array.filter(keep) for name, array in first.items()}
    length = length[good]
    rollout, trainer = (prefixes(first[field], length) for field in _LOGPROBS)
    token_mask = prefixes(first["token_loss_mask"], length).values.to_numpy(zero_copy_only=False)
    sample_mask = first["sample_loss_mask"].fill_null(1.0).to_numpy(zero_copy_only=False)
    if (sample_mask == 1.0).all():  # x * 1.0 is x (NaN and -0.0 included)
        mask = np.array(token_mask, dtype=np.float64)
    else:
        mask = token_mask * np.repeat(sample_mask, length)
    starts = np.cumsum(length) - length
    mask[starts[length > 0]] = 0.0  # position 0's logprob is a placeholder (NeMo-RL slices [:, 1:])
    ones = mask == 1
    if (ones | (mask == 0)).all():
        mask_values = ones.view(np.int8)
    else:
        mask_values = np.where(mask == 0, 0, np.where(ones, 1, 2)).astype(np.int8)  # as _as_mask
    token_ids = prefixes(first["token_ids"], length, nulls=first["token_ids"].is_null().to_numpy(zero_copy_only=False))
    idx = (columns["idx"] if ok.all() else columns["idx"].filter(pa.array(ok))).to_pylist()
    lines = parsed.lines[ok].tolist()
    sample_ids = [f"line{line + 1}" if value is None else str(value) for value, line in zip(idx, lines, strict=True)]
    batch = canonical_batch(
        pa.array(np.full(len(sample_ids), step, dtype=np.int64)),
        sample_ids,
        rollout,
        trainer,
        pa.ListArray.from_arrays(rollout.offsets, pa.array(mask_values)),
        token_ids,
    )
    return batch, ok


FAST = FastLines(_FAST_SCHEMA, _fast_rows)


register(
    TrainerFormat(
        name=NAME,
        suffix=".jsonl",
        described="train_data_stepN.jsonl",
        step_of=step_of,
        open_file=lambda path, trust_pickle: open_file(path),
        order=20,
        by_name=lambda path: step_of(path) is not None,
        by_content=lambda path, peek: peek.first_record is not None and looks_like(peek.first_record),
    )
)
