"""Write dumps from a trainer: padded [B, L] tensors in, one Parquet row per sequence out.

:class:`DumpWriter` has two modes. The **directory mode** (a path without ``.parquet``, or
``partition="step"``) writes one file per step and rank, ``<dir>/step=<N>/rank-<R>.parquet``, each to a
hidden temporary file in the same directory and then renamed over the final name, so ranks never share a
file and a job killed at any moment leaves every finished step readable (the reader skips hidden files).
The **one-file mode** appends one row group per step to a single file; Parquet writes its footer only at
``close()``, so a job killed before then leaves that file unreadable.

:func:`pack_padded` and :func:`row_problems` are shared with :mod:`rollout_diag.trainers`, so what the writer
stores and what ``compute_metrics`` measures are the same rows.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from rollout_diag.errors import ConfigError
from rollout_diag.io.columns import ROLE_CANDIDATES, parquet_options
from rollout_diag.io.config import CONFIG_KEY
from rollout_diag.io.sources import COMPLETE_PREFIX
from rollout_diag.io.validate import MAX_POSITIVE_LOGPROB

log = logging.getLogger(__name__)

TRAINER, ROLLOUT, MASK = "old_log_probs", "rollout_log_probs", "response_mask"
LOGPROB_TYPES = {"float32": pa.float32(), "float64": pa.float64()}
_TORCH_TYPES = {"float32": torch.float32, "float64": torch.float64}
PADDING_SIDES = ("right", "left")
PARTITIONS = ("step",)
# Names the reader would take for a role (two candidates for one role is an error there), so extras avoid them.
# policy_version is the exception: a per-row scalar role, written as an extra column and read back by that role.
_RESERVED = {name for role, names in ROLE_CANDIDATES.items() if role != "policy_version" for name in names} | {
    "position"
}


# --------------------------------------------------------------------------- padded batch -> rows
@dataclass(frozen=True)
class PackedRows:
    """The rows of a padded [B, L] batch with their padding stripped, concatenated (the layout of ``Chunk``):
    row i holds tokens ``[offsets[i], offsets[i + 1])``. Tensors stay on the inputs' device and dtype."""

    lengths: torch.Tensor  # int64 [B]
    trainer: torch.Tensor  # [T]
    rollout: torch.Tensor  # [T]
    mask: torch.Tensor  # [T]
    token_ids: torch.Tensor | None = None  # [T]

    @property
    def rows(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def offsets(self) -> torch.Tensor:
        """int64 [B + 1]."""
        return torch.nn.functional.pad(torch.cumsum(self.lengths, 0), (1, 0))

    @property
    def token_row(self) -> torch.Tensor:
        """Row of every token (int64 [T])."""
        rows = torch.arange(self.rows, device=self.lengths.device)
        return torch.repeat_interleave(rows, self.lengths, output_size=int(self.trainer.shape[0]))

    def select_rows(self, keep: torch.Tensor) -> PackedRows:
        """Only the rows where ``keep`` (bool [B]) is true."""
        keep_token = keep[self.token_row]
        return PackedRows(
            lengths=self.lengths[keep],
            trainer=self.trainer[keep_token],
            rollout=self.rollout[keep_token],
            mask=self.mask[keep_token],
            token_ids=None if self.token_ids is None else self.token_ids[keep_token],
        )


def as_tensor(name: str, values: Any) -> torch.Tensor:
    """A torch tensor (left on its device) or an array-like as a CPU tensor; raises ConfigError naming ``name``."""
    if isinstance(values, torch.Tensor):
        return values.detach()
    try:
        return torch.as_tensor(np.asarray(values))
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ConfigError(f"{name}: not a tensor or array ({' '.join(str(exc).split())}).") from None


def pack_padded(
    old_log_probs: Any,
    rollout_log_probs: Any,
    response_mask: Any,
    *,
    lengths: Any = None,
    padding_side: str = "right",
    token_ids: Any = None,
) -> PackedRows:
    """Strip the padding of [B, L] tensors (torch on any device, numpy, lists) and concatenate the rows.

    Row i is the first ``lengths[i]`` positions (``padding_side="right"``, verl) or the last ``lengths[i]``
    (``"left"``, SkyRL's right-aligned response tensors). Without ``lengths`` a row ends at its last position
    with a non-zero mask (right padding) or starts at its first one (left padding), so environment tokens
    after the last model token are dropped and a row without a model token is empty. Raises ConfigError for
    arguments of the wrong kind or shape (a programmer error, never a data problem).
    """
    if padding_side not in PADDING_SIDES:
        raise ConfigError(f"padding_side={padding_side!r}: choose 'right' or 'left'.")
    trainer, rollout, mask = _padded_tensors(old_log_probs, rollout_log_probs, response_mask)
    device = trainer.device
    rollout, mask = rollout.to(device), mask.to(device)
    rows, width = trainer.shape
    ids = None if token_ids is None else _token_ids(token_ids, device, rows, width)
    if lengths is None:
        row_lengths = _masked_lengths(mask, padding_side)
    else:
        row_lengths = _given_lengths(lengths, device, rows, width)
    row_lengths = row_lengths.to(torch.int64)
    if rows and bool((row_lengths == width).all()):  # no padding: the rows are the flattened tensors (no copy)
        return PackedRows(
            lengths=row_lengths,
            trainer=trainer.reshape(-1),
            rollout=rollout.reshape(-1),
            mask=mask.reshape(-1),
            token_ids=None if ids is None else ids.reshape(-1),
        )
    positions = torch.arange(width, device=device)
    if padding_side == "right":
        keep = positions[None, :] < row_lengths[:, None]
    else:
        keep = positions[None, :] >= (width - row_lengths)[:, None]
    return PackedRows(
        lengths=row_lengths,
        trainer=trainer[keep],
        rollout=rollout[keep],
        mask=mask[keep],
        token_ids=None if ids is None else ids[keep],
    )


def _padded_tensors(
    old_log_probs: Any, rollout_log_probs: Any, response_mask: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The three [B, L] tensors, checked: float logprobs, one shape, a 0/1 mask; raises ConfigError."""
    trainer, rollout = as_tensor(TRAINER, old_log_probs), as_tensor(ROLLOUT, rollout_log_probs)
    mask = as_tensor(MASK, response_mask)
    for name, values in ((TRAINER, trainer), (ROLLOUT, rollout)):
        if not values.dtype.is_floating_point:
            raise ConfigError(
                f"{name}: {values.dtype} values, expected float logprobs (were the logprobs and the mask swapped?)."
            )
    if trainer.ndim != 2 or trainer.shape != rollout.shape or trainer.shape != mask.shape:
        raise ConfigError(
            f"expected [B, L] tensors of one shape, got {TRAINER} {tuple(trainer.shape)}, "
            f"{ROLLOUT} {tuple(rollout.shape)}, {MASK} {tuple(mask.shape)}."
        )
    if mask.dtype.is_floating_point:
        not_binary = (mask != 0) & (mask != 1)
        if bool(not_binary.any()):
            raise ConfigError(
                f"{MASK}: float values other than 0 and 1, such as {float(mask[not_binary][0]):g}; "
                "was a logprob or weight tensor passed as the mask?"
            )
    return trainer, rollout, mask


def _token_ids(token_ids: Any, device: torch.device, rows: int, width: int) -> torch.Tensor:
    """The token ids as an integer [B, L] tensor on ``device``; raises ConfigError."""
    ids = as_tensor("token_ids", token_ids).to(device)
    if tuple(ids.shape) != (rows, width) or ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise ConfigError(f"token_ids: expected integer [B, L] = {(rows, width)}, got {ids.dtype} {tuple(ids.shape)}.")
    return ids


def _masked_lengths(mask: torch.Tensor, padding_side: str) -> torch.Tensor:
    """Each row's length without ``lengths``: up to its last model token (right padding) or from its first (left)."""
    width = mask.shape[1]
    model = mask != 0
    present = model.any(dim=1)
    if padding_side == "right":  # last non-zero mask position + 1
        return torch.where(present, width - torch.flip(model, (1,)).to(torch.int8).argmax(dim=1), 0)
    return torch.where(present, width - model.to(torch.int8).argmax(dim=1), 0)  # from the first non-zero to the end


def _given_lengths(lengths: Any, device: torch.device, rows: int, width: int) -> torch.Tensor:
    """``lengths`` as a tensor on ``device``: one integer in [0, width] per row; raises ConfigError."""
    row_lengths = as_tensor("lengths", lengths).to(device)
    if tuple(row_lengths.shape) != (rows,) or row_lengths.dtype.is_floating_point:
        raise ConfigError(f"lengths: expected {rows} integers (one per row), got {tuple(row_lengths.shape)}.")
    if rows and bool(((row_lengths < 0) | (row_lengths > width)).any()):
        raise ConfigError(f"lengths: every length must lie in [0, {width}] (the padded width).")
    return row_lengths


@dataclass(frozen=True)
class RowProblems:
    """Rows analyze would skip, with the reader's message for the first row of each kind of problem."""

    bad_rows: torch.Tensor  # bool [B]
    examples: list[str]

    @property
    def count(self) -> int:
        return int(self.bad_rows.sum())


def row_problems(packed: PackedRows) -> RowProblems | None:
    """None when every row is valid; else the rows with a mask value other than 0/1, or a NaN, infinite or
    positive logprob on a model token (what the reader skips), with one reader-style message per kind."""
    mask = packed.mask
    model = mask == 1
    # One pass for the common case (nothing wrong): -inf < value ≤ max is false for NaN, ±inf and positives.
    suspect = (mask != 0) & ~model
    for values in (packed.trainer, packed.rollout):
        suspect |= model & ~((values <= MAX_POSITIVE_LOGPROB) & (values > -torch.inf))
    if not bool(suspect.any()):
        return None
    kinds = [(MASK, (mask != 0) & ~model, "mask value {value:g} at position {position} (must be 0 or 1)", mask)]
    for name, values in ((TRAINER, packed.trainer), (ROLLOUT, packed.rollout)):
        kinds.append((name, model & ~torch.isfinite(values), "{value} logprob at position {position}", values))
        kinds.append(
            (
                name,
                model & (values > MAX_POSITIVE_LOGPROB),
                "positive logprob {value:g} at position {position} (logprobs are ≤ 0)",
                values,
            )
        )
    any_bad = kinds[0][1]
    for _, bad, _, _ in kinds[1:]:
        any_bad = any_bad | bad
    if not bool(any_bad.any()):
        return None
    token_row = packed.token_row
    bad_rows = torch.zeros(packed.rows, dtype=torch.bool, device=mask.device)
    bad_rows[token_row[any_bad]] = True
    offsets = packed.offsets
    examples = []  # (first bad token, message) per kind; listed in row order, as the reader lists skipped rows
    for name, bad, template, values in kinds:
        found = torch.nonzero(bad).flatten()
        if found.numel():
            token = int(found[0])
            row = int(token_row[token])
            value = float(values[token])
            shown = value if np.isfinite(value) else ("NaN" if np.isnan(value) else ("+inf" if value > 0 else "-inf"))
            reason = template.format(value=shown, position=token - int(offsets[row]))
            examples.append((token, f"row {row}, column '{name}': {reason}"))
    return RowProblems(bad_rows=bad_rows, examples=[message for _, message in sorted(examples)])


class WarnOnce:
    """Log each kind of data problem once per writer (or metrics object), through ``logging``: a training step
    never raises for what the reader would only skip."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def __call__(self, kind: str, message: str) -> None:
        if kind not in self.seen:
            self.seen.add(kind)
            log.warning("rollout-diag: %s (logged once)", message)


# --------------------------------------------------------------------------- the writer
class DumpWriter:
    """Write training steps as dumps ``analyze`` reads: one Parquet row per sequence (the sequence layout).

    ``path`` ending in ``.parquet`` (and no ``partition``): **one file**, one row group per step. Parquet
    writes the file's footer at ``close()``: a job killed before then leaves the file unreadable, so long
    runs should use the directory mode. Any other path, or ``partition="step"``: **a directory** with one
    file per step and rank, ``step=<N>/rank-<R>.parquet``, written to a hidden temporary file in the same
    directory and renamed (atomic), so ranks write at once without locks and a killed job loses at most the
    step being written; writing a step again (a resumed run) replaces that step's file of that rank.
    When the world size is known (``world_size``, else ``$WORLD_SIZE``, else torch.distributed's), each rank
    then writes ``step=<N>/_COMPLETE-rank-<R>`` (JSON: rank, world_size, rows) the same way: the step is
    complete once ``world_size`` ranks have written theirs (``rollout-diag watch`` reads them; readers skip
    names that start with ``_``).

    ``rank``: the rank in the file name (default: ``$RANK``, else torch.distributed's rank, else 0).
    ``every``: write only steps that are a multiple of it (the others return at once).
    ``logprob_type``: ``float32`` (default) holds bf16, fp16 and fp32 logprobs exactly; ``float64`` keeps
    float64 tensors exact. ``durable``: fsync each step's file and directory (survives a machine crash, not
    only a killed process). ``config``: the run's knobs (``{"tp": 8, "r3": "on", "vllm": "0.11"}``: JSON-able),
    stored in every file's Parquet key-value metadata under ``rollout_diag.config``; ``rollout-diag runs`` reads
    them as the run's knobs (:func:`dump_config`). Use as a context manager, or call ``close()``.

    Data problems the reader would skip (a positive or NaN logprob on a model token, a mask value other than
    0/1, repeated sample ids) are written as they are and logged once through ``logging``; programmer errors
    (wrong shapes, missing or swapped tensors, a ``sample_ids`` of the wrong length) raise ConfigError.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        partition: str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        every: int = 1,
        logprob_type: str = "float32",
        compression: str = "zstd",
        durable: bool = False,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self.path = Path(path)
        self._metadata = None if config is None else {CONFIG_KEY: _config_json(config)}
        if partition is not None and partition not in PARTITIONS:
            raise ConfigError(f"partition={partition!r}: the only partition is 'step'.")
        if logprob_type not in LOGPROB_TYPES:
            raise ConfigError(f"logprob_type={logprob_type!r}: choose float32 or float64.")
        if not isinstance(every, int) or every < 1:
            raise ConfigError(f"every={every!r}: must be a positive integer (1 writes every step).")
        self.directory_mode = partition == "step" or self.path.suffix != ".parquet"
        self.rank = _default_rank() if rank is None else int(rank)
        self.world_size = _default_world_size() if world_size is None else world_size
        if self.world_size is not None and (
            isinstance(self.world_size, bool) or not isinstance(self.world_size, int) or self.world_size < 1
        ):
            raise ConfigError(f"world_size={world_size!r}: must be a positive integer (the number of ranks).")
        self.every = every
        self.logprob_type = logprob_type
        self.compression = compression
        self.durable = durable
        self.warn = WarnOnce()
        self.steps_written = 0
        self._schema: pa.Schema | None = None
        self._writer: pq.ParquetWriter | None = None
        self._closed = False
        try:
            if self.directory_mode:
                self.path.mkdir(parents=True, exist_ok=True)
            elif not self.path.parent.is_dir():
                raise OSError(f"no directory {self.path.parent}")
        except OSError as exc:
            raise ConfigError(f"{self.path}: cannot write a dump here ({' '.join(str(exc).split())}).") from None

    # -- writing -----------------------------------------------------------------------------------
    def write_step(
        self,
        step: int,
        *,
        old_log_probs: Any = None,
        rollout_log_probs: Any = None,
        response_mask: Any = None,
        sample_ids: Sequence[Any] | Any | None = None,
        token_ids: Any = None,
        extra: Mapping[str, Any] | None = None,
        lengths: Any = None,
        padding_side: str = "right",
    ) -> Path | None:
        """Write one step from padded [B, L] tensors (torch of any float dtype on any device, or numpy).

        The keyword names are the trainer's tensor names, so the two logprobs cannot be swapped silently.
        Padding is stripped as :func:`pack_padded` says (``lengths`` per row, else the mask). ``sample_ids``:
        one id per row (default: the row number, ``<rank>-<row>`` in the directory mode); ``token_ids``: [B, L]
        integers; ``extra``: per-row scalars ([B] tensors, arrays or lists, e.g. ``advantage``, ``reward``,
        ``policy_version``) written as extra columns, which ``analyze`` shows with its worst rows and ``inspect``
        with its row. Returns the file written, or None for a step skipped by ``every``. Raises ConfigError for
        programmer errors only.
        """
        if self._closed:
            raise ConfigError(f"{self.path}: DumpWriter is closed.")
        step = _step_number(step)
        if step % self.every:
            return None
        missing = [
            name
            for name, value in ((TRAINER, old_log_probs), (ROLLOUT, rollout_log_probs), (MASK, response_mask))
            if value is None
        ]
        if missing:
            raise ConfigError(f"write_step(step={step}): missing {', '.join(missing)} (pass every tensor by keyword).")
        packed = pack_padded(
            old_log_probs,
            rollout_log_probs,
            response_mask,
            lengths=lengths,
            padding_side=padding_side,
            token_ids=token_ids,
        )
        ids = self._sample_ids(sample_ids, packed.rows)
        extras = _extra_columns(extra, packed.rows)
        table = self._table(step, packed, ids, extras)
        if self.directory_mode:
            return self._write_file(step, table)
        return self._append(table)

    def write(
        self,
        step: int,
        rollout_log_probs: Any,
        old_log_probs: Any,
        response_mask: Any,
        *,
        sample_ids: Sequence[Any] | None = None,
        lengths: Sequence[int] | Any | None = None,
    ) -> Path | None:
        """Alias of :meth:`write_step` kept from the first API: the tensors are positional, rollout first.
        Prefer ``write_step``, whose keyword-only tensors cannot be swapped."""
        return self.write_step(
            step,
            old_log_probs=old_log_probs,
            rollout_log_probs=rollout_log_probs,
            response_mask=response_mask,
            sample_ids=sample_ids,
            lengths=lengths,
        )

    def _sample_ids(self, sample_ids: Any, rows: int) -> pa.Array:
        if sample_ids is None:
            prefix = f"{self.rank}-" if self.directory_mode else ""
            return pa.array([f"{prefix}{row}" for row in range(rows)], pa.string())
        if isinstance(sample_ids, torch.Tensor):
            sample_ids = sample_ids.detach().cpu().numpy()
        if isinstance(sample_ids, (str, bytes)) or not hasattr(sample_ids, "__len__"):
            raise ConfigError(f"sample_ids: expected one id per row ({rows}), got {type(sample_ids).__name__}.")
        if len(sample_ids) != rows:
            raise ConfigError(f"sample_ids: {len(sample_ids)} ids for a batch of {rows} rows; give one id per row.")
        ids = [str(value) for value in sample_ids]
        if len(set(ids)) != rows:
            self.warn(
                "duplicate_ids",
                f"{self.path}: sample_ids repeat within a step ({rows - len(set(ids))} repeats; verl's uid is one "
                "id per prompt): analyze warns about them and cannot tell those rows apart; append the response "
                "index, as rollout_diag.trainers.from_verl_batch does.",
            )
        return pa.array(ids, pa.string())

    def _table(self, step: int, packed: PackedRows, ids: pa.Array, extras: dict[str, pa.Array]) -> pa.Table:
        storage = _TORCH_TYPES[self.logprob_type]
        # Packing ran on the tensors' device (only the rows' tokens cross to the host); cast on the host.
        lengths = packed.lengths.cpu().numpy()
        trainer = packed.trainer.cpu().to(storage)
        rollout = packed.rollout.cpu().to(storage)
        mask = packed.mask.cpu()
        host = PackedRows(packed.lengths.cpu(), trainer, rollout, mask)
        problems = row_problems(host)
        if problems is not None:
            self.warn(
                "bad_rows",
                f"{self.path}: step {step}: {problems.count} row(s) that analyze will skip, e.g. "
                f"{problems.examples[0]}",
            )
        total = int(lengths.sum())
        if total > np.iinfo(np.int32).max:
            raise ConfigError(f"step {step}: {total} tokens exceed a Parquet list's 2^31; write the step in parts.")
        offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
        # 0/1 stay; any other integer stays invalid (the reader skips its row) without overflowing int8.
        mask_values = mask.to(torch.int64).clamp(-1, 2).to(torch.int8)

        def lists(values: np.ndarray) -> pa.Array:
            return pa.ListArray.from_arrays(offsets, pa.array(values))

        columns = {
            "step": pa.array(np.full(len(lengths), step, dtype=np.int64)),
            "sample_id": ids,
            ROLLOUT: lists(rollout.numpy()),
            TRAINER: lists(trainer.numpy()),
            MASK: lists(mask_values.numpy()),
        }
        if packed.token_ids is not None:
            columns["token_ids"] = lists(packed.token_ids.cpu().to(torch.int32).numpy())
        columns.update(extras)
        return pa.table(columns, metadata=self._metadata)

    def _write_file(self, step: int, table: pa.Table) -> Path | None:
        directory = self.path / f"step={step}"
        final = directory / f"rank-{self.rank}.parquet"
        # Hidden (leading dot) and not *.parquet: the reader never takes a half-written file for data.
        temporary = directory / f".rank-{self.rank}.parquet.{os.getpid()}.tmp"
        try:
            directory.mkdir(exist_ok=True)
            pq.write_table(table, temporary, **parquet_options(table.schema, self.compression))
            if self.durable:
                _fsync(temporary)
            os.replace(temporary, final)
            if self.world_size is not None:
                self._mark_complete(directory, table.num_rows)
            if self.durable:
                _fsync(directory)
        except OSError as exc:
            temporary.unlink(missing_ok=True)
            self.warn(f"os_error:{exc.errno}", f"{final}: step {step} not written ({' '.join(str(exc).split())}).")
            return None
        self.steps_written += 1
        return final

    def _mark_complete(self, directory: Path, rows: int) -> None:
        """``_COMPLETE-rank-<R>`` beside the rank's file, written after it (temporary file + rename)."""
        marker = directory / f"{COMPLETE_PREFIX}{self.rank}"
        temporary = directory / f".{marker.name}.{os.getpid()}.tmp"
        try:
            temporary.write_text(json.dumps({"rank": self.rank, "world_size": self.world_size, "rows": rows}) + "\n")
            if self.durable:
                _fsync(temporary)
            os.replace(temporary, marker)
        finally:
            temporary.unlink(missing_ok=True)

    def _append(self, table: pa.Table) -> Path:
        if self._schema is None:
            self._schema = table.schema
            try:
                self._writer = pq.ParquetWriter(
                    self.path, self._schema, **parquet_options(self._schema, self.compression)
                )
            except (OSError, pa.ArrowException) as exc:
                raise ConfigError(f"{self.path}: cannot write ({' '.join(str(exc).split())}).") from None
        elif table.schema.names != self._schema.names:
            raise ConfigError(
                f"{self.path}: this step has columns {table.schema.names}, the first step had "
                f"{self._schema.names}; one file keeps the first step's columns (use the directory mode to vary them)."
            )
        assert self._writer is not None
        self._writer.write_table(table.cast(self._schema))
        self.steps_written += 1
        return self.path

    # -- closing -----------------------------------------------------------------------------------
    def close(self) -> None:
        """Finish the file (one-file mode: writes the footer that makes it readable). Idempotent."""
        self._closed = True
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> DumpWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


def _default_rank() -> int:
    if "RANK" in os.environ:
        try:
            return int(os.environ["RANK"])
        except ValueError:
            pass
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return 0


def _default_world_size() -> int | None:
    """``$WORLD_SIZE``, else torch.distributed's world size, else None (unknown: no completion marker)."""
    if "WORLD_SIZE" in os.environ:
        try:
            size = int(os.environ["WORLD_SIZE"])
        except ValueError:
            size = 0
        if size >= 1:
            return size
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return None


def _step_number(step: Any) -> int:
    if isinstance(step, torch.Tensor) and step.numel() == 1:
        step = step.item()
    integral = isinstance(step, (int, np.integer)) and not isinstance(step, (bool, np.bool_))
    if not integral and not (isinstance(step, (float, np.floating)) and float(step).is_integer()):
        raise ConfigError(f"step={step!r}: the step must be an integer.")
    return int(step)


def _extra_columns(extra: Mapping[str, Any] | None, rows: int) -> dict[str, pa.Array]:
    """Per-row scalar columns; raises ConfigError for a reserved name or a value that is not one scalar per row."""
    columns: dict[str, pa.Array] = {}
    for name, values in (extra or {}).items():
        if not isinstance(name, str) or not name or name in _RESERVED or name in {"sample_id", "step"}:
            raise ConfigError(
                f"extra column {name!r}: the name is empty or one the reader reads as a role "
                f"({', '.join(sorted(_RESERVED))}); rename it."
            )
        if isinstance(values, torch.Tensor):
            values = values.detach().cpu()
            values = values.float() if values.dtype in (torch.bfloat16, torch.float16) else values
            array = values.numpy()
        else:
            array = np.asarray(values)
        if array.shape != (rows,):
            raise ConfigError(f"extra column '{name}': expected one value per row, shape ({rows},), got {array.shape}.")
        if array.dtype.kind == "f":
            columns[name] = pa.array(array.astype(np.float64), from_pandas=True)  # NaN -> null
        elif array.dtype.kind in "iu":
            columns[name] = pa.array(array.astype(np.int64))
        elif array.dtype.kind == "b":
            columns[name] = pa.array(array)
        else:
            columns[name] = pa.array([None if value is None else str(value) for value in array.tolist()], pa.string())
    return columns


def _fsync(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _config_json(config: Mapping[str, Any]) -> bytes:
    """``config`` as JSON (an object of JSON-able values). Raises ConfigError for anything else."""
    if not isinstance(config, Mapping):
        raise ConfigError(f"config={config!r}: give a mapping of knob names to values (e.g. {{'tp': 8}}).")
    try:
        return json.dumps({str(name): value for name, value in config.items()}, sort_keys=True).encode()
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"config: {exc}; give JSON-able values (numbers, strings, booleans, lists).") from None
