"""ROLL: ``actor/train_infer_ratio_{token,geometric,sequence,segment}_mean`` and
``actor/train_infer_diff_{token,geometric,sequence,segment}_mean``.

Definitions: alibaba/ROLL ``roll/utils/train_infer_corrections.py`` (``_compute_all_granularity`` and
``compute_train_infer_correction``: ratio = exp(old − infer logprob) per token, exp of the row's masked mean
(geometric) or masked sum (sequence) of δ, or of each segment's mean (segment); diff = exp(old) − exp(infer),
aggregated the same way; each recorded always, with ``agg_loss(..., "seq-mean-token-mean")``),
``roll/utils/functionals.py`` (``masked_mean``: Σ/(n + 1e-8), 0 for an empty row; ``agg_loss``: Σ over valid
rows of the row means / (valid rows + 1e-8), valid rows at least 1), ``roll/pipeline/agentic/utils.py``
(``compute_segment_masked_mean``: segments are maximal runs of mask 1) and ``roll/utils/tracking.py`` (the
``@sum`` tag is stripped from the logged name), commit 8eb27cc2dc34c4d1310b169d9b86d339004d811a.
"""

from __future__ import annotations

from typing import ClassVar

from rollout_diag.catalogue import EPS
from rollout_diag.engine import arrays
from rollout_diag.engine.arrays import Array, segment_sum
from rollout_diag.engine.formulas import quantity
from rollout_diag.engine.stats import ChunkStats, stats
from rollout_diag.io.chunk import Chunk
from rollout_diag.metrics.base import State, StepAccumulator, as_float
from rollout_diag.metrics.dialects.base import DialectMetric, Framework, by_step, reductions, round_sums

LEVELS = ("token", "geometric", "sequence", "segment")


@quantity("signed_prob_diff")
def _signed_prob_diff(s: ChunkStats) -> Array:  # exp(a) − exp(r)
    return s.token("trainer_prob") - s.token("rollout_prob")


def key(kind: str, level: str) -> str:
    return f"actor/train_infer_{kind}_{level}_mean"


class ROLLAccumulator(StepAccumulator):
    """Σ over valid rows of each row's masked mean, for ratio and diff at four granularities, and the valid rows."""

    REDUCTIONS: ClassVar[dict[str, str]] = reductions(
        sum=("tokens", "valid_rows", *(f"{kind}_{level}" for kind in ("ratio", "diff") for level in LEVELS))
    )

    def _stats(self, chunk: Chunk) -> dict[str, Array]:
        s = stats(chunk)
        n = s.row_count
        denominator = n + EPS  # masked_mean over the row

        def broadcast_mean(per_row: Array) -> Array:  # a row constant broadcast, then masked_mean
            return per_row * n / denominator

        delta_sum, diff_sum = s.row_sum("log_ratio"), s.row_sum("signed_prob_diff")
        rows: dict[str, Array] = {
            "ratio_token": s.row_sum("exp_log_ratio") / denominator,
            "ratio_geometric": broadcast_mean(arrays.exp(delta_sum / denominator)),
            "ratio_sequence": broadcast_mean(arrays.exp(delta_sum)),
            "ratio_segment": self._segment(s, "log_ratio", arrays.exp) / denominator,
            "diff_token": diff_sum / denominator,
            "diff_geometric": broadcast_mean(diff_sum / denominator),
            "diff_sequence": broadcast_mean(diff_sum),
            "diff_segment": self._segment(s, "signed_prob_diff", lambda mean: mean) / denominator,
        }
        valid = arrays.float64(n > 0)  # seq-mean-token-mean weighs only rows with a masked token
        out = {name: by_step(s, arrays.where(n > 0, values, 0.0)) for name, values in rows.items()}
        out["valid_rows"] = by_step(s, valid)
        out["tokens"] = by_step(s, n)
        return out

    @staticmethod
    def _segment(s: ChunkStats, name: str, transform) -> Array:
        """Σ over a row's segments of length × transform(segment mean), the segment mean being Σ/(len + 1e-8)."""
        sums, lengths, row = round_sums(s, name)
        per_round = lengths * transform(sums / (lengths + EPS))
        return segment_sum(per_round, row, s.chunk.rows)

    def _finalize(self, state: State) -> dict[str, float]:
        if as_float(state["tokens"]) == 0:
            return {}
        valid = max(as_float(state["valid_rows"]), 1.0)
        return {
            key(kind, level): as_float(state[f"{kind}_{level}"]) / (valid + EPS)
            for kind in ("ratio", "diff")
            for level in LEVELS
        }


_AGG = "seq-mean-token-mean: Σ over rows with a masked token of the row's masked mean / (valid rows + 1e-8)"
_RATIO = {
    "token": ("IS ratio exp(δ), mean", "exp(δ)"),
    "geometric": ("geometric IS ratio exp(R_i[δ])", "exp(R_i[δ]) broadcast to the row's tokens"),
    "sequence": ("sequence IS ratio exp(S_i[δ]), mean", "exp(S_i[δ]) broadcast to the row's tokens"),
    "segment": ("segment IS ratio exp(mean δ of the round)", "exp(Σ_round δ / (len + 1e-8)) at the round's tokens"),
}
_DIFF = {
    "token": ("p_a − p_r, mean", "exp(a) − exp(r)"),
    "geometric": ("p_a − p_r, row mean broadcast", "R_i[exp(a) − exp(r)] broadcast"),
    "sequence": ("p_a − p_r, row sum broadcast", "S_i[exp(a) − exp(r)] broadcast"),
    "segment": ("p_a − p_r, round mean broadcast", "mean of exp(a) − exp(r) over the round (+1e-8)"),
}

FRAMEWORK = Framework(
    name="roll",
    title="ROLL",
    source=(
        "alibaba/ROLL `roll/utils/train_infer_corrections.py`, `roll/utils/functionals.py`, "
        "`roll/pipeline/agentic/utils.py`, `roll/utils/tracking.py` @ 8eb27cc2dc34c4d1310b169d9b86d339004d811a"
    ),
    config="always recorded (train_infer_correction), on the pipeline's whole batch",
    offline=(
        "none for the pipeline-level call (apply_train_infer_correction_to_batch, one whole batch); the worker-level "
        "call repeats them per micro-batch, summed with its global valid-sample count."
    ),
    metrics=tuple(
        DialectMetric(key("ratio", level), concept, formula, _AGG) for level, (concept, formula) in _RATIO.items()
    )
    + tuple(DialectMetric(key("diff", level), concept, formula, _AGG) for level, (concept, formula) in _DIFF.items()),
    accumulator=ROLLAccumulator,
)
