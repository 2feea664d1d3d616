"""``rollout-diag report``: one self-contained HTML file, from dumps or from saved JSON results."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from rollout_diag.cli.app import app
from rollout_diag.cli.boundary import fail
from rollout_diag.cli.layout import command
from rollout_diag.cli.options import (
    DEFAULT_TARGETS,
    AnalysisKnobs,
    DialectOpt,
    IntrusiveEssOpt,
    IntrusiveRejectOpt,
    Logging,
    PresetChoice,
    Reading,
    Selection,
    TargetOpt,
    argument,
    parse_targets,
)
from rollout_diag.cli.output import progress_bar, refuse_overwriting_inputs
from rollout_diag.drivers.dump import PRESET_CHUNK_TOKENS

if TYPE_CHECKING:
    from rollout_diag.decisions.diff import DiffResult
    from rollout_diag.drivers.dump import Dump
    from rollout_diag.results import AnalysisResult, ComparisonResult

# Options that shape a live analysis: given with --from-json they would be silently ignored, so they are an error.
LIVE_ONLY = (
    "by",
    "where",
    "steps",
    "presets_file",
    "rollout_is",
    "rollout_is_threshold",
    "rollout_rs",
    "rollout_rs_threshold",
    "batch_normalize",
    "target",
    "intrusive_reject",
    "intrusive_ess",
    "max_rounds",
    "catastrophic",
    "top_k",
    "drift_windows",
    "workers",
    "backend",
    "column",
    "device",
    "strict",
    "chunk_tokens",
)


@app.command()
@command(
    "inputs output from_json title choice target intrusive_reject intrusive_ess knobs open_browser vs workers backend "
    "column device strict chunk_tokens dialect input_format trust_pickle tokenizer selection wandb wandb_group "
    "wandb_run_id",
    chunk_tokens=PRESET_CHUNK_TOKENS,  # their accumulators' fixed cost per chunk (drivers/dump.py)
)
def report(
    *,
    ctx: typer.Context,
    inputs: Annotated[
        list[Path] | None,
        argument("Dump(s), as for analyze: files, globs or directories.", "FILE"),
    ] = None,
    output: Annotated[Path, typer.Option("--output", "-o", help="The HTML file to write.")] = Path(
        "rollout-diag-report.html"
    ),
    from_json: Annotated[
        list[Path] | None,
        typer.Option(
            "--from-json",
            help="Build the report from saved `analyze` and/or `compare-presets` --format json output "
            "(repeatable: one of each) instead of dumps.",
        ),
    ] = None,
    title: Annotated[str | None, typer.Option("--title", help="Title of the report.")] = None,
    choice: PresetChoice,
    target: TargetOpt = DEFAULT_TARGETS,
    intrusive_reject: IntrusiveRejectOpt = 0.10,
    intrusive_ess: IntrusiveEssOpt = 0.5,
    knobs: AnalysisKnobs,
    open_browser: Annotated[bool, typer.Option("--open", help="Open the report in a browser.")] = False,
    vs: Annotated[
        list[Path] | None,
        typer.Option("--vs", help="A second run's dump(s): add an A/B section (what `diff` prints).", metavar="FILE"),
    ] = None,
    reading: Reading,
    dialect: DialectOpt = None,
    selection: Selection,
    logging: Logging,
) -> None:
    """One self-contained HTML file (no network needed) showing where and why rollout and trainer disagree.

    \b
    Examples:
      rollout-diag report run/ -o report.html --open
      rollout-diag report --from-json result.json -o report.html
      rollout-diag report before/ --vs after/ -o ab.html
    """
    from rollout_diag.errors import ConfigError

    if from_json and inputs:
        raise ConfigError("give dump files or --from-json, not both.")
    refuse_overwriting_inputs({"output": output}, inputs, from_json, vs, choice.presets_file)
    logging.check()
    dump: Dump | None = None
    if inputs:  # opened before the imports below load torch: a bad file fails at once
        from rollout_diag.engine.choice import expect_presets

        expect_presets()  # a first run compiles the preset kernels in a helper process from the start
        dump = reading.open(inputs, read_ahead=selection.every_row(), numpy=True)
    from rollout_diag.report import render_report

    if from_json:
        analysis, comparison = _saved_results(ctx, from_json, reading.tokenizer)
    elif inputs:
        from rollout_diag.drivers.compare import analyze_and_compare

        with progress_bar(inputs) as progress:
            assert dump is not None  # opened above, from the same inputs
            analysis, comparison = analyze_and_compare(
                dump,
                choice.presets(),
                progress=progress,
                targets=parse_targets(target),
                analysis_options=dataclasses.asdict(knobs),
                intrusive_rejected_fraction=intrusive_reject,
                intrusive_min_ess=intrusive_ess,
                dialect=dialect or "verl",
                **selection.options(),
            )
    else:
        fail("give the dump(s) to analyse, or --from-json FILE.")
    comparison_ab = _versus(inputs, vs, reading, choice.preset) if vs else None
    shown = (choice.preset or None) if from_json else None  # a live run already compared only these
    if analysis is None:  # a saved compare-presets result alone: the report derives the rest from it
        assert comparison is not None  # load_results returns one of the two at least
        text = render_report(comparison, title=title, presets=shown)
    else:
        text = render_report(analysis, comparison=comparison, title=title, presets=shown, diff=comparison_ab)
    from rollout_diag.io.outputs import write_text

    write_text(output, text)  # atomic: a failed run leaves an earlier report as it was
    typer.echo(f"wrote {output} ({output.stat().st_size / 1e6:.1f} MB)", err=True)
    logging.log(analysis if analysis is not None else comparison, report=output)
    if open_browser:
        import webbrowser

        webbrowser.open(output.resolve().as_uri())


def _saved_results(
    ctx: typer.Context, from_json: list[Path], tokenizer: str | None
) -> tuple[AnalysisResult | None, ComparisonResult | None]:
    """--from-json's results (a saved result's token ids shown as text with --tokenizer); raises ConfigError where
    an option that shapes a live analysis was given too (it would be silently ignored)."""
    from rollout_diag.errors import ConfigError

    given = [name for name in LIVE_ONLY if _from_command_line(ctx, name)]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise ConfigError(f"{flags}: apply when analysing dumps, not to saved --from-json results.")
    from rollout_diag.results import load_results

    analysis, comparison = load_results(from_json)
    if tokenizer is not None and analysis is not None:
        from rollout_diag.drivers.tokens import with_token_text

        analysis = with_token_text(analysis, tokenizer)
    return analysis, comparison


def _versus(inputs: list[Path] | None, vs: list[Path], reading: Reading, presets: list[str] | None) -> DiffResult:
    """--vs: run A (the inputs) against run B, as ``diff`` compares them (each read in one process)."""
    if not inputs:
        fail("--vs compares two dumps: give run A's dump(s) as FILE, not --from-json.")
    from rollout_diag.drivers.diff import diff_runs

    return diff_runs(
        reading.dump(inputs, one_process=True), reading.dump(vs, one_process=True), presets=presets or None
    )


def _from_command_line(ctx: typer.Context, name: str) -> bool:
    source = ctx.get_parameter_source(name)  # click's ParameterSource (typer may vendor click: compare by name)
    return source is not None and source.name == "COMMANDLINE"
