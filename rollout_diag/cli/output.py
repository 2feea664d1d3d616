"""What every command does around its library call: a progress bar while it reads, its outputs checked before
anything is read, and its result written in the chosen --format to --output or the terminal."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterable, Iterator, Sized
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from rollout_diag.cli.options import DataFormat, OutputFormat, OutputOpt, RowFormat, RowFormatOpt

if TYPE_CHECKING:  # rich.console loads where a command renders: --help and an input error do without it (issue 39)
    from rich.console import Console

PROGRESS_MIN_BYTES = 64 << 20  # show a progress bar from this much input on, when stderr is a terminal
PROGRESS_LINE_MIN_BYTES = 16 << 20  # elsewhere, progress lines (every few seconds) from this much input on
FILE_WIDTH = 160  # a table written with -o: as wide as a terminal that would show it without splitting
FORMAT_BY_SUFFIX = {".json": OutputFormat.json, ".csv": OutputFormat.csv}


def console() -> Console:
    """A rich console on stdout that never wraps soft lines (a table keeps its rows whole)."""
    from rich.console import Console

    return Console(file=sys.stdout, soft_wrap=False)


@contextmanager
def progress_bar(inputs: Iterable[Path]) -> Iterator[Callable[[int, int], None] | None]:
    """A rich progress bar on stderr for large inputs when stderr is a terminal; elsewhere (a pipe, a CI log, a
    notebook) a short line on stderr every few seconds, printed only once a run has lasted that long."""
    size = sum(_size(path) for path in inputs)
    if not sys.stderr.isatty() and size >= PROGRESS_LINE_MIN_BYTES:  # a pipe, a CI log, a notebook
        from rollout_diag.progress import LineProgress

        yield LineProgress(sys.stderr)
        return
    if size < PROGRESS_MIN_BYTES:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(
        TextColumn("reading"),
        BarColumn(),
        MofNCompleteColumn(),  # "done/total" that copes with a total not known yet
        TextColumn("rows"),
        TimeRemainingColumn(),
        console=Console(file=sys.stderr),
        transient=True,
    ) as bar:
        task = bar.add_task("read", total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size if path.exists() else 0


def refuse_overwriting_inputs(outputs: dict[str, Path | None], *read: list[Path] | Path | str | None) -> None:
    """Before anything is read or written: an output (library option name -> path) that is one of the files the
    command reads (``read``: dumps, --from-json, --presets-file, --gates…), however spelled, is an error."""
    from rollout_diag.errors import option_name
    from rollout_diag.io.outputs import check_outputs

    paths: list[Path | str] = []
    for group in read:
        if isinstance(group, list):
            paths += group
        elif group is not None:
            paths.append(group)
    check_outputs({option_name(name): path for name, path in outputs.items()}, paths)


def wrote(path: Path | str) -> None:
    """The line on stderr that says a file was written."""
    typer.echo(f"wrote {path}", err=True)


def emit(pieces: Iterable[str], output: Path | None) -> None:
    """Write a json/csv document, piece by piece (never held as one string), to ``output`` (atomically: a temporary
    file renamed over it) or stdout."""
    if output is None:
        for piece in pieces:
            sys.stdout.write(piece)
        return
    from rollout_diag.io.outputs import atomic_path

    with atomic_path(output) as temporary, temporary.open("w", encoding="utf-8") as handle:
        for piece in pieces:
            handle.write(piece)
    wrote(output)


def show(renderable: Any, output: Path | None) -> None:
    """Print rich tables to the terminal, or write them as plain text (no colour) to ``output`` (atomically)."""
    if output is None:
        console().print(renderable)
        return
    from rich.console import Console

    from rollout_diag.io.outputs import atomic_path

    with atomic_path(output) as temporary, temporary.open("w", encoding="utf-8") as handle:
        Console(file=handle, width=FILE_WIDTH, color_system=None, soft_wrap=False).print(renderable)
    wrote(output)


def output_format(format: OutputFormat | None, output: Path | None) -> OutputFormat:
    """--format when given; else what the --output extension says (.json, .csv; any other: a table)."""
    if format is not None:
        return format
    return FORMAT_BY_SUFFIX.get(output.suffix.lower(), OutputFormat.table) if output is not None else OutputFormat.table


def data_format(format: DataFormat | None, output: Path | None) -> DataFormat:
    """As ``output_format``, with parquet (by --format or a .parquet --output); raises ConfigError for parquet
    without --output (a binary table has no place on a terminal)."""
    if format is None and output is not None and output.suffix.lower() == ".parquet":
        format = DataFormat.parquet
    if format is DataFormat.parquet:
        if output is None:
            from rollout_diag.errors import ConfigError

            raise ConfigError("--format parquet writes a file: give --output FILE.parquet.")
        return format
    return DataFormat(output_format(None if format is None else OutputFormat(format.value), output).value)


def data_outputs(chosen: DataFormat, output: Path | None, by: list[str] | None) -> dict[str, Path | None]:
    """The files --output makes: with --format parquet and --by, the per-group table beside it too."""
    if chosen is DataFormat.parquet and by and output is not None:
        from rollout_diag.export.parquet import groups_path

        return {"output": output, "groups_output": groups_path(output)}
    return {"output": output}


def parquet_tables(result: Any) -> Callable[[Path], Iterable[Path]]:
    """--format parquet of analyze and compare-presets: the per-step table to the file, the per-group one beside it
    (``export.parquet.write_parquet``)."""

    def write(path: Path) -> Iterable[Path]:
        from rollout_diag.export.parquet import write_parquet

        return write_parquet(result, path)

    return write


def write_result(
    chosen: Enum,
    output: Path | None,
    *,
    table: Callable[[], Any],
    json: Callable[[], Iterable[str]],
    csv: Callable[[], str] | None = None,
    parquet: Callable[[Path], Iterable[Path]] | None = None,
) -> None:
    """A command's result in the ``chosen`` --format (its value: table, json, csv or parquet; the others' a table),
    each made only when chosen: ``table()`` shown, ``json()``'s pieces or ``csv()`` emitted, ``parquet(output)``'s
    files written (the command's format checks gave parquet an --output)."""
    if chosen.value == "parquet" and parquet is not None:
        assert output is not None, "parquet is refused without --output"
        for path in parquet(output):
            wrote(path)
    elif chosen.value == "json":
        emit(json(), output)
    elif chosen.value == "csv" and csv is not None:
        emit((csv(),), output)
    else:
        show(table(), output)


def write_repro(
    path: Path, listed: Sized | None, export: Callable[[], int], *, missing: str, listed_are: str, none_is: str
) -> None:
    """``--export-repro``: ``export()`` writes the ``listed`` prompts' rows to ``path`` (a second pass) and returns
    how many; then one line on stderr says what (``listed_are``, ``none_is``: what the prompts are). Raises ConfigError
    where ``listed`` is None: the input has no prompt identity (``missing`` says whose)."""
    if listed is None:
        from rollout_diag.errors import ConfigError

        raise ConfigError(
            f"--export-repro: {missing} (no prompt_id column, no prompt tokens under mask 0 with token ids).",
            hint="name the prompt's column with --column prompt_id=NAME.",
        )
    rows = export()
    if listed:
        typer.echo(f"{path}: {rows} rows of {len(listed)} prompts {listed_are}", err=True)
    else:
        typer.echo(f"{path}: no prompt {none_is}; the file holds no rows", err=True)


@dataclasses.dataclass(frozen=True)
class TableOrJson:
    """--format and --output of inspect, check and diff: their one result as a table or a JSON document, on the
    terminal or in a file."""

    format: RowFormatOpt = RowFormat.table
    output: OutputOpt = None

    def write(self, table: Callable[[], Any], json: Callable[[], Iterable[str]]) -> None:
        """The result in the chosen format (:func:`write_result`)."""
        write_result(self.format, self.output, table=table, json=json)
