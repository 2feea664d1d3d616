"""Validating a decoded block: rows whose model tokens hold NaN/inf, positive logprobs, bad masks or ragged lists
are skipped and recorded (``--strict`` makes the first one an error naming file, row and column)."""

from __future__ import annotations

import math

import numpy as np

from rollout_diag.catalogue import FILL_LOGPROB
from rollout_diag.io.decode import Block, drop_rows
from rollout_diag.io.readlog import ReadLog
from rollout_diag.results import FILL_VALUES_KEPT, FillCount, RowRef, SkippedRow

MAX_POSITIVE_LOGPROB = 1e-6  # logprobs above this are not logprobs (float noise of log(1) stays below)


# ---------------------------------------------------------------------------------- validation
def validate_block(block: Block, log: ReadLog, strict: bool) -> Block | None:
    """Skip (and record, in file-row order) rows with a bad mask value, or NaN/inf/positive logprobs on model
    tokens, besides those already found while decoding (null lists, ragged rows, duplicate positions)."""
    rows = len(block.lengths)
    token_row = np.repeat(np.arange(rows), block.lengths)
    offsets = np.concatenate([[0], np.cumsum(block.lengths)])
    bad_row = np.zeros(rows, dtype=bool)
    records = [(record, 0) for record in block.skipped]  # rows skipped while decoding: their lists were not read
    mask = block.mask
    model = np.ones(len(token_row), dtype=bool) if mask is None else mask == 1
    model_tokens = np.bincount(token_row, weights=model, minlength=rows).astype(np.int64)

    def flag(bad_token: np.ndarray, role: str, describe) -> None:
        for token in np.flatnonzero(bad_token):
            row = int(token_row[token])
            if bad_row[row]:
                continue
            bad_row[row] = True
            # token layout: the row that holds the bad token; sequence layout: the sequence's row
            file_row = int(block.file_row[row] if block.token_rows is None else block.token_rows[token])
            reason = describe(token, int(token - offsets[row]))
            records.append(
                (SkippedRow(block.file, file_row, block.names.get(role, role), reason), int(model_tokens[row]))
            )

    if mask is not None:
        flag(
            (mask != 0) & (mask != 1),
            "mask",
            lambda t, p: f"mask value {_fmt(mask[t])} at position {p} (must be 0 or 1)",
        )
    for role, values in (("trainer", block.trainer), ("rollout", block.rollout)):
        with np.errstate(invalid="ignore"):
            nonfinite = model & ~np.isfinite(values)
            positive = model & (values > MAX_POSITIVE_LOGPROB)
        flag(nonfinite, role, lambda t, p, v=values: f"{_fmt(v[t])} logprob at position {p}")
        flag(
            positive,
            role,
            lambda t, p, v=values: f"positive logprob {_fmt(v[t])} at position {p} (logprobs are ≤ 0)",
        )
    for record, tokens in sorted(records, key=lambda item: -1 if item[0].row is None else item[0].row):
        log.skip(record, strict, tokens, block.names)  # under --strict the first (lowest) row raises
    if bad_row.any():
        block = drop_rows(block, np.flatnonzero(bad_row))
    return block if len(block.lengths) else None


def count_fills(block: Block, role: str, values: np.ndarray, mask: np.ndarray | None) -> FillCount | None:
    """The model tokens of ``role`` in a validated ``block`` whose logprob is a fill value (``FILL_LOGPROB`` or
    below; ``values``: that side's logprobs, ``mask``: None when environment tokens are already 0). None when there
    is none: one min over the values decides that for almost every block."""
    with np.errstate(invalid="ignore"):
        if not len(values) or values.min() > FILL_LOGPROB:
            return None
        filled = values <= FILL_LOGPROB
    if mask is not None:
        filled &= mask == 1
    tokens = np.flatnonzero(filled)
    if not tokens.size:
        return None
    offsets = np.concatenate([[0], np.cumsum(block.lengths)])
    token_row = np.searchsorted(offsets, tokens, side="right") - 1
    found, counts = np.unique(values[tokens], return_counts=True)
    commonest = np.argsort(-counts, kind="stable")[:FILL_VALUES_KEPT]
    first, row = int(tokens[0]), int(token_row[0])
    # token layout: the file row that holds the token; sequence layout: the sequence's row
    file_row = int(block.file_row[row] if block.token_rows is None else block.token_rows[first])
    example = RowRef(int(block.step[row]), str(block.sample_id[row]), block.file, file_row, float(first - offsets[row]))
    return FillCount(
        block.names.get(role, role),
        int(tokens.size),
        int(np.unique(token_row).size),
        {float(found[k]): int(counts[k]) for k in commonest},
        example,
    )


def _fmt(value: float | np.floating | np.integer | np.ndarray) -> str:
    value = float(value)
    if math.isnan(value):
        return "NaN (or null)"
    if math.isinf(value):
        return "+inf" if value > 0 else "-inf"
    return f"{value:g}"
