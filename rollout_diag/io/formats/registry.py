"""The register of trainer formats: each format module adds its :class:`TrainerFormat` here when it is imported, and
``io/formats/__init__.py`` imports every module of the package, so a new format is one new module.

A format says how its files are recognised (by name, else by content), which of the files found are read, their
step, and how one is opened as a :class:`~rollout_diag.io.formats.base.RowsFile`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rollout_diag.io.formats.base import RowsFile


class Peek:
    """What a file's content says, read once and only when a format asks: the first JSON-lines record, the global
    names a pickle refers to."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @cached_property
    def first_record(self) -> dict[str, Any] | None:
        try:
            with open(self.path, encoding="utf-8") as handle:
                for line in handle:
                    if line.strip():
                        record = json.loads(line)
                        return record if isinstance(record, dict) else None
        except (OSError, ValueError):
            return None
        return None

    @cached_property
    def pickle_globals(self) -> set[str]:
        from rollout_diag.io.formats.safe_pickle import global_names

        return set(global_names(str(self.path)))


def _never(*_: Any) -> bool:
    return False


def _every_file(files: list[Path], named: set[Path]) -> tuple[list[Path], list[str]]:
    return files, []


@dataclass(frozen=True)
class TrainerFormat:
    """One trainer format. ``by_name`` is asked first (of every format with the file's suffix, in ``order``), then
    ``by_content``; ``select`` (files found, those the user named) -> (files to read, what to say about the rest)."""

    name: str
    suffix: str  # the extension of its files: ".jsonl", ".pt", ".pkl"
    described: str  # its files, for the message when nothing of a known format is found
    step_of: Callable[[Path], int | None]
    open_file: Callable[[str, bool], RowsFile]  # (path, trust_pickle)
    order: int  # detection order among formats sharing a suffix, and the order FORMAT_NAMES lists them
    by_name: Callable[[Path], bool] = _never
    by_content: Callable[[Path, Peek], bool] = _never
    select: Callable[[list[Path], set[Path]], tuple[list[Path], list[str]]] = _every_file


FORMATS: dict[str, TrainerFormat] = {}


def register(trainer_format: TrainerFormat) -> TrainerFormat:
    """Add ``trainer_format`` to the register (a module registering itself twice, on a reload, replaces itself)."""
    FORMATS[trainer_format.name] = trainer_format
    return trainer_format


def register_pickle(
    name: str,
    described: str,
    step_of: Callable[[Path], int | None],
    open_file: Callable[[str, bool], RowsFile],
    order: int,
    markers: Iterable[str],
) -> TrainerFormat:
    """Register a format whose files are pickles (``.pkl``), recognised by a class of ``markers`` among the pickle's
    globals (``Peek.pickle_globals``: read without unpickling)."""
    wanted = frozenset(markers)

    def found(path: Path, peek: Peek) -> bool:
        return bool(peek.pickle_globals & wanted)

    return register(TrainerFormat(name, ".pkl", described, step_of, open_file, order, by_content=found))


def ordered() -> list[TrainerFormat]:
    """The registered formats in detection order."""
    return sorted(FORMATS.values(), key=lambda trainer_format: (trainer_format.order, trainer_format.name))
