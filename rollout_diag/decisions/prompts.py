"""The prompt checks: pure functions from the per-prompt evidence (``metrics/prompts.py``) to the
``stale_prefix_cache`` hint and the prompts that are extreme every time. Thresholds are module constants with their
reasons in ``docs/hints.md``.

Ages: a row's *age* is its version (``policy_version``, else its step) minus the first version at which its prompt
appears in the dump. Rows of age 0 are first-seen (all n rows of a GRPO group at the prompt's first step among them);
rows of age > 0 come from a prompt the engine had seen under older weights.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from rollout_diag.decisions.hints import MAX_STEPS, MIN_GROUP_TOKENS, Contrast, Group
from rollout_diag.decisions.trends import least_squares
from rollout_diag.results import ExtremePrompt, Hint, HintRow, PromptEvidence, PromptFindings
from rollout_diag.results import prompt_label as label

# stale_prefix_cache: two contrasts, each with recurring rows at least 2× the mean min(|δ|, 1) of first-seen ones
# (Welch's t ≥ 5, ≥ 30 tokens a side: decisions/hints.py's Contrast):
# - within steps: in the steps that hold both, recurring rows against first-seen rows (a mismatch that drifts over
#   training raises both alike);
# - within prompts: the recurring prompts' later rows against what their own first-seen rows' mean predicts for them
#   (Σ later y over Σ later tokens × that prompt's first-seen mean: each prompt its own baseline, so a prompt that is
#   hard at every sighting — extreme every time — raises neither side);
# and where three ages or more have 30 tokens, the mean grows with the age (a positive least-squares slope).
STALE_MIN_FACTOR = 2.0
# The hint explains the run's mismatch (verdict cause "pipeline") when the recurring rows' excess over the first-seen
# mean is at least half of the run's Σ min(|δ|, 1).
STALE_EXPLAINS_SHARE = 0.5
STALE_PROMPTS_NAMED = 5
STALE_AGES_SHOWN = 5
# Extreme every time: a prompt whose every row (≥ 2) is in the worst 1 % of rows by score, listed when the chance of
# that for one prompt (share^rows), times the prompts with ≥ 2 rows, is below 1 % (a family-wise bound: clean data
# with 10 000 prompts seen twice lists none; one seen three times in the worst 1 % is 1e-6 · 1e4 = 0.01).
WORST_SHARE = 0.01
EXTREME_MIN_ROWS = 2
EXTREME_MAX_CHANCE = 0.01
EXTREME_LISTED = 20
EXTREME_EXAMPLE_ROWS = 3

FIX_FIRST = (
    "disable prefix caching or reset it at every weight sync (vLLM: --no-enable-prefix-caching, or "
    "llm.reset_prefix_cache() after each update; SGLang: --disable-radix-cache, or POST /flush_cache after each "
    "update_weights_*)"
)


def _ages(evidence: PromptEvidence) -> np.ndarray:
    """Each cell's version minus its prompt's first version in the dump."""
    cells = evidence.cells
    if cells.key.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    unique, inverse = np.unique(cells.key, return_inverse=True)
    first = np.full(unique.shape[0], np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, inverse, cells.version)
    return cells.version - first[inverse]


def _group(evidence: PromptEvidence, where: np.ndarray) -> Group:
    cells = evidence.cells
    return Group(float(cells.tokens[where].sum()), float(cells.y[where].sum()), float(cells.y2[where].sum()))


def _stale(evidence: PromptEvidence) -> tuple[Contrast, np.ndarray, np.ndarray] | None:
    """(recurring vs first-seen rows within the steps that hold both, ages, the mixed steps' cells) or None."""
    cells = evidence.cells
    if cells.key.shape[0] == 0:
        return None
    ages = _ages(evidence)
    seen = ages > 0
    steps_seen = np.unique(cells.step[seen & (cells.tokens > 0)])
    steps_first = np.unique(cells.step[~seen & (cells.tokens > 0)])
    mixed = np.isin(cells.step, np.intersect1d(steps_seen, steps_first))
    contrast = Contrast(_group(evidence, mixed & seen), _group(evidence, mixed & ~seen))
    if not contrast.holds(STALE_MIN_FACTOR):
        return None
    return (contrast, ages, mixed) if _own_factor(evidence, ages) >= STALE_MIN_FACTOR else None


def _own_factor(evidence: PromptEvidence, ages: np.ndarray) -> float:
    """Σ y of recurring rows over what each prompt's own first-seen mean predicts for them (0 without any)."""
    cells = evidence.cells
    unique, inverse = np.unique(cells.key, return_inverse=True)
    sums = np.zeros((unique.shape[0], 4))  # first tokens, first Σy, later tokens, later Σy
    later = ages > 0
    np.add.at(sums[:, 0], inverse[~later], cells.tokens[~later])
    np.add.at(sums[:, 1], inverse[~later], cells.y[~later])
    np.add.at(sums[:, 2], inverse[later], cells.tokens[later])
    np.add.at(sums[:, 3], inverse[later], cells.y[later])
    usable = (sums[:, 0] > 0) & (sums[:, 2] > 0)
    expected = float((sums[usable, 2] * sums[usable, 1] / sums[usable, 0]).sum())
    observed = float(sums[usable, 3].sum())
    return observed / expected if expected > 0 else (math.inf if observed > 0 else 0.0)


def _by_age(evidence: PromptEvidence, ages: np.ndarray) -> list[tuple[int, Group]]:
    """(age, group) for every age with at least MIN_GROUP_TOKENS tokens, by age."""
    out = []
    for age in np.unique(ages).tolist():
        group = _group(evidence, ages == age)
        if group.n >= MIN_GROUP_TOKENS:
            out.append((int(age), group))
    return out


def stale_prefix_cache(evidence: PromptEvidence | None) -> Hint | None:
    """The hint, or None (no prompt identity, no recurring prompt, or the data does not show it)."""
    if evidence is None or not evidence.source or evidence.rows_keyed == 0:
        return None
    found = _stale(evidence)
    if found is None:
        return None
    contrast, ages, _mixed = found
    by_age = _by_age(evidence, ages)
    fit = least_squares([float(age) for age, _ in by_age], [g.mean for _, g in by_age]) if len(by_age) >= 3 else None
    if fit is not None and fit[0] <= 0:
        return None  # recurring rows are worse, but not the more so the older their prompt: not this cause
    cells = evidence.cells
    seen = ages > 0
    total = float(cells.y.sum())
    excess = float(cells.y[seen].sum()) - float(cells.tokens[seen].sum()) * contrast.low.mean
    share = excess / total if total > 0 else 0.0
    version = "policy version" if evidence.has_versions else "step"
    per_age = ", ".join(f"age {age}: {g.mean:.3g}" for age, g in by_age[:STALE_AGES_SHOWN])
    prompts, rows = _stale_examples(evidence, ages)
    named = ", ".join(prompts)
    return Hint(
        id="stale_prefix_cache",
        message=(
            f"Rows of prompts the dump saw at an earlier {version} carry {contrast.factor:.1f}× the mismatch of "
            f"first-seen prompts in the same steps (mean min(|δ|, 1) {contrast.high.mean:.3g} vs "
            f"{contrast.low.mean:.3g}"
            + (f"; by {version}s since first seen: {per_age}" if len(by_age) > 1 else "")
            + "): the engine's prefix cache served KV computed under older weights after a weight sync. "
            f"Fix: {FIX_FIRST}." + (f" Recurring prompts: {named}." if named else "")
        ),
        evidence={
            "recurring_mean": contrast.high.mean,
            "first_seen_mean": contrast.low.mean,
            "factor": contrast.factor,
            "welch_t": contrast.t,
            "recurring_tokens": float(cells.tokens[seen].sum()),
            "first_seen_tokens": float(cells.tokens[~seen].sum()),
            "slope_per_version": math.nan if fit is None else fit[0],
            "max_age": float(ages.max()),
            "own_baseline_factor": _own_factor(evidence, ages),
            "excess_share": share,
            "explains_mismatch": 1.0 if share >= STALE_EXPLAINS_SHARE else 0.0,
            "prompts_recurring": float(np.unique(cells.key[seen]).shape[0]),
        },
        steps=_stale_steps(evidence, ages, contrast.low.mean),
        rows=rows,
        look_at=f"rows of recurring prompts at the steps listed, against the {version} at which each prompt was "
        "first seen; the engine's prefix-cache reset at weight sync",
    )


def _stale_steps(evidence: PromptEvidence, ages: np.ndarray, first_mean: float) -> list[int]:
    """Steps by the recurring rows' excess Σ min(|δ|, 1) over the first-seen mean, largest first."""
    cells = evidence.cells
    seen = (ages > 0) & (cells.tokens > 0)
    if not seen.any():
        return []
    steps, inverse = np.unique(cells.step[seen], return_inverse=True)
    excess = np.zeros(steps.shape[0])
    np.add.at(excess, inverse, cells.y[seen] - cells.tokens[seen] * first_mean)
    order = np.lexsort((steps, -excess))
    return [int(steps[i]) for i in order if excess[i] > 0][:MAX_STEPS]


def _stale_examples(evidence: PromptEvidence, ages: np.ndarray) -> tuple[list[str], list[HintRow]]:
    """The recurring prompts among the rows with the largest mean min(|δ|, 1), and those rows."""
    cells = evidence.cells
    unique, inverse = np.unique(cells.key, return_inverse=True)
    first = np.full(unique.shape[0], np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, inverse, cells.version)
    first_of = dict(zip(unique.tolist(), first.tolist(), strict=True))
    prompts: dict[str, None] = {}
    rows = []
    for ref, key, text, version in evidence.stale_rows:
        if key not in first_of or version <= first_of[key]:
            continue
        name = text if text is not None else label(key)
        if name not in prompts and len(prompts) < STALE_PROMPTS_NAMED:
            prompts[name] = None
            rows.append(HintRow(ref.step, ref.sample_id, ref.file, ref.row))
    return list(prompts), rows


# ------------------------------------------------------------------------------------------ extreme every time
def worst_threshold(histogram: np.ndarray, edges: Sequence[float], share: float = WORST_SHARE) -> tuple[float, int]:
    """(the lowest score of the bin where the worst ``share`` of rows begins, rows at or above it)."""
    total = int(histogram.sum())
    if total == 0:
        return math.inf, 0
    wanted = max(1, math.ceil(share * total))
    above = np.cumsum(histogram[::-1])[::-1]  # rows in this bin or higher
    index = int(np.flatnonzero(above >= wanted)[-1])
    return float(edges[index]), int(above[index])


def prompt_findings(evidence: PromptEvidence | None) -> PromptFindings | None:
    """The prompt identity and the prompts that are extreme every time; None without a prompt identity."""
    if evidence is None or not evidence.source or evidence.rows_keyed == 0:
        return None
    cells = evidence.cells
    threshold, at_or_above = worst_threshold(evidence.score_histogram, evidence.score_edges)
    valid = int(evidence.score_histogram.sum())
    share = at_or_above / valid if valid else 0.0
    unique, inverse = np.unique(cells.key, return_inverse=True)
    prompts = int(unique.shape[0])
    rows = np.zeros(prompts)
    np.add.at(rows, inverse, cells.rows)
    lowest = np.full(prompts, np.inf)
    np.minimum.at(lowest, inverse, cells.score_min)
    highest = np.full(prompts, -np.inf)
    np.maximum.at(highest, inverse, cells.score_max)
    versions = np.unique(np.stack([cells.key, cells.version], axis=1), axis=0) if prompts else np.zeros((0, 2))
    recurring = int(np.count_nonzero(np.unique(versions[:, 0], return_counts=True)[1] >= 2)) if prompts else 0
    multi = int(np.count_nonzero(rows >= EXTREME_MIN_ROWS))
    chance = np.power(share, rows) if share > 0 else np.zeros(prompts)
    extreme = (
        (rows >= EXTREME_MIN_ROWS)
        & (lowest >= threshold)
        & (threshold > 0)
        & (chance * max(multi, 1) <= EXTREME_MAX_CHANCE)
    )
    chosen = np.flatnonzero(extreme)
    # the most rows first (the most certainly deterministic), then the highest smallest score
    chosen = chosen[np.lexsort((unique[chosen], -lowest[chosen], -rows[chosen]))]
    texts = {key: text for _, key, text, _ in evidence.worst_rows if text is not None}
    examples: dict[int, list[HintRow]] = {}
    for ref, key, _, _ in evidence.worst_rows:
        examples.setdefault(key, [])
        if len(examples[key]) < EXTREME_EXAMPLE_ROWS:
            examples[key].append(HintRow(ref.step, ref.sample_id, ref.file, ref.row))
    listed = []
    for index in chosen[:EXTREME_LISTED].tolist():
        key = int(unique[index])
        steps = np.unique(cells.step[cells.key == key])
        listed.append(
            ExtremePrompt(
                prompt=texts.get(key, label(key)),
                key=label(key),
                rows=int(rows[index]),
                steps=[int(step) for step in steps[:MAX_STEPS]],
                score_min=float(lowest[index]),
                score_max=float(highest[index]),
                chance=float(chance[index]),
                example_rows=examples.get(key, []),
            )
        )
    return PromptFindings(
        identity=evidence.source,
        rows_keyed=evidence.rows_keyed,
        rows_without=evidence.rows_without,
        prompts=prompts,
        recurring=recurring,
        sampled_share=evidence.sampled_share,
        worst_threshold=threshold if math.isfinite(threshold) else 0.0,
        worst_share=share,
        extreme=listed,
        extreme_cut=max(int(chosen.shape[0]) - EXTREME_LISTED, 0),
    )
