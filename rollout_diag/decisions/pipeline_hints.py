"""The hints that name a bug in the pipeline that wrote the dump (docs/hints.md): a shifted gather (``off_by_one``),
no response mask (``no_mask``), dummy or fill logprobs, re-tokenized turns (``retokenization``), a spike after a
resume (``resume_spike``). Pure functions of the hint evidence (``metrics/hints.py``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from rollout_diag.catalogue import FILL_LOGPROB, SHIFT_MAX_RATIO
from rollout_diag.decisions.contrasts import (
    EXAMPLES,
    MAX_STEPS,
    MIN_GROUP_TOKENS,
    Contrast,
    Group,
    bucket_group,
    example_rows,
    fmt,
    strongest_steps,
)
from rollout_diag.decisions.resume import RESUME_WINDOW
from rollout_diag.formatting import number
from rollout_diag.results import FILL_VALUES_KEPT, Evidence, FillCount, Hint, HintRow, Sums

# off_by_one: shifting the trainer logprobs one position at least halves mean |δ| (SHIFT_MAX_RATIO) over ≥ 100
# token pairs
SHIFT_MIN_PAIRS = 100
SHIFT_MIN_ALIGNED = 0.01  # … and the aligned mean |δ| is at least the log-ppl watch level;
SHIFT_MIN_ROWS = 3  # or, when only some rows or steps are shifted, ≥ 3 rows pass the test on their own pairs
# (SHIFT_ROW_MIN_PAIRS, SHIFT_ROW_MIN_ALIGNED in catalogue.py: the evidence accumulator tests each row with them)
# no_mask: without a mask column, ≥ 1 % of the tokens have rollout logprob exactly 0.0 where the trainer's is below
# log 0.5 (the reader's warning states the same rule): environment tokens the engine never scored
NO_MASK_MIN_SHARE = 0.01
# dummy_logprobs: exact zeros where the other side says p < 0.5 (in runs or isolated: engines that return no
# logprob for some tokens write isolated zeros too) and exact copies, on ≥ 10 model tokens and ≥ 0.5 % of them
DUMMY_MIN_TOKENS = 10
DUMMY_MIN_SHARE = 0.005


# ------------------------------------------------------------------------------------------ off_by_one
def _shift(sums: Sums) -> tuple[float, float, str] | None:
    """(aligned mean |δ|, shifted mean |δ|, direction) over all token pairs when the shift test passes."""
    pairs = sums["pairs"]
    if pairs < SHIFT_MIN_PAIRS:
        return None
    aligned = sums["pair_abs"] / pairs
    late, early = sums["shift_next"] / pairs, sums["shift_prev"] / pairs
    shifted, direction = (late, "late") if late <= early else (early, "early")
    if aligned >= SHIFT_MIN_ALIGNED and shifted <= SHIFT_MAX_RATIO * aligned:
        return aligned, shifted, direction
    return None


def _shift_strength(sums: Sums) -> float | None:
    """How much shifting helps in a step: over all its pairs, else over its rows that pass on their own."""
    found = _shift(sums)
    if found is not None:
        return found[0] / max(found[1], 1e-12)
    if sums["shift_rows"] > 0:
        return sums["shift_rows_aligned"] / max(sums["shift_rows_shifted"], 1e-12)
    return None


def off_by_one(evidence: Evidence) -> Hint | None:
    run = evidence.run
    found = _shift(run)
    if found is not None:
        aligned, shifted, direction = found
        scope = "all rows"
    elif run["shift_rows"] >= SHIFT_MIN_ROWS:
        aligned = run["shift_rows_aligned"] / run["shift_rows_pairs"]
        shifted = run["shift_rows_shifted"] / run["shift_rows_pairs"]
        direction = "late" if run["shift_next"] <= run["shift_prev"] else "early"
        scope = f"{int(run['shift_rows'])} rows"
    else:
        return None
    lead = "a_{t+1} matches r_t" if direction == "late" else "a_t matches r_{t+1}"
    return Hint(
        id="off_by_one",
        message=(
            f"Shifting the trainer logprobs one position {'back' if direction == 'late' else 'forward'} cuts mean |δ| "
            f"from {fmt(aligned)} to {fmt(shifted)} in {scope} ({lead}): the signature of an off-by-one gather of "
            "the logprobs (labels vs logits shift) on one side."
        ),
        evidence={
            "aligned_abs_diff_mean": aligned,
            "shifted_abs_diff_mean": shifted,
            "ratio": shifted / aligned,
            "rows_shifted": run["shift_rows"],
            "token_pairs": run["pairs"],
        },
        steps=strongest_steps(evidence, _shift_strength),
        rows=example_rows(evidence, "off_by_one"),
        look_at=f"trainer logprobs one position {direction} against the rollout logprobs",
    )


# ------------------------------------------------------------------------------------------ no_mask
def no_mask(evidence: Evidence) -> Hint | None:
    tokens, zeros = evidence.unmasked
    if tokens == 0 or zeros < NO_MASK_MIN_SHARE * tokens:
        return None
    return Hint(
        id="no_mask",
        message=(
            f"The input has no mask column and {zeros} of its {tokens} tokens ({zeros / tokens:.2%}) have a rollout "
            "logprob of exactly 0.0 where the trainer's is below log 0.5: environment tokens (tool output, prompt) "
            "the engine never scored are being measured as model tokens."
        ),
        evidence={"tokens": float(tokens), "zero_rollout_tokens": float(zeros), "share": zeros / tokens},
        look_at="the dump's mask column (response_mask / loss_mask): name it with --column mask=NAME",
    )


# ------------------------------------------------------------------------------------------ dummy_logprobs
def _dummy(sums: Sums, isolated: bool = True) -> tuple[float, float, float] | None:
    """(exact-zero tokens, isolated ones too unless ``isolated`` is false; copied tokens; their share of model
    tokens) when the test passes."""
    zeros = sums["dummy_zero"] if isolated else sums["dummy_zero_run"]
    copied, tokens = sums["copied"], sums["tokens"]
    flagged = zeros + copied
    if tokens > 0 and flagged >= DUMMY_MIN_TOKENS and flagged / tokens >= DUMMY_MIN_SHARE:
        return zeros, copied, flagged / tokens
    return None


def dummy_logprobs(evidence: Evidence, isolated: bool = True) -> Hint | None:
    found = _dummy(evidence.run, isolated)
    if found is None:
        return None
    zeros, copied, share = found
    parts = []
    if zeros:
        runs = int(evidence.run["dummy_zero_run"])
        kinds = f"{runs} of them in runs, {int(zeros) - runs} isolated" if isolated else "in runs"
        parts.append(
            f"{int(zeros)} model tokens ({kinds}) have a logprob of exactly 0.0 where the other side says p < 0.5"
        )
    if copied:
        parts.append(f"{int(copied)} repeat their neighbour's logprob exactly while the other side differs by > log 2")
    return Hint(
        id="dummy_logprobs",
        message=(
            f"{'; '.join(parts)} ({share:.2%} of model tokens): placeholder values on tokens the engine never "
            "scored (tool or environment tokens) that the mask lets into the loss — a masking bug."
        ),
        evidence={
            "zero_tokens_in_runs": evidence.run["dummy_zero_run"],
            "zero_tokens": zeros,
            "copied_tokens": copied,
            "share_of_model_tokens": share,
        },
        steps=strongest_steps(evidence, lambda s: None if (f := _dummy(s, isolated)) is None else f[2]),
        rows=example_rows(evidence, "dummy_logprobs"),
        look_at="the response_mask of these rows: mask-1 tokens carrying dummy logprobs",
    )


# ------------------------------------------------------------------------------------------ fill_values
# The fill values dumps use, named: the most negative finite value of each float type an engine computes in.
FILL_NAMES = {
    float(np.finfo(np.float16).min): "float16's finfo.min",
    -3.3895313892515355e38: "bfloat16's finfo.min",
    float(np.finfo(np.float32).min): "float32's finfo.min",
    float(np.finfo(np.float64).min): "float64's finfo.min",
}


def _fill_name(value: float) -> str:
    name = FILL_NAMES.get(value)
    return number(value) + (f" ({name})" if name else "")


def fill_values(evidence: Evidence) -> Hint | None:
    """Model tokens whose logprob is a fill value (``FILL_LOGPROB`` or below), counted while reading: one is enough,
    since no softmax gets there and a single one makes |δ| astronomical in every metric."""
    if not evidence.fills:
        return None
    counts = list(evidence.fills.values())
    tokens, rows = sum(c.tokens for c in counts), sum(c.rows for c in counts)
    sides = [_fill_side(role, evidence.fills) for role in ("trainer", "rollout")]
    examples = [(file, c.first) for (file, _), c in evidence.fills.items() if c.first is not None]
    file, first = examples[0]
    return Hint(
        id="fill_values",
        message=(
            f"{tokens} model token(s) in {rows} row(s) carry a fill value instead of a logprob — "
            f"{'; '.join(side for side in sides if side)}; the first at position {int(first.score)} of {file}:"
            f"{first.row} (step {first.step}, sample {first.sample_id}). No softmax gives a logprob ≤ "
            f"{FILL_LOGPROB:g}: tokens the engine never scored that the mask lets into the loss (a masking or dump "
            "bug), and every metric they enter is meaningless."
        ),
        evidence={
            "tokens": float(tokens),
            "rows": float(rows),
            "lowest_value": min(value for c in counts for value in c.values),
        },
        steps=sorted({ref.step for _, ref in examples})[:MAX_STEPS],
        rows=[HintRow(r.step, r.sample_id, f, r.row) for f, r in examples[:EXAMPLES]],
        look_at="the response_mask and the logprob columns of these rows: mask-1 tokens holding a fill value",
    )


def _fill_side(role: str, fills: Mapping[tuple[str, str], FillCount]) -> str:
    """ "3 on the trainer side (old_log_probs: -1e+30 ×3)"; "" when that side has none."""
    counts = [count for (_, side), count in fills.items() if side == role]
    if not counts:
        return ""
    values: dict[float, int] = {}
    for count in counts:
        for value, tokens in count.values.items():
            values[value] = values.get(value, 0) + tokens
    commonest = sorted(values.items(), key=lambda item: -item[1])[:FILL_VALUES_KEPT]
    named = ", ".join(f"{_fill_name(value)} ×{tokens}" for value, tokens in commonest)
    columns = ", ".join(dict.fromkeys(count.column for count in counts))
    return f"{sum(count.tokens for count in counts)} on the {role} side ({columns}: {named})"


# ------------------------------------------------------------------------------------------ retokenization
RETOKENIZATION_MIN_FACTOR = 3.0  # the first k tokens after an environment segment at least 3× the rest of the turn


def _offset_groups(sums: Sums) -> tuple[list[Group], list[Group], Group] | None:
    """(round 0's offset groups, later rounds' offset groups, the later rounds' tokens past the offsets)."""
    buckets = sums.get("turn_offsets")
    if not buckets or sums.get("later_tokens", 0.0) <= 0:
        return None
    groups = [Group(b["tokens"], b["y"], b["y2"]) for b in buckets]
    half = len(groups) // 2
    first, later = groups[:half], groups[half:]
    covered = sum(later, Group(0.0, 0.0, 0.0))
    rest = Group(
        sums["later_tokens"] - covered.n, sums["later_y"] - covered.total, max(sums["later_y2"] - covered.squares, 0.0)
    )
    return first, later, rest


def _retokenization(sums: Sums) -> tuple[int, Contrast, Contrast] | None:
    """(k, the later rounds' first k tokens against the rest of those turns, round 0's first k against the same
    rest) when the first k tokens after environment segments carry the mismatch and round 0's first ones do not."""
    found = _offset_groups(sums)
    if found is None:
        return None
    first, later, rest = found
    if rest.n < MIN_GROUP_TOKENS or not rest.mean >= 0:
        return None
    k = 0
    while k < len(later) and later[k].n > 0 and later[k].mean >= RETOKENIZATION_MIN_FACTOR * rest.mean:
        k += 1
    if k == 0:
        return None
    head = Contrast(sum(later[:k], Group(0.0, 0.0, 0.0)), rest)
    if not head.holds(RETOKENIZATION_MIN_FACTOR):
        return None
    prompt = Contrast(sum(first[:k], Group(0.0, 0.0, 0.0)), rest)
    if prompt.high.n >= MIN_GROUP_TOKENS and prompt.holds(RETOKENIZATION_MIN_FACTOR):
        return None  # every turn's start, the prompt's too: a template / boundary handling (first_token)
    return k, head, prompt


def _id_differences(evidence: Evidence) -> Hint | None:
    """With rollout_token_ids beside token_ids: the model tokens whose two ids differ, and the first of them."""
    differ, tokens = evidence.run.get("id_differ", 0.0), evidence.run.get("id_tokens", 0.0)
    if differ <= 0:
        return None
    firsts = evidence.examples.get("retokenization", ())
    first = firsts[0] if firsts else None
    where = (
        f"; the first at position {int(first.score)} of {first.file}:{first.row} (step {first.step}, sample "
        f"{first.sample_id})"
        if first is not None
        else ""
    )
    found = _retokenization(evidence.run)
    concentrated = (
        f" The mismatch agrees: the first {found[0]} token(s) after environment segments have {found[1].factor:.1f}× "
        "that of the rest of their turn."
        if found is not None
        else ""
    )
    return Hint(
        id="retokenization",
        message=(
            f"{int(differ)} of {int(tokens)} model tokens ({differ / tokens:.2%}) carry a different token id on the "
            f"two sides (token_ids vs rollout_token_ids){where}: the trainer scores a re-tokenized sequence, not the "
            f"tokens the engine sampled.{concentrated}"
        ),
        evidence={
            "token_id_mismatches": differ,
            "tokens_with_ids": tokens,
            "share": differ / tokens,
            **({"first_position": first.score} if first is not None else {}),
            **({"k": float(found[0]), "factor": found[1].factor} if found is not None else {}),
        },
        steps=strongest_steps(evidence, lambda s: s.get("id_differ", 0.0) or None),
        rows=[HintRow(r.step, r.sample_id, r.file, r.row) for r in firsts],
        look_at="the positions where token_ids and rollout_token_ids differ (rollout-diag inspect shows the row): "
        "reuse the rollout's token ids instead of re-tokenizing the history",
    )


def retokenization(evidence: Evidence) -> Hint | None:
    """Multi-turn histories re-tokenized by the trainer: the tokens right after each environment segment (tool output,
    user turn) are split differently on the two sides, the rest of the turn agrees (slime #2360, ms-swift #10012,
    rllm #272). With a rollout_token_ids column, the positions where the ids differ say it directly."""
    if evidence.run.get("id_tokens", 0.0) > 0:
        by_ids = _id_differences(evidence)
        if by_ids is not None:
            return by_ids
    found = _retokenization(evidence.run)
    if found is None:
        return None
    k, head, prompt = found
    tokens = "token" if k == 1 else f"{k} tokens"
    return Hint(
        id="retokenization",
        message=(
            f"The first {tokens} after each environment segment (rounds ≥ 1) have {head.factor:.1f}× the mismatch "
            f"of the rest of their turn (mean min(|δ|, 1) {fmt(head.high.mean)} vs {fmt(head.low.mean)}), while "
            f"the first tokens of round 0 do not ({fmt(prompt.high.mean)}): the trainer re-tokenizes the multi-turn "
            "history and splits the turn boundaries differently from the rollout."
        ),
        evidence={
            "k": float(k),
            "head_mean": head.high.mean,
            "rest_mean": head.low.mean,
            "factor": head.factor,
            "welch_t": head.t,
            "head_tokens": head.high.n,
            "round0_head_mean": prompt.high.mean,
        },
        steps=strongest_steps(evidence, lambda s: None if (f := _retokenization(s)) is None else f[1].factor),
        rows=[],
        look_at=f"the first {tokens} of rounds ≥ 1 (after each tool / environment segment): compare the two sides' "
        "token ids there; reuse the rollout's token ids instead of re-tokenizing the history",
    )


# ------------------------------------------------------------------------------------------ resume_spike
RESUME_MIN_FACTOR = 2.0  # the steps right after a resume at least 2× the mismatch of the steps before it
RESUME_BASELINE_STEPS = 8  # … the (up to) 8 steps before the resume


def _step_group(sums: Sums) -> Group:
    return sum((bucket_group(b) for b in sums["probability_buckets"]), Group(0.0, 0.0, 0.0))


def resume_spike(evidence: Evidence, resumes: Sequence[int]) -> Hint | None:
    """Steps right after a resume from a checkpoint with a transient jump of the mismatch (slime #1695)."""
    if not resumes:
        return None
    steps = sorted(evidence.steps)
    groups = {step: _step_group(evidence.steps[step]) for step in steps}
    run = sum(groups.values(), Group(0.0, 0.0, 0.0))
    best = None
    for resume in resumes:
        window = [s for s in steps if s >= resume][:RESUME_WINDOW]
        before = [s for s in steps if s < resume][-RESUME_BASELINE_STEPS:]
        if not window or not before:
            continue
        contrast = Contrast(
            sum((groups[s] for s in window), Group(0.0, 0.0, 0.0)),
            sum((groups[s] for s in before), Group(0.0, 0.0, 0.0)),
        )
        if contrast.holds(RESUME_MIN_FACTOR) and (best is None or contrast.factor > best[1].factor):
            best = (resume, contrast, window)
    if best is None:
        return None
    resume, contrast, window = best
    share = contrast.high.total / run.total if run.total > 0 else 0.0
    return Hint(
        id="resume_spike",
        message=(
            f"Resume at step {resume}: the run starts again from a checkpoint there, and steps "
            f"{window[0]}–{window[-1]} have {contrast.factor:.1f}× the mismatch of the {RESUME_BASELINE_STEPS} steps "
            f"before (mean min(|δ|, 1) {fmt(contrast.high.mean)} vs {fmt(contrast.low.mean)}; {share:.0%} of the "
            "run's): a transient of the restart (engine weights, caches or optimizer state not restored as before), "
            "not a growth of the mismatch."
        ),
        evidence={
            "resume_step": float(resume),
            "window_mean": contrast.high.mean,
            "before_mean": contrast.low.mean,
            "factor": contrast.factor,
            "welch_t": contrast.t,
            "share_of_run": share,
            "resumes": float(len(resumes)),
        },
        steps=window,
        rows=[],
        look_at=f"steps {window[0]}–{window[-1]} after the resume at step {resume}: what the restart reloads (the "
        "inference engine's weights and their sync, the checkpoint's optimizer state)",
    )
