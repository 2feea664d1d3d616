"""The metric catalogue: one row per metric key rollout-diag reports, stating the metric's identity once.

A row holds the key (verl's name, or SkyRL's / the legacy helper's / rollout-diag's own), its METRICS.md
section, formula, unit, direction, the terminal's short name, the report's title, the glossary's "a high value
means" text and, for the key metrics, the verdict thresholds. The glossary and ``docs/metrics.md``
(``rollout_diag.glossary``), the verdicts (``rollout_diag.decisions.levels``), the terminal tables (``render/``), the
report (``report/``) and ``diff``/``check`` (``decisions/``) read these rows; none of them spells a key.

Keys the families generate are rows with a placeholder: ``per_round/round_<k>/…`` (round index) and
``rollout_corr/rollout_rs_<opt>_…`` (rejection option, e.g. ``seq_mean_k3``); :func:`lookup` maps a concrete
key to its row, also through a preset prefix (``<preset>/rollout_corr/kl`` from ``compute_metrics``) or a preset
suffix (``summary/rejected_token_fraction[<preset>]`` in ``diff``). The accumulator families under
``rollout_diag/metrics/`` write the keys they compute as ``PREFIX + name`` with ``PREFIX`` one of this module's
``*_PREFIX`` constants (or a row's ``key``); ``tests/test_catalogue.py`` checks that every key they produce has a
row here, that every row is produced, and that no module but this one and the dialects spells a key. Dialect
keys (``--dialect``) are each trainer's own names, documented by that dialect's table (``docs/dialects.md``);
verl's are this catalogue's keys.

Pure data: no torch, no rich, no plotly; importable by every renderer.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from rollout_diag.presets import RS_OPTIONS

# The contract's two constants (METRICS.md, Notation), here because every consumer may import this module:
EPS = 1e-8  # verl's masked-mean denominator guard
CLAMP = 20.0  # clamp20

# Key prefixes, one per family: each family writes its keys as its PREFIX (one of these) + name.
OFFPOLICY_PREFIX = "rollout_corr/"  # §1–§3, verl's rollout_corr_helper
DEBUG_PREFIX = "training/"  # §5, verl's debug metrics
ROLLOUT_KL_PREFIX = "rollout_kl/"  # §6, SkyRL's rollout-KL estimators
ROUNDS_PREFIX = "per_round/"  # §7
LEGACY_PREFIX = "mismatch/"  # §8 and §7's last line
LOCALISATION_PREFIX = "diag/"
SUMMARY_PREFIX = "summary/"  # what a preset drops, rollout-diag's own keys
PREFIXES = (
    OFFPOLICY_PREFIX,
    DEBUG_PREFIX,
    ROLLOUT_KL_PREFIX,
    ROUNDS_PREFIX,
    LEGACY_PREFIX,
    LOCALISATION_PREFIX,
    SUMMARY_PREFIX,
)

# Glossary sections, in the order the glossary, docs/metrics.md and the report list them.
SECTIONS = {
    "offpolicy": "Off-policy metrics (METRICS.md §1)",
    "is": "Importance-sampling weights (§2)",
    "rs": "Rejection sampling (§3)",
    "debug": "verl debug metrics on probabilities (§5)",
    "rollout_kl": "Rollout-KL estimators (§6)",
    "rounds": "Multi-turn rounds (§7)",
    "localisation": "Localisation",
    "counts": "Counts of model tokens by |δ|: exactness, extreme tokens, tolerance bands",
    "legacy": "Legacy importance sampling (§8)",
    "summary": "What a preset drops (rollout-diag's own keys)",
    "gates": "Gate and diff metrics (check, diff)",
}
# A section's paragraph under its heading in docs/metrics.md (where its numbers come from, what to compare them with).
SECTION_NOTES = {
    "counts": "Exact counts from the fused pass: any chunking or worker count gives the same digits. *Is this zero "
    "real?* `diag/mismatched_tokens` = 0 means δ ≡ 0 bit for bit: deterministic, batch-invariant inference (verl #7688 "
    "targets k3_kl = 0, Megatron-LM #7562) or a trainer column copied from the rollout's (verl's bypass mode); the "
    "verdict's cause is then `identical` and `compare-presets` recommends nothing, and `check --exact` gates it "
    "(slime's CI gate asks |δ| ≤ 1e-6 instead). Where either column is float32 the values compare as float32 (one ulp "
    "at |logprob| ≈ 1 is 1.2e-7; RL-Kernel #329 reports 96 of 128 tokens one ulp apart, which the verdict says in so "
    "many words). Reference magnitudes for the extreme shares: AReaL #1496 measured |δ| > ln 2 on 9.08e-3 of the "
    "tokens without R3 (rollout routing replay) and 6.8e-5 with it, |δ| > ln 5 on 1.33e-3 and 4.0e-6. The bands are "
    "MLPerf-style parity checks (maxtext #5231): the share of tokens, and of whole sequences, within ±ε nats.",
}

# Units: what a value is measured in (the report draws SHARE in %).
NATS = "nats"  # a log-probability difference or a KL
PERPLEXITY = "perplexity"
RATIO = "ratio"  # an importance weight or a ratio of probabilities, 1 = no correction
DIMENSIONLESS = "dimensionless"  # χ², a rejection statistic in its own metric space
PROBABILITY = "probability"  # a difference of probabilities, in [0, 1]
CORRELATION = "correlation"
SHARE = "share"  # a fraction in [0, 1]
COUNT = "count"
INDEX = "index"  # a round number
FLAG = "flag"  # 0 or 1
UNITS = (NATS, PERPLEXITY, RATIO, DIMENSIONLESS, PROBABILITY, CORRELATION, SHARE, COUNT, INDEX, FLAG)

# Direction: which way a value is worse.
UP = "higher is worse"
DOWN = "lower is worse"
AWAY = "worse away from its neutral value (0 or 1), either way"
NONE = "neither: a property of the data or a count"
DIRECTIONS = (UP, DOWN, AWAY, NONE)


@dataclass(frozen=True)
class Thresholds:
    """The verdict of a key metric: *watch* at or above ``watch``, *bad* at or above ``bad`` (on |value|)."""

    watch: float
    bad: float
    measures: str  # one line: what the verdict judges (the verdict's meaning in JSON, the report's card)


@dataclass(frozen=True)
class RowFormula:
    """How ``diff`` and ``check`` recompute a metric from per-row sums (``metrics/rowstats.py`` ROW_SUMS), so that
    resampled rows give bootstrap replicates: ``token``: Σ_i S_i[of] / (N + eps) + offset (a token mean);
    ``row``: mean_i of the per-row value ``of`` + offset (``decisions/rowmetrics.py`` names the per-row values:
    ``abs_log_ppl_diff`` = |d_i|, ``chi2_seq_term`` = exp(2·clamp20(S_i[δ])), ``row_mean:X`` = R_i[X])."""

    kind: str  # "token" | "row"
    of: str
    offset: float = 0.0
    eps: float = EPS


@dataclass(frozen=True)
class Metric:
    """One catalogue row (see the module docstring).

    The texts differ in purpose and each is what its consumer has always printed: ``high_means`` (glossary, docs),
    ``verdict.measures`` (verdict cards and JSON), ``note`` (terminal) and ``row_meaning`` (diff).
    """

    key: str
    section: str
    formula: str
    high_means: str  # glossary text; "" = not listed in the glossary or docs/metrics.md
    unit: str
    direction: str
    short: str  # terminal column header and name in sentences
    title: str  # long name: report trend panel title, terminal per-round table header
    note: str  # terminal "All metrics" note, "" for none: two different KLs share the name k3, notes say which is which
    verdict: Thresholds | None
    signed: bool  # can be negative: plots do not pin the axis at zero
    row_meaning: str  # diff's one-line meaning of a metric it recomputes from rows: "" when diff does not
    # (role, rank): what rollout-diag does with the metric (Role), and its place among the metrics of that role
    roles: tuple[tuple[str, int], ...] = ()
    row: RowFormula | None = None  # how diff / check recompute it from per-row sums (role "bootstrapped")

    def has(self, role: str) -> bool:
        return any(name == role for name, _ in self.roles)


class Role:
    """What rollout-diag does with a metric, declared once in its row (``roles=``): nothing else lists metrics by
    role. The rank orders the metrics of one role (tables and panels list them in that order)."""

    JUDGED = "judged"  # has an ok / watch / bad level (its ``verdict`` thresholds): the key metrics
    LENGTH_GROWING = "length_growing"  # expected value grows with the response length: never sets the level alone
    ANOMALY = "anomaly"  # checked for anomalous steps (decisions.trends)
    TRENDED = "trended"  # drawn as a per-step trend panel in the report
    BOOTSTRAPPED = "bootstrapped"  # recomputed from per-row sums by diff (bootstrap) and check: needs ``row=``
    RUNS = "runs"  # the key metrics ``runs`` reports per run and per knob effect: needs ``row=``
    ALL = (JUDGED, LENGTH_GROWING, ANOMALY, TRENDED, BOOTSTRAPPED, RUNS)


def with_role(role: str) -> tuple[Metric, ...]:
    """The catalogue rows with ``role``, in the order of their rank."""
    found = [(rank, index, row) for index, row in enumerate(_ROWS) for name, rank in row.roles if name == role]
    return tuple(row for _, _, row in sorted(found, key=lambda item: item[:2]))


def keys_with_role(role: str) -> tuple[str, ...]:
    """The keys of :func:`with_role`."""
    return tuple(row.key for row in with_role(role))


_ROWS: list[Metric] = []


def _metric(
    key: str,
    section: str,
    formula: str,
    high_means: str = "",
    *,
    unit: str,
    direction: str = UP,
    short: str = "",
    title: str = "",
    note: str = "",
    verdict: Thresholds | None = None,
    signed: bool = False,
    row_meaning: str = "",
    roles: dict[str, int] | None = None,
    row: RowFormula | None = None,
) -> Metric:
    """Add a row; ``short`` defaults to the key's last part, ``title`` to ``short``."""
    short = short or key.rpartition("/")[2]
    metric = Metric(
        key,
        section,
        formula,
        high_means,
        unit,
        direction,
        short,
        title or short,
        note,
        verdict,
        signed,
        row_meaning,
        tuple((roles or {}).items()),
        row,
    )
    _ROWS.append(metric)
    return metric


