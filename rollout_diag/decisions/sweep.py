"""What the threshold sweep says in words: the share verl's default thresholds reject on this data.

Pure: the sweep's run-level rows (``results.SweepOption``) in, sentences out; the terminal and the report
print them.
"""

from __future__ import annotations

from collections.abc import Sequence

from rollout_diag.formatting import percent
from rollout_diag.results import SweepOption

UNIT = {"token": "tokens", "sequence": "sequences"}


def default_sentences(run: Sequence[SweepOption]) -> list[str]:
    """'seq_mean_k3 ≤ 0.01 rejects 2.74 % of sequences here', one per option verl uses by default."""
    lines = []
    for row in run:
        if row.verl_default is None:
            continue
        relation = "ratio bounds" if row.option.endswith("k1") else "≤"
        if row.option.startswith("is_"):
            verb, what = "truncates", f"IS at {row.verl_default} ({row.level} level)"
        else:
            verb, what = "rejects", f"{row.option} {relation} {row.verl_default}"
        approx = "" if row.exact else " at most"
        lines.append(f"{what} {verb}{approx} {percent(row.default_share)} of {UNIT[row.level]} here")
    return lines
