"""``rollout-diag compare-presets`` and ``sweep``: what each rollout-correction preset, and each threshold, would do
to the data."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from rollout_diag.cli.app import app
from rollout_diag.cli.layout import command
from rollout_diag.cli.options import (
    DEFAULT_TARGETS,
    DataFormatOpt,
    FormatOpt,
    Inputs,
    IntrusiveEssOpt,
    IntrusiveRejectOpt,
    Logging,
    OutputOpt,
    PresetChoice,
    Reading,
    Selection,
    TargetOpt,
    parse_targets,
)
from rollout_diag.cli.output import (
    data_format,
    data_outputs,
    output_format,
    parquet_tables,
    progress_bar,
    refuse_overwriting_inputs,
    write_result,
    wrote,
)
from rollout_diag.drivers.dump import PRESET_CHUNK_TOKENS

if TYPE_CHECKING:
    from rollout_diag.results import ComparisonResult


class PresetOrder(str, Enum):
    given = "given"
    intrusiveness = "intrusiveness"


@app.command()
@command("inputs target column device format output strict chunk_tokens input_format trust_pickle")
def sweep(
    *,
    inputs: Inputs,
    target: TargetOpt = DEFAULT_TARGETS,
    reading: Reading,
    format: FormatOpt = None,
    output: OutputOpt = None,
) -> None:
    """Which threshold of each rejection option / IS truncation rejects a target share of tokens or
    sequences, and what verl's default thresholds reject on this data.

    \b
    Examples:
      rollout-diag sweep run/
      rollout-diag sweep run/ --target 0.001,0.01 -f json -o sweep.json
    """
    refuse_overwriting_inputs({"output": output}, inputs)
    dump = reading.open(inputs, numpy=True)
    from rollout_diag.drivers.sweep import threshold_sweep
    from rollout_diag.render.export import json_pieces, sweep_csv
    from rollout_diag.render.sweep import render_sweep

    with progress_bar(inputs) as progress:
        result = threshold_sweep(dump, targets=parse_targets(target), progress=progress)
    write_result(
        output_format(format, output),
        output,
        table=lambda: render_sweep(result.run, result.targets),
        json=lambda: json_pieces(result.json_document()),  # 200 000 steps: written step by step
        csv=lambda: sweep_csv(result),
    )


@app.command("compare-presets")
@command(
    "inputs choice target export_decisions intrusive_reject intrusive_ess sort workers backend column device format "
    "output strict chunk_tokens input_format trust_pickle selection tensorboard wandb wandb_group wandb_run_id",
    chunk_tokens=PRESET_CHUNK_TOKENS,  # their accumulators' fixed cost per chunk (drivers/dump.py)
)
def compare_presets(
    *,
    inputs: Inputs,
    choice: PresetChoice,
    target: TargetOpt = DEFAULT_TARGETS,
    export_decisions: Annotated[
        Path | None,
        typer.Option(
            "--export-decisions", help="Write each preset's keep/reject decision per row to this Parquet file."
        ),
    ] = None,
    intrusive_reject: IntrusiveRejectOpt = 0.10,
    intrusive_ess: IntrusiveEssOpt = 0.5,
    sort: Annotated[
        PresetOrder,
        typer.Option(
            "--sort", help="Order of the presets: given (as chosen) or intrusiveness (least intrusive first)."
        ),
    ] = PresetOrder.given,
    reading: Reading,
    format: DataFormatOpt = None,
    output: OutputOpt = None,
    selection: Selection,
    logging: Logging,
) -> None:
    """What every rollout-correction preset (verl's 19, the legacy family, your own) would do to this data,
    side by side, plus the threshold sweep. Opens with the data's verdict and the recommended preset, or why none
    is (a pipeline bug; no correction needed; too little data to choose: docs/recommendation.md).

    \b
    Examples:
      rollout-diag compare-presets run/
      rollout-diag compare-presets run/ --preset verl --sort intrusiveness
      rollout-diag compare-presets run/ --export-decisions decisions.parquet
    """
    chosen_format = data_format(format, output)
    outputs = {**data_outputs(chosen_format, output, selection.by), "export_decisions_to": export_decisions}
    refuse_overwriting_inputs(outputs, inputs, choice.presets_file)
    logging.check()
    from rollout_diag.engine.choice import expect_presets

    expect_presets()  # a first run compiles the preset kernels in a helper process from the start
    dump = reading.open(inputs, read_ahead=selection.every_row(), numpy=True)
    from rollout_diag.decisions.recommend import sort_by_intrusiveness
    from rollout_diag.drivers.compare import compare_presets as run_comparison
    from rollout_diag.render.export import comparison_csv, comparison_json_pieces

    chosen = choice.presets()
    with progress_bar(inputs) as progress:
        result = run_comparison(
            dump,
            chosen,
            progress=progress,
            export_decisions_to=export_decisions,
            targets=parse_targets(target),
            intrusive_rejected_fraction=intrusive_reject,
            intrusive_min_ess=intrusive_ess,
            **selection.options(),
        )
    if export_decisions is not None:
        wrote(export_decisions)
    logging.log(result)
    if sort is PresetOrder.intrusiveness:
        result = sort_by_intrusiveness(result)
    write_result(
        chosen_format,
        output,
        table=lambda: comparison_tables(result, parse_targets(target)),
        json=lambda: comparison_json_pieces(result),
        csv=lambda: comparison_csv(result),
        parquet=parquet_tables(result),
    )


def comparison_tables(result: ComparisonResult, targets: list[float]) -> Any:
    """compare-presets' terminal view: the answer, the presets side by side, the sweep, the groups, the warnings and
    the recommendation's reasons."""
    from rich.console import Group

    from rollout_diag.render.decisions import recommendation_lines
    from rollout_diag.render.format import plain
    from rollout_diag.render.presets import answer_block, k1_bounds_lines, presets_table, raw_applied_table
    from rollout_diag.render.sweep import render_sweep

    warnings = [plain(f"warning: {warning}", style="yellow") for warning in result.warnings]
    raw_applied = raw_applied_table(result)
    tables = [
        *answer_block(result),
        presets_table(result),
        *k1_bounds_lines(result),
        *([raw_applied] if raw_applied is not None else []),
        render_sweep(result.sweep, targets),
    ]
    if result.groups or result.selection:
        from rollout_diag.render.groups import groups_tables, selection_line

        if result.selection:
            tables.insert(0, selection_line(result.selection))
        tables.append(groups_tables(result.groups))
    details = [] if result.recommendation is None else [recommendation_lines(result.recommendation, headline=False)]
    return Group(*tables, *warnings, *details)
