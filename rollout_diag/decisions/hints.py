"""Root-cause hints: pure functions from the evidence sums (``metrics/hints.py``) and an AnalysisResult to a list
of :class:`~rollout_diag.results.Hint`. No torch, no file reading: testable on hand-built evidence.

A hint is shown only when the data supports it; every threshold is a module constant, and ``docs/hints.md`` gives
the reason for each. Group comparisons use y = min(|δ|, 1) and Welch's t over tokens, so a handful of
catastrophic tokens can neither make nor hide a hint.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rollout_diag.catalogue import FILL_LOGPROB, SHIFT_MAX_RATIO, parse_round_key, round_quantity
from rollout_diag.decisions.resume import RESUME_WINDOW, resume_steps
from rollout_diag.decisions.trends import least_squares
from rollout_diag.formatting import number
from rollout_diag.results import FILL_VALUES_KEPT, AnalysisResult, Evidence, FillCount, Hint, HintRow, Sums

HINT_IDS = (
    "invalid_rows",  # not found here: decisions/skipped.py makes it from what reading skipped, before the others
    "off_by_one",
    "no_mask",
    "dummy_logprobs",
    "fill_values",
    "top_p_truncation",
    "processed_logprobs",
    "retokenization",
    "resume_spike",
    "first_token",
    "last_token",
    "low_probability",
    "long_context",
    "turn_growth",
    "staleness",
    "stale_prefix_cache",  # not found here: decisions/prompts.py, from the per-prompt evidence
)
MIN_GROUP_TOKENS = 30  # each side of a comparison needs this many tokens
MIN_T = 5.0  # Welch's t over tokens; tokens of one row are correlated, so well above the usual 2–3
MIN_GAP = 1e-3  # the elevated group's mean min(|δ|, 1) exceeds the other's by at least this: negligible otherwise
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
EDGE_MIN_FACTOR = 3.0  # first_token / last_token: mean at least 3× the other tokens'
LOW_PROBABILITY_MIN_FACTOR = 3.0  # p < 0.1 tokens' mean at least 3× that of p ≥ 0.5 tokens
LONG_CONTEXT_MIN_BUCKETS = 4  # log2 position buckets (positions ≥ 1) with ≥ 30 tokens
LONG_CONTEXT_MIN_FACTOR = 2.0  # later half of the buckets at least 2× the earlier half
TURN_MIN_ROUNDS = 3  # rounds with ≥ 30 tokens (the round trend's own rule)
TURN_MIN_FACTOR = 2.0  # the fitted mean |δ| at the last such round at least 2× the fitted one at the first
STALENESS_MIN_FACTOR = 1.5  # rows behind the freshest policy at least 1.5× the mismatch of the freshest
MAX_STEPS = 10  # steps listed per hint
EXAMPLES = 5  # example rows listed per hint (the schema's bound)
PROBABILITY_LABELS = ("p ≥ 0.9", "0.5 ≤ p < 0.9", "0.1 ≤ p < 0.5", "0.01 ≤ p < 0.1", "p < 0.01")
LOW_BUCKETS, HIGH_BUCKETS = (3, 4), (0, 1)


@dataclass(frozen=True)
class Group:
    """Count, Σy and Σy² of y = min(|δ|, 1) over a group of tokens."""

    n: float
    total: float
    squares: float

    @property
    def mean(self) -> float:
        return self.total / self.n if self.n > 0 else math.nan

    @property
    def variance(self) -> float:
        if self.n < 2:
            return 0.0
        return max(self.squares - self.n * self.mean * self.mean, 0.0) / (self.n - 1)

    def __add__(self, other: Group) -> Group:
        return Group(self.n + other.n, self.total + other.total, self.squares + other.squares)


@dataclass(frozen=True)
class Contrast:
    """An elevated group against a baseline group: the means, their ratio and Welch's t."""

    high: Group
    low: Group

    @property
    def factor(self) -> float:
        return self.high.mean / self.low.mean if self.low.mean > 0 else math.inf

    @property
    def t(self) -> float:
        spread = math.sqrt(self.high.variance / self.high.n + self.low.variance / self.low.n)
        gap = self.high.mean - self.low.mean
        return gap / spread if spread > 0 else (math.inf if gap > 0 else 0.0)

    def holds(self, min_factor: float) -> bool:
        """Both groups large enough, the high mean ``min_factor`` × the low one, clearly apart and not negligible."""
        if min(self.high.n, self.low.n) < MIN_GROUP_TOKENS:
            return False
        gap = self.high.mean - self.low.mean
        return gap >= MIN_GAP and self.high.mean >= min_factor * self.low.mean and self.t >= MIN_T


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


