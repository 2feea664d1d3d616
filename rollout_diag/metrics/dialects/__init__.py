"""Dialects: each trainer's own mismatch metrics under its exact logged names (``--dialect``).

One module per framework, each a mergeable accumulator family with the framework's repo, files and commit in
its docstring. :class:`DialectsAccumulator` runs the chosen ones side by side; ``markdown()`` writes
``docs/dialects.md`` (``python -m rollout_diag.metrics.dialects > docs/dialects.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeGuard

import numpy as np

from rollout_diag.errors import ConfigError, option_name
from rollout_diag.io.chunk import Chunk
from rollout_diag.metrics.base import StepAccumulator, groups_of_dicts
from rollout_diag.metrics.dialects import (
    areal,
    areal_4aef98d,
    nemo_rl,
    openrlhf,
    prime_rl,
    roll,
    skyrl,
    slime,
    trl,
    verl,
    verl_b178a3c,
)
from rollout_diag.metrics.dialects.base import DialectFamily, DialectMetric, Framework
from rollout_diag.results import DialectLayout, KeyColumns, MetricColumns

# Each trainer at its current code (``--dialect all``), then the variants a name reaches: ``NAME:CONFIG`` (another
# configuration of the same code) and ``NAME@COMMIT`` (the trainer's code at an earlier commit).
TRAINERS: tuple[Framework, ...] = tuple(
    module.FRAMEWORK for module in (verl, prime_rl, nemo_rl, slime, skyrl, trl, roll, areal, openrlhf)
)
VARIANTS: tuple[Framework, ...] = (
    verl_b178a3c.FRAMEWORK,
    verl_b178a3c.FRAMEWORK_SEQ,
    prime_rl.FRAMEWORK_IPO,
    areal.FRAMEWORK_KPOP,
    areal_4aef98d.FRAMEWORK,
)
FRAMEWORKS: dict[str, Framework] = {framework.name: framework for framework in (*TRAINERS, *VARIANTS)}
DEFAULT = "verl"
ALL = "all"
CHOICES = (*FRAMEWORKS, ALL)

__all__ = [
    "ALL",
    "CHOICES",
    "DEFAULT",
    "FRAMEWORKS",
    "TRAINERS",
    "VARIANTS",
    "DialectMetric",
    "DialectsAccumulator",
    "Framework",
    "dilution_warning",
    "layout",
    "resolve",
]


def resolve(dialect: str | Sequence[str]) -> tuple[str, ...]:
    """Framework names from ``--dialect`` (one name, ``all`` = every trainer at its current code, or a
    comma-separated list); raises ConfigError."""
    parts = [dialect] if isinstance(dialect, str) else list(dialect)
    names: list[str] = []
    for part in (p.strip().lower() for text in parts for p in text.split(",")):
        chosen = tuple(framework.name for framework in TRAINERS) if part == ALL else (part,)
        for name in chosen:
            if name not in FRAMEWORKS:
                raise ConfigError(f"{option_name('dialect')}={part}: not a dialect (choose from {', '.join(CHOICES)}).")
            if name not in names:
                names.append(name)
    if not names:
        raise ConfigError(f"{option_name('dialect')}: give a dialect ({', '.join(CHOICES)}).")
    return tuple(names)


class DialectsAccumulator:
    """The chosen frameworks' accumulators, updated and merged together."""

    def __init__(self, names: Sequence[str] = (DEFAULT,)) -> None:
        self.names = resolve(names)
        self.families: dict[str, DialectFamily] = {name: FRAMEWORKS[name].accumulator() for name in self.names}

    def update(self, chunk: Chunk) -> None:
        for family in self.families.values():
            family.update(chunk)

    def merge(self, other: DialectsAccumulator) -> None:
        for name, family in self.families.items():
            family.merge(other.families[name])

    def step_accumulators(self) -> list[StepAccumulator]:
        """Every framework's per-step accumulators, in framework order."""
        return [accumulator for family in self.families.values() for accumulator in family.step_accumulators()]

    def finalize_steps(self) -> dict[int, dict[str, dict[str, float]]]:
        """step -> framework -> metric name as logged -> value (a framework without values at a step is left out)."""
        out: dict[int, dict[str, dict[str, float]]] = {}
        for name, family in self.families.items():
            for step, values in family.finalize_steps().items():
                if values:
                    out.setdefault(step, {})[name] = _ordered(name, values)
        return out

    def finalize_columns(self, steps: np.ndarray) -> dict[str, MetricColumns]:
        """``finalize_steps`` as columns over ``steps``: framework -> its values per step, in its declared order (a
        step a framework has no value at does not report it); no dict per step where the family gives columns."""
        out: dict[str, MetricColumns] = {}
        for name, family in self.families.items():
            groups: Sequence[KeyColumns]
            if _gives_columns(family):
                groups = family.finalize_columns(steps).groups
            else:
                per_step = family.finalize_steps()
                groups = groups_of_dicts([per_step.get(step, {}) for step in steps.tolist()])
            rank: dict[str, int] = {}
            for index, metric in enumerate(FRAMEWORKS[name].metrics):
                rank.setdefault(metric.name, index)
            out[name] = MetricColumns(groups, steps.shape[0], order=rank)
        return out

    def finalize_run(self) -> dict[str, dict[str, float]]:
        run = {name: family.finalize_run() for name, family in self.families.items()}
        return {name: _ordered(name, values) for name, values in run.items() if values}