# ------------------------------------------------------------------------------------------ §1 off-policy
TRAINING_PPL = _metric(
    "rollout_corr/training_ppl",
    "offpolicy",
    "mean_i exp(−R_i[a])",
    "the trainer finds the sampled text surprising (a property of the data, not of the mismatch)",
    unit=PERPLEXITY,
    direction=NONE,
)
_metric(
    "rollout_corr/training_log_ppl",
    "offpolicy",
    "mean_i (−R_i[a])",
    "as training_ppl, in log space",
    unit=NATS,
    direction=NONE,
)
_metric(
    "rollout_corr/rollout_ppl",
    "offpolicy",
    "mean_i exp(−R_i[r])",
    "the rollout engine found its own samples surprising (high temperature, long tails)",
    unit=PERPLEXITY,
    direction=NONE,
)
ROLLOUT_LOG_PPL = _metric(
    "rollout_corr/rollout_log_ppl",
    "offpolicy",
    "mean_i (−R_i[r])",
    "as rollout_ppl, in log space",
    unit=NATS,
    direction=NONE,
)
KL = _metric(
    "rollout_corr/kl",
    "offpolicy",
    "T[r − a]",
    "rollout is more confident than the trainer on the sampled tokens; can be negative, so read k3_kl too",
    unit=NATS,
    direction=AWAY,
    note="T[r − a]: can be negative; read k3_kl",
    signed=True,
    roles={Role.TRENDED: 2},
)
K3_KL = _metric(
    "rollout_corr/k3_kl",
    "offpolicy",
    "T[exp(δ) − δ − 1]",
    "the two policies disagree token by token (k3 estimator of KL, never negative); the headline number",
    unit=NATS,
    note="KL(rollout‖trainer), k3 estimator, token mean: the headline number",
    verdict=Thresholds(1e-3, 1e-2, "token-level KL(rollout‖trainer), k3 estimator"),
    row_meaning="token-mean k3 KL, exp(δ) − δ − 1 (§1)",
    roles={Role.BOOTSTRAPPED: 1, Role.JUDGED: 1, Role.TRENDED: 1, Role.ANOMALY: 1, Role.RUNS: 1},
    row=RowFormula("token", "k3"),
)
_metric(
    "rollout_corr/log_ppl_diff",
    "offpolicy",
    "mean_i d_i,  d_i = R_i[r] − R_i[a]",
    "a systematic per-sequence bias: rollout logprobs higher than the trainer's",
    unit=NATS,
    direction=AWAY,
    signed=True,
)
LOG_PPL_ABS_DIFF = _metric(
    "rollout_corr/log_ppl_abs_diff",
    "offpolicy",
    "mean_i |d_i|",
    "sequences differ in log-perplexity between the stacks, whatever the sign",
    unit=NATS,
    title="|log-ppl diff|",
    verdict=Thresholds(1e-2, 5e-2, "per-sequence |log-ppl gap| between the two stacks"),
    row_meaning="mean |log-ppl gap| per sequence (§1)",
    roles={Role.BOOTSTRAPPED: 4, Role.JUDGED: 4, Role.TRENDED: 5, Role.ANOMALY: 3},
    row=RowFormula("row", "abs_log_ppl_diff"),
)
_metric(
    "rollout_corr/log_ppl_diff_max",
    "offpolicy",
    "max_i d_i",
    "at least one sequence the rollout liked much more",
    unit=NATS,
    signed=True,
)
_metric(
    "rollout_corr/log_ppl_diff_min",
    "offpolicy",
    "min_i d_i",
    "(very negative) at least one sequence the trainer liked much more",
    unit=NATS,
    direction=DOWN,
    signed=True,
)
_metric(
    "rollout_corr/ppl_ratio",
    "offpolicy",
    "mean_i exp(d_i)",
    "above 1: trainer perplexity above rollout perplexity",
    unit=RATIO,
    direction=AWAY,
)
CHI2_TOKEN = _metric(
    "rollout_corr/chi2_token",
    "offpolicy",
    "T[exp(2·clamp20(δ))] − 1",
    "token importance weights ρ vary a lot: token-level IS corrections get noisy",
    unit=DIMENSIONLESS,
    title="χ² token",
    verdict=Thresholds(1e-2, 1e-1, "variance of token IS weights ρ = π_train/π_rollout"),
    row_meaning="χ² of token IS weights (§1)",
    roles={Role.BOOTSTRAPPED: 2, Role.JUDGED: 2, Role.TRENDED: 3, Role.ANOMALY: 2},
    row=RowFormula("token", "chi2_term", offset=-1.0),
)
CHI2_SEQ = _metric(
    "rollout_corr/chi2_seq",
    "offpolicy",
    "mean_i exp(2·clamp20(S_i[δ])) − 1",
    "sequence importance weights vary a lot (grows with length): sequence-level IS is unreliable",
    unit=DIMENSIONLESS,
    title="χ² seq",
    verdict=Thresholds(0.5, 2.0, "variance of sequence IS weights (grows with length)"),
    row_meaning="χ² of sequence IS weights (§1)",
    roles={Role.BOOTSTRAPPED: 3, Role.JUDGED: 3, Role.TRENDED: 4, Role.LENGTH_GROWING: 1},
    row=RowFormula("row", "chi2_seq_term", offset=-1.0),
)

