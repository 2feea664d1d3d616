"""The compiled JSON-lines scanner's conversions, driven from Python lists of lines."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from numba import njit

from rollout_diag.io.jsonl import Scanner
from rollout_diag.io.jsonl import numbers as jsonl_numbers


@njit(cache=False)
def _numbers(buf, starts):
    n = starts.shape[0] - 1
    out = np.empty(n)
    ok = np.zeros(n, np.bool_)
    for i in range(n):
        p, value, _ = jsonl_numbers.number(buf, starts[i], starts[i + 1])
        if p == starts[i + 1]:
            out[i] = value
            ok[i] = True
    return out, ok


def _convert(strings: list[str]) -> tuple[np.ndarray, np.ndarray]:
    data = "".join(strings).encode()
    starts = np.cumsum([0, *(len(s) for s in strings)]).astype(np.int64)
    return _numbers(np.frombuffer(data, np.uint8), starts)


_SCHEMA = pa.schema(
    [
        ("i", pa.int64()),
        ("s", pa.string()),
        ("f", pa.list_(pa.float64())),
        ("n", pa.list_(pa.int64())),
        ("b", pa.list_(pa.bool_())),
        ("ff", pa.list_(pa.list_(pa.float64()))),
    ]
)


def _scan_lines(lines: list[str]):
    data = "".join(line + "\n" for line in lines).encode()
    starts = np.cumsum([0, *(len(line.encode()) + 1 for line in lines)]).astype(np.int64)
    return Scanner(_SCHEMA).scan(data, starts)