class _Columnar(DialectFamily, Protocol):
    """A family whose ``finalize_columns`` gives its ``finalize_steps`` as columns."""

    def finalize_columns(self, steps: np.ndarray) -> MetricColumns: ...


def _gives_columns(family: DialectFamily) -> TypeGuard[_Columnar]:
    """Whether ``family.finalize_columns`` gives what its ``finalize_steps`` does (not where a family writes its own
    ``finalize_steps``)."""
    if isinstance(family, verl.VerlAccumulator):
        return True
    return isinstance(family, StepAccumulator) and type(family).finalize_steps is StepAccumulator.finalize_steps


def _ordered(framework: str, values: dict[str, float]) -> dict[str, float]:
    """In the order the framework declares its metrics (docs, JSON and tables read alike); names a declared
    template stands for (prime-rl's ``mismatch_kl/<env>/mean``) follow in the order the family gave them."""
    ordered = {m.name: values[m.name] for m in FRAMEWORKS[framework].metrics if m.name in values}
    return {**ordered, **{name: value for name, value in values.items() if name not in ordered}}


DILUTION_NOTED = 0.01  # a relative move of verl's row means below 1 % is not worth a sentence (it printed "-0.0%")


def dilution_warning(empty_rows: int, run: dict[str, dict[str, float]]) -> str | None:
    """A sentence to add to the empty-row warning: how far verl's empty-row dilution moved its headline row mean,
    log_ppl_abs_diff, and which row metric it moved most. None without empty rows, without the verl dialect, or
    when no row mean moved by DILUTION_NOTED (1 %) or more of its value over the rows with model tokens."""
    values = run.get("verl", {})
    headline = "rollout_corr/log_ppl_abs_diff"
    if empty_rows == 0 or headline not in values or (most := verl.dilution(values)) is None:
        return None
    name, most_diluted, most_valid = most
    if abs(most_diluted - most_valid) < DILUTION_NOTED * abs(most_valid):
        return None
    diluted, valid = values[headline], values[headline + verl.VALID]
    change = f" ({(diluted - valid) / abs(valid):+.1%})" if valid != 0 else ""
    text = (
        f"In the verl dialect they move {headline} to {diluted:.6g} from {valid:.6g} over the rows that have model "
        f"tokens{change}"
    )
    if name != headline:
        text += f", and {name} most: {most_diluted:.6g} vs {most_valid:.6g}"
    return text + f"; the undiluted values are reported as <name>{verl.VALID}."


