"""The overall verdict in one sentence: the first line of ``analyze`` and of the report.

Pure: the run's verdicts in, (worst level, sentence) out; ``render.summary`` and ``report.header`` print it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rollout_diag.catalogue import short_name

if TYPE_CHECKING:  # a type only: results imports the exporters, whose notebook view reads these sentences
    from rollout_diag.results import Verdict

LEVEL_ORDER = ("bad", "watch", "ok", "n/a")
ADVICE = {
    "bad": "the run is off-policy enough to matter: consider a rollout correction (compare-presets shows what "
    "each would do to this data).",
    "watch": "look at the per-step trends and where the mismatch sits.",
    "ok": "training and rollout agree within the usual bf16/fp32 range.",
    "n/a": "no key metric could be computed.",
}


def overall(verdicts: Sequence[Verdict]) -> tuple[str, str]:
    """(worst level, one sentence): which key metrics sit at that level and what to do about it."""
    levels = [v.level for v in verdicts]
    worst = next((level for level in LEVEL_ORDER if level in levels), "n/a")
    flagged = [v for v in verdicts if v.level == worst]
    names = ", ".join(short_name(v.metric) for v in flagged) if worst in ("bad", "watch") else ""
    detail = f"{names} at {worst} level ({len(flagged)} of {len(verdicts)} key metrics): " if names else ""
    return worst, detail + ADVICE[worst]