# ------------------------------------------------------------------------------------------ helpers
def _steps(evidence: Evidence, measure: Callable[[Sums], float | None]) -> list[int]:
    """Steps whose own sums pass the hint's test (``measure`` returns a strength, None when it fails),
    strongest first."""
    passing = [(strength, step) for step, sums in evidence.steps.items() if (strength := measure(sums)) is not None]
    return [step for _, step in sorted(passing, key=lambda item: (-item[0], item[1]))[:MAX_STEPS]]


def _rows(evidence: Evidence, kind: str) -> list[HintRow]:
    return [HintRow(ref.step, ref.sample_id, ref.file, ref.row) for ref in evidence.examples.get(kind, ())]


def _group(sums: Sums, prefix: str) -> Group:
    return Group(sums[prefix], sums[f"{prefix}_y"], sums[f"{prefix}_y2"])


def _fmt(value: float) -> str:
    return f"{value:.3g}"


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
            f"from {_fmt(aligned)} to {_fmt(shifted)} in {scope} ({lead}): the signature of an off-by-one gather of "
            "the logprobs (labels vs logits shift) on one side."
        ),
        evidence={
            "aligned_abs_diff_mean": aligned,
            "shifted_abs_diff_mean": shifted,
            "ratio": shifted / aligned,
            "rows_shifted": run["shift_rows"],
            "token_pairs": run["pairs"],
        },
        steps=_steps(evidence, _shift_strength),
        rows=_rows(evidence, "off_by_one"),
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
        steps=_steps(evidence, lambda s: None if (f := _dummy(s, isolated)) is None else f[2]),
        rows=_rows(evidence, "dummy_logprobs"),
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


# ------------------------------------------------------------------------------------------ first / last
def _edge(sums: Sums, prefix: str) -> Contrast | None:
    contrast = Contrast(_group(sums, prefix), _group(sums, "rest"))
    return contrast if contrast.holds(EDGE_MIN_FACTOR) else None


def _edge_hint(evidence: Evidence, prefix: str) -> Hint | None:
    contrast = _edge(evidence.run, prefix)
    if contrast is None:
        return None
    what = (
        "the first token of each round (position 0 of a model segment)"
        if prefix == "first"
        else ("the last model token of each row")
    )
    cause = (
        "a prompt/response boundary or BOS/chat-template token scored differently on the two sides"
        if prefix == "first"
        else "an EOS/stop token, or the token after it, handled differently on the two sides"
    )
    return Hint(
        id=f"{prefix}_token",
        message=(
            f"Mismatch on {what} is {contrast.factor:.1f}× that of the other tokens (mean min(|δ|, 1) "
            f"{_fmt(contrast.high.mean)} vs {_fmt(contrast.low.mean)}): {cause}."
        ),
        evidence={
            "mean": contrast.high.mean,
            "rest_mean": contrast.low.mean,
            "factor": contrast.factor,
            "welch_t": contrast.t,
            "tokens": contrast.high.n,
        },
        steps=_steps(evidence, lambda s: None if (c := _edge(s, prefix)) is None else c.factor),
        rows=_rows(evidence, f"{prefix}_token"),
        look_at="position 0 of each round" if prefix == "first" else "the final token of each row",
    )


def first_token(evidence: Evidence) -> Hint | None:
    return _edge_hint(evidence, "first")


def last_token(evidence: Evidence) -> Hint | None:
    return _edge_hint(evidence, "last")


# ------------------------------------------------------------------------------------------ low_probability
def _bucket_group(bucket: Mapping[str, float]) -> Group:
    return Group(bucket["tokens"], bucket["y"], bucket["y2"])


def _low_probability(sums: Sums) -> Contrast | None:
    buckets = sums["probability_buckets"]
    low = sum((_bucket_group(buckets[k]) for k in LOW_BUCKETS), Group(0.0, 0.0, 0.0))
    high = sum((_bucket_group(buckets[k]) for k in HIGH_BUCKETS), Group(0.0, 0.0, 0.0))
    contrast = Contrast(low, high)
    return contrast if contrast.holds(LOW_PROBABILITY_MIN_FACTOR) else None


