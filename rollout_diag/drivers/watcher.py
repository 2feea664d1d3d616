"""The run state of one watched dump directory (:class:`Watcher`), advanced a poll at a time: what is new, rewritten
or removed is read or taken out, and the steps that became final are handed to the :class:`Reporter` (see
``drivers/watch.py`` for what a poll does with each kind of file)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout_diag.decisions.check import Gate
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
from rollout_diag.drivers.watchfiles import (
    FileRecord,
    Signature,
    completed_steps,
    ends_with_newline,
    file_signature,
    merged_log,
    step_families,
    steps_text,
)
from rollout_diag.drivers.watchreport import Reporter, StepReport, WatchGone, WatchUpdate, verdict_of
from rollout_diag.errors import ConfigError, DataError, InputError, RolloutDiagError
from rollout_diag.io import storage
from rollout_diag.io.formats import PARQUET, check_format, prime_rl, resolve, step_of
from rollout_diag.io.opening import describe_columns
from rollout_diag.io.reader import DEFAULT_CHUNK_TOKENS, DumpReader
from rollout_diag.io.readlog import ReadLog
from rollout_diag.io.sources import Source
from rollout_diag.metrics.dialects import DEFAULT as DEFAULT_DIALECT
from rollout_diag.metrics.dialects import resolve as resolve_dialects
from rollout_diag.metrics.localize import DEFAULT_CATASTROPHIC, DEFAULT_TOP_K
from rollout_diag.metrics.prompts import PromptAccumulator
from rollout_diag.metrics.rounds import DEFAULT_MAX_ROUNDS
from rollout_diag.metrics.rowstats import RowStatsCollector
from rollout_diag.results import AnalysisResult, RowStats

if TYPE_CHECKING:
    import torch  # annotations only: the driver's arithmetic runs in passes and metrics


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
        self.directory: str | Path = remote or Path(directory)
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
        self.reporter = Reporter(gates)
        self.analysis = self.new_analysis()
        self.files: dict[str, FileRecord] = {}
        self.order: list[str] = []  # listed files in the order analyze reads them
        self.format: str | None = None
        self.listing_warnings: list[str] = []
        self.seen: dict[str, Signature] = {}  # files not read yet: signature at the last poll
        self.failed: dict[str, Signature] = {}  # files that could not be read, until they change
        self.complete_steps: set[int] = set()
        self.listed_steps: set[int] = set()  # steps the listed files' names or directories carry
        self.unread_steps: set[int] = set()  # … of the listed files not read (yet)
        self.versions: dict[int, int] = {}  # step -> how many times its state changed
        self.result: AnalysisResult | None = None
        self.known_findings: set[str] = set()  # notes said once
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
            pending_steps=[s for s in known if s not in self.reporter.reported],
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
            signature = file_signature(source.path)
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
            notes.append(f"{path}: {what}; step(s) {steps_text(record.steps)} replaced.")
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
            if late and any(step in self.reporter.reported for step in record.steps):
                notes.append(f"{source.path}: joins step(s) {steps_text(record.steps)} (arrived late).")
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
        return ends_with_newline(source.path)

    def _update_complete_steps(self) -> None:
        """Steps whose ``DumpWriter`` completion markers come from every rank of the world size they state."""
        if self.format == PARQUET:
            self.complete_steps |= completed_steps(self.directory, self.complete_steps)

    # -- reading ---------------------------------------------------------------------------------------
    def _read(self, source: Source, signature: Signature | None, notes: list[str]) -> FileRecord | None:
        """Read one file into its own Analysis and merge it into the run's; None when it cannot be read yet."""
        signature = signature or file_signature(source.path)
        if signature is None:
            return None
        try:
            reader = self._reader(source)
            if reader.log.layout != self._layout(reader.log.layout):
                raise InputError(f"{source.path}: {reader.log.layout} layout, the files before it have another.")
            reader.log.finished = True  # keep the row keys: duplicates are found over every file (_log)
            analysis = self.new_analysis()
            rows = RowStatsCollector() if self.reporter.need_rows else None
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
        record = FileRecord(
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
        for family in step_families(self.analysis):
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

    def _refill_rows(self, steps: set[int], left: list[FileRecord]) -> None:
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

    @property
    def failed_gates(self) -> bool:
        """Whether a gate has failed on the run or a step so far."""
        return self.reporter.failed_gates

    # -- results ---------------------------------------------------------------------------------------
    def _log(self) -> ReadLog:
        """The reading log ``analyze`` would have kept over the files read so far."""
        paths = [path for path in self.order if path in self.files]
        log = ReadLog(files=paths, format=self.format or PARQUET)
        return merged_log([self.files[path] for path in paths], log, self.listing_warnings)

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
        if self.result is None:
            return [], []
        return self.reporter.report(self.result, self._final_steps(final), self.versions, self._row_stats, final)

    def _row_stats(self) -> RowStats:
        """The run's per-row statistics: every file's, merged."""
        collector = RowStatsCollector()
        for record in self.files.values():
            if record.rows is not None:
                collector.merge(record.rows)
        return collector.finalize()
