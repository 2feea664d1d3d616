"""Follow a dump directory while the trainer writes it (``rollout-diag watch``).

Each poll lists the directory (every trainer format ``analyze`` reads), reads each new file once into an
:class:`~rollout_diag.drivers.passes.Analysis` of its own and merges it into the run's: the accumulators are mergeable,
so the run state after the last file equals what ``analyze`` computes over the finished directory (rtol 1e-12).
What is kept per file is small (its steps, signature, reading log and a few side records; no token data), so
memory grows with steps, as ``analyze``'s own per-step state does, never with tokens.

- A file not readable yet (no Parquet footer, a JSONL file without its last newline or still growing, a
  truncated pickle) is retried at the next poll once it changes, and said once.
- A file rewritten (a resumed run) or removed takes its steps out of the run state; the other files of those
  steps are read again and merged back. The run's top-K lists are rebuilt from each file's own top-K (kept as
  summaries); a worst row that comes back needs its tokens, so the file holding it is read again for those.
- A rank file arriving late joins its step: its state is merged in, nothing else is read again.
- A step is *final* when the writer says so (``DumpWriter``'s ``_COMPLETE-rank-<R>`` markers from every rank,
  prime-rl's ``STABLE``), when a later step appears, or when the watch ends; each final step is reported once
  (again, with a higher ``revision``, if a late file or a rewrite changes it).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout_diag import catalogue
from rollout_diag.decisions.check import FAIL, Gate, check
from rollout_diag.decisions.rowmetrics import KEY_METRIC_NAMES
from rollout_diag.decisions.verdict import step_levels
from rollout_diag.drivers.dump import Dump, call_options
from rollout_diag.drivers.engine import build_result
from rollout_diag.drivers.passes import (
    MAX_LISTED_EMPTY_ROWS,
    Analysis,
    check_analysis_options,
    empty_row_order,
    resolve_device,
    run_chunks,
)
from rollout_diag.errors import ConfigError, DataError, InputError, RolloutDiagError, option_name
from rollout_diag.io import storage
from rollout_diag.io.formats import PARQUET, check_format, prime_rl, resolve, step_of
from rollout_diag.io.opening import describe_columns
from rollout_diag.io.reader import DEFAULT_CHUNK_TOKENS, DumpReader
from rollout_diag.io.readlog import MAX_SKIP_RECORDS, ReadLog
from rollout_diag.io.sources import COMPLETE_PREFIX, Source
from rollout_diag.metrics.base import StepAccumulator
from rollout_diag.metrics.dialects import DEFAULT as DEFAULT_DIALECT
from rollout_diag.metrics.dialects import resolve as resolve_dialects
from rollout_diag.metrics.localize import DEFAULT_CATASTROPHIC, DEFAULT_TOP_K
from rollout_diag.metrics.prompts import PromptAccumulator
from rollout_diag.metrics.rounds import DEFAULT_MAX_ROUNDS
from rollout_diag.metrics.rowstats import RowStatsCollector
from rollout_diag.results import AnalysisResult, StepResult, json_number, repr_sizes, repr_text, short_repr

if TYPE_CHECKING:
    import torch  # annotations only: the driver's arithmetic runs in passes and metrics

DEFAULT_INTERVAL = 2.0  # seconds between polls
Signature = tuple[int, int]  # (size, mtime in ns): a file that changes gets another


def verdict_of(result: AnalysisResult | None) -> tuple[str, str]:
    """(level, one sentence) of the run so far: the overall verdict the result was built with (decisions/verdict.py),
    pipeline findings and length rules included, as ``analyze`` prints it."""
    if result is None:
        return "n/a", "no data yet."
    if result.verdict is None:
        return "n/a", "no verdict."
    return result.verdict.level, result.verdict.sentence


# ----------------------------------------------------------------------------------------------- results
@dataclass(frozen=True)
class StepReport:
    """A step that became final (or changed again after it was reported: ``revision`` > 0)."""

    step: int
    revision: int
    rows: int
    tokens: int
    metrics: dict[str, float]
    level: str
    anomalies: list[str] = field(default_factory=list)  # anomaly flags new at this step
    findings: list[str] = field(default_factory=list)  # pipeline findings (hints) first seen since the last report
    alerts: list[str] = field(default_factory=list)  # gates failing on this step (or newly on the run)
    set_by: list[str] = field(default_factory=list)  # the judged metrics at the step's watch/bad level

    def to_json(self) -> dict[str, Any]:
        """One ``--format jsonl`` line (schemas/watch.schema.json)."""
        return {
            "step": self.step,
            "revision": self.revision,
            "rows": self.rows,
            "tokens": self.tokens,
            "level": self.level,
            "level_set_by": list(self.set_by),
            "metrics": {name: json_number(value) for name, value in self.metrics.items()},
            "anomalies": list(self.anomalies),
            "findings": list(self.findings),
            "alerts": list(self.alerts),
        }

    def __repr__(self) -> str:
        return short_repr(
            "StepReport",
            f"step {self.step}" + (f" (revision {self.revision})" if self.revision else ""),
            f"level {self.level}, {self.rows:,} rows, {self.tokens:,} model tokens",
            f"{len(self.anomalies)} anomalies, {len(self.findings)} findings, {len(self.alerts)} alerts",
        )


@dataclass
class WatchUpdate:
    """What one poll found: the run so far, the steps that became final, notes and gate alerts."""

    result: AnalysisResult | None  # the run so far (None until a file with model tokens was read)
    level: str  # the run's overall verdict level ("n/a" before any result)
    sentence: str
    steps: list[StepReport]  # steps final at this poll, in step order
    notes: list[str]  # files retried, steps replaced, late ranks joined
    alerts: list[str]  # gate failures new at this poll (each said once)
    idle: float  # seconds since new data last arrived
    changed: bool  # whether this poll brought new data
    pending_steps: list[int]  # steps with data that are not final yet
    ended: str | None = None  # why the watch stops after this update (one line), None while it goes on
    exit_code: int | None = None

    def __repr__(self) -> str:
        return short_repr(
            "WatchUpdate",
            f"level {self.level}: {repr_text(self.sentence)}",
            f"{len(self.steps):,} steps final, {len(self.pending_steps):,} pending, {len(self.alerts):,} alerts",
            "" if self.result is None else repr_sizes(self.result.run, self.result.steps, self.result.skipped_rows),
            f"ended: {repr_text(self.ended)}" if self.ended else f"idle {self.idle:.1f} s",
        )


class WatchGone(Exception):
    """The watched directory was deleted or moved."""


@dataclass
class _FileRecord:
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


# ----------------------------------------------------------------------------------------------- the state
# What a Watcher takes from a Dump, of all its options (the others, workers, backend and engine, left at their defaults)
WATCHER_OPTIONS = ("columns", "input_format", "trust_pickle", "device", "strict", "chunk_tokens")
_WATCHED_DUMP_OPTIONS = (*WATCHER_OPTIONS, "workers", "backend", "engine")


class Watcher:
    """The run state of one dump directory (or a :class:`Dump` of one, its reading options with it), advanced by
    :meth:`poll`. Raises RolloutDiagError for bad options."""

    def __init__(
        self,
        directory: str | Path | Dump,
        *,
        columns: Mapping[str, str] | None = None,
        input_format: str | None = None,
        trust_pickle: bool | None = None,
        device: str | torch.device | None = None,
        strict: bool | None = None,
        chunk_tokens: int | None = None,
        max_rounds: int = DEFAULT_MAX_ROUNDS,
        catastrophic: float = DEFAULT_CATASTROPHIC,
        top_k: int = DEFAULT_TOP_K,
        dialect: str | Sequence[str] = DEFAULT_DIALECT,
        gates: Sequence[Gate] = (),
    ) -> None:
        check_analysis_options(max_rounds, catastrophic, top_k)
        reading: dict[str, Any] = {
            "columns": columns,
            "input_format": input_format,
            "trust_pickle": trust_pickle,
            "device": device,
            "strict": strict,
            "chunk_tokens": chunk_tokens,
        }
        if isinstance(directory, Dump):  # its reading options; given again, they must agree
            reading.update(call_options(directory, "watch", WATCHER_OPTIONS, reading, _WATCHED_DUMP_OPTIONS))
            if len(directory.inputs) != 1:
                raise ConfigError(f"watch follows one dump directory, not {len(directory.inputs)} inputs.")
            directory = directory.inputs[0]
        remote = storage.remote_uri(str(directory))  # a prefix on object storage, polled by listing it
        self.directory: Any = remote or Path(directory)
        if not remote and Path(directory).exists() and not Path(directory).is_dir():
            raise InputError(f"{directory}: not a directory; watch follows a dump directory.")
        # a directory the trainer has not made yet is waited for (polls note it); once seen, its removal ends the watch
        self.appeared = self._listable()
        self.columns = dict(reading["columns"] or {})
        self.input_format = check_format(reading["input_format"])  # an unknown one fails now, not at a poll
        self.trust_pickle = bool(reading["trust_pickle"])
        self.device = resolve_device("cpu" if reading["device"] is None else reading["device"])
        self.strict = bool(reading["strict"])
        self.chunk_tokens = DEFAULT_CHUNK_TOKENS if reading["chunk_tokens"] is None else reading["chunk_tokens"]
        self.new_analysis = partial(
            Analysis, max_rounds=max_rounds, catastrophic=catastrophic, top_k=top_k, dialects=resolve_dialects(dialect)
        )
        self.gates = list(gates)
        self.need_rows = any(gate.metric in KEY_METRIC_NAMES for gate in self.gates)
        self.analysis = self.new_analysis()
        self.files: dict[str, _FileRecord] = {}
        self.order: list[str] = []  # listed files in the order analyze reads them
        self.format: str | None = None
        self.listing_warnings: list[str] = []
        self.seen: dict[str, Signature] = {}  # files not read yet: signature at the last poll
        self.failed: dict[str, Signature] = {}  # files that could not be read, until they change
        self.complete_steps: set[int] = set()
        self.listed_steps: set[int] = set()  # steps the listed files' names or directories carry
        self.unread_steps: set[int] = set()  # … of the listed files not read (yet)
        self.versions: dict[int, int] = {}  # step -> how many times its state changed
        self.reported: dict[int, tuple[int, int]] = {}  # step -> (version reported, revision)
        self.result: AnalysisResult | None = None
        self.alerted: set[tuple[str, int | None]] = set()
        self.failed_gates = False
        self.known_findings: set[str] = set()  # notes said once
        self.known_hints: set[str] = set()  # pipeline findings (hint ids) said once
        self.known_anomalies: set[tuple[int, str]] = set()
        self.last_change = time.monotonic()

    # -- polling ---------------------------------------------------------------------------------------
    def poll(self, final: bool = False) -> WatchUpdate:
        """List the directory, read what is new, and report the steps that became final (all of them when
        ``final``). Raises WatchGone when the directory is gone, RolloutDiagError for a gate on an unknown metric."""
        notes: list[str] = []
        listed = self._list(notes)
        changed = self._apply(listed, notes)
        if listed is not None:
            self.unread_steps = {
                step
                for source in listed
                if source.path not in self.files and (step := self._step_of(source)) is not None
            }
        if changed:
            self.last_change = time.monotonic()
            self.result = self._build()
        steps, alerts = self._report(final)
        level, sentence = verdict_of(self.result)
        known = sorted(self.versions)
        return WatchUpdate(
            result=self.result,
            level=level,
            sentence=sentence,
            steps=steps,
            notes=notes,
            alerts=alerts,
            idle=time.monotonic() - self.last_change,
            changed=changed,
            pending_steps=[s for s in known if s not in self.reported],
        )

    def _listable(self) -> bool:
        return self.directory.is_dir() if isinstance(self.directory, Path) else storage.is_prefix(self.directory)

    def _gone(self) -> bool:
        return not self._listable()

    def _list(self, notes: list[str]) -> list[Source] | None:
        """The data files of the directory in reading order; None when nothing can be listed this poll (the
        directory not made yet included)."""
        if not self.appeared:
            if not self._listable():
                self._note_once(notes, f"{self.directory}: no such directory yet; waiting for the trainer to make it.")
                return None
            self.appeared = True
            self._note_once(notes, f"{self.directory}: the directory appeared; reading it.")
        if self._gone():
            raise WatchGone(f"{self.directory}: the directory was deleted or moved; the watch ends.")
        warnings: list[str] = []
        try:
            fmt, sources = resolve([str(self.directory)], self.input_format, warnings)
        except InputError as exc:
            if self._gone():
                raise WatchGone(f"{self.directory}: the directory was deleted or moved; the watch ends.") from None
            if self.files:  # files were there: something the user should hear about (once)
                self._note_once(notes, f"{self.directory}: {exc}")
            return None
        except OSError:  # a file vanished while the directory was listed: list again at the next poll
            return None
        if self.format is not None and fmt != self.format:
            self._note_once(notes, f"{self.directory}: now lists {fmt} files, the watch reads {self.format}; ignored.")
            return None
        self.format = fmt
        self.listing_warnings = [w for w in warnings if "left out" not in w or not self._is_prime_rl()]
        return sources

    def _is_prime_rl(self) -> bool:
        return self.format == prime_rl.NAME

    def _note_once(self, notes: list[str], message: str) -> None:
        if message not in self.known_findings:
            self.known_findings.add(message)
            notes.append(message)

    def _apply(self, listed: list[Source] | None, notes: list[str]) -> bool:
        if listed is None:
            return False
        by_path = {source.path: source for source in listed}
        self.order = [source.path for source in listed]
        removed = [path for path in self.files if path not in by_path]
        changed, new, signatures = self._sort_listed(listed)
        self._update_complete_steps()
        self.listed_steps = {step for step in map(self._step_of, listed) if step is not None}
        if not (removed or changed or new):
            return False
        dirty = self._forget(removed, changed, notes)
        reread = self._forget_sharing(dirty, by_path)
        if dirty:
            self._remove_steps(dirty)
        for step in dirty:
            self.versions[step] = self.versions.get(step, 0) + 1
        read_new = self._read_again(changed, new, reread, signatures, dirty, notes)
        for step in [step for step in self.versions if step not in self.analysis.offpolicy.steps]:
            del self.versions[step]  # every row of it is gone (a removed step)
        return bool(dirty) or read_new

    def _sort_listed(self, listed: list[Source]) -> tuple[list[Source], list[Source], dict[str, Signature]]:
        """The listed files rewritten since read and those new and ready, with every listed file's signature."""
        changed: list[Source] = []
        new: list[Source] = []
        signatures: dict[str, Signature] = {}
        for source in listed:
            signature = _signature(source.path)
            if signature is None:
                continue
            signatures[source.path] = signature
            record = self.files.get(source.path)
            if record is not None:
                if record.signature != signature:
                    changed.append(source)
            elif self.failed.get(source.path) != signature and self._ready(source, signature):
                new.append(source)
            self.seen[source.path] = signature
        return changed, new, signatures

    def _forget(self, removed: list[str], changed: list[Source], notes: list[str]) -> set[int]:
        """Drops the removed and rewritten files, saying so; returns their steps."""
        dirty: set[int] = set()
        for path in removed + [source.path for source in changed]:
            record = self.files.pop(path)
            dirty |= record.steps
            what = "removed" if path in removed else "rewritten"
            notes.append(f"{path}: {what}; step(s) {_steps_text(record.steps)} replaced.")
        return dirty

    def _forget_sharing(self, dirty: set[int], by_path: dict[str, Source]) -> list[Source]:
        """Drops the other files of the ``dirty`` steps, and of their other steps (a file may hold several), adding
        those steps to ``dirty``; returns the files to read again."""
        reread: list[Source] = []
        while True:
            touching = [path for path, record in self.files.items() if record.steps & dirty]
            if not touching:
                return reread
            for path in touching:
                dirty |= self.files.pop(path).steps
                reread.append(by_path[path])

    def _read_again(
        self,
        changed: list[Source],
        new: list[Source],
        reread: list[Source],
        signatures: dict[str, Signature],
        dirty: set[int],
        notes: list[str],
    ) -> bool:
        """Reads the changed, new and re-read files in listing order; whether a changed or new one gave rows."""
        known_steps = set(self.versions)
        read_any = False
        fresh = {source.path for source in changed + new}
        position = {path: index for index, path in enumerate(self.order)}
        for source in sorted(changed + new + reread, key=lambda s: position[s.path]):
            record = self._read(source, signatures.get(source.path), notes)
            if record is None or source.path not in fresh:  # a file read again has what it had
                continue
            read_any = True
            late = record.steps & known_steps and source in new
            if late and any(step in self.reported for step in record.steps):
                notes.append(f"{source.path}: joins step(s) {_steps_text(record.steps)} (arrived late).")
            for step in record.steps - dirty:
                self.versions[step] = self.versions.get(step, 0) + 1
        return read_any

    def _step_of(self, source: Source) -> int | None:
        if self.format == PARQUET or self.format is None:
            step = source.partition.get("step")
        else:
            step = step_of(self.format, Path(source.path))
        return step if isinstance(step, int) else None

    def _ready(self, source: Source, signature: Signature) -> bool:
        """Whether a file not read yet looks finished. Parquet and pickles say so by opening (retried if not);
        a JSONL file (NeMo-RL) must end with a newline and be unchanged since the last poll; prime-rl's step
        directories are listed only with their STABLE marker."""
        if self.format in (None, PARQUET, prime_rl.NAME) or not source.path.endswith(".jsonl"):
            return True
        if self.seen.get(source.path) != signature:
            return False
        return _ends_with_newline(source.path)

    def _update_complete_steps(self) -> None:
        """Steps whose ``DumpWriter`` completion markers come from every rank of the world size they state."""
        if self.format != PARQUET:
            return
        try:
            entries = list(os.scandir(self.directory))
        except OSError:
            return
        for entry in entries:
            key, sep, value = entry.name.partition("=")
            if key != "step" or not sep or not value.lstrip("-").isdigit() or not entry.is_dir():
                continue
            step = int(value)
            if step in self.complete_steps:  # a rewrite (resumed run) writes every rank's marker again
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
                self.complete_steps.add(step)

    # -- reading ---------------------------------------------------------------------------------------
    def _read(self, source: Source, signature: Signature | None, notes: list[str]) -> _FileRecord | None:
        """Read one file into its own Analysis and merge it into the run's; None when it cannot be read yet."""
        signature = signature or _signature(source.path)
        if signature is None:
            return None
        try:
            reader = self._reader(source)
            if reader.log.layout != self._layout(reader.log.layout):
                raise InputError(f"{source.path}: {reader.log.layout} layout, the files before it have another.")
            reader.log.finished = True  # keep the row keys: duplicates are found over every file (_log)
            analysis = self.new_analysis()
            rows = RowStatsCollector() if self.need_rows else None
            consumers = [analysis.update] + ([rows.update] if rows is not None else [])
            # numpy chunks: on the CPU the compiled kernels however small each file (a watched run keeps growing;
            # loaded once per watch), and no torch
            run_chunks(reader, consumers, self.device, None, analysis.prepare)
        except (RolloutDiagError, OSError) as exc:
            if isinstance(exc, DataError) and self.strict:
                raise
            self.failed[source.path] = signature
            self._note_once(notes, f"{source.path}: not readable yet ({exc}); retried when it changes.")
            return None
        self.failed.pop(source.path, None)
        self.analysis.merge(analysis)
        opened = reader.files[0]
        record = _FileRecord(
            source=source,
            signature=signature,
            steps=frozenset(analysis.offpolicy.steps),
            log=reader.log,
            describe=describe_columns(opened.columns),
            lags=dict(analysis.hint_evidence.lags),
            has_versions=analysis.hint_evidence.has_versions,
            empty_rows=list(analysis.empty_rows),
            rows=rows,
            examples={kind: list(top.items) for kind, top in analysis.hint_evidence.examples.items()},
            worst_tokens=list(analysis.worst.tokens.items),
            worst_rows={
                criterion: [(score, key, details[0]) for score, key, details in top.items]
                for criterion, top in analysis.worst.rows.items()
            },
            prompts=analysis.prompts,
        )
        self.files[source.path] = record
        return record

    def _reader(self, source: Source) -> DumpReader:
        return DumpReader(
            [source],
            self.columns,
            strict=self.strict,
            chunk_tokens=self.chunk_tokens,
            input_format=self.format,
            trust_pickle=self.trust_pickle,
        )

    def _layout(self, layout: str) -> str:
        first = next(iter(self.files.values()), None)
        return layout if first is None else first.log.layout

    def _remove_steps(self, steps: set[int]) -> None:
        """Take ``steps`` out of the run state. The per-step states are dropped; what is kept for the whole run
        (top-K lists, version lags, rows without model tokens) is rebuilt from the records of the files left,
        exactly: a file's own top-K holds every entry it can add to the run's."""
        for family in _step_families(self.analysis):
            for step in steps:
                family.steps.pop(step, None)
        left = list(self.files.values())  # the files of ``steps`` were taken out of ``self.files``
        worst, evidence = self.analysis.worst, self.analysis.hint_evidence
        for kind, top in evidence.examples.items():
            top.items = []
            top.offer([item for record in left for item in record.examples[kind]])
        worst.tokens.items = []
        worst.tokens.offer([item for record in left for item in record.worst_tokens])
        self._refill_rows(steps, left)
        evidence.lags = {}
        for record in left:
            for lag, sums in record.lags.items():
                evidence.lags[lag] = evidence.lags[lag] + sums if lag in evidence.lags else sums.copy()
        evidence.has_versions = any(record.has_versions for record in left)
        # where each file's steps go back (resumes): a file taken out takes its pieces with it
        evidence.files = {path: pieces for path, pieces in evidence.files.items() if path in self.files}
        self.analysis.prompts = PromptAccumulator()
        for record in left:
            self.analysis.prompts.merge(record.prompts)
        empty = sorted((row for record in left for row in record.empty_rows), key=empty_row_order)
        self.analysis.empty_rows = empty[:MAX_LISTED_EMPTY_ROWS]

    def _refill_rows(self, steps: set[int], left: list[_FileRecord]) -> None:
        """The run's worst rows without ``steps``: from the files' own top rows (summaries); a row that enters
        now needs its tokens, so the few files holding such rows are read again, for their worst rows only."""
        wanted: dict[str, set[tuple]] = {}
        for criterion, top in self.analysis.worst.rows.items():
            before = len(top.items)
            top.items = kept = [item for item in top.items if item[1][0] not in steps]
            if before < top.k or len(kept) == before:  # nothing was ever pushed out, or nothing left it
                continue
            have = {item[1] for item in kept}
            top.offer([item for record in left for item in record.worst_rows[criterion] if item[1] not in have])
            for _, key, _ in top.items:
                if key not in have:
                    wanted.setdefault(key[2], set()).add(key)
        if not wanted:
            return
        captured: dict[tuple, Any] = {}
        for path, keys in wanted.items():
            tracker = self.new_analysis()
            reader = self._reader(self.files[path].source)
            run_chunks(reader, [tracker.worst.update], self.device, None, tracker.prepare)
            for top in tracker.worst.rows.values():
                captured.update({key: details for _, key, details in top.items if key in keys})
        for top in self.analysis.worst.rows.values():
            top.items = [(score, key, captured.get(key, details)) for score, key, details in top.items]

    # -- results ---------------------------------------------------------------------------------------
    def _log(self) -> ReadLog:
        """The reading log ``analyze`` would have kept over the files read so far."""
        paths = [path for path in self.order if path in self.files]
        records = [self.files[path] for path in paths]
        log = ReadLog(files=paths, format=self.format or PARQUET)
        if not records:
            return log
        first = records[0]
        log.columns = dict(first.log.columns)
        log.layout = first.log.layout
        log.total_rows = sum(record.log.total_rows for record in records)
        warnings = list(self.listing_warnings)
        for record in records[1:]:
            if record.log.columns != first.log.columns:
                warnings.append(
                    f"{record.source.path}: columns differ from the first file's "
                    f"({record.describe} vs {first.describe})."
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
        position = {path: index for index, path in enumerate(paths)}
        log.skipped.sort(key=lambda r: (position.get(r.file, -1), -1 if r.row is None else r.row))
        del log.skipped[MAX_SKIP_RECORDS:]
        log.finish()
        return log

    def _build(self) -> AnalysisResult | None:
        if not self.files:
            return None
        try:
            return build_result(self.analysis, self._log(), self.device, self.strict)
        except DataError:
            if self.strict and any(record.log.skipped_rows for record in self.files.values()):
                raise
            return None  # no row with a model token yet

    def _final_steps(self, final: bool) -> set[int]:
        steps = set(self.versions)
        if final:
            return steps
        steps -= self.unread_steps  # a file of the step is listed but not readable yet
        if self._is_prime_rl():
            return steps
        last = max(steps | self.listed_steps, default=None)
        return {step for step in steps if step != last or step in self.complete_steps}

    def _report(self, final: bool) -> tuple[list[StepReport], list[str]]:
        result = self.result
        if result is None:
            return [], []
        by_step = {step.step: step for step in result.steps}
        ready = sorted(
            step
            for step in self._final_steps(final)
            if step in by_step and self.reported.get(step, (-1, -1))[0] != self.versions.get(step)
        )
        failures = self._gate_failures(result)
        # a finding is said once, by its id: its numbers change as steps arrive (the live view shows them in place)
        fresh = [h for h in result.hints if h.id not in self.known_hints] if ready else []
        self.known_hints.update(h.id for h in fresh)  # said with the last step reported now, else at the next one
        new_findings = [h.message for h in fresh]
        reports: list[StepReport] = []
        alerts: list[str] = []
        for step in ready:
            entry = by_step[step]
            step_level = _step_level(entry)
            revision = self.reported[step][1] + 1 if step in self.reported else 0
            self.reported[step] = (self.versions[step], revision)
            anomalies = [
                f"step {a.step}: {a.metric} = {a.value:.4g}, {a.factor:.3g}× its baseline {a.baseline:.4g}"
                for a in result.anomalies
                if a.step == step and (a.step, a.metric) not in self.known_anomalies
            ]
            self.known_anomalies.update((a.step, a.metric) for a in result.anomalies if a.step == step)
            step_alerts = self._new_alerts(failures, step)
            alerts += step_alerts
            reports.append(
                StepReport(
                    step=step,
                    revision=revision,
                    rows=entry.rows,
                    tokens=entry.tokens,
                    metrics=dict(entry.metrics),
                    level=step_level,
                    anomalies=anomalies,
                    findings=new_findings if step == ready[-1] else [],
                    alerts=step_alerts,
                    set_by=level_set_by(entry.metrics, step_level),
                )
            )
        run_alerts = self._new_alerts(failures, None) if ready or final else []
        if run_alerts and reports:
            last = reports[-1]
            reports[-1] = replace(last, alerts=last.alerts + run_alerts)
        return reports, alerts + run_alerts

    def _gate_failures(self, result: AnalysisResult) -> dict[int | None, list[str]]:
        if not self.gates:
            return {}
        rows = None
        if self.need_rows:
            collector = RowStatsCollector()
            for record in self.files.values():
                if record.rows is not None:
                    collector.merge(record.rows)
            rows = collector.finalize()
        outcome = check(result, self.gates, per_step=True, rows=rows)
        failures: dict[int | None, list[str]] = {}
        for gate_outcome in outcome.outcomes:
            if gate_outcome.status == FAIL:
                failures.setdefault(gate_outcome.step, []).append(gate_outcome.message())
        return failures

    def _new_alerts(self, failures: dict[int | None, list[str]], step: int | None) -> list[str]:
        new = []
        for message in failures.get(step, []):
            key = (message.split(" = ")[0], step)
            if key not in self.alerted:
                self.alerted.add(key)
                new.append(f"ALERT {message}")
        if new:
            self.failed_gates = True
        return new


# ----------------------------------------------------------------------------------------------- the loop
def watch(
    directory: str | Path | Dump,
    *,
    interval: float = DEFAULT_INTERVAL,
    exit_after_idle: float | None = None,
    exit_on_fail: bool = False,
    max_polls: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
    **options: Any,
) -> Iterator[WatchUpdate]:
    """Follow ``directory``: one :class:`WatchUpdate` per poll, every ``interval`` seconds, until the directory
    is deleted or moved (exit code 1), a gate fails with ``exit_on_fail`` (3), nothing new has arrived for
    ``exit_after_idle`` seconds (0, or 3 if a gate failed), or ``max_polls`` polls (same codes). The last update
    carries ``ended`` and ``exit_code``; every step still pending is reported final in it. ``directory`` and
    ``options``: those of :class:`Watcher` (a :class:`Dump` of the directory too); ``sleep`` waits between polls (a
    test passes its own). Raises RolloutDiagError for bad options or a gate naming an unknown metric."""
    if not (isinstance(interval, (int, float)) and interval > 0 and math.isfinite(interval)):
        raise ConfigError(f"{option_name('interval')}={interval}: must be a positive number of seconds.")
    if exit_after_idle is not None and not exit_after_idle >= 0:
        raise ConfigError(f"{option_name('exit_after_idle')}={exit_after_idle}: must be 0 or more seconds.")
    watcher = Watcher(directory, **options)
    polls = 0
    while True:
        polls += 1
        try:
            update = watcher.poll()
        except WatchGone as gone:
            yield _ended(watcher, str(gone), 1)
            return
        if watcher.failed_gates and exit_on_fail:
            update.ended, update.exit_code = "a gate failed; the watch ends (--exit-on-fail).", 3
            yield update
            return
        idle_end = exit_after_idle is not None and update.idle >= exit_after_idle and not update.changed
        if idle_end or (max_polls is not None and polls >= max_polls):
            yield update
            why = (
                f"nothing new for {update.idle:.0f} s; the watch ends."
                if idle_end
                else f"{polls} poll{'s' if polls > 1 else ''} done; the watch ends."
            )
            try:
                last = watcher.poll(final=True)
            except WatchGone as gone:
                yield _ended(watcher, str(gone), 1)
                return
            last.ended, last.exit_code = why, 3 if watcher.failed_gates else 0
            yield last
            return
        yield update
        sleep(interval)


def _ended(watcher: Watcher, why: str, code: int) -> WatchUpdate:
    result = watcher.result
    level, sentence = verdict_of(result)
    return WatchUpdate(
        result=result,
        level=level,
        sentence=sentence,
        steps=[],
        notes=[],
        alerts=[],
        idle=time.monotonic() - watcher.last_change,
        changed=False,
        pending_steps=[],
        ended=why,
        exit_code=code,
    )


# ----------------------------------------------------------------------------------------------- helpers
def _signature(path: str) -> Signature | None:
    if storage.is_remote(path):
        return storage.signature(path)
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_size, info.st_mtime_ns)