# ------------------------------------------------------------------------------------------ §2 importance sampling
IS_MEAN = _metric(
    "rollout_corr/rollout_is_mean",
    "is",
    "T[w], w = truncated or IcePop-masked ρ (token or sequence level)",
    "far from 1: the correction reweights the batch strongly",
    unit=RATIO,
    direction=AWAY,
)
IS_MAX = _metric(
    "rollout_corr/rollout_is_max",
    "is",
    "max of w over masked tokens (sequence: exp(min(max_i s_i, 20)))",
    "some token or sequence gets a large weight (capped by the threshold under TIS)",
    unit=RATIO,
)
IS_MIN = _metric(
    "rollout_corr/rollout_is_min",
    "is",
    "min of w over masked tokens (sequence: exp(min_i s_i))",
    "(low value) some tokens are almost ignored",
    unit=RATIO,
    direction=DOWN,
)
IS_STD = _metric(
    "rollout_corr/rollout_is_std",
    "is",
    "sqrt(T[c²] − T[c]²), c = clamp(w, 0, U), from centred moments without verl's ε term (constant c gives 0)",
    "weights spread widely",
    unit=RATIO,
)
IS_EFF_SAMPLE_SIZE = _metric(
    "rollout_corr/rollout_is_eff_sample_size",
    "is",
    "1 / T[(c / T[c])²]",
    "high is good: close to 1 means the weights are nearly uniform; below 0.5 the correction wastes half the batch",
    unit=SHARE,
    direction=DOWN,
)
_metric(
    "rollout_corr/rollout_is_ratio_fraction_high",
    "is",
    "T[w_raw > U] (sequence: mean_i [s_i > log U])",
    "many ratios exceed the upper threshold and are truncated or masked",
    unit=SHARE,
)
_metric(
    "rollout_corr/rollout_is_ratio_fraction_low",
    "is",
    "T[w_raw < L'] (sequence: mean_i [s_i < log L'])",
    "many ratios fall below the lower bound",
    unit=SHARE,
)
_metric(
    "rollout_corr/rollout_is_seq_mean",
    "is",
    "mean_i q_i, q_i = R_i[w]",
    "far from 1: sequences reweighted on average",
    unit=RATIO,
    direction=AWAY,
)
_metric("rollout_corr/rollout_is_seq_std", "is", "unbiased std over all rows of q_i = R_i[w]", unit=RATIO)
_metric("rollout_corr/rollout_is_seq_max", "is", "max_i q_i, q_i = R_i[w]", unit=RATIO)
_metric("rollout_corr/rollout_is_seq_min", "is", "min_i q_i, q_i = R_i[w]", unit=RATIO, direction=DOWN)
_metric(
    "rollout_corr/rollout_is_seq_max_deviation",
    "is",
    "max_i |q_i − 1|",
    "at least one sequence is reweighted hard",
    unit=RATIO,
)
_metric("rollout_corr/rollout_is_seq_fraction_high", "is", "mean_i [R_i[w_raw] > U]", unit=SHARE)
_metric("rollout_corr/rollout_is_seq_fraction_low", "is", "mean_i [R_i[w_raw] < L']", unit=SHARE)
_metric(
    "rollout_corr/rollout_is_oob_ratio",
    "is",
    "T[w_raw < L or w_raw > U] (IcePop only)",
    "IcePop zeroes this share of tokens",
    unit=SHARE,
)
IS_BATCH_NORM_FACTOR = _metric(
    "rollout_corr/rollout_is_batch_norm_factor",
    "is",
    "T[w] (token) or mean over valid rows of q_i (sequence)",
    "far from 1: batch normalisation rescales the weights a lot",
    unit=RATIO,
    direction=AWAY,
)

