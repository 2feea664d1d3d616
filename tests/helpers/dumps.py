"""Write small Parquet dumps for tests, in either layout and under any trainer's column names.

A *row* is one sequence, a dict::

    {"step": 0, "sample_id": "s0", "rollout": [-0.5, -1.0], "trainer": [-0.4, -1.1], "mask": [1, 1]}

with optional ``token_ids`` (list of int) and ``tokens`` (list of str). ``rollout``/``trainer``/``mask``
may be None (a null list) and their elements may be NaN, inf or None; the writers do not validate.

``names`` maps a role to the column name written for it; a role mapped to None is left out of the file
(``names={"mask": None}`` writes no mask column). Roles: rollout, trainer, mask, step, sample_id,
position (token layout only), token_ids, tokens.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

Row = dict[str, Any]
FLOAT32 = pa.float32()  # what trainers write for logprobs

VERL_NAMES: dict[str, str | None] = {
    "rollout": "rollout_log_probs",
    "trainer": "old_log_probs",
    "mask": "response_mask",
    "step": "step",
    "sample_id": "sample_id",
    "position": "position",
    "token_ids": "token_ids",
    "tokens": "tokens",
}
SKYRL_NAMES = {"rollout": "rollout_logprobs", "trainer": "action_log_probs", "mask": "loss_mask"}
PRIME_RL_NAMES = {"rollout": "inference_logprobs", "trainer": "trainer_logprobs", "mask": "loss_mask"}
NEMO_RL_NAMES = {"rollout": "generation_logprobs", "trainer": "prev_logprobs", "mask": "token_loss_mask"}
OPEN_INSTRUCT_NAMES = {"rollout": "vllm_logprobs"}
ALT_KEY_NAMES = {"step": "global_step", "sample_id": "uid"}


def column_names(names: Mapping[str, str | None] | None = None) -> dict[str, str | None]:
    """verl's names with ``names`` laid over them (None drops a role's column)."""
    return {**VERL_NAMES, **dict(names or {})}


def seq_row(
    step: int,
    sample_id: str | int,
    rollout: Sequence[float] | None,
    trainer: Sequence[float] | None,
    mask: Sequence[int] | None = None,
    **optional: Any,
) -> Row:
    """One sequence; ``mask`` defaults to all ones (for a null mask list, set ``row["mask"] = None`` afterwards)."""
    if mask is None and rollout is not None:
        mask = [1] * len(rollout)
    return {"step": step, "sample_id": sample_id, "rollout": rollout, "trainer": trainer, "mask": mask, **optional}


def random_rows(
    seed: int = 0,
    *,
    steps: Sequence[int] = (0, 1, 2),
    rows_per_step: int = 4,
    min_length: int = 1,
    max_length: int = 12,
    env_share: float = 0.3,
    with_token_ids: bool = False,
) -> list[Row]:
    """Plausible rows: logprobs ≤ 0 that survive float32 exactly, a mask with environment runs (mask 0).

    Every row has at least one model token. sample ids are ``s{step}-{index}``.
    """
    rng = np.random.default_rng(seed)
    rows = []
    for step in steps:
        for index in range(rows_per_step):
            length = int(rng.integers(min_length, max_length + 1))
            trainer = -rng.exponential(1.0, length)
            rollout = trainer + rng.normal(0.0, 0.05, length)
            rollout = np.minimum(rollout, 0.0)
            mask = (rng.random(length) >= env_share).astype(np.int8)
            mask[int(rng.integers(0, length))] = 1
            row = seq_row(
                step,
                f"s{step}-{index}",
                np.float32(rollout).astype(np.float64).tolist(),
                np.float32(trainer).astype(np.float64).tolist(),
                mask.tolist(),
            )
            if with_token_ids:
                row["token_ids"] = rng.integers(0, 1000, length).tolist()
            rows.append(row)
    return rows


def sequence_table(
    rows: Sequence[Row],
    *,
    names: Mapping[str, str | None] | None = None,
    logprob_type: pa.DataType = FLOAT32,
) -> pa.Table:
    """The sequence layout (one row per sequence, list columns) as an Arrow table."""
    cols = column_names(names)
    arrays: dict[str, pa.Array] = {}

    def put(role: str, values: list, data_type: pa.DataType) -> None:
        name = cols.get(role)
        if name is not None:
            arrays[name] = pa.array(values, type=data_type)

    put("step", [row["step"] for row in rows], pa.int64())
    put("sample_id", [row["sample_id"] for row in rows], _id_type(rows))
    for role in ("rollout", "trainer"):
        put(role, [_floats(row[role]) for row in rows], pa.list_(pa.float64()))
        if cols.get(role) is not None:  # cast, so that e.g. pa.string() gives list<string> of "-0.5"
            arrays[cols[role]] = arrays[cols[role]].cast(pa.list_(logprob_type))
    put("mask", [row.get("mask") for row in rows], pa.list_(pa.int8()))
    if any("token_ids" in row for row in rows):
        put("token_ids", [row.get("token_ids") for row in rows], pa.list_(pa.int32()))
    if any("tokens" in row for row in rows):
        put("tokens", [row.get("tokens") for row in rows], pa.list_(pa.string()))
    return pa.table(arrays)


def token_table(
    rows: Sequence[Row],
    *,
    names: Mapping[str, str | None] | None = None,
    shuffle_seed: int | None = None,
) -> pa.Table:
    """The token layout (one row per token, scalar columns), sequences in the order given.

    ``shuffle_seed`` shuffles the tokens *within* each sequence (``position`` keeps the true order).
    Null lists and ragged rows cannot be expressed here; every row needs equal-length lists.
    """
    cols = column_names(names)
    shuffle = random.Random(shuffle_seed) if shuffle_seed is not None else None
    out: dict[str, list] = {role: [] for role in ("step", "sample_id", "position", "rollout", "trainer", "mask")}
    has_ids = any("token_ids" in row for row in rows)
    has_text = any("tokens" in row for row in rows)
    out["token_ids"], out["tokens"] = [], []
    for row in rows:
        length = len(row["rollout"])
        mask = row.get("mask") or [1] * length
        order = list(range(length))
        if shuffle is not None:
            shuffle.shuffle(order)
        for position in order:
            out["step"].append(row["step"])
            out["sample_id"].append(row["sample_id"])
            out["position"].append(position)
            out["rollout"].append(_float(row["rollout"][position]))
            out["trainer"].append(_float(row["trainer"][position]))
            out["mask"].append(mask[position])
            if has_ids:
                out["token_ids"].append(row["token_ids"][position])
            if has_text:
                out["tokens"].append(row["tokens"][position])
    types = {
        "step": pa.int64(),
        "sample_id": _id_type(rows),
        "position": pa.int64(),
        "rollout": pa.float32(),
        "trainer": pa.float32(),
        "mask": pa.int8(),
        "token_ids": pa.int32(),
        "tokens": pa.string(),
    }
    arrays = {}
    for role, values in out.items():
        name = cols.get(role)
        if name is None or (role == "token_ids" and not has_ids) or (role == "tokens" and not has_text):
            continue
        arrays[name] = pa.array(values, type=types[role])
    return pa.table(arrays)


def write_table(path: str | Path, table: pa.Table, *, row_group_size: int | None = None) -> Path:
    """Write ``table`` to ``path`` (parent directories made); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def write_sequence_dump(
    path: str | Path,
    rows: Sequence[Row],
    *,
    names: Mapping[str, str | None] | None = None,
    row_group_size: int | None = None,
    logprob_type: pa.DataType = FLOAT32,
) -> Path:
    """Write ``rows`` in the sequence layout; returns the path."""
    return write_table(
        path, sequence_table(rows, names=names, logprob_type=logprob_type), row_group_size=row_group_size
    )


