"""Per-row decisions: what each preset would do to each row, streamed into one Parquet file.

``DecisionWriter`` is a chunk consumer (it reads the chunk's rows and its shared per-chunk engine,
``engine.stats.ChunkStats``); the file itself is ``io.decisions.DecisionFile``. ``export_decisions``
is the pass that runs it alone; ``compare_presets(export_decisions_to=…)`` runs it beside the comparison.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rollout_diag.drivers.dump import reads_dump
from rollout_diag.drivers.passes import Inputs, Progress, open_reader, resolve_device, run_chunks
from rollout_diag.engine import arrays
from rollout_diag.engine.stats import ChunkStats, stats
from rollout_diag.io.chunk import Chunk
from rollout_diag.io.decisions import DecisionFile
from rollout_diag.io.reader import DEFAULT_CHUNK_TOKENS
from rollout_diag.metrics.correction import importance_weights, rs_row_value
from rollout_diag.metrics.legacy import legacy_weights
from rollout_diag.metrics.outcome import DropRule
from rollout_diag.presets import Preset, resolve_presets

if TYPE_CHECKING:
    import torch  # annotations only: the arithmetic runs in metrics, on numpy chunks or tensors alike


class DecisionWriter:
    """Streams, per preset and row, what the preset would do to the row, into one Parquet file (columns: see
    :class:`rollout_diag.io.decisions.DecisionFile`)."""

    def __init__(self, path: str | Path, presets: Sequence[Preset]) -> None:
        self.path = Path(path)
        self.presets = list(presets)
        self.rules = [DropRule.of(preset) for preset in self.presets]
        self.options = list(dict.fromkeys(option.option for preset in self.presets for option in preset.rejection))
        self._file = DecisionFile(self.path, self.options)
        self.rows_written = 0

    def write(self, chunk: Chunk) -> None:
        """Append one chunk's rows for every preset."""
        shared = stats(chunk)
        rows = chunk.rows
        missing = np.full(rows, np.nan)
        parts: dict[str, list[Any]] = {name: [] for name in self._file.names}
        for preset, rule in zip(self.presets, self.rules, strict=True):
            rejected_tokens = rule.kept_tokens(shared).map(arrays.logical_not)
            rejected = np.rint(arrays.host(shared.row_sum(rejected_tokens))).astype(np.int64)
            statistics = {option.option: rs_row_value(shared, option) for option in preset.rejection}
            parts["preset"].append([preset.name] * rows)
            parts["step"].append(arrays.host(chunk.step))
            parts["sample_id"].append(chunk.sample_id)
            parts["file"].append(chunk.file)
            parts["file_row"].append(np.asarray(chunk.file_row, dtype=np.int64))
            parts["tokens"].append(arrays.host(shared.row_tokens))
            parts["tokens_rejected"].append(rejected)
            parts["kept"].append(rejected == 0)
            parts["is_weight"].append(self._row_weight(shared, preset, missing))
            for name in self.options:
                values = statistics.get(name)
                parts[f"stat_{name}"].append(missing if values is None else arrays.host(values))
        self._file.write({name: _concatenate(pieces) for name, pieces in parts.items()})
        self.rows_written += rows * len(self.presets)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> DecisionWriter:
        return self

    def __exit__(self, error_type: type[BaseException] | None, *rest: Any) -> None:
        """Close the file; a pass that failed leaves no half-written file behind."""
        self._file.__exit__(error_type, *rest)

    def _row_weight(self, shared: ChunkStats, preset: Preset, missing: np.ndarray) -> np.ndarray:
        """R_i[w] of the preset's IS weights (legacy: of the raw w) before normalisation; NaN (null) without IS."""
        if preset.importance is not None:
            _, weight = importance_weights(shared, preset.importance)
        elif preset.legacy is not None:
            weight = legacy_weights(shared, preset.legacy.level)
        else:
            return missing
        return arrays.host(shared.row_mean(weight))


def _concatenate(pieces: list[Any]) -> np.ndarray:
    """One column from per-preset pieces; text stays as Python strings (object arrays)."""
    text = any(isinstance(piece, list) for piece in pieces)
    return np.concatenate([np.asarray(piece, dtype=object if text else None) for piece in pieces])


@reads_dump
def export_decisions(
    inputs: Inputs,
    path: str | Path,
    presets: Sequence[str | Preset] | None = None,
    *,
    columns: Mapping[str, str] | None = None,
    device: str | torch.device = "auto",
    strict: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    progress: Progress | None = None,
) -> int:
    """Write, per preset and row, whether the preset keeps the row and its statistics (columns: see
    :class:`rollout_diag.io.decisions.DecisionFile`) to the Parquet file ``path``, streaming. Returns the rows
    written.

    Raises RolloutDiagError for bad input or options (ConfigError when ``path`` cannot be written).
    """
    chosen = resolve_presets(presets)
    torch_device = resolve_device(device)
    reader = open_reader(inputs, columns, strict=strict, chunk_tokens=chunk_tokens)
    with DecisionWriter(path, chosen) as writer:
        run_chunks(reader, [writer.write], torch_device, progress)
    return writer.rows_written
