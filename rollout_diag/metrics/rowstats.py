"""Per-row sufficient statistics: a few float64 sums per sequence, for intervals over sequences (``diff``).

Every key metric of METRICS.md §1, §5, §6, §7 that is a ratio of sums over rows (a token mean Σ_i S_i[x] /
(Σ_i n_i + 1e-8), or a row average mean_i v_i) is a function of these columns, so resampling rows and
recomputing the metric from them gives its bootstrap distribution without keeping a single token. Memory is
O(rows × columns) floats; the collector merges by concatenation, like any other accumulator.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from rollout_diag.engine import arrays
from rollout_diag.engine.arrays import Array
from rollout_diag.engine.formulas import quantity
from rollout_diag.engine.stats import ChunkStats, stats
from rollout_diag.io.chunk import Chunk
from rollout_diag.presets import Preset
from rollout_diag.results import RowStats

if TYPE_CHECKING:
    from rollout_diag.metrics.outcome import DropRule, OutcomeAccumulator


@quantity("exp_abs_log_ratio")
def _exp_abs_log_ratio(s: ChunkStats) -> Array:  # exp(|δ|): NeMo-RL's token_mult_prob_error term
    return arrays.exp(s.token("abs_log_ratio"))


# Row column -> token quantity summed over the row's model tokens (S_i[x]); "tokens" is n_i.
ROW_SUMS: dict[str, str] = {
    "trainer": "trainer",  # S_i[a]
    "rollout": "rollout",  # S_i[r]
    "log_ratio": "log_ratio",  # S_i[δ]
    "abs_log_ratio": "abs_log_ratio",  # S_i[|δ|]
    "k3": "k3",  # S_i[exp δ − δ − 1]
    "chi2_term": "chi2_term",  # S_i[exp(2·clamp20(δ))]
    "prob_diff": "prob_diff",  # S_i[|p_a − p_r|]
    "exp_abs_log_ratio": "exp_abs_log_ratio",  # S_i[exp |δ|]
}


# The optional row sum ``RowStatsCollector(catastrophic=threshold)`` adds: S_i[|δ| > threshold], the row's count of
# catastrophic tokens (diag/catastrophic_token_share = Σ_i S_i / Σ_i n_i).
CATASTROPHIC = "catastrophic"


class RowStatsCollector:
    """Collects :class:`RowStats` chunk by chunk; ``presets`` adds each preset's rejected-token count per row
    (``rejected[preset name]``), ``rules`` each named drop rule's (``rejected[name]``), ``catastrophic`` (a |δ|
    threshold) each row's count of catastrophic tokens (``sums["catastrophic"]``)."""

    def __init__(
        self,
        presets: Sequence[Preset] = (),
        catastrophic: float | None = None,
        rules: Mapping[str, DropRule] | None = None,
    ) -> None:
        self.catastrophic = catastrophic
        self.rules: dict[str, OutcomeAccumulator] = {}
        if presets or rules:  # each preset's drop rule and its count, shared with compare-presets (metrics/outcome.py)
            from rollout_diag.metrics.outcome import DropRule, OutcomeAccumulator

            named = {preset.name: DropRule.of(preset) for preset in presets} | dict(rules or {})
            self.rules = {name: OutcomeAccumulator(rule) for name, rule in named.items()}
        self.parts: list[dict[str, np.ndarray]] = []

    def prepare(self, chunk: Chunk) -> None:
        """In the reader's prepare pool: the presets' flags from the compiled preset pass (on the numba engine), so
        ``update`` counts each row's rejected tokens from their sums, as compare-presets does, without token arrays."""
        if self.rules:
            from rollout_diag.metrics.correction import prepare_derived

            names = [name for outcome in self.rules.values() for name in outcome.token_quantities()[0]]
            prepare_derived(stats(chunk), list(dict.fromkeys(names)))

    def update(self, chunk: Chunk) -> None:
        s = stats(chunk)
        part = {"step": arrays.host(chunk.step).astype(np.int64), "tokens": arrays.host(s.row_count)}
        for name, token_quantity in ROW_SUMS.items():
            part[name] = arrays.host(s.row_sum(token_quantity))
        if self.catastrophic is not None:
            part[CATASTROPHIC] = arrays.host(s.row_sum(s.catastrophic(self.catastrophic)))
        for preset, outcome in self.rules.items():
            part[f"rejected:{preset}"] = arrays.host(outcome.rejected_tokens(s))
        self.parts.append(part)

    def merge(self, other: RowStatsCollector) -> None:
        self.parts.extend(other.parts)

    def finalize(self) -> RowStats:
        sums = [*ROW_SUMS, *([CATASTROPHIC] if self.catastrophic is not None else [])]
        names = ["step", "tokens", *sums, *(f"rejected:{preset}" for preset in self.rules)]
        columns: Mapping[str, np.ndarray] = {
            name: np.concatenate([part[name] for part in self.parts])
            if self.parts
            else np.zeros(0, dtype=np.int64 if name == "step" else np.float64)
            for name in names
        }
        return RowStats(
            step=np.asarray(columns["step"], dtype=np.int64),
            tokens=np.asarray(columns["tokens"], dtype=np.float64),
            sums={name: np.asarray(columns[name], dtype=np.float64) for name in sums},
            rejected={preset: np.asarray(columns[f"rejected:{preset}"], dtype=np.float64) for preset in self.rules},
        )