# ------------------------------------------------------------------------------------------ §3 rejection sampling
RS_MASKED_FRACTION = _metric(
    "rollout_corr/rollout_rs_masked_fraction",
    "rs",
    "T[1 − final keep mask]",
    "the preset rejects this share of model tokens: that much training signal is dropped",
    unit=SHARE,
)
RS_SEQ_MASKED_FRACTION = _metric(
    "rollout_corr/rollout_rs_seq_masked_fraction",
    "rs",
    "mean_i [some masked token of row i rejected]",
    "this share of sequences loses at least one token (sequence options: the whole row)",
    unit=SHARE,
)
_metric(
    "rollout_corr/rollout_rs_<opt>_mean",
    "rs",
    "T[stat], stat = k1 −clamp20(δ), k2 ½clamp20(δ)², k3 exp(clamp20(δ))−1−clamp20(δ)",
    "the option's statistic is large on average: the data is far off-policy by that measure",
    unit=DIMENSIONLESS,
    signed=True,
)
_metric(
    "rollout_corr/rollout_rs_<opt>_masked_fraction",
    "rs",
    "T[1 − keep of this option]",
    "this option alone rejects that share of tokens",
    unit=SHARE,
)
_metric(
    "rollout_corr/rollout_rs_<opt>_seq_masked_fraction",
    "rs",
    "over valid rows: share with a token this option rejects",
    "this option alone touches that share of sequences",
    unit=SHARE,
)
_RS_OVER = "sequence options over valid rows' values, token options over masked tokens"
_metric("rollout_corr/rollout_rs_<opt>_max", "rs", f"max of stat: {_RS_OVER}", unit=DIMENSIONLESS, signed=True)
_metric(
    "rollout_corr/rollout_rs_<opt>_min",
    "rs",
    f"min of stat: {_RS_OVER}",
    unit=DIMENSIONLESS,
    direction=AWAY,
    signed=True,
)
_metric(
    "rollout_corr/rollout_rs_<opt>_std",
    "rs",
    "N > 1: masked population std of clamp(stat, lower, upper); else 0",
    unit=DIMENSIONLESS,
)
_metric(
    "rollout_corr/rollout_rs_<opt>_fraction_high",
    "rs",
    "sequence options: share of valid rows with v > upper; token options: T[stat > upper]",
    unit=SHARE,
)
_metric(
    "rollout_corr/rollout_rs_<opt>_fraction_low",
    "rs",
    "sequence options: share of valid rows with v < lower; token options: T[stat < lower]; 0 for k2/k3",
    unit=SHARE,
)
_RS_ROWS = "over valid rows of v_i (the row value, or R_i[stat] for token options); 0 when no row is valid"
_metric("rollout_corr/rollout_rs_<opt>_seq_mean", "rs", f"mean {_RS_ROWS}", unit=DIMENSIONLESS, signed=True)
_metric("rollout_corr/rollout_rs_<opt>_seq_std", "rs", f"unbiased std {_RS_ROWS}", unit=DIMENSIONLESS)
_metric("rollout_corr/rollout_rs_<opt>_seq_max", "rs", f"max {_RS_ROWS}", unit=DIMENSIONLESS, signed=True)
_metric(
    "rollout_corr/rollout_rs_<opt>_seq_min",
    "rs",
    f"min {_RS_ROWS}",
    unit=DIMENSIONLESS,
    direction=AWAY,
    signed=True,
)
_metric("rollout_corr/rollout_rs_<opt>_seq_max_deviation", "rs", f"max |v_i| {_RS_ROWS}", unit=DIMENSIONLESS)
_metric("rollout_corr/rollout_rs_<opt>_seq_fraction_high", "rs", f"share with v_i > upper {_RS_ROWS}", unit=SHARE)
_metric(
    "rollout_corr/rollout_rs_<opt>_seq_fraction_low",
    "rs",
    f"share with v_i < lower {_RS_ROWS} (k1 options only)",
    unit=SHARE,
)

# ------------------------------------------------------------------------------------------ §5 debug metrics
_metric(
    "training/rollout_probs_diff_max",
    "debug",
    "max |exp(a) − exp(r)| over masked tokens",
    "at least one token has very different probabilities (1 = certain vs impossible)",
    unit=PROBABILITY,
    short="probs_diff_max",
)
PROBS_DIFF_MEAN = _metric(
    "training/rollout_probs_diff_mean",
    "debug",
    "mean |exp(a) − exp(r)| over masked tokens",
    "probabilities differ on typical tokens, not only in the tail",
    unit=PROBABILITY,
    short="probs_diff_mean",
    title="probs diff mean",
    verdict=Thresholds(1e-2, 5e-2, "mean |p_train − p_rollout| per token"),
    row_meaning="token-mean |p_train − p_rollout| (§5)",
    roles={Role.BOOTSTRAPPED: 7, Role.JUDGED: 5, Role.TRENDED: 6},
    row=RowFormula("token", "prob_diff", eps=0.0),
)
_metric(
    "training/rollout_probs_diff_std",
    "debug",
    "unbiased std of |exp(a) − exp(r)|",
    "the probability gap is uneven",
    unit=PROBABILITY,
    short="probs_diff_std",
)
PEARSON_CORR = _metric(
    "training/rollout_actor_probs_pearson_corr",
    "debug",
    "Pearson correlation of exp(a) and exp(r)",
    "high is good: near 1 the two stacks agree; lower values mean the probabilities disagree",
    unit=CORRELATION,
    direction=DOWN,
    short="actor_probs_pearson_corr",
    signed=True,
)
_metric(
    "training/rollout_probs_diff_valid",
    "debug",
    "1 when the step has a masked token, else 0",
    "1 is normal; 0 means the step had no model token",
    unit=FLAG,
    direction=NONE,
    short="probs_diff_valid",
)

