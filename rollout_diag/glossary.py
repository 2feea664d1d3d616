"""What every metric means: its formula and how to read a high value. One source for the HTML report and the docs.

Notation as in ``../shared/METRICS.md``: δ = a − r (trainer minus rollout logprob, = log ρ), m the response
mask, T[x] a token mean over masked tokens, R_i[x] / S_i[x] the mean / sum over row i's masked tokens,
mean_i a mean over the rows of the step, d_i = R_i[r] − R_i[a], clamp20 = clamp to [−20, 20].
Names with ``<k>`` (round index) or ``<opt>`` (rejection option, e.g. ``seq_mean_k3``) stand for a family.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Term:
    """One glossary entry: the metric's key, its METRICS.md section, formula and what a high value means."""

    name: str
    section: str
    formula: str
    high_means: str


SECTIONS = {
    "offpolicy": "Off-policy metrics (METRICS.md §1)",
    "is": "Importance-sampling weights (§2)",
    "rs": "Rejection sampling (§3)",
    "debug": "verl debug metrics on probabilities (§5)",
    "rollout_kl": "Rollout-KL estimators (§6)",
    "rounds": "Multi-turn rounds (§7)",
    "localisation": "Localisation",
    "legacy": "Legacy importance sampling (§8)",
    "summary": "What a preset drops (rollout-diag's own keys)",
}

