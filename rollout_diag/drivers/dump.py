"""The entry object of the library: a dump and how to read it, given once instead of option by option.

    dump = Dump(["run/"], columns={"rollout": "vllm_logprobs"}, device="cpu", workers=4)
    result = analyze(dump, top_k=50)
    comparison = compare_presets(dump, ["verl"])

Every library call that reads a dump (``analyze``, ``compare_presets``, ``threshold_sweep``, ``inspect_row``,
``check_run``, ``diff_runs``, ``watch``, ``convert``, …) takes a :class:`Dump` where it takes file names, and reads the
options it knows from it; an option given both ways must agree, and an option set that the call cannot honour
(``workers=4`` for a call that reads in one process) is a ConfigError, never silently ignored. ``Dump.opened()`` reads
the footers and resolves the columns at once (without loading torch): the CLI does that first, so that a missing file
or column fails in a fraction of a second.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeAlias, TypeVar

from rollout_diag.errors import ConfigError, option_name

DEFAULT_CHUNK_TOKENS = 1 << 20  # = io.reader.DEFAULT_CHUNK_TOKENS (not imported: it would load pyarrow)
# Chunks of the passes with presets (compare-presets, report): each chunk costs the ~26 preset accumulators a fixed
# ~20 ms of bookkeeping, twice analyze's. On 100M tokens, 2M against 1M: compare-presets wall 0.92 and report 0.93
# (peaks 456 -> 584 and 506 -> 651 MiB), 10M 0.99; 4M against 2M 1.006; analyze 1.00 (so it keeps 1M: +115 MiB for
# nothing). docs/benchmarks.md, issue 20 session 11.
PRESET_CHUNK_TOKENS = 1 << 21
P = ParamSpec("P")
R = TypeVar("R")

if TYPE_CHECKING:
    from rollout_diag.io.reader import DumpReader
    from rollout_diag.io.tokenizer import TokenDecoder

# Files, globs or directories (a DumpInputs carries the trainer format), or a DumpReader opened over them: what a
# reading call takes besides a Dump.
Inputs: TypeAlias = "str | Path | Sequence[str | Path] | DumpReader"


@dataclass(frozen=True)
class Dump:
    """Files, globs or directories of one dump, with the options every reading call shares."""

    inputs: tuple[str, ...]
    columns: Mapping[str, str] = field(default_factory=dict)  # role -> column overrides
    input_format: str | None = None  # a name of io.formats.FORMAT_NAMES; None: detected
    trust_pickle: bool = False
    strict: bool = False  # any skipped row is an error
    # None: each call's own size (DEFAULT_CHUNK_TOKENS; PRESET_CHUNK_TOKENS for compare_presets and the report's
    # analyze_and_compare), or the size of a reader that already reads ahead (``opened(read_ahead=True)``)
    chunk_tokens: int | None = None
    device: str = "auto"
    workers: int | str = "auto"  # a process count, or "auto": every core where the input splits
    backend: str = "process"
    # per-token engine: auto, numba (CPU kernels) or torch (any device); None: the process's (engine/choice.py)
    engine: str | None = None
    # token ids shown as text (rollout_diag/io/tokenizer.py): a tokenizer.json, a model directory or a cached model
    # name, loaded when the Dump is made (an error now, not after the reading); a call that shows no token ignores it
    tokenizer: str | Path | TokenDecoder | None = None
    # A reader opened ahead (``opened``), handed to the first call that reads: not part of the dump's identity.
    _reader: list[DumpReader] = field(default_factory=list, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        given = self.inputs
        inputs = (given,) if isinstance(given, (str, Path)) else tuple(given)
        object.__setattr__(self, "inputs", tuple(str(path) for path in inputs))
        object.__setattr__(self, "columns", dict(self.columns or {}))
        from rollout_diag.engine.choice import check_engine  # light: numba loads only when a kernel first runs

        if self.engine is not None:
            check_engine(self.engine)
        if self.tokenizer is not None:
            from rollout_diag.io.tokenizer import load_tokenizer

            object.__setattr__(self, "tokenizer", load_tokenizer(self.tokenizer))
        if isinstance(self.workers, str) and self.workers.strip().isdigit():  # "4" from a command line
            object.__setattr__(self, "workers", int(self.workers))

    def open(self) -> DumpReader:
        """A DumpReader over the inputs: files found, footers read, columns resolved (torch is not loaded); chunks of
        ``chunk_tokens`` tokens, or DEFAULT_CHUNK_TOKENS where that is None (a call that reads it sets its own size:
        :meth:`reader`). Raises InputError / ColumnError for unreadable input, ConfigError for a bad option."""
        from rollout_diag.io.formats import DumpInputs
        from rollout_diag.io.reader import DumpReader

        return DumpReader(
            DumpInputs(list(self.inputs), self.input_format, self.trust_pickle),
            self.columns,
            strict=self.strict,
            chunk_tokens=DEFAULT_CHUNK_TOKENS if self.chunk_tokens is None else self.chunk_tokens,
        )

    def opened(self, read_ahead: bool = False, numpy: bool = False) -> Dump:
        """This dump with its reader opened now (errors now); the next call that reads it uses that reader.
        ``read_ahead``: the reader also starts reading now, while the command's modules load, where the call will
        read the whole input in this process with the numba engine on the CPU (:func:`reads_ahead`; the CLI's
        analyze, compare-presets, report and check: decoding and the compiled passes overlap the imports).
        ``numpy``: the call reads numpy chunks (analyze, check, compare-presets, report, sweep: ``DumpReader.chunks``),
        the kernels at any size."""
        ready = replace(self)
        reader = self.open()
        if read_ahead and reads_ahead(self, reader, numpy):
            reader.read_ahead(read_ahead_depth(reader.chunk_tokens))
        ready.hold(reader)
        return ready

    def hold(self, reader: DumpReader) -> None:
        """Hand ``reader`` (opened from this dump, not read yet) to the next call that reads the dump."""
        self._reader.append(reader)

    def input_size(self) -> tuple[int, int] | None:
        """(tokens, rows) of the input, from the files' footers (``DumpReader.input_size``)."""
        return (self._reader[0] if self._reader else self.open()).input_size()

    def reader(self, chunk_tokens: int | None = None) -> DumpReader:
        """The reader opened ahead (once), else a new one. ``chunk_tokens``: the calling function's size, taken where
        the dump leaves the size to the call and the reader has not started reading ahead."""
        reader = self._reader.pop() if self._reader else self.open()
        if self.chunk_tokens is None and chunk_tokens is not None and not reader.reads_ahead:
            reader.resize(chunk_tokens)
        return reader