def concepts() -> list[str]:
    """Every concept (row of the side-by-side table), in the order the frameworks first declare them."""
    seen: dict[str, None] = {}
    for framework in FRAMEWORKS.values():
        for metric in framework.metrics:
            seen.setdefault(metric.concept, None)
    return list(seen)


def layout() -> DialectLayout:
    """The catalog as plain data for ``rollout_diag.render.dialects`` (which must not import torch)."""
    return DialectLayout(
        titles={name: framework.title for name, framework in FRAMEWORKS.items()},
        concepts=concepts(),
        metrics={name: {m.name: m.concept for m in framework.metrics} for name, framework in FRAMEWORKS.items()},
    )


def markdown() -> str:
    """docs/dialects.md: every framework's metrics side by side with their definitions and sources."""
    lines = [
        "# Dialects",
        "",
        "<!-- Generated by `python -m rollout_diag.metrics.dialects > docs/dialects.md`; a test fails when it is "
        "stale. -->",
        "",
        "`rollout-diag analyze --dialect NAME` reports each trainer's own mismatch metrics under the exact names it",
        "logs, computed with its formula and aggregated per step as it aggregates them (and for the run: every row",
        "as one batch). `--dialect all` computes every one; the JSON carries them per step and for the run under",
        "`dialects: {framework: {name: value}}`. Each definition was read in the framework's code at the commit",
        "given below. Notation: a = trainer logprob, r = rollout (inference) logprob, δ = a − r, m the response",
        "(loss) mask, n_i = Σ_t m of row i, N = Σ_i n_i, B the rows of the step; R_i[x] = Σ_t m·x / (n_i + 1e-8),",
        "S_i[x] = Σ_t m·x; clamp20 = clamp to [−20, 20]. A step without model tokens has no dialect values.",
        "",
        "## Where they differ",
        "",
        "- **probability vs log space**: NeMo-RL's `token_mult_prob_error` averages exp|δ| (1 = perfect), ROLL's",
        "  `train_infer_diff_*` and verl's `training/rollout_probs_diff_*` work on probabilities exp(a) − exp(r);",
        "  everything else on logprobs.",
        "- **padding leaking into min/std**: SkyRL's `is_ratio_std/min/max` are taken over the whole padded",
        "  tensor, where padding and environment tokens are zeros: `is_ratio_min` is 0 whenever a row is shorter",
        "  than the longest or has an environment token, and the std counts the zeros.",
        "- **token- vs sequence-normalised**: slime averages per-sequence means (short sequences weigh as much as",
        "  long ones); SkyRL, TRL, prime-rl, NeMo-RL, OpenRLHF and AReaL average over tokens; ROLL and verl's",
        "  row metrics average row means.",
        "- **empty rows counted or not**: verl's row means and slime count rows without model tokens (verl with",
        "  R_i = 0, slime as 0 |δ|), TRL counts them with sequence ratio 1; ROLL and NeMo-RL's per-sequence",
        "  values leave them out. `rollout_corr/<name>@valid_rows` is verl's formula without them.",
        "- **clamped vs raw**: verl's χ² and SkyRL's `is_ratio_*` clamp δ to ±20 before exp; TRL, ROLL,",
        "  prime-rl, NeMo-RL and AReaL exponentiate raw δ (TRL then zeroes sequence ratios above 3, AReaL leaves",
        "  out tokens with ratio above 5).",
        "- **sign**: verl's `kl` and OpenRLHF's `vllm_kl` are E[r − a]; AReaL's `behave_approx_kl` is E[a − r].",
        "",
        *VERSIONS,
    ]
    for framework in FRAMEWORKS.values():
        lines += [
            f"## {framework.title} (`--dialect {framework.name}`)",
            "",
            f"- Source: {framework.source}.",
            f"- Configuration assumed: {framework.config}.",
            f"- Offline equivalent: {framework.offline}",
            "",
            "| metric as logged | per-token / per-row value | aggregation per step |",
            "|---|---|---|",
        ]
        lines += [f"| `{m.name}` | {_cell(m.formula)} | {_cell(m.aggregation)} |" for m in framework.metrics]
        lines.append("")
    return "\n".join(lines)


