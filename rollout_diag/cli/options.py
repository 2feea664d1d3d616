"""Every option of the command line, declared once: the formats, the option types several commands share
(``Annotated`` aliases), and the option groups (frozen dataclasses whose fields are options: the reading options and
the ``Dump`` built from them, the presets, analyze's knobs, the row selection, the gates, the exports). Where each
command shows them is its ``@command`` layout (``rollout_diag.cli.layout``)."""

from __future__ import annotations

import dataclasses
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from rollout_diag.drivers.dump import DEFAULT_CHUNK_TOKENS as CHUNK_TOKENS  # dump.py loads no pyarrow: light --help
from rollout_diag.process import open_for_reading

if TYPE_CHECKING:
    from rollout_diag.decisions.check import Gate
    from rollout_diag.drivers.dump import Dump
    from rollout_diag.export.wandb import WandbTarget
    from rollout_diag.presets import Preset


def argument(help: str, metavar: str) -> Any:
    """A command's argument (its dumps, its directory) as ``--help`` shows them: named by ``metavar``, no default."""
    return typer.Argument(help=help, show_default=False, metavar=metavar)


# Shared option types (one definition, used by every command).
Inputs = Annotated[
    list[Path],
    argument(
        "Dump(s): Parquet, or what prime-rl, NeMo-RL, slime, SkyRL or verl wrote (README, 'Where is my dump?'); "
        "files, globs or directories (hive partitions like step=3/ work).",
        "FILE",
    ),
]


class OutputFormat(str, Enum):
    """sweep's formats (and those an --output extension chooses)."""

    table = "table"
    json = "json"
    csv = "csv"


FormatOpt = Annotated[
    OutputFormat | None,
    typer.Option(
        "--format",
        "-f",
        help="table (terminal), json or csv. Default: from the --output extension (.json, .csv; any other "
        "a table), else table.",
    ),
]


class DataFormat(str, Enum):
    """analyze and compare-presets: OutputFormat plus parquet."""

    table = "table"
    json = "json"
    csv = "csv"
    parquet = "parquet"


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


class RowFormat(str, Enum):
    """inspect, check, diff: one result, as a table or a JSON document."""

    table = "table"
    json = "json"


RowFormatOpt = Annotated[RowFormat, typer.Option("--format", "-f", help="table (terminal) or json.")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show Python tracebacks for errors.")]
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


def parse_targets(text: str) -> list[float]:
    """--target's shares; raises ConfigError."""
    from rollout_diag.errors import ConfigError

    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"--target {text}: expected comma-separated shares, e.g. 0.001,0.01,0.05.") from None


ReplicatesOpt = Annotated[int, typer.Option("--replicates", help="Bootstrap resamples of the rows.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the bootstrap (same seed, same interval).")]
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


def custom(flag: str, help: str, metavar: str | None = None) -> Any:
    """An option of the one custom preset compare-presets and report may add (verl's settings, one flag each)."""
    return typer.Option(flag, help=f"Custom preset: {help}", metavar=metavar)


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
    rollout_is: Annotated[str | None, custom("--rollout-is", "IS level, token or sequence.", "LEVEL")] = None
    rollout_is_threshold: Annotated[
        str | None, custom("--rollout-is-threshold", "U (truncation) or L_U (IcePop).", "SPEC")
    ] = None
    rollout_rs: Annotated[str | None, custom("--rollout-rs", "RS options, e.g. seq_mean_k3,token_k1.", "OPTIONS")] = (
        None
    )
    rollout_rs_threshold: Annotated[
        str | None, custom("--rollout-rs-threshold", "one threshold per RS option (or one shared).", "SPECS")
    ] = None
    batch_normalize: Annotated[bool, custom("--batch-normalize", "normalise IS weights per batch.")] = False

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


def grouping(help: str) -> Any:
    """A --by option (a per-row column, or a number bucketed: COLUMN:sign, COLUMN:bins=E1,E2), with what its
    groups are for (``help``): analyze's and compare-presets' metrics per group, check's gates, diff's intervals."""
    return typer.Option("--by", help=help, metavar="COLUMN[:sign|:bins=E1,E2]")


