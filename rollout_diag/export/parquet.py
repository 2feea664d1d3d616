"""``--format parquet --output FILE``: the per-step table in FILE and, with ``--by``, the per-group table beside it
in ``FILE``'s name with ``.groups`` before the suffix (``out.parquet`` → ``out.groups.parquet``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rollout_diag.export.frames import analysis_frames, comparison_frames
from rollout_diag.io.outputs import atomic_path
from rollout_diag.results import ComparisonResult

if TYPE_CHECKING:
    from rollout_diag.results import AnalysisResult, RunsResult


def groups_path(output: Path) -> Path:
    """Where the per-group table goes: ``out.parquet`` → ``out.groups.parquet`` (no suffix: ``out.groups``)."""
    return (
        output.with_name(f"{output.stem}.groups{output.suffix}")
        if output.suffix
        else output.with_name(f"{output.name}.groups")
    )


def write_parquet(result: AnalysisResult | ComparisonResult, output: Path) -> list[Path]:
    """Write the per-step table (analyze: ``to_polars()["steps"]``; compare-presets: ``["preset_steps"]``) and, when
    the result has groups, ``["group_steps"]`` (one row per group and step, and per group a row with a null step:
    its run), each atomically. Returns the paths written."""
    if isinstance(result, ComparisonResult):
        frames = comparison_frames(result)
        tables = [(output, frames["preset_steps"])]
    else:
        frames = analysis_frames(result)
        tables = [(output, frames["steps"])]
    if result.groups:
        tables.append((groups_path(output), frames["group_steps"]))
    for path, frame in tables:  # each written beside its place and renamed: a failed run leaves no half file
        with atomic_path(path) as temporary:
            frame.write_parquet(temporary)
    return [path for path, _ in tables]


def write_runs_parquet(result: RunsResult, output: Path) -> Path:
    """``runs --format parquet``: one row per run × step (``RunsResult.step_records``: run, each knob, step, rows,
    each key metric), written atomically. Returns the path."""
    import polars as pl

    frame = pl.DataFrame(result.step_records(), strict=False)
    with atomic_path(output) as temporary:
        frame.write_parquet(temporary)
    return output
