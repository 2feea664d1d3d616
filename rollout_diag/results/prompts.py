"""What the prompt checks hand over and find: the per-prompt evidence (``metrics/prompts.py``) and the prompts that are
extreme every time (``decisions/prompts.py``), with their JSON (``AnalysisResult.prompts``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from rollout_diag.results.rows import HintRow, RowRef
from rollout_diag.results.shapes import item_from_json


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
    score: np.ndarray  # Σ row score (|log-ppl diff| of each row)
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
    texts: dict[int, str] = field(default_factory=dict)  # prompt key → id text (``keep_texts``; else empty)


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


# ------------------------------------------------------------------------------ prompts matched across runs (runs)
@dataclass(frozen=True)
class MatchedCell:
    """One prompt in one run: its rows, the mean, smallest and largest of their row scores (|log-ppl diff|), the
    share of the run's rows scoring at least its smallest (``tail``: at most the run's worst share when every row of
    it is in the worst 1 %), whether every row of it is there (``worst``), and the first steps it appears at."""

    run: str
    rows: int
    score_mean: float
    score_min: float
    score_max: float
    tail: float
    worst: bool
    steps: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class MatchedPrompt:
    """One prompt seen in two runs or more: its id text (or key in hex), key, one cell per run it appears in (in the
    runs' order), ``listed`` when it is a deterministic outlier (in the worst 1 % in every run it appears in) and
    ``chance``, the probability of that by chance (Π over its runs of share^rows)."""

    prompt: str
    key: str
    cells: list[MatchedCell]
    listed: bool
    chance: float

    def cell(self, run: str) -> MatchedCell | None:
        return next((cell for cell in self.cells if cell.run == run), None)

    @property
    def runs(self) -> list[str]:
        return [cell.run for cell in self.cells]


@dataclass(frozen=True)
class RunWorst:
    """One run's worst-1 % cut (``decisions/prompts.py``'s): the lowest row score in it and the share of the run's
    valid rows at or above it; the distinct prompts the run has."""

    run: str
    threshold: float
    share: float
    prompts: int


@dataclass(frozen=True)
class RunsPrompts:
    """``runs``' prompts matched across runs (``decisions/prompts.py``: ``matched_prompts``): the identity, the runs
    that have one, how many prompts recur across runs, the deterministic outliers (``outliers``, listed first in
    ``matrix``) and the prompts × runs matrix of the most extreme recurring prompts (at most ``MATRIX_PROMPTS``)."""

    identity: str
    runs: list[str]  # the runs with a prompt identity, in the runs' order
    without: list[str]  # the runs read without one
    worst: list[RunWorst]
    shared: int  # prompts seen in two runs or more (the chance guard's count of candidates)
    in_every_run: int  # of them, seen in every run with an identity
    sampled_share: float  # share of the prompts followed (1.0 unless a run's table passed its cap)
    outliers: int  # deterministic outliers found (the listed ones are the first of ``matrix``)
    matrix: list[MatchedPrompt] = field(default_factory=list)
    matrix_cut: int = 0  # recurring prompts not in the matrix

    @property
    def listed(self) -> list[MatchedPrompt]:
        return [prompt for prompt in self.matrix if prompt.listed]

    def to_json(self) -> dict[str, Any]:
        return {
            "identity": self.identity,
            "runs": list(self.runs),
            "without": list(self.without),
            "worst": [asdict(worst) for worst in self.worst],
            "shared": self.shared,
            "in_every_run": self.in_every_run,
            "sampled_share": self.sampled_share,
            "outliers": self.outliers,
            "matrix": [
                {
                    "prompt": item.prompt,
                    "key": item.key,
                    "listed": item.listed,
                    "chance": item.chance,
                    "cells": {cell.run: _cell_json(cell) for cell in item.cells},
                }
                for item in self.matrix
            ],
            "matrix_cut": self.matrix_cut,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> RunsPrompts:
        """Inverse of ``to_json`` (the document's shape checked before: ``RunsResult.from_json``)."""
        matrix = [
            MatchedPrompt(
                prompt=item["prompt"],
                key=item["key"],
                cells=[item_from_json(MatchedCell, {**cell, "run": run}) for run, cell in item["cells"].items()],
                listed=item["listed"],
                chance=item["chance"],
            )
            for item in raw["matrix"]
        ]
        return cls(
            identity=raw["identity"],
            runs=list(raw["runs"]),
            without=list(raw["without"]),
            worst=[item_from_json(RunWorst, worst) for worst in raw["worst"]],
            shared=raw["shared"],
            in_every_run=raw["in_every_run"],
            sampled_share=raw["sampled_share"],
            outliers=raw["outliers"],
            matrix=matrix,
            matrix_cut=raw["matrix_cut"],
        )


def _cell_json(cell: MatchedCell) -> dict[str, Any]:
    found = asdict(cell)
    del found["run"]
    return found