def low_probability(evidence: Evidence) -> Hint | None:
    contrast = _low_probability(evidence.run)
    if contrast is None:
        return None
    buckets = evidence.run["probability_buckets"]
    total_abs = sum(b["abs"] for b in buckets)
    tokens = sum(b["tokens"] for b in buckets)
    lowest = max(k for k, b in enumerate(buckets) if b["tokens"] > 0)
    abs_share = buckets[lowest]["abs"] / total_abs if total_abs > 0 else 0.0
    token_share = buckets[lowest]["tokens"] / tokens
    return Hint(
        id="low_probability",
        message=(
            f"Mismatch is concentrated on low-probability tokens: rollout p < 0.1 tokens have {contrast.factor:.1f}× "
            f"the mean min(|δ|, 1) of p ≥ 0.5 tokens ({_fmt(contrast.high.mean)} vs {_fmt(contrast.low.mean)}), and "
            f"the {PROBABILITY_LABELS[lowest]} bucket carries {abs_share:.0%} of Σ|δ| with {token_share:.0%} of the "
            "tokens — the numerical-precision signature (bf16 logits, a low-precision lm_head or softmax)."
        ),
        evidence={
            "low_mean": contrast.high.mean,
            "high_mean": contrast.low.mean,
            "factor": contrast.factor,
            "welch_t": contrast.t,
            "lowest_bucket_abs_share": abs_share,
            "lowest_bucket_token_share": token_share,
        },
        steps=_steps(evidence, lambda s: None if (c := _low_probability(s)) is None else c.factor),
        rows=[],
        look_at=f"tokens with rollout {PROBABILITY_LABELS[lowest]} (the worst-tokens table); precision of the "
        "lm_head / logits on both sides",
    )


# ------------------------------------------------------------------------------------------ long_context
def _long_context(sums: Sums) -> tuple[Contrast, float, int, int] | None:
    """(late vs early contrast, slope per log2 bucket, first position of the late half, buckets used)."""
    buckets = [(k, _bucket_group(b)) for k, b in enumerate(sums["position_buckets"]) if k >= 1]
    used = [(k, g) for k, g in buckets if g.n >= MIN_GROUP_TOKENS]
    if len(used) < LONG_CONTEXT_MIN_BUCKETS:
        return None
    fit = least_squares([float(k) for k, _ in used], [g.mean for _, g in used])
    if fit is None or fit[1] <= 0:
        return None
    half = len(used) // 2
    early = sum((g for _, g in used[:half]), Group(0.0, 0.0, 0.0))
    late = sum((g for _, g in used[half:]), Group(0.0, 0.0, 0.0))
    contrast = Contrast(late, early)
    if not contrast.holds(LONG_CONTEXT_MIN_FACTOR):
        return None
    return contrast, fit[0], 1 << (used[half][0] - 1), len(used)


def long_context(evidence: Evidence) -> Hint | None:
    found = _long_context(evidence.run)
    if found is None:
        return None
    contrast, slope, start, buckets = found
    return Hint(
        id="long_context",
        message=(
            f"Mismatch grows with the position in the row: from position {start} on, mean min(|δ|, 1) is "
            f"{contrast.factor:.1f}× that of earlier positions ({_fmt(contrast.high.mean)} vs "
            f"{_fmt(contrast.low.mean)}; +{slope:.3g} per doubling of the position): long-context numerics "
            "(RoPE scaling, attention kernels, KV-cache precision) differ between the engines."
        ),
        evidence={
            "late_mean": contrast.high.mean,
            "early_mean": contrast.low.mean,
            "factor": contrast.factor,
            "welch_t": contrast.t,
            "slope_per_doubling": slope,
            "late_from_position": float(start),
            "position_buckets": float(buckets),
        },
        steps=_steps(evidence, lambda s: None if (f := _long_context(s)) is None else f[0].factor),
        rows=[],
        look_at=f"positions ≥ {start} (the per-position table)",
    )


