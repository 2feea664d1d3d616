"""What ``watch`` keeps of each file it has read (:class:`FileRecord`: its steps, signature, reading log and the few
side records that rebuild the run's top-K lists; no token data), and the file-system questions a poll asks: a
file's signature, whether a JSON-lines file ends its last line, which steps every rank marked complete."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout_diag.drivers.passes import Analysis
from rollout_diag.io import storage
from rollout_diag.io.readlog import MAX_SKIP_RECORDS, ReadLog
from rollout_diag.io.sources import COMPLETE_PREFIX, Source
from rollout_diag.metrics.base import StepAccumulator
from rollout_diag.metrics.prompts import PromptAccumulator
from rollout_diag.metrics.rowstats import RowStatsCollector

Signature = tuple[int, int]  # (size, mtime in ns): a file that changes gets another


@dataclass
class FileRecord:
    """One file read: what the run state needs of it once it is merged (to take its steps out again)."""

    source: Source
    signature: Signature
    steps: frozenset[int]
    log: ReadLog
    describe: str  # the file's column roles, for the "columns differ" warning
    lags: dict[int, Any]
    has_versions: bool
    empty_rows: list[tuple[int, str, str, int]]
    rows: RowStatsCollector | None
    # the file's own top-K lists, to rebuild the run's when steps are taken out: hint example rows (keys only),
    # worst tokens (a few numbers each) and worst rows as summaries (their tokens are not kept)
    examples: dict[str, list]
    worst_tokens: list
    worst_rows: dict[str, list]
    prompts: PromptAccumulator  # the file's per-prompt evidence, to rebuild the run's when steps are taken out


def merged_log(records: Sequence[FileRecord], log: ReadLog, listing_warnings: Sequence[str]) -> ReadLog:
    """``log`` (empty, of the files of ``records`` in reading order) filled as the reading log ``analyze`` would
    have kept over those files."""
    if not records:
        return log
    first = records[0]
    log.columns = dict(first.log.columns)
    log.layout = first.log.layout
    log.total_rows = sum(record.log.total_rows for record in records)
    warnings = list(listing_warnings)
    for record in records[1:]:
        if record.log.columns != first.log.columns:
            warnings.append(
                f"{record.source.path}: columns differ from the first file's ({record.describe} vs {first.describe})."
            )
    for record in records:
        warnings.extend(w for w in record.log.warnings if w not in warnings)
    log.warnings = warnings
    for index, record in enumerate(records):
        log.skipped.extend(record.log.skipped)
        log.skipped_rows += record.log.skipped_rows
        log.add_skip_counts(record.log)
        for file, counts in record.log.unmasked.items():
            log.unmasked[file] = list(counts)
        log.fills.update(record.log.fills)
        log.mask_candidates.update(record.log.mask_candidates)
        log.row_keys.extend(record.log.row_keys)
        for places in record.log.row_places:
            moved = places.copy()
            moved[:, 0] = index
            log.row_places.append(moved)
    position = {path: index for index, path in enumerate(log.files)}
    log.skipped.sort(key=lambda r: (position.get(r.file, -1), -1 if r.row is None else r.row))
    del log.skipped[MAX_SKIP_RECORDS:]
    log.finish()
    return log


def completed_steps(directory: str | Path, known: set[int]) -> set[int]:
    """The steps of ``directory`` not in ``known`` whose ``DumpWriter`` completion markers come from every rank of the
    world size they state."""
    found: set[int] = set()
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return found
    for entry in entries:
        key, sep, value = entry.name.partition("=")
        if key != "step" or not sep or not value.lstrip("-").isdigit() or not entry.is_dir():
            continue
        step = int(value)
        if step in known:  # a rewrite (resumed run) writes every rank's marker again
            continue
        ranks: set[int] = set()
        world_size = None
        try:
            markers = [m for m in os.scandir(entry.path) if m.name.startswith(COMPLETE_PREFIX)]
            for marker in markers:
                with open(marker.path, encoding="utf-8") as handle:
                    written = json.load(handle)
                ranks.add(int(written["rank"]))
                world_size = int(written["world_size"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if world_size is not None and len(ranks) >= world_size:
            found.add(step)
    return found


def file_signature(path: str) -> Signature | None:
    """The file's (size, mtime) (object storage's own for a remote one); None when it is gone."""
    if storage.is_remote(path):
        return storage.signature(path)
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_size, info.st_mtime_ns)


def ends_with_newline(path: str) -> bool:
    """Whether the file's last byte is a newline (a JSON-lines writer has finished its last line)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            if handle.tell() == 0:
                return False
            handle.seek(-1, os.SEEK_END)
            return handle.read(1) == b"\n"
    except OSError:
        return False


def steps_text(steps: frozenset[int] | set[int]) -> str:
    """The steps for a note: the first ten, then how many in all."""
    ordered = sorted(steps)
    return ", ".join(map(str, ordered[:10])) + (f", … ({len(ordered)} in all)" if len(ordered) > 10 else "")


def step_families(analysis: Analysis) -> list[StepAccumulator]:
    """Every per-step accumulator in the analysis (its families, the hint evidence, the drift, each dialect's)."""
    return [*analysis.families, analysis.hint_evidence, analysis.drift, *analysis.dialect.step_accumulators()]
