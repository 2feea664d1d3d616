"""``rollout-diag diff``: run A against run B, with bootstrap intervals and a verdict."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rollout_diag.cli.app import app
from rollout_diag.cli.boundary import fail
from rollout_diag.cli.layout import command
from rollout_diag.cli.options import Reading, ReplicatesOpt, SeedOpt, argument, grouping
from rollout_diag.cli.output import TableOrJson, progress_bar, refuse_overwriting_inputs


@app.command()
@command(
    "inputs steps_a steps_b preset replicates level seed by answer column device strict chunk_tokens "
    "input_format trust_pickle"
)
def diff(
    *,
    inputs: Annotated[
        list[Path],
        argument("Run A's dump, then run B's (or one dump with --steps-a/--steps-b).", "A [B]"),
    ],
    steps_a: Annotated[
        str | None, typer.Option("--steps-a", help="Steps of A, FIRST:LAST inclusive (e.g. 0:99).", metavar="RANGE")
    ] = None,
    steps_b: Annotated[
        str | None, typer.Option("--steps-b", help="Steps of B, FIRST:LAST inclusive (e.g. 100:199).", metavar="RANGE")
    ] = None,
    preset: Annotated[
        list[str] | None,
        typer.Option("--preset", help="Presets whose dropped-token share to compare; default: all.", metavar="NAME"),
    ] = None,
    replicates: ReplicatesOpt = 1000,
    level: Annotated[float, typer.Option("--level", help="Level of the interval of B − A.")] = 0.95,
    seed: SeedOpt = 0,
    by: Annotated[
        list[str] | None,
        grouping(
            "Also compare each group of rows present in A or B (a per-row column such as env_name, or "
            "COLUMN:sign / COLUMN:bins=E1,E2): its key metrics in A and B and the interval of B − A over its rows "
            "alone, the largest change of k3_kl first. Repeatable."
        ),
    ] = None,
    answer: TableOrJson,
    reading: Reading,
) -> None:
    """Did my fix help? Run A against run B: every key metric, B against A ("109× lower"), a bootstrap interval
    of B − A over sequences, a verdict (better / worse / no detectable change), and which presets now drop a
    different share.

    \b
    Examples:
      rollout-diag diff before/ after/
      rollout-diag diff run/ --steps-a 0:99 --steps-b 100:199 -f json
      rollout-diag diff before/ after/ --by env_name
    """
    from rollout_diag.drivers.diff import diff_runs
    from rollout_diag.render.decisions import diff_tables
    from rollout_diag.render.export import to_json_text
    from rollout_diag.selection import parse_step_range

    if len(inputs) > 2:
        fail(f"diff takes one or two dumps (A, B), not {len(inputs)}; quote a glob or use a directory for many files.")
    refuse_overwriting_inputs({"output": answer.output}, inputs)
    runs = [reading.dump([path]) for path in inputs]  # each run a Dump of its own (diff reads each in one process)
    with progress_bar(inputs) as progress:
        result = diff_runs(
            *runs,
            steps_a=parse_step_range(steps_a, "--steps-a"),
            steps_b=parse_step_range(steps_b, "--steps-b"),
            presets=preset or None,
            replicates=replicates,
            level=level,
            seed=seed,
            progress=progress,
            by=by or (),
        )
    answer.write(table=lambda: diff_tables(result), json=lambda: (to_json_text(result.to_json()),))
