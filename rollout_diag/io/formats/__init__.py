"""Trainer formats: which one an input is, which of its files to read, and how to open each.

Every format opens a file as something with the ``pyarrow.parquet.ParquetFile`` members the reader uses
(``schema_arrow``, ``metadata``, ``iter_batches``): Parquet as itself, the others as a
:class:`~rollout_diag.io.formats.base.RowsFile` of canonical sequence-layout batches. The reader does the
rest, the same for all.

Parquet (``*.parquet``, rollout-diag's own layout, any columns) is the reader's own. Every other format is one
module of this package that registers itself (:mod:`rollout_diag.io.formats.registry`); its docstring says what
it reads. This module imports every module of the package, so a new format is one new module.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rollout_diag.errors import ConfigError, InputError, option_name
from rollout_diag.io.formats.base import ParquetSource
from rollout_diag.io.formats.registry import FORMATS, Peek, ordered
from rollout_diag.io.sources import DirectoryWalker, Source, expand_inputs, refuse_remote
from rollout_diag.io.storage import is_remote
from rollout_diag.paths import natural_key

for _module in pkgutil.iter_modules(__path__):  # each format module registers itself when imported
    importlib.import_module(f"{__name__}.{_module.name}")

PARQUET = "parquet"
FORMAT_NAMES = (PARQUET, *(trainer_format.name for trainer_format in ordered()))
_GLOB_CHARS = set("*?[")


class DumpInputs(list):
    """Input paths (files, globs, directories) plus how to read them: a ``list[str]`` that every API
    taking inputs accepts. ``input_format`` None detects the format; ``trust_pickle`` lifts the pickle
    allowlist (unpickling an untrusted file can run code)."""

    def __init__(
        self, paths: Iterable[str | Path | Source], input_format: str | None = None, trust_pickle: bool = False
    ):
        # Sources (files another reader resolved) pass as they are: a worker's reader expands nothing again.
        super().__init__(path if isinstance(path, Source) else str(path) for path in paths)
        self.input_format = check_format(input_format)
        self.trust_pickle = trust_pickle


def check_format(name: str | None) -> str | None:
    """``name`` when it is a known format (or None); raises ConfigError."""
    if name is not None and name not in FORMAT_NAMES:
        raise ConfigError(f"{option_name('input_format')}={name}: unknown format. Formats: {', '.join(FORMAT_NAMES)}.")
    return name


def input_options(inputs: Any) -> tuple[str | None, bool]:
    """(format, trust_pickle) carried by ``inputs`` when it is a :class:`DumpInputs`, else (None, False)."""
    return getattr(inputs, "input_format", None), bool(getattr(inputs, "trust_pickle", False))


# ------------------------------------------------------------------------------------ detection
def _candidates(given: str) -> list[tuple[Path, Path | None]]:
    """(file, the directory or glob root it was found under) for one input; raises InputError."""
    if _GLOB_CHARS & set(given) and not Path(given).exists():  # an existing path is taken as it is
        # the loop-safe glob of io/sources (plain glob.glob with ** runs forever over a symlink loop); the
        # warnings about skipped loops are said when the chosen format's files are expanded
        matches = [str(match) for match in DirectoryWalker(None).glob(given)]
        if not matches:
            raise InputError(f"{given}: no file matches this pattern.")
        found: list[tuple[Path, Path | None]] = []
        for match in matches:
            found += _candidates(match) if Path(match).is_dir() else [(Path(match), None)]
        return found
    path = Path(given)
    if path.is_dir():
        files: list[tuple[Path, Path | None]] = []
        for root, dirs, names in os.walk(path):  # symlinked directories are not followed: no loops
            dirs.sort()
            files += [(Path(root) / name, path) for name in sorted(names) if not name.startswith((".", "_"))]
        return files
    if path.exists():
        return [(path, None)]
    raise InputError(f"{given}: no such file or directory.")


def format_of(path: Path) -> str | None:
    """The format one file belongs to, from its name and, where names do not tell, its content."""
    if path.name.endswith(".parquet"):
        return PARQUET
    candidates = [trainer_format for trainer_format in ordered() if path.name.endswith(trainer_format.suffix)]
    for trainer_format in candidates:
        if trainer_format.by_name(path):
            return trainer_format.name
    peek = Peek(path)
    for trainer_format in candidates:
        if trainer_format.by_content(path, peek):
            return trainer_format.name
    return None


def step_of(fmt: str, path: Path) -> int | None:
    """The step a file of trainer format ``fmt`` holds, from its path (None when the path does not say)."""
    return FORMATS[fmt].step_of(path)


def resolve(
    inputs: Sequence[str], input_format: str | None = None, warnings: list[str] | None = None
) -> tuple[str, list[Source]]:
    """(format, files to read in order) for the user's inputs; what should be said is appended to ``warnings``.

    Parquet inputs expand exactly as before (``sources.expand_inputs``), and so do inputs on object storage (read as
    Parquet only). Other formats: a directory contributes its files of the format, ordered by step then name. Raises
    InputError when nothing of a known format is found, or when inputs mix formats.
    """
    input_format = check_format(input_format)
    for given in inputs:
        refuse_remote(str(given))
    remote = next((str(given) for given in inputs if is_remote(str(given))), None)
    if remote is not None and input_format not in (None, PARQUET):
        raise InputError(f"{remote}: {input_format} files are read from local paths; object storage only as Parquet.")
    if input_format == PARQUET or remote is not None:
        return PARQUET, expand_inputs(inputs, warnings)
    found: list[tuple[Path, Path | None, str | None]] = []
    for given in inputs:
        candidates = _candidates(str(given))
        # A file named alone whose format nothing tells is read as Parquet, as it always was.
        detected = [(path, root, format_of(path) or (PARQUET if root is None else None)) for path, root in candidates]
        if input_format is None and any(fmt == PARQUET for *_, fmt in detected):
            found += [(Path(given), None, PARQUET)]  # Parquet inputs keep their own expansion
            continue
        if input_format is None and not any(fmt for *_, fmt in detected):
            what = "directory holds no .parquet file" if Path(given).is_dir() else "not a dump of a known format"
            described = ", ".join(trainer_format.described for trainer_format in ordered())
            raise InputError(
                f"{given}: {what} (nor {described}).",
                hint=f"name the format with {option_name('input_format')} ({', '.join(FORMAT_NAMES)}).",
            )
        found += detected
    formats = {fmt for *_, fmt in found if fmt is not None} if input_format is None else {input_format}
    if len(formats) > 1:
        examples = {fmt: str(path) for path, _, fmt in reversed(found) if fmt is not None}
        listed = "; ".join(f"{path} is {fmt}" for fmt, path in sorted(examples.items()))
        raise InputError(f"inputs mix formats ({listed}); analyse them separately.")
    (chosen,) = formats
    if chosen == PARQUET:
        return PARQUET, expand_inputs([str(path) for path, *_ in found], warnings)
    sources, notes = _select(chosen, found, forced=input_format is not None)
    if warnings is not None:
        warnings.extend(notes)
    return chosen, sources


def _select(
    fmt: str, found: list[tuple[Path, Path | None, str | None]], forced: bool
) -> tuple[list[Source], list[str]]:
    picked: list[Path] = []
    seen: set[str] = set()
    named: set[Path] = set()  # files the user named (not found in a directory)
    for path, root, detected in found:
        # forced: a file the user named, or one with the format's extension whose content did not tell
        taken = forced and (root is None or (detected is None and path.suffix == FORMATS[fmt].suffix))
        if detected != fmt and not taken:
            continue
        key = str(path.resolve())
        if key not in seen:
            seen.add(key)
            picked.append(path)
            if root is None:
                named.add(path)
    picked, warnings = FORMATS[fmt].select(picked, named)
    if not picked:
        raise InputError(f"{', '.join(sorted({str(r or p) for p, r, _ in found}))}: no {fmt} file to read.")
    step = FORMATS[fmt].step_of
    picked.sort(key=lambda path: (step(path) if step(path) is not None else -1, natural_key(path)))
    return [Source(path=str(path), partition={}) for path in picked], warnings


# ------------------------------------------------------------------------------------ opening
def open_source(source: Source, fmt: str, trust_pickle: bool = False) -> Any:
    """The opened file: a ParquetSource (its footer) for Parquet, a RowsFile for the others.

    Raises InputError (or the OSError / Arrow errors the reader turns into one) for an unreadable file.
    """
    path = source.path
    if fmt == PARQUET:
        return ParquetSource(path)
    return FORMATS[fmt].open_file(path, trust_pickle)


__all__ = ["FORMAT_NAMES", "PARQUET", "DumpInputs", "check_format", "format_of", "open_source", "resolve", "step_of"]
