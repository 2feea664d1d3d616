"""``rollout-diag analyze``: every mismatch metric per step and for the run, with a verdict and hints."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from rollout_diag.cli.app import app
from rollout_diag.cli.layout import command
from rollout_diag.cli.options import (
    AnalysisKnobs,
    DataFormatOpt,
    DialectOpt,
    Inputs,
    Logging,
    OutputOpt,
    Reading,
    Selection,
)
from rollout_diag.cli.output import (
    data_format,
    data_outputs,
    parquet_tables,
    progress_bar,
    refuse_overwriting_inputs,
    write_repro,
    write_result,
)

if TYPE_CHECKING:
    from rollout_diag.results import AnalysisResult


@app.command()
@command(
    "inputs column device format output all_steps knobs workers backend strict chunk_tokens dialect input_format "
    "trust_pickle tokenizer selection tensorboard export_repro wandb wandb_group wandb_run_id"
)
def analyze(
    *,
    inputs: Inputs,
    reading: Reading,
    format: DataFormatOpt = None,
    output: OutputOpt = None,
    all_steps: Annotated[
        bool, typer.Option("--all-steps", help="Show every step (default: first, last, worst).")
    ] = False,
    knobs: AnalysisKnobs,
    dialect: DialectOpt = None,
    selection: Selection,
    logging: Logging,
    export_repro: Annotated[
        Path | None,
        typer.Option(
            "--export-repro",
            help="Write the rows of the prompts that are extreme every time (every row in the worst 1 %, at least "
            "twice) to FILE as JSON lines (prompt, step, token ids, both logprobs, mask) for an engine developer to "
            "replay; needs a prompt identity (a prompt_id column, or token ids with the prompt under mask 0). "
            "Reads the dump a second time.",
            metavar="FILE",
        ),
    ] = None,
) -> None:
    """Every mismatch metric (verl's names), per step and for the run, with a verdict on what looks unhealthy
    and hints at the likely root cause.

    \b
    Examples:
      rollout-diag analyze run/
      rollout-diag analyze 'run/step=*/*.parquet' -f json -o result.json
      rollout-diag analyze run.parquet -c rollout=vllm_logprobs --all-steps
    """
    chosen = data_format(format, output)  # before any reading: --format parquet without --output fails at once
    refuse_overwriting_inputs({**data_outputs(chosen, output, selection.by), "export_repro": export_repro}, inputs)
    logging.check()
    dump = reading.open(inputs, read_ahead=selection.every_row(), numpy=True)
    from rollout_diag.drivers.engine import analyze as run_analysis
    from rollout_diag.render.export import analysis_csv, analysis_json_pieces

    with progress_bar(inputs) as progress:
        options: dict[str, Any] = {**dataclasses.asdict(knobs), **selection.options()}
        result = run_analysis(dump, progress=progress, dialect=dialect or "verl", **options)
    logging.log(result)
    if export_repro is not None:
        from rollout_diag.drivers.repro import export_repro as export_rows

        prompts = None if result.prompts is None else result.prompts.extreme
        write_repro(
            export_repro,
            prompts,
            lambda: export_rows(dump, export_repro, result),
            missing="the dump has no prompt identity",
            listed_are="that are extreme every time",
            none_is="is extreme every time",
        )
    write_result(
        chosen,
        output,
        table=lambda: analysis_tables(result, all_steps, dialect),
        json=lambda: analysis_json_pieces(result),  # 200 000 steps: written from the step columns
        csv=lambda: analysis_csv(result),
        parquet=parquet_tables(result),
    )


def analysis_tables(result: AnalysisResult, all_steps: bool, dialect: str | None) -> Any:
    """analyze's terminal view: the selection, the steps and the run, the dialect's table, the groups'."""
    from rich.console import Group

    from rollout_diag.render.analysis import render_analysis

    tables = [render_analysis(result, all_steps=all_steps)]
    if result.selection:
        from rollout_diag.render.groups import selection_line

        tables.insert(0, selection_line(result.selection))
    if dialect is not None:  # the default verl dialect repeats the tables above: shown only when asked for
        from rollout_diag.metrics.dialects import layout, resolve
        from rollout_diag.render.dialects import render_dialects

        tables.append(render_dialects(result, resolve(dialect), layout()))
    if result.groups:
        from rollout_diag.render.groups import groups_tables

        tables.append(groups_tables(result.groups))
    return Group(*tables)