# ------------------------------------------------------------------------------------------ turn_growth
def _turn_growth(rounds: Sequence[Mapping[str, Any]]) -> tuple[float, float, float, float, int, int] | None:
    """(slope, CI low, fitted mean |δ| at the first and at the last round used, last round, rounds used)."""
    used = [r for r in rounds if not r["pooled"] and r["token_count"] >= MIN_GROUP_TOKENS]
    if len(used) < TURN_MIN_ROUNDS:
        return None
    xs, ys = [float(r["round"]) for r in used], [r["logprob_abs_diff_mean"] for r in used]
    fit = least_squares(xs, ys)
    if fit is None or fit[1] <= 0:
        return None
    # the fitted line, not the last round's own mean: late rounds are few and noisy
    intercept = sum(ys) / len(ys) - fit[0] * sum(xs) / len(xs)
    first, last = intercept + fit[0] * xs[0], intercept + fit[0] * xs[-1]
    if first <= 0 or last - first < MIN_GAP or last < TURN_MIN_FACTOR * first:
        return None
    return fit[0], fit[1], first, last, int(used[-1]["round"]), len(used)


def _step_rounds(metrics: Mapping[str, float], pooled: set[int]) -> list[dict[str, Any]]:
    """A step's per-round table rebuilt from its per_round/round_<k>/… metrics (``pooled``: the pooled round)."""
    rounds: dict[int, dict[str, Any]] = {}
    for name, value in metrics.items():
        if (parsed := parse_round_key(name)) is not None:
            index, row = parsed
            entry = rounds.setdefault(index, {"pooled": index in pooled})
            entry[round_quantity(row)] = value
    return [
        {"round": k, **v}
        for k, v in sorted(rounds.items())
        if "token_count" in v and "logprob_abs_diff_mean" in v and math.isfinite(v["logprob_abs_diff_mean"])
    ]


def turn_growth(result: AnalysisResult) -> Hint | None:
    found = _turn_growth(result.rounds)
    if found is None:
        return None
    slope, low, first, last, last_round, used = found
    steps = []
    pooled = {int(r["round"]) for r in result.rounds if r["pooled"]}
    for step in result.steps:
        step_found = _turn_growth(_step_rounds(step.metrics, pooled))
        if step_found is not None and step.step is not None:
            steps.append((step_found[3] / max(step_found[2], 1e-12), step.step))
    return Hint(
        id="turn_growth",
        message=(
            f"Mismatch grows with the turn: mean |δ| rises by {slope:.3g} per round (95 % CI from {low:.3g}), from "
            f"{_fmt(first)} at the first round to {_fmt(last)} at round {last_round} (fitted): the two sides see "
            "different contexts "
            "in later turns (tool outputs re-tokenized, chat template or truncation differences)."
        ),
        evidence={
            "slope_per_round": slope,
            "ci_low": low,
            "first_round_mean": first,
            "last_round_mean": last,
            "factor": last / first if first > 0 else math.inf,
            "rounds": float(used),
        },
        steps=[step for _, step in sorted(steps, key=lambda item: (-item[0], item[1]))[:MAX_STEPS]],
        rows=[],
        look_at=f"rounds ≥ 1 up to round {last_round} (the per-round table): how later turns are tokenized",
    )


# ------------------------------------------------------------------------------------------ staleness
def staleness(evidence: Evidence) -> Hint | None:
    lags = {lag: Group(s[0], s[1], s[2]) for lag, s in evidence.lags.items() if s[0] > 0}
    if not evidence.has_versions or len(lags) < 2:
        return None
    freshest = min(lags)
    stale = sum((g for lag, g in lags.items() if lag != freshest), Group(0.0, 0.0, 0.0))
    contrast = Contrast(stale, lags[freshest])
    if not contrast.holds(STALENESS_MIN_FACTOR):
        return None
    rows = _rows(evidence, "staleness")
    per_lag = ", ".join(f"lag {lag - freshest}: {_fmt(g.mean)}" for lag, g in sorted(lags.items())[:6])
    return Hint(
        id="staleness",
        message=(
            f"Mismatch grows with policy staleness: rows generated by an older policy have {contrast.factor:.1f}× "
            f"the mean min(|δ|, 1) of the freshest ({per_lag}): off-policy lag, not numerics — bound the async "
            "lag or correct for it (IS over the behaviour policy)."
        ),
        evidence={
            "stale_mean": contrast.high.mean,
            "fresh_mean": contrast.low.mean,
            "factor": contrast.factor,
            "welch_t": contrast.t,
            "max_lag": float(max(lags) - freshest),
            "stale_tokens": contrast.high.n,
        },
        steps=sorted({row.step for row in rows})[:MAX_STEPS],
        rows=rows,
        look_at="rows whose policy_version lags their step the most",
    )


