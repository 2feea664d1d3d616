"""Per-round (multi-turn) metrics (METRICS.md §7, keys ``per_round/…``).

A round is a maximal run of mask-1 tokens within a row, numbered 0, 1, … Rounds at index
``max_rounds`` and beyond are pooled into one bucket (key ``round_<max_rounds>``, marked ``pooled``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rollout_diag import catalogue
from rollout_diag.engine import arrays
from rollout_diag.engine.arrays import Array, segment_max
from rollout_diag.engine.quantities import BANDS, COUNTS
from rollout_diag.engine.stats import stats
from rollout_diag.io.chunk import Chunk
from rollout_diag.metrics.base import Columns, KeyGroup, State, StepAccumulator

PREFIX = catalogue.ROUNDS_PREFIX
DEFAULT_MAX_ROUNDS = 64
# most_divergent_round names a round only with support (the rule lives in the catalogue: decisions reads it too)
SUPPORT_TOKENS = catalogue.ROUND_SUPPORT_TOKENS
SUPPORT_ROWS = catalogue.ROUND_SUPPORT_ROWS
SUPPORT_SHARE = catalogue.ROUND_SUPPORT_SHARE
# COUNTS but the first (bitwise differences are a step's and the run's): |δ| > ln 2, ln 5, |δ| ≤ each band
ROUND_COUNTS = COUNTS[1:]
ROUND_BANDS = tuple(zip(COUNTS[3:], BANDS, strict=True))
_COUNT_STATE = (*ROUND_COUNTS, *(f"rows_{name}" for name, _ in ROUND_BANDS))
ROUND_SUMS = (
    "token_count",
    "seq_count",
    "abs_diff",
    "kl",
    "k3_kl",
    "chi2_token",
    "catastrophic",
    *_COUNT_STATE,  # |δ| > ln 2, ln 5, ≤ each band; rows whose every round-k token has |δ| ≤ the band
)
supported = catalogue.supported_rounds


def most_divergent_round(rounds: list[dict[str, Any]]) -> int | None:
    """The supported round with the highest mean |δ| (ties: the earliest); None when no round has support."""
    candidates = supported(rounds)
    if not candidates:
        return None
    return int(max(candidates, key=lambda r: (r["logprob_abs_diff_mean"], -r["round"]))["round"])


class RoundAccumulator(StepAccumulator):
    """Per step, arrays over round buckets 0..max_rounds of token-level sums and |δ| maxima."""

    def __init__(self, max_rounds: int = DEFAULT_MAX_ROUNDS, catastrophic: float = 1.0) -> None:
        super().__init__()
        self.max_rounds = int(max_rounds)
        self.catastrophic = float(catastrophic)
        # per instance: the round count shapes this family's state
        self.REDUCTIONS = {**{name: "sum" for name in ROUND_SUMS}, "max_abs_diff": "max", "num_rounds_max": "max"}  # type: ignore[misc]

    def _stats(self, chunk: Chunk) -> dict[str, Array]:
        s = stats(chunk)
        groups = chunk.groups
        buckets = self.max_rounds + 1
        bucket = arrays.clamp(s.segment_round, upper=self.max_rounds)

        def by_bucket(name: str) -> Array:
            return s.bucket_sum(s.segment_sum(name), bucket, buckets)

        rounds = s.rounds_per_row
        # seq_count[k] = rows with more than k rounds (bucket max_rounds: more than max_rounds).
        histogram = arrays.host(  # [G, buckets + 1], small: counted up on the host
            arrays.bincount(
                groups.row_group * (buckets + 1) + arrays.clamp(rounds, upper=buckets),
                None,
                groups.count * (buckets + 1),
            )
        ).reshape(groups.count, buckets + 1)
        rows_with_more = np.ascontiguousarray(histogram[:, ::-1].cumsum(1)[:, ::-1][:, 1:])
        return {
            "token_count": s.bucket_sum(s.segment_length, bucket, buckets),
            "seq_count": rows_with_more,
            "abs_diff": by_bucket("abs_log_ratio"),
            "kl": -by_bucket("log_ratio"),  # as §1 kl: r − a
            "k3_kl": by_bucket("k3"),
            "chi2_token": by_bucket("chi2_term"),
            "catastrophic": by_bucket(s.catastrophic(self.catastrophic)),
            **s.count_sums(ROUND_COUNTS, bucket, buckets),
            **self._rows_within(s, bucket, buckets),
            "max_abs_diff": s.bucket_max(s.segment_max("abs_log_ratio"), bucket, buckets),
            "num_rounds_max": segment_max(arrays.float64(rounds), groups.row_group, groups.count),
        }

    @staticmethod
    def _rows_within(s: Any, bucket: Array, buckets: int) -> dict[str, Array]:
        """Per step group and round bucket, the rows whose every token of that bucket has |δ| ≤ each band: the max |δ|
        of each (row, bucket) from the segment maxima, then the rows counted where it is within the band."""
        if not arrays.is_tensor(bucket):
            return _rows_within_runs(s, bucket, buckets)
        rows = s.chunk.rows
        place = s.segment_row * buckets + bucket
        largest = arrays.scatter_max(
            arrays.full(rows * buckets, -np.inf, s.segment_max("abs_log_ratio")),
            place,
            s.segment_max("abs_log_ratio"),
        )
        places = arrays.flatnonzero(largest > -np.inf)  # the (row, bucket) pairs with tokens: a few per row
        largest = largest[places]
        group_place = s.chunk.groups.row_group[places // buckets] * buckets + places % buckets
        out = {}
        for name, band in ROUND_BANDS:  # counts of 0 and 1: exact sums, those of the pairs without tokens left out
            kept = arrays.float64(largest <= band)
            counts = arrays.zeros(s.chunk.groups.count * buckets, kept)
            out[f"rows_{name}"] = arrays.index_add(counts, group_place, kept).reshape(s.chunk.groups.count, buckets)
        return out

    def table(self, state: State) -> list[dict[str, Any]]:
        """One dict per round bucket that has tokens: round, pooled, counts and means."""
        tokens = state["token_count"]
        rows: list[dict[str, Any]] = []
        for k in np.flatnonzero(tokens > 0):
            n = float(tokens[k])
            rows.append(
                {
                    "round": int(k),
                    "pooled": bool(k == self.max_rounds),
                    "token_count": int(n),
                    "seq_count": int(state["seq_count"][k]),
                    "logprob_abs_diff_mean": float(state["abs_diff"][k]) / n,
                    "kl": float(state["kl"][k]) / n,
                    "k3_kl": float(state["k3_kl"][k]) / n,
                    "chi2_token": float(state["chi2_token"][k]) / n - 1.0,
                    "max_abs_diff": float(state["max_abs_diff"][k]),
                    "catastrophic_count": int(state["catastrophic"][k]),
                    "catastrophic_share": float(state["catastrophic"][k]) / n,
                    **{
                        name: float(value[0])
                        for name, value in round_counts(
                            {key: state[key][None, :] for key in ("seq_count", *_COUNT_STATE)}, int(k), np.array([n])
                        ).items()
                    },
                }
            )
        return rows

    def finalize_block(self, columns: Columns) -> list[KeyGroup]:
        """The family's metrics over a block of steps: its one formula (the run is a block of one, ``_finalize``)."""
        tokens, seq_count = columns["token_count"], columns["seq_count"]
        present = tokens > 0
        groups: list[KeyGroup] = []
        with np.errstate(divide="ignore", invalid="ignore"):
            for k in np.flatnonzero(present.any(axis=0)).tolist():
                n = tokens[:, k]
                values = {
                    "logprob_abs_diff_mean": columns["abs_diff"][:, k] / n,
                    "token_count": n,
                    "seq_count": seq_count[:, k],
                    "k3_kl": columns["k3_kl"][:, k] / n,
                    "kl": columns["kl"][:, k] / n,
                    "chi2_token": columns["chi2_token"][:, k] / n - 1.0,
                    "max_abs_diff": columns["max_abs_diff"][:, k],
                    **round_counts(columns, k, n),
                }
                groups.append((present[:, k], {f"{PREFIX}round_{k}/{name}": v for name, v in values.items()}))
            any_round = present.any(axis=1)
            groups.append((any_round, {PREFIX + "num_rounds_max": columns["num_rounds_max"]}))
            # most_divergent_round: supported() and the highest mean |δ|, ties to the earliest round
            most_tokens = np.where(present, tokens, -np.inf).max(axis=1, initial=-np.inf)
            most_rows = np.where(present, seq_count, -np.inf).max(axis=1, initial=-np.inf)
            min_tokens = np.minimum(SUPPORT_TOKENS, SUPPORT_SHARE * most_tokens)
            min_rows = np.minimum(SUPPORT_ROWS, np.ceil(SUPPORT_SHARE * most_rows))
            candidate = present & (tokens >= min_tokens[:, None]) & (seq_count >= min_rows[:, None])
            means = np.where(candidate, columns["abs_diff"] / tokens, -np.inf)
        best = np.argmax(means, axis=1).astype(np.float64)
        groups.append((candidate.any(axis=1), {PREFIX + "most_divergent_round": best}))
        return groups

    def finalize_table(self) -> list[dict[str, Any]]:
        state = self.run_state()
        return [] if state is None else self.table(state)


