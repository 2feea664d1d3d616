"""Rich tables for ``--dialect``: one framework's metrics under its own names, or every framework side by side.

The catalog (framework titles, each metric's concept) comes in as plain data (``DialectLayout``) so that this
module stays free of torch; ``rollout_diag.metrics.dialects.layout()`` builds it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from rollout_diag.render.format import number
from rollout_diag.results import AnalysisResult, StepResult

VALID_ROWS = "@valid_rows"
VALID_COLUMN = "verl" + VALID_ROWS


@dataclass(frozen=True)
class DialectLayout:
    """Plain-data description of the dialects: titles, and per framework its metric names -> concept, in order."""

    titles: Mapping[str, str]
    concepts: Sequence[str]  # rows of the side-by-side table, in order
    metrics: Mapping[str, Mapping[str, str]]  # framework -> metric name -> concept


def render_dialects(result: AnalysisResult, names: Sequence[str], layout: DialectLayout) -> RenderableType:
    """One framework: its metrics for the run, the first and the last step. Several: frameworks as columns."""
    if len(names) == 1:
        return single_table(result, names[0], layout)
    return Group(side_by_side(result.run, names, layout), *(Text(line) for line in differences(result.run)))


def single_table(result: AnalysisResult, name: str, layout: DialectLayout) -> Table:
    steps = [s for s in result.steps if name in s.dialects]
    shown = steps if len(steps) <= 2 else [steps[0], steps[-1]]
    table = Table(title=f"{layout.titles.get(name, name)} metrics, under its own names", title_justify="left")
    table.add_column("metric as logged")
    table.add_column("run", justify="right")
    for step in shown:
        table.add_column(f"step {step.step}", justify="right")
    values = result.run.dialects.get(name, {})
    for metric in layout.metrics.get(name, {}):
        if metric in values or any(metric in s.dialects[name] for s in shown):
            cells = [number(values.get(metric))] + [number(s.dialects[name].get(metric)) for s in shown]
            table.add_row(escape(metric), *cells)
    return table


def side_by_side(run: StepResult, names: Sequence[str], layout: DialectLayout) -> Table:
    """Rows = what is measured, columns = frameworks (plus verl over valid rows), cells = run values."""
    columns = list(names)
    if "verl" in names and any(m.endswith(VALID_ROWS) for m in run.dialects.get("verl", {})):
        columns.insert(columns.index("verl") + 1, VALID_COLUMN)
    cells: dict[str, dict[str, float]] = {}
    for name in names:
        for metric, value in run.dialects.get(name, {}).items():
            concept = layout.metrics.get(name, {}).get(metric)
            if concept is None:
                continue
            column = VALID_COLUMN if name == "verl" and metric.endswith(VALID_ROWS) else name
            cells.setdefault(concept, {})[column] = value
    table = Table(
        title="Every trainer's mismatch metrics on this run (docs/dialects.md names them)", title_justify="left"
    )
    table.add_column("what is measured")
    for column in columns:
        title = "verl, valid rows" if column == VALID_COLUMN else layout.titles.get(column, column)
        table.add_column(title, justify="right")
    for concept in layout.concepts:
        row = cells.get(concept)
        if row:
            table.add_row(escape(concept), *(number(row[c], 4) if c in row else "" for c in columns))
    return table


def differences(run: StepResult) -> list[str]:
    """Where the frameworks' numbers part on this data, one line each (only for the frameworks computed)."""
    d = run.dialects

    def get(framework: str, metric: str) -> float | None:
        value = d.get(framework, {}).get(metric)
        return None if value is None or math.isnan(value) else value

    lines = []
    token_abs = get("skyrl", "policy/rollout_train_logprobs_abs_diff_mean")
    if token_abs is None:
        token_abs = get("trl", "sampling/sampling_logp_difference/mean")
    sequence_abs = get("slime", "train/train_rollout_logprob_abs_diff")
    if token_abs is not None and sequence_abs is not None and token_abs > 0:
        heavier = "short" if sequence_abs > token_abs else "long"
        lines.append(
            f"token- vs sequence-normalised: mean |δ| is {number(token_abs, 4)} over tokens (SkyRL, TRL) but "
            f"{number(sequence_abs, 4)} as slime's mean of per-sequence means ({sequence_abs / token_abs:.3g}×): "
            f"{heavier} sequences diverge more here."
        )
    mult = get("nemo-rl", "train/token_mult_prob_error")
    if mult is not None:
        log_space = f"; in log space the same tokens have mean |δ| {number(token_abs, 4)}" if token_abs else ""
        prob_diff = get("roll", "actor/train_infer_diff_token_mean")
        roll = f"; ROLL's train_infer_diff_* are signed p_a − p_r (token: {number(prob_diff, 4)})" if prob_diff else ""
        lines.append(
            f"probability vs log space: NeMo-RL's token_mult_prob_error {number(mult, 4)} is mean exp|δ| "
            f"(1 = identical, alert above 1.05){log_space}{roll}."
        )
    is_min = get("skyrl", "policy/loss_metrics/is_ratio_min")
    if is_min is not None:
        if is_min == 0.0:
            kept_min = get("areal", "ppo_actor/update/behave_imp_weight/min")
            other = f" (AReaL's, over model tokens: {number(kept_min, 4)})" if kept_min is not None else ""
            lines.append(
                "padding leaking into min/std: SkyRL's is_ratio_min is 0 and its is_ratio_std "
                f"{number(get('skyrl', 'policy/loss_metrics/is_ratio_std'), 4)} counts the zeros of padding and "
                f"environment tokens; the other minima are over model tokens only{other}."
            )
        else:
            lines.append("padding leaking into min/std: every row is full length and fully masked here, so none.")
    if run.empty_rows:
        verl_valid = get("verl", "rollout_corr/log_ppl_abs_diff" + VALID_ROWS)
        verl_value = get("verl", "rollout_corr/log_ppl_abs_diff")
        moved = (
            f" (verl's log_ppl_abs_diff {number(verl_value, 4)} vs {number(verl_valid, 4)} over valid rows)"
            if verl_valid is not None and verl_value is not None
            else ""
        )
        lines.append(
            f"empty rows counted or not: {run.empty_rows} row(s) have no model token; verl's row means{moved} and "
            "slime count them, TRL counts them as ratio 1, ROLL and NeMo-RL's per-sequence values leave them out."
        )
    else:
        lines.append("empty rows counted or not: every row has a model token here, so it changes nothing.")
    max_abs = get("skyrl", "policy/rollout_train_logprobs_abs_diff_max")
    if max_abs is None:
        max_abs = get("trl", "sampling/sampling_logp_difference/max")
    if max_abs is not None:
        if max_abs > 20.0:
            lines.append(
                f"clamped vs raw: a token has |δ| = {number(max_abs, 4)} > 20: verl's χ² and SkyRL's is_ratio clamp "
                "δ at ±20, prime-rl, NeMo-RL, ROLL, TRL and AReaL exponentiate it raw."
            )
        else:
            lines.append(f"clamped vs raw: the largest |δ| is {number(max_abs, 4)} ≤ 20, so clamping changes nothing.")
    reverse = get("openrlhf", "train/vllm_kl")
    if reverse is None:
        reverse = get("verl", "rollout_corr/kl")
    forward = get("areal", "ppo_actor/update/behave_approx_kl/avg")
    if reverse is not None and forward is not None:
        lines.append(
            f"sign: verl's kl and OpenRLHF's vllm_kl are E[r − a] = {number(reverse, 4)}; AReaL's behave_approx_kl is "
            f"E[a − r] over the tokens its rejection keeps = {number(forward, 4)}."
        )
    return lines
