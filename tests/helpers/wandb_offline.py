"""Reading back what an offline W&B run wrote (``WANDB_MODE=offline``): the records of its ``run-<id>.wandb`` file.

wandb (0.2x on) writes a run as a LevelDB-style log (the format its removed ``sdk/internal/datastore.py`` read): a
7-byte file header (``:W&B``, magic 0xBEE1, version 0), then 32 KiB blocks of records, each a 7-byte header (CRC-32,
length, type: 1 full, 2 first, 3 middle, 4 last) and a piece of a serialized ``wandb_internal_pb2.Record``; a block's
tail shorter than a header is padding. ``wandb.Api`` is online only, so the tests parse the file themselves.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[Any]:
    """Every Record protobuf in ``path``, in order."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:HEADER])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), (ident, magic, version)
    found, pending, offset = [], b"", HEADER
    while offset + HEADER <= len(data):
        room = BLOCK - offset % BLOCK
        if room < HEADER:  # padding at a block's end
            offset += room
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[offset : offset + HEADER])
        if length == 0 and kind == 0:  # zero padding
            offset += room
            continue
        piece = data[offset + HEADER : offset + HEADER + length]
        offset += HEADER + length
        if kind in (FULL, FIRST):
            pending = piece
        else:
            pending += piece
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            found.append(record)
            pending = b""
    return found


@dataclass
class OfflineRun:
    """What one offline run holds: its name, group and project, history rows, summary and artifacts."""

    run_id: str = ""
    name: str = ""
    group: str = ""
    project: str = ""
    resumed: bool = False
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    artifacts: list[tuple[str, str, list[str]]] = field(default_factory=list)  # (name, type, file paths)
    metrics: list[dict[str, str]] = field(default_factory=list)  # define_metric records
    directory: Path | None = None  # the run's directory (its files/ hold logged tables and media)

    def table(self, key: str) -> list[list[Any]]:
        """The rows of the table last logged under ``key`` (a W&B Table, written as files/<path>)."""
        import json

        document = json.loads((self.directory / "files" / self.summary[key + "/path"]).read_text())
        return document["data"]


def read_run(path: Path) -> OfflineRun:
    """The run in ``path`` (a ``run-<id>.wandb`` file)."""
    import json

    run = OfflineRun(directory=Path(path).parent)
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.run_id, run.name = record.run.run_id, record.run.display_name
            run.group, run.project = record.run.run_group, record.run.project
            run.resumed = run.resumed or bool(record.run.resumed)
        elif kind == "history":
            run.history.append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            )
        elif kind == "summary":
            for item in record.summary.update:
                run.summary[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
        elif kind == "artifact":
            paths = [entry.path for entry in record.artifact.manifest.contents]
            run.artifacts.append((record.artifact.name, record.artifact.type, paths))
        elif kind == "metric":
            run.metrics.append(
                {"name": record.metric.name, "glob": record.metric.glob_name, "step": record.metric.step_metric}
            )
    return run


def offline_runs(directory: Path) -> list[OfflineRun]:
    """Every offline run under ``directory`` (wandb's ``dir``), in the order they were made."""
    return [read_run(path) for path in sorted(Path(directory).glob("wandb/offline-run-*/run-*.wandb"))]