# ------------------------------------------------------------------------------------------ §6 rollout-KL estimators
_metric(
    "rollout_kl/k1",
    "rollout_kl",
    "mean_i R_i[δ]",
    "signed: the trainer assigns more probability than the rollout",
    unit=NATS,
    direction=AWAY,
    signed=True,
)
ROLLOUT_KL_ABS = _metric(
    "rollout_kl/abs",
    "rollout_kl",
    "mean_i R_i[|δ|]",
    "typical per-token log-ratio size, row-averaged",
    unit=NATS,
    row_meaning="mean over sequences of the row-mean |δ| (§6; slime's train_rollout_logprob_abs_diff)",
    roles={Role.BOOTSTRAPPED: 6},
    row=RowFormula("row", "row_mean:abs_log_ratio"),
)
_metric(
    "rollout_kl/k2", "rollout_kl", "mean_i R_i[½δ²]", "squared log ratio: dominated by large per-token gaps", unit=NATS
)
ROLLOUT_KL_K3 = _metric(
    "rollout_kl/k3",
    "rollout_kl",
    "mean_i R_i[exp(−δ) − 1 + δ]",
    "KL(trainer‖rollout) estimate as SkyRL's rollout-KL loss aggregates it",
    unit=NATS,
    note="KL(trainer‖rollout) (SkyRL's k3, row mean first): not k3_kl, can be far larger",
)

# ------------------------------------------------------------------------------------------ §7 rounds
LOGPROB_ABS_DIFF = _metric(
    "mismatch/logprob_abs_diff",
    "rounds",
    "T[|δ|]",
    "typical per-token log-ratio size over all model tokens",
    unit=NATS,
    title="|δ| mean",
    verdict=Thresholds(5e-2, 2e-1, "mean |log p_train − log p_rollout| per token"),
    row_meaning="token-mean |δ| (§7)",
    roles={Role.BOOTSTRAPPED: 5, Role.JUDGED: 6, Role.TRENDED: 7, Role.RUNS: 2},
    row=RowFormula("token", "abs_log_ratio"),
)
ROUND_ABS_DIFF_MEAN = _metric(
    "per_round/round_<k>/logprob_abs_diff_mean",
    "rounds",
    "mean |δ| over the round-k tokens of all rows",
    "round k (k-th model turn of a trajectory) diverges more than the others",
    unit=NATS,
    title="|δ| mean",
)
ROUND_TOKEN_COUNT = _metric(
    "per_round/round_<k>/token_count",
    "rounds",
    "model tokens in round k",
    "more data behind round k's numbers",
    unit=COUNT,
    direction=NONE,
    title="tokens",
)
ROUND_SEQ_COUNT = _metric(
    "per_round/round_<k>/seq_count",
    "rounds",
    "rows with a round k",
    "how many trajectories reach round k",
    unit=COUNT,
    direction=NONE,
    title="rows",
)
ROUND_K3_KL = _metric(
    "per_round/round_<k>/k3_kl",
    "rounds",
    "T[exp(δ) − δ − 1] over round-k tokens",
    "k3_kl restricted to round k",
    unit=NATS,
)
ROUND_KL = _metric(
    "per_round/round_<k>/kl",
    "rounds",
    "T[r − a] over round-k tokens",
    "kl restricted to round k",
    unit=NATS,
    direction=AWAY,
    signed=True,
)
ROUND_CHI2_TOKEN = _metric(
    "per_round/round_<k>/chi2_token",
    "rounds",
    "T[exp(2·clamp20(δ))] − 1 over round-k tokens",
    "token IS weights vary a lot in round k",
    unit=DIMENSIONLESS,
)
ROUND_MAX_ABS_DIFF = _metric(
    "per_round/round_<k>/max_abs_diff",
    "rounds",
    "max |δ| over round-k tokens",
    "one token of round k is far off",
    unit=NATS,
    title="max |δ|",
)
ROUND_EXTREME_FRACS = tuple(
    _metric(
        f"per_round/round_<k>/extreme_frac_{name}",
        "rounds",
        f"share of round-k tokens with |δ| > {name.replace('ln', 'ln ')}",
        f"round k has more tokens whose probability ratio exceeds {name[2:]} either way",
        unit=SHARE,
        title=f"|δ| > {name.replace('ln', 'ln ')} share",
    )
    for name in ("ln2", "ln5")
)
ROUND_BAND_SHARES = tuple(
    _metric(
        f"per_round/round_<k>/band_{kind}_share@{band}",
        "rounds",
        f"share of round-k {what} with |δ| ≤ {band}"
        if kind == "token"
        else f"share of the rows reaching round k whose every round-k token has |δ| ≤ {band}",
        f"higher is better: round k's {what} within the ±{band} nats band",
        unit=SHARE,
        direction=DOWN,
        title=f"{what} within {band}",
    )
    for kind, what in (("token", "tokens"), ("seq", "rows"))
    for band in ("1e-3", "1e-2", "1e-1")
)
_metric(
    "per_round/num_rounds_max",
    "rounds",
    "the most rounds any row of the step has",
    "long multi-turn trajectories",
    unit=COUNT,
    direction=NONE,
)
MOST_DIVERGENT_ROUND = _metric(
    "per_round/most_divergent_round",
    "rounds",
    "argmax_k of round_<k>/logprob_abs_diff_mean over rounds with support: ≥ 200 model tokens from ≥ 3 rows "
    "(in a smaller step, a tenth of the most tokens and rows any round has); absent when no round has it",
    "a late round diverges most: mismatch accumulates over the turns",
    unit=INDEX,
    direction=NONE,
)

# The support rule of MOST_DIVERGENT_ROUND (metrics/rounds.py names the round; decisions/analysis.py marks the rounds
# below it, which the report draws grey): this many model tokens from this many rows …
ROUND_SUPPORT_TOKENS = 200
ROUND_SUPPORT_ROWS = 3
# … or, in a step too small for that, this share of the largest round's tokens and rows
ROUND_SUPPORT_SHARE = 0.1


