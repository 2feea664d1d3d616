"""Where the mismatch is: token positions, the δ distribution, catastrophic tokens, worst rows and tokens.

Position buckets are log2 of the index within the row (0, 1, 2–3, 4–7, …). Worst rows and tokens are
bounded top-K sets, merged across chunks; ties are broken by (step, file, row, position) so the sets do
not depend on chunking.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from rollout_diag import catalogue
from rollout_diag.catalogue import EPS
from rollout_diag.engine import arrays
from rollout_diag.engine.arrays import Array
from rollout_diag.engine.quantities import EXPONENT_MAX, EXPONENT_MIN
from rollout_diag.engine.stats import ChunkStats, stats
from rollout_diag.io.chunk import Chunk
from rollout_diag.metrics.base import Columns, KeyGroup, State, StepAccumulator
from rollout_diag.metrics.offpolicy import log_ppl_diff
from rollout_diag.results import Rows, RowTokens, WorstRow, WorstToken

POSITION_BUCKETS = 40  # log2 buckets: covers rows of up to 2^38 tokens
DEFAULT_CATASTROPHIC = 1.0  # |δ| > 1: ρ outside [1/e, e]
DEFAULT_TOP_K = 20
ROW_CRITERIA = ("log_ppl_abs_diff", "max_abs_diff", "k3_sum", "catastrophic_share")
# Signed δ bins, one per binary order of magnitude: |δ| in [2^k, 2^(k+1)) for k = -20 … 6, mirrored,
# plus a central bin |δ| < 2^-20; values beyond ±128 fall in the end bins. The bin of a value is its
# binary exponent, which costs one frexp per token instead of a binary search.
_LEVELS = EXPONENT_MAX - EXPONENT_MIN  # bins per sign
_ABS_EDGES = [2.0**k for k in range(EXPONENT_MIN, EXPONENT_MAX + 1)]
DELTA_EDGES = [-e for e in reversed(_ABS_EDGES)] + _ABS_EDGES
DELTA_BINS = len(DELTA_EDGES) - 1  # 2·_LEVELS + 1


def delta_bin(delta: Array) -> Array:
    """Index of each δ's bin between consecutive DELTA_EDGES: centre ± k for |δ| in [2^(min+k−1), 2^(min+k))."""
    # frexp: |δ| = m·2^e with m in [0.5, 1), so k = e − min; its exponent of 0 is 0, which must land in the centre
    if not arrays.is_tensor(delta) or delta.device.type == "cpu":  # numpy's frexp is 8× torch's there
        values = arrays.host(delta)
        magnitude = np.clip(np.frexp(values)[1].astype(np.int64) - EXPONENT_MIN, 0, _LEVELS)
        magnitude[values == 0] = 0
        return arrays.like(np.where(values < 0, -magnitude, magnitude) + _LEVELS, delta)
    import torch  # a GPU chunk

    magnitude = (torch.frexp(delta).exponent - EXPONENT_MIN).clamp_(0, _LEVELS).masked_fill_(delta == 0, 0)
    return torch.where(delta < 0, -magnitude, magnitude).add_(_LEVELS)


def _kth_largest(values: Array, k: int) -> float:
    """The k-th largest of ``values`` (1 ≤ k ≤ their count)."""
    if arrays.is_tensor(values):
        import torch

        return float(torch.topk(values, k).values[-1])
    return float(np.partition(values, values.size - k)[values.size - k])


@functools.cache  # one label string per bucket, shared by every step's rows
def bucket_label(bucket: int) -> tuple[int, int, str]:
    """(first position, last position, label) of a log2 bucket."""
    if bucket == 0:
        return 0, 0, "0"
    start, end = 1 << (bucket - 1), (1 << bucket) - 1
    return start, end, str(start) if start == end else f"{start}–{end}"


POSITION_COLUMNS = (
    "step",
    "bucket",
    "start",
    "end",
    "token_count",
    "logprob_abs_diff_mean",
    "k3_kl",
    "catastrophic_share",
)


