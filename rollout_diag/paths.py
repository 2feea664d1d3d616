"""How tables name input files: the shortest trailing part of their paths that tells the input files apart.

A directory dump (``step=3/rank-0.parquet``, ``step=4/rank-0.parquet``, …) needs its parent directories to tell
its files apart; a flat list of files needs only their names. ``inspect --row`` accepts any such suffix back.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import PurePath

_DIGITS = re.compile(r"(\d+)")


def natural_key(path: str | PurePath) -> tuple[list[str | int], str]:
    """Sort key that puts ``step=2`` before ``step=10``: the path's runs of digits compare as numbers (the split
    alternates text and digits, so like compares with like), then the path itself (``step=01`` and ``step=1``)."""
    text = str(path)
    return [int(part) if index % 2 else part for index, part in enumerate(_DIGITS.split(text))], text


def _parts(path: str) -> tuple[str, ...]:
    return PurePath(path.replace("\\", "/")).parts


def file_labels(files: Sequence[str]) -> dict[str, str]:
    """Each file -> its last ``k`` path components, with the smallest ``k`` that tells all ``files`` apart (the
    same ``k`` for every file, so that a directory dump's labels line up: ``step=3/rank-0.parquet``)."""
    parts = {file: _parts(file) for file in files}
    longest = max((len(p) for p in parts.values()), default=1)
    for length in range(1, longest + 1):
        labels = {file: "/".join(p[-length:]) for file, p in parts.items()}
        if len(set(labels.values())) == len(labels):
            return labels
    return {file: file for file in files}


def inputs_label(files: Sequence[str]) -> str:
    """One name for a command's input files: the file itself; for several files under one directory (a directory
    dump, or files named one by one beside each other), that directory and the count, ``run/ (8 files)``, not the
    first file (which names one step and rank of the run); otherwise the first file's label and how many more."""
    if not files:
        return ""
    if len(files) == 1:
        return files[0]
    parents = [_parts(file)[:-1] for file in files]
    common: list[str] = []
    for level in zip(*parents, strict=False):  # as deep as the shallowest file
        if len(set(level)) != 1:
            break
        common.append(level[0])
    if common and common != ["/"]:
        return f"{PurePath(*common).as_posix().rstrip('/')}/ ({len(files)} files)"
    return f"{file_labels(files)[files[0]] or files[0]} and {len(files) - 1} more"


def file_label(file: str, files: Sequence[str]) -> str:
    """``file``'s label among ``files`` (its name alone when ``files`` does not list it)."""
    return file_labels([*files, file] if file not in files else files)[file]


def names_file(label: str, file: str) -> bool:
    """Whether ``label`` (a label as tables print it, or a path) ends ``file`` component by component."""
    wanted = _parts(label)
    return bool(wanted) and _parts(file)[-len(wanted) :] == wanted
