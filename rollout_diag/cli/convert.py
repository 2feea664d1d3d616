"""``rollout-diag convert``: any dump rollout-diag reads, written as its canonical Parquet layout."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rollout_diag.cli.app import app
from rollout_diag.cli.layout import command
from rollout_diag.cli.options import Inputs, Reading, RowFormat
from rollout_diag.cli.output import emit


@app.command()
@command("inputs output partition overwrite column strict input_format trust_pickle format")
def convert(
    *,
    inputs: Inputs,
    output: Annotated[
        Path, typer.Option("--output", "-o", help="The Parquet file to write (a directory with --partition).")
    ],
    partition: Annotated[
        str | None,
        typer.Option("--partition", help="Write a hive directory OUT/step=N/part-K.parquet instead of one file."),
    ] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace OUT when it exists.")] = False,
    reading: Reading,
    format: Annotated[RowFormat, typer.Option("--format", "-f", help="table (a summary) or json.")] = RowFormat.table,
) -> None:
    """Write any dump rollout-diag reads (prime-rl, NeMo-RL, slime, SkyRL, verl, Parquet) as its canonical
    Parquet sequence layout: zstd, one row group per step, per-row columns (reward, advantage, policy_version…)
    kept. `analyze` on the result gives the same numbers.

    \b
    Examples:
      rollout-diag convert token_exports/ -o run.parquet
      rollout-diag convert rollouts/ -o run/ --partition step --overwrite
    """
    from rollout_diag.errors import option_name
    from rollout_diag.io.outputs import check_outputs

    check_outputs({option_name("output"): output}, inputs, directories=(option_name("output"),))
    sources = reading.sources(inputs)
    from rollout_diag.io.convert import convert as run_convert

    result = run_convert(
        sources, output, partition=partition, columns=reading.columns(), strict=reading.strict, overwrite=overwrite
    )
    if format is RowFormat.json:
        from rollout_diag.render.export import to_json_text

        emit((to_json_text(result.to_json()),), None)
        return
    typer.echo(
        f"wrote {result.output}: {result.rows} rows, {len(result.steps)} step(s) in {len(result.files)} file(s), "
        f"from {len(result.inputs)} {result.format} file(s)"
    )
    for warning in result.warnings:
        typer.echo(f"warning: {warning}", err=True)
    if result.skipped_rows:
        typer.echo(f"warning: {result.skipped_rows} unreadable row(s) left out:", err=True)
        for skipped in result.skipped[:10]:
            typer.echo(f"  {skipped.describe()}", err=True)
