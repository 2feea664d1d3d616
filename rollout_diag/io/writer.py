"""Write dumps from a trainer: padded [B, L] tensors in, one Parquet row per sequence out."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rollout_diag.errors import ConfigError

SCHEMA = pa.schema(
    [
        ("step", pa.int64()),
        ("sample_id", pa.string()),
        ("rollout_log_probs", pa.list_(pa.float32())),
        ("old_log_probs", pa.list_(pa.float32())),
        ("response_mask", pa.list_(pa.int8())),
    ]
)


def _numpy(values: Any) -> np.ndarray:
    """torch tensors (any device, bf16 included) or array-likes to numpy."""
    if hasattr(values, "detach"):
        values = values.detach()
        if values.dtype.is_floating_point:
            values = values.float()
        return values.cpu().numpy()
    return np.asarray(values)


class DumpWriter:
    """Append training steps to one Parquet file in the sequence layout (one row group per call).

    ``lengths`` (valid response tokens per row) trims right padding; without it every row keeps all L
    positions and padding must carry mask 0. Use as a context manager, or call ``close()``.

    >>> with DumpWriter("run.parquet") as dump:                     # doctest: +SKIP
    ...     dump.write(step, batch["rollout_log_probs"], batch["old_log_probs"], batch["response_mask"],
    ...                sample_ids=batch.non_tensor_batch["uid"])
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._writer: pq.ParquetWriter | None = pq.ParquetWriter(self.path, SCHEMA, compression="zstd")

    def write(
        self,
        step: int,
        rollout_log_probs: Any,
        old_log_probs: Any,
        response_mask: Any,
        *,
        sample_ids: Sequence[Any] | None = None,
        lengths: Sequence[int] | Any | None = None,
    ) -> None:
        """Write one step: [B, L] rollout logprobs, trainer logprobs and mask (torch or numpy)."""
        if self._writer is None:
            raise ConfigError(f"{self.path}: DumpWriter is closed.")
        rollout, trainer, mask = _numpy(rollout_log_probs), _numpy(old_log_probs), _numpy(response_mask)
        if rollout.ndim != 2 or rollout.shape != trainer.shape or rollout.shape != mask.shape:
            raise ConfigError(
                f"{self.path}: expected [B, L] tensors of one shape, "
                f"got {rollout.shape}, {trainer.shape}, {mask.shape}."
            )
        rows, width = rollout.shape
        row_lengths = np.full(rows, width, dtype=np.int64) if lengths is None else _numpy(lengths).astype(np.int64)
        keep = np.arange(width)[None, :] < row_lengths[:, None]
        offsets = np.concatenate([[0], np.cumsum(row_lengths)]).astype(np.int32)

        def lists(values: np.ndarray, value_type: pa.DataType) -> pa.Array:
            flat = pa.array(values[keep], value_type)
            return pa.ListArray.from_arrays(pa.array(offsets), flat)

        ids = [str(i) for i in (sample_ids if sample_ids is not None else range(rows))]
        batch = pa.record_batch(
            [
                pa.array(np.full(rows, step, dtype=np.int64)),
                pa.array(ids, pa.string()),
                lists(rollout.astype(np.float32), pa.float32()),
                lists(trainer.astype(np.float32), pa.float32()),
                lists(mask.astype(np.int8), pa.int8()),
            ],
            schema=SCHEMA,
        )
        self._writer.write_batch(batch)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> DumpWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


_KINDS = {
    "string": pa.string(),
    "category": pa.dictionary(pa.int32(), pa.string()),  # a few distinct values repeated on every row
    "int64": pa.int64(),
    "float64": pa.float64(),
    "bool": pa.bool_(),
}


class RowTableWriter:
    """Stream rows of plain columns (numpy arrays or lists; NaN floats become nulls) into one Parquet file.

    ``columns``: (name, kind) with kind in string, category, int64, float64, bool. A context manager: a
    pass that fails deletes the half-written file. Raises ConfigError when the file cannot be created.
    """

    def __init__(self, path: str | Path, columns: Sequence[tuple[str, str]], setting: str = "output") -> None:
        self.path = Path(path)
        self.schema = pa.schema([(name, _KINDS[kind]) for name, kind in columns])
        try:
            self._writer = pq.ParquetWriter(str(self.path), self.schema, compression="zstd")
        except (OSError, pa.ArrowException) as exc:
            raise ConfigError(f"{setting} {self.path}: cannot write ({' '.join(str(exc).split())}).") from None

    def write(self, columns: dict[str, Any]) -> None:
        arrays = []
        for field in self.schema:
            values = columns[field.name]
            if pa.types.is_dictionary(field.type):
                arrays.append(pa.array(values, pa.string()).dictionary_encode())
            else:
                arrays.append(pa.array(values, field.type, from_pandas=True))  # from_pandas: NaN -> null
        self._writer.write_table(pa.Table.from_arrays(arrays, schema=self.schema))

    def close(self) -> None:
        self._writer.close()

    def __enter__(self) -> RowTableWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()
        if kind is not None:
            self.path.unlink(missing_ok=True)