def write_token_dump(
    path: str | Path,
    rows: Sequence[Row],
    *,
    names: Mapping[str, str | None] | None = None,
    row_group_size: int | None = None,
    shuffle_seed: int | None = None,
) -> Path:
    """Write ``rows`` in the token layout (one row per token); returns the path."""
    table = token_table(rows, names=names, shuffle_seed=shuffle_seed)
    return write_table(path, table, row_group_size=row_group_size)


def _id_type(rows: Sequence[Row]) -> pa.DataType:
    return pa.int64() if all(isinstance(row["sample_id"], int) for row in rows) else pa.string()


def _float(value: float | None) -> float | None:
    return None if value is None else float(value)


def _floats(values: Sequence[float | None] | None) -> list[float | None] | None:
    return None if values is None else [_float(v) for v in values]


def encodings(path: str | Path) -> dict[str, set[str]]:
    """Each leaf column's Parquet encodings in the first row group (e.g. 'rollout_log_probs.list.element')."""
    group = pq.ParquetFile(path).metadata.row_group(0)
    return {group.column(i).path_in_schema: set(group.column(i).encodings) for i in range(group.num_columns)}


def corrupt_row_group(path: Path, group: int) -> None:
    """Overwrite the first page header of every column chunk in ``group`` (the footer stays valid)."""
    metadata = pq.ParquetFile(path).metadata.row_group(group)
    data = bytearray(path.read_bytes())
    for index in range(metadata.num_columns):
        chunk = metadata.column(index)
        start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
        data[start : start + 8] = b"\xff" * 8
    path.write_bytes(bytes(data))
