"""Mismatch against the trainer's own columns: how row mismatch goes with reward, advantage, entropy and response
length, and whether a GRPO group's worst row is its best-rewarded one.

Row mismatch is the quantity the worst-rows table ranks by: |d_i|, d_i = R_i[r] − R_i[a] (METRICS.md §1, the row's
log-ppl diff), over rows with a model token.

- **Rank correlations.** A bounded sample of rows keeps, per row, |d_i| and the value of each trainer column: the
  ``SAMPLE_ROWS`` rows with the smallest keys, a row's key a 64-bit hash of (its step, its sample id, ``SEED``). The
  sample is the same whatever the chunking, the row order, the file split or the worker count (bottom-k sampling
  merges exactly), and for a dump of at most ``SAMPLE_ROWS`` rows it is every row. Spearman's ρ is taken on it
  (average ranks for ties), with a 95 % interval from Fisher's z of ρ with the Bonett–Wright standard error sqrt((1 +
  ρ²/2)/(n − 3)).
- **Groups.** Per (step, group id) over every row (no sample): the row count, the worst row's |d_i| and its
  advantage (the largest |d_i|; equal ones: the smaller key), and the group's largest and smallest advantage. A group
  counts where it has 2 rows or more and its advantages differ; its worst row "is the best" where its advantage is
  the group's largest. Chance: a uniformly random row is a top-advantage one with probability (rows at the largest
  advantage) / (rows), so the count by chance is a Poisson-binomial; its upper tail is the one-sided p-value
  (exact up to ``EXACT_GROUPS`` groups, a normal approximation with continuity correction beyond).

Numbers only: what is significant is decided in ``rollout_diag/decisions/association.py``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from rollout_diag.engine import arrays
from rollout_diag.engine.stats import stats
from rollout_diag.io.chunk import Chunk
from rollout_diag.io.readlog import row_keys
from rollout_diag.metrics.offpolicy import log_ppl_diff

# Trainer columns, by what they are: the dump column names recognised for each, the first present taken.
TRAINER_COLUMNS: dict[str, tuple[str, ...]] = {
    "reward": ("reward", "rewards", "score", "scores", "token_level_scores"),
    "advantage": ("advantage", "advantages"),
    "entropy": ("entropy", "entropies", "mean_entropy"),
    "response_length": ("response_length",),
}
GROUP_COLUMNS = ("uid", "group_id", "prompt_id")  # a GRPO group's id (verl: uid), the first present taken
SUFFIXED_ID = re.compile(r".+#\d+")  # a sample id "<prompt id>#<k>" (rollout_diag.trainers.unique_sample_ids)
SAMPLE_ROWS = 50_000  # rows kept for the rank correlations: 50 000 × (8 + 8 + 8 per column) bytes at most
SEED = 20_261_127
MAX_GROUPS = 4_000_000  # (step, group) pairs tracked: beyond, the group rule stops (and says so)
EXACT_GROUPS = 5_000  # the Poisson-binomial tail exactly up to this many groups
Z95 = 1.959963984540054
SCATTER_POINTS = 2_000  # up to this many sampled rows the report draws points; beyond, a binned 2-D histogram
HISTOGRAM_BINS = 30


def _mix(values: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a well-spread 64-bit key for each 64-bit input (wrapping arithmetic)."""
    z = values.astype(np.uint64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def sample_keys(steps: np.ndarray, sample_ids: Sequence[str], seed: int = SEED) -> np.ndarray:
    """uint64 [R]: each row's sampling key, a function of its step, its sample id and ``seed`` only (the skipped rows'
    hash, ``io.readlog.row_keys``, mixed with the seed): not of the chunk, the order, the file split or the worker
    that read it."""
    with np.errstate(over="ignore"):
        return _mix(row_keys(np.asarray(steps), sample_ids) ^ _mix(np.array([seed], dtype=np.uint64)))


def numeric_values(values: Any, rows: int) -> np.ndarray:
    """float64 [rows]: an extra column's values as numbers (NaN for null, text, or a value that is no number)."""
    if values is None:
        return np.full(rows, np.nan)
    array = getattr(values, "array", None)  # text or nullable columns stay Arrow arrays (io/reader.py)
    raw = array.to_pylist() if array is not None else values
    if isinstance(raw, np.ndarray) and raw.dtype.kind in "fiub":
        return raw.astype(np.float64)
    out = np.full(rows, np.nan)
    for index, value in enumerate(raw):
        if isinstance(value, (int, float, np.integer, np.floating, np.bool_)):  # bool is an int: 0 or 1
            out[index] = float(value)
    return out


def _group_values(values: Any) -> list[Any]:
    array = getattr(values, "array", None)
    raw = array.to_pylist() if array is not None else list(values.tolist() if hasattr(values, "tolist") else values)
    return raw


def group_ids(chunk: Chunk) -> tuple[str, list[Any]] | None:
    """(where from, each row's GRPO group id) of ``chunk``: an extra column of GROUP_COLUMNS; the reader's prompt
    key where it has one (``Chunk.prompt_key``: a prompt_id column's, or the token ids before the first model
    token); else sample ids written ``<id>#<k>`` (verl's and SkyRL's importers and
    ``DumpWriter`` make a prompt's k-th response's id so: the group is ``<id>``). None without any."""
    for name in GROUP_COLUMNS:
        if name in chunk.extra:
            return name, _group_values(chunk.extra[name])
    prompt_keys = chunk.prompt_key  # the reader's prompt identity (io/prompts.py): a key per row, 0 for none
    if prompt_keys is not None:
        return f"prompt ({chunk.prompt_source or 'key'})", [key or None for key in prompt_keys.tolist()]
    ids = chunk.sample_id
    if ids and all(SUFFIXED_ID.fullmatch(str(sample)) for sample in ids):
        return "prompt (sample id prefix)", [str(sample).rsplit("#", 1)[0] for sample in ids]
    return None


def ranks(values: np.ndarray) -> np.ndarray:
    """Average ranks (1-based; ties share their mean rank), as Spearman's ρ takes them."""
    order = np.argsort(values, kind="mergesort")
    ordered = values[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    ends = np.r_[starts[1:], len(values)]
    mean_rank = (starts + ends + 1) / 2.0  # ranks starts+1 .. ends averaged
    out = np.empty(len(values))
    out[order] = np.repeat(mean_rank, ends - starts)
    return out


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's ρ of ``x`` and ``y`` (Pearson's on average ranks); NaN where either is constant or n < 2."""
    if len(x) < 2:
        return math.nan
    rank_x, rank_y = ranks(x), ranks(y)
    rank_x -= rank_x.mean()
    rank_y -= rank_y.mean()
    scale = math.sqrt(float(rank_x @ rank_x) * float(rank_y @ rank_y))
    return float(rank_x @ rank_y) / scale if scale > 0 else math.nan


def fisher_interval(rho: float, n: int) -> tuple[float, float]:
    """95 % interval of a rank correlation ``rho`` over ``n`` rows: tanh(atanh ρ ± 1.96·sqrt((1 + ρ²/2)/(n − 3)))
    (Bonett & Wright 2000); (NaN, NaN) for n ≤ 3 or ρ NaN."""
    if n <= 3 or not math.isfinite(rho):
        return math.nan, math.nan
    clipped = min(max(rho, -0.999999999), 0.999999999)
    centre = math.atanh(clipped)
    spread = Z95 * math.sqrt((1.0 + rho * rho / 2.0) / (n - 3))
    return math.tanh(centre - spread), math.tanh(centre + spread)


def poisson_binomial_tail(probabilities: np.ndarray, observed: int) -> float:
    """P(X ≥ observed) for X a sum of independent Bernoulli(p_g): exact (a convolution) up to EXACT_GROUPS values,
    else a normal approximation with continuity correction."""
    if observed <= 0:
        return 1.0
    if len(probabilities) <= EXACT_GROUPS:
        distribution = np.zeros(len(probabilities) + 1)
        distribution[0] = 1.0
        for count, p in enumerate(probabilities.tolist(), start=1):
            distribution[1 : count + 1] = distribution[1 : count + 1] * (1 - p) + distribution[:count] * p
            distribution[0] *= 1 - p
        return float(min(1.0, distribution[observed:].sum()))
    mean = float(probabilities.sum())
    spread = math.sqrt(float((probabilities * (1 - probabilities)).sum()))
    if spread == 0:
        return 1.0 if observed <= mean else 0.0
    return 0.5 * math.erfc((observed - 0.5 - mean) / spread / math.sqrt(2.0))


def histogram_2d(x: np.ndarray, y: np.ndarray, bins: int = HISTOGRAM_BINS) -> dict[str, list]:
    """Counts of the points (x, y) on a bins × bins grid: x linear over its range, y (row |log-ppl diff|, heavy
    tailed) on log10 over its positive range (0 in the first bin)."""
    x_low, x_high = float(x.min()), float(x.max())
    if x_high <= x_low:
        x_high = x_low + 1.0
    x_edges = np.linspace(x_low, x_high, bins + 1)
    positive = y[y > 0]
    y_low = float(np.log10(positive.min())) if positive.size else -8.0
    y_high = float(np.log10(positive.max())) if positive.size else y_low + 1.0
    if y_high <= y_low:
        y_high = y_low + 1.0
    log_edges = np.linspace(y_low, y_high, bins + 1)
    with np.errstate(divide="ignore"):
        y_log = np.where(y > 0, np.log10(np.where(y > 0, y, 1.0)), y_low)
    counts, _, _ = np.histogram2d(x, y_log, bins=[x_edges, log_edges])
    return {
        "x_edges": x_edges.tolist(),
        "y_edges": (10.0**log_edges).tolist(),
        "counts": counts.astype(np.int64).T.tolist(),  # [y bin][x bin]
    }


class TrainerColumnsTracker:
    """The row sample and the per-group state (see the module's docstring); ``update``, ``merge``, ``finalize``."""

    def __init__(self, sample_rows: int = SAMPLE_ROWS, seed: int = SEED) -> None:
        self.sample_rows = int(sample_rows)
        self.seed = int(seed)
        self.columns: dict[str, str] = {}  # role -> the dump column read for it
        self.group_column: str | None = None
        self.keys = np.zeros(0, dtype=np.uint64)
        self.mismatch = np.zeros(0)
        self.values: dict[str, np.ndarray] = {}  # role -> float64 aligned with keys
        self.rows = 0  # rows with a model token seen
        # (step, group id) -> [rows, worst |d|, worst key (an int), advantage of the worst, largest advantage,
        # smallest, rows at the largest advantage]
        self.groups: dict[tuple[int, Any], list[float]] = {}
        self.groups_overflow = False
        self.derived_length = False  # response_length counted from the mask (no such column)

    def _roles(self, chunk: Chunk) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for role, names in TRAINER_COLUMNS.items():
            name = self.columns.get(role) or next((name for name in names if name in chunk.extra), None)
            if name is not None and name in chunk.extra:
                self.columns.setdefault(role, name)
                found[role] = chunk.extra[name]
        return found

    def update(self, chunk: Chunk) -> None:
        found = self._roles(chunk)
        if not found:
            return  # rows without a trainer column are never sampled (whichever part of the input reads them)
        s = stats(chunk)
        n = s.row_count
        mismatch = np.abs(arrays.host(log_ppl_diff(s)))
        model_tokens = arrays.host(n)
        valid = model_tokens > 0
        keys = sample_keys(arrays.host(chunk.step), chunk.sample_id, self.seed)
        values = {role: numeric_values(found.get(role), chunk.rows) for role in self.columns}
        if "response_length" not in self.columns:
            self.derived_length = True
            values["response_length"] = model_tokens.astype(np.float64)
        self.rows += int(valid.sum())
        self._sample(keys[valid], mismatch[valid], {role: column[valid] for role, column in values.items()})
        ranking = values.get("advantage", values.get("reward"))
        grouped = group_ids(chunk)
        if grouped is not None and ranking is not None and not self.groups_overflow:
            self.group_column = self.group_column or grouped[0]
            self._group_update(arrays.host(chunk.step), grouped[1], keys, mismatch, ranking, valid)

    def _sample(self, keys: np.ndarray, mismatch: np.ndarray, values: dict[str, np.ndarray]) -> None:
        if len(self.keys) >= self.sample_rows:  # only rows below the current k-th key can enter
            entering = keys < self.keys.max()
            keys, mismatch = keys[entering], mismatch[entering]
            values = {role: column[entering] for role, column in values.items()}
        if not len(keys):
            return
        held = len(self.keys)
        for role in set(values) | set(self.values):
            mine = self.values.get(role, np.full(held, np.nan))
            theirs = values.get(role, np.full(len(keys), np.nan))
            self.values[role] = np.concatenate([mine, theirs])
        self.keys = np.concatenate([self.keys, keys])
        self.mismatch = np.concatenate([self.mismatch, mismatch])
        if len(self.keys) > self.sample_rows:
            keep = np.argpartition(self.keys, self.sample_rows - 1)[: self.sample_rows]
            keep.sort()
            self.keys, self.mismatch = self.keys[keep], self.mismatch[keep]
            self.values = {role: column[keep] for role, column in self.values.items()}

    def _group_update(
        self,
        steps: np.ndarray,
        ids: list[Any],
        keys: np.ndarray,
        mismatch: np.ndarray,
        ranking: np.ndarray,
        valid: np.ndarray,
    ) -> None:
        codes: dict[Any, int] = {None: -1}
        code = np.fromiter((codes.setdefault(value, len(codes) - 1) for value in ids), np.int64, len(ids))
        rows = np.flatnonzero(valid & np.isfinite(ranking) & (code >= 0))
        if not len(rows):
            return
        # (step, group id) pairs numbered 0…count-1: step · K + code is one integer per pair (0 ≤ code < K)
        row_step, row_code = steps[rows].astype(np.int64), code[rows]
        _, first, group_of = np.unique(row_step * len(codes) + row_code, return_index=True, return_inverse=True)
        group_of = group_of.reshape(-1)
        count = len(first)
        value_of = list(codes)[1:]  # code -> the group id
        numbered = {
            (step, value_of[value]): number
            for number, (step, value) in enumerate(zip(row_step[first].tolist(), row_code[first].tolist(), strict=True))
        }
        row_mismatch, row_key, row_rank = mismatch[rows], keys[rows], ranking[rows]
        sizes = np.bincount(group_of, minlength=count)
        order = np.lexsort((row_key, -row_mismatch, group_of))  # per group: the largest |d| first, equal: smaller key
        worst = order[np.r_[True, group_of[order][1:] != group_of[order][:-1]]]  # one per group, in group order
        best = np.full(count, -np.inf)
        np.maximum.at(best, group_of, row_rank)
        lowest = np.full(count, np.inf)
        np.minimum.at(lowest, group_of, row_rank)
        at_best = np.bincount(group_of, weights=(row_rank == best[group_of]).astype(np.float64), minlength=count)
        for entry, number in numbered.items():
            chosen = worst[number]
            self._offer(
                entry,
                [
                    float(sizes[number]),
                    float(row_mismatch[chosen]),
                    int(row_key[chosen]),
                    float(row_rank[chosen]),
                    float(best[number]),
                    float(lowest[number]),
                    float(at_best[number]),
                ],
            )
        if len(self.groups) > MAX_GROUPS:
            self.groups_overflow = True
            self.groups.clear()

    def _offer(self, entry: tuple[int, Any], state: list[float]) -> None:
        held = self.groups.get(entry)
        if held is None:
            self.groups[entry] = state
            return
        held[0] += state[0]
        if (state[1], -state[2]) > (held[1], -held[2]):  # the larger |d|; equal: the smaller key
            held[1], held[2], held[3] = state[1], state[2], state[3]
        if state[4] > held[4]:
            held[4], held[6] = state[4], state[6]
        elif state[4] == held[4]:
            held[6] += state[6]
        held[5] = min(held[5], state[5])

    def merge(self, other: TrainerColumnsTracker) -> None:
        for role, name in other.columns.items():
            self.columns.setdefault(role, name)
        self.group_column = self.group_column or other.group_column
        self.derived_length = self.derived_length or other.derived_length
        self.rows += other.rows
        self._sample(other.keys, other.mismatch, other.values)
        self.groups_overflow = self.groups_overflow or other.groups_overflow
        if self.groups_overflow:
            self.groups.clear()
            return
        for entry, state in other.groups.items():
            self._offer(entry, list(state))

    def finalize(self) -> dict[str, Any] | None:
        """The numbers (see :class:`rollout_diag.results.TrainerColumns`); None without any trainer column."""
        if not self.columns and self.group_column is None:
            return None
        order = np.argsort(self.keys, kind="stable")  # the sample in key order: any merge order gives the same arrays
        mismatch = self.mismatch[order]
        correlations = []
        for role in [*TRAINER_COLUMNS]:
            if role not in self.values or (role not in self.columns and not self.derived_length):
                continue
            column = self.values[role][order]
            keep = np.isfinite(column) & np.isfinite(mismatch)
            x, y = column[keep], mismatch[keep]
            rho = spearman(x, y) if len(x) >= 2 else math.nan
            low, high = fisher_interval(rho, len(x))
            drawn: dict[str, Any] = {}
            if len(x) and len(x) <= SCATTER_POINTS:
                drawn["points"] = {"x": x.tolist(), "y": y.tolist()}
            elif len(x):
                drawn["histogram"] = histogram_2d(x, y)
            correlations.append(
                {
                    "role": role,
                    "column": self.columns.get(role, "response_length (model tokens)"),
                    "rows": len(x),
                    "spearman": rho,
                    "ci_low": low,
                    "ci_high": high,
                    **drawn,
                }
            )
        return {
            "rows": self.rows,
            "sampled_rows": len(self.keys),
            "sample_limit": self.sample_rows,
            "seed": self.seed,
            "correlations": correlations,
            "groups": self._group_numbers(),
        }

    def _group_numbers(self) -> dict[str, Any] | None:
        if self.group_column is None:
            return None
        ranking = "advantage" if "advantage" in self.columns else ("reward" if "reward" in self.columns else None)
        if ranking is None:
            return None
        counted = [state for state in self.groups.values() if state[0] >= 2 and state[4] > state[5]]
        worst_is_best = sum(1 for state in counted if state[3] == state[4])
        chance = np.array([state[6] / state[0] for state in counted])
        return {
            "column": self.group_column,
            "ranked_by": self.columns[ranking],
            "groups_seen": 0 if self.groups_overflow else len(self.groups),
            "groups": len(counted),
            "worst_is_best": worst_is_best,
            "expected": float(chance.sum()),
            "p_value": poisson_binomial_tail(chance, worst_is_best) if counted else math.nan,
            "overflow": self.groups_overflow,
        }
