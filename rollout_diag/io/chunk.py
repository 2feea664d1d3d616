"""A chunk: a few thousand whole rows as packed (unpadded) torch tensors, the unit every accumulator eats.

Packed, not padded: the tokens of all rows are concatenated, with ``offsets`` marking row boundaries
(the varlen layout of flash-attention). Padding a batch of rows whose lengths range from 20 to 32k
tokens would multiply memory and arithmetic for nothing; per-row sums are ``index_add`` over
``token_row`` instead. Only tokens with mask 1 ("model tokens") enter any metric, so the chunk also
keeps a compacted view of them, built once and shared by every accumulator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import torch


@dataclass(frozen=True)
class StepGroups:
    """The steps present in a chunk: ``steps[g]`` is the step of group g; ``row_group[i]`` the group of row i."""

    steps: tuple[int, ...]
    row_group: torch.Tensor  # int64 [R]

    @property
    def count(self) -> int:
        return len(self.steps)


@dataclass(frozen=True)
class ModelTokens:
    """The mask-1 tokens of a chunk, in row order."""

    trainer: torch.Tensor  # float64 [M]  a = old_log_probs
    rollout: torch.Tensor  # float64 [M]  r = rollout_log_probs
    log_ratio: torch.Tensor  # float64 [M]  δ = a − r
    row: torch.Tensor  # int64 [M]  row index within the chunk
    position: torch.Tensor  # int64 [M]  index of the token within its row (environment tokens count)
    round: torch.Tensor  # int64 [M]  multi-turn round: index of the run of mask-1 tokens within its row


@dataclass
class Chunk:
    """Whole rows of one or more steps. Tensors live on one device; row metadata stays on the host."""

    step: torch.Tensor  # int64 [R]
    offsets: torch.Tensor  # int64 [R + 1], row i's tokens are [offsets[i], offsets[i+1])
    trainer: torch.Tensor  # float64 [T]
    rollout: torch.Tensor  # float64 [T]
    mask: torch.Tensor  # bool [T]
    sample_id: list[str]
    file: list[str]  # source file of each row (shared string objects, not copies)
    file_row: list[int]  # row number within that file (first token's row in token layout)
    token_ids: torch.Tensor | None = None  # int64 [T]
    # Token text is only needed for the handful of tokens a report shows, so it is fetched on demand.
    token_text: Callable[[int, int], str | None] | None = field(default=None, repr=False)

    @property
    def rows(self) -> int:
        return int(self.step.shape[0])

    @property
    def device(self) -> torch.device:
        return self.trainer.device

    @cached_property
    def lengths(self) -> torch.Tensor:
        """Tokens per row, environment tokens included (int64 [R])."""
        return self.offsets[1:] - self.offsets[:-1]

    @cached_property
    def token_row(self) -> torch.Tensor:
        """Row index of every token (int64 [T])."""
        rows = torch.arange(self.rows, device=self.device)
        return torch.repeat_interleave(rows, self.lengths, output_size=int(self.trainer.shape[0]))

    @cached_property
    def groups(self) -> StepGroups:
        steps, row_group = torch.unique(self.step, sorted=True, return_inverse=True)
        return StepGroups(steps=tuple(int(s) for s in steps.tolist()), row_group=row_group)

    @cached_property
    def round_starts(self) -> torch.Tensor:
        """True at the first token of each round: a mask-1 token at a row start or after a mask-0 token."""
        previous = torch.roll(self.mask, 1)
        previous[self.offsets[:-1][self.lengths > 0]] = False
        return self.mask & ~previous

    @cached_property
    def rounds_per_row(self) -> torch.Tensor:
        """Number of rounds (runs of mask-1 tokens) in each row (int64 [R])."""
        counts = torch.zeros(self.rows, dtype=torch.int64, device=self.device)
        return counts.index_add_(0, self.token_row, self.round_starts.to(torch.int64))

    @cached_property
    def model(self) -> ModelTokens:
        index = torch.nonzero(self.mask, as_tuple=True)[0]
        token_row = self.token_row
        position = torch.arange(self.trainer.shape[0], device=self.device) - self.offsets[token_row]
        # Round id = rounds started in the row up to and including this token, minus one.
        starts = self.round_starts.to(torch.int64)
        started = torch.cumsum(starts, 0)
        first_token = self.offsets[:-1].clamp(max=max(int(self.trainer.shape[0]) - 1, 0))
        before_row = (started - starts)[first_token] if started.numel() else torch.zeros_like(first_token)
        round_index = started - before_row[token_row] - 1
        trainer, rollout = self.trainer[index], self.rollout[index]
        return ModelTokens(
            trainer=trainer,
            rollout=rollout,
            log_ratio=trainer - rollout,
            row=token_row[index],
            position=position[index],
            round=round_index[index],
        )

    @cached_property
    def tokens_per_row(self) -> torch.Tensor:
        """n_i: model tokens per row (int64 [R])."""
        return torch.bincount(self.model.row, minlength=self.rows)
