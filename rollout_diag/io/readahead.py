"""The reader's threads: blocks produced on a thread of their own, a few items ahead (:func:`prefetched`); the
reading started before torch is loaded (:class:`ReadAhead`); chunks prepared on a pool of threads, handed out in order
(:func:`prepared`)."""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from rollout_diag.engine.arrays import device_kind
from rollout_diag.io.decode import Block
from rollout_diag.io.joining import Joiner
from rollout_diag.io.packing import Valid

if TYPE_CHECKING:
    from rollout_diag.io.chunk import Chunk


class Reading(Protocol):
    """What :class:`ReadAhead` uses of a reader (``io/reader.py`` ``DumpReader``)."""

    chunk_tokens: int

    def decoded_blocks(self) -> Generator[tuple[Block, int], None, None]: ...

    def validated(self, block: Block, device_type: str, engine: str) -> Valid | None: ...

    def built_chunk(self, valid: Valid, device: str, engine: str, kind: str) -> Chunk: ...


def prefetched(blocks: Iterator, depth: int) -> Iterator:
    """Run ``blocks`` in a thread (Parquet decoding releases the GIL), ``depth`` items ahead. A consumer that stops
    early closes ``blocks`` too (an earlier stage of a pipeline stops its own thread)."""
    items: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    thread = threading.Thread(
        target=_produce_ahead, args=(blocks, items, stop, done), name="rollout-diag-reader", daemon=True
    )
    thread.start()
    try:
        while True:
            item = items.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()


def _produce_ahead(blocks: Iterator, items: queue.Queue, stop: threading.Event, done: object) -> None:
    """``prefetched``'s thread: puts each of ``blocks`` into ``items`` until ``stop``, then ``done`` (or what it
    raised, for the consumer to raise), and closes ``blocks``."""
    try:
        for item in blocks:
            if not _offer(items, item, stop):
                break
        else:
            items.put(done)
    except BaseException as exc:  # handed to the consumer, raised there
        items.put(exc)
    finally:
        close = getattr(blocks, "close", None)
        if close is not None:
            close()


def _offer(items: queue.Queue, item: object, stop: threading.Event) -> bool:
    """Puts ``item`` once there is room, unless ``stop`` comes first; whether to go on (``stop`` not set)."""
    while not stop.is_set():
        try:
            items.put(item, timeout=0.1)
            break
        except queue.Full:
            continue
    return not stop.is_set()