# ------------------------------------------------------------------------------------------ signed buckets
# top_p_truncation and processed_logprobs read the sign of δ per rollout-probability bucket: Σδ against Σ|δ| (the
# share of |δ| on the negative side) and t = Σδ / √Σy² (the mean's t for a mean near 0; y² = min(|δ|, 1)²).
TRUNCATION_MIN_LOG_MASS = 0.005  # |mean δ| over all model tokens: a kept mass ≤ 99.5 % (top_p 0.99 gives ≈ 0.008)
TRUNCATION_MIN_SHARE = 0.8  # ≥ 80 % of Σ|δ| on the truncating side over all tokens (1.00 at top_p ≤ 0.95)
TRUNCATION_BUCKET_SHARE = 0.9  # … and ≥ 90 % in at least two buckets (placeholder zeros make one: p ≥ 0.9)
TRUNCATION_MIN_BUCKETS = 2
CONTRADICT_T = 3.0  # a bucket with its mean on the other side at t ≥ 3 rules truncation out (temperature, noise)
SAMPLING_MIN_STEPS = 3  # with ≥ 3 steps, at least half of them must show the pattern on their own
SAMPLING_MIN_STEP_SHARE = 0.5
PROCESSED_SIDE_SHARE = 0.8  # temperature: one bucket ≥ 80 % of Σ|δ| negative, another ≥ 80 % positive …
# (each with |mean δ| ≥ MIN_GAP and |t| ≥ MIN_T)


@dataclass(frozen=True)
class Signed:
    """A rollout-probability bucket's tokens, Σδ, Σ|δ| and Σy²."""

    n: float
    delta: float
    abs: float
    squares: float

    @property
    def mean(self) -> float:
        return self.delta / self.n if self.n > 0 else 0.0

    @property
    def negative_share(self) -> float:
        """Share of Σ|δ| on tokens with δ < 0 (0.5 when Σ|δ| is 0)."""
        return (self.abs - self.delta) / (2 * self.abs) if self.abs > 0 else 0.5

    @property
    def t(self) -> float:
        return self.delta / math.sqrt(self.squares) if self.squares > 0 else 0.0

    def __add__(self, other: Signed) -> Signed:
        return Signed(self.n + other.n, self.delta + other.delta, self.abs + other.abs, self.squares + other.squares)


def _signed_buckets(sums: Sums) -> list[tuple[int, Signed]]:
    """(bucket, signed sums) of the rollout-probability buckets with ≥ MIN_GROUP_TOKENS tokens."""
    out = []
    for k, b in enumerate(sums["probability_buckets"]):
        if b["tokens"] >= MIN_GROUP_TOKENS:
            out.append((k, Signed(b["tokens"], b.get("delta", 0.0), b["abs"], b["y2"])))
    return out


# ------------------------------------------------------------------------------------------ top_p_truncation
def _truncation(sums: Sums) -> tuple[float, Signed, list[tuple[int, Signed]]] | None:
    """(sign of δ on the truncated side's tokens: −1 rollout truncated, +1 trainer; all tokens; the buckets) when
    δ has one sign in every populated bucket and the kept mass is clearly below 1."""
    buckets = _signed_buckets(sums)
    if len(buckets) < 2:
        return None
    total = sum((b for _, b in buckets), Signed(0.0, 0.0, 0.0, 0.0))
    sign = -1.0 if total.delta < 0 else 1.0
    share = total.negative_share if sign < 0 else 1.0 - total.negative_share
    if abs(total.mean) < TRUNCATION_MIN_LOG_MASS or sign * total.t < MIN_T or share < TRUNCATION_MIN_SHARE:
        return None
    shares = [b.negative_share if sign < 0 else 1.0 - b.negative_share for _, b in buckets]
    contradicted = any(-sign * b.t >= CONTRADICT_T and abs(b.mean) >= MIN_GAP for _, b in buckets)
    if contradicted or sum(share >= TRUNCATION_BUCKET_SHARE for share in shares) < TRUNCATION_MIN_BUCKETS:
        return None
    return sign, total, buckets


KEPT_EXPLAINED = 0.5  # with a kept_mass column: Σ|δ − log M| at most half of Σ|δ| (δ tracks log M)


