"""A validated block (:class:`Valid`) and what the reader packs of it into a chunk (``io/chunk.py``): its logprob
arrays from the compiled validation scan where it ran (:func:`scanned_values`), else converted here; its arrays as
numpy (the numba engine) or as torch tensors on a device; its prompt keys (``io/prompts.py``), extra columns and
token text."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

import numpy as np
import pyarrow as pa

from rollout_diag.engine.arrays import Array
from rollout_diag.io import prompts
from rollout_diag.io.decode import Block, ExtraColumn
from rollout_diag.io.validate import MAX_POSITIVE_LOGPROB

if TYPE_CHECKING:  # torch is imported when the first chunk is built
    from rollout_diag.engine.kernels.prepass import KernelPrepass


class ChunkColumns(TypedDict):
    """A chunk's arrays (``io/chunk.py`` ``Chunk``'s fields of these names): numpy, or torch tensors on one device."""

    step: Array
    offsets: Array
    trainer: Array
    rollout: Array
    mask: Array
    token_ids: Array | None
    policy_version: Array | None
    token_columns: Mapping[str, Array]


def is_narrow(block: Block) -> bool:
    """Whether either logprob column of ``block`` is float32 or narrower (then its values compare as float32)."""
    return any(values.dtype.kind == "f" and values.dtype.itemsize <= 4 for values in (block.trainer, block.rollout))


def numpy_columns(valid: Valid) -> ChunkColumns:
    """A chunk's arrays as numpy (the numba engine): the scan's where it ran, else copies (Arrow's buffers are
    read-only, and the fill below writes in place)."""
    block = valid.block
    trainer, rollout, mask = host_values(valid)
    return {
        "step": np.array(block.step, dtype=np.int64),
        "offsets": valid.offsets,
        "trainer": trainer,
        "rollout": rollout,
        "mask": mask,
        "token_ids": None if block.token_ids is None else np.array(block.token_ids),
        "policy_version": None if block.policy_version is None else np.array(block.policy_version),
        "token_columns": {role: np.array(values) for role, values in block.token_columns.items()},
    }


def tensor_columns(valid: Valid, device: str) -> ChunkColumns:
    """A chunk's arrays as torch tensors on ``device`` (the torch engine)."""
    import torch

    block = valid.block
    if valid.scanned is not None:
        # the scan's arrays (zero-copy on the CPU); elsewhere copied, the values the torch path builds
        trainer, rollout, mask = (torch.from_numpy(values).to(device) for values in valid.scanned)
    else:
        # torch.tensor copies: Arrow's buffers are read-only, and the fill below writes in place.
        trainer = torch.tensor(block.trainer, dtype=torch.float64, device=device)
        rollout = torch.tensor(block.rollout, dtype=torch.float64, device=device)
        if block.mask is None:
            mask = torch.ones(len(block.trainer), dtype=torch.bool, device=device)
        else:
            mask = torch.tensor(block.mask == 1, device=device)
        # Environment tokens never enter a metric; zero them so NaN fill values there cannot leak in.
        trainer.masked_fill_(~mask, 0.0)
        rollout.masked_fill_(~mask, 0.0)
    return {
        "step": torch.tensor(block.step, dtype=torch.int64, device=device),
        "offsets": torch.from_numpy(valid.offsets).to(device),
        "trainer": trainer,
        "rollout": rollout,
        "mask": mask,
        "token_ids": None if block.token_ids is None else torch.tensor(block.token_ids, device=device),
        "policy_version": None if block.policy_version is None else torch.tensor(block.policy_version, device=device),
        "token_columns": {role: torch.tensor(values, device=device) for role, values in block.token_columns.items()},
    }


@dataclass
class Valid:
    """A validated block before it is a Chunk: numpy arrays only (``DumpReader.validated``)."""

    block: Block
    offsets: np.ndarray  # int64 [R + 1]
    scanned: tuple[np.ndarray, np.ndarray, np.ndarray] | None  # the scan's (trainer, rollout, mask), if it ran
    prepass: KernelPrepass | None = None  # the compiled passes, when read ahead of torch
    files: list[str] | None = None  # each row's file, where blocks of several files were joined (else block.file)
    float32: bool = False  # either logprob column was float32 or narrower (``Chunk.float32``)
    row_keys: np.ndarray | None = None  # uint64 [R]: io.readlog.row_keys of each row (``Chunk.row_key``)


