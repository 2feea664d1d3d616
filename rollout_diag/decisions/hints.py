"""Root-cause hints: pure functions from the evidence sums (``metrics/hints.py``) and an AnalysisResult to a list
of :class:`~rollout_diag.results.Hint`. No torch, no file reading: testable on hand-built evidence.

A hint is shown only when the data supports it; every threshold is a module constant, and ``docs/hints.md`` gives
the reason for each. Group comparisons use y = min(|δ|, 1) and Welch's t over tokens, so a handful of
catastrophic tokens can neither make nor hide a hint.

The rules live by kind: ``pipeline_hints.py`` (a bug in what wrote the dump), ``sampling_hints.py`` (truncated or
processed sampling logprobs), ``shape_hints.py`` (where the mismatch sits); the statistics they share in
``contrasts.py``. This module says which hints there are and finds them in order.
"""

from __future__ import annotations

from rollout_diag.decisions.contrasts import PROBABILITY_LABELS
from rollout_diag.decisions.pipeline_hints import (
    dummy_logprobs,
    fill_values,
    no_mask,
    off_by_one,
    resume_spike,
    retokenization,
)
from rollout_diag.decisions.resume import resume_steps
from rollout_diag.decisions.sampling_hints import processed_logprobs, top_p_truncation
from rollout_diag.decisions.shape_hints import (
    first_token,
    last_token,
    long_context,
    low_probability,
    staleness,
    turn_growth,
)
from rollout_diag.results import AnalysisResult, Evidence, Hint

# the hints that name a bug in the pipeline (decisions/verdict.py: they come before every other finding), in the
# order they are found and shown
PIPELINE_HINT_IDS = (
    "invalid_rows",  # not found here: decisions/skipped.py makes it from what reading skipped, before the others
    "off_by_one",
    "no_mask",
    "dummy_logprobs",
    "fill_values",
    "top_p_truncation",
    "processed_logprobs",
    "retokenization",
    "resume_spike",
)
HINT_IDS = (
    *PIPELINE_HINT_IDS,
    "first_token",
    "last_token",
    "low_probability",
    "long_context",
    "turn_growth",
    "staleness",
    "stale_prefix_cache",  # not found here: decisions/prompts.py, from the per-prompt evidence
)


def find_hints(evidence: Evidence, result: AnalysisResult) -> list[Hint]:
    """Every hint the data supports, in HINT_IDS order (an empty list for clean data)."""
    if not evidence.run or evidence.run.get("tokens", 0.0) == 0:
        return []
    found = []
    shifted = off_by_one(evidence)
    # the first tokens after environment segments: the specific cause of a first-token or turn-growth excess
    retokenized = retokenization(evidence)
    for hint in (
        shifted,
        no_mask(evidence),
        # a shifted gather puts p < 0.5 next to a rollout's exact 0.0 (p = 1) by itself: isolated zeros count then
        # only in runs
        dummy_logprobs(evidence, isolated=shifted is None),
        fill_values(evidence),
        # a shifted gather pairs each rollout logprob with another token's: δ then leans with the rollout probability
        # by itself (likely tokens below, unlikely ones above), the sign patterns of sampling are read without one
        top_p_truncation(evidence) if shifted is None else None,
        processed_logprobs(evidence) if shifted is None else None,
        retokenized,
        resume_spike(evidence, resume_steps(evidence)),
        first_token(evidence) if retokenized is None else None,
        last_token(evidence),
        low_probability(evidence),
        long_context(evidence),
        turn_growth(result) if retokenized is None else None,
        staleness(evidence),
    ):
        if hint is not None:
            found.append(hint)
    return found


# what callers read here: the hints, the rules by name, the evidence they read, the probability buckets' labels
__all__ = [
    "HINT_IDS",
    "PIPELINE_HINT_IDS",
    "PROBABILITY_LABELS",
    "Evidence",
    "dummy_logprobs",
    "fill_values",
    "find_hints",
    "first_token",
    "last_token",
    "long_context",
    "low_probability",
    "no_mask",
    "off_by_one",
    "processed_logprobs",
    "resume_spike",
    "retokenization",
    "staleness",
    "top_p_truncation",
    "turn_growth",
]