def _rows_within_runs(s: Any, bucket: np.ndarray, buckets: int) -> dict[str, np.ndarray]:
    """``RoundAccumulator._rows_within`` of a numpy chunk: each (row, bucket) pair's segments as one run
    (``arrays.index_runs``: a row's segments come in order and its rounds never go down, so no sort), its max |δ| by
    reduceat (no [rows × buckets] array), and the bands are nested, so one bincount of each pair's first band at or
    above its max counts every band (counts of 0 and 1: exact in any order)."""
    groups = s.chunk.groups
    place = s.segment_row * buckets + bucket
    order, starts, pair = arrays.index_runs(place, s.chunk.rows * buckets)
    maxima = s.segment_max("abs_log_ratio")
    maxima = maxima if order is None else maxima[order]
    largest = np.maximum.reduceat(maxima, starts) if starts.shape[0] else np.zeros(0)
    group_place = groups.row_group[pair // buckets] * buckets + pair % buckets
    levels = len(ROUND_BANDS) + 1  # a pair within band k (k = 0, 1, …) has level ≤ k; above every band: the last
    level = np.searchsorted(_BAND_EDGES, largest)  # NaN sorts last: within no band
    pairs = np.bincount(group_place * levels + level, minlength=groups.count * buckets * levels)
    within = np.cumsum(pairs.reshape(groups.count * buckets, levels), axis=1).astype(np.float64)
    return {f"rows_{name}": within[:, k].reshape(groups.count, buckets) for k, (name, _) in enumerate(ROUND_BANDS)}


_BAND_EDGES = np.array([band for _, band in ROUND_BANDS])


def round_counts(columns: Any, k: int, tokens: np.ndarray) -> dict[str, np.ndarray]:
    """Round bucket k's extreme-token shares and tolerance bands over a block of steps (the §1 family's keys, per round:
    ``metrics/offpolicy.py`` ``exact_counts``): shares of its tokens above ln 2 and ln 5, within each band, and of the
    rows that reach it whose every round-k token is within the band."""
    rows = columns["seq_count"][:, k]
    out = {
        "extreme_frac_ln2": columns["above_ln2"][:, k] / tokens,
        "extreme_frac_ln5": columns["above_ln5"][:, k] / tokens,
    }
    for name, _ in ROUND_BANDS:
        band = name.removeprefix("within_")
        out[f"band_token_share@{band}"] = columns[name][:, k] / tokens
        out[f"band_seq_share@{band}"] = columns[f"rows_{name}"][:, k] / rows
    return out
