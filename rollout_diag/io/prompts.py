"""A prompt's identity: one 64-bit key per row, the same for every row (and every run) that saw the same prompt.

Two sources, the first that the dump has:
- a ``prompt_id`` column (``io/columns.py``: ``prompt_id``, ``prompt_hash``, ``prompt_uid``, ``group_id``, ``uid``,
  or ``--column prompt_id=NAME``), integers or text: the key is a hash of the value's text (``5`` and ``"5"`` give one
  key), so that two runs, or two dumps that spell the id with different types, match;
- else, in a full-sequence layout with token ids and a mask, the token ids before the row's first model token (the
  prompt the engine prefilled): a hash of that prefix. Rows that start with a model token have no prompt here.

Keys are int64 (the 64 bits of the hash); ``NO_PROMPT`` (0) marks a row without one (a null id, no prefix). Two
different prompts share a key with probability about 2^-64 per pair. Pure numpy and hashlib: no metric, no I/O.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

NO_PROMPT = 0
COLUMN_SOURCE = "column"
TOKENS_SOURCE = "token ids before the first model token"

# The token-prefix hash: Σ_t (id_t + 1)·P^t mod 2^64 over the prefix, then its length folded in and splitmix64's
# finaliser, all in wrapping uint64 arithmetic (the same bits on any machine). P: an odd 64-bit constant.
_BASE = np.uint64(0x9E3779B97F4A7C15)
_LENGTH_SALT = np.uint64(0xD6E8FEB86659FD93)
_powers = np.ones(1, dtype=np.uint64)


def text_key(value: Any) -> int:
    """The key of one prompt id (its ``str()``, UTF-8): the first 8 bytes of its BLAKE2b digest as a signed int64,
    never ``NO_PROMPT``."""
    text = value if isinstance(value, str) else str(value)
    key = int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")
    key = key - (1 << 64) if key >= 1 << 63 else key
    return key or 1


def column_keys(values: pa.Array | pa.ChunkedArray | np.ndarray) -> tuple[np.ndarray, int]:
    """(int64 key per row, rows with a null id) of a prompt-id column's values; a null's key is ``NO_PROMPT``.
    Each distinct value is hashed once."""
    array = pa.array(values) if isinstance(values, np.ndarray) else values
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if pa.types.is_dictionary(array.type):
        array = array.cast(array.type.value_type)
    encoded = pc.dictionary_encode(array)
    keys = np.array([text_key(value) for value in encoded.dictionary.to_pylist()] + [NO_PROMPT], dtype=np.int64)
    indices = encoded.indices.fill_null(len(keys) - 1).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return keys[indices], int(array.null_count)


def _power_table(length: int) -> np.ndarray:
    """P^0 … P^(length − 1) in wrapping uint64 arithmetic (kept and grown between calls)."""
    global _powers
    if _powers.shape[0] < length:
        grown = np.full(max(length, 2 * _powers.shape[0]), _BASE, dtype=np.uint64)
        grown[0] = 1
        _powers = np.multiply.accumulate(grown)
    return _powers[:length]


def _mixed(values: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser (wrapping uint64)."""
    z = values.copy()
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z


def prefix_lengths(mask: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per row, the tokens before its first model token (the whole row when it has none)."""
    starts, ends = offsets[:-1], offsets[1:]
    model = np.flatnonzero(mask)
    if model.size == 0:
        return (ends - starts).astype(np.int64)
    found = np.searchsorted(model, starts)  # the first model token at or after each row's start
    first = np.where(found < model.size, model[np.minimum(found, model.size - 1)], ends)
    return (np.minimum(first, ends) - starts).astype(np.int64)


def token_prefix_keys(token_ids: np.ndarray, mask: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """int64 key per row of the token ids before its first model token; ``NO_PROMPT`` for a row that starts with a
    model token. ``mask``: bool per token (True: model token); ``offsets``: int64 [R + 1] row starts."""
    rows = offsets.shape[0] - 1
    lengths = prefix_lengths(np.asarray(mask, dtype=bool), offsets)
    keys = np.zeros(rows, dtype=np.int64)
    has = lengths > 0
    if not has.any():
        return keys
    starts = offsets[:-1][has]
    kept = lengths[has]
    # the prefix tokens, row after row: position within the prefix and the token index
    position = np.arange(int(kept.sum()), dtype=np.int64) - np.repeat(np.cumsum(kept) - kept, kept)
    index = np.repeat(starts, kept) + position
    terms = (token_ids[index].astype(np.uint64) + np.uint64(1)) * _power_table(int(kept.max()))[position]
    sums = np.add.reduceat(terms, np.concatenate([[0], np.cumsum(kept)[:-1]]).astype(np.int64))
    hashed = _mixed(sums ^ (kept.astype(np.uint64) * _LENGTH_SALT)).view(np.int64)
    keys[has] = np.where(hashed == NO_PROMPT, 1, hashed)
    return keys
