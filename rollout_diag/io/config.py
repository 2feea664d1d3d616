"""The run's knobs a ``DumpWriter(config=...)`` stores in its Parquet files' key-value metadata, read back for
``rollout-diag runs`` (each run's knobs without a knobs file)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rollout_diag.errors import DataError, InputError

# The Parquet key-value metadata key that holds a DumpWriter's ``config`` (a JSON object).
CONFIG_KEY = b"rollout_diag.config"


def dump_config(inputs: Sequence[str | Path]) -> dict[str, Any]:
    """The knobs a ``DumpWriter(config=...)`` stored in the dump's local Parquet files (the first file that holds
    them; {} when none does). Raises InputError for a file whose footer cannot be read, DataError for metadata that
    is not a JSON object."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rollout_diag.io.sources import expand_inputs

    for source in expand_inputs(inputs):
        if not source.path.endswith(".parquet") or "://" in source.path:
            continue
        try:
            metadata = pq.read_schema(source.path).metadata or {}
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"{source.path}: cannot read its footer ({' '.join(str(exc).split())}).") from None
        found = metadata.get(CONFIG_KEY)
        if found is None:
            continue
        try:
            config = json.loads(found)
        except ValueError:
            config = None
        if not isinstance(config, dict):
            raise DataError(f"{source.path}: metadata {CONFIG_KEY.decode()} is not a JSON object.")
        return config
    return {}
