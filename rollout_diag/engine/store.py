"""A family's per-step table as chunks feed it: sealed parts, an open part, finished layers, per-row values aside.

A chunk merges into the open part only (the latest steps), so a chunk costs what it holds, not what the table holds;
the parts are joined (concatenated: no arithmetic, so no digit changes) when the table is read. The open part's merges
are deferred: the chunks that go on with it are kept as they came and folded into it in one pass (StateTable.folded,
the chain's digits) when it is sealed or read, not merged one by one (each merge copied every field of the open part:
a family's dozens of fields, a few numpy calls each, every chunk).

A chunk that goes back in steps (per-rank files each holding every step, the same file read twice) reaches steps the
parts have sealed. Merged into the whole table, it would cost what the table holds, chunk after chunk (the ragged
fields' rows concatenated and sorted each time): quadratic over such a run. Instead it starts a *layer*: the parts so
far become a finished layer, kept as they are, and the chunk starts the parts anew. The table is the finished layers
and the parts folded in order (StateTable.folded: one pass, each entry copied once), when it is read or when the
finished layers grow (``StepStore._begin_layer``).

Digits: a chain of merges, chunk after chunk, reduces each step's (and bucket's) partial states left to right, in the
order the chunks came: reduce(reduce(c1, c2), c3)… The first layer merges as the chain does (a chunk going on with the
open step is reduced into it); a later layer never merges (a chunk that goes on with its open step starts a layer too),
so each of its steps holds one chunk's state, and the fold, left to right over the layers, reduces exactly what the
chain would, in its order: the same table, bit for bit, however the chunks come (but a NaN's sign: which of two NaNs a
merge keeps is numpy's choice by SIMD lane, so it follows the lengths of the arrays merged; NaN reads and prints as NaN
either way). Layers that merged within themselves would be cheaper to hold, but would reduce a step split over two
chunks as reduce(earlier, reduce(c1, c2)) and change the last digits of a re-read input.

Per-row values (``concat`` fields: the sweep's row statistics) are held aside, a chunk's block at a time, and joined to
the table when it is read. Merged with the table, a chunk going on with the open step copied every row of that step so
far: the run's sweep (every chunk into one step) or a dump of one big step copied all the rows read, chunk after chunk
(quadratic: ~35 MiB a G tokens copied per chunk at 1G, and a block of a new size each time for the heap to place).
Joining is concatenation, a step's rows in the order they came: the table is the same, byte for byte.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from rollout_diag.engine.state import StateTable

# The open part is sealed off once it holds more steps than this: a fold then copies at most about this many steps'
# states with the chunks that waited. Each fold costs every field of every family a few numpy calls whatever it holds,
# so folds are kept rare (16: a fold every ~8 chunks of the 100M dump, 0.45 ns/token of the main thread at 20M).
OPEN_STEPS = 64
# The chunks that go on with the open part are folded into it once this many wait (a run of one step never seals it).
PENDING_CHUNKS = 64
# The finished layers are folded, whatever their size, once more than LAYERS of them span one step (a fold reduces that
# many states of the step one after another), or once there are more than HELD_LAYERS of them (the tables held, and
# the work of deciding when to fold).
LAYERS = 64
HELD_LAYERS = 1024


class Layer(NamedTuple):
    """A finished layer (``StepStore._begin_layer``): its parts, in step order, and what deciding when to fold weighs
    (the bytes its arrays hold, its first and last step)."""

    pieces: tuple[StateTable, ...]
    nbytes: int
    first: int
    last: int

    @classmethod
    def of(cls, pieces: Sequence[StateTable]) -> Layer:
        spanned = [piece.steps for piece in pieces if piece.steps.shape[0]]
        return cls(tuple(pieces), sum(piece.nbytes() for piece in pieces), int(spanned[0][0]), int(spanned[-1][-1]))


def layer_depth(layers: Sequence[Layer]) -> int:
    """The most layers whose spans (first to last step) hold one step: at most this many states of a step reduce one
    after another in a fold. The most spans hold some span's first step x: those that begin at or before x, less those
    that end before it."""
    first = np.sort(np.array([layer.first for layer in layers], dtype=np.int64))
    last = np.sort(np.array([layer.last for layer in layers], dtype=np.int64))
    return int((np.searchsorted(first, first, side="right") - np.searchsorted(last, first, side="left")).max())


class StepStore:
    """One family's per-step table, fed chunk after chunk (``append``) and read whole (``table``). Its lists are
    replaced, never changed in place, so a shallow copy (``copy.copy``) fed other chunks leaves this one as it was."""

    def __init__(self, table: StateTable, open_steps: int = OPEN_STEPS) -> None:
        self.open_steps = open_steps  # the open part's bound (tests vary it)
        self._open = table
        # chunks that go on with the open part, in order, not merged into it yet (``_settled``); its steps with them
        self._pending: list[StateTable] = []
        self._open_steps = int(table.steps.shape[0])
        self._sealed: list[StateTable] = []  # steps no later chunk can reach, in order
        self._layers: list[Layer] = []
        self._rows: list[dict[str, tuple[np.ndarray, np.ndarray]]] = []  # per-row values held aside, in order

    @property
    def table(self) -> StateTable:
        """The whole table: the finished layers folded, the parts joined, the per-row values joined (kept so)."""
        if self._layers:
            self._open = StateTable.folded(self.pieces(rows=False))
            self._layers, self._sealed = [], []
        self._settled()
        if self._sealed:
            self._open = StateTable.joined([*self._sealed, self._open])
            self._sealed = []
        if self._rows:
            self._open = self._open.with_rows(self._rows)
            self._rows = []
        self._open_steps = int(self._open.steps.shape[0])
        return self._open

    @property
    def layer_count(self) -> int:
        """Finished layers held now (0 once the table is read: folded into one)."""
        return len(self._layers)

    def pieces(self, rows: bool = True) -> list[StateTable]:
        """The tables the table is kept in, in order (each finished layer's, then the sealed parts, then the open part):
        folded, they are the table; appended in turn to an empty store, they give it the same table, digit for digit
        (a layer's parts follow each other; a layer's first part starts at or before the previous part's last step, so
        it starts a layer there too, or goes on with the open step of a first layer, which reduces it as the fold
        would). With per-row values held aside and ``rows``, the table itself, with them: they belong to no piece."""
        if rows and self._rows:
            return [self.table]
        finished = [piece for layer in self._layers for piece in layer.pieces]
        return [*finished, *self._sealed, self._settled()]

    def append(self, incoming: StateTable) -> None:
        """Merge a chunk's table: into the open part when its steps start at or after the open part's last step
        (the same merge, on fewer steps), else (it goes back in steps) as a new layer; in a later layer, one that goes
        on with the open part's last step starts a layer too. Its per-row values are held aside."""
        if incoming.ragged and self._open.shapes:
            incoming = self._hold_rows(incoming)
        if self._layers and not incoming.steps.shape[0]:
            return  # no steps, no state: merged, it would copy the table to the same entries
        latest = self._pending[-1] if self._pending else self._open
        last = latest.steps[-1] if latest.steps.shape[0] else None
        if last is None or not incoming.steps.shape[0]:  # an empty table (a later layer never is: it starts a chunk)
            self._open = self.table.merged(incoming)
            self._open_steps = int(self._open.steps.shape[0])
            return
        if incoming.steps[0] < last or (self._layers and incoming.steps[0] == last):
            self._begin_layer(incoming)
            return
        count = int(incoming.steps.shape[0])
        if incoming.steps[0] > last:
            sealed = self._settled()
            self._open, self._open_steps = incoming, count
        else:  # the chunk goes on with the open part's last step: only that step merges
            if self._open_steps <= self.open_steps:  # a few steps: it waits to be folded in with the others
                self._pending = [*self._pending, incoming]
                self._open_steps += count - 1
                if len(self._pending) >= PENDING_CHUNKS:
                    self._settled()
                return
            open_part = self._settled()
            held = int(open_part.steps.shape[0])
            sealed = open_part.sliced(0, held - 1)
            self._open, self._pending, self._open_steps = open_part.sliced(held - 1, held), [incoming], count
        self._sealed = [*self._sealed, sealed]

    def _settled(self) -> StateTable:
        """The open part with the chunks that went on with it folded in (each step's states reduced in the order the
        chunks came, as merging them one by one would)."""
        if self._pending:
            self._open = StateTable.folded([self._open, *self._pending])
            self._pending = []
        return self._open

    def _hold_rows(self, incoming: StateTable) -> StateTable:
        """``incoming`` without its per-row values, which are held aside until the table is read."""
        self._rows = [*self._rows, incoming.ragged]
        empty = {name: (step[:0], values[:0]) for name, (step, values) in incoming.ragged.items()}
        return StateTable(incoming.reductions, incoming.shapes, incoming.steps, incoming.dense, incoming.sparse, empty)

    def _begin_layer(self, incoming: StateTable) -> None:
        """Finish the current layer (its sealed parts and open part, kept as they are) and start one with ``incoming``.

        The finished layers are folded into one when those after the first hold as many bytes as the first: each fold
        then copies at most about twice what the layers after the first bring in, so over a run each entry is copied
        a few times (the first layer at least doubles from fold to fold), and the layers held stay within about the
        table's size. They are folded too when more than ``LAYERS`` of them span one step (many small layers, each
        going back over the others: a fold reduces that many states in turn) or when there are more than
        ``HELD_LAYERS``, so such an input folds the whole table once per ``LAYERS`` chunks at most, where it merged
        each chunk into the whole table. Folding the layers so far, whenever, reduces each step's states in the same
        order: when it happens changes no digit."""
        layers = [*self._layers, Layer.of([*self._sealed, self._settled()])]
        if len(layers) > 1 and (
            sum(layer.nbytes for layer in layers[1:]) >= layers[0].nbytes
            or len(layers) > HELD_LAYERS
            or (len(layers) > LAYERS and layer_depth(layers) > LAYERS)
        ):
            layers = [Layer.of([StateTable.folded([piece for layer in layers for piece in layer.pieces])])]
        self._layers = layers
        self._sealed, self._open, self._open_steps = [], incoming, int(incoming.steps.shape[0])
