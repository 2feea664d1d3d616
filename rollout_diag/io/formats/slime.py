"""slime ``--dump-details DIR``: ``DIR/train_data/<rollout_id>.pt`` (and ``DIR/rollout_data/<rollout_id>.pt``).

Read from THUDM/slime at commit 624b824a898ab0ec1fcb4d373004c7f3852bf515:
- ``slime/utils/arguments.py``: ``--dump-details DIR`` sets ``save_debug_rollout_data`` to
  ``DIR/rollout_data/{rollout_id}.pt`` and ``save_debug_train_data`` to ``DIR/train_data/{rollout_id}.pt``.
- ``slime/observability/train_data_utils.py`` ``_build_dump_payload`` (``format_version`` 2):
  ``{"format_version": 2, "rollout_id", "rank", "samples": [...], "dp_shards": [...]}``, one dict per
  training sample in rollout order, holding response-only tensors (``rollout_log_probs`` from the
  inference engine, ``log_probs`` from the trainer, ``loss_masks``; CP shards already gathered), the
  full ``tokens``, ``response_lengths`` and ``total_lengths``, and ``sample_index`` / ``rollout_position``.
  It is written with ``torch.save`` of tensors, lists and dicts, and slime's own test loads it with
  ``weights_only=True``, as done here. The rollout dump needs ``weights_only=False`` and carries no
  trainer logprobs: it is not read.
- Step = rollout id + 1 (slime counts rollouts from 0; the trainer's steps are 1-based).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rollout_diag.errors import InputError
from rollout_diag.io.formats.base import Row, RowsFile, number_in
from rollout_diag.io.formats.registry import TrainerFormat, register

NAME = "slime"
FILE_GLOB = "*.pt"


def step_of(path: Path) -> int | None:
    rollout_id = number_in(path.name, r"^(\d+)\.pt$")
    return None if rollout_id is None else rollout_id + 1


def is_train_dump(path: Path) -> bool:
    return path.suffix == ".pt" and path.parent.name == "train_data" and step_of(path) is not None


def open_file(path: str) -> RowsFile:
    rows = _read(path)
    return RowsFile(path, len(rows), lambda: rows)


def _load(path: str) -> Any:
    import pickle

    import torch

    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        detail = " ".join(str(exc).split())
        needs = detail.split("Unsupported global: GLOBAL ")[-1].split(" ")[0] if "GLOBAL " in detail else "objects"
        raise InputError(
            f"{path}: refused: the file needs {needs}, more than tensors, lists and dicts "
            "(torch.load weights_only=True).",
            hint="point at DIR/train_data/, the dump slime writes as plain tensors.",
        ) from exc
    except (RuntimeError, OSError, EOFError, ValueError) as exc:
        raise InputError(f"{path}: not a readable torch file ({' '.join(str(exc).split())[:200]}).") from exc


def _numpy(value: Any) -> np.ndarray | None:
    if value is None:
        return None
    if hasattr(value, "detach"):
        value = value.detach()
        return value.double().numpy() if value.is_floating_point() else value.numpy()
    return np.asarray(value)


def _read(path: str) -> list[Row]:
    payload = _load(path)
    if not isinstance(payload, dict) or not isinstance(payload.get("samples"), list):
        raise InputError(
            f"{path}: not a slime train dump (expected a dict with 'samples', format_version 2).",
            hint="slime's rollout_data/ dumps hold no trainer logprobs; point at train_data/.",
        )
    rollout_id = payload.get("rollout_id")
    step = rollout_id + 1 if isinstance(rollout_id, int) else (step_of(Path(path)) or 0)
    return [_row(sample, index, step) for index, sample in enumerate(payload["samples"])]


def _row(sample: Any, index: int, step: int) -> Row:
    if not isinstance(sample, dict):
        return Row.unreadable(step, str(index), "sample is not a dict")
    sample_id = next(
        (str(sample[key]) for key in ("sample_index", "rollout_position") if isinstance(sample.get(key), int)),
        str(index),
    )
    try:
        rollout, trainer = _numpy(sample.get("rollout_log_probs")), _numpy(sample.get("log_probs"))
        mask, tokens = _numpy(sample.get("loss_masks")), _numpy(sample.get("tokens"))
    except (TypeError, ValueError) as exc:
        return Row.unreadable(step, sample_id, f"a field is not numeric ({exc})")
    if rollout is None or rollout.ndim != 1:
        return Row.unreadable(step, sample_id, _not_per_token(rollout), "rollout_log_probs")
    if trainer is None or trainer.ndim != 1:
        return Row.unreadable(step, sample_id, _not_per_token(trainer), "log_probs")
    if mask is None:
        mask = np.ones(len(rollout), dtype=np.int8)
    token_ids = None
    if tokens is not None and tokens.ndim == 1 and len(tokens) >= len(rollout):
        token_ids = tokens[len(tokens) - len(rollout) :].astype(np.int64)  # the response ends the sequence
    return Row(
        step=step,
        sample_id=sample_id,
        rollout=rollout,
        trainer=trainer,
        mask=np.where(mask == 0, 0, np.where(mask == 1, 1, 2)).astype(np.int8),
        token_ids=token_ids,
    )


def _train_dumps(files: list[Path], named: set[Path]) -> tuple[list[Path], list[str]]:
    """The train_data dumps when there are any (a run dumps rollout_data beside them), else every file."""
    return [path for path in files if is_train_dump(path)] or files, []


register(
    TrainerFormat(
        name=NAME,
        suffix=".pt",
        described="train_data/N.pt",
        step_of=step_of,
        open_file=lambda path, trust_pickle: open_file(path),
        order=30,
        by_name=lambda path: path.parent.name != "rollout_data",
        select=_train_dumps,
    )
)


def _not_per_token(values: np.ndarray | None) -> str:
    """Why a sample's logprob field is not one value per response token."""
    if values is None:
        return "missing (not carried into training)"
    return f"expected one value per response token, shape {values.shape}"
