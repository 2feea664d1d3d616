"""Where commands write: refuse an output that is one of the inputs, and replace outputs atomically.

Every command that writes a file checks its outputs against everything it reads *before* reading or writing
anything (:func:`check_outputs`), and writes each output to a hidden temporary file beside it that is renamed
over the target only when complete (:func:`atomic_path`), so a failed or interrupted run never leaves a
truncated file where a good one was. Loads no pyarrow: the CLI calls it first.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from rollout_diag.errors import ConfigError
from rollout_diag.io.sources import _GLOB_CHARS, DirectoryWalker

# What a reader takes from a directory (Parquet, prime-rl/NeMo-RL .jsonl, slime .pt, SkyRL/verl .pkl): an output
# beside the data (run/result.json, run/report.html) is no input, and rewriting it is fine.
DATA_SUFFIXES = (".parquet", ".jsonl", ".pt", ".pkl")
FileKey = tuple[int, int]  # (device, inode): one file however many links, `./` or relative spellings lead to it
TEMPORARY_PREFIX = "."  # hidden: directory readers skip names starting with "." (io.sources)


def _key(path: Path) -> FileKey | None:
    try:
        info = os.stat(path)  # follows symlinks
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _walk(directory: Path, walker: DirectoryWalker) -> Iterator[Path]:
    """Every file under ``directory``, each real directory once."""
    stack = [directory]
    seen: set[FileKey] = set()
    while stack:
        current = stack.pop()
        key = _key(current)
        if key is None or key in seen:
            continue
        seen.add(key)
        for entry in walker.entries(current):
            try:
                is_dir = entry.is_dir()
            except OSError:
                continue
            if is_dir:
                stack.append(Path(entry.path))
            else:
                yield Path(entry.path)


def input_files(inputs: Iterable[str | Path | None]) -> dict[FileKey, str]:
    """(device, inode) -> path of every existing file that ``inputs`` name: files, directories (every data file
    under them: DATA_SUFFIXES) and glob patterns. Paths that do not exist are left out (reading them fails later,
    with its own error)."""
    walker = DirectoryWalker(None)
    found: dict[FileKey, str] = {}
    for given in inputs:
        if given is None:
            continue
        text = str(given)
        path = Path(text)
        if not os.path.lexists(path) and _GLOB_CHARS & set(text):
            for match in walker.glob(text):
                _add_input(match, walker, found)
        else:
            _add_input(path, walker, found)
    return found


def _add_input(path: Path, walker: DirectoryWalker, found: dict[FileKey, str]) -> None:
    """A file, or every data file under a directory, into ``found`` (the first path of each file kept)."""
    if not path.is_dir():
        _add_file(path, found)
        return
    for inner in _walk(path, walker):
        if inner.name.endswith(DATA_SUFFIXES):
            _add_file(inner, found)


def _add_file(path: Path, found: dict[FileKey, str]) -> None:
    key = _key(path)
    if key is not None:
        found.setdefault(key, str(path))


def check_outputs(
    outputs: Mapping[str, str | Path | None],
    inputs: Iterable[str | Path | None],
    *,
    directories: Iterable[str] = (),
) -> None:
    """Raises ConfigError when an output (option flag -> path; None: not given) would replace or delete a file
    the command reads (``inputs``: files, directories, globs), however the path spells it (symlinks, ``./``,
    relative paths, hard links), when two outputs are one file, when an output's directory does not exist, or
    when an output is an existing directory (unless its flag is in ``directories``: an output that may be a
    directory and whose missing parents are made, like ``convert``'s). Reads nothing but file metadata."""
    given = {flag: Path(path) for flag, path in outputs.items() if path is not None}
    if not given:
        return
    _refuse_remote(given)
    read = None
    seen: dict[FileKey | str, str] = {}
    for flag, path in given.items():
        key = _key(path)
        same = seen.get(key if key is not None else os.path.abspath(path))
        if same is not None:
            raise ConfigError(f"{flag} {path}: the same file as {same} {given[same]}; give each output its own path.")
        seen[key if key is not None else os.path.abspath(path)] = flag
        if key is None:  # a file that does not exist yet is no input; its directory must exist (or be made)
            if flag not in directories and not path.absolute().parent.is_dir():
                raise ConfigError(f"{flag} {path}: No such file or directory.")
            continue
        if read is None:
            read = input_files(inputs)
        _check_existing(flag, path, key, read, flag in directories)


def _check_existing(flag: str, path: Path, key: FileKey, read: dict[FileKey, str], may_be_directory: bool) -> None:
    """Raises ConfigError when the existing output ``path`` is an input, a directory not allowed, or a directory
    that holds an input."""
    if key in read:
        raise ConfigError(
            f"{flag} {path}: this is an input ({read[key]}); writing it would destroy the input. "
            "Choose another output path."
        )
    if not path.is_dir():
        return
    if not may_be_directory:
        raise ConfigError(f"{flag} {path}: is a directory; give a file name.")
    inside = next((read[k] for p in _walk(path, DirectoryWalker(None)) if (k := _key(p)) in read), None)
    if inside is not None:
        raise ConfigError(
            f"{flag} {path}: this directory holds an input ({inside}); replacing it would destroy the input. "
            "Choose another output path."
        )


def _refuse_remote(outputs: Mapping[str, Path]) -> None:
    from rollout_diag.io.sources import remote_scheme

    for flag, path in outputs.items():
        if remote_scheme(str(path)) is not None:
            raise ConfigError(f"{flag} {path}: remote URIs are not written; write to a local path (then copy it).")


def temporary_beside(target: str | Path, *, directory: bool = False) -> Path:
    """A new, hidden temporary file (or empty directory) in ``target``'s directory, to be renamed over ``target``
    by :func:`commit` or deleted by :func:`discard`. Raises OSError when that directory is missing or not writable
    (a mistyped directory is not made)."""
    target = _through_link(Path(target))
    parent = target.parent
    prefix = f"{TEMPORARY_PREFIX}{target.name}."
    try:
        if directory:
            return Path(tempfile.mkdtemp(prefix=prefix, suffix=".partial", dir=parent))
        handle, name = tempfile.mkstemp(prefix=prefix, suffix=".partial", dir=parent)
    except OSError as exc:  # name the output the user gave, not the temporary file
        raise OSError(exc.errno, exc.strerror, str(target)) from None
    os.close(handle)
    return Path(name)


def commit(temporary: Path, target: str | Path) -> None:
    """Put the finished ``temporary`` (from :func:`temporary_beside`) in ``target``'s place, in one rename (a
    directory: the old one is moved aside first and deleted once the new one is in)."""
    target = _through_link(Path(target))
    os.chmod(temporary, _mode(target, temporary.is_dir()))  # mkstemp/mkdtemp make them private (0600/0700)
    _replace(temporary, target)


def discard(temporary: Path) -> None:
    """Delete an unfinished ``temporary``."""
    if temporary.is_dir() and not temporary.is_symlink():
        shutil.rmtree(temporary, ignore_errors=True)
    else:
        temporary.unlink(missing_ok=True)


def _through_link(target: Path) -> Path:
    # a symlink at the target is written through: the file it points to is replaced, the link stays
    return Path(os.path.realpath(target)) if target.is_symlink() else target


@contextmanager
def atomic_path(target: str | Path, *, directory: bool = False) -> Iterator[Path]:
    """A temporary path beside ``target`` (a file, or an empty directory with ``directory``) to write into; when
    the block ends without an exception it replaces ``target`` (an existing file or directory there is replaced
    only then), else it is deleted and ``target`` is left as it was."""
    temporary = temporary_beside(target, directory=directory)
    try:
        yield temporary
        commit(temporary, target)
    except BaseException:
        discard(temporary)
        raise


def _mode(target: Path, directory: bool) -> int:
    """The mode a new file or directory gets (0o666 or 0o777 less the umask), or the replaced one's own (when it is
    of the same kind)."""
    try:
        replaced = os.stat(target)
        if stat.S_ISDIR(replaced.st_mode) == directory:
            return replaced.st_mode & 0o7777
    except OSError:
        pass
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if directory else 0o666) & ~umask


def _replace(temporary: Path, target: Path) -> None:
    if os.path.lexists(target) and (temporary.is_dir() or target.is_dir()):
        # a directory cannot be renamed over (or replaced by) another kind: move the old one aside first, and delete
        # it once the new one is in
        aside = Path(tempfile.mkdtemp(prefix=f"{TEMPORARY_PREFIX}{target.name}.", suffix=".old", dir=target.parent))
        aside.rmdir()
        os.replace(target, aside)
        try:
            os.replace(temporary, target)
        except OSError:
            os.replace(aside, target)
            raise
        shutil.rmtree(aside, ignore_errors=True) if aside.is_dir() else aside.unlink(missing_ok=True)
        return
    os.replace(temporary, target)


def write_text(target: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``target`` atomically (see :func:`atomic_path`)."""
    with atomic_path(target) as temporary:
        temporary.write_text(text, encoding="utf-8")