RoundRow = TypeVar("RoundRow", bound=Mapping[str, float])  # a rounds table's row: round, token_count, seq_count, …


def supported_rounds(rounds: Sequence[RoundRow]) -> list[RoundRow]:
    """The rounds with enough support to be named: ≥ min(ROUND_SUPPORT_TOKENS, ROUND_SUPPORT_SHARE × the most tokens
    any round has) model tokens from ≥ min(ROUND_SUPPORT_ROWS, ⌈ROUND_SUPPORT_SHARE × the most rows any round has⌉)
    rows."""
    if not rounds:
        return []
    min_tokens = min(ROUND_SUPPORT_TOKENS, ROUND_SUPPORT_SHARE * max(r["token_count"] for r in rounds))
    min_rows = min(ROUND_SUPPORT_ROWS, math.ceil(ROUND_SUPPORT_SHARE * max(r["seq_count"] for r in rounds)))
    return [r for r in rounds if r["token_count"] >= min_tokens and r["seq_count"] >= min_rows]


# ------------------------------------------------------------------------------------------ localisation
CATASTROPHIC_TOKENS = _metric(
    "diag/catastrophic_tokens",
    "localisation",
    "count of model tokens with |δ| > threshold (default 1)",
    "tokens whose ratio ρ lies outside [1/e, e]: one such token can dominate a sequence's IS weight",
    unit=COUNT,
)
CATASTROPHIC_TOKEN_SHARE = _metric(
    "diag/catastrophic_token_share",
    "localisation",
    "T[|δ| > threshold]",
    "catastrophic tokens are not rare",
    unit=SHARE,
    title="catastrophic token share",
    roles={Role.TRENDED: 8, Role.RUNS: 3},
    row=RowFormula("token", "catastrophic", eps=0.0),  # S_i[|δ| > threshold]: runs' row statistics count it
    row_meaning="share of model tokens with |δ| above the catastrophic threshold",
)
K3_KL_WITHOUT_CATASTROPHIC = _metric(
    "diag/k3_kl_without_catastrophic",
    "localisation",
    "k3_kl over the model tokens with |δ| ≤ the catastrophic threshold",
    "the mismatch is broad, not a few outlier tokens (compare with k3_kl)",
    unit=NATS,
    short="k3_kl_without_catastrophic",
)
CHI2_TOKEN_WITHOUT_CATASTROPHIC = _metric(
    "diag/chi2_token_without_catastrophic",
    "localisation",
    "chi2_token over the model tokens with |δ| ≤ the catastrophic threshold",
    "token IS weights vary a lot even without the outlier tokens (compare with chi2_token)",
    unit=DIMENSIONLESS,
    short="chi2_token_without_catastrophic",
)

# ------------------------------------------------------------------------------------------ counts by |δ|
# Exact counts of model tokens by |δ|, from the fused pass (engine/quantities.py COUNTS): is a zero real (bits), how
# many tokens are extreme, how many lie within a tolerance band.
MISMATCHED_TOKENS = _metric(
    "diag/mismatched_tokens",
    "counts",
    "count of model tokens whose two logprobs differ in any bit (compared as float32 when either column is float32)",
    "some tokens differ at all: 0 means δ ≡ 0 (deterministic, batch-invariant inference, or a trainer column copied "
    "from the rollout's as in verl's bypass mode)",
    unit=COUNT,
)
MISMATCHED_TOKEN_SHARE = _metric(
    "diag/mismatched_token_share",
    "counts",
    "mismatched_tokens / N",
    "the share of model tokens whose logprobs are not bitwise equal (one ulp counts)",
    unit=SHARE,
    title="bitwise-differing token share",
)
MAX_ABS_DELTA = _metric(
    "diag/max_abs_delta",
    "counts",
    "max over model tokens of |δ| (exact; 0 only when every token is equal)",
    "one token is far off (read with mismatched_tokens: a few ulp or a real gap)",
    unit=NATS,
    title="max |δ|",
)
EXTREME_FRAC_LN2 = _metric(
    "mismatch/extreme_frac_ln2",
    "counts",
    "T[|δ| > ln 2] (ρ outside [1/2, 2]; AReaL's |δ| > ln 2 share, no 1e-8)",
    "more tokens whose probability ratio exceeds 2 either way (AReaL #1496: 9.08e-3 without R3, 6.8e-5 with)",
    unit=SHARE,
    title="|δ| > ln 2 share",
)
EXTREME_FRAC_LN5 = _metric(
    "mismatch/extreme_frac_ln5",
    "counts",
    "T[|δ| > ln 5] (ρ outside [1/5, 5]; no 1e-8)",
    "more tokens whose probability ratio exceeds 5 either way (AReaL #1496: 1.33e-3 without R3, 4.0e-6 with)",
    unit=SHARE,
    title="|δ| > ln 5 share",
)
BAND_TOKEN_SHARES = tuple(
    _metric(
        f"mismatch/band_token_share@{band}",
        "counts",
        f"T[|δ| ≤ {band}] (no 1e-8)",
        f"higher is better: the share of model tokens within the ±{band} nats tolerance band (MLPerf-style "
        "parity checks, maxtext #5231)",
        unit=SHARE,
        direction=DOWN,
        title=f"tokens within {band}",
    )
    for band in ("1e-3", "1e-2", "1e-1")
)
BAND_SEQ_SHARES = tuple(
    _metric(
        f"mismatch/band_seq_share@{band}",
        "counts",
        f"share of valid rows (n_i > 0) whose every model token has |δ| ≤ {band}",
        f"higher is better: the share of sequences entirely within the ±{band} nats band",
        unit=SHARE,
        direction=DOWN,
        title=f"rows within {band}",
    )
    for band in ("1e-3", "1e-2", "1e-1")
)

