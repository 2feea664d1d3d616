"""``rollout-diag runs``: many runs at once, and which knob changed the mismatch."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from rollout_diag.cli.app import app
from rollout_diag.cli.boundary import GATE_FAILED, fail
from rollout_diag.cli.layout import command
from rollout_diag.cli.options import Logging, OutputOpt, Reading, ReplicatesOpt, SeedOpt, argument
from rollout_diag.cli.output import refuse_overwriting_inputs, write_repro, write_result, wrote


class RunsFormat(str, Enum):
    table = "table"
    json = "json"
    parquet = "parquet"


@app.command()
@command(
    "inputs knob knobs baseline preset max_ratio state_dir report export_repro replicates level seed format output "
    "column device strict chunk_tokens input_format trust_pickle workers backend wandb wandb_group"
)
def runs(
    *,
    inputs: Annotated[
        list[str],
        argument(
            "Each run as NAME=DUMP (a file, directory or glob); a bare DUMP is named after its last path part.",
            "NAME=DUMP...",
        ),
    ],
    knob: Annotated[
        list[str] | None,
        typer.Option(
            "--knob",
            help="A knob and its value in each run, in the runs' order (tp=8,8,4). Repeatable. Knobs a dump's "
            "DumpWriter(config=...) recorded count too.",
            metavar="NAME=V1,V2,...",
        ),
    ] = None,
    knobs: Annotated[
        Path | None,
        typer.Option("--knobs", help="Knobs from a TOML file: a table per run ([base] tp = 8).", metavar="FILE"),
    ] = None,
    baseline: Annotated[
        str | None,
        typer.Option("--baseline", help="The run the others are compared with (default: the first).", metavar="NAME"),
    ] = None,
    preset: Annotated[
        list[str] | None,
        typer.Option("--preset", help="Also compare this preset's dropped-token share. Repeatable.", metavar="NAME"),
    ] = None,
    max_ratio: Annotated[
        list[str] | None,
        typer.Option(
            "--max-ratio",
            help="Gate: every run's metric over the baseline's must be ≤ VALUE (k3_kl=2); exit 3 when one is not. "
            "Repeatable.",
            metavar="NAME=VALUE",
        ),
    ] = None,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            "--state-dir",
            help="Keep each run's pass here (keyed by its files' paths, sizes and mtimes): a run added later costs "
            "one pass. Pickles: use a directory you own.",
            metavar="DIR",
        ),
    ] = None,
    report: Annotated[
        Path | None, typer.Option("--report", help="Also write the HTML report of the runs.", metavar="FILE")
    ] = None,
    export_repro: Annotated[
        Path | None,
        typer.Option(
            "--export-repro",
            help="Write the rows of the prompts in the worst 1 % in every run they appear in (deterministic "
            "outliers) to FILE as JSON lines (run, prompt, step, token ids, both logprobs, mask) for an engine "
            "developer to replay; needs a prompt identity. Reads those runs a second time.",
            metavar="FILE",
        ),
    ] = None,
    replicates: ReplicatesOpt = 1000,
    level: Annotated[float, typer.Option("--level", help="Level of the intervals.")] = 0.95,
    seed: SeedOpt = 0,
    format: Annotated[
        RunsFormat,
        typer.Option("--format", "-f", help="table (terminal), json, or parquet (one row per run × step; --output)."),
    ] = RunsFormat.table,
    output: OutputOpt = None,
    reading: Reading,
    logging: Logging,
) -> None:
    """Many runs at once: which knob changed the mismatch? Per run its verdict, key metrics with bootstrap
    intervals and the step where it departs from the baseline; per knob its effect on each metric (a ratio with an
    interval, or "no detectable effect"). --workers runs read in parallel (one process a run).

    \b
    Examples:
      rollout-diag runs base=runA/ r3=runB/ fp16=runC/ --knob r3=off,on,off --knob fp16=off,off,on
      rollout-diag runs base=a/ tp4=b/ --knobs runs.toml --report runs.html
      rollout-diag runs base=main/ cand=pr/ --max-ratio k3_kl=2 --state-dir .rd-cache
    """
    from rollout_diag.decisions.check import parse_gate
    from rollout_diag.drivers.runs import RunSpec, compare_dumps, parse_run

    if format is RunsFormat.parquet and output is None:
        fail("--format parquet writes a file: give --output FILE.parquet.")
    named = [parse_run(text) for text in inputs]
    refuse_overwriting_inputs(
        {"output": output, "report": report, "export_repro": export_repro}, [Path(path) for _, path in named]
    )
    logging.check()
    given = _given_knobs(knob or [], knobs, [name for name, _ in named])
    gates = {gate.metric: gate.limit for gate in (parse_gate(text, "max-ratio") for text in max_ratio or [])}
    specs = [RunSpec(name, reading.dump([Path(path)], one_process=True), given[name]) for name, path in named]
    result = compare_dumps(
        specs,
        baseline=baseline,
        presets=preset or (),
        max_ratios=gates,
        replicates=replicates,
        level=level,
        seed=seed,
        workers=int(reading.workers) if str(reading.workers).isdigit() else reading.workers,
        backend=reading.backend,
        state_dir=state_dir,
        progress=lambda line: typer.echo(line, err=True),
    )
    if export_repro is not None:
        from rollout_diag.drivers.repro import export_runs_repro

        write_repro(
            export_repro,
            None if result.prompts is None else result.prompts.listed,
            lambda: export_runs_repro([(spec.name, spec.inputs) for spec in specs], export_repro, result),
            missing="no run has a prompt identity",
            listed_are="in the worst 1 % in every run they appear in",
            none_is="is in the worst 1 % in every run it appears in",
        )
    if report is not None:
        from rollout_diag.report.runs import write_runs_report

        write_runs_report(result, report)
        wrote(report)
    logging.log_runs(result, report)
    from rollout_diag.export.parquet import write_runs_parquet
    from rollout_diag.render.export import to_json_text
    from rollout_diag.render.runs import runs_tables

    write_result(
        format,
        output,
        table=lambda: runs_tables(result),
        json=lambda: (to_json_text(result.to_json()),),
        parquet=lambda path: (write_runs_parquet(result, path),),
    )
    if not result.passed:
        raise typer.Exit(GATE_FAILED)


def _given_knobs(columns: list[str], path: Path | None, names: list[str]) -> dict[str, dict[str, Any]]:
    """Each run's knobs: the --knobs file's, then --knob's over them; raises ConfigError."""
    from rollout_diag.drivers.runs import knob_columns, load_knobs

    given: dict[str, dict[str, Any]] = {name: {} for name in names}
    for found in (load_knobs(path, names) if path is not None else {}, knob_columns(columns, names)):
        for name, values in found.items():
            given[name].update(values)
    return given