_TERMS: tuple[tuple[str, str, str, str], ...] = (
    # §1 off-policy
    (
        "rollout_corr/training_ppl",
        "offpolicy",
        "mean_i exp(−R_i[a])",
        "the trainer finds the sampled text surprising (a property of the data, not of the mismatch)",
    ),
    ("rollout_corr/training_log_ppl", "offpolicy", "mean_i (−R_i[a])", "as training_ppl, in log space"),
    (
        "rollout_corr/rollout_ppl",
        "offpolicy",
        "mean_i exp(−R_i[r])",
        "the rollout engine found its own samples surprising (high temperature, long tails)",
    ),
    ("rollout_corr/rollout_log_ppl", "offpolicy", "mean_i (−R_i[r])", "as rollout_ppl, in log space"),
    (
        "rollout_corr/kl",
        "offpolicy",
        "T[r − a]",
        "rollout is more confident than the trainer on the sampled tokens; can be negative, so read k3_kl too",
    ),
    (
        "rollout_corr/k3_kl",
        "offpolicy",
        "T[exp(δ) − δ − 1]",
        "the two policies disagree token by token (k3 estimator of KL, never negative); the headline number",
    ),
    (
        "rollout_corr/log_ppl_diff",
        "offpolicy",
        "mean_i d_i,  d_i = R_i[r] − R_i[a]",
        "a systematic per-sequence bias: rollout logprobs higher than the trainer's",
    ),
    (
        "rollout_corr/log_ppl_abs_diff",
        "offpolicy",
        "mean_i |d_i|",
        "sequences differ in log-perplexity between the stacks, whatever the sign",
    ),
    ("rollout_corr/log_ppl_diff_max", "offpolicy", "max_i d_i", "at least one sequence the rollout liked much more"),
    (
        "rollout_corr/log_ppl_diff_min",
        "offpolicy",
        "min_i d_i",
        "(very negative) at least one sequence the trainer liked much more",
    ),
    ("rollout_corr/ppl_ratio", "offpolicy", "mean_i exp(d_i)", "above 1: trainer perplexity above rollout perplexity"),
    (
        "rollout_corr/chi2_token",
        "offpolicy",
        "T[exp(2·clamp20(δ))] − 1",
        "token importance weights ρ vary a lot: token-level IS corrections get noisy",
    ),
    (
        "rollout_corr/chi2_seq",
        "offpolicy",
        "mean_i exp(2·clamp20(S_i[δ])) − 1",
        "sequence importance weights vary a lot (grows with length): sequence-level IS is unreliable",
    ),
    # §2 importance sampling
    (
        "rollout_corr/rollout_is_mean",
        "is",
        "T[w], w = truncated or IcePop-masked ρ (token or sequence level)",
        "far from 1: the correction reweights the batch strongly",
    ),
    (
        "rollout_corr/rollout_is_max",
        "is",
        "max of w over masked tokens (sequence: exp(min(max_i s_i, 20)))",
        "some token or sequence gets a large weight (capped by the threshold under TIS)",
    ),
    (
        "rollout_corr/rollout_is_min",
        "is",
        "min of w over masked tokens (sequence: exp(min_i s_i))",
        "(low value) some tokens are almost ignored",
    ),
    (
        "rollout_corr/rollout_is_std",
        "is",
        "sqrt(T[c²] − T[c]²), c = clamp(w, 0, U), from centred moments without verl's ε term (constant c gives 0)",
        "weights spread widely",
    ),
    (
        "rollout_corr/rollout_is_eff_sample_size",
        "is",
        "1 / T[(c / T[c])²]",
        "high is good: close to 1 means the weights are nearly uniform; below 0.5 the correction wastes half the batch",
    ),
    (
        "rollout_corr/rollout_is_ratio_fraction_high",
        "is",
        "T[w_raw > U] (sequence: mean_i [s_i > log U])",
        "many ratios exceed the upper threshold and are truncated or masked",
    ),
    (
        "rollout_corr/rollout_is_ratio_fraction_low",
        "is",
        "T[w_raw < L'] (sequence: mean_i [s_i < log L'])",
        "many ratios fall below the lower bound",
    ),
    (
        "rollout_corr/rollout_is_seq_mean",
        "is",
        "mean_i q_i, q_i = R_i[w]",
        "far from 1: sequences reweighted on average",
    ),
    ("rollout_corr/rollout_is_seq_max_deviation", "is", "max_i |q_i − 1|", "at least one sequence is reweighted hard"),
    (
        "rollout_corr/rollout_is_oob_ratio",
        "is",
        "T[w_raw < L or w_raw > U] (IcePop only)",
        "IcePop zeroes this share of tokens",
    ),
    (
        "rollout_corr/rollout_is_batch_norm_factor",
        "is",
        "T[w] (token) or mean over valid rows of q_i (sequence)",
        "far from 1: batch normalisation rescales the weights a lot",
    ),
    # §3 rejection sampling
    (
        "rollout_corr/rollout_rs_masked_fraction",
        "rs",
        "T[1 − final keep mask]",
        "the preset rejects this share of model tokens: that much training signal is dropped",
    ),
    (
        "rollout_corr/rollout_rs_seq_masked_fraction",
        "rs",
        "mean_i [some masked token of row i rejected]",
        "this share of sequences loses at least one token (sequence options: the whole row)",
    ),
    (
        "rollout_corr/rollout_rs_<opt>_mean",
        "rs",
        "T[stat], stat = k1 −clamp20(δ), k2 ½clamp20(δ)², k3 exp(clamp20(δ))−1−clamp20(δ)",
        "the option's statistic is large on average: the data is far off-policy by that measure",
    ),
    (
        "rollout_corr/rollout_rs_<opt>_masked_fraction",
        "rs",
        "T[1 − keep of this option]",
        "this option alone rejects that share of tokens",
    ),
    (
        "rollout_corr/rollout_rs_<opt>_seq_masked_fraction",
        "rs",
        "over valid rows: share with a token this option rejects",
        "this option alone touches that share of sequences",
    ),
    # §5 debug metrics on probabilities
    (
        "training/rollout_probs_diff_max",
        "debug",
        "max |exp(a) − exp(r)| over masked tokens",
        "at least one token has very different probabilities (1 = certain vs impossible)",
    ),
    (
        "training/rollout_probs_diff_mean",
        "debug",
        "mean |exp(a) − exp(r)| over masked tokens",
        "probabilities differ on typical tokens, not only in the tail",
    ),
    ("training/rollout_probs_diff_std", "debug", "unbiased std of |exp(a) − exp(r)|", "the probability gap is uneven"),
    (
        "training/rollout_actor_probs_pearson_corr",
        "debug",
        "Pearson correlation of exp(a) and exp(r)",
        "high is good: near 1 the two stacks agree; lower values mean the probabilities disagree",
    ),
    (
        "training/rollout_probs_diff_valid",
        "debug",
        "1 when the step has a masked token, else 0",
        "1 is normal; 0 means the step had no model token",
    ),
    # §6 rollout-KL estimators
    ("rollout_kl/k1", "rollout_kl", "mean_i R_i[δ]", "signed: the trainer assigns more probability than the rollout"),
    ("rollout_kl/abs", "rollout_kl", "mean_i R_i[|δ|]", "typical per-token log-ratio size, row-averaged"),
    ("rollout_kl/k2", "rollout_kl", "mean_i R_i[½δ²]", "squared log ratio: dominated by large per-token gaps"),
    (
        "rollout_kl/k3",
        "rollout_kl",
        "mean_i R_i[exp(−δ) − 1 + δ]",
        "KL(trainer‖rollout) estimate as SkyRL's rollout-KL loss aggregates it",
    ),
    # §7 rounds
    ("mismatch/logprob_abs_diff", "rounds", "T[|δ|]", "typical per-token log-ratio size over all model tokens"),
    (
        "per_round/round_<k>/logprob_abs_diff_mean",
        "rounds",
        "mean |δ| over the round-k tokens of all rows",
        "round k (k-th model turn of a trajectory) diverges more than the others",
    ),
    ("per_round/round_<k>/token_count", "rounds", "model tokens in round k", "more data behind round k's numbers"),
    ("per_round/round_<k>/seq_count", "rounds", "rows with a round k", "how many trajectories reach round k"),
    ("per_round/round_<k>/k3_kl", "rounds", "T[exp(δ) − δ − 1] over round-k tokens", "k3_kl restricted to round k"),
    ("per_round/round_<k>/kl", "rounds", "T[r − a] over round-k tokens", "kl restricted to round k"),
    (
        "per_round/round_<k>/chi2_token",
        "rounds",
        "T[exp(2·clamp20(δ))] − 1 over round-k tokens",
        "token IS weights vary a lot in round k",
    ),
    ("per_round/round_<k>/max_abs_diff", "rounds", "max |δ| over round-k tokens", "one token of round k is far off"),
    ("per_round/num_rounds_max", "rounds", "the most rounds any row of the step has", "long multi-turn trajectories"),
    (
        "per_round/most_divergent_round",
        "rounds",
        "argmax_k of round_<k>/logprob_abs_diff_mean over rounds with support: ≥ 200 model tokens from ≥ 3 rows "
        "(in a smaller step, a tenth of the most tokens and rows any round has); absent when no round has it",
        "a late round diverges most: mismatch accumulates over the turns",
    ),
    # Localisation
    (
        "diag/catastrophic_tokens",
        "localisation",
        "count of model tokens with |δ| > threshold (default 1)",
        "tokens whose ratio ρ lies outside [1/e, e]: one such token can dominate a sequence's IS weight",
    ),
    ("diag/catastrophic_token_share", "localisation", "T[|δ| > threshold]", "catastrophic tokens are not rare"),
    # §8 legacy family and the presets' drop summary
    (
        "mismatch/rollout_is_veto_fraction",
        "legacy",
        "mean_i [row i has a masked token with ρ outside the veto bounds]",
        "the per-token veto throws away this share of whole rows",
    ),
    (
        "mismatch/rollout_is_catastrophic_token_fraction",
        "legacy",
        "T[ρ outside the veto bounds]",
        "tokens the legacy helper calls catastrophic are not rare",
    ),
    (
        "mismatch/rollout_is_eff_sample_size",
        "legacy",
        "1 / T[(w / T[w])²] on the legacy weights",
        "high is good: near 1 the legacy weights are nearly uniform",
    ),
    (
        "summary/rejected_token_fraction",
        "summary",
        "share of model tokens the preset drops (RS rejection, IcePop zero weight, legacy mask or veto)",
        "that much of the training signal is thrown away; above 10 % the preset is called intrusive",
    ),
    (
        "summary/rejected_row_fraction",
        "summary",
        "share of rows with a model token that have at least one dropped (rows without a model token left out, "
        "as in the sweep)",
        "the preset touches many sequences (sequence options drop them whole)",
    ),
    ("summary/tokens_kept", "summary", "model tokens the preset keeps", "(count) the data left to train on"),
)


