"""The ``rollout-diag`` command line: thin Typer commands over the library.

Each command parses options, makes one library call and renders. ``RolloutDiagError`` becomes one
``Error:`` line and exit code 1; any other exception too (with a request to report it), unless
``--debug`` asks for the traceback.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import sys
import typing
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from enum import Enum
from inspect import signature as signature_of  # `inspect` is a command's name here
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer
from typer.core import TyperGroup

from rollout_diag.drivers.dump import DEFAULT_CHUNK_TOKENS as CHUNK_TOKENS  # dump.py loads no pyarrow: light --help
from rollout_diag.drivers.dump import PRESET_CHUNK_TOKENS
from rollout_diag.errors import RolloutDiagError
from rollout_diag.process import command_ended, exit_now, one_blas_thread, open_for_reading

one_blas_thread()  # before anything a command imports loads numpy (rollout_diag.process)

if TYPE_CHECKING:  # rich.console loads where a command renders: --help and an input error do without it (issue 39)
    from rich.console import Console

    from rollout_diag.drivers.dump import Dump
    from rollout_diag.presets import Preset

# The README's order:
COMMAND_ORDER = (
    "analyze",
    "compare-presets",
    "sweep",
    "report",
    "inspect",
    "check",
    "diff",
    "runs",
    "watch",
    "convert",
)


class CommandsInReadmeOrder(TyperGroup):
    """``--help`` lists the commands in the README's order, each with its whole first paragraph (never cut "...")."""

    def list_commands(self, ctx: Any) -> list[str]:
        names = super().list_commands(ctx)
        return sorted(names, key=lambda name: COMMAND_ORDER.index(name) if name in COMMAND_ORDER else len(names))

    def get_command(self, ctx: Any, name: str) -> Any:
        command = super().get_command(ctx, name)
        if command is not None and command.short_help is None and command.help:
            command.short_help = " ".join(command.help.strip().split("\n\n")[0].split())
        if command is not None:
            light_coercion(command.get_params(ctx))  # its options and its --help (made and kept by get_params)
        return command

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        light_coercion(self.get_params(ctx))  # the group's own options (--engine, --help)
        return super().parse_args(ctx, args)


# --------------------------------------------------------------------------- option values without pydantic
# Typer (0.29) turns every option's text into its type through a pydantic TypeAdapter: importing pydantic and
# building ~20 adapters took 0.24 s of the 0.46 s a missing-file error took (docs/benchmarks.md, issue 39). The
# options here are str, int, float, Path, an Enum, bool or lists of those: plain text is converted as pydantic
# would; anything else (a bad number, an unknown choice) goes to typer's own adapter, whose message is unchanged.
_PLAIN_INT = re.compile(r"[+-]?\d+")
_PLAIN_FLOAT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_UNCONVERTED = object()


def _light_value(annotation: Any, value: Any) -> Any:
    """``value`` (the option's text, or its default) as ``annotation``, or _UNCONVERTED where typer should decide."""
    if annotation is str or annotation is bool:
        return value if isinstance(value, annotation) else _UNCONVERTED
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        return int(value) if isinstance(value, str) and _PLAIN_INT.fullmatch(value) else _UNCONVERTED
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        return float(value) if isinstance(value, str) and _PLAIN_FLOAT.fullmatch(value) else _UNCONVERTED
    if annotation is Path:
        return value if isinstance(value, Path) else Path(value) if isinstance(value, str) and value else _UNCONVERTED
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        if isinstance(value, annotation):
            return value
        return next((member for member in annotation if member.value == value), _UNCONVERTED)
    return _UNCONVERTED


def light_coercion(params: Iterable[Any]) -> None:
    """Give each of the options ``params`` whose type :func:`_light_value` knows a converter that needs no pydantic;
    typer's own is built only for a value it cannot convert. A typer without these internals keeps its own."""
    try:
        from typer._coercion import RuntimeParam, build_runtime_param
    except ImportError:
        return

    @dataclasses.dataclass(frozen=True)
    class LightParam(RuntimeParam):
        descriptor: Any

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            item_type = self.annotation
            if typing.get_origin(item_type) is list:
                item_type = typing.get_args(item_type)[0]
                items = [_light_value(item_type, item) for item in value] if isinstance(value, (list, tuple)) else None
                if items is not None and _UNCONVERTED not in items:
                    return items
            else:
                converted = _light_value(item_type, value)
                if converted is not _UNCONVERTED:
                    return converted
            # typer's own conversion, for what the light path leaves (typer has no public hook for it)
            return build_runtime_param(self.descriptor)._coerce_value(value, param=param, ctx=ctx)  # noqa: SLF001

    for param in params:
        descriptor = getattr(param, "type_descriptor", None)
        info = getattr(descriptor, "parameter_info", None)
        if (
            getattr(param, "_runtime_param", False) is not None
            or descriptor is None
            or info is None
            or descriptor.file_annotation is not None
            or getattr(info, "parser", None) is not None
            or getattr(info, "click_type", None) is not None
        ):
            continue
        annotation = descriptor.annotation
        item = typing.get_args(annotation)[0] if typing.get_origin(annotation) is list else annotation
        if item in (str, bool, int, float, Path) or (isinstance(item, type) and issubclass(item, Enum)):
            param._runtime_param = LightParam(info, annotation, descriptor)  # noqa: SLF001  (typer's lazy slot)


