"""A chunk: a few thousand whole rows as packed (unpadded) arrays, the unit every accumulator eats.

The arrays are numpy for the numba engine (the CPU; torch is not loaded) and torch tensors on one device for the torch
engine (``rollout_diag.engine.kernels``); everything below works on either kind (``rollout_diag.engine.arrays``).

Packed, not padded: the tokens of all rows are concatenated, with ``offsets`` marking row boundaries
(the varlen layout of flash-attention). Padding a batch of rows whose lengths range from 20 to 32k
tokens would multiply memory and arithmetic for nothing; per-row sums are ``index_add`` over
``token_row`` instead. Only tokens with mask 1 ("model tokens") enter any metric, so the chunk also
keeps a compacted view of them, built once and shared by every accumulator.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from rollout_diag.engine import arrays
from rollout_diag.engine.arrays import Array
from rollout_diag.results import ExtraValue

if TYPE_CHECKING:
    from rollout_diag.engine.kernels.prepass import KernelPrepass


def extra_value(value: Any) -> ExtraValue:
    """A plain Python scalar (numpy scalars unwrapped); NaN and ±inf become None, which JSON can spell."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


@dataclass(frozen=True)
class StepGroups:
    """The steps present in a chunk: ``steps[g]`` is the step of group g; ``row_group[i]`` the group of row i."""

    steps: tuple[int, ...]
    row_group: Array  # int64 [R]

    @property
    def count(self) -> int:
        return len(self.steps)


class RowValues(Protocol):
    """One value per row, read by row: a numpy array, a list, or io/decode.py's Arrow values."""

    def __len__(self) -> int: ...

    def __getitem__(self, row: int, /) -> Any: ...


@dataclass(frozen=True)
class ModelTokens:
    """The mask-1 tokens of a chunk, in row order."""

    trainer: Array  # float64 [M]  a = old_log_probs
    rollout: Array  # float64 [M]  r = rollout_log_probs
    log_ratio: Array  # float64 [M]  δ = a − r
    row: Array  # int64 [M]  row index within the chunk
    position: Array  # int64 [M]  index of the token within its row (environment tokens count)


