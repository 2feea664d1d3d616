"""The per-row decisions file (``compare-presets --export-decisions``): its columns and its Parquet writer.

Only the file side lives here (names, types, writing); what each preset does to each row is computed by
``rollout_diag.drivers.exports.DecisionWriter``, which hands this writer one chunk's columns at a time.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from rollout_diag.errors import ConfigError, option_name
from rollout_diag.io.outputs import commit, discard, temporary_beside

# Column names and kinds in file order; one ``stat_<option>`` column per RS option follows them.
FIXED_COLUMNS = (
    ("preset", "category"),
    ("step", "int64"),
    ("sample_id", "string"),
    ("file", "category"),
    ("file_row", "int64"),
    ("tokens", "int64"),
    ("tokens_rejected", "int64"),
    ("kept", "bool"),
    ("is_weight", "float64"),
)


Writer = TypeVar("Writer", bound="RowTableWriter")

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
        try:  # written beside the target and renamed over it on close: a failed pass leaves the old file as it was
            self._temporary = temporary_beside(self.path)
            self._writer = pq.ParquetWriter(str(self._temporary), self.schema, compression="zstd")
        except (OSError, pa.ArrowException) as exc:
            if hasattr(self, "_temporary"):
                discard(self._temporary)
            raise ConfigError(f"{setting}={self.path}: cannot write ({' '.join(str(exc).split())}).") from None

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
        """Finish the file and put it in place (replacing what was at the path)."""
        self._writer.close()
        if os.path.lexists(self._temporary):
            commit(self._temporary, self.path)

    def __enter__(self: Writer) -> Writer:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if kind is None:
            self.close()
            return
        self._writer.close()
        discard(self._temporary)


class DecisionFile(RowTableWriter):
    """One Parquet file of per-preset, per-row decisions, written a chunk at a time.

    Columns: preset, step, sample_id, file, file_row, tokens (model tokens n_i), tokens_rejected (RS rejection,
    IcePop zero weights, legacy mask/veto), kept (no model token rejected), is_weight (R_i[w] before batch
    normalisation; legacy: of the raw w; null without IS), and ``stat_<option>`` per RS option in ``options``:
    the row value v_i (§3: S_i[k], R_i[k], max; R_i[k] for token options), null for presets without that option.
    Raises ConfigError when ``path`` cannot be written.
    """

    def __init__(self, path: str | Path, options: Sequence[str]) -> None:
        self.options = list(options)
        columns = [*FIXED_COLUMNS, *[(f"stat_{option}", "float64") for option in self.options]]
        super().__init__(path, columns, setting=option_name("export_decisions_to"))

    @property
    def names(self) -> list[str]:
        """The columns each ``write`` takes, every one equally long, in file order."""
        return list(self.schema.names)