class PositionAccumulator(StepAccumulator):
    """Per step, over log2 position buckets: token count, Σ|δ|, Σ k3, catastrophic count; and the δ histogram."""

    REDUCTIONS: ClassVar[dict[str, str]] = {
        "token_count": "sum",
        "abs_diff": "sum",
        "k3_kl": "sum",
        "catastrophic": "sum",
        "delta_histogram": "sum",
        # Σ k3 and Σ exp(2·clamp20(δ)) over the tokens with |δ| ≤ the catastrophic threshold ("a few outliers or a
        # broad mismatch?": the key metrics without the catastrophic tokens)
        "k3_kept": "sum",
        "chi2_kept": "sum",
    }

    def __init__(self, catastrophic: float = DEFAULT_CATASTROPHIC) -> None:
        super().__init__()
        self.catastrophic = float(catastrophic)

    def _stats(self, chunk: Chunk) -> dict[str, Array]:
        s = stats(chunk)
        bucket = arrays.clamp(s.segment_bucket, upper=POSITION_BUCKETS - 1)

        def by_bucket(name: str) -> Array:
            return s.bucket_sum(s.segment_sum(name), bucket, POSITION_BUCKETS)

        histogram = s.delta_histogram(delta_bin, DELTA_BINS)
        return {
            # k3 and χ² terms without the catastrophic tokens (the verdict's "a few outliers or broad mismatch?")
            "k3_kept": s.group_sum(s.within("k3", self.catastrophic)),
            "chi2_kept": s.group_sum(s.within("chi2_term", self.catastrophic)),
            "token_count": s.bucket_sum(s.segment_length, bucket, POSITION_BUCKETS),
            "abs_diff": by_bucket("abs_log_ratio"),
            "k3_kl": by_bucket("k3"),
            "catastrophic": by_bucket(s.catastrophic(self.catastrophic)),
            "delta_histogram": histogram,
        }

    def table(self, state: State, step: int | None) -> list[dict[str, Any]]:
        rows = []
        for bucket in np.flatnonzero(state["token_count"] > 0):
            n = float(state["token_count"][bucket])
            start, end, label = bucket_label(int(bucket))
            rows.append(
                {
                    "step": step,
                    "bucket": label,
                    "start": start,
                    "end": end,
                    "token_count": int(n),
                    "logprob_abs_diff_mean": float(state["abs_diff"][bucket]) / n,
                    "k3_kl": float(state["k3_kl"][bucket]) / n,
                    "catastrophic_share": float(state["catastrophic"][bucket]) / n,
                }
            )
        return rows

    def finalize_block(self, columns: Columns) -> list[KeyGroup]:
        """The family's metrics over a block of steps: its one formula (the run is a block of one, ``_finalize``)."""
        tokens, catastrophic = columns["token_count"].sum(axis=1), columns["catastrophic"].sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = catastrophic / tokens
        kept = tokens - catastrophic
        count = len(tokens)
        k3_kept = np.asarray(columns["k3_kept"], np.float64).reshape(count, -1).sum(axis=1)
        chi2_kept = np.asarray(columns["chi2_kept"], np.float64).reshape(count, -1).sum(axis=1)
        return [
            (
                tokens != 0,
                {catalogue.CATASTROPHIC_TOKENS.key: catastrophic, catalogue.CATASTROPHIC_TOKEN_SHARE.key: share},
            ),
            (
                (tokens != 0) & (kept > 0),  # token means over the kept tokens, as §1's T[·] (denominator + 1e-8)
                {
                    catalogue.K3_KL_WITHOUT_CATASTROPHIC.key: k3_kept / (kept + EPS),
                    catalogue.CHI2_TOKEN_WITHOUT_CATASTROPHIC.key: chi2_kept / (kept + EPS) - 1.0,
                },
            ),
        ]

    def position_rows(self) -> list[dict[str, Any]]:
        """Run buckets first (step None), then each step's."""
        run = self.run_state()
        rows = [] if run is None else self.table(run, None)
        for step, state in self.store.states():
            rows.extend(self.table(state, step))
        return rows

    def position_table(self) -> Rows:
        """``position_rows`` as columns (the same rows, keys, values and order), a block of steps at a time: no dict
        per (step, bucket) is kept."""
        run = self.run_state()
        head = [] if run is None else self.table(run, None)
        labels = [bucket_label(bucket) for bucket in range(POSITION_BUCKETS)]
        starts = np.array([label[0] for label in labels], dtype=np.int64)
        ends = np.array([label[1] for label in labels], dtype=np.int64)
        names = np.array([label[2] for label in labels], dtype=object)
        parts: dict[str, list[np.ndarray]] = {name: [] for name in POSITION_COLUMNS}
        for steps, columns in self.store.blocks():
            counts = np.asarray(columns["token_count"], np.float64).reshape(len(steps), -1)
            row, bucket = np.nonzero(counts > 0)  # step by step, buckets in order: as table() walks them
            n = counts[row, bucket]
            parts["step"].append(np.asarray(steps, dtype=np.int64)[row])
            parts["bucket"].append(names[bucket])
            parts["start"].append(starts[bucket])
            parts["end"].append(ends[bucket])
            parts["token_count"].append(n.astype(np.int64))
            for name, summed in (
                ("logprob_abs_diff_mean", "abs_diff"),
                ("k3_kl", "k3_kl"),
                ("catastrophic_share", "catastrophic"),
            ):
                parts[name].append(np.asarray(columns[summed], np.float64).reshape(len(steps), -1)[row, bucket] / n)
        kinds = {"bucket": object, "logprob_abs_diff_mean": np.float64, "k3_kl": np.float64}
        kinds["catastrophic_share"] = np.float64
        return Rows(
            head,
            {
                name: np.concatenate(parts[name]) if parts[name] else np.zeros(0, dtype=kinds.get(name, np.int64))
                for name in POSITION_COLUMNS
            },
        )

    def delta_histogram(self) -> dict[str, list[float] | list[int]]:
        run = self.run_state()
        counts = [] if run is None else [int(c) for c in run["delta_histogram"]]
        return {"edges": list(DELTA_EDGES), "counts": counts}