# ------------------------------------------------------------------------------------------ §8 legacy family
_metric(
    "mismatch/rollout_is_veto_fraction",
    "legacy",
    "mean_i [row i has a masked token with ρ outside the veto bounds]",
    "the per-token veto throws away this share of whole rows",
    unit=SHARE,
)
_metric(
    "mismatch/rollout_is_catastrophic_token_fraction",
    "legacy",
    "T[ρ outside the veto bounds]",
    "tokens the legacy helper calls catastrophic are not rare",
    unit=SHARE,
)
_metric(
    "mismatch/rollout_is_eff_sample_size",
    "legacy",
    "1 / T[(w / T[w])²] on the legacy weights",
    "high is good: near 1 the legacy weights are nearly uniform",
    unit=SHARE,
    direction=DOWN,
)
_LEGACY_W = "the raw legacy weight w = exp(clamp20(ℓ)), ℓ = δ, S_i[δ] or R_i[δ] by level"
_metric("mismatch/rollout_is_mean", "legacy", f"T[w], {_LEGACY_W}", unit=RATIO, direction=AWAY)
_metric(
    "mismatch/rollout_is_max",
    "legacy",
    f"max of {_LEGACY_W} (sequence / geometric: exp(min(max_i ℓ_i, 20)))",
    unit=RATIO,
)
_metric(
    "mismatch/rollout_is_min",
    "legacy",
    f"min of {_LEGACY_W} (sequence / geometric: exp(min_i ℓ_i))",
    unit=RATIO,
    direction=DOWN,
)
_metric(
    "mismatch/rollout_is_std", "legacy", "sqrt(T[c²] − T[c]²), c = clamp(w, L, U) on the legacy weights", unit=RATIO
)
_metric(
    "mismatch/rollout_is_ratio_fraction_high",
    "legacy",
    "share of legacy weights above U (token level: T[w > U]; sequence: over rows; geometric: token-weighted)",
    unit=SHARE,
)
_metric(
    "mismatch/rollout_is_ratio_fraction_low",
    "legacy",
    "share of legacy weights below L (token level: T[w < L]; sequence: over rows; geometric: token-weighted)",
    unit=SHARE,
)
_metric("mismatch/rollout_is_seq_mean", "legacy", "mean_i q_i, q_i = R_i[w] of the legacy weights", unit=RATIO)
_metric(
    "mismatch/rollout_is_seq_std", "legacy", "unbiased std over all rows of q_i = R_i[w] (legacy weights)", unit=RATIO
)
_metric("mismatch/rollout_is_seq_max", "legacy", "max_i q_i, q_i = R_i[w] of the legacy weights", unit=RATIO)
_metric(
    "mismatch/rollout_is_seq_min",
    "legacy",
    "min_i q_i, q_i = R_i[w] of the legacy weights",
    unit=RATIO,
    direction=DOWN,
)
_metric("mismatch/rollout_is_seq_max_deviation", "legacy", "max_i |q_i − 1| of the legacy weights", unit=RATIO)
_metric("mismatch/rollout_is_seq_fraction_high", "legacy", "mean_i [q_i > U] of the legacy weights", unit=SHARE)
_metric("mismatch/rollout_is_seq_fraction_low", "legacy", "mean_i [q_i < L] of the legacy weights", unit=SHARE)
_metric(
    "mismatch/rollout_is_masked_fraction",
    "legacy",
    "T[w outside the mask bounds] (mask modes only)",
    unit=SHARE,
)
_metric(
    "mismatch/rollout_is_seq_masked_fraction",
    "legacy",
    "share of rows with a masked token (sequence / geometric: whose w is outside the mask bounds; mask modes only)",
    unit=SHARE,
)

# ------------------------------------------------------------------------------------------ what a preset drops
REJECTED_TOKEN_FRACTION = _metric(
    "summary/rejected_token_fraction",
    "summary",
    "share of model tokens the preset drops (RS rejection, IcePop zero weight, legacy mask or veto)",
    "that much of the training signal is thrown away; above 10 % the preset is called intrusive",
    unit=SHARE,
)
REJECTED_ROW_FRACTION = _metric(
    "summary/rejected_row_fraction",
    "summary",
    "share of rows with a model token that have at least one dropped (rows without a model token left out, "
    "as in the sweep)",
    "the preset touches many sequences (sequence options drop them whole)",
    unit=SHARE,
)
TOKENS_KEPT = _metric(
    "summary/tokens_kept",
    "summary",
    "model tokens the preset keeps",
    "(count) the data left to train on",
    unit=COUNT,
    direction=DOWN,
)
_metric("summary/tokens_rejected", "summary", "model tokens the preset drops", unit=COUNT)
_metric("summary/rows_rejected", "summary", "rows with a model token that have at least one dropped", unit=COUNT)
# verl's k1 rejection with asymmetric bounds L_U keeps ρ in [1/U, 1/L] (verl #6377): what [L, U] as written would drop
K1_WRITTEN_TOKENS = _metric(
    "summary/k1_as_written_token_fraction",
    "summary",
    "share of model tokens the preset's first asymmetric k1 option would reject with ρ kept in [L, U] as written "
    "(verl keeps [1/U, 1/L]); T[1 − keep]",
    unit=SHARE,
)
K1_WRITTEN_ROWS = _metric(
    "summary/k1_as_written_row_fraction",
    "summary",
    "share of rows with a model token that the same option would touch with ρ kept in [L, U] as written",
    unit=SHARE,
)
# IS weights before truncation (TRL #5243, NeMo-RL #3900): verl's rollout_is_* formulas on w_raw
IS_RAW_MEAN = _metric(
    "summary/is_raw_mean",
    "summary",
    "T[w_raw]: w_raw = exp(clamp20(δ)) per token, exp(clamp20(s_i)) per row at sequence level, before truncation",
    "the policies disagree on average; compare with rollout_is_mean, the weight after truncation",
    unit=RATIO,
    signed=True,
)
IS_RAW_STD = _metric(
    "summary/is_raw_std",
    "summary",
    "population std of w_raw over model tokens (before truncation)",
    "the raw weights spread; truncation hides how far",
    unit=RATIO,
)
IS_RAW_MIN = _metric(
    "summary/is_raw_min", "summary", "min of w_raw over model tokens (before truncation)", unit=RATIO, signed=True
)
IS_RAW_MAX = _metric(
    "summary/is_raw_max",
    "summary",
    "max of w_raw over model tokens (before truncation; exp(20) at most, verl's clamp)",
    "a token or sequence the trainer likes far more than the sampler did",
    unit=RATIO,
)
IS_RAW_ESS = _metric(
    "summary/is_raw_eff_sample_size",
    "summary",
    "1 / T[(w_raw / T[w_raw])²] over model tokens (before truncation)",
    "high is good: how uniform the weights would be without truncation",
    unit=SHARE,
    direction=DOWN,
)
# (label, the raw key, verl's key on the applied weights): the raw/applied IS table of compare-presets and the report
IS_RAW_APPLIED = (
    ("mean", IS_RAW_MEAN.key, IS_MEAN.key),
    ("std", IS_RAW_STD.key, IS_STD.key),
    ("min", IS_RAW_MIN.key, IS_MIN.key),
    ("max", IS_RAW_MAX.key, IS_MAX.key),
    ("ESS", IS_RAW_ESS.key, IS_EFF_SAMPLE_SIZE.key),
)

