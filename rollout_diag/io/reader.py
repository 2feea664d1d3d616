"""Stream dumps into validated chunks of whole rows: the reader's seam (``DumpReader``) and chunk building.

The reading is split by job, each in its own module:
- ``io/sources.py`` finds the inputs, ``io/formats/`` knows each trainer's own dump (a format is one module);
- ``io/opening.py`` opens one file: its columns, their roles, its layout, the warnings it earns up front;
- ``io/decode.py`` decodes row groups into blocks of whole rows (numpy), for both layouts:
  sequence (one row per sequence, list columns: what verl/SkyRL dump) and token (one row per token, scalar
  columns plus ``sample_id``; consecutive tokens of one (step, sample_id) form a sequence);
- ``io/validate.py`` skips and records the rows a metric must not see;
- ``io/readlog.py`` keeps what a read saw (skipped rows, warnings), mergeable across workers;
- ``io/packing.py`` holds a validated block and packs it into a chunk's arrays (``io/chunk.py``), numpy or torch;
- ``io/joining.py`` joins small blocks (of one file or the next ones) into one chunk;
- ``io/readahead.py`` runs the reading on a thread of its own (and before torch is loaded) and prepares chunks on a
  pool of threads;
- here, ``DumpReader``: the inputs opened up front, the row groups planned across workers, the blocks decoded (small
  files ahead, on a few threads), validated and built into chunks.

Memory: one record batch per file at a time (a row group is decoded at once by Parquet), plus at most
``prefetch`` decoded blocks waiting and two chunks' worth of small files decoded ahead; nothing is kept across
chunks but small counters.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from numbers import Integral
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np
import pyarrow as pa

from rollout_diag.cores import available_cores
from rollout_diag.engine.arrays import device_kind, device_name
from rollout_diag.errors import ColumnError, ConfigError, InputError, RolloutDiagError, option_name
from rollout_diag.io import storage
from rollout_diag.io.decode import (
    Block,
    may_hold,
    read_sequences,
    read_tokens,
    split_steps,
)
from rollout_diag.io.formats import PARQUET, DumpInputs, input_options, resolve
from rollout_diag.io.formats.base import ParquetSource
from rollout_diag.io.joining import Joiner
from rollout_diag.io.opening import (
    OpenFile,
    describe_columns,
    extra_cap_warnings,
    float16_warnings,
    listed_columns,
    no_token_column,
    normalised,
    one_line,
    open_input,
)
from rollout_diag.io.packing import (
    Valid,
    chunk_extra,
    is_narrow,
    numpy_columns,
    prompt_keys,
    prompt_nulls,
    scanned_values,
    tensor_columns,
    text_lookup,
)
from rollout_diag.io.readahead import ReadAhead, prefetched, prepared
from rollout_diag.io.readlog import ZERO_ROLLOUT_TRAINER_BELOW, ReadLog, row_keys
from rollout_diag.io.sources import Source
from rollout_diag.io.validate import count_fills, validate_block
from rollout_diag.memory import collect_from_here
from rollout_diag.paths import names_file

if TYPE_CHECKING:  # torch is imported when the first chunk is built: opening files and their errors come first
    import torch

    from rollout_diag.io.chunk import Chunk

# ~1M tokens: 8 MB per float64 quantity. Each chunk costs the families a fixed few ms of bookkeeping: against 512K,
# 100M tokens took 0.93 of the wall for `analyze` (peak +50 MiB) and 0.87 for `compare-presets` (+150 MiB); 2M is no
# faster for `analyze`, only bigger (docs/benchmarks.md, issue 20 session 10). The commands with presets, whose
# accumulators cost twice as much a chunk, read 2M (drivers/dump.PRESET_CHUNK_TOKENS, session 11).
DEFAULT_CHUNK_TOKENS = 1 << 20


# --------------------------------------------------------------------------------------- the reader
def checked_chunk_tokens(chunk_tokens: object) -> int:
    """``chunk_tokens`` as an int; raises ConfigError unless it is a positive whole number."""
    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, Integral) or chunk_tokens < 1:
        raise ConfigError(f"{option_name('chunk_tokens')}={chunk_tokens}: must be a positive whole number of tokens.")
    return int(chunk_tokens)


class DumpReader:
    """Opens every input up front (so a bad file fails before any work), then streams chunks."""

    def __init__(
        self,
        inputs: str | Sequence[str] | Sequence[Source],
        columns: Mapping[str, str] | None = None,
        *,
        strict: bool = False,
        chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
        parts: Mapping[str, Sequence[int]] | None = None,
        input_format: str | None = None,
        trust_pickle: bool | None = None,
    ) -> None:
        """``inputs``: files, globs and directories, or the :class:`Source` list another reader resolved (then
        nothing is expanded again). ``columns``: the user's role -> column overrides; each file resolves its own
        columns from them. ``parts``: read only these row groups of these files (by path), as :meth:`plan`
        splits them. ``input_format``: a name of ``io.formats.FORMAT_NAMES`` (default: what ``inputs`` carries,
        else detected); ``trust_pickle`` lifts the pickle allowlist (``io/formats/safe_pickle.py``).
        Raises InputError / ColumnError for unreadable input, ConfigError for a bad chunk size."""
        chunk_tokens = checked_chunk_tokens(chunk_tokens)
        carried_format, carried_trust = input_options(inputs)
        self.trust_pickle = carried_trust if trust_pickle is None else trust_pickle
        self.strict = strict
        self.chunk_tokens = chunk_tokens
        self.overrides = dict(columns or {})
        self.parts = None if parts is None else {path: set(groups) for path, groups in parts.items()}
        self._ahead: ReadAhead | None = None  # the reading started before torch was loaded (read_ahead)
        self.log = ReadLog()
        # Called per record batch with (batch, steps) -> bool per row: the rows to read (rollout_diag/selection.py).
        self.selection: Callable[[pa.RecordBatch | pa.Table, np.ndarray], np.ndarray] | None = None
        given: Sequence[str] | Sequence[Source] = [inputs] if isinstance(inputs, str) else inputs  # or Sources resolved
        resolved = [item for item in given if isinstance(item, Source)]
        self.sources: list[Source]
        if given and len(resolved) == len(given):
            self.sources = resolved
            self.log.format = input_format or carried_format or PARQUET
        else:  # names (the signature's other kind)
            names = cast("Sequence[str]", given)
            self.log.format, self.sources = resolve(names, input_format or carried_format, self.log.warnings)
        self.files = self._open_sources(given)
        first = self.files[0]
        self.log.files = [f.source.path for f in self.files]
        # where each analysed row's (step, sample_id) key comes from: (file index, whether ids are real)
        self._file_index = {f.source.path: (i, "sample_id" in f.columns) for i, f in enumerate(self.files)}
        self.log.mask_candidates = {f.source.path: list(f.mask_candidates) for f in self.files}
        self.log.columns = {
            role: (f"{name} (partition)" if role in first.columns.from_partition else name)
            for role, name in first.columns.names.items()
        }
        layouts = {f.layout for f in self.files}
        if len(layouts) > 1:
            first_of = {f.layout: f.source.path for f in reversed(self.files)}
            raise InputError(
                f"{first_of['token']}: token layout (one row per token), but {first_of['sequence']} has the "
                "sequence layout (one row per sequence); analyse them separately."
            )
        self.log.layout = first.layout
        for opened in self.files[1:]:
            if dict(opened.columns.names) != dict(first.columns.names):
                self.log.warnings.append(
                    f"{opened.source.path}: columns differ from the first file's "
                    f"({describe_columns(opened.columns)} vs {describe_columns(first.columns)})."
                )
        self.log.total_rows = sum(f.parquet.metadata.num_rows for f in self.files)
        if self.log.total_rows == 0:
            raise InputError(f"{', '.join(self.log.files)}: no rows in the input.")
        for opened in self.files:
            if opened.parquet.metadata.num_rows == 0:
                self.log.warnings.append(f"{opened.source.path}: file has no rows.")
        self.log.warnings.extend(extra_cap_warnings(self.files))
        self.log.warnings.extend(float16_warnings(self.files))

    def _open_sources(self, given: Sequence[str | Source]) -> list[OpenFile]:
        """Open every source. A Parquet file found in a directory or by a glob that has none of a dump's per-token
        columns (training statistics beside the run) is left out with a warning naming it; a file named on its own,
        or one with some of those columns but not all, is an error."""
        named = {normalised(item) for item in given if not isinstance(item, Source)}
        opened: list[OpenFile] = []
        kept: list[Source] = []
        first_error: ColumnError | None = None
        for source in self.sources:
            try:
                opened.append(open_input(source, self.overrides, self.log.format, self.trust_pickle))
                kept.append(source)
            except ColumnError as exc:
                stray = self.log.format == PARQUET and normalised(source.path) not in named
                if not stray or not no_token_column(source.path, self.overrides):
                    raise
                first_error = first_error or exc
                self.log.warnings.append(
                    f"{source.path}: skipped: not part of the dump (no logprob, mask or token column; "
                    f"{listed_columns(source.path)})."
                )
        if not opened:
            raise first_error  # type: ignore[misc]  # every file was stray: say why the first one is not a dump
        self.sources = kept
        return opened

    def select(self, selection: Callable[[pa.RecordBatch | pa.Table, np.ndarray], np.ndarray] | None) -> None:
        """Read only the rows ``selection(batch, steps)`` keeps; it may first ``check(schema, path)`` every file's
        per-row columns (a bad predicate fails before any reading)."""
        if selection:  # an empty RowSelection (no predicate, no steps) reads every row
            self._not_reading_yet("select rows")
        if selection is not None and hasattr(selection, "check"):
            for opened in self.files:  # what a predicate may name: the per-row values, never a token's
                roles = ("step", "sample_id", "policy_version")
                per_row = [
                    opened.columns.names[r]
                    for r in roles
                    if r in opened.columns.names and r not in opened.columns.from_partition
                ]
                per_row += [n for n in opened.extras if n not in per_row]
                selection.check(opened.parquet.schema_arrow, opened.source.path, per_row)
        self.selection = selection or None

    def row_columns(self) -> list[str]:
        """The per-row scalar columns carried in ``Chunk.extra`` (any file's, policy_version first): what ``--by``
        can group by."""
        names: dict[str, None] = {}
        for opened in self.files:
            version = opened.columns.get("policy_version")
            if version is not None and "policy_version" not in opened.columns.from_partition:
                names[version] = None
            names.update(dict.fromkeys(opened.extras))
        return list(names)

    def narrow(self, step: int | None = None, sample_id: str | None = None) -> None:
        """Read only the row groups that may hold rows of ``step`` / ``sample_id``, judged by the Parquet
        row-group statistics (a group without statistics is read) and hive partition values."""
        self._not_reading_yet("narrow the input")
        parts: dict[str, list[int]] = {}
        for opened in self.files:
            partition = opened.source.partition
            wanted = {"step": step, "sample_id": sample_id}
            if any(
                value is not None
                and role in opened.columns.from_partition
                and str(partition[opened.columns.names[role]]) != str(value)
                for role, value in wanted.items()
            ):
                continue
            metadata = opened.parquet.metadata
            groups = [
                group
                for group in range(metadata.num_row_groups)
                if all(
                    may_hold(opened, metadata.row_group(group), role, value)
                    for role, value in wanted.items()
                    if value is not None and role in opened.columns and role not in opened.columns.from_partition
                )
            ]
            if groups:
                parts[opened.source.path] = groups
        self.parts = {path: set(groups) for path, groups in parts.items()}

    def narrow_to_row(self, place: str) -> tuple[str, int]:
        """Read only the row group holding ``FILE:ROW`` (token layout: and those after it, where the sequence may
        go on); returns (file path, row). FILE is a path as given or resolved, or a file name unique in the input.
        Raises InputError when no file, or more than one, matches, or the file has no such row."""
        self._not_reading_yet("narrow the input")
        name, sep, number = place.rpartition(":")
        if not sep or not name or not number.strip().isdigit():
            raise InputError(
                f"{option_name('row')}={place}: expected FILE:ROW, e.g. part-0.parquet:12 (as the tables print it)."
            )
        row = int(number)
        matches = [
            f
            for f in self.files
            if f.source.path == name
            or names_file(name, f.source.path)  # as the tables label it: step=3/rank-0.parquet
            or Path(f.source.path).resolve() == Path(name).resolve()
        ]
        if len({f.source.path for f in matches}) != 1:
            found = "no input file" if not matches else f"{len(matches)} input files"
            raise InputError(
                f"{option_name('row')}={place}: {found} named {name} (inputs: {', '.join(self.log.files[:5])})."
            )
        opened = matches[0]
        metadata = opened.parquet.metadata
        if not 0 <= row < metadata.num_rows:
            raise InputError(
                f"{option_name('row')}={place}: {opened.source.path} has rows 0 to {metadata.num_rows - 1}."
            )
        first = 0
        for group in range(metadata.num_row_groups):
            first += metadata.row_group(group).num_rows
            if row < first:
                break
        last = group if opened.layout == "sequence" else metadata.num_row_groups - 1
        self.parts = {opened.source.path: set(range(group, last + 1))}
        return opened.source.path, row

    def input_size(self) -> tuple[int, int] | None:
        """(tokens, rows) this reader reads, from the files' footers: what the engine ``auto`` is chosen by
        (``engine.choice.kernel_for``); tokens count model and environment tokens, rows are file rows. None where a
        footer does not say (a trainer's own format)."""
        tokens = rows = 0
        for opened in self.files:
            if self.parts is not None and opened.source.path not in self.parts:
                continue
            size = _footer_size(opened, None if self.parts is None else self.parts[opened.source.path])
            if size is None:
                return None
            tokens, rows = tokens + size[0], rows + size[1]
        return tokens, rows

    def worker_inputs(self) -> DumpInputs:
        """The files to hand a worker's reader, with the format they were read as (never re-detected)."""
        return DumpInputs(self.sources, self.log.format, self.trust_pickle)

    def plan(self, workers: int) -> list[dict[str, list[int]]]:
        """Split the input into at most ``workers`` parts of about equal rows, for parallel readers.

        Sequence layout splits at row-group boundaries (rows never span row groups); token layout at file
        boundaries (a sequence's tokens may span row groups of one file).
        """
        units: list[tuple[str, int, int]] = []  # (path, row group or -1 for the whole file, rows)
        for opened in self.files:
            metadata = opened.parquet.metadata
            if opened.layout == "sequence":
                units += [
                    (opened.source.path, g, metadata.row_group(g).num_rows) for g in range(metadata.num_row_groups)
                ]
            else:
                units.append((opened.source.path, -1, metadata.num_rows))
        total = sum(rows for *_, rows in units)
        parts: list[dict[str, list[int]]] = [{}]
        filled = 0
        for path, group, rows in units:
            if filled >= total * len(parts) / workers and len(parts) < workers:
                parts.append({})
            groups = parts[-1].setdefault(path, [])
            metadata = next(f.parquet.metadata for f in self.files if f.source.path == path)
            groups.extend(range(metadata.num_row_groups) if group < 0 else [group])
            filled += rows
        return [part for part in parts if part]

    def read_ahead(self, depth: int) -> None:
        """Start reading now, on the reader's thread, before torch is loaded: the numba engine's work on the CPU that
        needs no torch (Parquet decoding, the validation scan, each chunk's compiled passes,
        ``engine/kernels/prepass.py``) runs beside the command's imports, which hold one core. At most ``depth`` chunks
        wait (their arrays, ~17 bytes a token); :meth:`chunks` takes them over. Only for the numba engine on the CPU
        (the caller knows it without torch: ``drivers/dump.py``) and a reader read whole by this process (no
        selection, no parts)."""
        if self._ahead is None:
            self._not_reading_yet("read ahead")
            self._ahead = ReadAhead(self, max(1, depth))

    @property
    def reads_ahead(self) -> bool:
        """Whether :meth:`read_ahead` has started the reading (its chunk size is then fixed)."""
        return self._ahead is not None

    def resize(self, chunk_tokens: int) -> None:
        """Read chunks of ``chunk_tokens`` tokens, set before the reading starts. Raises ConfigError for a bad size."""
        self._not_reading_yet("resize its chunks")
        self.chunk_tokens = checked_chunk_tokens(chunk_tokens)

    def _not_reading_yet(self, what: str) -> None:
        if self._ahead is not None:
            raise RuntimeError(f"cannot {what}: the reader already reads ahead (DumpReader.read_ahead)")

    def chunks(
        self,
        device: str | torch.device = "cpu",
        prefetch: int = 1,
        prepare: Callable[[Chunk], None] | None = None,
        numpy: bool = False,
    ) -> Iterator[tuple[Chunk, int]]:
        """Yield (chunk, file rows consumed so far) on ``device``. The numba engine's chunks are numpy arrays with
        ``numpy`` (the caller's arithmetic takes them: torch is not loaded), else CPU tensors on the same memory; the
        torch engine's are tensors on ``device``.

        With ``prefetch`` > 0 a reader thread decodes, validates and builds chunks ahead, and a pool of threads (one
        per core but one; one in a worker process, which reads a part beside other workers) runs ``prepare(chunk)``
        (e.g. the per-chunk arithmetic every metric shares) on the next chunks, so reading, that arithmetic and the
        caller's work on an earlier chunk overlap (pyarrow, the compiled kernels and torch release the GIL). Chunks
        come out in file order whatever the pool's size. A reader that reads ahead (:meth:`read_ahead`) hands over
        its thread and the chunks it has read.
        """
        from rollout_diag.engine.choice import kernel_for

        device = device_name(device)
        # numpy chunks load no torch: the kernels then win at any size (kernel_for's small-input rule is for
        # readings of tensor chunks, which load torch anyway: inspect)
        engine = "numba" if kernel_for(device_kind(device), None if numpy else self.input_size()) else "torch"
        kind = "numpy" if numpy and engine == "numba" else "torch"
        collect_from_here()  # the command line's collector back on, its modules loaded (rollout_diag.memory)
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            workers = _prepare_workers()
            built = ahead.handover(device, engine, kind, max(prefetch, workers, 1))
            yield from built if prepare is None else prepared(built, prepare, workers)
        elif prefetch <= 0:
            yield from self._built_chunks(device, engine, kind, prepare)
        elif prepare is None:
            yield from prefetched(self._built_chunks(device, engine, kind, None), prefetch)
        else:
            workers = _prepare_workers() if self.parts is None else 1
            built = prefetched(self._built_chunks(device, engine, kind, None), max(prefetch, workers))
            yield from prepared(built, prepare, workers)
        if self.parts is None:  # the whole input was read here (a worker's part is finished by the driver)
            self.log.finish()

    def _built_chunks(
        self, device: str, engine: str, kind: str, prepare: Callable[[Chunk], None] | None
    ) -> Iterator[tuple[Chunk, int]]:
        joiner = Joiner(self.chunk_tokens)
        for item in itertools.chain(self.decoded_blocks(), [None]):  # None: the end, where the joiner flushes
            if item is None:
                ready = joiner.flush()
            else:
                valid = self.validated(item[0], device_kind(device), engine)
                ready = [] if valid is None else joiner.add(valid, item[1])
            for joined, at in ready:
                chunk = self.built_chunk(joined, device, engine, kind)
                if prepare is not None:
                    prepare(chunk)
                yield chunk, at

    # -- decoding --------------------------------------------------------------------------------
    def decoded_blocks(self) -> Generator[tuple[Block, int], None, None]:
        """The first stage of a read: each decoded block of whole rows, with the input rows consumed so far."""
        consumed = 0
        for decoded in self._decoded_files():
            for block, rows in decoded:
                pieces = split_steps(block)  # a chunk's per-step partials are allocated per step it holds
                for piece in pieces[:-1]:
                    yield piece, consumed
                consumed += rows
                yield pieces[-1], consumed

    def _decoded_files(self) -> Iterator[Iterable[tuple[Block, int]]]:
        """Each file's (block, file rows) in reading order. Small Parquet files (at most ``chunk_tokens`` tokens by
        their footer) are decoded ahead, ``_decoding_threads()`` at a time (Parquet decoding releases the GIL), each
        with a log of its own folded into this reader's when its blocks are handed out: the same blocks, skip records
        and warnings in the same order as one file after the other. Larger files, and a worker's part, are decoded
        here in order (a whole large file is never held)."""
        files = [f for f in self.files if self.parts is None or f.source.path in self.parts]
        threads = _decoding_threads() if self.parts is None and len(files) > 1 else 1
        if threads <= 1:
            yield from (self._decoded(opened, self) for opened in files)
            return
        from concurrent.futures import Future, ThreadPoolExecutor

        pool = ThreadPoolExecutor(threads, thread_name_prefix="rollout-diag-decode")
        ahead: deque[tuple[OpenFile, Future | None, int]] = deque()  # (file, its decoding if small, its tokens)
        remaining = iter(files)
        tokens_ahead = 0
        try:
            while True:
                # each thread busy and one more file decoded for each, at most two chunks' worth
                while len(ahead) < 2 * threads and tokens_ahead < 2 * self.chunk_tokens:
                    opened = next(remaining, None)
                    if opened is None:
                        break
                    size = _footer_size(opened, None)
                    tokens = 0 if size is None or size[0] > self.chunk_tokens else size[0]
                    ahead.append((opened, pool.submit(self._decoded_apart, opened) if tokens else None, tokens))
                    tokens_ahead += tokens
                if not ahead:
                    return
                opened, future, tokens = ahead.popleft()
                tokens_ahead -= tokens
                if future is None:
                    yield self._decoded(opened, self)
                    continue
                blocks, log = future.result()  # raises what decoding the file raised, in its turn
                self.log.fold(log)
                yield blocks
        finally:
            for _, future, _ in ahead:
                if future is not None:
                    future.cancel()
            pool.shutdown(wait=True)

    def _decoded_apart(self, opened: OpenFile) -> tuple[list[tuple[Block, int]], ReadLog]:
        """``opened``'s blocks decoded whole, with the log its decoding wrote (on a decoding thread)."""
        apart = _Apart(self)
        return list(self._decoded(opened, apart)), apart.log

    @staticmethod
    def _decoded(opened: OpenFile, reading: DumpReader | _Apart) -> Iterator[tuple[Block, int]]:
        """``opened``'s (block, file rows), decoded with ``reading``'s options into its log."""
        decode = read_sequences if opened.layout == "sequence" else read_tokens
        try:
            yield from decode(opened, reading)
        except (UnicodeDecodeError, pa.ArrowException, OSError) as exc:
            if isinstance(exc, OSError) and storage.is_remote(opened.source.path):  # the network, not the file
                raise storage.failure(opened.source.path, exc) from exc
            # Decoding errors outside a row group's read (text columns, metadata) mean a corrupt file.
            raise InputError(
                f"{opened.source.path}: cannot be decoded, the file is corrupt ({one_line(exc)})."
            ) from exc
        finally:
            opened.parquet.close()  # its descriptor and last row group's buffers (io/formats/base.ParquetSource)

    def validated(self, block: Block, device_type: str, engine: str) -> Valid | None:
        """The block validated (bad rows recorded and dropped; None when none is left), with the numba engine's
        scanned arrays on the CPU: numpy only, so the reader can do it before torch is loaded."""
        scanned = None if block.skipped or engine != "numba" else scanned_values(block, device_type)
        if scanned is None:  # the exact check, which finds and records the bad rows
            checked = validate_block(block, self.log, self.strict)
            if checked is None:
                return None
            block = checked
        file_index, has_ids = self._file_index[block.file]
        if block.mask is None:
            counts = self.log.unmasked.setdefault(block.file, [0, 0])
            counts[0] += len(block.rollout)
            counts[1] += int(np.count_nonzero((block.rollout == 0.0) & (block.trainer < ZERO_ROLLOUT_TRAINER_BELOW)))
        sides = (block.trainer, block.rollout) if scanned is None else scanned[:2]
        for role, values in zip(("trainer", "rollout"), sides, strict=True):
            # the scan's values are zero on environment tokens; the block's are masked here
            found = count_fills(block, role, values, block.mask if scanned is None else None)
            if found is not None:
                self.log.add_fills(block.file, role, found)
        nulls = prompt_nulls(block)
        if nulls:
            self.log.prompt_nulls[block.file] = self.log.prompt_nulls.get(block.file, 0) + nulls
        keys = row_keys(block.step, block.sample_id)  # the read log's, and the chunk's (Chunk.row_key)
        if has_ids:
            self.log.row_keys.append(keys)
            self.log.row_places.append(np.stack([np.full(len(block.file_row), file_index), block.file_row], axis=1))
        offsets = np.zeros(len(block.lengths) + 1, dtype=np.int64)
        np.cumsum(block.lengths, out=offsets[1:])
        return Valid(block, offsets, scanned, float32=is_narrow(block), row_keys=keys)

    def built_chunk(self, valid: Valid, device: str, engine: str, kind: str) -> Chunk:
        """The validated block as a Chunk of ``kind`` arrays: ``numpy`` (the numba engine's, torch not loaded) or
        ``torch`` tensors on ``device``."""
        from rollout_diag.io.chunk import Chunk

        block, offsets = valid.block, valid.offsets
        columns = numpy_columns(valid) if kind == "numpy" else tensor_columns(valid, device)
        text = block.token_text
        prompt_key, prompt_source = prompt_keys(valid)
        return Chunk(
            **columns,
            prompt_key=prompt_key,
            prompt_source=prompt_source,
            sample_id=block.sample_id,
            file=[block.file] * len(block.lengths) if valid.files is None else valid.files,
            file_row=block.file_row.tolist(),
            token_text=None if text is None else text_lookup(text, offsets),
            extra=chunk_extra(block),
            engine=engine,
            prepass=valid.prepass if engine == "numba" else None,
            float32=valid.float32,
            row_key=valid.row_keys,
        )


def _footer_size(opened: OpenFile, groups: set[int] | None) -> tuple[int, int] | None:
    """(tokens, rows) in ``groups`` (None: every row group) of a Parquet file, from its footer: tokens are rows in
    the token layout, the trainer column's list values in the sequence layout. None for a trainer format's rows
    (no footer)."""
    parquet = opened.parquet
    if not isinstance(parquet, ParquetSource):
        return None
    metadata = parquet.metadata
    chosen = range(metadata.num_row_groups) if groups is None else sorted(groups)
    rows = sum(metadata.row_group(group).num_rows for group in chosen)
    if opened.layout != "sequence":
        return rows, rows
    name = opened.columns.get("trainer")
    leaf = next(
        (j for j in range(metadata.num_columns) if parquet.schema.column(j).path.startswith(f"{name}.")),
        None,
    )
    if leaf is None:
        return None
    return sum(metadata.row_group(group).column(leaf).num_values for group in chosen), rows


@dataclass
class _Apart:
    """What decoding reads of a reader (``io/decode.py``: parts, strict, chunk size, row selection), with a log of
    its own: a file decoded on a decoding thread writes its skip records and warnings there, and the reader folds
    them into its own log in reading order (``ReadLog.fold``)."""

    parts: dict[str, set[int]] | None
    strict: bool
    chunk_tokens: int
    selection: Callable[[pa.RecordBatch | pa.Table, np.ndarray], np.ndarray] | None
    log: ReadLog

    def __init__(self, reader: DumpReader) -> None:
        self.parts, self.strict, self.chunk_tokens = reader.parts, reader.strict, reader.chunk_tokens
        self.selection, self.log = reader.selection, ReadLog()


# Threads that decode small files ahead. One thread decoding file after file was the bottleneck of a directory dump:
# ~0.4 ms of Parquet's own set-up per file besides the decoding (100M tokens in 2 248 files: 3.0 s to decode against
# 2.1 s in one file; docs/benchmarks.md, session 13). More than four gain nothing while one thread validates.
MAX_DECODING_THREADS = 4


def _decoding_threads() -> int:
    return min(available_cores(), MAX_DECODING_THREADS)


def _prepare_workers() -> int:
    """Threads that prepare chunks: one per core but one (the reader's), at least one."""
    return max(1, available_cores() - 1)


__all__ = ["DEFAULT_CHUNK_TOKENS", "DumpReader", "ReadLog", "RolloutDiagError"]