def _ends_with_newline(path: str) -> bool:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            if handle.tell() == 0:
                return False
            handle.seek(-1, os.SEEK_END)
            return handle.read(1) == b"\n"
    except OSError:
        return False


def _steps_text(steps: frozenset[int] | set[int]) -> str:
    ordered = sorted(steps)
    return ", ".join(map(str, ordered[:10])) + (f", … ({len(ordered)} in all)" if len(ordered) > 10 else "")


def _step_level(step: StepResult) -> str:
    return str(step_levels([(step.step, step.metrics)])[0]["level"]) if step.tokens else "n/a"


def level_set_by(metrics: Mapping[str, float], level: str) -> list[str]:
    """The judged metrics of a step at its (watch or bad) level: what made the step's level; [] for ok and n/a."""
    if level not in ("watch", "bad"):
        return []
    levels = step_levels([(None, metrics)])[0]["levels"]
    growing = set(catalogue.keys_with_role(catalogue.Role.LENGTH_GROWING))
    return [metric for metric, found in levels.items() if found == level and metric not in growing]


def _step_families(analysis: Analysis) -> list[StepAccumulator]:
    """Every per-step accumulator in the analysis (its families, the hint evidence, the drift, each dialect's)."""
    return [*analysis.families, analysis.hint_evidence, analysis.drift, *analysis.dialect.step_accumulators()]


__all__ = ["DEFAULT_INTERVAL", "StepReport", "WatchGone", "WatchUpdate", "Watcher", "verdict_of", "watch"]