# ------------------------------------------------------------------------------------------ check / diff only
TOKEN_MULT_PROB_ERROR = _metric(
    "token_mult_prob_error",
    "gates",
    "T[exp(|δ|)], Σ / (N + 1e-8) as NeMo-RL's masked_mean (1 = identical logprobs)",
    unit=RATIO,
    row_meaning="NeMo-RL's token-mean exp(|δ|), Σ/(N + 1e-8) as its masked_mean (1 = identical logprobs)",
    roles={Role.BOOTSTRAPPED: 8},
    row=RowFormula("token", "exp_abs_log_ratio"),
)


CATALOGUE: dict[str, Metric] = {metric.key: metric for metric in _ROWS}

_ROUND = re.compile(r"^per_round/round_(\d+)/(.+)$")
_RS_OPTION = re.compile(rf"^(rollout_corr/rollout_rs_)(?:{'|'.join(RS_OPTIONS)})(_.+)$")
_PRESET_SUFFIX = re.compile(r"^(.+)\[[^\]]+\]$")


def lookup(key: str) -> Metric | None:
    """The row of ``key``: round and option keys map to their ``<k>`` / ``<opt>`` row, ``<preset>/<key>`` and
    ``<key>[<preset>]`` to the row of ``<key>``; None for a key rollout-diag does not report."""
    row = _generic(key)
    if row is None and (suffixed := _PRESET_SUFFIX.match(key)):
        row = _generic(suffixed.group(1))
    if row is None and "/" in key and not key.startswith(PREFIXES):
        row = _generic(key.split("/", 1)[1])
    return row


@functools.lru_cache(maxsize=1 << 16)
def _generic(key: str) -> Metric | None:
    """The row of ``key`` or of its generic form (a round's ``<k>``, an RS option's ``<opt>``). Cached: the catalogue
    never changes, and a run's every step asks for the same few hundred keys (two regex substitutions a key were 0.2 s
    of a 100M-token ``analyze``'s last, single-threaded stage)."""
    if key in CATALOGUE:
        return CATALOGUE[key]
    generic = _ROUND.sub(r"per_round/round_<k>/\2", key)
    generic = _RS_OPTION.sub(r"\1<opt>\2", generic)
    return CATALOGUE.get(generic)


def short_name(key: str) -> str:
    """The terminal's name for ``key`` (``rollout_corr/k3_kl`` → ``k3_kl``); the key's last part when uncatalogued."""
    row = lookup(key)
    return key.rpartition("/")[2] if row is None else row.short


def round_quantity(row: Metric) -> str:
    """The name a per-round row's value has in a result's rounds table (``per_round/round_<k>/kl`` → ``kl``)."""
    return row.key.removeprefix(ROUNDS_PREFIX + "round_<k>/")


@functools.lru_cache(maxsize=1 << 16)
def parse_round_key(key: str) -> tuple[int, Metric] | None:
    """(round, its ``<k>`` row) of a per-round key (``per_round/round_3/k3_kl`` → (3, the round k3_kl row)), else
    None."""
    match = _ROUND.match(key)
    if match is None:
        return None
    row = _generic(key)
    return None if row is None else (int(match.group(1)), row)


def legacy_twin(metric: Metric) -> Metric:
    """The §8 legacy helper's row of the same name as a §2 IS row (``mismatch/rollout_is_mean`` for
    ``rollout_corr/rollout_is_mean``): legacy presets report their weights under it. KeyError when it has none."""
    return CATALOGUE[LEGACY_PREFIX + metric.key.removeprefix(OFFPOLICY_PREFIX)]


# ------------------------------------------------------------------------------- thresholds shared by two layers
# The intrusive rule (decisions/intrusive.py applies it): a preset is "intrusive" (highlighted) when, over the run,
# it would drop more than this share of model tokens (RS rejection, IcePop zero weights, legacy mask/veto) ...
INTRUSIVE_REJECTED_FRACTION = 0.10
# ... or its IS weights leave an effective sample size (rollout_is_eff_sample_size) below this.
INTRUSIVE_MIN_ESS = 0.5
# A logprob at or below this is a fill value, not a logprob (io/reader.py counts them on model tokens, the
# fill_values hint names them): no softmax over real logits gets there (a logit gap of 1 000; float64's smallest
# positive probability is e^−745), while the fills engines and dumps use (−1e4, −65504, −1e9, −1e30, finfo.min of
# float16, bfloat16, float32 or float64) all lie below.
FILL_LOGPROB = -1000.0
# The hints' per-row tests (decisions/hints.py judges with them; metrics/hints.py scores example rows with them).
# off_by_one: shifting the trainer logprobs one position at least halves mean |δ| ...
SHIFT_MAX_RATIO = 0.5
SHIFT_ROW_MIN_PAIRS = 16  # ≥ 16 pairs in the row, and an aligned mean |δ| ≥ 0.05 (a shifted gather gives |δ| ~ 1)
SHIFT_ROW_MIN_ALIGNED = 0.05
# processed_logprobs: a row's δ ≈ c·log p fit
FIT_MIN_TOKENS = 8  # a row's δ ≈ c·log p fit needs this many model tokens
FIT_MIN_SLOPE = 0.05  # |c| ≥ 0.05: a temperature (or scale) at least 5 % away from 1
FIT_MIN_R2 = 0.5  # the line explains at least half of Σδ² in the row
