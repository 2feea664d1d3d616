"""``rollout-diag inspect``: one row token by token."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated

import typer

from rollout_diag.cli.app import app
from rollout_diag.cli.layout import command
from rollout_diag.cli.options import Inputs, Reading
from rollout_diag.cli.output import TableOrJson, refuse_overwriting_inputs

if TYPE_CHECKING:
    from rollout_diag.drivers.dump import Dump
    from rollout_diag.results import RowTokens


@dataclasses.dataclass(frozen=True)
class RowChoice:
    """Which row inspect shows (by sample id, step or place), and which of its tokens."""

    sample: Annotated[
        str | None,
        typer.Option("--sample", "-s", help="sample_id of the row (default: the worst row by |log-ppl diff|)."),
    ] = None
    step: Annotated[
        int | None,
        typer.Option(
            "--step", help="Step of the row (a sample id may repeat across steps); alone: the worst row of the step."
        ),
    ] = None
    row: Annotated[
        str | None,
        typer.Option("--row", help="The row at FILE:ROW, as the worst-rows tables print it.", metavar="FILE:ROW"),
    ] = None
    around: Annotated[
        int | None, typer.Option("--around", help="Show only the tokens around this position.", metavar="POS")
    ] = None
    window: Annotated[
        int | None,
        typer.Option(
            "--window", help="How many tokens to show (default 100; alone: around the largest |δ|).", metavar="N"
        ),
    ] = None
    whole_row: Annotated[
        bool,
        typer.Option(
            "--all",
            help="List every token of the row. Without it a row longer than 1000 tokens shows 100 around its "
            "largest |δ| (in the table and the JSON).",
        ),
    ] = False

    def tokens(self, dump: Dump) -> RowTokens:
        """The chosen row's tokens (``drivers.inspect.inspect_row``); raises RolloutDiagError."""
        from rollout_diag.drivers.inspect import inspect_row

        return inspect_row(
            dump,
            self.sample,
            step=self.step,
            row=self.row,
            around=self.around,
            window=self.window,
            whole_row=self.whole_row,
        )


@app.command()
@command("inputs choice column device answer input_format trust_pickle tokenizer")
def inspect(
    *,
    inputs: Inputs,
    choice: RowChoice,
    reading: Reading,
    answer: TableOrJson,
) -> None:
    """One row token by token: position, round, token, both logprobs and δ, coloured by |δ|. Reads only the
    row groups that can hold the row.

    \b
    Examples:
      rollout-diag inspect run/ -s s10-013
      rollout-diag inspect run/ --row step=3/rank-0.parquet:12 --window 40
      rollout-diag inspect run/ --step 7 -f json
    """
    refuse_overwriting_inputs({"output": answer.output}, inputs)
    dump = reading.open(inputs)
    from rollout_diag.render.export import to_json_text
    from rollout_diag.render.inspect import render_row

    tokens = choice.tokens(dump)
    answer.write(
        table=lambda: render_row(tokens),
        json=lambda: (to_json_text({**asdict(tokens), "log_ratio": tokens.log_ratio}),),
    )
