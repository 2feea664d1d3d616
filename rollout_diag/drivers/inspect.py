"""The ``inspect`` command: the tokens of one row (named, by sample id, or the worst)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from numbers import Integral
from typing import TYPE_CHECKING

import numpy as np

from rollout_diag.drivers.dump import reads_dump
from rollout_diag.drivers.passes import Inputs, open_reader, resolve_device
from rollout_diag.drivers.tokens import Tokenizer, with_token_text
from rollout_diag.engine import arrays
from rollout_diag.engine.formulas import row_mean
from rollout_diag.engine.stats import prepare, stats
from rollout_diag.errors import ConfigError, DataError, option_name, where
from rollout_diag.io.chunk import Chunk
from rollout_diag.io.reader import DEFAULT_CHUNK_TOKENS
from rollout_diag.io.tokenizer import load_tokenizer
from rollout_diag.metrics.localize import DEFAULT_WINDOW, CapturedRow, default_window, first_differing, window_at
from rollout_diag.paths import file_label
from rollout_diag.results import RowTokens

if TYPE_CHECKING:
    import torch  # annotations only: the chunks are numpy on the CPU (no torch loaded), tensors on a GPU

    from rollout_diag.io.reader import DumpReader


@reads_dump
def inspect_row(
    inputs: Inputs,
    sample_id: str | None = None,
    *,
    step: int | None = None,
    row: str | None = None,
    around: int | None = None,
    window: int | None = None,
    whole_row: bool = False,
    columns: Mapping[str, str] | None = None,
    device: str | torch.device = "auto",
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    tokenizer: Tokenizer = None,
) -> RowTokens:
    """The tokens of one row: the one at ``row`` ("FILE:ROW", as the tables print it), or with ``sample_id`` (and
    ``step``), or else the worst row by |log-ppl diff| of ``step`` (of the run without it).

    Only the row groups that can hold the row are read (row-group statistics on step and sample id). ``around``
    and ``window`` list only ``window`` tokens centred on position ``around`` (``window`` alone: centred on the
    largest |δ|); the result's ``start`` and ``row_length`` say where they sit. Without them a row longer than
    ``LONG_ROW`` tokens is listed as ``DEFAULT_WINDOW`` tokens around its largest |δ| (a 2 M-token row would take
    minutes and gigabytes to list), unless ``whole_row``. Raises DataError when no row (or more than one, without
    ``step``) matches, InputError / ConfigError for a bad ``row`` or window. ``tokenizer``: as for ``analyze``, the
    listed token ids' text.
    """
    decoder = load_tokenizer(tokenizer)  # a missing tokenizer fails before the reading
    listed = _inspect(
        inputs, sample_id, step, row, _Listing.checked(around, window, whole_row), columns, device, chunk_tokens
    )
    return with_token_text(listed, decoder)


def _inspect(
    inputs: Inputs,
    sample_id: str | None,
    step: int | None,
    row: str | None,
    listing: _Listing,
    columns: Mapping[str, str] | None,
    device: str | torch.device,
    chunk_tokens: int,
) -> RowTokens:
    """``inspect_row`` without the token text."""
    torch_device = resolve_device(device)
    reader = open_reader(inputs, columns, strict=False, chunk_tokens=chunk_tokens)
    if row is not None:
        if sample_id is not None or step is not None:
            raise ConfigError(
                f"{option_name('row')} names one row already: leave out {option_name('sample_id')} and "
                f"{option_name('step')}."
            )
        return _at_row(reader, torch_device, row, listing)
    reader.narrow(step, sample_id)
    if sample_id is None:
        return _worst_row(reader, torch_device, step, listing)
    return _with_sample_id(reader, torch_device, sample_id, step, listing)


@dataclass(frozen=True)
class _Listing:
    """Which of a row's tokens to list (``inspect_row``'s ``around``, ``window`` and ``whole_row``)."""

    around: int | None
    window: int | None
    whole_row: bool

    @classmethod
    def checked(cls, around: int | None, window: int | None, whole_row: bool) -> _Listing:
        """The listing asked for; raises ConfigError for a window that is not one."""
        if whole_row and (around is not None or window is not None):
            raise ConfigError(
                f"{option_name('whole_row')} lists the whole row: leave out {option_name('around')} and "
                f"{option_name('window')}."
            )
        if around is not None and (isinstance(around, bool) or not isinstance(around, Integral) or around < 0):
            raise ConfigError(f"{option_name('around')}={around}: must be a token position (0 or more).")
        if window is not None and (isinstance(window, bool) or not isinstance(window, Integral) or window < 1):
            raise ConfigError(f"{option_name('window')}={window}: must be a positive number of tokens.")
        return cls(around, window, whole_row)

    def of(self, chunk: Chunk, index: int) -> RowTokens:
        return _row_window(chunk, index, self.around, self.window, self.whole_row)


def _at_row(reader: DumpReader, device: str | torch.device, row: str, listing: _Listing) -> RowTokens:
    """The row at ``row`` ("FILE:ROW"); raises DataError saying why when no row starts there."""
    path, file_row = reader.narrow_to_row(row)
    for chunk in _chunks(reader, device):
        for index, (file, candidate) in enumerate(zip(chunk.file, chunk.file_row, strict=True)):
            if file == path and candidate == file_row:
                return listing.of(chunk, index)
    skipped = next((r for r in reader.log.skipped if r.file == path and r.row == file_row), None)
    why = f"it was skipped: {skipped.reason}" if skipped else "it is not the first row of a sequence"
    raise DataError(f"{where(path, file_row)}no row to inspect ({why}).")


def _worst_row(reader: DumpReader, device: str | torch.device, step: int | None, listing: _Listing) -> RowTokens:
    """The worst row by |log-ppl diff| (as analyze ranks them), of ``step`` or the run; raises DataError if none."""
    best: tuple[float, tuple] | None = None
    found = None
    # the row sums come from the fused pass, run on the next chunks in the reader's prepare pool
    for chunk in _chunks(reader, device, prepare):
        worst = _chunk_worst(chunk, step)
        if worst is None:
            continue
        top, key, index = worst
        if best is None or (-top, key) < (-best[0], best[1]):
            best, found = (top, key), listing.of(chunk, index)
    if found is None:
        in_step = "" if step is None else f" in step {step}"
        raise DataError(f"{', '.join(reader.log.files)}: no row with a model token{in_step} to inspect.")
    return found


def _chunk_worst(chunk: Chunk, step: int | None) -> tuple[float, tuple, int] | None:
    """The chunk's worst row of ``step`` (the largest score, ties by location): its score, location and index;
    None when the chunk has no row with a model token there."""
    s = stats(chunk)
    n = s.row_count
    score = arrays.host(abs(row_mean(s.row_sum("rollout"), n) - row_mean(s.row_sum("trainer"), n)))
    eligible = arrays.host(n > 0)
    if step is not None:
        eligible &= arrays.host(chunk.step) == step
    if not eligible.any():
        return None
    top = score[eligible].max()
    tied = np.flatnonzero(eligible & (score == top)).tolist()
    keys = {i: (int(chunk.step[i]), chunk.sample_id[i], chunk.file[i], chunk.file_row[i]) for i in tied}
    index = min(tied, key=keys.__getitem__)
    return float(top), keys[index], index


def _with_sample_id(
    reader: DumpReader, device: str | torch.device, sample_id: str, step: int | None, listing: _Listing
) -> RowTokens:
    """The one row with ``sample_id`` (in ``step``); raises DataError when none or several match."""
    sample_column = f"column '{reader.log.columns.get('sample_id', 'sample_id')}'"
    where_ = f"{', '.join(reader.log.files)}: {sample_column}"
    matches: list[RowTokens] = []
    for chunk in _chunks(reader, device):
        for index, candidate in enumerate(chunk.sample_id):
            if candidate == sample_id and (step is None or int(chunk.step[index]) == step):
                matches.append(listing.of(chunk, index))
    if not matches:
        in_step = "" if step is None else f" in step {step}"
        raise DataError(f"{where_}: no row with sample id '{sample_id}'{in_step}.")
    if len(matches) > 1:
        steps = ", ".join(str(r.step) for r in matches[:10])
        places = ", ".join(f"{file_label(r.file, reader.log.files)}:{r.row}" for r in matches[:10])
        raise DataError(
            f"{where_}: sample id '{sample_id}' names {len(matches)} rows (steps {steps}) at {places}.",
            hint=f"pick one with {option_name('step')}."
            if step is None
            else f"pick one with {option_name('row')} FILE:ROW.",
        )
    return matches[0]


def _chunks(
    reader: DumpReader, device: str | torch.device, prepare: Callable[[Chunk], None] | None = None
) -> Iterator[Chunk]:
    """The reader's chunks, numpy on the CPU (no torch loaded), each chunk's shared values let go once looked at (as
    ``run_chunks`` does: left to the cyclic collector, a 100M-token search peaked at 1.4 GB instead of ~0.5)."""
    for chunk, _ in reader.chunks(device, prepare=prepare, numpy=True):
        yield chunk
        chunk.cache.clear()


def _row_window(chunk: Chunk, index: int, around: int | None, window: int | None, whole_row: bool = False) -> RowTokens:
    """Row ``index`` of ``chunk``: all of it, or the window of ``window`` tokens centred on ``around`` (by default,
    for a row longer than LONG_ROW, DEFAULT_WINDOW tokens around the largest |δ|)."""
    begin, end = int(chunk.offsets[index]), int(chunk.offsets[index + 1])
    length = end - begin
    largest: tuple[float, int] | None = None  # the whole row's largest |δ| and its position, said beside a window's
    if whole_row:
        first, last = 0, length
    elif around is None and window is None:  # the window a result carries for this row (metrics/localize.py)
        first, last = default_window(
            *(arrays.host(values[begin:end]) for values in (chunk.mask, chunk.trainer, chunk.rollout))
        )
        if (first, last) != (0, length):
            largest = _largest_abs_delta(chunk, begin, end)
    else:
        largest = _largest_abs_delta(chunk, begin, end)
        if around is None:  # centred on the largest |δ| among model tokens
            around = 0 if largest is None else largest[1]
        elif around >= length:
            raise DataError(
                f"{where(chunk.file[index], chunk.file_row[index])}{option_name('around')}={around}: the "
                f"row has {length} tokens "
                f"(positions 0 to {length - 1})."
            )
        first, last = window_at(around, DEFAULT_WINDOW if window is None else int(window), length)
    whole = (first, last) == (0, length)
    return replace(
        CapturedRow.of(chunk, index, (first, last)).tokens(),
        row_largest_abs_delta=None if largest is None or whole else largest[0],
        row_largest_position=None if largest is None or whole else largest[1],
        first_differing_position=first_differing(chunk, index),
    )


def _largest_abs_delta(chunk: Chunk, begin: int, end: int) -> tuple[float, int] | None:
    """(largest |δ| over the model tokens of chunk[begin:end], its position in the row); None without one."""
    mask = arrays.host(chunk.mask[begin:end]).astype(bool)
    if not mask.any():
        return None
    delta = np.abs(arrays.host(chunk.trainer[begin:end]) - arrays.host(chunk.rollout[begin:end]))
    position = int(np.argmax(np.where(mask, delta, -1.0)))
    return float(delta[position]), position
