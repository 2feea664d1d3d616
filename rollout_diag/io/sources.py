"""Turn what the user typed (files, globs, directories) into an ordered list of Parquet files."""

from __future__ import annotations

import errno
import fnmatch
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePath

from rollout_diag.errors import InputError
from rollout_diag.io import storage
from rollout_diag.paths import natural_key

_GLOB_CHARS = set("*?[")
# step=<N>/_COMPLETE-rank-<R>: rank R has written its file of step N (io/writer.py writes it, watch reads it: here,
# where the watcher finds it without loading the writer's torch)
COMPLETE_PREFIX = "_COMPLETE-rank-"
# s3://, gs://, hf://, https://, file:// (a pathlib.Path, as the CLI hands them over, folds "//" into "/")
_URI = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):/+(.*)", re.DOTALL)


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


def _partition_keys(path: PurePath, root: PurePath | None) -> dict[str, int | str]:
    # The root's own name counts: `analyze run/step=3` and `analyze 'run/step=*'` name partition directories.
    parts = (root.name, *path.parts[len(root.parts) : -1]) if root is not None else path.parts[:-1]
    keys: dict[str, int | str] = {}
    for part in parts:
        key, sep, value = part.partition("=")
        if sep and key and value:
            keys[key] = _partition_value(value)
    return keys


def _is_data_file(path: Path) -> bool:
    # Spark/Hive markers (_SUCCESS, .crc, _metadata) sit beside the data files.
    return path.is_file() and not path.name.startswith((".", "_"))


DirKey = tuple[int, int]  # (device, inode) of a directory: one real directory however many links lead to it


