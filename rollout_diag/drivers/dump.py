"""The entry object of the library: a dump and how to read it, given once instead of option by option.

    dump = Dump(["run/"], columns={"rollout": "vllm_logprobs"}, device="cpu", workers=4)
    result = analyze(dump, top_k=50)
    comparison = compare_presets(dump, ["verl"])

Every library call that reads a dump (``analyze``, ``compare_presets``, ``threshold_sweep``, ``inspect_row``,
``check_run``, …) takes a :class:`Dump` where it takes file names, and reads the options it knows from it; an
option given both ways must agree. ``Dump.opened()`` reads the footers and resolves the columns at once (without
loading torch): the CLI does that first, so that a missing file or column fails in a fraction of a second.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TypeVar

from rollout_diag.errors import ConfigError, option_name

DEFAULT_CHUNK_TOKENS = 1 << 19  # = io.reader.DEFAULT_CHUNK_TOKENS (not imported: it would load pyarrow)
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Dump:
    """Files, globs or directories of one dump, with the options every reading call shares."""

    inputs: tuple[str, ...]
    columns: Mapping[str, str] = field(default_factory=dict)  # role -> column overrides
    input_format: str | None = None  # a name of io.formats.FORMAT_NAMES; None: detected
    trust_pickle: bool = False
    strict: bool = False  # any skipped row is an error
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    device: str = "auto"
    workers: int | str = "auto"  # a process count, or "auto": every core where the input splits
    backend: str = "process"
    # per-token engine: auto, numba (CPU kernels) or torch (any device); None: the process's (rollout_diag.kernels)
    engine: str | None = None
    # A reader opened ahead (``opened``), handed to the first call that reads: not part of the dump's identity.
    _reader: list = field(default_factory=list, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        given = self.inputs
        inputs = (given,) if isinstance(given, (str, Path)) else tuple(given)
        object.__setattr__(self, "inputs", tuple(str(path) for path in inputs))
        object.__setattr__(self, "columns", dict(self.columns or {}))
        from rollout_diag.kernels import check_engine  # light: numba loads only when a kernel first runs

        if self.engine is not None:
            check_engine(self.engine)
        if isinstance(self.workers, str) and self.workers.strip().isdigit():  # "4" from a command line
            object.__setattr__(self, "workers", int(self.workers))

    def open(self):
        """A DumpReader over the inputs: files found, footers read, columns resolved (torch is not loaded).
        Raises InputError / ColumnError for unreadable input, ConfigError for a bad option."""
        from rollout_diag.io.formats import DumpInputs
        from rollout_diag.io.reader import DumpReader

        return DumpReader(
            DumpInputs(list(self.inputs), self.input_format, self.trust_pickle),
            self.columns,
            strict=self.strict,
            chunk_tokens=self.chunk_tokens,
        )

    def opened(self) -> Dump:
        """This dump with its reader opened now (errors now); the next call that reads it uses that reader."""
        ready = replace(self)
        ready._reader.append(self.open())
        return ready

    def input_size(self) -> tuple[int, int] | None:
        """(tokens, rows) of the input, from the files' footers (``DumpReader.input_size``)."""
        return (self._reader[0] if self._reader else self.open()).input_size()

    def reader(self):
        """The reader opened ahead (once), else a new one."""
        return self._reader.pop() if self._reader else self.open()


_CALL_OPTIONS = tuple(
    f.name for f in fields(Dump) if f.name not in ("inputs", "input_format", "trust_pickle", "engine", "_reader")
)


def reads_dump(function: F) -> F:
    """Let ``function(inputs, …)`` take a :class:`Dump` as ``inputs``: the dump's options fill the keyword arguments
    the function has (an explicit one that disagrees is a ConfigError) and its reader replaces the file names."""
    accepted = set(inspect.signature(function).parameters)

    @functools.wraps(function)
    def wrapper(inputs: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(inputs, Dump):
            return function(inputs, *args, **kwargs)
        for name in _CALL_OPTIONS:
            if name not in accepted:
                continue
            value = getattr(inputs, name)
            if name in kwargs and kwargs[name] is not None and kwargs[name] != value:
                raise ConfigError(
                    f"{option_name(name)}={kwargs[name]!r} disagrees with the Dump's {name}={value!r}: give it once."
                )
            kwargs[name] = value
        from rollout_diag.kernels import use_engine

        with use_engine(inputs.engine):
            return function(inputs.reader(), *args, **kwargs)

    return wrapper  # type: ignore[return-value]