def _kept_mass_column(sums: Sums) -> tuple[float, float] | None:
    """(mean log M, Σ|δ − log M| / Σ|δ|) when a kept_mass column shows a kept mass ≤ 99.5 % that δ follows."""
    tokens = sums.get("kept_tokens", 0.0)
    if tokens < MIN_GROUP_TOKENS or sums["kept_abs"] <= 0:
        return None
    mean_log, residual = sums["kept_log"] / tokens, sums["kept_residual"] / sums["kept_abs"]
    if mean_log > -TRUNCATION_MIN_LOG_MASS or residual > KEPT_EXPLAINED:
        return None
    return mean_log, residual


def top_p_truncation(evidence: Evidence) -> Hint | None:
    """The engine reports logprobs of the truncated, renormalised sampling distribution (top-p / top-k) and the trainer
    those of the full one: for a token of a kept set of mass M, r = a − log M, so δ = log M ≤ 0 on every token and ρ
    = M; every rollout-probability bucket leans to one side (TRL #6789). A kept_mass column, where the dump has one,
    decides instead."""
    if evidence.run.get("kept_tokens", 0.0) > 0:
        return _top_p_from_column(evidence)
    found = _truncation(evidence.run)
    if found is None or not _persistent(evidence, _truncation):
        return None
    sign, total, buckets = found
    kept = math.exp(-abs(total.mean))  # ρ = M per token: exp(mean δ) is the geometric mean of the kept mass
    side, other = ("rollout", "trainer") if sign < 0 else ("trainer", "rollout")
    share = total.negative_share if sign < 0 else 1.0 - total.negative_share
    per_bucket = ", ".join(f"{PROBABILITY_LABELS[k]}: {_fmt(b.mean)}" for k, b in buckets)
    return Hint(
        id="top_p_truncation",
        message=(
            f"δ leans to one side in every rollout-probability bucket ({share:.0%} of Σ|δ| has δ "
            f"{'<' if sign < 0 else '>'} 0; mean δ {per_bucket}): the {side} logprobs come from a truncated, "
            f"renormalised distribution (top-p / top-k) and the {other}'s from the full one. Kept probability mass "
            f"≈ {kept:.3g} (exp of mean δ: for such sampling every token's ρ is its kept mass)."
        ),
        evidence={
            "kept_mass": kept,
            "mean_log_ratio": total.mean,
            "one_sided_share": share,
            "welch_t": abs(total.t),
            "buckets": float(len(buckets)),
            "tokens": total.n,
        },
        steps=_steps(evidence, lambda s: None if (f := _truncation(s)) is None else abs(f[1].mean)),
        rows=[],
        look_at=f"the {side} engine's sampling parameters (top_p, top_k, min_p) and whether its logprobs are taken "
        "before or after they are applied (e.g. vLLM logprobs_mode='processed_logprobs')",
    )


def _top_p_from_column(evidence: Evidence) -> Hint | None:
    found = _kept_mass_column(evidence.run)
    if found is None:
        return None
    mean_log, residual = found
    kept = math.exp(mean_log)
    return Hint(
        id="top_p_truncation",
        message=(
            f"The dump's kept_mass column says top-p / top-k kept {kept:.3g} of the probability (geometric mean over "
            f"{int(evidence.run['kept_tokens'])} model tokens) and δ follows log kept_mass (Σ|δ − log M| is "
            f"{residual:.0%} of Σ|δ|): the rollout logprobs are those of the truncated, renormalised distribution, the "
            "trainer's of the full one."
        ),
        evidence={"kept_mass": kept, "mean_log_kept_mass": mean_log, "unexplained_share": residual},
        steps=_steps(evidence, lambda s: None if (f := _kept_mass_column(s)) is None else -f[0]),
        rows=[],
        look_at="the rollout engine's sampling parameters (top_p, top_k, min_p) and whether its logprobs are taken "
        "before or after they are applied (e.g. vLLM logprobs_mode='processed_logprobs')",
    )


# ------------------------------------------------------------------------------------------ processed_logprobs
def _processed_sign_flip(sums: Sums) -> tuple[int, Signed, int, Signed] | None:
    """(bucket, sums) of the likeliest bucket that leans one way and of a less likely one that leans the other way,
    each ≥ 80 % of its Σ|δ| on its side, |mean| ≥ MIN_GAP and |t| ≥ MIN_T: the temperature signature."""
    buckets = _signed_buckets(sums)

    def leaning(b: Signed, sign: float) -> bool:
        share = b.negative_share if sign < 0 else 1.0 - b.negative_share
        return share >= PROCESSED_SIDE_SHARE and sign * b.mean >= MIN_GAP and sign * b.t >= MIN_T

    for high_index, (k, high) in enumerate(buckets):
        for sign in (-1.0, 1.0):
            if not leaning(high, sign):
                continue
            for j, low in buckets[high_index + 1 :]:
                if leaning(low, -sign):
                    return k, high, j, low
    return None