# The window of a long row that ``inspect`` lists by default and that a result carries (worst_row_tokens).
DEFAULT_WINDOW = 100  # tokens around a position (inspect --around without --window; a long row's largest |δ|)
LONG_ROW = 1000  # a longer row is listed as DEFAULT_WINDOW tokens around its largest |δ|


def first_differing(chunk: Chunk, row: int, start: int = 0, stop: int | None = None) -> int | None:
    """Position in row ``row`` of ``chunk`` of its first model token whose two logprobs differ in any bit (as float32
    where either column was: ``Chunk.float32``); None when every one is equal. ``start`` and ``stop``: the positions
    searched, [start, stop) (the row's end by default), where the caller knows that no model token before ``start``
    differs and one before ``stop`` does."""
    offset = int(chunk.offsets[row])
    begin, end = offset + start, int(chunk.offsets[row + 1]) if stop is None else offset + stop
    trainer, rollout = arrays.host(chunk.trainer[begin:end]), arrays.host(chunk.rollout[begin:end])
    differ = arrays.bits_differ(trainer, rollout, bool(chunk.float32)) & arrays.host(chunk.mask[begin:end]).astype(bool)
    return start + int(np.argmax(differ)) if differ.any() else None


def _first_differing_rows(
    chunk: Chunk, s: ChunkStats, rows: list[int], segments: list[range], mismatched: np.ndarray
) -> list[int | None]:
    """``first_differing`` of each of ``rows`` (its segments ``segments[i]``) from their exact ``mismatched`` counts
    (the fused pass's): only a row's first segment that counts one is read (a segment's tokens are consecutive in the
    row), none when no segment does; the segments' places in their rows found in one call for all the rows."""
    first_hit = []
    for spanned in segments:
        hit = np.flatnonzero(mismatched[spanned.start : spanned.stop])
        first_hit.append(spanned.start + int(hit[0]) if hit.size else -1)
    hit_segments = [segment for segment in first_hit if segment >= 0]
    if not hit_segments:
        return [None] * len(rows)
    lengths = arrays.host(s.segment_length)
    places = iter(s.token_locations(arrays.host(s.segment_starts)[hit_segments].tolist()))
    found: list[int | None] = []
    if arrays.is_tensor(chunk.trainer):  # a tensor chunk's segments read one by one where they lie
        for row, segment in zip(rows, first_hit, strict=True):
            if segment < 0:
                found.append(None)
                continue
            position = next(places)[1]
            found.append(first_differing(chunk, row, position, position + int(lengths[segment])))
        return found
    # a numpy chunk's: the segments' tokens gathered and compared at once, each segment's first differing one kept
    hit_rows = [row for row, segment in zip(rows, first_hit, strict=True) if segment >= 0]
    starts = np.array([next(places)[1] for _ in hit_rows], dtype=np.int64)  # each segment's position in its row
    counts = lengths[hit_segments].astype(np.int64)
    firsts = np.cumsum(counts) - counts  # each segment's first token in the gathered run
    index = np.repeat(chunk.offsets[hit_rows] + starts - firsts, counts) + np.arange(int(counts.sum()))
    differ = arrays.bits_differ(chunk.trainer[index], chunk.rollout[index], bool(chunk.float32))
    differ &= chunk.mask[index].astype(bool)
    at = np.flatnonzero(differ)
    run = np.searchsorted(firsts, at, side="right") - 1  # the segment of each differing token, ascending
    first_at = np.full(len(hit_rows), -1, dtype=np.int64)
    seen, where = np.unique(run, return_index=True)
    first_at[seen] = at[where] - firsts[seen]
    by_row = iter((starts + first_at).tolist())
    offsets_found = iter(first_at.tolist())
    for segment in first_hit:
        if segment < 0:
            found.append(None)
            continue
        position, offset = next(by_row), next(offsets_found)
        found.append(None if offset < 0 else position)
    return found