class ReadAhead:
    """The reader's thread started before torch is loaded (``DumpReader.read_ahead``): until :meth:`handover` it
    decodes, validates with the numba engine's scan and runs each chunk's compiled passes
    (``engine/kernels/prepass.py``), numpy and numba only, keeping at most ``depth`` validated blocks; after it, it
    builds chunks as the reader's thread always does (``prefetched``), with the engine and the queue depth
    :meth:`chunks` chose."""

    _DONE = object()

    def __init__(self, reader: Reading, depth: int) -> None:
        self.reader = reader
        self.depth = depth
        self.items: deque = deque()
        self.changed = threading.Condition()
        self.device: str | None = None  # set by handover
        self.engine = "numba"
        self.kind = "torch"  # set by handover
        self.stopped = False
        self.thread = threading.Thread(target=self._produce, name="rollout-diag-reader", daemon=True)
        self.thread.start()

    def _produce(self) -> None:
        from rollout_diag.engine.kernels.prepass import warm_up

        reader = self.reader
        # numba and the compiled kernels load on a thread of their own (their import holds the GIL, as the command's
        # imports do), while this one decodes blocks, which it validates once they are loaded
        loading = threading.Thread(target=quietly(warm_up), name="rollout-diag-kernels", daemon=True)
        loading.start()
        decoded: deque = deque()
        blocks = reader.decoded_blocks()
        joiner = Joiner(reader.chunk_tokens)
        try:
            for item in itertools.chain(blocks, [None]):  # None: the end, where the blocks still decoded go on
                if item is not None:
                    decoded.append(item)
                    if loading.is_alive() and len(decoded) + len(self.items) < self.depth:
                        continue
                loading.join()
                if not self._validate(decoded, joiner):
                    return
            if self._put_ready(joiner.flush()):
                self._put(self._DONE)
        except BaseException as exc:  # handed to the consumer, raised there
            self._put(exc)
        finally:
            blocks.close()

    def _validate(self, decoded: deque, joiner: Joiner) -> bool:
        """Validates the blocks decoded so far and puts the chunks they complete; False once stopped."""
        while decoded:
            block, consumed = decoded.popleft()
            with self.changed:
                device, engine = self.device, self.engine
            valid = self.reader.validated(block, "cpu" if device is None else device_kind(device), engine)
            if valid is not None and not self._put_ready(joiner.add(valid, consumed)):
                return False
        return True

    def _put_ready(self, ready: list[tuple[Valid, int]]) -> bool:
        """Puts each joined block: as a chunk once handed over, else with its compiled passes run; False once
        stopped."""
        for valid, consumed in ready:
            with self.changed:
                device, engine, kind = self.device, self.engine, self.kind
            built = self._prepassed(valid) if device is None else self.reader.built_chunk(valid, device, engine, kind)
            if not self._put((built, consumed)):
                return False
        return True

    @staticmethod
    def _prepassed(valid: Valid) -> Valid:
        """``valid`` with its compiled passes run (before the handover: numpy and numba only)."""
        from rollout_diag.engine.kernels.prepass import prepass

        if valid.scanned is not None:
            trainer, rollout, mask = valid.scanned
            valid.prepass = prepass(valid.block.step, valid.offsets, trainer, rollout, mask, valid.float32)
            # the decoded values live on as the scan's: their Arrow buffers go while the chunk waits
            valid.block = replace(valid.block, trainer=None, rollout=None, mask=None)  # type: ignore[arg-type]  # read as valid.scanned from here
        return valid

    def _put(self, item: object) -> bool:
        with self.changed:
            while len(self.items) >= self.depth and not self.stopped:
                self.changed.wait()
            if self.stopped:
                return False
            self.items.append(item)
            self.changed.notify_all()
            return True

    def handover(self, device: str, engine: str, kind: str, depth: int) -> Iterator[tuple[Chunk, int]]:
        """The chunks on ``device`` with ``engine``, of ``kind`` arrays (those read ahead, then the rest), read
        ``depth`` ahead from now; closing the iterator stops the thread."""
        with self.changed:
            self.device, self.engine, self.kind, self.depth = device, engine, kind, depth
            self.changed.notify_all()
        return self._chunks(device, engine, kind)

    def _chunks(self, device: str, engine: str, kind: str) -> Iterator[tuple[Chunk, int]]:
        try:
            while True:
                with self.changed:
                    while not self.items:
                        self.changed.wait()
                    item = self.items.popleft()
                    self.changed.notify_all()
                if item is self._DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                value, consumed = item
                yield (
                    (self.reader.built_chunk(value, device, engine, kind) if isinstance(value, Valid) else value),
                    consumed,
                )
        finally:
            with self.changed:
                self.stopped = True
                self.items.clear()
                self.changed.notify_all()


def quietly(function: Callable[[], None]) -> Callable[[], None]:
    """``function`` for a helper thread whose failure the work after it meets again, and reports, itself."""

    def run() -> None:
        with contextlib.suppress(Exception):  # the reader's first use of the kernels raises it in its place
            function()

    return run


def prepared(
    chunks: Iterator[tuple[Chunk, int]], prepare: Callable[[Chunk], None], workers: int
) -> Iterator[tuple[Chunk, int]]:
    """The items of ``chunks`` in order, each after ``prepare(chunk)``, which a pool of ``workers`` threads runs on
    the chunks after the one handed out (each chunk is prepared on its own: the pool changes no digit)."""
    from concurrent.futures import Future, ThreadPoolExecutor

    pending: deque[tuple[Future, tuple[Chunk, int]]] = deque()
    pool = ThreadPoolExecutor(workers, thread_name_prefix="rollout-diag-prepare")
    try:
        for item in chunks:
            pending.append((pool.submit(prepare, item[0]), item))
            if len(pending) > workers:  # a chunk in every worker's hands and one more waiting
                future, ready = pending.popleft()
                future.result()  # raises what prepare raised
                yield ready
        while pending:
            future, ready = pending.popleft()
            future.result()
            yield ready
    finally:
        for future, _ in pending:
            future.cancel()
        pool.shutdown(wait=True)
        close = getattr(chunks, "close", None)
        if close is not None:  # stops the reader's thread when the caller stops early
            close()