# Memory for the chunks read ahead while the command's modules load: ~17 bytes a token (the scanned float64 values and
# the mask), so 384 MiB hold 45 chunks of the default size, more than the reader gets through while torch (where it
# was loaded) and the command's modules loaded (~2 s on two cores; on a loaded machine the reader filled 22 first).
READ_AHEAD_BYTES = 384 << 20
READ_AHEAD_MAX_CHUNKS = 64


def read_ahead_depth(chunk_tokens: int) -> int:
    """How many chunks of ``chunk_tokens`` tokens the reader keeps while it reads ahead."""
    return max(1, min(READ_AHEAD_MAX_CHUNKS, READ_AHEAD_BYTES // (17 * max(1, int(chunk_tokens)))))


def reads_ahead(dump: Dump, reader: DumpReader, numpy: bool = False) -> bool:
    """Whether a call on ``dump`` reads ``reader`` whole in this process with the numba engine on the CPU, decided
    without loading torch: the engine the chunks get (``kernel_for``; ``numpy``: numpy chunks, the kernels
    at any size), a device that is the CPU (``auto`` on
    a build of torch without CUDA or ROCm), one process (``distributed.resolve_workers``). Anything unsure: False
    (the reading then starts when the call reads, as without reading ahead)."""
    from rollout_diag.engine.choice import kernel_for, use_engine

    if dump.device != "cpu" and not (dump.device == "auto" and not torch_may_use_a_gpu()):
        return False
    if reader.parts is not None or reader.selection is not None or not _one_process(dump.workers, reader):
        return False
    try:
        with use_engine(dump.engine):
            return kernel_for("cpu", None if numpy else reader.input_size())
    except ConfigError:  # raised again where the call reads, in its place among the call's errors
        return False


def _one_process(workers: int | str, reader: DumpReader) -> bool:
    """``distributed.resolve_workers(workers, reader, cpu) == 1`` without loading torch
    (tests/io/test_reader_read_ahead.py compares the two)."""
    from rollout_diag.cores import auto_cpu_workers

    if workers != "auto":
        return isinstance(workers, int) and not isinstance(workers, bool) and workers == 1
    return auto_cpu_workers(reader) == 1


def torch_may_use_a_gpu() -> bool:
    """False only where the installed torch is known to be built without CUDA and ROCm (its ``version.py`` says
    ``cuda = None`` and ``hip = None``), so that ``device="auto"`` is the CPU; read without importing torch."""
    import importlib.util
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "cuda"):
        return bool(torch.cuda.is_available())
    try:
        spec = importlib.util.find_spec("torch")
        locations = None if spec is None else spec.submodule_search_locations
        if not locations:
            return True
        text = (Path(next(iter(locations))) / "version.py").read_text(encoding="utf-8")
    except (ImportError, OSError, ValueError, UnicodeDecodeError):
        return True
    return not built_without_gpu(text)


def built_without_gpu(version_py: str) -> bool:
    """Whether torch's ``version.py`` text says the build has neither CUDA nor ROCm."""
    import re

    return all(re.search(rf"^{name}\s*(:[^=\n]*)?=\s*None\s*$", version_py, re.MULTILINE) for name in ("cuda", "hip"))


# The options a call takes from a Dump as keyword arguments; the others reach it through the reader (input_format,
# trust_pickle), the engine in use (engine) or, for a call that shows tokens, its own argument (tokenizer).
CALL_OPTIONS = tuple(
    f.name
    for f in fields(Dump)
    if f.name not in ("inputs", "input_format", "trust_pickle", "engine", "tokenizer", "_reader")
)
_DEFAULTS = {
    f.name: f.default_factory() if f.default_factory is not MISSING else f.default
    for f in fields(Dump)
    if f.init and f.name != "inputs"
}
# Why a call without the option cannot honour a value other than its default (a value it would silently ignore).
_WHY = {
    "workers": "it reads in one process (1 or auto)",
    "backend": "it reads in one process",
    "strict": "it reads only the row groups that can hold the row",
    "engine": "it reads with the process's engine",
}


def call_options(
    dump: Dump,
    call: str,
    accepted: Collection[str],
    given: Mapping[str, Any] | None = None,
    names: Sequence[str] = CALL_OPTIONS,
) -> dict[str, Any]:
    """The keyword arguments ``call`` takes from ``dump``'s options ``names``: each one ``call`` accepts
    (``accepted``) and the dump sets (None: the call's own). Raises ConfigError where ``given`` (the call's explicit
    arguments) holds another value, or where the dump sets an option ``call`` has no argument for to anything but its
    default (``workers`` 1 or auto: one process), which would be silently ignored."""
    given = given or {}
    options: dict[str, Any] = {}
    for name in names:
        value = getattr(dump, name)
        if name not in accepted:
            if value != _DEFAULTS[name] and not (name == "workers" and value == 1):
                why = _WHY.get(name, "it takes no such option")
                raise ConfigError(
                    f"{option_name(name)}={value!r}: {call} cannot honour it, {why}.",
                    hint=f"leave the Dump's {name} at {_DEFAULTS[name]!r}.",
                )
            continue
        if value is None:  # chunk_tokens: the call's own
            continue
        if given.get(name) is not None and given[name] != value:
            raise ConfigError(
                f"{option_name(name)}={given[name]!r} disagrees with the Dump's {name}={value!r}: give it once."
            )
        options[name] = value
    return options


def reads_dump(function: Callable[Concatenate[Inputs, P], R]) -> Callable[Concatenate[Inputs | Dump, P], R]:
    """Let ``function(inputs, …)`` take a :class:`Dump` as ``inputs``: the dump's options fill the keyword arguments
    the function has (:func:`call_options`: an explicit one that disagrees, or an option set that the function cannot
    honour, is a ConfigError) and its reader replaces the file names."""
    parameters = inspect.signature(function).parameters
    accepted = set(parameters)
    chunk_default = parameters["chunk_tokens"].default if "chunk_tokens" in parameters else None

    @functools.wraps(function)
    def wrapper(inputs: Inputs | Dump, /, *args: P.args, **kwargs: P.kwargs) -> R:
        if not isinstance(inputs, Dump):
            return function(inputs, *args, **kwargs)
        kwargs.update(call_options(inputs, function.__name__, accepted, kwargs))
        if "tokenizer" in accepted and inputs.tokenizer is not None:  # a call that shows tokens
            if kwargs.get("tokenizer") is not None and kwargs["tokenizer"] is not inputs.tokenizer:
                raise ConfigError(f"{option_name('tokenizer')} given both to the Dump and the call: give it once.")
            kwargs["tokenizer"] = inputs.tokenizer
        from rollout_diag.engine.choice import use_engine

        size = kwargs.get("chunk_tokens")
        if size is None:
            reader = inputs.reader(chunk_default)
        else:
            from rollout_diag.io.reader import checked_chunk_tokens

            reader = inputs.reader(checked_chunk_tokens(size))
        if "chunk_tokens" in accepted and size is None:
            kwargs["chunk_tokens"] = reader.chunk_tokens
        with use_engine(inputs.engine):
            return function(reader, *args, **kwargs)

    return wrapper