GLOSSARY: dict[str, Term] = {name: Term(name, section, formula, high) for name, section, formula, high in _TERMS}

_ROUND = re.compile(r"^(per_round/)round_\d+(/.+)$")
_RS_OPTION = re.compile(r"^(rollout_corr/rollout_rs_)(?:token|seq_sum|seq_mean|seq_max)_k[123](_.+)$")


def lookup(metric: str) -> Term | None:
    """The glossary entry of ``metric``; per-round and per-option names map to their ``<k>`` / ``<opt>`` entry."""
    if metric in GLOSSARY:
        return GLOSSARY[metric]
    generic = _ROUND.sub(r"\1round_<k>\2", metric)
    generic = _RS_OPTION.sub(r"\1<opt>\2", generic)
    return GLOSSARY.get(generic)


def markdown() -> str:
    """docs/metrics.md: every term by section, then the verdict thresholds (``python -m rollout_diag.glossary``)."""
    from rollout_diag.verdicts import RULES

    lines = [
        "# Metrics",
        "",
        "<!-- Generated by `python -m rollout_diag.glossary > docs/metrics.md`; a test fails when it is stale. -->",
        "",
        "Every number rollout-diag prints, with the name verl (or SkyRL) logs it under. Formulas follow the",
        "project's metric contract (verl's `rollout_corr_helper.py` and debug metrics, SkyRL's rollout-KL",
        "estimators), quirks included. Notation: δ = a − r (trainer minus rollout logprob, = log ρ); m the",
        "response mask; T[x] = Σ m·x / (N + 1e-8), a token mean over the step's model tokens; R_i[x] =",
        "Σ_t m·x / (n_i + 1e-8) and S_i[x] = Σ_t m·x, a row's mean and sum (a row with no model token has",
        "R_i = 0 and still counts, as in verl); mean_i over every row of the step; d_i = R_i[r] − R_i[a];",
        "clamp20(x) = clamp(x, −20, 20). A *run* value treats every row of the input as one batch.",
        "",
    ]
    for key, title in SECTIONS.items():
        terms = [term for term in GLOSSARY.values() if term.section == key]
        if not terms:
            continue
        lines += [f"## {title}", "", "| metric | formula | a high value means |", "|---|---|---|"]
        lines += [f"| `{t.name}` | {_cell(t.formula)} | {_cell(t.high_means)} |" for t in terms]
        lines.append("")
    lines += [
        "## Verdicts",
        "",
        "`analyze` and the report judge these run (and step) values: *ok* below *watch*, *watch* below *bad*,",
        "else *bad*. The thresholds are judgement, set from healthy bf16-rollout / fp32-trainer pairs (the",
        "bundled real dump: k3_kl ≈ 4e-4 per step) and from where verl's own rejection defaults start to bite.",
        "",
        "| metric | watch ≥ | bad ≥ | what it measures |",
        "|---|---|---|---|",
    ]
    lines += [f"| `{r.metric}` | {r.watch:g} | {r.bad:g} | {_cell(r.meaning)} |" for r in RULES]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


if __name__ == "__main__":
    print(markdown(), end="")
