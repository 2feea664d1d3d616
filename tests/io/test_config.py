"""The knobs a ``DumpWriter(config=...)`` stores in the Parquet metadata, read back by ``io/config.py``."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollout_diag.errors import ConfigError, DataError
from rollout_diag.io.config import CONFIG_KEY, dump_config
from rollout_diag.io.writer import DumpWriter


def _write(path, **options):
    with DumpWriter(path, **options) as writer:
        for step in range(2):
            ones = -np.ones((2, 3))
            writer.write_step(step, old_log_probs=ones, rollout_log_probs=ones, response_mask=np.ones((2, 3)))
    return path


@pytest.mark.parametrize("name", ["one.parquet", "directory"])
def test_config_round_trips_in_both_modes(tmp_path, name):
    config = {"tp": 8, "r3": "on", "fp16": False, "vllm": "0.11.0"}
    path = _write(tmp_path / name, config=config, world_size=1)
    assert dump_config([path]) == config
    assert dump_config([_write(tmp_path / f"plain-{name}")]) == {}  # no config: no knobs


def test_bad_config_and_bad_metadata(tmp_path):
    with pytest.raises(ConfigError, match="JSON-able"):
        DumpWriter(tmp_path / "x.parquet", config={"when": object()})
    with pytest.raises(ConfigError, match="mapping"):
        DumpWriter(tmp_path / "x.parquet", config=[("tp", 8)])  # type: ignore[arg-type]
    table = pa.table({"a": [1]}).replace_schema_metadata({CONFIG_KEY: b"[1, 2]"})
    pq.write_table(table, tmp_path / "bad.parquet")
    with pytest.raises(DataError, match="not a JSON object"):
        dump_config([tmp_path / "bad.parquet"])
