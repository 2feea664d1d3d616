"""``rollout-diag inspect``: one row token by token."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

import typer

from rollout_diag.cli.app import app
from rollout_diag.cli.layout import command
from rollout_diag.cli.options import Inputs, OutputOpt, Reading, RowFormat, RowFormatOpt
from rollout_diag.cli.output import refuse_overwriting_inputs, write_result


@app.command()
@command(
    "inputs sample step row around window whole_row column device format output input_format trust_pickle tokenizer"
)
def inspect(
    inputs: Inputs,
    sample: Annotated[
        str | None,
        typer.Option("--sample", "-s", help="sample_id of the row (default: the worst row by |log-ppl diff|)."),
    ] = None,
    step: Annotated[
        int | None,
        typer.Option(
            "--step", help="Step of the row (a sample id may repeat across steps); alone: the worst row of the step."
        ),
    ] = None,
    row: Annotated[
        str | None,
        typer.Option("--row", help="The row at FILE:ROW, as the worst-rows tables print it.", metavar="FILE:ROW"),
    ] = None,
    around: Annotated[
        int | None, typer.Option("--around", help="Show only the tokens around this position.", metavar="POS")
    ] = None,
    window: Annotated[
        int | None,
        typer.Option(
            "--window", help="How many tokens to show (default 100; alone: around the largest |δ|).", metavar="N"
        ),
    ] = None,
    whole_row: Annotated[
        bool,
        typer.Option(
            "--all",
            help="List every token of the row. Without it a row longer than 1000 tokens shows 100 around its "
            "largest |δ| (in the table and the JSON).",
        ),
    ] = False,
    format: RowFormatOpt = RowFormat.table,
    output: OutputOpt = None,
    *,
    reading: Reading,
) -> None:
    """One row token by token: position, round, token, both logprobs and δ, coloured by |δ|. Reads only the
    row groups that can hold the row.

    \b
    Examples:
      rollout-diag inspect run/ -s s10-013
      rollout-diag inspect run/ --row step=3/rank-0.parquet:12 --window 40
      rollout-diag inspect run/ --step 7 -f json
    """
    refuse_overwriting_inputs({"output": output}, inputs)
    dump = reading.open(inputs)
    from rollout_diag.drivers.inspect import inspect_row
    from rollout_diag.render.export import to_json_text
    from rollout_diag.render.inspect import render_row

    tokens = inspect_row(dump, sample, step=step, row=row, around=around, window=window, whole_row=whole_row)
    write_result(
        format,
        output,
        table=lambda: render_row(tokens),
        json=lambda: (to_json_text({**asdict(tokens), "log_ratio": tokens.log_ratio}),),
    )
