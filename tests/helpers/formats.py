"""Write one known dataset in every trainer format rollout-diag imports, as each trainer writes it.

The dataset is :func:`dataset` (``dumps.random_rows``: response tokens with environment runs, float32
values). Each writer lays it out the way the framework's own writer does (read in their code; see the
docstring of each ``rollout_diag/io/formats/*.py``): prompt tokens before the response where the
framework records them, its padding, its wrapping, its step numbering. None of them imports the
framework: the pickles name the framework's classes through temporary stand-in modules.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import pickle
import sys
import types
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from helpers.dumps import Row, random_rows, write_sequence_dump

STEPS = (1, 2, 3)  # every trainer here logs 1-based steps
PROMPT_LENGTH = 3


def dataset(seed: int = 7, rows_per_step: int = 5) -> list[Row]:
    return random_rows(seed, steps=STEPS, rows_per_step=rows_per_step, max_length=10, with_token_ids=True)


def by_step(rows: Sequence[Row]) -> dict[int, list[Row]]:
    steps: dict[int, list[Row]] = {}
    for row in rows:
        steps.setdefault(row["step"], []).append(row)
    return steps


def prompt(row: Row) -> tuple[list[int], list[float]]:
    """A prompt for the row: token ids and the trainer's logprobs of them (the rollout has none)."""
    seed = zlib.crc32(str(row["sample_id"]).encode())  # str hash() varies between processes
    rng = np.random.default_rng(seed)
    return rng.integers(0, 1000, PROMPT_LENGTH).tolist(), np.float32(-rng.exponential(1.0, PROMPT_LENGTH)).tolist()


def write_parquet(path: Path, rows: Sequence[Row]) -> Path:
    return write_sequence_dump(path, rows)


# ------------------------------------------------------------------------------------------ prime-rl
def prime_rl_record(row: Row, rank: int, index: int) -> dict[str, Any]:
    """One token-export record: prompt + response, loss mask on the trained tokens, nulls for non-finite."""
    prompt_ids, prompt_trainer = prompt(row)
    length = len(row["rollout"])

    def finite(values: Sequence[float | None]) -> list[float | None]:
        return [v if v is not None and math.isfinite(v) else None for v in values]

    return {
        "schema_version": 1,
        "step": row["step"],
        "rank": rank,
        "micro_step": 0,
        "micro_sequence_idx": index,
        "export_sequence_idx": index,
        "env_name": "math",
        "token_ids": prompt_ids + row["token_ids"],
        "position_ids": list(range(PROMPT_LENGTH + length)),
        "loss_mask": [False] * PROMPT_LENGTH + [bool(m) for m in row["mask"]],
        "advantages": [0.0] * (PROMPT_LENGTH + length),
        "inference_logprobs": [0.0] * PROMPT_LENGTH + finite(row["rollout"]),
        "trainer_logprobs": finite(prompt_trainer + row["trainer"]),
        "entropy": [0.5] * (PROMPT_LENGTH + length),
        "mismatch_kl": [None] * (PROMPT_LENGTH + length),
        "rl_weights": [None] * (PROMPT_LENGTH + length),
        "ce_weights": [None] * (PROMPT_LENGTH + length),
        "ref_kl_weights": [None] * (PROMPT_LENGTH + length),
    }


def write_prime_rl(root: Path, rows: Sequence[Row], ranks: int = 2, stable: bool = True) -> Path:
    """``root/token_exports/step_<N>/rank_<R>.jsonl``, rows dealt to ranks in turn, STABLE per step."""
    exports = root / "token_exports"
    for step, step_rows in by_step(rows).items():
        directory = exports / f"step_{step}"
        directory.mkdir(parents=True, exist_ok=True)
        per_rank: dict[int, list[str]] = {rank: [] for rank in range(ranks)}
        for position, row in enumerate(step_rows):
            rank = position % ranks
            record = prime_rl_record(row, rank, len(per_rank[rank]))
            per_rank[rank].append(json.dumps(record, separators=(",", ":"), allow_nan=False))
        for rank, lines in per_rank.items():
            (directory / f"rank_{rank}.jsonl").write_text("".join(line + "\n" for line in lines))
        if stable:
            (directory / "STABLE").touch()
    return exports


