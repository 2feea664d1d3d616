"""The ``check`` command: every gate on the run (and with ``per_step`` each step, with ``by`` each group)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from rollout_diag.decisions.check import (
    EXACT_GATE,
    FAIL,
    K1_APPLIED,
    K1_AS_WRITTEN,
    CheckResult,
    Gate,
    check,
    gate_presets,
    with_skipped_gate,
)
from rollout_diag.drivers.dump import reads_dump
from rollout_diag.drivers.passes import Inputs, Progress
from rollout_diag.drivers.rowpass import row_pass
from rollout_diag.groups import GroupSpec, group_name
from rollout_diag.io.reader import DEFAULT_CHUNK_TOKENS
from rollout_diag.metrics.correction import k1_as_written
from rollout_diag.metrics.outcome import DropRule
from rollout_diag.presets import Preset

if TYPE_CHECKING:
    import torch  # annotations only: the driver's arithmetic runs in passes and metrics


@reads_dump
def check_run(
    inputs: Inputs,
    gates: Sequence[Gate],
    *,
    per_step: bool = False,
    columns: Mapping[str, str] | None = None,
    device: str | torch.device = "auto",
    strict: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    progress: Progress | None = None,
    by: Sequence[str | GroupSpec] = (),
    exact: bool = False,
) -> CheckResult:
    """Every gate (see :mod:`rollout_diag.decisions.check`) on the run and, with ``per_step``, on every step;
    ``by`` (``env_name``, ``reward:sign``, …): on each group's run metrics (and steps) too, the group named in
    each such outcome. The share of rows skipped as invalid is gated too (``skipped_row_share`` ≤ 1 % unless
    ``gates`` names it). ``exact``: also the gate that no model token's two logprobs differ in any bit
    (``EXACT_GATE``), its failure naming the first differing token (file, row, position, both values). A gate on
    ``rejected_token_fraction[PRESET]`` (a built-in preset) counts that preset's dropped tokens per row in the same
    pass; a preset with an asymmetric k1 rejection also counts its option alone, as verl applies it and as written,
    for the result's ``k1_bounds`` line. Raises RolloutDiagError for bad input, an unknown metric or preset, or no
    gate."""
    gates = [*gates, EXACT_GATE] if exact else list(gates)
    presets = gate_presets(gates)  # raises ConfigError when there is no gate
    done = row_pass(
        inputs,
        presets=presets,
        rules=k1_rules(presets),
        columns=columns,
        device=device,
        strict=strict,
        chunk_tokens=chunk_tokens,
        progress=progress,
        by=by,
        exact=exact,
    )
    result = done.result()
    done.release()  # the gates read the result and the row statistics: the per-step state goes before they run
    groups = [
        (group_name(group.column, group.value), group, done.group_rows(group.column, group.value))
        for group in result.groups
    ]
    checked = check(result, with_skipped_gate(gates), per_step=per_step, rows=done.row_stats(), groups=groups)
    found = None if done.first_difference is None else done.first_difference.found
    if found is None:
        return checked
    # the run's failure names the first differing token
    named = [
        replace(outcome, detail=found.line())
        if outcome.gate.metric == EXACT_GATE.metric
        and outcome.status == FAIL
        and outcome.group is None
        and outcome.step is None
        else outcome
        for outcome in checked.outcomes
    ]
    return replace(checked, outcomes=named)


def k1_rules(presets: Sequence[Preset]) -> dict[str, DropRule]:
    """For each preset with an asymmetric k1 rejection (its first such option): that option alone as verl applies it
    (``NAME|k1 as applied``) and with ρ in [L, U] as written (``NAME|k1 as written``), the rules whose per-row counts
    ``decisions.check.k1_bounds`` reads."""
    rules: dict[str, DropRule] = {}
    for preset in presets:
        option = preset.asymmetric_k1
        if option is not None:
            rules[preset.name + K1_APPLIED] = DropRule(rejection=(option,))
            rules[preset.name + K1_AS_WRITTEN] = DropRule(rejection=(k1_as_written(option),))
    return rules
