"""``rollout-diag check``: gate a run for CI."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rollout_diag.cli.app import app
from rollout_diag.cli.boundary import GATE_FAILED
from rollout_diag.cli.layout import command
from rollout_diag.cli.options import Gates, Inputs, Reading, grouping
from rollout_diag.cli.output import TableOrJson, progress_bar, refuse_overwriting_inputs, wrote


@app.command()
@command("inputs gating per_step exact answer junit by column device strict chunk_tokens input_format trust_pickle")
def check(
    *,
    inputs: Inputs,
    gating: Gates,
    per_step: Annotated[bool, typer.Option("--per-step", help="Check every step too, not only the whole run.")] = False,
    exact: Annotated[
        bool,
        typer.Option(
            "--exact",
            help="Fail (exit 3) on any model token whose two logprobs differ in any bit (float32 where either column "
            "is), naming the first: file, row, position, both values. For batch-invariant inference.",
        ),
    ] = False,
    answer: TableOrJson,
    junit: Annotated[
        Path | None,
        typer.Option("--junit", help="Also write JUnit XML here (one testcase per gate, step and --by group)."),
    ] = None,
    by: Annotated[
        list[str] | None,
        grouping(
            "Judge every gate on each group of rows too (a per-row column such as env_name, or "
            "COLUMN:sign / COLUMN:bins=E1,E2; with --per-step, each group's steps); a failing group fails the "
            "check. Repeatable. README, 'Which environment diverges?'."
        ),
    ] = None,
    reading: Reading,
) -> None:
    """Gate a run for CI: exit 0 when every gate passes, 3 when one fails, 1 for bad input or an unknown metric.

    \b
    Examples:
      rollout-diag check run/ --gates default
      rollout-diag check run/ --max rollout_corr/k3_kl=1e-3 --junit gates.xml
      rollout-diag check run/ --gates default --by env_name --per-step
      rollout-diag check run/ --exact
      rollout-diag check run/ --max "rejected_token_fraction[decoupled_geo_rs]=0.05"
    """
    refuse_overwriting_inputs({"output": answer.output, "junit": junit}, inputs, gating.file())
    dump = reading.open(inputs, read_ahead=True, numpy=True)
    from rollout_diag.drivers.check import check_run
    from rollout_diag.render.decisions import check_table, junit_xml
    from rollout_diag.render.export import json_pieces

    chosen = gating.chosen()
    with progress_bar(inputs) as progress:
        result = check_run(dump, chosen, per_step=per_step, progress=progress, by=by or (), exact=exact)
    if junit is not None:
        from rollout_diag.io.outputs import write_text

        write_text(junit, junit_xml(result))
        wrote(junit)
    answer.write(
        table=lambda: check_table(result),
        json=lambda: json_pieces(result.json_document()),  # 200 000 steps: written outcome by outcome
    )
    if not result.passed:
        raise typer.Exit(GATE_FAILED)
