"""The ``diff`` command: run A against run B (two dumps, or two step ranges of one), with bootstrap intervals."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from rollout_diag.decisions.diff import (
    DEFAULT_LEVEL,
    DEFAULT_REPLICATES,
    DEFAULT_SEED,
    DiffResult,
    DiffSide,
    GroupDiff,
    GroupSide,
    diff,
    diff_group,
    sort_group_diffs,
)
from rollout_diag.drivers.dump import Dump, call_options
from rollout_diag.drivers.passes import Inputs, Progress
from rollout_diag.drivers.rowpass import READING_OPTIONS, RowPass, range_label, row_pass
from rollout_diag.errors import ConfigError, option_name
from rollout_diag.groups import GroupSpec
from rollout_diag.presets import Preset, resolve_presets
from rollout_diag.selection import StepRange

if TYPE_CHECKING:
    import torch  # annotations only: the driver's arithmetic runs in passes and metrics


class Interval(TypedDict):
    """The bootstrap's settings, the same for the runs and each group."""

    replicates: int
    level: float
    seed: int


def diff_runs(
    inputs_a: Inputs | Dump,
    inputs_b: Inputs | Dump | None = None,
    *,
    steps_a: StepRange | None = None,
    steps_b: StepRange | None = None,
    presets: Sequence[str | Preset] | None = None,
    replicates: int = DEFAULT_REPLICATES,
    level: float = DEFAULT_LEVEL,
    seed: int = DEFAULT_SEED,
    columns: Mapping[str, str] | None = None,
    device: str | torch.device | None = None,
    strict: bool | None = None,
    chunk_tokens: int | None = None,
    progress: Progress | None = None,
    by: Sequence[str | GroupSpec] = (),
) -> DiffResult:
    """Run A against run B (two dumps; or one dump, ``inputs_b`` None, split by ``steps_a`` / ``steps_b``): every
    key metric, its bootstrap interval of B − A over sequences and a verdict; per preset the change in dropped
    tokens. ``by`` (``env_name``, ``reward:sign``, …): also each group of rows present in A or B, its key metrics
    in A and B and the interval of B − A over its rows alone (``DiffResult.groups``, largest change first).
    Each run may be a :class:`Dump` (its own reading options: A's and B's columns may differ); ``columns``,
    ``device``, ``strict``, ``chunk_tokens`` left None: the Dump's, else ``auto``, False and 1 M tokens.
    Raises RolloutDiagError for bad input or options (a Dump's option that a one-process read cannot honour)."""
    given = {"columns": columns, "device": device, "strict": strict, "chunk_tokens": chunk_tokens}
    for side in (inputs_a, inputs_b):  # before anything is read: a Dump's option refused at once
        if isinstance(side, Dump):
            call_options(side, "diff_runs", READING_OPTIONS, given)
    chosen = resolve_presets(presets)
    options: dict[str, Any] = {name: value for name, value in given.items() if value is not None}
    options.update(by=by, findings=False)  # each side is a summary: no hint evidence, worst rows or dialects gathered
    sides: list[DiffSide] = []
    passes: list[tuple[RowPass, StepRange | None]] = []  # each side's pass and its steps
    if inputs_b is None:
        if steps_a is None or steps_b is None:
            raise ConfigError(
                f"one dump: give the two step ranges, {option_name('steps_a')} and "
                f"{option_name('steps_b')} (e.g. 0:99 and 100:199)."
            )
        done = row_pass(inputs_a, presets=chosen, progress=progress, **options)
        sides = [
            DiffSide(f"{_label(done.log.files)} {range_label(r)}", done.summary(r), done.row_stats(r))
            for r in (steps_a, steps_b)
        ]
        done.release()
        passes = [(done, steps_a), (done, steps_b)]
    else:
        for inputs, steps in ((inputs_a, steps_a), (inputs_b, steps_b)):
            done = row_pass(inputs, presets=chosen, progress=progress, **options)
            label = _label(done.log.files) + ("" if steps is None else f" {range_label(steps)}")
            sides.append(DiffSide(label, done.summary(steps), done.row_stats(steps)))
            done.release()  # before the next run's pass: one analysis held at a time
            passes.append((done, steps))
    interval = Interval(replicates=replicates, level=level, seed=seed)
    result = diff(sides[0], sides[1], **interval)
    return replace(result, groups=_group_diffs(sides, passes, interval)) if by else result


def _group_diffs(
    sides: Sequence[DiffSide], passes: Sequence[tuple[RowPass, StepRange | None]], interval: Interval
) -> list[GroupDiff]:
    """Each --by group present in A or B: its key metrics on both sides and the interval of B − A over its rows
    alone, the largest change first."""
    found = [{(g.column, _key(g.value)): g for g in side.result.groups} for side in sides]
    values: dict[tuple[str, Any], Any] = {}
    for present in found:
        for key, group in present.items():
            values.setdefault(key, group.value)
    groups = []
    for (column, key), value in values.items():
        parts = []
        for (done, steps), present in zip(passes, found, strict=True):
            side = present.get((column, key))
            rows = done.group_rows(column, value, steps)
            parts.append(GroupSide({} if side is None else side.metrics, rows, 0 if side is None else side.tokens))
        groups.append(diff_group(column, value, *parts, **interval))
    return sort_group_diffs(groups)


def _key(value: Any) -> tuple[str, Any]:
    """A group value as a dict key that tells 1 from True and "1" (None: the null group)."""
    return (type(value).__name__, value)


def _label(files: Sequence[str]) -> str:
    names = [Path(name).name for name in files]
    return names[0] + (f" and {len(names) - 1} more" if len(names) > 1 else "") if names else "(no file)"