def _persistent(evidence: Evidence, test: Callable[[Sums], object | None]) -> bool:
    """Whether at least half of the steps with ≥ 2 populated probability buckets pass ``test`` on their own (with
    fewer than SAMPLING_MIN_STEPS such steps, the run's test alone decides). A sampling setting holds for every
    step; a few steps of heavy rollout noise (a spike) make the buckets lean by selection alone (bucketing by r picks
    the tokens whose noise raised r), in those steps only."""
    steps = [sums for _, sums in evidence.steps.items() if len(_signed_buckets(sums)) >= 2]
    if len(steps) < SAMPLING_MIN_STEPS:
        return True
    return sum(test(sums) is not None for sums in steps) >= SAMPLING_MIN_STEP_SHARE * len(steps)


def processed_logprobs(evidence: Evidence) -> Hint | None:
    """One side's logprobs at a temperature T ≠ 1: r = log softmax(z / T)[tok], not a / T. At T < 1 the likely tokens
    gain probability and the unlikely ones lose it: δ < 0 where the rollout says p is high, δ > 0 where low (T > 1
    the reverse). Truncation keeps one sign everywhere (``top_p_truncation``), numerical noise has no sign."""
    found = _processed_sign_flip(evidence.run)
    if found is None or not _persistent(evidence, _processed_sign_flip):
        return None
    k, high, j, low = found
    sharper = high.mean < 0  # the rollout gives its likely tokens more than the trainer does
    what = (
        "the rollout distribution is sharper than the trainer's (a temperature T < 1 on the rollout side, or T > 1 "
        "on the trainer's)"
        if sharper
        else "the rollout distribution is flatter than the trainer's (T > 1 on the rollout side, or T < 1 on the "
        "trainer's)"
    )
    return Hint(
        id="processed_logprobs",
        message=(
            f"δ changes sign with the rollout probability: mean δ {_fmt(high.mean)} on {PROBABILITY_LABELS[k]} tokens "
            f"({max(high.negative_share, 1 - high.negative_share):.0%} of their Σ|δ| one way) and {_fmt(low.mean)} on "
            f"{PROBABILITY_LABELS[j]} tokens: {what}. One side's logprobs come from a temperature-processed "
            "distribution."
        ),
        evidence={
            "likely_bucket_mean": high.mean,
            "unlikely_bucket_mean": low.mean,
            "likely_welch_t": high.t,
            "unlikely_welch_t": low.t,
            "sharper_rollout": 1.0 if sharper else 0.0,
        },
        steps=_steps(evidence, lambda s: None if (f := _processed_sign_flip(s)) is None else abs(f[3].mean)),
        rows=_rows(evidence, "processed_logprobs"),
        look_at="the temperature with which each side computes its logprobs (the engine's logprobs mode, the trainer's "
        "logits / T)",
    )


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
        steps=_steps(evidence, lambda s: s.get("id_differ", 0.0) or None),
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
            f"of the rest of their turn (mean min(|δ|, 1) {_fmt(head.high.mean)} vs {_fmt(head.low.mean)}), while "
            f"the first tokens of round 0 do not ({_fmt(prompt.high.mean)}): the trainer re-tokenizes the multi-turn "
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
        steps=_steps(evidence, lambda s: None if (f := _retokenization(s)) is None else f[1].factor),
        rows=[],
        look_at=f"the first {tokens} of rounds ≥ 1 (after each tool / environment segment): compare the two sides' "
        "token ids there; reuse the rollout's token ids instead of re-tokenizing the history",
    )


# ------------------------------------------------------------------------------------------ resume_spike
RESUME_MIN_FACTOR = 2.0  # the steps right after a resume at least 2× the mismatch of the steps before it
RESUME_BASELINE_STEPS = 8  # … the (up to) 8 steps before the resume


def _step_group(sums: Sums) -> Group:
    return sum((_bucket_group(b) for b in sums["probability_buckets"]), Group(0.0, 0.0, 0.0))


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
            f"before (mean min(|δ|, 1) {_fmt(contrast.high.mean)} vs {_fmt(contrast.low.mean)}; {share:.0%} of the "
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