def host_values(valid: Valid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(trainer, rollout, mask) of a validated block as the numba engine's numpy chunk holds them: the scan's where it
    ran, else float64 copies (Arrow's buffers are read-only, and the fill below writes in place)."""
    if valid.scanned is not None:
        return valid.scanned
    block = valid.block
    trainer = np.array(block.trainer, dtype=np.float64)
    rollout = np.array(block.rollout, dtype=np.float64)
    mask = np.ones(len(trainer), dtype=bool) if block.mask is None else np.asarray(block.mask == 1)
    # Environment tokens never enter a metric; zero them so NaN fill values there cannot leak in.
    trainer[~mask] = 0.0
    rollout[~mask] = 0.0
    return trainer, rollout, mask


def scanned_values(block: Block, device_type: str) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(trainer, rollout, mask) arrays of a clean block from one compiled scan that converts, zeroes environment
    tokens and flags bad values at once (the numba engine's CPU chunks; ``kernels.cpu.checked_model_values``): the
    values ``DumpReader.built_chunk`` builds otherwise, as numpy (no torch). None where the scan does not apply
    (another device, a dtype it is not compiled for) or where it flags anything: ``validate_block`` then finds the rows
    and records them with its messages, exactly as without the scan."""
    from rollout_diag.engine.kernels import compiled

    trainer, rollout, mask = block.trainer, block.rollout, block.mask
    if device_type != "cpu" or not len(block.lengths):
        return None
    if trainer.dtype != rollout.dtype or trainer.dtype not in (np.float32, np.float64):
        return None
    if mask is not None and mask.dtype.kind not in "biu":
        return None
    kernels = compiled()
    # numpy compares a float32 array with the tolerance rounded to float32; as float64 that bound is exact
    limit = float(trainer.dtype.type(MAX_POSITIVE_LOGPROB))
    # one compiled scan per logprob dtype and mask width (kernels.cpu.SIGNATURES): the inputs as read-only views
    # (Arrow's buffers are, a converted column is not; numba compiles each mix anew)
    trainer, rollout = readonly(trainer), readonly(rollout)
    if mask is None:
        trainer, rollout, clean = kernels.checked_values(trainer, rollout, limit)
        model = np.ones(len(trainer), dtype=bool)
    else:
        # bool, int8 and uint8 share one compiled scan (-1 reads 255: flagged), any wider integer reads as int64 (a
        # uint64 above 2**63 reads negative: flagged, as any value but 0 and 1 is)
        mask = mask.view(np.uint8) if mask.dtype.itemsize == 1 else mask.astype(np.int64, copy=False)
        trainer, rollout, model, clean = kernels.checked_model_values(trainer, rollout, readonly(mask), limit)
    if not clean:
        return None
    return trainer, rollout, model


def readonly(values: np.ndarray) -> np.ndarray:
    """A C-contiguous, read-only view of ``values`` (a copy only where it is not contiguous)."""
    view = np.ascontiguousarray(values).view()
    view.flags.writeable = False
    return view


def prompt_values(block: Block) -> pa.Array | pa.ChunkedArray | None:
    """The block's prompt ids (its sample ids where the sample_id column is the prompt's: ``uid``), or None."""
    name = block.names.get("prompt_id")
    if name is None:
        return None
    if name == block.names.get("sample_id"):
        return pa.array(block.sample_id)
    values = block.extra.get(name)
    return None if values is None else getattr(values, "array", values)  # decode._ArrowValues' Arrow array


def prompt_nulls(block: Block) -> int:
    """Rows of the block whose prompt id is null (they have no prompt; ``ReadLog`` warns)."""
    values = prompt_values(block)
    return int(values.null_count) if isinstance(values, pa.Array | pa.ChunkedArray) else 0


def prompt_keys(valid: Valid) -> tuple[np.ndarray | None, str | None]:
    """(int64 prompt key per row, where the keys come from) of a validated block (``io/prompts.py``): its prompt_id
    column, else the token ids before each row's first model token; (None, None) when it has neither."""
    block = valid.block
    values = prompt_values(block)
    if values is not None:
        return prompts.column_keys(values)[0], f"column {block.names['prompt_id']}"
    if block.token_ids is None or "mask" not in block.names:
        return None, None
    mask = valid.scanned[2] if valid.scanned is not None else np.asarray(block.mask == 1)
    keys = prompts.token_prefix_keys(block.token_ids, mask, valid.offsets)
    return (keys, prompts.TOKENS_SOURCE) if bool(keys.any()) else (None, None)


def chunk_extra(block: Block) -> dict[str, ExtraColumn]:
    """The block's extra columns, its policy_version column first: read by its role, it is carried once, here."""
    if block.policy_version is None:
        return block.extra
    return {block.names["policy_version"]: block.policy_version, **block.extra}


def text_lookup(text: pa.Array, offsets: np.ndarray) -> Callable[[int, int], str | None]:
    def lookup(row: int, position: int) -> str | None:
        value = text[int(offsets[row]) + position]
        try:
            return value.as_py()
        except UnicodeDecodeError:  # token text is for display: show what can be shown
            return value.as_buffer().to_pybytes().decode("utf-8", errors="replace")

    return lookup
