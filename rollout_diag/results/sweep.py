"""``sweep``'s result: per option, the thresholds for target shares and the share verl's default rejects."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rollout_diag.results.columns import Converted
from rollout_diag.results.document import result_document
from rollout_diag.results.reprs import repr_inputs, short_repr
from rollout_diag.results.rows import SkippedRow
from rollout_diag.results.shapes import JsonItem, each, json_as, optional


@dataclass(frozen=True)
class SweepTarget:
    """For one target share: the threshold (in verl's units) that rejects at most that share, and the share it does."""

    target: float
    threshold: float
    share: float


@dataclass(frozen=True)
class SweepPoint:
    """One point of an option's share-vs-threshold curve (threshold in verl's units)."""

    threshold: float
    share: float


@dataclass(frozen=True)
class SweepOption(JsonItem):
    """One rejection option (or IS truncation) of the sweep, for the run or one step (rollout_diag.metrics.sweep)."""

    option: str  # seq_mean_k3, token_k1, is_sequence, …
    level: str  # "token" | "sequence"
    # verl's default threshold spec for the option, None where verl has none
    verl_default: str | None = field(metadata=json_as(absent=None))
    count: int  # tokens or valid rows the shares are taken over
    exact: bool  # sequence options: exact; token options: from a histogram (never above the target)
    thresholds: list[SweepTarget] = field(metadata=json_as(read=each(lambda entry: SweepTarget(**entry))))
    default_threshold: float | None = None  # the upper bound of verl_default, where the curve is marked
    default_share: float | None = None  # the share verl's default rejects
    # run level only
    curve: list[SweepPoint] | None = field(
        default=None, metadata=json_as(read=optional(each(lambda point: SweepPoint(**point))))
    )

    def to_json(self) -> dict[str, Any]:
        """The option's JSON (``from_json`` reads it back, as it reads the sweep accumulator's table rows); the
        default's threshold and share only where verl has a default."""
        out: dict[str, Any] = {"option": self.option, "level": self.level, "verl_default": self.verl_default}
        if self.default_threshold is not None:
            out["default_threshold"] = self.default_threshold
        out["count"], out["exact"] = self.count, self.exact
        if self.default_share is not None:
            out["default_share"] = self.default_share
        out["thresholds"] = [asdict(target) for target in self.thresholds]
        if self.curve is not None:
            out["curve"] = [asdict(point) for point in self.curve]
        return out


@dataclass(frozen=True)
class SweepStep:
    """The sweep of one step (its options without curves)."""

    step: int
    options: list[SweepOption]

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "options": [option.to_json() for option in self.options]}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> SweepStep:
        return cls(raw["step"], [SweepOption.from_json(option) for option in raw["options"]])


@dataclass(frozen=True)
class SweepResult:
    """Threshold sweep (``rollout-diag sweep``): per option, thresholds for target shares, verl's default's share."""

    inputs: list[str]
    columns: dict[str, str]
    targets: list[float]
    run: list[SweepOption]  # one entry per option, with the share-vs-threshold curve
    steps: Sequence[SweepStep]  # per step, without curves (built by threshold_sweep: Converted, made when read)
    warnings: list[str] = field(default_factory=list)
    skipped: list[SkippedRow] = field(default_factory=list)
    skipped_rows: int = 0

    def to_json(self) -> dict[str, Any]:
        return result_document(
            self,
            targets=list(self.targets),
            run=[option.to_json() for option in self.run],
            steps=_steps_json(self.steps),
        )

    def json_document(self) -> dict[str, Any]:
        """``to_json`` with ``steps`` as a sequence read step by step (the sweep's own per-step tables where the steps
        come from them): what ``render.export.json_pieces`` writes without holding every step's dict."""
        steps = self.steps
        lazy = steps.items if isinstance(steps, Converted) and steps.convert == SweepStep.from_json else None
        return result_document(
            self,
            targets=list(self.targets),
            run=[option.to_json() for option in self.run],
            steps=lazy if lazy is not None else _steps_json(steps),
        )

    def __repr__(self) -> str:
        return short_repr(
            "SweepResult",
            f"{len(self.run):,} options, targets {', '.join(f'{target:g}' for target in self.targets[:8])}"
            + (", …" if len(self.targets) > 8 else ""),
            f"{len(self.steps):,} steps, {self.skipped_rows:,} rows skipped",
            repr_inputs(self.inputs),
        )


def _steps_json(steps: Sequence[SweepStep]) -> list[dict[str, Any]]:
    """Each step's JSON: the sweep's own per-step tables where the steps are read from them (``to_json`` of the step
    ``SweepStep.from_json`` makes of a table is that table), else ``to_json`` step by step."""
    if isinstance(steps, Converted) and steps.convert == SweepStep.from_json:
        return list(steps.items)
    return [step.to_json() for step in steps]
