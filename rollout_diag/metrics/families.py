"""The analysis families, in the order their keys are reported: the one list the ``--by`` groups build their
accumulators from. A new family is one module in ``metrics/`` and one line here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rollout_diag.metrics.base import StepAccumulator
from rollout_diag.metrics.debug import DebugAccumulator
from rollout_diag.metrics.localize import PositionAccumulator
from rollout_diag.metrics.offpolicy import OffPolicyAccumulator
from rollout_diag.metrics.rollout_kl import RolloutKLAccumulator
from rollout_diag.metrics.rounds import RoundAccumulator


@dataclass(frozen=True)
class Family:
    """One family: its name, how a fresh accumulator is made from the analysis options (max rounds, the catastrophic
    |δ| threshold), and whether it is reported per ``--by`` group too."""

    name: str
    make: Callable[[int, float], StepAccumulator]
    per_group: bool = True
    # also in the pass that reads §1 alone (every preset reports it beside its own metrics): positions for the
    # verdict's catastrophic tokens, as analyze's
    offpolicy_pass: bool = False


FAMILIES = (
    Family("offpolicy", lambda max_rounds, catastrophic: OffPolicyAccumulator(), offpolicy_pass=True),  # §1, §7's |δ|
    Family("debug", lambda max_rounds, catastrophic: DebugAccumulator()),  # §5
    Family("rollout_kl", lambda max_rounds, catastrophic: RolloutKLAccumulator()),  # §6
    Family("rounds", RoundAccumulator),  # §7 per round
    Family(
        "positions",
        lambda max_rounds, catastrophic: PositionAccumulator(catastrophic),
        per_group=False,
        offpolicy_pass=True,
    ),
)