app = typer.Typer(
    cls=CommandsInReadmeOrder,
    name="rollout-diag",
    help="Diagnose training–inference logprob mismatch in RL for LLMs, offline, from Parquet dumps.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)
F = TypeVar("F", bound=Callable[..., Any])
PROGRESS_MIN_BYTES = 64 << 20  # show a progress bar from this much input on, when stderr is a terminal
PROGRESS_LINE_MIN_BYTES = 16 << 20  # elsewhere, progress lines (every few seconds) from this much input on


class OutputFormat(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"


class DataFormat(str, Enum):
    """analyze and compare-presets: OutputFormat plus parquet."""

    table = "table"
    json = "json"
    csv = "csv"
    parquet = "parquet"


class RowFormat(str, Enum):
    table = "table"
    json = "json"


class PresetOrder(str, Enum):
    given = "given"
    intrusiveness = "intrusiveness"


# Shared option types (one definition, used by every command).
Inputs = Annotated[
    list[Path],
    typer.Argument(
        help="Dump(s): Parquet, or what prime-rl, NeMo-RL, slime, SkyRL or verl wrote (README, 'Where is my "
        "dump?'); files, globs or directories (hive partitions like step=3/ work).",
        show_default=False,
        metavar="FILE",
    ),
]
FormatOpt = Annotated[
    OutputFormat | None,
    typer.Option(
        "--format",
        "-f",
        help="table (terminal), json or csv. Default: from the --output extension (.json, .csv; any other "
        "a table), else table.",
    ),
]
DataFormatOpt = Annotated[
    DataFormat | None,
    typer.Option(
        "--format",
        "-f",
        help="table (terminal), json, csv or parquet (the per-step table to --output FILE; with --by also the "
        "per-group one to FILE.groups.parquet). Default: from the --output extension (.json, .csv, .parquet; any "
        "other a table), else table.",
    ),
]
OutputOpt = Annotated[
    Path | None, typer.Option("--output", "-o", help="Write the output to this file instead of stdout.")
]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show Python tracebacks for errors.")]
TensorboardOpt = Annotated[
    Path | None,
    typer.Option(
        "--tensorboard",
        help="Also write every per-step metric as a TensorBoard scalar under its verl name (global step = the dump's "
        "step) into this log directory, with rollout_diag/alert (0 ok, 1 watch, 2 bad) per step; each --by group "
        "and each preset as a run (a sub-directory), so that they overlay on one chart. Needs "
        "pip install 'rollout-diag[tensorboard]'.",
        metavar="DIR",
    ),
]
TargetOpt = Annotated[
    str, typer.Option("--target", help="Sweep: target rejection shares, comma separated.", metavar="SHARES")
]
IntrusiveRejectOpt = Annotated[
    float, typer.Option("--intrusive-reject", help="Mark presets rejecting more than this share of tokens.")
]
IntrusiveEssOpt = Annotated[
    float, typer.Option("--intrusive-ess", help="Mark presets whose IS effective sample size falls below this.")
]
DEFAULT_TARGETS = "0.001,0.01,0.05"
FILE_WIDTH = 160  # a table written with -o: as wide as a terminal that would show it without splitting
FORMAT_BY_SUFFIX = {".json": OutputFormat.json, ".csv": OutputFormat.csv}
DialectOpt = Annotated[
    str | None,
    typer.Option(
        "--dialect",
        help="Also report a trainer's own mismatch metrics under its logged names: verl (the default, in the JSON), "
        "prime-rl, nemo-rl, slime, skyrl, trl, roll, areal, openrlhf; an earlier commit or another configuration "
        "(verl@b178a3c, verl@b178a3c:seq, prime-rl:ipo, areal:kpop, areal@4aef98d); a comma-separated list, or all "
        "(every trainer at its current code; one table, trainers as columns). See docs/dialects.md.",
        metavar="NAME",
    ),
]


def _console(stream=None) -> Console:
    from rich.console import Console

    return Console(file=stream or sys.stdout, soft_wrap=False)


def fail(message: str) -> NoReturn:
    from rollout_diag.formatting import visible  # messages name files and columns: never raw escapes

    typer.echo(f"Error: {visible(message)}", err=True)
    raise typer.Exit(1)


# Library keyword arguments whose flag is not the argument's name with dashes (errors name options in library terms).
FLAGS = {
    "columns": "--column",
    "presets": "--preset",
    "targets": "--target",
    "sample_id": "--sample",
    "export_decisions_to": "--export-decisions",
    "whole_row": "--all",
}


def flag_of(option: str) -> str:
    """The command-line flag of a library option named in an error message."""
    return FLAGS.get(option, "--" + option.replace("_", "-"))


def handles_errors(command: F) -> F:
    """Turn library errors (and unexpected ones) into one ``Error:`` line and exit 1."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        debug = kwargs.get("debug", False)
        try:
            return command(*args, **kwargs)
        except RolloutDiagError as exc:
            if debug:
                raise
            fail(exc.render(flag_of, " "))
        except KeyboardInterrupt:
            typer.echo("Interrupted.", err=True)
            raise typer.Exit(130) from None
        except (typer.Exit, typer.Abort):
            raise
        except OSError as exc:  # an output path that cannot be written (input errors are RolloutDiagErrors)
            if debug:
                raise
            fail(f"{exc.filename}: {exc.strerror}." if exc.filename else f"{exc}.")
        except Exception as exc:
            if debug:
                raise
            fail(
                f"internal error: {type(exc).__name__}: {exc} "
                "(rerun with --debug for the traceback, and please report it)"
            )
        finally:
            command_ended()  # the collector as it was before Reading.open (rollout_diag.process)

    return wrapper  # type: ignore[return-value]


@contextmanager
def progress_bar(inputs: list[Path]) -> Iterator[Callable[[int, int], None] | None]:
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


def emit(text: str, output: Path | None) -> None:
    """Write a json/csv document to ``output`` (atomically: a temporary file renamed over it) or stdout."""
    if output is None:
        sys.stdout.write(text)
    else:
        from rollout_diag.io.outputs import write_text

        write_text(output, text)
        typer.echo(f"wrote {output}", err=True)


def emit_pieces(pieces: Iterable[str], output: Path | None) -> None:
    """As :func:`emit`, for a document written piece by piece (never held as one string)."""
    if output is None:
        for piece in pieces:
            sys.stdout.write(piece)
        return
    from rollout_diag.io.outputs import atomic_path

    with atomic_path(output) as temporary, temporary.open("w", encoding="utf-8") as handle:
        for piece in pieces:
            handle.write(piece)
    typer.echo(f"wrote {output}", err=True)


def show(renderable: Any, output: Path | None) -> None:
    """Print rich tables to the terminal, or write them as plain text (no colour) to ``output`` (atomically)."""
    if output is None:
        _console().print(renderable)
        return
    from rich.console import Console

    from rollout_diag.io.outputs import atomic_path

    with atomic_path(output) as temporary, temporary.open("w", encoding="utf-8") as handle:
        Console(file=handle, width=FILE_WIDTH, color_system=None, soft_wrap=False).print(renderable)
    typer.echo(f"wrote {output}", err=True)


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


def write_repro(dump: Any, result: Any, path: Path) -> None:
    """``--export-repro``: the extreme prompts' rows to ``path`` (a second pass), and one line on stderr saying what."""
    from rollout_diag.drivers.repro import export_repro
    from rollout_diag.errors import ConfigError

    if result.prompts is None:
        raise ConfigError(
            "--export-repro: the dump has no prompt identity (no prompt_id column, no prompt tokens under mask 0 "
            "with token ids).",
            hint="name the prompt's column with --column prompt_id=NAME.",
        )
    rows = export_repro(dump, path, result)
    listed = len(result.prompts.extreme)
    typer.echo(
        f"{path}: {rows} rows of {listed} prompts that are extreme every time"
        if listed
        else f"{path}: no prompt is extreme every time; the file holds no rows",
        err=True,
    )


def write_runs_repro(runs: Any, result: Any, path: Path) -> None:
    """``runs --export-repro``: the deterministic outliers' rows to ``path`` (a second pass over the runs holding
    them), and one line on stderr saying what."""
    from rollout_diag.drivers.repro import export_runs_repro
    from rollout_diag.errors import ConfigError

    if result.prompts is None:
        raise ConfigError(
            "--export-repro: no run has a prompt identity (no prompt_id column, no prompt tokens under mask 0 with "
            "token ids).",
            hint="name the prompt's column with --column prompt_id=NAME.",
        )
    rows = export_runs_repro(runs, path, result)
    listed = len(result.prompts.listed)
    typer.echo(
        f"{path}: {rows} rows of {listed} prompts in the worst 1 % in every run they appear in"
        if listed
        else f"{path}: no prompt is in the worst 1 % in every run it appears in; the file holds no rows",
        err=True,
    )


def write_parquet_tables(result: Any, output: Path | None) -> None:
    assert output is not None, "data_format refuses --format parquet without --output"
    from rollout_diag.export.parquet import write_parquet

    for path in write_parquet(result, output):
        typer.echo(f"wrote {path}", err=True)


def write_tensorboard_events(result: Any, directory: Path) -> None:
    from rollout_diag.export.tensorboard import write_tensorboard

    count = write_tensorboard(result, directory)
    typer.echo(f"wrote {count:,} TensorBoard scalars to {directory}", err=True)


# ------------------------------------------------------------------ option groups: declared once, placed by name
# A group is a frozen dataclass whose fields are options (each declared once: its Annotated type, help and default). A
# command takes a group as one argument annotated with it, and shows its options either all together where that
# argument stands (``knobs: AnalysisKnobs = SHARED``) or one by one where its signature names them (``column: Shared =
# SHARED``, the group a keyword-only ``reading: Reading``): each command's --help keeps its order. An option a command
# does not show keeps the group's default. ``@option_groups`` does the rest.
class Shared:
    """Where a command shows one option of a group; ``Shared(default)``: this command's own default."""

    def __init__(self, default: Any = dataclasses.MISSING) -> None:
        self.default = default


SHARED: Any = Shared()  # typed Any: it stands in a parameter's default for the group's own value
PRESET_CHUNKS = Shared(PRESET_CHUNK_TOKENS)  # --chunk-tokens of the commands with presets (drivers/dump.py)
ON_THE_CPU = Shared("cpu")  # --device of watch


@dataclasses.dataclass(frozen=True)
class Reading:
    """How a command reads its dump(s): the reading options every reading command shares, and the Dump built from
    them (``rollout_diag.drivers.dump``)."""

    column: Annotated[
        list[str] | None,
        typer.Option(
            "--column",
            "-c",
            help="Say which column plays a role: role=name (roles: rollout, trainer, "
            "mask, step, sample_id, position, token_ids, tokens, policy_version, prompt_id, rollout_token_ids, "
            "kept_mass). Repeatable.",
            metavar="ROLE=NAME",
        ),
    ] = None
    device: Annotated[
        str, typer.Option("--device", help="auto (CUDA when available), cpu or cuda[:N].", metavar="DEVICE")
    ] = "auto"
    workers: Annotated[
        str,
        typer.Option(
            "--workers",
            help="Split the input over this many processes (or Ray tasks) and merge: same result. auto: one per "
            "core but one, at most 8, where the input has that many row groups (files in the token layout); 1 on a GPU "
            "or on 2 cores.",
        ),
    ] = "auto"
    backend: Annotated[str, typer.Option("--backend", help="Where --workers run: process (this machine) or ray.")] = (
        "process"
    )
    strict: Annotated[bool, typer.Option("--strict", help="Fail on the first invalid row instead of skipping it.")] = (
        False
    )
    chunk_tokens: Annotated[
        int,
        typer.Option(
            "--chunk-tokens",
            help="Tokens per chunk (memory vs overhead); results do not depend on it. On a GPU the default becomes "
            "16 M.",
        ),
    ] = CHUNK_TOKENS
    input_format: Annotated[
        str | None,
        typer.Option(
            "--input-format",
            help="Read the inputs as this format instead of detecting it: parquet, prime-rl, nemo-rl, slime, skyrl, "
            "verl (README, 'Where is my dump?').",
            metavar="NAME",
        ),
    ] = None
    trust_pickle: Annotated[
        bool,
        typer.Option(
            "--trust-pickle",
            help="Unpickle SkyRL/verl .pkl files without the allowlist of plain data classes. Unpickling runs code "
            "the file names: only for files you trust.",
        ),
    ] = False
    tokenizer: Annotated[
        str | None,
        typer.Option(
            "--tokenizer",
            help="Show token ids as text: a tokenizer.json, a local Hugging Face model directory, or a model name "
            "found in the local Hugging Face cache (nothing is downloaded). Needs pip install "
            "'rollout-diag[tokenizer]'.",
            metavar="PATH|NAME",
        ),
    ] = None

    def columns(self) -> dict[str, str]:
        """--column ROLE=NAME as role -> column; raises ConfigError."""
        from rollout_diag.io.columns import parse_overrides

        return parse_overrides(self.column or [])

    def sources(self, inputs: list[Path]) -> list[str]:
        """The input paths, carrying how to read them (``io.formats.DumpInputs``); a missing one fails before pyarrow
        loads (0.3–0.5 s)."""
        from rollout_diag.io.sources import check_inputs_exist

        check_inputs_exist(inputs)
        from rollout_diag.io.formats import DumpInputs

        return DumpInputs(inputs, self.input_format, self.trust_pickle)

    def dump(self, inputs: list[Path], one_process: bool = False, must_exist: bool = True) -> Dump:
        """The :class:`~rollout_diag.drivers.dump.Dump` of ``inputs`` with these options, not opened; a missing input
        fails before pyarrow loads (0.3–0.5 s) unless not ``must_exist`` (a directory ``watch`` waits for).
        ``one_process``: without --workers and --backend (a call that reads in one process: ``diff``'s)."""
        from rollout_diag.drivers.dump import Dump
        from rollout_diag.io.sources import check_inputs_exist

        if must_exist:
            check_inputs_exist(inputs)

        split = {} if one_process else {"workers": self.workers, "backend": self.backend}
        options: dict[str, Any] = {
            "strict": self.strict,
            "chunk_tokens": self.chunk_tokens,
            "device": self.device,
            **split,
        }
        return Dump(
            tuple(str(path) for path in inputs),
            self.columns(),
            input_format=self.input_format,
            trust_pickle=self.trust_pickle,
            tokenizer=self.tokenizer,
            **options,
        )

    def open(
        self, inputs: list[Path], read_ahead: bool = False, numpy: bool = False, one_process: bool = False
    ) -> Dump:
        """The command's Dump opened before torch is loaded: files found, footers read, columns resolved, so a
        missing file or column fails at once; the process tuned for the reading (``rollout_diag.process``: undone
        by handles_errors at the end). ``read_ahead``: the command reads every row (no --where / --steps): reading
        may start now (``Dump.opened``); ``numpy``: its passes take numpy chunks (every command that reads the whole
        dump: no torch on the CPU)."""
        from rollout_diag.drivers.dump import Dump

        dump = self.dump(inputs)
        return open_for_reading(lambda: dump.opened(read_ahead=read_ahead, numpy=numpy), Dump.input_size)


@dataclasses.dataclass(frozen=True)
class PresetChoice:
    """The presets compare-presets and report compare: named, from a file, or one custom preset."""

    preset: Annotated[
        list[str] | None,
        typer.Option(
            "--preset",
            help="Preset name or group (all, verl, legacy, gates); repeatable. Default: all.",
            metavar="NAME",
        ),
    ] = None
    presets_file: Annotated[
        Path | None,
        typer.Option(
            "--presets-file",
            help="YAML or JSON file of named presets (verl's keys or OpenRLHF's is_correction_*), added to the "
            "comparison.",
        ),
    ] = None
    rollout_is: Annotated[
        str | None, typer.Option("--rollout-is", help="Custom preset: IS level, token or sequence.", metavar="LEVEL")
    ] = None
    rollout_is_threshold: Annotated[
        str | None,
        typer.Option("--rollout-is-threshold", help="Custom preset: U (truncation) or L_U (IcePop).", metavar="SPEC"),
    ] = None
    rollout_rs: Annotated[
        str | None,
        typer.Option("--rollout-rs", help="Custom preset: RS options, e.g. seq_mean_k3,token_k1.", metavar="OPTIONS"),
    ] = None
    rollout_rs_threshold: Annotated[
        str | None,
        typer.Option(
            "--rollout-rs-threshold",
            help="Custom preset: one threshold per RS option (or one shared).",
            metavar="SPECS",
        ),
    ] = None
    batch_normalize: Annotated[
        bool, typer.Option("--batch-normalize", help="Custom preset: normalise IS weights per batch.")
    ] = False

    def presets(self) -> list[str | Preset] | None:
        """The chosen presets (``presets.choose_presets``); raises ConfigError."""
        from rollout_diag.presets import choose_presets

        return choose_presets(*(getattr(self, field.name) for field in dataclasses.fields(self)))


@dataclasses.dataclass(frozen=True)
class AnalysisKnobs:
    """analyze's knobs (also report's)."""

    max_rounds: Annotated[
        int, typer.Option("--max-rounds", help="Pool rounds at this index and beyond into one bucket.")
    ] = 64
    catastrophic: Annotated[
        float,
        typer.Option(
            "--catastrophic", help="|δ| above which a token counts as catastrophic (1.0: ρ outside [1/e, e])."
        ),
    ] = 1.0
    top_k: Annotated[int, typer.Option("--top-k", help="How many worst rows and tokens to keep.")] = 20
    drift_windows: Annotated[
        str | None,
        typer.Option(
            "--drift-windows",
            help="The early and the late window of steps whose change of k3_kl and mean |δ| is split into mix and "
            "within parts per factor (first:last,first:last, inclusive; default: the first and the last 20 % of the "
            "steps). docs/drift.md.",
            metavar="A:B,C:D",
        ),
    ] = None


@dataclasses.dataclass(frozen=True)
class Selection:
    """--by, --where, --steps of analyze, compare-presets and report: which rows, and their groups."""

    by: Annotated[
        list[str] | None,
        typer.Option(
            "--by",
            help="Key metrics per group of rows: a per-row column (env_name, reward, a data-source tag) or a derived "
            "one (response_length, num_rounds); numbers can be bucketed: COLUMN:sign or COLUMN:bins=E1,E2,... "
            "Repeatable (each is its own grouping). README, 'Which environment diverges?'.",
            metavar="COLUMN[:sign|:bins=E1,E2]",
        ),
    ] = None
    where: Annotated[
        str | None,
        typer.Option(
            "--where",
            help='Analyse only the rows for which this SQL condition over per-row columns holds, e.g. "reward > 0 AND '
            "env_name = 'math'\" (evaluated with polars; rows that do not match are not decoded).",
            metavar="PREDICATE",
        ),
    ] = None
    steps: Annotated[
        str | None,
        typer.Option(
            "--steps",
            help="Analyse only these steps: FIRST:LAST, inclusive (either end may be empty).",
            metavar="FIRST:LAST",
        ),
    ] = None

    def every_row(self) -> bool:
        """Whether the command reads every row (its reading may start at once: ``Reading.open(read_ahead=…)``)."""
        return self.where is None and self.steps is None

    def options(self) -> dict[str, Any]:
        """The library's ``by``, ``where`` and ``steps``; raises ConfigError for a bad --steps."""
        from rollout_diag.selection import parse_step_range

        return {"by": self.by or (), "where": self.where, "steps": parse_step_range(self.steps, "--steps")}


@dataclasses.dataclass(frozen=True)
class WandbLogging:
    """--wandb of analyze, compare-presets and watch: the result in a Weights & Biases project
    (rollout_diag/export/wandb.py)."""

    wandb: Annotated[
        str | None,
        typer.Option(
            "--wandb",
            help="Also log to this W&B project: every per-step metric under its verl name at the dump's step, each "
            "--by group, preset or (runs) run as a run in one W&B group (they overlay), the verdict and findings as "
            "the run's summary and a table, the report as an artifact. WANDB_MODE=offline works (wandb sync later). "
            "Needs pip install 'rollout-diag[wandb]'.",
            metavar="PROJECT",
        ),
    ] = None
    wandb_group: Annotated[
        str | None,
        typer.Option(
            "--wandb-group",
            help="The W&B group of this command's runs (default: rollout-diag-<UTC time>).",
            metavar="NAME",
        ),
    ] = None
    wandb_run_id: Annotated[
        str | None,
        typer.Option(
            "--wandb-run-id",
            help="Add to this existing W&B run (the training run itself, resume=allow): the metrics under "
            "rollout_diag/... against their own step, groups and presets in the same run.",
            metavar="ID",
        ),
    ] = None

    def check(self) -> None:
        """Before any reading: wandb is installed (ConfigError saying what to install), the options make sense."""
        if self.wandb is None:
            from rollout_diag.errors import ConfigError

            if self.wandb_group is not None or self.wandb_run_id is not None:
                raise ConfigError("--wandb-group and --wandb-run-id go with --wandb PROJECT.")
            return
        from rollout_diag.export.wandb import wandb_module

        wandb_module()

    def log(self, result: Any, report: Path | None = None) -> None:
        """``result`` to W&B (nothing without --wandb)."""
        if self.wandb is None:
            return
        from rollout_diag.export.wandb import log_to_wandb

        target = log_to_wandb(result, self.wandb, group=self.wandb_group, run_id=self.wandb_run_id, report=report)
        names = [name for name, _ in target.runs]
        runs = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        typer.echo(
            f"logged {target.scalars:,} scalars to W&B project {self.wandb}, group {target.group}: {runs}", err=True
        )

    def target(self) -> Any:
        """The W&B target of a command that logs as it goes (watch); None without --wandb."""
        if self.wandb is None:
            return None
        from rollout_diag.export.wandb import WandbTarget

        return WandbTarget(self.wandb, self.wandb_group, self.wandb_run_id)


OPTION_GROUPS = (Reading, PresetChoice, AnalysisKnobs, Selection, WandbLogging)


@functools.cache
def _group_fields() -> dict[str, tuple[type, Any, Any]]:
    """Option name -> (its group, its Annotated declaration, its default), over every group."""
    found: dict[str, tuple[type, Any, Any]] = {}
    for group in OPTION_GROUPS:
        hints = typing.get_type_hints(group, include_extras=True)
        for field in dataclasses.fields(group):
            found[field.name] = (group, hints[field.name], field.default)
    return found


def option_groups(command: F) -> F:
    """Declare the options ``command``'s signature shows from their groups, in their places (a group's argument with
    ``SHARED``: all of its options there; ``name: Shared = SHARED``: that one), and hand ``command`` each group it
    takes built from their values."""
    signature = signature_of(command, eval_str=True)
    groups = {
        parameter.name: parameter.annotation
        for parameter in signature.parameters.values()
        if parameter.annotation in OPTION_GROUPS
    }
    parameters, placed = [], []
    for parameter in signature.parameters.values():
        if parameter.name in groups:
            if parameter.default is SHARED:  # the whole group here, in its fields' order
                for field in dataclasses.fields(parameter.annotation):
                    _, declared, default = _group_fields()[field.name]
                    parameters.append(parameter.replace(name=field.name, annotation=declared, default=default))
                    placed.append(field.name)
            continue
        if isinstance(parameter.default, Shared):
            group, declared, default = _group_fields()[parameter.name]
            if group not in groups.values():
                raise TypeError(f"{command.__name__}: {parameter.name} is shown but no argument takes {group.__name__}")
            if parameter.default.default is not dataclasses.MISSING:
                default = parameter.default.default
            parameter = parameter.replace(annotation=declared, default=default)
            placed.append(parameter.name)
        parameters.append(parameter)

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        given = {name: kwargs.pop(name) for name in placed}
        for argument, group in groups.items():
            names = {field.name for field in dataclasses.fields(group)}
            kwargs[argument] = group(**{name: value for name, value in given.items() if name in names})
        return command(*args, **kwargs)

    wrapper.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {
        **{parameter.name: parameter.annotation for parameter in parameters},
        "return": signature.return_annotation,
    }
    return wrapper  # type: ignore[return-value]


def print_version(value: bool) -> None:
    if value:
        from rollout_diag import __version__

        typer.echo(f"rollout-diag {__version__}")
        raise typer.Exit(0)


class Engine(str, Enum):
    """The per-token engines (rollout_diag.engine.choice.ENGINES)."""

    auto = "auto"
    numba = "numba"
    torch = "torch"


@app.callback()
def root(
    context: typer.Context,
    version: Annotated[
        bool, typer.Option("--version", callback=print_version, is_eager=True, help="Print the version and exit.")
    ] = False,
    engine: Annotated[
        Engine,
        typer.Option(
            "--engine",
            envvar="ROLLOUT_DIAG_ENGINE",
            help="Per-token engine of every reading command: numba (compiled CPU kernels), torch (any device, what "
            "runs on CUDA) or auto (numba on the CPU, torch on a GPU; and torch for an input under 4M tokens and 4096 "
            "rows where the command loads torch anyway: inspect). Before the command: "
            "rollout-diag --engine torch analyze ….",
        ),
    ] = Engine.auto,
) -> None:
    """Diagnose training–inference logprob mismatch in RL for LLMs, offline, from Parquet dumps."""
    before = os.environ.get("ROLLOUT_DIAG_ENGINE")
    os.environ["ROLLOUT_DIAG_ENGINE"] = engine.value  # read where each chunk is computed (rollout_diag.engine.kernels)
    context.call_on_close(lambda: _restore_environment("ROLLOUT_DIAG_ENGINE", before))


def _restore_environment(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


@app.command()
@handles_errors
@option_groups
def analyze(
    inputs: Inputs,
    column: Shared = SHARED,
    device: Shared = SHARED,
    format: DataFormatOpt = None,
    output: OutputOpt = None,
    all_steps: Annotated[
        bool, typer.Option("--all-steps", help="Show every step (default: first, last, worst).")
    ] = False,
    knobs: AnalysisKnobs = SHARED,
    workers: Shared = SHARED,
    backend: Shared = SHARED,
    strict: Shared = SHARED,
    chunk_tokens: Shared = SHARED,
    dialect: DialectOpt = None,
    input_format: Shared = SHARED,
    trust_pickle: Shared = SHARED,
    tokenizer: Shared = SHARED,
    selection: Selection = SHARED,
    tensorboard: TensorboardOpt = None,
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
    logging: WandbLogging = SHARED,
    debug: DebugOpt = False,
    *,
    reading: Reading,
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
    if tensorboard is not None:  # a missing package fails before the reading, not after
        from rollout_diag.export.tensorboard import writer_class

        writer_class()
    logging.check()
    dump = reading.open(inputs, read_ahead=selection.every_row(), numpy=True)
    from rollout_diag.drivers.engine import analyze as run_analysis
    from rollout_diag.render.analysis import render_analysis
    from rollout_diag.render.export import analysis_csv, analysis_json_pieces

    with progress_bar(inputs) as progress:
        result = run_analysis(
            dump,
            **dataclasses.asdict(knobs),
            progress=progress,
            dialect=dialect or "verl",
            **selection.options(),
        )
    if tensorboard is not None:
        write_tensorboard_events(result, tensorboard)
    logging.log(result)
    if export_repro is not None:
        write_repro(dump, result, export_repro)
    if chosen is DataFormat.parquet:
        write_parquet_tables(result, output)
    elif chosen is DataFormat.json:
        emit_pieces(analysis_json_pieces(result), output)  # 200 000 steps: written from the step columns
    elif chosen is DataFormat.csv:
        emit(analysis_csv(result), output)
    else:
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
        from rich.console import Group

        show(Group(*tables), output)


@app.command()
@handles_errors
@option_groups
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
    column: Shared = SHARED,
    device: Shared = SHARED,
    format: Annotated[RowFormat, typer.Option("--format", "-f", help="table (terminal) or json.")] = RowFormat.table,
    output: OutputOpt = None,
    input_format: Shared = SHARED,
    trust_pickle: Shared = SHARED,
    tokenizer: Shared = SHARED,
    debug: DebugOpt = False,
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
    from dataclasses import asdict

    refuse_overwriting_inputs({"output": output}, inputs)
    dump = reading.open(inputs)
    from rollout_diag.drivers.inspect import inspect_row
    from rollout_diag.render.export import to_json_text
    from rollout_diag.render.inspect import render_row

    tokens = inspect_row(
        dump,
        sample,
        step=step,
        row=row,
        around=around,
        window=window,
        whole_row=whole_row,
    )
    if format is RowFormat.json:
        emit(to_json_text({**asdict(tokens), "log_ratio": tokens.log_ratio}), output)
    else:
        show(render_row(tokens), output)


@app.command()
@handles_errors
@option_groups
def sweep(
    inputs: Inputs,
    target: TargetOpt = DEFAULT_TARGETS,
    column: Shared = SHARED,
    device: Shared = SHARED,
    format: FormatOpt = None,
    output: OutputOpt = None,
    strict: Shared = SHARED,
    chunk_tokens: Shared = SHARED,
    input_format: Shared = SHARED,
    trust_pickle: Shared = SHARED,
    debug: DebugOpt = False,
    *,
    reading: Reading,
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
        result = threshold_sweep(
            dump,
            targets=parse_targets(target),
            progress=progress,
        )
    chosen = output_format(format, output)
    if chosen is OutputFormat.json:
        emit_pieces(json_pieces(result.json_document()), output)  # 200 000 steps: written step by step
    elif chosen is OutputFormat.csv:
        emit(sweep_csv(result), output)
    else:
        show(render_sweep(result.run, result.targets), output)


@app.command("compare-presets")
@handles_errors
@option_groups
def compare_presets(
    inputs: Inputs,
    choice: PresetChoice = SHARED,
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
    workers: Shared = SHARED,
    backend: Shared = SHARED,
    column: Shared = SHARED,
    device: Shared = SHARED,
    format: DataFormatOpt = None,
    output: OutputOpt = None,
    strict: Shared = SHARED,
    chunk_tokens: Shared = PRESET_CHUNKS,
    input_format: Shared = SHARED,
    trust_pickle: Shared = SHARED,
    selection: Selection = SHARED,
    tensorboard: TensorboardOpt = None,
    logging: WandbLogging = SHARED,
    debug: DebugOpt = False,
    *,
    reading: Reading,
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
    if tensorboard is not None:  # a missing package fails before the reading, not after
        from rollout_diag.export.tensorboard import writer_class

        writer_class()
    logging.check()
    from rollout_diag.engine.choice import expect_presets

    expect_presets()  # a first run compiles the preset kernels in a helper process from the start
    dump = reading.open(inputs, read_ahead=selection.every_row(), numpy=True)
    from rollout_diag.drivers.compare import compare_presets as run_comparison
    from rollout_diag.render.export import comparison_csv, comparison_json_pieces
    from rollout_diag.render.format import plain
    from rollout_diag.render.presets import k1_bounds_lines, presets_table, raw_applied_table
    from rollout_diag.render.sweep import render_sweep

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
        typer.echo(f"wrote {export_decisions}", err=True)
    if tensorboard is not None:
        write_tensorboard_events(result, tensorboard)
    logging.log(result)
    from rollout_diag.decisions.recommend import sort_by_intrusiveness
    from rollout_diag.render.decisions import recommendation_lines
    from rollout_diag.render.presets import answer_block

    if sort is PresetOrder.intrusiveness:
        result = sort_by_intrusiveness(result)
    shown = chosen_format
    if shown is DataFormat.parquet:
        write_parquet_tables(result, output)
    elif shown is DataFormat.json:
        emit_pieces(comparison_json_pieces(result), output)
    elif shown is DataFormat.csv:
        emit(comparison_csv(result), output)
    else:
        warnings = [plain(f"warning: {warning}", style="yellow") for warning in result.warnings]
        raw_applied = raw_applied_table(result)
        tables = [
            *answer_block(result),
            presets_table(result),
            *k1_bounds_lines(result),
            *([raw_applied] if raw_applied is not None else []),
            render_sweep(result.sweep, parse_targets(target)),
        ]
        if result.groups or result.selection:
            from rollout_diag.render.groups import groups_tables, selection_line

            if result.selection:
                tables.insert(0, selection_line(result.selection))
            tables.append(groups_tables(result.groups))
        details = [] if result.recommendation is None else [recommendation_lines(result.recommendation, headline=False)]
        from rich.console import Group

        show(Group(*tables, *warnings, *details), output)


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
@handles_errors
@option_groups
def report(
    ctx: typer.Context,
    inputs: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Dump(s), as for analyze: files, globs or directories.", show_default=False, metavar="FILE"
        ),
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
    choice: PresetChoice = SHARED,
    target: TargetOpt = DEFAULT_TARGETS,
    intrusive_reject: IntrusiveRejectOpt = 0.10,
    intrusive_ess: IntrusiveEssOpt = 0.5,
    knobs: AnalysisKnobs = SHARED,
    open_browser: Annotated[bool, typer.Option("--open", help="Open the report in a browser.")] = False,
    vs: Annotated[
        list[Path] | None,
        typer.Option("--vs", help="A second run's dump(s): add an A/B section (what `diff` prints).", metavar="FILE"),
    ] = None,
    workers: Shared = SHARED,
    backend: Shared = SHARED,
    column: Shared = SHARED,
    device: Shared = SHARED,
    strict: Shared = SHARED,
    chunk_tokens: Shared = PRESET_CHUNKS,
    dialect: DialectOpt = None,
    input_format: Shared = SHARED,
    trust_pickle: Shared = SHARED,
    tokenizer: Shared = SHARED,
    selection: Selection = SHARED,
    logging: WandbLogging = SHARED,
    debug: DebugOpt = False,
    *,
    reading: Reading,
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
        given = [name for name in LIVE_ONLY if _from_command_line(ctx, name)]
        if given:
            flags = ", ".join("--" + name.replace("_", "-") for name in given)
            raise ConfigError(f"{flags}: apply when analysing dumps, not to saved --from-json results.")
        from rollout_diag.results import load_results

        analysis, comparison = load_results(from_json)
        if reading.tokenizer is not None and analysis is not None:  # a saved result's token ids, shown as text
            from rollout_diag.drivers.tokens import with_token_text

            analysis = with_token_text(analysis, reading.tokenizer)
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
    comparison_ab = None
    if vs:
        if not inputs:
            fail("--vs compares two dumps: give run A's dump(s) as FILE, not --from-json.")
        from rollout_diag.drivers.diff import diff_runs

        runs = (reading.dump(inputs, one_process=True), reading.dump(vs, one_process=True))  # diff reads in one
        comparison_ab = diff_runs(*runs, presets=choice.preset or None)
    shown = (choice.preset or None) if from_json else None  # a live run already compared only these
    if analysis is None:  # a saved compare-presets result alone: the report derives the rest from it
        assert comparison is not None  # load_results returns one of the two at least
        text = render_report(comparison, title=title, presets=shown)
    else:
        text = render_report(analysis, comparison=comparison, title=title, presets=shown, diff=comparison_ab)
    from rollout_diag.io.outputs import write_text

    write_text(output, text)  # atomic: a failed run leaves an earlier report as it was
    path = output
    typer.echo(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)", err=True)
    logging.log(analysis if analysis is not None else comparison, report=path)
    if open_browser:
        import webbrowser

        webbrowser.open(path.resolve().as_uri())


@app.command()
@handles_errors
@option_groups
def convert(
    inputs: Inputs,
    output: Annotated[
        Path, typer.Option("--output", "-o", help="The Parquet file to write (a directory with --partition).")
    ],
    partition: Annotated[
        str | None,
        typer.Option("--partition", help="Write a hive directory OUT/step=N/part-K.parquet instead of one file."),
    ] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace OUT when it exists.")] = False,
    column: Shared = SHARED,
    strict: Shared = SHARED,
    input_format: Shared = SHARED,
    trust_pickle: Shared = SHARED,
    format: Annotated[RowFormat, typer.Option("--format", "-f", help="table (a summary) or json.")] = RowFormat.table,
    debug: DebugOpt = False,
    *,
    reading: Reading,
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

        emit(to_json_text(result.to_json()), None)
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


def _from_command_line(ctx: typer.Context, name: str) -> bool:
    source = ctx.get_parameter_source(name)  # click's ParameterSource (typer may vendor click: compare by name)
    return source is not None and source.name == "COMMANDLINE"


def parse_targets(text: str) -> list[float]:
    from rollout_diag.errors import ConfigError

    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"--target {text}: expected comma-separated shares, e.g. 0.001,0.01,0.05.") from None


# ------------------------------------------------------------------ decisions: check and diff
class CheckFormat(str, Enum):
    table = "table"
    json = "json"


GATE_FAILED = 3  # exit code of `check` when a gate fails (1 is bad input, 0 all pass)
MaxGateOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--max",
        help="Gate: the metric must be ≤ VALUE (full name, e.g. rollout_corr/k3_kl=1e-3, or the short name "
        "the tables print when only one metric has it, e.g. k3_kl=1e-3). Repeatable.",
        metavar="NAME=VALUE",
    ),
]
MinGateOpt = Annotated[
    list[str] | None,
    typer.Option("--min", help="Gate: the metric must be ≥ VALUE. Repeatable.", metavar="NAME=VALUE"),
]
GatesOpt = Annotated[
    str | None,
    typer.Option(
        "--gates",
        help="Gates from a TOML/YAML/JSON file, or 'default' (public CI bounds; docs/gates.md).",
        metavar="FILE|default",
    ),
]


def chosen_gates(gates: str | None, max_: list[str] | None, min_: list[str] | None) -> list:
    """The gates of --gates, --max and --min, in that order (check, watch); raises ConfigError."""
    from rollout_diag.decisions.check import load_gates, parse_gate

    return [
        *(load_gates(gates) if gates else []),
        *(parse_gate(t, "max") for t in max_ or []),
        *(parse_gate(t, "min") for t in min_ or []),
    ]


@app.command()
@handles_errors
@option_groups
def check(
    inputs: Inputs,
    max_: MaxGateOpt = None,
    min_: MinGateOpt = None,
    gates: GatesOpt = None,
    per_step: Annotated[bool, typer.Option("--per-step", help="Check every step too, not only the whole run.")] = False,
    exact: Annotated[
        bool,
        typer.Option(
            "--exact",
            help="Fail (exit 3) on any model token whose two logprobs differ in any bit (float32 where either column "
            "is), naming the first: file, row, position, both values. For batch-invariant inference.",
        ),
    ] = False,
    format: Annotated[
        CheckFormat, typer.Option("--format", "-f", help="table (terminal) or json.")
    ] = CheckFormat.table,
    output: OutputOpt = None,
    junit: Annotated[
        Path | None,
        typer.Option("--junit", help="Also write JUnit XML here (one testcase per gate, step and --by group)."),
    ] = None,
    by: Annotated[
        list[str] | None,
        typer.Option(
            "--by",
            help="Judge every gate on each group of rows too (a per-row column such as env_name, or "
            "COLUMN:sign / COLUMN:bins=E1,E2; with --per-step, each group's steps); a failing group fails the "
            "check. Repeatable. README, 'Which environment diverges?'.",
            metavar="COLUMN[:sign|:bins=E1,E2]",
        ),
    ] = None,
    column: Shared = SHARED,
    device: Shared = SHARED,
    strict: Shared = SHARED,
    chunk_tokens: Shared = SHARED,
    input_format: Shared = SHARED,
    trust_pickle: Shared = SHARED,
    debug: DebugOpt = False,
    *,
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
    refuse_overwriting_inputs({"output": output, "junit": junit}, inputs, gates if gates != "default" else None)
    dump = reading.open(inputs, read_ahead=True, numpy=True)
    from rollout_diag.drivers.check import check_run
    from rollout_diag.render.decisions import check_table, junit_xml
    from rollout_diag.render.export import json_pieces

    chosen = chosen_gates(gates, max_, min_)
    with progress_bar(inputs) as progress:
        result = check_run(dump, chosen, per_step=per_step, progress=progress, by=by or (), exact=exact)
    if junit is not None:
        from rollout_diag.io.outputs import write_text

        write_text(junit, junit_xml(result))
        typer.echo(f"wrote {junit}", err=True)
    if format is CheckFormat.json:
        emit_pieces(json_pieces(result.json_document()), output)  # 200 000 steps: written outcome by outcome
    else:
        show(check_table(result), output)
    if not result.passed:
        raise typer.Exit(GATE_FAILED)


@app.command()
@handles_errors
@option_groups
def diff(
    inputs: Annotated[
        list[Path],
        typer.Argument(
            help="Run A's dump, then run B's (or one dump with --steps-a/--steps-b).",
            show_default=False,
            metavar="A [B]",
        ),
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
    replicates: Annotated[int, typer.Option("--replicates", help="Bootstrap resamples of the rows.")] = 1000,
    level: Annotated[float, typer.Option("--level", help="Level of the interval of B − A.")] = 0.95,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the bootstrap (same seed, same interval).")] = 0,
    by: Annotated[
        list[str] | None,
        typer.Option(
            "--by",
            help="Also compare each group of rows present in A or B (a per-row column such as env_name, or "
            "COLUMN:sign / COLUMN:bins=E1,E2): its key metrics in A and B and the interval of B − A over its rows "
            "alone, the largest change of k3_kl first. Repeatable.",
            metavar="COLUMN[:sign|:bins=E1,E2]",
        ),
    ] = None,
    format: Annotated[RowFormat, typer.Option("--format", "-f", help="table (terminal) or json.")] = RowFormat.table,
    output: OutputOpt = None,
    column: Shared = SHARED,
    device: Shared = SHARED,
    strict: Shared = SHARED,
    chunk_tokens: Shared = SHARED,
    input_format: Shared = SHARED,
    trust_pickle: Shared = SHARED,
    debug: DebugOpt = False,
    *,
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
    refuse_overwriting_inputs({"output": output}, inputs)
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
    if format is RowFormat.json:
        emit(to_json_text(result.to_json()), output)
    else:
        show(diff_tables(result), output)


# ------------------------------------------------------------------ runs: many runs, what each knob did
class RunsFormat(str, Enum):
    table = "table"
    json = "json"
    parquet = "parquet"


@app.command()
@handles_errors
@option_groups
def runs(
    inputs: Annotated[
        list[str],
        typer.Argument(
            help="Each run as NAME=DUMP (a file, directory or glob); a bare DUMP is named after its last path part.",
            show_default=False,
            metavar="NAME=DUMP...",
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
            help="Gate: every run's metric over the baseline's must be ≤ VALUE (k3_kl=2); exit 3 when one is "
            "not. Repeatable.",
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
    replicates: Annotated[int, typer.Option("--replicates", help="Bootstrap resamples of the rows.")] = 1000,
    level: Annotated[float, typer.Option("--level", help="Level of the intervals.")] = 0.95,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the bootstrap (same seed, same interval).")] = 0,
    format: Annotated[
        RunsFormat,
        typer.Option("--format", "-f", help="table (terminal), json, or parquet (one row per run × step; --output)."),
    ] = RunsFormat.table,
    output: OutputOpt = None,
    column: Shared = SHARED,
    device: Shared = SHARED,
    strict: Shared = SHARED,
    chunk_tokens: Shared = SHARED,
    input_format: Shared = SHARED,
    trust_pickle: Shared = SHARED,
    workers: Shared = SHARED,
    backend: Shared = SHARED,
    wandb: Shared = SHARED,
    wandb_group: Shared = SHARED,
    debug: DebugOpt = False,
    *,
    reading: Reading,
    logging: WandbLogging,
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
    from rollout_diag.drivers.runs import RunSpec, compare_dumps, knob_columns, load_knobs, parse_run

    if format is RunsFormat.parquet and output is None:
        fail("--format parquet writes a file: give --output FILE.parquet.")
    named = [parse_run(text) for text in inputs]
    names = [name for name, _ in named]
    refuse_overwriting_inputs(
        {"output": output, "report": report, "export_repro": export_repro}, [Path(path) for _, path in named]
    )
    logging.check()
    given: dict[str, dict[str, Any]] = {name: {} for name in names}
    if knobs is not None:
        for name, values in load_knobs(knobs, names).items():
            given[name].update(values)
    for name, values in knob_columns(knob or [], names).items():
        given[name].update(values)
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
        write_runs_repro([(spec.name, spec.inputs) for spec in specs], result, export_repro)
    if report is not None:
        from rollout_diag.report.runs import write_runs_report

        write_runs_report(result, report)
        typer.echo(f"wrote {report}", err=True)
    if logging.wandb is not None:
        from rollout_diag.export.wandb import log_runs_to_wandb

        target = log_runs_to_wandb(result, logging.wandb, group=logging.wandb_group, report=report)
        typer.echo(f"logged {target.scalars:,} scalars to W&B project {logging.wandb}, group {target.group}", err=True)
    if format is RunsFormat.json:
        from rollout_diag.render.export import to_json_text

        emit(to_json_text(result.to_json()), output)
    elif format is RunsFormat.parquet:
        from rollout_diag.export.parquet import write_runs_parquet

        write_runs_parquet(result, output)  # type: ignore[arg-type]
        typer.echo(f"wrote {output}", err=True)
    else:
        from rollout_diag.render.runs import runs_tables

        show(runs_tables(result), output)
    if not result.passed:
        raise typer.Exit(GATE_FAILED)


# ------------------------------------------------------------------ watch: follow a run while it trains
class WatchFormat(str, Enum):
    live = "live"
    jsonl = "jsonl"


@app.command()
@handles_errors
@option_groups
def watch(
    directory: Annotated[
        Path,
        typer.Argument(
            help="The dump directory the trainer writes (DumpWriter's step=N/, prime-rl's token_exports/, NeMo-RL, "
            "slime or SkyRL step files).",
            show_default=False,
            metavar="DIR",
        ),
    ],
    interval: Annotated[float, typer.Option("--interval", help="Seconds between two looks at DIR.")] = 2.0,
    format: Annotated[
        WatchFormat,
        typer.Option("--format", "-f", help="live (a terminal view) or jsonl (one JSON object per finished step)."),
    ] = WatchFormat.live,
    report_file: Annotated[
        Path | None,
        typer.Option("--report", help="Rewrite this HTML report (atomically) as steps finish.", metavar="FILE"),
    ] = None,
    report_every: Annotated[
        int, typer.Option("--report-every", help="Rewrite --report every N finished steps (and at the end).")
    ] = 10,
    max_: MaxGateOpt = None,
    min_: MinGateOpt = None,
    gates: GatesOpt = None,
    exit_on_fail: Annotated[
        bool, typer.Option("--exit-on-fail", help="Exit 3 as soon as a gate fails (a sidecar can stop the job).")
    ] = False,
    exit_after_idle: Annotated[
        float | None,
        typer.Option(
            "--exit-after-idle",
            help="Exit once nothing new arrived for this many seconds: 0, or 3 if a gate failed.",
            metavar="SECONDS",
        ),
    ] = None,
    column: Shared = SHARED,
    input_format: Shared = SHARED,
    trust_pickle: Shared = SHARED,
    device: Shared = ON_THE_CPU,
    strict: Shared = SHARED,
    chunk_tokens: Shared = SHARED,
    logging: WandbLogging = SHARED,
    debug: DebugOpt = False,
    *,
    reading: Reading,
) -> None:
    """Follow a run while it trains: each new step is read once and merged into the run so far; a live view (or
    one JSON line per step) says the moment the mismatch goes wrong. A DIR the trainer has not made yet is waited
    for (the view says so; --exit-after-idle counts the wait). Exit 0, 3 when a gate failed, 1 for bad input or when
    DIR is deleted or moved.

    \b
    Examples:
      rollout-diag watch run/ --max k3_kl=1e-3 --report watch.html
      rollout-diag watch out/token_exports --gates default --exit-on-fail
      rollout-diag watch run/ -f jsonl --exit-after-idle 600 >> mismatch.jsonl
    """
    from rollout_diag.errors import InputError

    if directory.exists() and not directory.is_dir():
        raise InputError(f"{directory}: not a directory; watch follows a dump directory.")
    if report_every < 1:
        fail(f"--report-every {report_every}: must be a positive number of steps.")
    refuse_overwriting_inputs({"report": report_file}, [directory], gates if gates != "default" else None)
    logging.check()
    from rollout_diag.drivers.watch import watch as follow

    chosen = chosen_gates(gates, max_, min_)
    dump = reading.dump([directory], must_exist=False)  # a directory the trainer has not made yet is waited for
    updates = follow(dump, interval=interval, exit_after_idle=exit_after_idle, exit_on_fail=exit_on_fail, gates=chosen)
    writer = _ReportWriter(report_file, report_every, logging.target())
    try:
        if format is WatchFormat.jsonl:
            code = _watch_jsonl(updates, writer)
        else:
            code = _watch_live(updates, writer, str(directory))
    finally:
        writer.close()
    raise typer.Exit(code)


def _watch_jsonl(updates: Iterator[Any], writer: _ReportWriter) -> int:
    import json

    for update in updates:
        for report in update.steps:
            sys.stdout.write(json.dumps(report.to_json(), allow_nan=False) + "\n")
        sys.stdout.flush()
        for line in [*update.notes, *update.alerts]:
            typer.echo(line, err=True)
        writer.after(update)
        if update.ended:
            typer.echo(update.ended, err=True)
            return update.exit_code or 0
    return 0


def _watch_live(updates: Iterator[Any], writer: _ReportWriter, directory: str) -> int:
    from rich.live import Live
    from rich.text import Text

    from rollout_diag.render.watch import WatchView

    view = WatchView(directory)
    console = _console()
    with Live(view, console=console, refresh_per_second=2, transient=False) as live:
        for update in updates:
            view.add(update)
            for alert in update.alerts:
                live.console.print(Text(alert, style="bold red"))  # the style ends with the text, not the line
            live.refresh()
            writer.after(update)
            if update.ended:
                code = update.exit_code or 0
                break
        else:
            code = 0
    if update.ended:
        typer.echo(update.ended, err=True)
    return code


class _ReportWriter:
    """Rewrites the --report file every N finished steps and at the end, through a temporary file and a rename
    (a browser that reloads never sees half a file)."""

    def __init__(self, path: Path | None, every: int, wandb: Any = None) -> None:
        self.path = path
        self.every = every
        self.since = 0
        self.wandb = wandb  # --wandb: a WandbTarget, its run opened at the first finished step
        self.run: Any = None
        self.last: Any = None

    def after(self, update: Any) -> None:
        if self.wandb is not None and update.steps:
            if self.run is None:
                self.run = self.wandb.open("watch")
            for report in update.steps:  # a step revised after W&B took a later one is not logged again
                self.run.log_step(report.step, report.metrics, report.level)
        if update.result is not None:
            self.last = update.result
        if self.path is None or update.result is None:
            return
        self.since += len(update.steps)
        if self.since >= self.every or (update.ended and (self.since or not self.path.exists())):
            self.since = 0
            from rollout_diag.io.outputs import write_text
            from rollout_diag.report import render_report

            write_text(self.path, render_report(update.result, title=f"rollout-diag watch: {update.result.inputs[0]}"))

    def close(self) -> None:
        """The W&B run's summary (the run so far), the report as an artifact, and the run finished."""
        if self.run is None:
            return
        try:
            if self.last is not None:
                self.run.summarize(self.last)
            if self.path is not None and self.path.exists():
                self.run.attach_report(self.path)
        finally:
            self.run.finish()
        typer.echo(f"logged {self.wandb.scalars:,} scalars to W&B project {self.wandb.project}", err=True)


def main() -> NoReturn:
    """Console-script entry point."""
    # A narrow pipe (CI logs, `| less`) should not wrap tables into unreadable columns.
    if not sys.stdout.isatty() and "COLUMNS" not in os.environ:
        os.environ["COLUMNS"] = "160"
    try:
        app()
    except SystemExit as done:
        exit_now(done.code)
    exit_now(0)


if __name__ == "__main__":
    main()
