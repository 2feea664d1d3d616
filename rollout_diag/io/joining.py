"""Small validated blocks joined into one chunk, in reading order (:class:`Joiner`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from rollout_diag.io.decode import MAX_BLOCK_STEPS, Block, ExtraColumn
from rollout_diag.io.packing import Valid, host_values

# A validated block under chunk_tokens / JOIN_BELOW tokens is joined with the small blocks after it (of the same file
# or the next ones) into one chunk of up to chunk_tokens. Every chunk costs the families a fixed ~2.7 ms of numpy calls
# (2-core VM), so a directory dump of one small file per step and rank (DumpWriter's, prime-rl's) paid it per file:
# 10M tokens in 184 files of 54K took 1.6-1.8 s against 0.9-1.1 s in one file (docs/benchmarks.md, session 13).
JOIN_BELOW = 4


class Joiner:
    """Joins consecutive small validated blocks into one, in reading order: ``add`` returns the items now ready to
    become chunks, ``flush`` the rest at the end. A joined block holds at most ``chunk_tokens`` tokens and
    ``MAX_BLOCK_STEPS`` runs of one step (``decode.split_steps``); blocks whose optional columns do not line up
    (``_joinable``) are not joined. Joining moves chunk boundaries only: results stay within the accumulators'
    chunking contract, and rows keep their order, files and row numbers."""

    def __init__(self, chunk_tokens: int) -> None:
        self.limit = chunk_tokens
        self.small = max(1, chunk_tokens // JOIN_BELOW)
        self.pending: list[tuple[Valid, int]] = []
        self.tokens = 0
        self.runs = 0  # runs of one step in the pending blocks, joined

    def add(self, valid: Valid, consumed: int) -> list[tuple[Valid, int]]:
        tokens = int(valid.offsets[-1])
        if tokens >= self.small:
            return [*self.flush(), (valid, consumed)]
        step = valid.block.step
        runs = step_runs(step)
        ready: list[tuple[Valid, int]] = []
        if self.pending:
            last = self.pending[-1][0].block.step
            going_on = bool(len(last) and len(step) and last[-1] == step[0])  # a step going on across the two
            if (
                self.tokens + tokens > self.limit
                or self.runs + runs - going_on > MAX_BLOCK_STEPS
                or not _joinable(self.pending[0][0].block, valid.block)
                or self.pending[0][0].float32 != valid.float32  # one way to compare the logprobs per chunk
            ):
                ready = self.flush()
            else:
                runs -= going_on
        self.pending.append((valid, consumed))
        self.tokens += tokens
        self.runs += runs
        return ready

    def flush(self) -> list[tuple[Valid, int]]:
        pending, self.pending, self.tokens, self.runs = self.pending, [], 0, 0
        if len(pending) <= 1:
            return pending
        return [(joined([valid for valid, _ in pending]), pending[-1][1])]


def step_runs(step: np.ndarray) -> int:
    """Runs of one step in a block's step column."""
    return int(np.count_nonzero(step[1:] != step[:-1])) + 1 if len(step) else 0


def _column_type(values: ExtraColumn | pa.Array | pa.ChunkedArray | None) -> pa.DataType | np.dtype | None:
    """What two blocks' optional column must share to be joined: its Arrow type or numpy dtype; None when absent."""
    if values is None:
        return None
    if isinstance(values, np.ndarray):
        return values.dtype
    arrow: pa.Array = getattr(values, "array", values)  # an Arrow array, or an extra column's (decode._ArrowValues)
    return arrow.type


def _joinable(first: Block, block: Block) -> bool:
    """Whether ``block`` can join ``first`` in one chunk: the same optional columns (token ids and text, policy
    version by the same name, the extra columns in the same order), of the same types."""
    if list(first.extra) != list(block.extra) or first.names.get("policy_version") != block.names.get("policy_version"):
        return False
    if {r: _column_type(v) for r, v in first.token_columns.items()} != {
        r: _column_type(v) for r, v in block.token_columns.items()
    }:
        return False
    return all(
        _column_type(getattr(first, name)) == _column_type(getattr(block, name))
        for name in ("token_ids", "token_text", "policy_version")
    ) and all(_column_type(values) == _column_type(block.extra[name]) for name, values in first.extra.items())


def _arrow_joined(parts: Sequence[pa.Array | pa.ChunkedArray]) -> pa.Array:
    return pa.concat_arrays([c for p in parts for c in (p.chunks if isinstance(p, pa.ChunkedArray) else [p])])


def joined(parts: Sequence[Valid]) -> Valid:
    """Validated blocks (``_joinable``, in reading order) as one: rows concatenated, each keeping its file and row."""
    blocks = [valid.block for valid in parts]
    first = blocks[0]

    def joined_column(name: str) -> np.ndarray | None:
        values = [getattr(block, name) for block in blocks]
        return None if values[0] is None else np.concatenate(values)

    def joined_extra(values: list[ExtraColumn]) -> ExtraColumn:  # all numpy, or all decode._ArrowValues
        first = values[0]
        if isinstance(first, np.ndarray):
            return np.concatenate([v for v in values if isinstance(v, np.ndarray)])
        return type(first)(_arrow_joined([v.array for v in values if not isinstance(v, np.ndarray)]))

    lengths = np.concatenate([block.lengths for block in blocks])
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    host = [host_values(valid) for valid in parts]
    block = Block(
        file=first.file,
        file_row=np.concatenate([block.file_row for block in blocks]),
        step=np.concatenate([block.step for block in blocks]),
        sample_id=[sample for block in blocks for sample in block.sample_id],
        lengths=lengths,
        trainer=None,  # type: ignore[arg-type]  # the values are the joined ``scanned`` arrays
        rollout=None,  # type: ignore[arg-type]
        mask=None,
        token_ids=joined_column("token_ids"),
        token_text=None if first.token_text is None else _arrow_joined([block.token_text for block in blocks]),
        policy_version=joined_column("policy_version"),
        names=first.names,
        extra={name: joined_extra([block.extra[name] for block in blocks]) for name in first.extra},
        token_columns={
            role: np.concatenate([block.token_columns[role] for block in blocks]) for role in first.token_columns
        },
    )
    scanned = tuple(np.concatenate([values[i] for values in host]) for i in range(3))
    files = [name for valid in parts for name in (valid.files or [valid.block.file] * len(valid.block.lengths))]
    keys = [valid.row_keys for valid in parts if valid.row_keys is not None]
    joined_keys = np.concatenate(keys) if len(keys) == len(parts) else None
    return Valid(block, offsets, scanned, files=files, float32=parts[0].float32, row_keys=joined_keys)  # type: ignore[arg-type]
