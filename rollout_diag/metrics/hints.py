"""Evidence for the root-cause hints (``rollout_diag/decisions/hints.py``): float64 sums per step, mergeable, and the
same for any chunking (chunks hold whole rows, so neighbouring tokens and row fits never straddle chunks).

Every hint either compares the mismatch of two groups of model tokens (trainer shifted one position vs
aligned, first tokens of a round vs the rest, low vs high rollout probability, late vs early positions,
stale vs fresh rows) or counts a pattern (exact-zero or copied logprobs, rows where δ is proportional to
log p). All of it is counts, sums and sums of squares, kept per step so a hint can name its steps, plus a
few example rows per hint in bounded top-K sets. Thresholds, also those applied per row here, live in
``rollout_diag/decisions/hints.py`` with their reasons in ``docs/hints.md``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from rollout_diag.catalogue import (
    FIT_MIN_R2,
    FIT_MIN_SLOPE,
    FIT_MIN_TOKENS,
    SHIFT_MAX_RATIO,
    SHIFT_ROW_MIN_ALIGNED,
    SHIFT_ROW_MIN_PAIRS,
)
from rollout_diag.engine import arrays
from rollout_diag.engine.arrays import Array
from rollout_diag.engine.quantities import CLIP, COPY_GAP, LOG_HALF, PROBABILITY_EDGES, TURN_OFFSETS
from rollout_diag.engine.state import StateTable
from rollout_diag.engine.stats import ChunkStats, KernelStats, reduce_runs, stats
from rollout_diag.io.chunk import Chunk
from rollout_diag.metrics.base import State, StepAccumulator
from rollout_diag.metrics.localize import POSITION_BUCKETS, TopK, top_candidates
from rollout_diag.results import UNORDERED, Evidence, RowRef

# Group means use min(|δ|, CLIP = 1) (ρ outside [1/e, e] counts as 1): a few catastrophic tokens cannot carry one.
# A logprob of exactly 0 (p = 1) where the other side says p < 0.5 (LOG_HALF) is no rounding error. Rollout-probability
# buckets: p ≥ 0.9, 0.5–0.9, 0.1–0.5, 0.01–0.1, < 0.01 (bucket k: below k edges). (kernels/prepass.py keeps them: the
# reader runs the compiled hint pass with them before torch is loaded.)
PROBABILITY_BUCKETS = len(PROBABILITY_EDGES) + 1
EXAMPLE_ROWS = 5  # example rows kept per hint
EXAMPLE_KINDS = (
    "off_by_one",
    "dummy_logprobs",
    "processed_logprobs",
    "first_token",
    "last_token",
    "staleness",
    "retokenization",  # the first model tokens whose two token ids differ, in reading order (score: −position)
)

# Per-step sums, one column each (token counts, Σ y and Σ y² with y = min(|δ|, 1), and pattern counts).
TOKEN_SUMS = (
    "tokens",
    "pairs",  # model tokens followed by a model token at the next position of the same row
    "pair_abs",  # Σ|δ_t| over those tokens: the aligned baseline of the shift test
    "shift_next",  # Σ|a_{t+1} − r_t|: trainer logprobs one position late
    "shift_prev",  # Σ|a_t − r_{t+1}|: trainer logprobs one position early
    "dummy_zero",  # one side exactly 0.0 while the other says p < 0.5
    "dummy_zero_run",  # … next to another such token (runs)
    "copied",  # one side repeats its neighbour's value exactly while the other side differs by > log 2
    "cross",  # Σ δ·r (the δ ≈ c·r fit pooled over the step)
    "rollout_square",  # Σ r²
    "delta_square",  # Σ δ²
    "first",
    "first_y",
    "first_y2",  # first token of each round
    "last",
    "last_y",
    "last_y2",  # last model token of each row
    "rest",
    "rest_y",
    "rest_y2",  # every other model token
    "rollout_sum",  # Σ r and Σ δ: with cross, rollout_square and delta_square, the δ ≈ α + β·r fit with an intercept
    "delta_sum",
)
ROW_SUMS = (
    "fit_rows",  # rows with a δ ≈ c·r fit …
    "fit_up",  # … with c ≥ +0.05 and R² ≥ 0.5
    "fit_down",  # … with c ≤ −0.05 and R² ≥ 0.5
    "shift_rows",  # rows whose own pairs pass the shift test (a shifted gather may hit some rows or steps only)
    "shift_rows_pairs",  # their token pairs, Σ aligned |δ| and Σ |δ| in the better shift direction
    "shift_rows_aligned",
    "shift_rows_shifted",
)

# Retokenization at turn boundaries: the first TURN_OFFSETS model tokens of each round, by offset in the round, for
# round 0 (after the prompt) and for later rounds (after an environment segment): [tokens, Σy, Σy²] per bucket
# (round class × offset; TURN_OFFSETS: engine/quantities.py, the fused pass takes them); and every token of the later
# rounds (the rest of those turns is their total less these).
TURN_COLUMNS = ("tokens", "y", "y2")
LATER_SUMS = ("later_tokens", "later_y", "later_y2")
# With the per-token side columns (io/columns.py TOKEN_SIDE_ROLES): model tokens with both token ids and those whose
# trainer (token_ids) and rollout (rollout_token_ids) ids differ; model tokens with a kept mass M, Σ log M and
# Σ|δ − log M| (δ explained by the truncation when small against Σ|δ|).
SIDE_SUMS = ("id_tokens", "id_differ", "kept_tokens", "kept_log", "kept_residual", "kept_abs")
# The policy versions of each step's rows (a resume that resets the weight-sync counter makes them go back).
VERSION_EXTREMES = {"version_min": "min", "version_max": "max"}
# per rollout-probability bucket (abs: Σ|δ|, delta: Σδ, k3: Σ(exp δ − δ − 1), what the drift split reads)
PROBABILITY_COLUMNS = ("tokens", "abs", "y", "y2", "delta", "k3")
POSITION_COLUMNS = ("tokens", "y", "y2")  # per log2 position bucket


def _isin(values: Array, sorted_set: Array) -> Array:
    """values ∈ sorted_set, elementwise (both small index tensors; the torch engine's)."""
    import torch

    if sorted_set.numel() == 0:
        return torch.zeros_like(values, dtype=torch.bool)
    found = torch.searchsorted(sorted_set, values).clamp(max=sorted_set.numel() - 1)
    return sorted_set[found] == values


class _ChunkEvidence:
    """Row sums of one chunk, computed once and shared by the step sums and the examples.

    Full passes over the model tokens are few: the first / last tokens of rounds and rows are gathered by index
    (one per round, one per row), the exact-zero and exact-copy patterns are searched among candidates first.
    """

    def __init__(self, chunk: Chunk) -> None:
        s = stats(chunk)
        self.chunk, self.stats = chunk, s
        self._fitted: tuple[Array, Array, Array] | None = None  # ``fit``, once computed
        self.row_lengths = arrays.astype(s.row_count, "int64")
        if isinstance(s, KernelStats):  # the numba engine: one compiled pass over the tokens
            parts, self.probability_buckets = s.hint_rows()
        else:
            parts = self._token_parts()
            self.probability_buckets = None
        count = s.row_count
        rounds = arrays.float64(s.rounds_per_row)
        total_y, total_y2 = s.row_sum("hint_clipped_abs"), s.row_sum("hint_clipped_square")
        first_y, first_y2, last_y, last_y2 = parts["first_y"], parts["first_y2"], parts["last_y"], parts["last_y2"]
        has_tokens = arrays.float64(count > 0)
        sums = {
            "tokens": count,
            "pairs": count - rounds,  # a round of k tokens has k − 1 adjacent pairs
            "pair_abs": s.row_sum("abs_log_ratio") - parts["round_last_abs"],
            "shift_next": parts["shift_next"],
            "shift_prev": parts["shift_prev"],
            "dummy_zero": parts["dummy_zero"],
            "dummy_zero_run": parts["dummy_zero_run"],
            "copied": parts["copied"],
            "cross": s.row_sum("hint_cross"),
            "rollout_square": s.row_sum("hint_rollout_square"),
            "delta_square": s.row_sum("square"),
            "first": rounds,
            "first_y": first_y,
            "first_y2": first_y2,
            "last": has_tokens,
            "last_y": last_y,
            "last_y2": last_y2,
            "rest": count - rounds - has_tokens + parts["both"],
            "rest_y": total_y - first_y - last_y + parts["both_y"],
            "rest_y2": total_y2 - first_y2 - last_y2 + parts["both_y2"],
            "rollout_sum": s.row_sum("rollout"),
            "delta_sum": s.row_sum("log_ratio"),
        }
        self.rows = arrays.stack([sums[name] for name in TOKEN_SUMS], axis=1)  # [R, K]
        self.total_y, self.total_y2 = total_y, total_y2

    def _token_parts(self) -> dict[str, Array]:
        """The torch engine's per-row token patterns (what ``KernelStats.hint_rows`` computes in one pass)."""
        import torch  # the torch engine's chunks are tensors

        chunk, s = self.chunk, self.stats
        model = chunk.model
        trainer, rollout = model.trainer, model.rollout
        tokens = model.row.numel()
        device = model.row.device
        # Rounds from the segments: a segment opens a round where the row or the round index changes.
        starts = s.segment_starts
        opens = torch.ones_like(starts, dtype=torch.bool)
        if starts.numel() > 1:
            opens[1:] = (s.segment_row[1:] != s.segment_row[:-1]) | (s.segment_round[1:] != s.segment_round[:-1])
        round_first = starts[opens]  # sorted token indices
        round_last = torch.cat([round_first[1:] - 1, round_first.new_tensor([tokens - 1])]) if tokens else round_first
        ends = torch.cumsum(self.row_lengths, 0)
        row_last = (ends - 1)[self.row_lengths > 0]
        row_of = model.row
        y, y2 = s.token("hint_clipped_abs"), s.token("hint_clipped_square")
        abs_delta = s.token("abs_log_ratio")

        def gathered(index: Array, values: Array) -> Array:
            out = torch.zeros(chunk.rows, dtype=torch.float64, device=device)
            return out.index_add_(0, row_of[index], values[index])

        both = row_last[_isin(row_last, round_first)]  # a last round of one token: first and last at once
        both_n = torch.zeros(chunk.rows, dtype=torch.float64, device=device).index_add_(
            0, row_of[both], torch.ones(both.numel(), dtype=torch.float64, device=device)
        )
        # shifted differences on every adjacent pair of tokens, then zeroed where the pair crosses a round end
        shift_next = torch.empty_like(y)
        shift_prev = torch.empty_like(y)
        if tokens > 1:
            torch.sub(trainer[1:], rollout[:-1], out=shift_next[:-1]).abs_()
            torch.sub(trainer[:-1], rollout[1:], out=shift_prev[:-1]).abs_()
        shift_next.index_fill_(0, round_last, 0.0)  # the last token of a round has no pair (the last token of all too)
        shift_prev.index_fill_(0, round_last, 0.0)
        dummy, dummy_run, copied = self._patterns(round_last)
        return {
            "first_y": gathered(round_first, y),
            "first_y2": gathered(round_first, y2),
            "last_y": gathered(row_last, y),
            "last_y2": gathered(row_last, y2),
            "both": both_n,
            "both_y": gathered(both, y),
            "both_y2": gathered(both, y2),
            "round_last_abs": gathered(round_last, abs_delta),
            "shift_next": self.row_sum(shift_next),
            "shift_prev": self.row_sum(shift_prev),
            "dummy_zero": dummy,
            "dummy_zero_run": dummy_run,
            "copied": copied,
        }

    def _patterns(self, round_last: Array) -> tuple[Array, Array, Array]:
        """Per row: exact-zero tokens where the other side says p < 0.5, those of them next to another in the same
        round, and exact copies of the neighbour's value where the other side differs by more than log 2 (the torch
        engine's)."""
        import torch

        model = self.chunk.model
        trainer, rollout, row = model.trainer, model.rollout, model.row
        out = [torch.zeros(self.chunk.rows, dtype=torch.float64, device=row.device) for _ in range(3)]

        def count(index: Array, into: Array) -> None:
            into.index_add_(0, row[index], torch.ones(index.numel(), dtype=torch.float64, device=row.device))

        # candidates first (values are ≤ 0 and finite: a product is 0 only where one side is 0)
        zero = torch.nonzero(trainer * rollout == 0.0, as_tuple=True)[0]
        a, r = trainer[zero], rollout[zero]
        zero = zero[((r == 0.0) & (a < LOG_HALF)) | ((a == 0.0) & (r < LOG_HALF))]
        count(zero, out[0])
        if zero.numel() > 1:
            # k and k + 1 adjacent tokens of one round: k is not a round's last token
            linked = (zero[1:] == zero[:-1] + 1) & ~_isin(zero[:-1], round_last)
            in_run = torch.zeros_like(zero, dtype=torch.bool)
            in_run[:-1] |= linked
            in_run[1:] |= linked
            count(zero[in_run], out[1])
        if trainer.numel() > 1:
            same = torch.nonzero((rollout[1:] == rollout[:-1]) | (trainer[1:] == trainer[:-1]), as_tuple=True)[0]
            same = same[~_isin(same, round_last)]  # token k and k + 1 in one round; counted on k + 1
            a0, a1, r0, r1 = trainer[same], trainer[same + 1], rollout[same], rollout[same + 1]
            copied_rollout = (r1 == r0) & (r1 != 0.0) & ((a1 - a0).abs() > COPY_GAP)
            copied_trainer = (a1 == a0) & (a1 != 0.0) & ((r1 - r0).abs() > COPY_GAP)
            hit = same[copied_rollout | copied_trainer] + 1
            count(hit, out[2])
        return out[0], out[1], out[2]

    def row_sum(self, values: Array) -> Array:
        """Σ of a model-token quantity over each row (float64 [R])."""
        return reduce_runs(values, self.row_lengths, "sum")

    def column(self, name: str) -> Array:
        """Per-row sums of one TOKEN_SUMS column (float64 [R])."""
        return self.rows[:, TOKEN_SUMS.index(name)]

    def fit(self) -> tuple[Array, Array, Array]:
        """Per row: (has a fit, slope c of δ ≈ c·r through the origin, R² of that line); computed once (the step sums
        and the examples both read it)."""
        if self._fitted is None:
            self._fitted = self._fit()
        return self._fitted

    def _fit(self) -> tuple[Array, Array, Array]:
        n, cross = self.column("tokens"), self.column("cross")
        rollout_square, delta_square = self.column("rollout_square"), self.column("delta_square")
        fitted = (n >= FIT_MIN_TOKENS) & (rollout_square > 0) & (delta_square > 0)
        slope = cross / arrays.clamp(rollout_square, lower=1e-300)
        # R² = 1 − Σ(δ − c·r)² / Σδ² = (Σδr)² / (Σr² · Σδ²) for the least-squares c
        r2 = cross * cross / arrays.clamp(rollout_square * delta_square, lower=1e-300)
        return fitted, arrays.where(fitted, slope, 0.0), arrays.where(fitted, r2, 0.0)


def _group_sums(chunk: Chunk, row_values: Array) -> Array:
    """Σ of per-row values [R, ...] over each step group [G, ...]."""
    groups = chunk.groups
    out = arrays.zeros((groups.count, *row_values.shape[1:]), row_values)
    return arrays.index_add(out, groups.row_group, row_values)


def _bucket_sums(chunk: Chunk, bucket: Array, buckets: int, columns: list[Array | None]) -> Array:
    """Σ of token values by (step group, bucket) into [G, buckets, K]; a None column counts tokens."""
    s = stats(chunk)
    return arrays.stack([s.group_bincount(bucket, buckets, values) for values in columns], axis=2)


def _evidence(chunk: Chunk) -> _ChunkEvidence:
    found = chunk.cache.get("hint_evidence")
    if found is None:
        found = chunk.cache["hint_evidence"] = _ChunkEvidence(chunk)
    return found


def prepare(chunk: Chunk) -> None:
    """Build the chunk's hint evidence ahead of the accumulator (``passes.Analysis.prepare`` runs this in the
    reader's pipeline, off the thread that updates the families)."""
    _evidence(chunk)


def probability_bucket(rollout: Array) -> Array:
    """Index of each rollout logprob's probability bucket (0: p ≥ 0.9 … 4: p < 0.01): the edges above it."""
    # a comparison per edge: 4× faster than bucketize's binary search over four edges on the CPU
    bucket = arrays.zeros(arrays.size(rollout), rollout, "uint8")  # uint8: adding bools into int64 takes a slow path
    for edge in PROBABILITY_EDGES:
        bucket += rollout < math.log(edge)
    return arrays.astype(bucket, "int64")


class HintEvidenceAccumulator(StepAccumulator):
    """Per step: TOKEN_SUMS and ROW_SUMS (scalars), rollout-probability and position buckets; plus example rows
    per hint and, when the dump has a policy_version column, mismatch per version lag (step − policy_version)."""

    REDUCTIONS: ClassVar[dict[str, str]] = {
        **{name: "sum" for name in TOKEN_SUMS + ROW_SUMS},
        "probability_buckets": "sum",
        "position_buckets": "sum",
        "turn_offsets": "sum",
        **{name: "sum" for name in LATER_SUMS},
        **{name: "sum" for name in SIDE_SUMS},
        **VERSION_EXTREMES,
    }

    def __init__(self) -> None:
        super().__init__()
        self.examples = {kind: TopK(EXAMPLE_ROWS) for kind in EXAMPLE_KINDS}
        self.lags: dict[int, np.ndarray] = {}  # lag → [tokens, Σy, Σy², rows]
        self.has_versions = False
        # file -> pieces of its rows in row order [first row, first step, last step, min, max, back row, back step]
        # (back: the first row whose step is below the step of the row before, -1 for none): where steps go back
        self.files: dict[str, list[tuple[int, ...]]] = {}

    def _stats(self, chunk: Chunk) -> dict[str, Array]:
        evidence = _evidence(chunk)
        sums = _group_sums(chunk, evidence.rows)
        out = {name: sums[:, index] for index, name in enumerate(TOKEN_SUMS)}
        fitted, slope, r2 = evidence.fit()
        good = fitted & (r2 >= FIT_MIN_R2)
        pairs, aligned = evidence.column("pairs"), evidence.column("pair_abs")
        shifted = arrays.minimum(evidence.column("shift_next"), evidence.column("shift_prev"))
        shift_row = arrays.float64(
            (pairs >= SHIFT_ROW_MIN_PAIRS)
            & (aligned >= SHIFT_ROW_MIN_ALIGNED * pairs)
            & (shifted <= SHIFT_MAX_RATIO * aligned)
        )
        row_values = arrays.stack(
            [
                arrays.float64(fitted),
                arrays.float64(good & (slope >= FIT_MIN_SLOPE)),
                arrays.float64(good & (slope <= -FIT_MIN_SLOPE)),
                shift_row,
                shift_row * pairs,
                shift_row * aligned,
                shift_row * shifted,
            ],
            axis=1,
        )
        row_sums = _group_sums(chunk, row_values)
        out.update({name: row_sums[:, index] for index, name in enumerate(ROW_SUMS)})
        if evidence.probability_buckets is not None:  # the numba engine's pass
            out["probability_buckets"] = evidence.probability_buckets
        else:
            s = evidence.stats
            out["probability_buckets"] = _bucket_sums(
                chunk,
                probability_bucket(chunk.model.rollout),
                PROBABILITY_BUCKETS,
                [
                    None,
                    s.token("abs_log_ratio"),
                    s.token("hint_clipped_abs"),
                    s.token("hint_clipped_square"),
                    s.token("log_ratio"),
                    s.token("k3"),
                ],
            )
        # segments never straddle a log2 position bucket: sum per segment, then by bucket
        s = evidence.stats
        position = arrays.clamp(s.segment_bucket, upper=POSITION_BUCKETS - 1)
        out["position_buckets"] = arrays.stack(
            [
                s.bucket_sum(values, position, POSITION_BUCKETS)
                for values in (
                    s.segment_length,
                    s.segment_sum("hint_clipped_abs"),
                    s.segment_sum("hint_clipped_square"),
                )
            ],
            axis=2,
        )
        out.update(_turn_sums(chunk, s))
        out.update(_version_extremes(chunk))
        out.update(_side_sums(chunk))
        return out

    def _finalize(self, state: State) -> dict[str, float]:
        # The evidence is not a metric: rollout_diag.decisions.hints reads the states (see ``evidence``).
        return {}

    def update(self, chunk: Chunk) -> None:
        super().update(chunk)
        evidence = _evidence(chunk)
        self._offer_examples(chunk, evidence)
        self._add_file_steps(chunk)
        self._offer_id_differences(chunk)
        if chunk.policy_version is not None:
            self.has_versions = True
            self._add_lags(chunk, evidence)

    def merge(self, other: StepAccumulator) -> None:
        super().merge(other)
        assert isinstance(other, HintEvidenceAccumulator)
        for kind, tracker in self.examples.items():
            tracker.merge(other.examples[kind])
        for lag, sums in other.lags.items():
            self.lags[lag] = self.lags[lag] + sums if lag in self.lags else sums.copy()
        self.has_versions |= other.has_versions
        for file, pieces in other.files.items():
            self.files[file] = sorted(self.files.get(file, []) + pieces)

    def _offer_id_differences(self, chunk: Chunk) -> None:
        """The first model tokens (by step, file, row, position) whose trainer and rollout token ids differ."""
        rollout_ids = chunk.token_columns.get("rollout_token_ids")
        if rollout_ids is None or chunk.token_ids is None:
            return
        differ = np.flatnonzero(
            arrays.host(chunk.mask).astype(bool) & (arrays.host(chunk.token_ids) != arrays.host(rollout_ids))
        )
        if differ.size == 0:
            return
        offsets = arrays.host(chunk.offsets)
        rows = np.searchsorted(offsets, differ, side="right") - 1
        steps = arrays.host(chunk.step)
        found: dict[int, tuple] = {}
        for token, row in zip(differ.tolist(), rows.tolist(), strict=True):  # the first difference of each row
            if row not in found:
                position = token - int(offsets[row])
                key = (int(steps[row]), chunk.sample_id[row], chunk.file[row], chunk.file_row[row], position)
                found[row] = key
        best = sorted(found.values(), key=lambda key: (key[0], key[2], key[3], key[4]))[:EXAMPLE_ROWS]
        # TopK keeps the largest scores: the earliest first as the highest, −(step, row, position) in one number
        self.examples["retokenization"].offer(
            [(-float(key[0]) * 1e12 - key[3] * 1e6 - key[4], key, None) for key in best]
        )

    def _add_file_steps(self, chunk: Chunk) -> None:
        """Each file's rows of the chunk as one piece: its first and last step, extremes and first step back."""
        files, steps = chunk.file, arrays.host(chunk.step)
        if not files:
            return
        starts = [0] + [i for i in range(1, len(files)) if files[i] is not files[i - 1] and files[i] != files[i - 1]]
        for lo, hi in zip(starts, [*starts[1:], len(files)], strict=True):
            part = steps[lo:hi]
            back = np.flatnonzero(part[1:] < part[:-1]) + 1  # a row whose step is below the row's before
            back_row, back_step = (chunk.file_row[lo + int(back[0])], int(part[back[0]])) if back.size else (-1, -1)
            if back.size > 1:  # rows out of step order (shuffled, interleaved): a layout, not a resume
                back_step = UNORDERED
            piece = (
                chunk.file_row[lo],
                int(part[0]),
                int(part[-1]),
                int(part.min()),
                int(part.max()),
                back_row,
                back_step,
            )
            self.files.setdefault(files[lo], []).append(piece)

    def _row_scores(self, chunk: Chunk, evidence: _ChunkEvidence) -> dict[str, tuple[Array, Array]]:
        """Per hint: (score of each row, rows that show the pattern at all)."""
        pairs = evidence.column("pairs")
        shifted = arrays.minimum(evidence.column("shift_next"), evidence.column("shift_prev"))
        drop = (evidence.column("pair_abs") - shifted) / arrays.clamp(pairs, lower=1.0)  # mean |δ| the shift removes
        fitted = evidence.fit()[0]
        first, last = evidence.column("first"), evidence.column("last")
        first_mean = evidence.column("first_y") / arrays.clamp(first, lower=1.0)
        rest_mean = evidence.column("rest_y") / arrays.clamp(evidence.column("rest"), lower=1.0)
        dummy = evidence.column("dummy_zero_run") + evidence.column("copied")
        # processed logprobs: the δ ≈ α + β·r fit with an intercept (a temperature adds a context-dependent offset:
        # r = a / T + c, so δ is no multiple of r); |β|·R² ranks the rows
        n = arrays.clamp(evidence.column("tokens"), lower=1.0)
        mean_r, mean_d = evidence.column("rollout_sum") / n, evidence.column("delta_sum") / n
        var_r = evidence.column("rollout_square") / n - mean_r * mean_r
        var_d = evidence.column("delta_square") / n - mean_d * mean_d
        cov = evidence.column("cross") / n - mean_r * mean_d
        varying = fitted & (var_r > 1e-12) & (var_d > 1e-300)
        beta = cov / arrays.clamp(var_r, lower=1e-12)
        r2_intercept = cov * cov / arrays.clamp(var_r * var_d, lower=1e-300)
        processed = arrays.where(varying, abs(beta) * r2_intercept, 0.0)
        scores = {
            "off_by_one": (drop, (pairs > 0) & (drop > 0)),
            "dummy_logprobs": (dummy, dummy > 0),
            "processed_logprobs": (processed, varying & (abs(beta) >= FIT_MIN_SLOPE)),
            "first_token": (first_mean - rest_mean, (first > 0) & (first_mean > rest_mean)),
            "last_token": (evidence.column("last_y") - rest_mean, (last > 0) & (evidence.column("last_y") > rest_mean)),
        }
        if chunk.policy_version is not None:
            tokens = evidence.column("tokens")
            row_mean = evidence.total_y / arrays.clamp(tokens, lower=1.0)
            lag = arrays.float64(chunk.step - chunk.policy_version)
            # the most stale rows first; among equally stale ones the most mismatched (row_mean < 1)
            scores["staleness"] = (lag + arrays.clamp(row_mean, upper=0.999), tokens > 0)
        return scores

    def _offer_examples(self, chunk: Chunk, evidence: _ChunkEvidence) -> None:
        steps = chunk.step.tolist()
        for kind, (score, shows) in self._row_scores(chunk, evidence).items():
            tracker = self.examples[kind]
            values, eligible = arrays.host(score), arrays.host(shows)
            candidates = top_candidates(
                values, np.flatnonzero(eligible & (values >= tracker.threshold())), EXAMPLE_ROWS
            )
            if candidates.size == 0:
                continue
            keys = {
                row: (steps[row], chunk.sample_id[row], chunk.file[row], chunk.file_row[row], -1)
                for row in candidates.tolist()
            }
            # sorted as TopK sorts (score, then location), so the kept rows do not depend on chunking
            best = sorted(keys, key=lambda row: (-values[row], keys[row]))[:EXAMPLE_ROWS]
            tracker.offer([(float(values[row]), keys[row], None) for row in best])

    def _add_lags(self, chunk: Chunk, evidence: _ChunkEvidence) -> None:
        tokens = evidence.column("tokens")
        lag = arrays.host(chunk.step - chunk.policy_version)
        per_row = arrays.stack([tokens, evidence.total_y, evidence.total_y2, arrays.float64(tokens > 0)], axis=1)
        per_row_host = arrays.host(per_row)
        for value in np.unique(lag).tolist():
            sums = per_row_host[lag == value].sum(axis=0)
            if sums[0] == 0:
                continue
            self.lags[value] = self.lags[value] + sums if value in self.lags else sums

    def evidence(self) -> Evidence:
        """The run's and each step's sums, the example rows and the version lags, for ``decisions.hints``."""
        run = self.run_state()
        examples: dict[str, list[RowRef]] = {}
        for kind, tracker in self.examples.items():
            examples[kind] = [
                RowRef(
                    step=key[0],
                    sample_id=key[1],
                    file=key[2],
                    row=key[3],
                    score=float(key[4]) if kind == "retokenization" else score,  # there: the token's position
                )
                for score, key, _ in tracker.items
            ]
        return Evidence(
            run=_named(run) if run is not None else {},
            steps=_NamedSteps(self.store),
            examples=examples,
            lags={lag: [float(v) for v in sums] for lag, sums in sorted(self.lags.items())},
            has_versions=self.has_versions,
            files={file: list(pieces) for file, pieces in self.files.items()},
        )


class _NamedSteps(Mapping):
    """Each step's sums as ``_named`` gives them, built when read (a hint reads them only when it fires; a run can
    have 200 000 steps)."""

    def __init__(self, store: StateTable) -> None:
        self.store = store

    def __getitem__(self, step: int) -> Mapping[str, Any]:
        index = int(np.searchsorted(self.store.steps, step))
        if index >= self.store.steps.shape[0] or self.store.steps[index] != step:
            raise KeyError(step)
        return _StepSums(self.store, step, index)

    def __iter__(self) -> Iterator[int]:
        return iter(self.store.steps.tolist())

    def __len__(self) -> int:
        return int(self.store.steps.shape[0])

    def columns(self, names: Sequence[str]) -> tuple[np.ndarray, list[np.ndarray]]:
        """The steps, ascending, and each scalar of ``names`` at every step: what a rule over every step reads
        (``decisions/resume.py``) instead of each step's mapping."""
        return np.asarray(self.store.steps), [np.asarray(self.store.dense[name], dtype=np.float64) for name in names]

    def items(self) -> Iterator[tuple[int, Mapping[str, Any]]]:  # type: ignore[override]
        # each step's sums built when read, from the states read block by block: a hint's test of every step reads
        # one of the three bucket lists, and the step's others (~200 floats as dicts) are not built
        return (
            (step, _StepSums(self.store, step, index, state)) for index, (step, state) in enumerate(self.store.states())
        )


_SCALARS = (*TOKEN_SUMS, *ROW_SUMS, *LATER_SUMS, *SIDE_SUMS, *VERSION_EXTREMES)
_BUCKETS = {
    "probability_buckets": PROBABILITY_COLUMNS,
    "position_buckets": POSITION_COLUMNS,
    "turn_offsets": TURN_COLUMNS,
}


def _named(state: State) -> dict[str, Any]:
    """A state as plain floats and nested lists (what the pure hint functions read)."""
    out: dict[str, Any] = {name: float(state[name]) for name in _SCALARS}
    for name, columns in _BUCKETS.items():
        out[name] = _bucket_dicts(state[name], columns)
    return out


def _bucket_dicts(buckets: np.ndarray, columns: tuple[str, ...]) -> list[dict[str, float]]:
    return [dict(zip(columns, map(float, bucket), strict=True)) for bucket in buckets]


class _StepSums(Mapping):
    """One step's ``_named`` sums, each built when read: a scalar straight from its column, the buckets from the step's
    state (built once). The resume rules read two scalars of every step (``decisions/resume.py``); a whole step's
    nested buckets are ~200 floats."""

    def __init__(self, store: StateTable, step: int, index: int, state: State | None = None) -> None:
        self.store, self.step, self.index = store, step, index
        self._state: State | None = state
        self._buckets: dict[str, list[dict[str, float]]] = {}

    def __getitem__(self, name: str) -> Any:
        if name in _BUCKETS:
            if name not in self._buckets:
                if self._state is None:
                    self._state = self.store.state(self.step)
                self._buckets[name] = _bucket_dicts(self._state[name], _BUCKETS[name])
            return self._buckets[name]
        if name not in _SCALARS:
            raise KeyError(name)
        return float(self.store.dense[name][self.index])

    def __iter__(self) -> Iterator[str]:
        return iter((*_SCALARS, *_BUCKETS))

    def __len__(self) -> int:
        return len(_SCALARS) + len(_BUCKETS)


def _take(values: Array, index: np.ndarray) -> np.ndarray:
    """values[index] on the host (a tensor is indexed where it lives, only the few values come back)."""
    if arrays.is_tensor(values):
        return arrays.host(values[arrays.like(index, values)])
    return values[index]


def _turn_sums(chunk: Chunk, s: ChunkStats | KernelStats) -> dict[str, Array]:
    """[G, 2·TURN_OFFSETS, 3] sums of the first tokens of each round by offset (round 0, then later rounds) and the
    later rounds' [G] totals: a gather of ≤ TURN_OFFSETS tokens a round and sums over segments already taken (the
    numba engine: ``KernelStats.round_openings``, the same additions in the same order, compiled)."""
    if isinstance(s, KernelStats):  # the numba engine: the fused pass took the same sums
        table, later_sums = s.round_openings()
        return {"turn_offsets": table, **dict(zip(LATER_SUMS, later_sums, strict=True))}
    groups = chunk.groups.count
    buckets = 2 * TURN_OFFSETS
    starts, rows = arrays.host(s.segment_starts), arrays.host(s.segment_row)
    rounds, segment_group = arrays.host(s.segment_round), arrays.host(s.segment_group)
    later = rounds >= 1
    y_segment, y2_segment = (
        arrays.host(s.segment_sum("hint_clipped_abs")),
        arrays.host(s.segment_sum("hint_clipped_square")),
    )
    totals = {
        "later_tokens": np.bincount(segment_group[later], arrays.host(s.segment_length)[later], groups),
        "later_y": np.bincount(segment_group[later], y_segment[later], groups),
        "later_y2": np.bincount(segment_group[later], y2_segment[later], groups),
    }
    offsets = np.zeros((groups * buckets, len(TURN_COLUMNS)))
    if starts.size:
        opens = np.ones(starts.size, dtype=bool)
        opens[1:] = (rows[1:] != rows[:-1]) | (rounds[1:] != rounds[:-1])
        first = starts[opens]
        length = np.diff(np.append(first, int(s.model_tokens)))
        offset = np.arange(TURN_OFFSETS)
        valid = offset[None, :] < length[:, None]
        index = (first[:, None] + offset[None, :])[valid]  # a round's tokens are consecutive
        trainer, rollout = chunk.model.trainer, chunk.model.rollout
        delta = _take(trainer, index) - _take(rollout, index)
        y = np.minimum(np.abs(delta), CLIP)
        bucket = np.broadcast_to(offset, valid.shape)[valid] + TURN_OFFSETS * np.repeat(later[opens], valid.sum(axis=1))
        key = np.repeat(segment_group[opens], valid.sum(axis=1)) * buckets + bucket
        for column, weights in enumerate((None, y, y * y)):
            offsets[:, column] = np.bincount(key, weights, groups * buckets)
    like = arrays.float64(chunk.groups.row_group)
    out = {name: arrays.like(values.astype(np.float64), like) for name, values in totals.items()}
    out["turn_offsets"] = arrays.like(offsets.reshape(groups, buckets, len(TURN_COLUMNS)), like)
    return out


def _side_sums(chunk: Chunk) -> dict[str, Array]:
    """SIDE_SUMS per step group from the per-token side columns (zeros without them): a pass over the raw arrays only
    for dumps that carry one."""
    groups = chunk.groups.count
    like = arrays.float64(chunk.groups.row_group)
    sums = {name: np.zeros(groups) for name in SIDE_SUMS}
    columns = chunk.token_columns
    if columns:
        mask = arrays.host(chunk.mask).astype(bool)
        group = arrays.host(chunk.groups.row_group)[arrays.host(chunk.token_row)]
        rollout_ids = columns.get("rollout_token_ids")
        if rollout_ids is not None and chunk.token_ids is not None:
            ids, other = arrays.host(chunk.token_ids), arrays.host(rollout_ids)
            both = mask & (ids >= 0) & (other >= 0)
            sums["id_tokens"] = np.bincount(group[both], minlength=groups).astype(np.float64)
            sums["id_differ"] = np.bincount(group[both & (ids != other)], minlength=groups).astype(np.float64)
        kept = columns.get("kept_mass")
        if kept is not None:
            mass = arrays.host(kept)
            with np.errstate(divide="ignore", invalid="ignore"):
                usable = mask & (mass > 0) & (mass <= 1)
                log_mass = np.log(np.where(usable, mass, 1.0))
            delta = arrays.host(chunk.trainer) - arrays.host(chunk.rollout)
            index = group[usable]
            sums["kept_tokens"] = np.bincount(index, minlength=groups).astype(np.float64)
            sums["kept_log"] = np.bincount(index, log_mass[usable], groups).astype(np.float64, copy=False)
            sums["kept_residual"] = np.bincount(index, np.abs(delta - log_mass)[usable], groups).astype(
                np.float64, copy=False
            )
            sums["kept_abs"] = np.bincount(index, np.abs(delta)[usable], groups).astype(np.float64, copy=False)
    return {name: arrays.like(values, like) for name, values in sums.items()}


def _version_extremes(chunk: Chunk) -> dict[str, Array]:
    """Each step group's lowest and highest policy_version (±inf without the column)."""
    groups = chunk.groups.count
    like = arrays.float64(chunk.groups.row_group)
    if chunk.policy_version is None:
        return {
            "version_min": arrays.full(groups, math.inf, like),
            "version_max": arrays.full(groups, -math.inf, like),
        }
    versions = arrays.float64(chunk.policy_version)
    row_group = chunk.groups.row_group
    return {
        "version_min": arrays.scatter_min(arrays.full(groups, math.inf, like), row_group, versions),
        "version_max": arrays.scatter_max(arrays.full(groups, -math.inf, like), row_group, versions),
    }