# ------------------------------------------------------------------------------------------ NeMo-RL
def write_nemo_rl(root: Path, rows: Sequence[Row]) -> Path:
    """``root/train_data_step<N>.jsonl``: length-1 batch lists, rows right-padded to the step's longest,
    position 0's logprob a placeholder 0, bare NaN/Infinity as Python's json writes them."""
    root.mkdir(parents=True, exist_ok=True)
    for step, step_rows in by_step(rows).items():
        width = PROMPT_LENGTH + max(len(row["rollout"]) for row in step_rows)
        lines = []
        for index, row in enumerate(step_rows):
            prompt_ids, prompt_trainer = prompt(row)
            length = PROMPT_LENGTH + len(row["rollout"])
            pad = width - length
            trainer = [0.0, *prompt_trainer[1:], *row["trainer"]]
            record = {
                "content": [[f"prompt {row['sample_id']}", "response"]],
                "rewards": [1.0],
                "input_lengths": [length],
                "token_ids": [prompt_ids + row["token_ids"] + [0] * pad],
                "token_loss_mask": [[0] * PROMPT_LENGTH + list(row["mask"]) + [0] * pad],
                "sample_loss_mask": [1.0],
                "advantages": [[0.0] * width],
                "generation_logprobs": [[0.0] * PROMPT_LENGTH + list(row["rollout"]) + [0.0] * pad],
                "prev_logprobs": [trainer + [0.0] * pad],
                "idx": index,
            }
            lines.append(json.dumps(record))
        (root / f"train_data_step{step}.jsonl").write_text("".join(line + "\n" for line in lines))
    return root


# ------------------------------------------------------------------------------------------ slime
def write_slime(root: Path, rows: Sequence[Row]) -> Path:
    """``root/train_data/<rollout_id>.pt`` (format_version 2, response-only tensors) and a rollout dump
    beside it; rollout id = step − 1."""
    for step, step_rows in by_step(rows).items():
        samples = []
        for index, row in enumerate(step_rows):
            prompt_ids, _ = prompt(row)
            length = len(row["rollout"])
            samples.append(
                {
                    "data_parallel_rank": index % 2,
                    "sample_index": index,
                    "rollout_position": index,
                    "tokens": torch.tensor(prompt_ids + row["token_ids"]),
                    "response_lengths": length,
                    "total_lengths": PROMPT_LENGTH + length,
                    "loss_masks": torch.tensor(row["mask"], dtype=torch.int),
                    "rollout_log_probs": torch.tensor(row["rollout"], dtype=torch.float32),
                    "log_probs": torch.tensor(row["trainer"], dtype=torch.float32),
                    "advantages": torch.zeros(length),
                }
            )
        payload = {"format_version": 2, "rollout_id": step - 1, "rank": 0, "samples": samples, "dp_shards": []}
        (root / "train_data").mkdir(parents=True, exist_ok=True)
        torch.save(payload, root / "train_data" / f"{step - 1}.pt")
        (root / "rollout_data").mkdir(parents=True, exist_ok=True)
        torch.save({"rollout_id": step - 1, "samples": []}, root / "rollout_data" / f"{step - 1}.pt")
    return root


