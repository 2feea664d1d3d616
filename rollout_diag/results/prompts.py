"""What the prompt checks hand over and find: the per-prompt evidence (``metrics/prompts.py``) and the prompts that are
extreme every time (``decisions/prompts.py``), with their JSON (``AnalysisResult.prompts``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from rollout_diag.results.rows import HintRow, RowRef


def prompt_label(key: int) -> str:
    """A prompt key (``io/prompts.py``) as 16 hex digits: what a listing shows where the dump has no id text."""
    return f"{int(key) & 0xFFFFFFFFFFFFFFFF:016x}"


@dataclass(frozen=True)
class PromptCells:
    """One entry per (prompt key, version, step): float64 sums and the extrema of the row score, int64 keys."""

    key: np.ndarray
    version: np.ndarray
    step: np.ndarray
    rows: np.ndarray
    tokens: np.ndarray
    y: np.ndarray  # Σ min(|δ|, 1)
    y2: np.ndarray
    score_min: np.ndarray  # smallest / largest row score (|log-ppl diff|) of the cell's rows
    score_max: np.ndarray


@dataclass(frozen=True)
class PromptEvidence:
    """``PromptAccumulator.evidence()``: the cells, the row-score histogram and example rows with their prompt
    (each a (row, prompt key, prompt id text, version) tuple)."""

    source: str  # where the keys come from ("column prompt_id", "token ids before the first model token"); "" none
    rows_keyed: int
    rows_without: int
    sampled_share: float  # share of the prompts followed (1.0 unless the table passed its cap)
    has_versions: bool
    cells: PromptCells
    score_histogram: np.ndarray  # int64 rows per score bin
    score_edges: list[float]  # each bin's lowest score
    worst_rows: list[tuple[RowRef, int, str | None, int]] = field(default_factory=list)
    stale_rows: list[tuple[RowRef, int, str | None, int]] = field(default_factory=list)


@dataclass(frozen=True)
class ExtremePrompt:
    """A prompt whose every row is in the run's worst 1 % by row score, at least twice."""

    prompt: str  # the prompt id's text, or its key in hex for a token-id prefix
    key: str  # the 64-bit key in hex (io/prompts.py label)
    rows: int
    steps: list[int]
    score_min: float  # the smallest and largest score of its rows
    score_max: float
    chance: float  # probability that its rows all land in the worst share by chance (share^rows)
    example_rows: list[HintRow] = field(default_factory=list)


@dataclass(frozen=True)
class PromptFindings:
    """The prompt identity a run was read with and what the prompt checks found (``decisions/prompts.py``)."""

    identity: str
    rows_keyed: int
    rows_without: int
    prompts: int  # distinct prompts followed
    recurring: int  # of them seen at two versions (steps) or more
    sampled_share: float
    worst_threshold: float  # a row at or above this score is in the worst share
    worst_share: float  # the share of valid rows at or above it (about 1 %)
    extreme: list[ExtremePrompt] = field(default_factory=list)
    extreme_cut: int = 0  # further such prompts, not listed

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> PromptFindings:
        extreme = [
            ExtremePrompt(**{**item, "example_rows": [HintRow(**row) for row in item.get("example_rows", [])]})
            for item in raw.get("extreme", [])
        ]
        return cls(**{**raw, "extreme": extreme})
