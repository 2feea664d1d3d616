"""The per-row decisions file (``compare-presets --export-decisions``): its columns and its Parquet writer.

Only the file side lives here (names, types, writing); what each preset does to each row is computed by
``rollout_diag.drivers.exports.DecisionWriter``, which hands this writer one chunk's columns at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rollout_diag.errors import option_name
from rollout_diag.io.writer import RowTableWriter

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


class DecisionFile:
    """One Parquet file of per-preset, per-row decisions, written a chunk at a time.

    Columns: preset, step, sample_id, file, file_row, tokens (model tokens n_i), tokens_rejected (RS rejection,
    IcePop zero weights, legacy mask/veto), kept (no model token rejected), is_weight (R_i[w] before batch
    normalisation; legacy: of the raw w; null without IS), and ``stat_<option>`` per RS option in ``options``:
    the row value v_i (§3: S_i[k], R_i[k], max; R_i[k] for token options), null for presets without that option.
    Raises ConfigError when ``path`` cannot be written.
    """

    def __init__(self, path: str | Path, options: Sequence[str]) -> None:
        self.path = Path(path)
        self.options = list(options)
        columns = [*FIXED_COLUMNS, *[(f"stat_{option}", "float64") for option in self.options]]
        self._file = RowTableWriter(self.path, columns, setting=option_name("export_decisions_to"))

    @property
    def names(self) -> list[str]:
        return list(self._file.schema.names)

    def write(self, columns: dict[str, Any]) -> None:
        """Append one block of rows: every column of ``names``, equally long."""
        self._file.write(columns)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> DecisionFile:
        return self

    def __exit__(self, error_type: type[BaseException] | None, *rest: Any) -> None:
        """Close the file; a pass that failed leaves no half-written file behind."""
        self._file.__exit__(error_type, *rest)