VERSIONS = [
    "## Versions and variants",
    "",
    "`--dialect all` is every trainer at the commit its section names (its current code when it was last read).",
    "A name with `@COMMIT` is that trainer's code at an earlier commit, for numbers logged before it changed; a",
    "name with `:CONFIG` is another configuration of the same code. Neither is part of `all`: ask for it by name",
    "(`--dialect all,verl@b178a3c`). `benchmarks/dialect_parity.py` runs verl's (b178a3c) and AReaL's (cbff54d) own",
    "functions beside `verl@b178a3c`, `areal` and `areal:kpop` on a random step: verl's values agree to 4e-8 (its",
    "fractions are float32 means), AReaL's gate and every min / max exactly, its averages to float32 summation noise.",
    "",
    "| dialect | code | what changed, and when |",
    "|---|---|---|",
    "| `verl` | verl-project/verl 1dda039b9 (2026-08-22) | `compute_offpolicy_metrics` and `calculate_debug_metrics` "
    "give the same numbers as at b178a3c for a step with a model token (#5860, 2026-04-03, only adds NaN "
    "placeholders for a batch without one). The presets (`compare-presets`) compute `rollout_is_*` as 1dda039b9 "
    "does. |",
    "| `verl@b178a3c`, `verl@b178a3c:seq` | volcengine/verl b178a3c (2026-01-29) | #5722 (IcePop, 2026-03-24) "
    "redefined `rollout_corr/rollout_is_*` without renaming them: token-level `rollout_is_mean/max/min` became "
    "post-truncation (max ≤ U), `rollout_is_std` and `_eff_sample_size` clamp the weights to [0, U] instead of "
    "[1/U, U], and `rollout_is_seq_*` describe the truncated weights; #6806 (2026-06-25) moved "
    "`rollout_is_seq_fraction_high/_low` back to the raw weights (between the two they were computed from the "
    "truncated ones, `_high` always 0). These dialects give every `rollout_is_*` from the weights before "
    "truncation, as b178a3c logged them (token or sequence level, U = 2). |",
    '| `prime-rl`, `prime-rl:ipo` | PrimeIntellect-ai/prime-rl 559b447 (2026-08-21) | `loss.type = "ipo"` (#2798, '
    "2026-06-14) logs `masked_mismatch_kl`, `unmasked_mismatch_kl` and `is_masked` with a symmetric trust region "
    "\\|p_a − p_r\\| > 0.1. Both leave a filtered sample (no trained token) out of the per-sample statistics, as "
    "`compute_loss` does: rollout-diag counted it as 0 before (a step with one such row in 8 read 7/8 of "
    "prime-rl's `masked_mismatch_kl/mean`). |",
    "| `areal`, `areal:kpop` | areal-project/AReaL cbff54d (2026-08-22; the repository moved from inclusionAI) | "
    "since 4aef98d: `logp_diff`, `logp_abs_diff`, `behave_filtered_ratio`, `masked_token_ratio`, "
    "`rs_filtered_fraction` and `compute_logp/kl_div_*` beside `behave_imp_weight` / `behave_approx_kl`, computed "
    "in float32 as AReaL does; the KPop gate (`metric: binary_kl`), which AReaL's own config check rejects at "
    "cbff54d. AReaL's traps are kept and counted in `note: …` keys. |",
    "| `areal@4aef98d` | inclusionAI/AReaL 4aef98d (2026-05-21) | the dialect before AReaL moved: the two "
    "`behave_*` keys in float64 (AReaL's float32 values differ in the 7th digit). |",
    "| `openrlhf` | OpenRLHF/OpenRLHF 3c3be62 (2026-08-13, #1307) | the newest commit the snapshot holds; the "
    "options of #1339 are not in it, and its merged text could not be read, so their metrics are not reproduced. |",
    "",
]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")
