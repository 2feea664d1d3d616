"""Trainer formats: which one an input is, which of its files to read, and how to open each.

Every format opens a file as something with the ``pyarrow.parquet.ParquetFile`` members the reader uses
(``schema_arrow``, ``metadata``, ``iter_batches``): Parquet as itself, the others as a
:class:`~rollout_diag.io.formats.base.RowsFile` of canonical sequence-layout batches. The reader does the
rest, the same for all.

| format    | what is read                                             | module        |
|-----------|----------------------------------------------------------|---------------|
| parquet   | ``*.parquet`` (rollout-diag's own layout, any columns)   | io/reader.py  |
| prime-rl  | ``token_exports/step_<N>/rank_<R>.jsonl`` (STABLE steps)  | prime_rl.py   |
| nemo-rl   | ``train_data_step<N>.jsonl``                             | nemo_rl.py    |
| slime     | ``<dump-details>/train_data/<rollout_id>.pt``            | slime.py      |
| skyrl     | ``dumped_data/global_step_<N>_training_input.pkl``       | skyrl.py      |
| verl      | pickled ``DataProto`` (``save_to_disk``) ``*.pkl``       | verl_pickle.py|
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rollout_diag.errors import ConfigError, InputError, option_name
from rollout_diag.io.formats import nemo_rl, prime_rl, safe_pickle, skyrl, slime, verl_pickle
from rollout_diag.io.formats.base import RowsFile, natural_key
from rollout_diag.io.sources import DirectoryWalker, Source, expand_inputs, refuse_remote

PARQUET = "parquet"
FORMAT_NAMES = (PARQUET, prime_rl.NAME, nemo_rl.NAME, slime.NAME, skyrl.NAME, verl_pickle.NAME)
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
        files = []
        for root, dirs, names in os.walk(path):  # symlinked directories are not followed: no loops
            dirs.sort()
            files += [(Path(root) / name, path) for name in sorted(names) if not name.startswith((".", "_"))]
        return files
    if path.exists():
        return [(path, None)]
    raise InputError(f"{given}: no such file or directory.")


def _first_record(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    record = json.loads(line)
                    return record if isinstance(record, dict) else None
    except (OSError, ValueError):
        return None
    return None


def format_of(path: Path) -> str | None:
    """The format one file belongs to, from its name and, where names do not tell, its first record."""
    name = path.name
    if name.endswith(".parquet"):
        return PARQUET
    if name.endswith(".jsonl"):
        if prime_rl.step_of(path) is not None and name.startswith("rank_"):
            return prime_rl.NAME
        if nemo_rl.step_of(path) is not None:
            return nemo_rl.NAME
        record = _first_record(path)
        if record is not None and prime_rl.looks_like(record):
            return prime_rl.NAME
        if record is not None and nemo_rl.looks_like(record):
            return nemo_rl.NAME
        return None
    if name.endswith(".pt"):
        return slime.NAME if path.parent.name != "rollout_data" else None
    if name.endswith(".pkl"):
        names = safe_pickle.global_names(str(path))
        if names & set(skyrl.MARKERS):
            return skyrl.NAME
        if names & set(verl_pickle.MARKERS):
            return verl_pickle.NAME
    return None


def resolve(
    inputs: Sequence[str], input_format: str | None = None, warnings: list[str] | None = None
) -> tuple[str, list[Source]]:
    """(format, files to read in order) for the user's inputs; what should be said is appended to ``warnings``.

    Parquet inputs expand exactly as before (``sources.expand_inputs``). Other formats: a directory
    contributes its files of the format, ordered by step then name. Raises InputError when nothing of a
    known format is found, or when inputs mix formats.
    """
    input_format = check_format(input_format)
    for given in inputs:
        refuse_remote(str(given))
    if input_format == PARQUET:
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
            raise InputError(
                f"{given}: {what} (nor token_exports/step_N/rank_R.jsonl, train_data_stepN.jsonl, "
                "train_data/N.pt, a SkyRL or verl *.pkl).",
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
    warnings: list[str] = []
    picked: list[Path] = []
    seen: set[str] = set()
    named: set[Path] = set()  # files the user named (not found in a directory)
    for path, root, detected in found:
        # forced: a file the user named, or one with the format's extension whose content did not tell
        taken = forced and (root is None or (detected is None and path.suffix == _SUFFIX[fmt]))
        if detected != fmt and not taken:
            continue
        key = str(path.resolve())
        if key not in seen:
            seen.add(key)
            picked.append(path)
            if root is None:
                named.add(path)
    if fmt == slime.NAME:
        train = [path for path in picked if slime.is_train_dump(path)]
        picked = train or picked
    if fmt == prime_rl.NAME:
        picked, warnings = _stable_steps(picked, named)
    if not picked:
        raise InputError(f"{', '.join(sorted({str(r or p) for p, r, _ in found}))}: no {fmt} file to read.")
    step_of = _STEP_OF[fmt]
    picked.sort(key=lambda path: (step_of(path) if step_of(path) is not None else -1, natural_key(path)))
    return [Source(path=str(path), partition={}) for path in picked], warnings


def _stable_steps(files: list[Path], named: set[Path]) -> tuple[list[Path], list[str]]:
    """prime-rl: keep files of step directories that carry the STABLE marker, and files the user named
    (with a warning when theirs lacks it); say which were left out."""
    kept, incomplete, warnings = [], set(), []
    for path in files:
        if (path.parent / prime_rl.STABLE_MARKER).exists():
            kept.append(path)
        elif path in named:
            kept.append(path)
            warnings.append(f"{path}: its directory has no STABLE marker; the step may be incomplete.")
        else:
            incomplete.add(path.parent)
    if incomplete:
        names = ", ".join(str(d) for d in sorted(incomplete, key=natural_key))
        warnings.append(
            f"{len(incomplete)} step director{'y' if len(incomplete) == 1 else 'ies'} without a STABLE marker "
            f"(still being written, or the run stopped mid-step) left out: {names}."
        )
    return kept, warnings


_SUFFIX = {
    prime_rl.NAME: ".jsonl",
    nemo_rl.NAME: ".jsonl",
    slime.NAME: ".pt",
    skyrl.NAME: ".pkl",
    verl_pickle.NAME: ".pkl",
}
_STEP_OF = {
    prime_rl.NAME: prime_rl.step_of,
    nemo_rl.NAME: nemo_rl.step_of,
    slime.NAME: slime.step_of,
    skyrl.NAME: skyrl.step_of,
    verl_pickle.NAME: verl_pickle.step_of,
}


# ------------------------------------------------------------------------------------ opening
def open_source(source: Source, fmt: str, trust_pickle: bool = False) -> Any:
    """The opened file: a ``pyarrow.parquet.ParquetFile`` for Parquet, a RowsFile for the others.

    Raises InputError (or the OSError / Arrow errors the reader turns into one) for an unreadable file.
    """
    path = source.path
    if fmt == PARQUET:
        import pyarrow.parquet as pq

        return pq.ParquetFile(path)
    opened: RowsFile
    if fmt == prime_rl.NAME:
        opened = prime_rl.open_file(path)
    elif fmt == nemo_rl.NAME:
        opened = nemo_rl.open_file(path)
    elif fmt == slime.NAME:
        opened = slime.open_file(path)
    elif fmt == skyrl.NAME:
        opened = skyrl.open_file(path, trust_pickle)
    else:
        opened = verl_pickle.open_file(path, trust_pickle)
    return opened


__all__ = ["FORMAT_NAMES", "PARQUET", "DumpInputs", "check_format", "format_of", "open_source", "resolve"]