# ------------------------------------------------------------------------------------------ pickles
@contextlib.contextmanager
def stand_in_module(name: str, **members: Any) -> Iterator[types.ModuleType]:
    """A module ``name`` holding ``members`` while pickling, so pickles name the framework's classes."""
    saved = {key: sys.modules.get(key) for key in _parents(name)}
    module = types.ModuleType(name)
    for key, value in members.items():
        value.__module__ = name
        value.__qualname__ = key
        setattr(module, key, value)
    for parent in _parents(name):
        sys.modules.setdefault(parent, types.ModuleType(parent))
    sys.modules[name] = module
    try:
        yield module
    finally:
        for key, value in saved.items():
            if value is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = value


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _serialized(array: np.ndarray) -> dict[str, Any]:
    """SkyRL's ``_serialize_tensor`` numpy path."""
    return {"format": "numpy", "data": array.tobytes(), "shape": array.shape, "dtype": str(array.dtype)}


def skyrl_state(step_rows: Sequence[Row], pad_size: int = 1) -> dict[str, Any]:
    """A TrainingInputBatch's pickled state: right-aligned response tensors, left-padded sequences,
    ``pad_size`` padding copies of row 0 at the end (loss mask 0)."""
    width = max(len(row["rollout"]) for row in step_rows)
    total = PROMPT_LENGTH + width
    count = len(step_rows) + pad_size
    rollout = np.zeros((count, width), np.float32)
    trainer = np.zeros((count, width), np.float32)
    loss_mask = np.zeros((count, width), np.float32)
    response_mask = np.zeros((count, width), np.int64)
    sequences = np.zeros((count, total), np.int64)
    for index in range(count):
        row = step_rows[index if index < len(step_rows) else 0]
        length = len(row["rollout"])
        start = width - length
        prompt_ids, prompt_trainer = prompt(row)
        rollout[index, start:] = row["rollout"]
        trainer[index, start:] = row["trainer"]
        trainer[index, :start] = (prompt_trainer * width)[:start]  # prompt logprobs before a short response
        loss_mask[index, start:] = row["mask"] if index < len(step_rows) else 0
        response_mask[index, start:] = 1
        sequences[index, total - length - PROMPT_LENGTH :] = prompt_ids + row["token_ids"]
    batch = {
        "sequences": sequences,
        "attention_mask": (sequences != 0).astype(np.int64),
        "loss_mask": loss_mask,
        "response_mask": response_mask,
        "action_log_probs": trainer,
        "base_action_log_probs": trainer,
        "advantages": np.zeros((count, width), np.float32),
        "rollout_logprobs": rollout,
    }
    return {
        "batch_dict": {key: _serialized(value) for key, value in batch.items()} | {"values": None},
        "batch_size": count,
        "device": torch.device("cpu"),
        "metadata": {"response_length": width, "avg_response_length": 4.0, "pad_size": pad_size},
    }


class _TrainingInputBatch(dict):
    """Pickles as SkyRL's TensorBatch does: ``(_rebuild_tensor_batch, (cls, state))``."""

    state: dict[str, Any] | None = None

    def __reduce__(self):
        return (_rebuild_tensor_batch, (type(self), self.state))


def _rebuild_tensor_batch(cls, state):  # pragma: no cover - never called: only named in the pickle
    raise AssertionError("the importer must not call SkyRL's code")


def write_skyrl(root: Path, rows: Sequence[Row]) -> Path:
    """``root/dumped_data/global_step_<N>_training_input.pkl``."""
    directory = root / "dumped_data"
    directory.mkdir(parents=True, exist_ok=True)
    with stand_in_module(
        "skyrl.backends.skyrl_train.training_batch",
        TrainingInputBatch=_TrainingInputBatch,
        _rebuild_tensor_batch=_rebuild_tensor_batch,
    ):
        for step, step_rows in by_step(rows).items():
            batch = _TrainingInputBatch()
            batch.state = skyrl_state(step_rows)
            (directory / f"global_step_{step}_training_input.pkl").write_bytes(pickle.dumps(batch))
    return directory


class _DataProto:
    """Pickles as verl's DataProto does: the dataclass's NEWOBJ, then BUILD with ``__getstate__``."""

    def __init__(self, state: tuple) -> None:
        self.state = state

    def __getstate__(self) -> tuple:
        return self.state

    def __setstate__(self, state: tuple) -> None:  # pragma: no cover - loading is the importer's job
        self.state = state