@dataclasses.dataclass(frozen=True)
class Selection:
    """--by, --where, --steps of analyze, compare-presets and report: which rows, and their groups."""

    by: Annotated[
        list[str] | None,
        grouping(
            "Key metrics per group of rows: a per-row column (env_name, reward, a data-source tag) or a derived "
            "one (response_length, num_rounds); numbers can be bucketed: COLUMN:sign or COLUMN:bins=E1,E2,... "
            "Repeatable (each is its own grouping). README, 'Which environment diverges?'."
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
class Gates:
    """--max, --min, --gates of check and watch: the gates a run must pass."""

    max_: Annotated[
        list[str] | None,
        typer.Option(
            "--max",
            help="Gate: the metric must be ≤ VALUE (full name, e.g. rollout_corr/k3_kl=1e-3, or the short name "
            "the tables print when only one metric has it, e.g. k3_kl=1e-3). Repeatable.",
            metavar="NAME=VALUE",
        ),
    ] = None
    min_: Annotated[
        list[str] | None,
        typer.Option("--min", help="Gate: the metric must be ≥ VALUE. Repeatable.", metavar="NAME=VALUE"),
    ] = None
    gates: Annotated[
        str | None,
        typer.Option(
            "--gates",
            help="Gates from a TOML/YAML/JSON file, or 'default' (public CI bounds; docs/gates.md).",
            metavar="FILE|default",
        ),
    ] = None

    def file(self) -> str | None:
        """The gates file the command reads (None for none or 'default')."""
        return self.gates if self.gates != "default" else None

    def chosen(self) -> list[Gate]:
        """The gates of --gates, --max and --min, in that order; raises ConfigError."""
        from rollout_diag.decisions.check import load_gates, parse_gate

        return [
            *(load_gates(self.gates) if self.gates else []),
            *(parse_gate(text, "max") for text in self.max_ or []),
            *(parse_gate(text, "min") for text in self.min_ or []),
        ]


@dataclasses.dataclass(frozen=True)
class Logging:
    """--tensorboard and --wandb: the result also in a TensorBoard log directory and a Weights & Biases project
    (rollout_diag/export/tensorboard.py, rollout_diag/export/wandb.py)."""

    tensorboard: Annotated[
        Path | None,
        typer.Option(
            "--tensorboard",
            help="Also write every per-step metric as a TensorBoard scalar under its verl name (global step = the "
            "dump's step) into this log directory, with rollout_diag/alert (0 ok, 1 watch, 2 bad) per step; each --by "
            "group and each preset as a run (a sub-directory), so that they overlay on one chart. Needs "
            "pip install 'rollout-diag[tensorboard]'.",
            metavar="DIR",
        ),
    ] = None
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
        """Before any reading: tensorboard and wandb are installed where asked for (ConfigError saying what to
        install: a missing package fails before the reading, not after), the options make sense."""
        if self.tensorboard is not None:
            from rollout_diag.export.tensorboard import writer_class

            writer_class()
        if self.wandb is None:
            from rollout_diag.errors import ConfigError

            if self.wandb_group is not None or self.wandb_run_id is not None:
                raise ConfigError("--wandb-group and --wandb-run-id go with --wandb PROJECT.")
            return
        from rollout_diag.export.wandb import wandb_module

        wandb_module()

    def log(self, result: Any, report: Path | None = None) -> None:
        """``result`` to TensorBoard and W&B (nothing without --tensorboard and --wandb), a line on stderr each."""
        if self.tensorboard is not None:
            from rollout_diag.export.tensorboard import write_tensorboard

            count = write_tensorboard(result, self.tensorboard)
            typer.echo(f"wrote {count:,} TensorBoard scalars to {self.tensorboard}", err=True)
        if self.wandb is None:
            return
        from rollout_diag.export.wandb import log_to_wandb

        target = log_to_wandb(result, self.wandb, group=self.wandb_group, run_id=self.wandb_run_id, report=report)
        names = [name for name, _ in target.runs]
        runs = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        typer.echo(
            f"logged {target.scalars:,} scalars to W&B project {self.wandb}, group {target.group}: {runs}", err=True
        )

    def log_runs(self, result: Any, report: Path | None) -> None:
        """``runs``' result to W&B, each run a W&B run of one group (nothing without --wandb)."""
        if self.wandb is None:
            return
        from rollout_diag.export.wandb import log_runs_to_wandb

        target = log_runs_to_wandb(result, self.wandb, group=self.wandb_group, report=report)
        typer.echo(f"logged {target.scalars:,} scalars to W&B project {self.wandb}, group {target.group}", err=True)

    def target(self) -> WandbTarget | None:
        """The W&B target of a command that logs as it goes (watch); None without --wandb."""
        if self.wandb is None:
            return None
        from rollout_diag.export.wandb import WandbTarget

        return WandbTarget(self.wandb, self.wandb_group, self.wandb_run_id)


OPTION_GROUPS = (Reading, PresetChoice, AnalysisKnobs, Selection, Gates, Logging)