@dataclass
class Chunk:
    """Whole rows of one or more steps. Arrays are numpy, or tensors on one device; row metadata stays on the host."""

    step: Array  # int64 [R]
    offsets: Array  # int64 [R + 1], row i's tokens are [offsets[i], offsets[i+1])
    trainer: Array  # float64 [T]
    rollout: Array  # float64 [T]
    mask: Array  # bool [T]
    sample_id: list[str]
    file: list[str]  # source file of each row (shared string objects, not copies)
    file_row: list[int]  # row number within that file (first token's row in token layout)
    token_ids: Array | None = None  # int64 [T]
    policy_version: Array | None = None  # int64 [R]: version of the policy that generated each row
    # per-token side columns by role (io/columns.py TOKEN_SIDE_ROLES: rollout_token_ids int64, kept_mass float64 [T])
    token_columns: Mapping[str, Array] = field(default_factory=dict)
    # int64 [R] on the host: each row's prompt key (io/prompts.py; 0: none), and where the keys come from
    prompt_key: np.ndarray | None = None
    prompt_source: str | None = None
    # Token text is only needed for the handful of tokens a report shows, so it is fetched on demand.
    token_text: Callable[[int, int], str | None] | None = field(default=None, repr=False)
    # Derived values shared by every accumulator that eats this chunk (see engine/stats.py).
    cache: dict = field(default_factory=dict, repr=False)
    # Per-row scalar columns no role takes (reward, advantage, …): column name -> R values (numpy array or list).
    extra: Mapping[str, RowValues] = field(default_factory=dict)
    # The engine of this chunk's token statistics ("numba" or "torch"), as the reader chose it for the whole input
    # (rollout_diag.engine.choice.kernel_for); None: the process's setting decides from the device alone.
    engine: str | None = None
    # The numba engine's compiled passes over this chunk, when the reader ran them before torch was loaded
    # (kernels/prepass.py; read by engine.stats.KernelStats); None: computed when first read.
    prepass: KernelPrepass | None = field(default=None, repr=False)
    # Either logprob column was float32 (or narrower) in the dump: ``mismatched`` compares the two values' bits as
    # float32 then (engine/quantities.py COUNTS); the reader joins only blocks that agree.
    float32: bool = False
    # uint64 [R] on the host: each row's (step, sample_id) hash (io.readlog.row_keys), where the reader made it (it
    # keeps them for its duplicate check); None: made by whoever reads it
    row_key: np.ndarray | None = None

    @property
    def rows(self) -> int:
        return int(self.step.shape[0])

    def row_extra(self, row: int) -> dict[str, ExtraValue]:
        """Row ``row``'s extra columns as plain scalars, in column order (empty without extra columns)."""
        return {name: extra_value(values[row]) for name, values in self.extra.items()}

    @property
    def device_type(self) -> str:
        """Where the arrays live: ``cpu`` for numpy arrays, else the tensors' device type (``cuda``, ``cpu``)."""
        return self.trainer.device.type if arrays.is_tensor(self.trainer) else "cpu"

    @cached_property
    def lengths(self) -> Array:
        """Tokens per row, environment tokens included (int64 [R])."""
        return self.offsets[1:] - self.offsets[:-1]

    @cached_property
    def token_row(self) -> Array:
        """Row index of every token (int64 [T])."""
        return arrays.repeat(arrays.arange(self.rows, self.offsets), self.lengths, int(self.trainer.shape[0]))

    @cached_property
    def groups(self) -> StepGroups:
        if self.prepass is not None:  # np.unique's steps and inverse: torch.unique's
            return StepGroups(steps=self.prepass.steps, row_group=arrays.like(self.prepass.row_group, self.step))
        if not arrays.is_tensor(self.step):
            from rollout_diag.engine.kernels.prepass import step_groups

            steps, row_group = step_groups(self.step)
            return StepGroups(steps=steps, row_group=row_group)
        import torch

        steps_tensor, row_group = torch.unique(self.step, sorted=True, return_inverse=True)
        return StepGroups(steps=tuple(int(s) for s in steps_tensor.tolist()), row_group=row_group)

    def regrouped(self, groups: StepGroups) -> Chunk:
        """This chunk with ``groups`` as its step groups (``--by``: (group, step) pairs; rollout_diag/groups.py):
        arrays and caches shared, ``groups`` the view's own."""
        view = copy.copy(self)
        view.groups = groups  # the view's own value of the cached property (functools.cached_property)
        return view

    @cached_property
    def model(self) -> ModelTokens:
        if not arrays.is_tensor(self.trainer):
            return _model_tokens_numpy(self)
        if self.device_type != "cpu":
            return _model_tokens_torch(self)
        import torch  # a CPU tensor chunk (the torch engine): numpy's index operations, as tensors

        model = _model_tokens_numpy(self)
        return ModelTokens(*(torch.from_numpy(values) for values in vars(model).values()))


def _model_tokens_torch(chunk: Chunk) -> ModelTokens:
    """ModelTokens with torch ops on the chunk's device (the GPU path)."""
    import torch

    token_row = chunk.token_row
    position = torch.arange(chunk.trainer.shape[0], device=chunk.trainer.device) - chunk.offsets[token_row]
    if bool(chunk.mask.all()):  # single-turn data: every token is a model token, no gather needed
        trainer, rollout, row = chunk.trainer, chunk.rollout, token_row
    else:
        index = torch.nonzero(chunk.mask, as_tuple=True)[0]
        trainer, rollout = chunk.trainer[index], chunk.rollout[index]
        row, position = token_row[index], position[index]
    return ModelTokens(trainer=trainer, rollout=rollout, log_ratio=trainer - rollout, row=row, position=position)


def _model_tokens_numpy(chunk: Chunk) -> ModelTokens:
    """ModelTokens of a CPU chunk with numpy's index operations (3–5× faster than torch's on the CPU), as numpy
    arrays; the same values as the torch path."""
    mask = arrays.host(chunk.mask)
    offsets = arrays.host(chunk.offsets)
    trainer, rollout = arrays.host(chunk.trainer), arrays.host(chunk.rollout)
    rows = np.arange(chunk.rows, dtype=np.int64)
    if mask.all():  # single-turn data: every token is a model token, no gather needed
        index = None
        row = np.repeat(rows, np.diff(offsets))
    else:
        index = np.flatnonzero(mask)
        # model tokens per row: a row's count is the number of indices below its end offset, minus those before it
        row = np.repeat(rows, np.diff(np.searchsorted(index, offsets)))
        trainer, rollout = trainer[index], rollout[index]
    position = (np.arange(len(row), dtype=np.int64) if index is None else index) - offsets[row]
    return ModelTokens(trainer=trainer, rollout=rollout, log_ratio=trainer - rollout, row=row, position=position)