def _rebuild_tensordict_files_consolidated(metadata, storage):  # pragma: no cover - only named
    raise AssertionError("the importer must not call tensordict's code")


class _Consolidated:
    """torch.save's view of a consolidated TensorDict: ``_reduce_td`` returns the rebuild call."""

    def __init__(self, metadata: dict[str, Any], storage: torch.Tensor) -> None:
        self.metadata, self.storage = metadata, storage

    def __reduce__(self):
        return (_rebuild_tensordict_files_consolidated, (self.metadata, self.storage))


def consolidated_bytes(tensors: dict[str, torch.Tensor]) -> bytes:
    """``torch.save`` of a consolidated TensorDict: one uint8 storage, byte offsets padded to 8."""
    chunks, leaves, start = [], {}, 0
    for key, tensor in tensors.items():
        raw = tensor.contiguous().view(-1).view(torch.uint8)
        pad = (8 - raw.numel() % 8) % 8
        chunks.append(torch.cat([raw, torch.zeros(pad, dtype=torch.uint8)]))
        leaves[key] = (str(tensor.dtype), list(tensor.shape), start, start + raw.numel() + pad, pad)
        start += raw.numel() + pad
    batch_size = next(iter(tensors.values())).shape[:1]
    metadata = {
        "cls": "TensorDict",
        "non_tensors": {},
        "leaves": leaves,
        "cls_metadata": {"batch_size": batch_size, "device": None, "names": None, "is_locked": False},
        "size": start,
    }
    buffer = io.BytesIO()
    with stand_in_module(
        "tensordict._reductions", _rebuild_tensordict_files_consolidated=_rebuild_tensordict_files_consolidated
    ):
        torch.save(_Consolidated(metadata, torch.cat(chunks)), buffer)
    return buffer.getvalue()


def verl_state(step: int, step_rows: Sequence[Row]) -> tuple:
    """(batch bytes, non-tensor batch, meta info): right-padded responses, prompt + response attention."""
    width = max(len(row["rollout"]) for row in step_rows)
    count = len(step_rows)
    rollout = torch.zeros(count, width)
    trainer = torch.zeros(count, width)
    response_mask = torch.zeros(count, width, dtype=torch.int64)
    responses = torch.zeros(count, width, dtype=torch.int64)
    attention = torch.zeros(count, PROMPT_LENGTH + width, dtype=torch.int64)
    for index, row in enumerate(step_rows):
        length = len(row["rollout"])
        rollout[index, :length] = torch.tensor(row["rollout"])
        trainer[index, :length] = torch.tensor(row["trainer"])
        response_mask[index, :length] = torch.tensor(row["mask"])
        responses[index, :length] = torch.tensor(row["token_ids"])
        attention[index, : PROMPT_LENGTH + length] = 1
    batch = {
        "responses": responses,
        "attention_mask": attention,
        "response_mask": response_mask,
        "old_log_probs": trainer,
        "rollout_log_probs": rollout,
    }
    uids = np.array([row["sample_id"] for row in step_rows], dtype=object)
    return consolidated_bytes(batch), {"uid": uids}, {"global_steps": step, "temperature": 1.0}


def write_verl(root: Path, rows: Sequence[Row]) -> Path:
    """``root/step_<N>.pkl``: ``DataProto.save_to_disk`` of each step's batch."""
    root.mkdir(parents=True, exist_ok=True)
    with stand_in_module("verl.protocol", DataProto=_DataProto):
        for step, step_rows in by_step(rows).items():
            (root / f"step_{step}.pkl").write_bytes(pickle.dumps(_DataProto(verl_state(step, step_rows))))
    return root


WRITERS = {
    "prime-rl": write_prime_rl,
    "nemo-rl": write_nemo_rl,
    "slime": write_slime,
    "skyrl": write_skyrl,
    "verl": write_verl,
}
