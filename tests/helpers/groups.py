"""A table of rows in several environments, and how close grouped results must come."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from helpers.dumps import random_rows, sequence_table

ENVS = ("math", "code", "search")


RTOL = ATOL = 1e-12  # chi2 − 1 and similar differences of values near 1: an absolute floor as well


def env_table(seed: int = 0) -> pa.Table:
    """5 steps × 12 rows; env_name cycles over three environments except that step 1 has no 'code' row and
    every 7th row's env_name is null; reward of both signs (and some exact zeros); a bool tag."""
    rows = random_rows(seed, steps=(0, 1, 2, 3, 4), rows_per_step=12, max_length=40)
    rng = np.random.default_rng(seed)
    envs: list[str | None] = []
    for index, row in enumerate(rows):
        env = ENVS[index % 3]
        if row["step"] == 1 and env == "code":
            env = "math"
        envs.append(None if index % 7 == 3 else env)
    rewards = np.round(rng.normal(size=len(rows)), 1)
    rewards[::5] = 0.0
    table = sequence_table(rows)
    return (
        table.append_column("env_name", pa.array(envs, pa.string()))
        .append_column("reward", pa.array(rewards))
        .append_column("flag", pa.array([bool(i % 2) for i in range(len(rows))]))
    )


def assert_close(actual: dict[str, float], expected: dict[str, float], where: str) -> None:
    assert set(actual) <= set(expected), f"{where}: unexpected {set(actual) - set(expected)}"
    assert actual, where
    for name, value in actual.items():
        want = expected[name]
        if math.isnan(want) or math.isinf(want):
            assert value == want or (math.isnan(value) and math.isnan(want)), f"{where} {name}: {value} != {want}"
        else:
            assert math.isclose(value, want, rel_tol=RTOL, abs_tol=ATOL), f"{where} {name}: {value} != {want}"