class DirectoryWalker:
    """Lists directories following symlinks, each real directory once: a link back to a directory being
    walked (a loop) is skipped with a warning, so no input can make the listing run forever."""

    def __init__(self, warnings: list[str] | None) -> None:
        self.warnings = warnings
        self.visited: set[tuple[DirKey, int]] = set()

    def warn(self, message: str) -> None:
        if self.warnings is not None and message not in self.warnings:
            self.warnings.append(message)

    def entries(self, directory: Path) -> list[os.DirEntry]:
        try:
            with os.scandir(directory) as listing:
                return sorted(listing, key=lambda entry: entry.name)
        except OSError as exc:
            self.warn(f"{directory}: cannot be listed ({exc.strerror}); skipped.")
            return []

    def subdirectory(self, entry: os.DirEntry, ancestors: tuple[DirKey, ...]) -> DirKey | None:
        """The key of ``entry`` when it is a directory to descend into; None otherwise."""
        try:
            if not entry.is_dir():  # follows symlinks
                if entry.is_symlink() and not os.path.exists(entry.path):
                    os.stat(entry.path)  # raises ELOOP for a link that leads to itself
                return None
            info = os.stat(entry.path)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                self.warn(f"{entry.path}: symlink loop; skipped.")
            return None
        key = (info.st_dev, info.st_ino)
        if key in ancestors:
            self.warn(f"{entry.path}: symlink loop (leads back to {os.path.realpath(entry.path)}); skipped.")
            return None
        return key

    def parquet_files(self, root: Path) -> list[Path]:
        """Every ``*.parquet`` data file under ``root``, in natural order (``step=2/`` before ``step=10/``: a directory
        dump is read in step order, so each chunk goes on from the one before it)."""
        found: list[Path] = []
        info = os.stat(root)
        self._walk(root, ((info.st_dev, info.st_ino),), found)
        return sorted((path for path in found if _is_data_file(path)), key=natural_key)

    def _walk(self, directory: Path, ancestors: tuple[DirKey, ...], found: list[Path]) -> None:
        if (ancestors[-1], -1) in self.visited:  # reached again through another link: listed already
            return
        self.visited.add((ancestors[-1], -1))
        for entry in self.entries(directory):
            key = self.subdirectory(entry, ancestors)
            if key is not None:
                self._walk(Path(entry.path), (*ancestors, key), found)
            elif entry.name.endswith(".parquet"):
                found.append(Path(entry.path))

    def glob(self, pattern: str) -> list[Path]:
        """What ``glob.glob(pattern, recursive=True)`` matches, in natural order, without following a symlink loop."""
        parts = Path(pattern).parts
        fixed = next((i for i, part in enumerate(parts) if _GLOB_CHARS & set(part)), len(parts))
        base = Path(*parts[:fixed]) if fixed else Path(".")
        if not base.is_dir():
            return []
        info = os.stat(base)
        matches: set[Path] = set()
        self._match(base, parts[fixed:], ((info.st_dev, info.st_ino),), matches, relative=fixed == 0)
        return sorted(matches, key=natural_key)

    def _match(
        self, path: Path, parts: tuple[str, ...], ancestors: tuple[DirKey, ...], out: set[Path], relative: bool
    ) -> None:
        """Adds to ``out`` what the pattern ``parts`` matches under ``path`` (names relative to it if ``relative``)."""
        if not parts:
            out.add(path)
        elif parts[0] == "**":
            self._match_any_depth(path, parts, ancestors, out, relative)
        elif not _GLOB_CHARS & set(parts[0]):
            self._match_name(path, parts, ancestors, out)
        else:
            self._match_pattern(path, parts, ancestors, out, relative)

    def _match_any_depth(
        self, path: Path, parts: tuple[str, ...], ancestors: tuple[DirKey, ...], out: set[Path], relative: bool
    ) -> None:
        """``**`` first in ``parts``: the rest matched here and in every directory below (hidden ones left out)."""
        rest = parts[1:]
        if (ancestors[-1], len(parts)) in self.visited:
            return
        self.visited.add((ancestors[-1], len(parts)))
        self._match(path, rest, ancestors, out, relative)  # ** matches no directory too
        for entry in self.entries(path):
            if entry.name.startswith("."):
                continue
            key = self.subdirectory(entry, ancestors)
            if key is not None:
                self._match(_child(entry, relative), parts, (*ancestors, key), out, False)
            elif not rest:
                out.add(_child(entry, relative))

    def _match_name(self, path: Path, parts: tuple[str, ...], ancestors: tuple[DirKey, ...], out: set[Path]) -> None:
        """A plain name first in ``parts``: that entry of ``path``, if there."""
        target, rest = path / parts[0], parts[1:]
        if rest and target.is_dir():
            info = os.stat(target)
            self._match(target, rest, (*ancestors, (info.st_dev, info.st_ino)), out, False)
        elif not rest and os.path.lexists(target):
            out.add(target)

    def _match_pattern(
        self, path: Path, parts: tuple[str, ...], ancestors: tuple[DirKey, ...], out: set[Path], relative: bool
    ) -> None:
        """A name pattern first in ``parts``: the entries of ``path`` it matches (a hidden one only by a dot)."""
        head, rest = parts[0], parts[1:]
        for entry in self.entries(path):
            if entry.name.startswith(".") and not head.startswith("."):
                continue
            if not fnmatch.fnmatchcase(entry.name, head):
                continue
            if not rest:
                out.add(_child(entry, relative))
                continue
            key = self.subdirectory(entry, ancestors)
            if key is not None:
                self._match(_child(entry, relative), rest, (*ancestors, key), out, False)


def _child(entry: os.DirEntry, relative: bool) -> Path:
    """An entry's path as a glob gives it: its name alone under a relative pattern's first directory."""
    return Path(entry.name) if relative else Path(entry.path)


def remote_scheme(text: str) -> str | None:
    """The URI scheme ``text`` starts with (``s3`` of ``s3://bucket/run``), or None for a local path."""
    found = _URI.match(text)
    return found.group(1).lower() if found else None


def refuse_remote(text: str) -> None:
    """Raises InputError when ``text`` is a URI that is not read (``https://…``, ``file://…``) rather than a local path
    that exists; ``s3://``, ``gs://`` and ``hf://`` are read (io/storage.py)."""
    found = _URI.match(text)
    if found is not None and not Path(text).exists() and not storage.is_remote(text):
        scheme = found.group(1).lower()
        uri = f"{found.group(1)}://{'/' if scheme == 'file' else ''}{found.group(2)}"
        raise InputError(
            f"{uri}: {scheme}:// URIs are not read; rollout-diag reads local paths and s3://, gs://, hf:// ones.",
            hint="download the files to a local directory." if scheme != "file" else "give the path without file://.",
        )


