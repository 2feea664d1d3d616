"""Evidence per prompt (``io/prompts.py`` keys): what the stale-prefix-cache hint and the prompts that are extreme
every time read (``rollout_diag/decisions/prompts.py`` judges; ``docs/hints.md`` gives the rules).

State, mergeable and the same for any chunking, row order or worker split (to float64 rounding of the sums):

- **cells**: per (prompt key, version, step) — version is the row's ``policy_version``, else its step; the step too,
  so that a hint can name steps — the rows, model tokens, Σy and Σy² of y = min(|δ|, 1) (the other hints' clipped
  mismatch), the sum of the row scores (a prompt's mean row mismatch, ``runs``' prompts matched across runs), and the
  smallest and largest row score (|log-ppl diff| of the row, the worst-rows table's first
  criterion). Cells arrive per chunk and are folded by key with a sort and ``reduceat`` once enough are pending.
  The table grows with the distinct (prompt, version, step) triples, not with rows or tokens; past ``max_cells`` a
  hash-chosen half of the prompts is dropped, then half of the rest, and so on (distinct sampling: which prompts are
  followed depends only on the keys and the cap, never on the chunking), and the result says which share is kept.
- **scores**: a histogram of every valid row's score (all rows, with or without a prompt) in 16 bins per octave, for
  the worst 1 % threshold.
- **examples**: the rows with the largest score and the rows of recurring prompts with the largest y, in bounded
  top-K sets with their prompt's id text, so that findings can name rows and prompts.
- **texts** (``keep_texts``: ``runs``, whose matrix names any recurring prompt): the id text of each prompt of an id
  column, at most ``MAX_TEXTS``; past that, distinct sampling as the cells' (the keys whose low ``text_level`` bits
  are 0), so that which prompts keep their text depends only on the keys.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from rollout_diag.engine import arrays
from rollout_diag.engine.stats import stats
from rollout_diag.io.chunk import Chunk
from rollout_diag.io.prompts import NO_PROMPT
from rollout_diag.metrics.localize import TopK, top_candidates
from rollout_diag.metrics.offpolicy import log_ppl_diff
from rollout_diag.results import PromptCells, PromptEvidence, RowRef
from rollout_diag.results import prompt_label as label

CELL_KEYS = ("key", "version", "step")
CELL_SUMS = ("rows", "tokens", "y", "y2", "score")  # summed
CELL_MIN, CELL_MAX = "score_min", "score_max"
MAX_CELLS = 1 << 21  # 2M cells × 80 bytes ≈ 160 MB at most; then distinct sampling halves the prompts followed
PENDING_CELLS = 1 << 16  # chunk cells gathered before they are folded into the table
# Row-score histogram: bin 0 holds a score of 0; then 16 bins per octave from 2^-40 up to 2^24 (a score is a mean
# |log-ppl diff|, bounded by the logprobs' range); the worst-1 % threshold is the lower edge of a bin (6 % wide).
SCORE_BINS_PER_OCTAVE = 16
SCORE_LOW_EXPONENT, SCORE_HIGH_EXPONENT = -40, 24
SCORE_BINS = 1 + (SCORE_HIGH_EXPONENT - SCORE_LOW_EXPONENT) * SCORE_BINS_PER_OCTAVE
EXAMPLE_ROWS = 64  # rows kept per example set (several per prompt named)
MAX_TEXTS = 1 << 16  # prompt id texts kept (keep_texts): ~10 MB of short ids at most


def score_bin(scores: np.ndarray) -> np.ndarray:
    """Histogram bin of each non-negative row score (see SCORE_BINS)."""
    mantissa, exponent = np.frexp(scores)  # score = mantissa · 2^exponent, mantissa in [0.5, 1)
    sub = np.floor((mantissa - 0.5) * 2 * SCORE_BINS_PER_OCTAVE).astype(np.int64)
    index = 1 + (exponent.astype(np.int64) - 1 - SCORE_LOW_EXPONENT) * SCORE_BINS_PER_OCTAVE + sub
    index = np.clip(index, 1, SCORE_BINS - 1)
    return np.where(scores > 0, index, 0)


def score_bin_edge(index: int) -> float:
    """The lowest score of bin ``index`` (0 for bin 0)."""
    if index <= 0:
        return 0.0
    octave, sub = divmod(index - 1, SCORE_BINS_PER_OCTAVE)
    return math.ldexp(1.0 + sub / SCORE_BINS_PER_OCTAVE, SCORE_LOW_EXPONENT + octave)


def _followed(keys: np.ndarray, level: int) -> np.ndarray:
    """Keys a table at sampling ``level`` follows: those whose low ``level`` bits are 0 (keys are hashes)."""
    if level == 0:
        return np.ones(keys.shape[0], dtype=bool)
    return (keys & ((1 << level) - 1)) == 0


@dataclass
class _Cells:
    keys: np.ndarray  # int64 [C, 3]: key, version, step
    sums: np.ndarray  # float64 [C, 5]: CELL_SUMS
    extrema: np.ndarray  # float64 [C, 2]: smallest, largest row score

    @classmethod
    def empty(cls) -> _Cells:
        return cls(np.zeros((0, 3), np.int64), np.zeros((0, len(CELL_SUMS))), np.zeros((0, 2)))

    def __len__(self) -> int:
        return int(self.keys.shape[0])


def _folded(parts: list[_Cells]) -> _Cells:
    """One cell per (key, version, step): sums added, extrema taken, in (key, version, step) order."""
    keys = np.concatenate([part.keys for part in parts])
    if keys.shape[0] == 0:
        return _Cells.empty()
    sums = np.concatenate([part.sums for part in parts])
    extrema = np.concatenate([part.extrema for part in parts])
    order = np.lexsort((keys[:, 2], keys[:, 1], keys[:, 0]))
    keys, sums, extrema = keys[order], sums[order], extrema[order]
    starts = np.flatnonzero(np.concatenate([[True], np.any(keys[1:] != keys[:-1], axis=1)]))
    return _Cells(
        keys=keys[starts],
        sums=np.add.reduceat(sums, starts, axis=0),
        extrema=np.stack(
            [np.minimum.reduceat(extrema[:, 0], starts), np.maximum.reduceat(extrema[:, 1], starts)], axis=1
        ),
    )


@dataclass
class PromptAccumulator:
    """Per-prompt evidence (see the module docstring): ``update(chunk)``, ``merge(other)``, ``evidence()``."""

    max_cells: int = MAX_CELLS
    table: _Cells = field(default_factory=_Cells.empty)
    pending: list[_Cells] = field(default_factory=list)
    pending_rows: int = 0
    level: int = 0  # distinct sampling: prompts whose key has its low ``level`` bits 0 are followed
    scores: np.ndarray = field(default_factory=lambda: np.zeros(SCORE_BINS, dtype=np.int64))
    rows_keyed: int = 0  # valid rows with a prompt key (followed or not)
    rows_without: int = 0  # valid rows of chunks with keys whose key is NO_PROMPT
    sources: dict[str, None] = field(default_factory=dict)
    has_versions: bool = False
    keep_texts: bool = False  # also keep each prompt's id text (the ``texts`` of the module docstring)
    texts: dict[int, str] = field(default_factory=dict)
    text_level: int = 0
    worst: TopK = field(default_factory=lambda: TopK(EXAMPLE_ROWS))  # rows by score, with their prompt
    stale: TopK = field(default_factory=lambda: TopK(EXAMPLE_ROWS))  # rows by mean y, with their prompt

    def update(self, chunk: Chunk) -> None:
        s = stats(chunk)
        tokens = arrays.host(s.row_count).astype(np.float64)
        valid = tokens > 0
        score = np.abs(arrays.host(log_ppl_diff(s)))  # the worst-rows table's score |d_i| (localize.WorstTracker)
        self.scores += np.bincount(score_bin(score[valid]), minlength=SCORE_BINS)
        if chunk.prompt_key is None:
            return
        key = chunk.prompt_key
        keyed = valid & (key != NO_PROMPT)
        if keyed.any():
            self.sources[chunk.prompt_source or ""] = None
        self.rows_keyed += int(keyed.sum())
        self.rows_without += int((valid & (key == NO_PROMPT)).sum())
        if chunk.policy_version is not None:
            self.has_versions = True
            version = arrays.host(chunk.policy_version).astype(np.int64)
        else:
            version = arrays.host(chunk.step).astype(np.int64)
        step = arrays.host(chunk.step).astype(np.int64)
        y = arrays.host(s.row_sum("hint_clipped_abs"))
        y2 = arrays.host(s.row_sum("hint_clipped_square"))
        mean_y = y / np.maximum(tokens, 1.0)
        self._offer(chunk, self.worst, score, keyed)
        self._offer(chunk, self.stale, mean_y, keyed)
        if self.keep_texts and (chunk.prompt_source or "").startswith("column "):
            self._keep_texts(chunk, key, keyed)
        kept = keyed & _followed(key, self.level)
        if not kept.any():
            return
        self.pending.append(
            _folded(
                [
                    _Cells(
                        keys=np.stack([key[kept], version[kept], step[kept]], axis=1),
                        sums=np.stack([np.ones(int(kept.sum())), tokens[kept], y[kept], y2[kept], score[kept]], axis=1),
                        extrema=np.stack([score[kept], score[kept]], axis=1),
                    )
                ]
            )
        )
        self.pending_rows += len(self.pending[-1])
        if self.pending_rows >= PENDING_CELLS:
            self._fold()

    def _offer(self, chunk: Chunk, tracker: TopK, values: np.ndarray, eligible: np.ndarray) -> None:
        candidates = top_candidates(values, np.flatnonzero(eligible & (values >= tracker.threshold())), tracker.k)
        if candidates.size == 0:
            return
        steps = chunk.step.tolist() if not arrays.is_tensor(chunk.step) else arrays.host(chunk.step).tolist()
        version = None if chunk.policy_version is None else arrays.host(chunk.policy_version)
        label = prompt_texts(chunk)
        keys = chunk.prompt_key
        assert keys is not None  # only a chunk with prompt keys offers rows
        offered = []
        for row in candidates.tolist():
            location = (steps[row], chunk.sample_id[row], chunk.file[row], chunk.file_row[row], -1)
            payload = (
                int(keys[row]),
                label(row),
                steps[row] if version is None else int(version[row]),
            )
            offered.append((float(values[row]), location, payload))
        offered.sort(key=lambda item: (-item[0], item[1]))
        tracker.offer(offered[: tracker.k])

    def _keep_texts(self, chunk: Chunk, key: np.ndarray, keyed: np.ndarray) -> None:
        """The id text of each prompt of the chunk not yet held (one row of each), then the cap."""
        rows = np.flatnonzero(keyed & _followed(key, self.text_level))
        if rows.size == 0:
            return
        unique, first = np.unique(key[rows], return_index=True)
        text = prompt_texts(chunk)
        for found, row in zip(unique.tolist(), rows[first].tolist(), strict=True):
            if found not in self.texts:
                value = text(row)
                if value is not None:
                    self.texts[found] = value
        self._cap_texts()

    def _cap_texts(self) -> None:
        while len(self.texts) > MAX_TEXTS:  # distinct sampling: keep half the texts kept so far
            self.text_level += 1
            mask = (1 << self.text_level) - 1
            self.texts = {found: value for found, value in self.texts.items() if found & mask == 0}

    def _fold(self) -> None:
        self.table = _folded([self.table, *self.pending])
        self.pending, self.pending_rows = [], 0
        while len(self.table) > self.max_cells:  # distinct sampling: follow half the prompts followed so far
            self.level += 1
            self._sample()

    def _sample(self) -> None:
        keep = _followed(self.table.keys[:, 0], self.level)
        self.table = _Cells(self.table.keys[keep], self.table.sums[keep], self.table.extrema[keep])

    def merge(self, other: PromptAccumulator) -> None:
        other._fold()
        self._fold()
        level = max(self.level, other.level)
        self.table = _folded([self.table, other.table])
        self.level = level
        self._sample()
        self._fold()
        self.scores += other.scores
        self.rows_keyed += other.rows_keyed
        self.rows_without += other.rows_without
        self.sources.update(other.sources)
        self.has_versions |= other.has_versions
        self.keep_texts |= other.keep_texts
        for found, value in other.texts.items():
            self.texts.setdefault(found, value)
        self.text_level = max(self.text_level, other.text_level)
        mask = (1 << self.text_level) - 1
        self.texts = {found: value for found, value in self.texts.items() if found & mask == 0}
        self._cap_texts()
        self.worst.merge(other.worst)
        self.stale.merge(other.stale)

    def evidence(self) -> PromptEvidence:
        """The folded table and the rest, for ``decisions.prompts`` (an empty evidence without prompt keys)."""
        self._fold()
        table = self.table
        return PromptEvidence(
            source=", ".join(name for name in self.sources if name),
            rows_keyed=self.rows_keyed,
            rows_without=self.rows_without,
            sampled_share=0.5**self.level,
            has_versions=self.has_versions,
            cells=PromptCells(
                key=table.keys[:, 0],
                version=table.keys[:, 1],
                step=table.keys[:, 2],
                rows=table.sums[:, 0],
                tokens=table.sums[:, 1],
                y=table.sums[:, 2],
                y2=table.sums[:, 3],
                score=table.sums[:, 4],
                score_min=table.extrema[:, 0],
                score_max=table.extrema[:, 1],
            ),
            score_histogram=self.scores.copy(),
            score_edges=[score_bin_edge(index) for index in range(SCORE_BINS)],
            worst_rows=_refs(self.worst),
            stale_rows=_refs(self.stale),
            texts=dict(self.texts),
        )


def prompt_texts(chunk: Chunk) -> Callable[[int], str | None]:
    """row -> the prompt id's text where the dump has an id column (None for a null id), else the key in hex."""
    source = chunk.prompt_source or ""
    name = source.removeprefix("column ") if source.startswith("column ") else None
    values = chunk.extra.get(name) if name is not None else None
    if name is not None and values is None:  # the sample_id column is the prompt's
        return lambda row: str(chunk.sample_id[row])
    if values is not None:
        return lambda row: None if values[row] is None else str(values[row])
    keys = chunk.prompt_key
    assert keys is not None  # labels are asked of a chunk with prompt keys only
    return lambda row: label(int(keys[row]))


def _refs(tracker: TopK) -> list[tuple[RowRef, int, str | None, int]]:
    """(row, prompt key, prompt id text, version) of each kept row, best first."""
    return [
        (RowRef(step=location[0], sample_id=location[1], file=location[2], row=location[3], score=score), *payload)
        for score, location, payload in tracker.items
    ]