def window_at(around: int, size: int, length: int) -> tuple[int, int]:
    """[first, last) of ``size`` tokens centred on position ``around`` of a row of ``length`` tokens, moved inside
    the row at its ends."""
    first = max(0, min(around - size // 2, length - size))
    return first, min(length, first + size)


def default_window(mask: np.ndarray, trainer: np.ndarray, rollout: np.ndarray) -> tuple[int, int]:
    """[first, last) of a row as listed by default: all of it up to LONG_ROW tokens, else DEFAULT_WINDOW tokens
    centred on its largest |δ| among model tokens."""
    length = int(mask.shape[0])
    if length <= LONG_ROW:
        return 0, length
    delta = np.where(mask.astype(bool), np.abs(trainer - rollout), -1.0)
    return window_at(int(np.argmax(delta)), DEFAULT_WINDOW, length)


@dataclass
class CapturedRow:
    """Every token of one row (environment tokens included), copied out of its chunk as arrays. A row entering a
    top-K list may leave it at the next chunk: it becomes RowTokens (Python lists) only if it stays to the end."""

    step: int
    sample_id: str
    file: str
    row: int
    mask: np.ndarray
    trainer_logprob: np.ndarray
    rollout_logprob: np.ndarray
    token_id: np.ndarray | None
    token: list[str | None] | None
    extra: dict[str, Any]

    start: int = 0  # position in the row of the first token kept
    row_length: int | None = None  # tokens in the whole row when only a window is kept

    @classmethod
    def of(cls, chunk: Chunk, row: int, window: tuple[int, int] | None = None) -> CapturedRow:
        """The row's tokens, or for a row longer than LONG_ROW the window ``inspect`` shows by default: what a result
        carries (JSON, report) then never grows with the length of one row (a 5 M-token row made 344 MB of JSON).
        ``window``: the (first, last) positions to keep instead (``inspect``'s own choice)."""
        begin, end = int(chunk.offsets[row]), int(chunk.offsets[row + 1])
        length = end - begin
        first, last = (0, length) if window is None else window
        if window is None and length > LONG_ROW:
            mask, trainer, rollout = (
                arrays.host(values[begin:end]) for values in (chunk.mask, chunk.trainer, chunk.rollout)
            )
            first, last = default_window(mask, trainer, rollout)
        span = slice(begin + first, begin + last)
        return cls(
            step=int(chunk.step[row]),
            sample_id=chunk.sample_id[row],
            file=chunk.file[row],
            row=chunk.file_row[row],
            mask=arrays.host(chunk.mask[span]).astype(np.int8),
            trainer_logprob=arrays.host(chunk.trainer[span]).copy(),
            rollout_logprob=arrays.host(chunk.rollout[span]).copy(),
            token_id=None if chunk.token_ids is None else arrays.host(chunk.token_ids[span]).copy(),
            token=None if chunk.token_text is None else [chunk.token_text(row, p) for p in range(first, last)],
            extra=chunk.row_extra(row),
            start=first,
            row_length=None if (first, last) == (0, length) else length,
        )

    def tokens(self) -> RowTokens:
        return RowTokens(
            step=self.step,
            sample_id=self.sample_id,
            file=self.file,
            row=self.row,
            mask=self.mask.tolist(),
            trainer_logprob=self.trainer_logprob.tolist(),
            rollout_logprob=self.rollout_logprob.tolist(),
            token_id=None if self.token_id is None else self.token_id.tolist(),
            token=self.token,
            start=self.start,
            row_length=self.row_length,
            extra=self.extra,
        )


# ------------------------------------------------------------------------------------------ top-K
Location = tuple[int, str, str, int, int]  # (step, sample_id, file, row, position): a total order for ties


def _location(step: int, sample_id: str, file: str, row: int, position: int = -1) -> Location:
    return (step, sample_id, file, row, position)


@dataclass
class TopK:
    """The ``k`` largest items by score; ties broken by location so any chunking keeps the same set."""

    k: int
    items: list[tuple[float, Location, Any]] = field(default_factory=list)

    def offer(self, candidates: list[tuple[float, Location, Any]]) -> None:
        merged = self.items + candidates
        merged.sort(key=lambda item: (-item[0], item[1]))
        self.items = merged[: self.k]

    def threshold(self) -> float:
        """Scores at or below this cannot enter (when full)."""
        return self.items[-1][0] if len(self.items) >= self.k else -math.inf

    def merge(self, other: TopK) -> None:
        self.offer(other.items)


def top_candidates(values: np.ndarray, rows: np.ndarray, k: int) -> np.ndarray:
    """Of ``rows`` (ascending), those whose value is among the ``k`` largest, with every row tied with the k-th: all a
    top-k list can take from them (ties go by location), found without a key per row."""
    if rows.shape[0] <= k:
        return rows
    scores = values[rows]
    kth = np.partition(scores, rows.shape[0] - k)[rows.shape[0] - k]
    return rows[scores >= kth]


class WorstTracker:
    """Top-K rows under each criterion and top-K tokens by |δ|, with the tokens of the top rows kept."""

    def __init__(self, k: int = DEFAULT_TOP_K, catastrophic: float = DEFAULT_CATASTROPHIC) -> None:
        self.k = int(k)
        self.catastrophic = float(catastrophic)
        self.rows = {criterion: TopK(self.k) for criterion in ROW_CRITERIA}
        self.tokens = TopK(self.k)

    def update(self, chunk: Chunk) -> None:
        s = stats(chunk)
        n = s.row_count
        diff = log_ppl_diff(s)  # §1 d_i
        catastrophic = s.row_sum(s.catastrophic(self.catastrophic))
        scores = {
            "log_ppl_abs_diff": abs(diff),
            "max_abs_diff": arrays.clamp(s.row_max("abs_log_ratio"), lower=0.0),
            "k3_sum": s.row_sum("k3"),
            "catastrophic_share": catastrophic / arrays.clamp(n, lower=1),
        }
        host = {name: arrays.host(value) for name, value in scores.items()}
        host["log_ppl_diff"] = arrays.host(diff)
        host["catastrophic"] = arrays.host(catastrophic)
        host["model_tokens"] = arrays.host(n)
        valid = host["model_tokens"] > 0  # rows with no model token have no score
        steps = chunk.step.tolist()
        chosen: set[int] = set()
        for criterion, tracker in self.rows.items():
            values = host[criterion]
            entering = top_candidates(values, np.flatnonzero(valid & (values >= tracker.threshold())), self.k).tolist()
            keys = {
                row: _location(steps[row], chunk.sample_id[row], chunk.file[row], chunk.file_row[row])
                for row in entering
            }
            entering.sort(key=lambda row: (-values[row], keys[row]))
            candidates = [(float(values[row]), keys[row], row) for row in entering[: self.k]]
            chosen.update(row for _, _, row in candidates)
            tracker.offer(candidates)
        details = self._row_details(chunk, sorted(chosen), host)
        for tracker in self.rows.values():
            tracker.items = [
                (score, key, details[item] if isinstance(item, int) else item) for score, key, item in tracker.items
            ]
        if s.model_tokens and float(host["max_abs_diff"].max()) >= self.tokens.threshold():
            self._offer_tokens(chunk)

    @staticmethod
    def _row_key(chunk: Chunk, row: int) -> Location:
        return _location(int(chunk.step[row]), chunk.sample_id[row], chunk.file[row], chunk.file_row[row])

    def _row_details(self, chunk: Chunk, rows: list[int], host: dict[str, np.ndarray]) -> dict[int, Any]:
        if not rows:
            return {}
        s = stats(chunk)
        segment_row = arrays.host(s.segment_row)
        segment_round = arrays.host(s.segment_round)
        segment_abs = arrays.host(s.segment_sum("abs_log_ratio"))
        segment_length = arrays.host(s.segment_length)
        lengths = arrays.host(chunk.lengths)
        rounds = arrays.host(s.rounds_per_row)
        mismatched = arrays.host(s.segment_sum("mismatched"))
        details: dict[int, Any] = {}
        # a row's segments are one run (segments follow the tokens, rows in order): its bounds, not a mask per row
        firsts = np.searchsorted(segment_row, rows, side="left").tolist()
        lasts = np.searchsorted(segment_row, rows, side="right").tolist()
        spans = [range(lo, hi) for lo, hi in zip(firsts, lasts, strict=True)]
        differing = _first_differing_rows(chunk, s, rows, spans, mismatched)
        for row, lo, hi, first_differs in zip(rows, firsts, lasts, differing, strict=True):
            round_abs = np.bincount(segment_round[lo:hi], weights=segment_abs[lo:hi])
            round_tokens = np.bincount(segment_round[lo:hi], weights=segment_length[lo:hi])
            with np.errstate(invalid="ignore", divide="ignore"):
                round_means = np.where(round_tokens > 0, round_abs / np.maximum(round_tokens, 1), -1.0)
            tokens = CapturedRow.of(chunk, row)
            details[row] = (
                {
                    "step": tokens.step,
                    "sample_id": tokens.sample_id,
                    "file": tokens.file,
                    "row": tokens.row,
                    "length": int(lengths[row]),
                    "model_tokens": int(host["model_tokens"][row]),
                    "rounds": int(rounds[row]),
                    "worst_round": int(np.argmax(round_means)) if round_means.size else -1,
                    "log_ppl_diff": float(host["log_ppl_diff"][row]),
                    "max_abs_diff": float(host["max_abs_diff"][row]),
                    "k3_sum": float(host["k3_sum"][row]),
                    "catastrophic_count": int(host["catastrophic"][row]),
                    "extra": dict(tokens.extra),
                    "first_differing_position": first_differs,
                },
                tokens,
            )
        return details

    def _offer_tokens(self, chunk: Chunk) -> None:
        s = stats(chunk)
        # Once the tracker is full only tokens at or above its threshold can enter: a cheap filter before topk.
        index, values = s.largest_tokens("abs_log_ratio", self.tokens.threshold())
        count = arrays.size(values)
        if count == 0:
            return
        kth = _kth_largest(values, min(self.k, count))
        # the k largest are a set with ties at its edge: widen to every token tied with the k-th value.
        tied = arrays.flatnonzero(values >= kth)
        scores = values[tied].tolist()
        if index is not None:
            tied = index[tied]
        tokens = tied.tolist()
        starts = arrays.host(s.segment_starts)

        def token_round(token: int) -> int:  # the round of the segment holding the token
            segment = int(np.searchsorted(starts, token, side="right")) - 1
            return int(s.segment_round[segment])

        candidates = []
        for token, score, (row, position) in zip(tokens, scores, s.token_locations(tokens), strict=True):
            if score < self.tokens.threshold():
                continue
            at = int(chunk.offsets[row]) + position  # the token in the chunk's own arrays
            trainer, rollout = float(chunk.trainer[at]), float(chunk.rollout[at])
            key = (*self._row_key(chunk, row)[:4], position)
            candidates.append(
                (
                    score,
                    key,
                    WorstToken(
                        step=int(chunk.step[row]),
                        sample_id=chunk.sample_id[row],
                        file=chunk.file[row],
                        row=chunk.file_row[row],
                        position=position,
                        round=token_round(token),
                        token_id=None
                        if chunk.token_ids is None
                        else int(chunk.token_ids[chunk.offsets[row] + position]),
                        token=None if chunk.token_text is None else chunk.token_text(row, position),
                        trainer_logprob=trainer,
                        rollout_logprob=rollout,
                        log_ratio=trainer - rollout,  # δ = a − r, as ModelTokens.log_ratio
                    ),
                )
            )
        self.tokens.offer(candidates)

    def merge(self, other: WorstTracker) -> None:
        for criterion, tracker in self.rows.items():
            tracker.merge(other.rows[criterion])
        self.tokens.merge(other.tokens)

    def worst_rows(self) -> list[WorstRow]:
        return [
            WorstRow(criterion=criterion, value=score, **item[0])
            for criterion, tracker in self.rows.items()
            for score, _, item in tracker.items
        ]

    def worst_row_tokens(self) -> list[RowTokens]:
        """Token-level data of every row in any top-K list, once each, worst (by |log-ppl diff|) first."""
        seen: dict[tuple[str, int], CapturedRow] = {}
        for tracker in self.rows.values():
            for _, _, (summary, tokens) in tracker.items:
                seen.setdefault((summary["file"], summary["row"]), tokens)
        return [tokens.tokens() for tokens in seen.values()]

    def worst_tokens(self) -> list[WorstToken]:
        return [item for _, _, item in self.tokens.items]


@dataclass(frozen=True)
class DifferingToken:
    """The first model token, in reading order, whose two logprobs differ in any bit (compared as float32 where
    either column was float32: ``float32``): ``check --exact`` names it."""

    step: int
    file: str
    row: int  # row number within ``file``
    position: int  # index in the row, environment tokens included
    trainer: float
    rollout: float
    float32: bool

    def line(self) -> str:
        """ "first differing token: run.parquet row 12, position 40 (step 3): trainer -0.6931472 vs rollout
        -0.69314724 (float32)"."""
        kind = np.float32 if self.float32 else np.float64
        trainer, rollout = (
            repr(float(kind(value))) if kind is np.float64 else str(kind(value))
            for value in (self.trainer, self.rollout)
        )
        return (
            f"first differing token: {self.file} row {self.row}, position {self.position} (step {self.step}): trainer "
            f"{trainer} vs rollout {rollout} ({'float32' if self.float32 else 'float64'})"
        )


@dataclass
class FirstDifference:
    """Finds the first model token whose logprobs differ in any bit, chunk after chunk in reading order: a chunk is
    searched only while none is found, and within it only the first segment the fused pass counts one in."""

    found: DifferingToken | None = None

    def update(self, chunk: Chunk) -> None:
        if self.found is not None:
            return
        s = stats(chunk)
        counts = arrays.host(s.segment_sum("mismatched"))
        hit = np.flatnonzero(counts > 0)
        if not hit.size:
            return
        segment = int(hit[0])
        start = int(arrays.host(s.segment_starts)[segment])
        end = start + int(arrays.host(s.segment_length)[segment])
        model = chunk.model
        trainer, rollout = arrays.host(model.trainer[start:end]), arrays.host(model.rollout[start:end])
        first = int(np.argmax(arrays.host(arrays.bits_differ(trainer, rollout, bool(chunk.float32)))))
        row, position = s.token_locations([start + first])[0]
        self.found = DifferingToken(
            step=int(chunk.step[row]),
            file=chunk.file[row],
            row=int(chunk.file_row[row]),
            position=int(position),
            trainer=float(trainer[first]),
            rollout=float(rollout[first]),
            float32=bool(chunk.float32),
        )

    def merge(self, other: FirstDifference) -> None:
        """The earlier of two parts' (this part read first)."""
        if self.found is None:
            self.found = other.found