def check_inputs_exist(inputs: Iterable[str | Path]) -> None:
    """Raises expand_inputs's InputError for the first input that is neither a path that exists nor a pattern,
    or that is a URI (``s3://…``): a check that needs no pyarrow, so the CLI reports a mistyped path before
    loading it."""
    for given in inputs:
        text = str(given)
        refuse_remote(text)
        uri = storage.remote_uri(text)
        if uri is not None:
            storage.check_client(uri)  # whether a remote path exists is asked when it is listed
        elif not Path(text).exists() and not _GLOB_CHARS & set(text):
            raise _missing(text)


def _missing(text: str) -> InputError:
    return InputError(f"{text}: no such file or directory.")


def expand_inputs(inputs: Iterable[str | Path], warnings: list[str] | None = None) -> list[Source]:
    """Resolve inputs in the order given; a directory contributes its ``*.parquet`` files in natural order (digits
    compare as numbers: ``step=2/`` before ``step=10/``), as a glob its matches.

    ``s3://``, ``gs://`` and ``hf://`` paths, prefixes and globs expand the same way through their object store
    (io/storage.py). A path that exists is taken as it is, even when its name holds glob characters
    (``part[0].parquet``); anything else with ``*``, ``?`` or ``[`` is a glob (``**`` recursive). Symlinks are
    followed, but a link back into a directory being listed (a loop) is skipped with a warning appended to
    ``warnings``. Raises InputError for a path that does not exist, a glob that matches nothing or an empty
    directory (a missing bucket or key, an empty prefix, an unreadable object store).
    """
    found = _Found()
    walker = DirectoryWalker(warnings)
    for given in inputs:
        text = str(given)
        refuse_remote(text)
        uri = storage.remote_uri(text)
        if uri is not None:
            for file, prefix in storage.expand(uri):
                found.add_remote(file, prefix)
        elif not Path(text).exists() and _GLOB_CHARS & set(text):
            _add_matches(text, walker, found)
        else:
            _add_local(text, walker, found)
    sources = found.sources
    if not sources:
        raise InputError("no input file given.")
    return sources


class _Found:
    """The sources found so far, in order, each file once (a local file by its resolved path)."""

    def __init__(self) -> None:
        self.sources: list[Source] = []
        self.seen: set[str] = set()

    def add(self, path: Path, root: Path | None) -> None:
        key = str(path.resolve())
        if key not in self.seen:
            self.seen.add(key)
            self.sources.append(Source(path=str(path), partition=_partition_keys(path, root)))

    def add_remote(self, uri: str, prefix: str | None) -> None:
        if uri not in self.seen:
            self.seen.add(uri)
            root = None if prefix is None else storage.partition_path(prefix)
            self.sources.append(Source(path=uri, partition=_partition_keys(storage.partition_path(uri), root)))


def _add_matches(text: str, walker: DirectoryWalker, found: _Found) -> None:
    """A glob's matches: a directory's Parquet files, a file itself; raises InputError when nothing matches."""
    matches = walker.glob(text)
    if not matches:
        raise InputError(f"{text}: no file matches this pattern.")
    for match_path in matches:
        if match_path.is_dir():
            for inner in walker.parquet_files(match_path):
                found.add(inner, match_path)
        elif match_path.exists():
            found.add(match_path, None)


def _add_local(text: str, walker: DirectoryWalker, found: _Found) -> None:
    """A local path: a directory's Parquet files, or the file; raises InputError when neither is there."""
    path = Path(text)
    if path.is_dir():
        inner_files = walker.parquet_files(path)
        if not inner_files:
            raise InputError(f"{text}: directory holds no .parquet file.")
        for inner in inner_files:
            found.add(inner, path)
    elif path.exists():
        found.add(path, None)
    else:
        raise _missing(text)
