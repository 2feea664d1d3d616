"""Turn what the user typed (files, globs, directories) into an ordered list of Parquet files."""

from __future__ import annotations

import glob
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from rollout_diag.errors import InputError

_GLOB_CHARS = set("*?[")


@dataclass(frozen=True)
class Source:
    """One Parquet file and the hive partition values its path carries (``step=12/part-0.parquet``)."""

    path: str
    partition: dict[str, int | str]


def _partition_value(text: str) -> int | str:
    try:
        return int(text)
    except ValueError:
        return text


def _partition_keys(path: Path, root: Path | None) -> dict[str, int | str]:
    # The root's own name counts: `analyze run/step=3` and `analyze 'run/step=*'` name partition directories.
    parts = (root.name, *path.relative_to(root).parts[:-1]) if root is not None else path.parts[:-1]
    keys: dict[str, int | str] = {}
    for part in parts:
        key, sep, value = part.partition("=")
        if sep and key and value:
            keys[key] = _partition_value(value)
    return keys


def _is_data_file(path: Path) -> bool:
    # Spark/Hive markers (_SUCCESS, .crc, _metadata) sit beside the data files.
    return path.is_file() and not path.name.startswith((".", "_"))


def expand_inputs(inputs: Iterable[str | Path]) -> list[Source]:
    """Resolve inputs in the order given; a directory contributes its ``*.parquet`` files, sorted.

    Raises InputError for a path that does not exist, a glob that matches nothing or an empty directory.
    """
    sources: list[Source] = []
    seen: set[str] = set()

    def add(path: Path, root: Path | None) -> None:
        key = str(path.resolve())
        if key not in seen:
            seen.add(key)
            sources.append(Source(path=str(path), partition=_partition_keys(path, root)))

    for given in inputs:
        text = str(given)
        if _GLOB_CHARS & set(text):
            matches = sorted(glob.glob(text, recursive=True))
            if not matches:
                raise InputError(f"{text}: no file matches this pattern.")
            for match in matches:
                match_path = Path(match)
                if match_path.is_dir():
                    for inner in sorted(match_path.rglob("*.parquet")):
                        if _is_data_file(inner):
                            add(inner, match_path)
                else:
                    add(match_path, None)
            continue
        path = Path(text)
        if path.is_dir():
            found = [p for p in sorted(path.rglob("*.parquet")) if _is_data_file(p)]
            if not found:
                raise InputError(f"{text}: directory holds no .parquet file.")
            for inner in found:
                add(inner, path)
        elif path.exists():
            add(path, None)
        else:
            raise InputError(f"{text}: no such file or directory.")
    if not sources:
        raise InputError("no input file given.")
    return sources
