"""The prompt checks: pure functions from the per-prompt evidence (``metrics/prompts.py``) to the
``stale_prefix_cache`` hint and the prompts that are extreme every time, and (``matched_prompts``) from several runs'
evidence to the prompts matched across runs. Thresholds are module constants with their reasons in ``docs/hints.md``
and ``docs/runs.md``.

Ages: a row's *age* is its version (``policy_version``, else its step) minus the first version at which its prompt
appears in the dump. Rows of age 0 are first-seen (all n rows of a GRPO group at the prompt's first step among them);
rows of age > 0 come from a prompt the engine had seen under older weights.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from rollout_diag.decisions.contrasts import MAX_STEPS, MIN_GROUP_TOKENS, Contrast, Group
from rollout_diag.decisions.trends import least_squares
from rollout_diag.results import (
    ExtremePrompt,
    Hint,
    HintRow,
    MatchedCell,
    MatchedPrompt,
    PromptEvidence,
    PromptFindings,
    RunsPrompts,
    RunWorst,
)
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


# ------------------------------------------------------------------------------------ prompts matched across runs
# Deterministic outliers across runs (``runs``; NeMo-RL #2100: one prompt's mismatch is large in every run, whatever
# the knobs): a prompt seen in two runs or more whose every row, in every run it appears in, is in that run's worst
# 1 % by row score (``worst_threshold`` of the run's own histogram, as extreme every time). Chance guard, the same
# family-wise bound as extreme every time: under "rows land in a run's worst share independently with that run's
# share", the chance of one prompt doing so is Π_runs share_r^rows_r; it is listed when that, times the prompts seen
# in two runs or more (the candidates; over the share followed where a run's table sampled its prompts), is at most
# EXTREME_MAX_CHANCE (1 %). One row in each of 3 runs: 1e-6 × 10 000 candidates = 0.01; clean runs list none.
MATCHED_MIN_RUNS = 2
MATRIX_PROMPTS = 50  # prompts in the prompts × runs matrix: the listed outliers, then the most extreme elsewhere


def matched_prompts(runs: Sequence[tuple[str, PromptEvidence | None]]) -> RunsPrompts | None:
    """The prompts matched across ``runs`` (name, that run's per-prompt evidence, None when not gathered), in the
    runs' order: each recurring prompt's row mismatch in every run, the deterministic outliers (block comment above).
    None when no run has a prompt identity. Runs whose tables sampled their prompts are matched on the prompts every
    one of them followed (the keys are hashes: the smaller sample is a subset of the larger)."""
    keyed = [(name, found) for name, found in runs if found is not None and found.source and found.rows_keyed > 0]
    if not keyed:
        return None
    without = [name for name, found in runs if all(name != other for other, _ in keyed)]
    level = max(_sampling_level(found.sampled_share) for _, found in keyed)
    tables = [_per_prompt(found, level) for _, found in keyed]
    worst = []
    for (name, found), table in zip(keyed, tables, strict=True):
        threshold, at_or_above = worst_threshold(found.score_histogram, found.score_edges)
        valid = int(found.score_histogram.sum())
        worst.append(
            RunWorst(
                run=name,
                threshold=threshold if math.isfinite(threshold) else 0.0,
                share=at_or_above / valid if valid else 0.0,
                prompts=int(table["key"].shape[0]),
            )
        )
    every = np.concatenate([table["key"] for table in tables])
    unique, counts = np.unique(every, return_counts=True)
    shared = unique[counts >= MATCHED_MIN_RUNS]
    count = int(shared.shape[0])
    runs_of = np.zeros(count, dtype=np.int64)
    log_chance = np.zeros(count)
    all_worst = np.ones(count, dtype=bool)
    worst_tail = np.zeros(count)
    for table, cut, (_, found) in zip(tables, worst, keyed, strict=True):
        index = np.searchsorted(table["key"], shared)
        present = np.zeros(count, dtype=bool)
        inside = index < table["key"].shape[0]
        present[inside] = table["key"][index[inside]] == shared[inside]
        at = index[present]
        rows, lowest = table["rows"][at], table["score_min"][at]
        runs_of[present] += 1
        in_worst = (lowest >= cut.threshold) & (cut.threshold > 0)
        all_worst[present] &= in_worst
        with np.errstate(divide="ignore"):
            log_chance[present] += rows * (math.log(cut.share) if cut.share > 0 else -math.inf)
        worst_tail[present] = np.maximum(worst_tail[present], _tails(found, lowest))
    # the candidates: the recurring prompts followed, scaled back to all of them where the tables sampled
    guard = math.log(EXTREME_MAX_CHANCE / max(count / 0.5**level, 1.0))
    outlier = all_worst & (log_chance <= guard)
    # the matrix: the outliers (in the most runs, then the least likely by chance), then the other prompts whose
    # largest tail share over their runs is smallest (the most extreme in every run they appear in)
    first = np.flatnonzero(outlier)
    first = first[np.lexsort((shared[first], log_chance[first], -runs_of[first]))]
    rest = np.flatnonzero(~outlier)
    rest = rest[np.lexsort((shared[rest], -runs_of[rest], worst_tail[rest]))]
    chosen = np.concatenate([first, rest])[:MATRIX_PROMPTS]
    texts = {key: text for _, found in keyed for _, key, text, _ in [*found.worst_rows, *found.stale_rows] if text}
    for _, found in keyed:
        texts.update(found.texts)
    columns = [
        _cells(name, found, table, cut, shared[chosen])
        for (name, found), table, cut in zip(keyed, tables, worst, strict=True)
    ]
    matrix = []
    for position in chosen.tolist():
        key = int(shared[position])
        matrix.append(
            MatchedPrompt(
                prompt=texts.get(key, label(key)),
                key=label(key),
                cells=[column[key] for column in columns if key in column],
                listed=bool(outlier[position]),
                chance=float(math.exp(log_chance[position])),
            )
        )
    return RunsPrompts(
        identity=", ".join(dict.fromkeys(found.source for _, found in keyed)),
        runs=[name for name, _ in keyed],
        without=without,
        worst=worst,
        shared=count,
        in_every_run=int(np.count_nonzero(runs_of == len(keyed))),
        sampled_share=0.5**level,
        outliers=int(np.count_nonzero(outlier)),
        matrix=matrix,
        matrix_cut=max(count - len(matrix), 0),
    )


def _sampling_level(share: float) -> int:
    """The distinct-sampling level of a table that followed ``share`` (= 0.5^level) of its prompts."""
    return max(0, round(-math.log2(share))) if share > 0 else 0


def _per_prompt(evidence: PromptEvidence, level: int) -> dict[str, np.ndarray]:
    """Per prompt key followed at sampling ``level`` (ascending): rows, Σ score, smallest and largest score. The
    cells come in key order from ``PromptAccumulator.evidence()`` (sorted here when not): one ``reduceat`` a column."""
    cells = evidence.cells
    kept = (cells.key & ((1 << level) - 1)) == 0 if level else np.ones(cells.key.shape[0], dtype=bool)
    key = cells.key[kept]
    order = None if np.all(key[1:] >= key[:-1]) else np.argsort(key, kind="stable")

    def column(values: np.ndarray) -> np.ndarray:
        return values[kept] if order is None else values[kept][order]

    key = column(cells.key)
    if key.shape[0] == 0:
        empty = np.zeros(0)
        return {"key": key, "rows": empty, "score": empty, "score_min": empty, "score_max": empty}
    starts = np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]]))
    return {
        "key": key[starts],
        "rows": np.add.reduceat(column(cells.rows), starts),
        "score": np.add.reduceat(column(cells.score), starts),
        "score_min": np.minimum.reduceat(column(cells.score_min), starts),
        "score_max": np.maximum.reduceat(column(cells.score_max), starts),
    }


def _tails(evidence: PromptEvidence, scores: np.ndarray) -> np.ndarray:
    """The share of the run's valid rows whose score falls in the bin of each score or above (1.0 for a score of 0)."""
    histogram = evidence.score_histogram
    total = int(histogram.sum())
    if total == 0:
        return np.ones(scores.shape[0])
    above = np.cumsum(histogram[::-1])[::-1]
    index = np.searchsorted(np.asarray(evidence.score_edges), scores, side="right") - 1
    return above[np.clip(index, 0, histogram.shape[0] - 1)] / total


def _cells(
    run: str, evidence: PromptEvidence, table: dict[str, np.ndarray], cut: RunWorst, keys: np.ndarray
) -> dict[int, MatchedCell]:
    """The cells of the prompts ``keys`` that ``run`` has (key → cell)."""
    index = np.searchsorted(table["key"], keys)
    inside = index < table["key"].shape[0]
    present = np.zeros(keys.shape[0], dtype=bool)
    present[inside] = table["key"][index[inside]] == keys[inside]
    cells = evidence.cells
    wanted = np.isin(cells.key, keys[present])
    steps: dict[int, list[int]] = {}
    for key, step in sorted(zip(cells.key[wanted].tolist(), cells.step[wanted].tolist(), strict=True)):
        held = steps.setdefault(key, [])
        if len(held) < MAX_STEPS and (not held or held[-1] != step):
            held.append(step)
    found = {}
    for key, at in zip(keys[present].tolist(), index[present].tolist(), strict=True):
        rows = float(table["rows"][at])
        lowest = float(table["score_min"][at])
        found[key] = MatchedCell(
            run=run,
            rows=int(rows),
            score_mean=float(table["score"][at]) / rows,
            score_min=lowest,
            score_max=float(table["score_max"][at]),
            tail=float(_tails(evidence, np.array([lowest]))[0]),
            worst=bool(cut.threshold > 0 and lowest >= cut.threshold),
            steps=steps.get(key, []),
        )
    return found
