"""SkyRL ``dumped_data/global_step_<N>_training_input.pkl`` (``trainer.dump_data_batch=true``).

Read from NovaSky-AI/SkyRL at commit a9564572eb8e91076be43c1bd5e4615e3de17265:
- ``skyrl/train/trainer.py`` ``dump_data`` pickles the ``TrainingInputBatch`` of each step to
  ``<trainer.export_path>/dumped_data/global_step_{global_step}_training_input.pkl``, after advantages
  (``rewards`` and the ``uids`` metadata are popped first).
- ``skyrl/backends/skyrl_train/training_batch.py``: ``TensorBatch.__reduce__`` returns
  ``(_rebuild_tensor_batch, (cls, state))``; ``state["batch_dict"]`` maps each key to None or
  ``{"format": "numpy", "data": bytes, "shape", "dtype"}`` (or ``"torch"``: ``torch.save`` bytes, loaded here
  with ``weights_only=True``; or ``"tensor_list"``). ``state["metadata"]["pad_size"]`` rows at the end are
  padding copies of row 0.
- ``skyrl/train/dataset/preprocess.py``: response-level tensors (``response_mask``, ``loss_mask``,
  ``rollout_logprobs``, ``action_log_probs``) are right-aligned (left-padded) to the longest response:
  row i's response is its last ``response_mask[i].sum()`` columns (the columns before it hold prompt
  logprobs in ``action_log_probs``). ``rollout_logprobs`` is the inference engine's, ``action_log_probs``
  the trainer's, ``loss_mask`` the trained tokens; ``sequences`` (left-padded too) ends with the response.

Loaded through :mod:`safe_pickle`: only SkyRL's batch classes (as plain-data stand-ins) are admitted.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

from rollout_diag.errors import InputError
from rollout_diag.io.formats import safe_pickle
from rollout_diag.io.formats.base import Row, RowsFile, number_in
from rollout_diag.io.formats.registry import register_pickle

NAME = "skyrl"
FILE_GLOB = "*.pkl"
_MODULES = ("skyrl.backends.skyrl_train.training_batch", "skyrl_train.training_batch")  # current, older package
MARKERS = tuple(f"{module}.{name}" for module in _MODULES for name in ("_rebuild_tensor_batch", "TrainingInputBatch"))
_NUMERIC_KINDS = "biuf"


class TensorBatchData(dict):
    """What a pickled SkyRL TensorBatch holds: its state, as plain data."""

    state: dict[str, Any] | None = None

    def __setstate__(self, state: dict[str, Any]) -> None:  # older pickles: dict items, then BUILD
        self.state = state


def _rebuild_tensor_batch(cls: Any, state: dict[str, Any]) -> TensorBatchData:
    batch = TensorBatchData()
    batch.state = state
    return batch


FORMAT_GLOBALS: dict[tuple[str, str], Any] = {}
for _module in _MODULES:
    FORMAT_GLOBALS[(_module, "_rebuild_tensor_batch")] = _rebuild_tensor_batch
    for _name in ("TrainingInputBatch", "TensorBatch", "TrainingOutputBatch"):
        FORMAT_GLOBALS[(_module, _name)] = TensorBatchData


def step_of(path: Path) -> int | None:
    return number_in(path.name, r"global_step_(\d+)")


def open_file(path: str, trust_pickle: bool = False) -> RowsFile:
    rows = _read(path, trust_pickle)
    return RowsFile(path, len(rows), lambda: rows)


def _tensor(path: str, key: str, value: Any) -> np.ndarray | None:
    """One serialized tensor of the batch dict as numpy."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InputError(f"{path}: field '{key}' is a {type(value).__name__}, not a serialized tensor.")
    if value.get("format") == "torch":
        import torch

        try:
            tensor = torch.load(io.BytesIO(value["data"]), weights_only=True)
        except Exception as exc:  # torch raises many types for a bad payload; all mean the same here
            raise InputError(f"{path}: field '{key}': torch payload not readable as plain tensors ({exc}).") from exc
        return tensor.detach().float().numpy() if tensor.is_floating_point() else tensor.numpy()
    if value.get("format") == "tensor_list":
        return None  # per-sample variable shapes (images): not a per-token field
    try:
        dtype = np.dtype(value["dtype"])
        if dtype.kind not in _NUMERIC_KINDS:
            raise ValueError(f"dtype {dtype} is not numeric")
        return np.frombuffer(value["data"], dtype=dtype).reshape(value["shape"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{path}: field '{key}' is not a readable serialized tensor ({exc}).") from exc


def _read(path: str, trust_pickle: bool) -> list[Row]:
    loaded = safe_pickle.load(path, path, FORMAT_GLOBALS, trust=trust_pickle)
    state = getattr(loaded, "state", None)
    if not isinstance(loaded, TensorBatchData) or not isinstance(state, dict) or "batch_dict" not in state:
        raise InputError(f"{path}: not a SkyRL TrainingInputBatch pickle (found {type(loaded).__name__}).")
    fields = {key: _tensor(path, key, value) for key, value in state["batch_dict"].items()}
    required: dict[str, np.ndarray] = {}
    for key in ("rollout_logprobs", "action_log_probs", "response_mask"):
        value = fields.get(key)
        if value is None:
            hint = " (SkyRL records it when the generator returns logprobs)" if key == "rollout_logprobs" else ""
            raise InputError(f"{path}: field '{key}' is missing or None{hint}.")
        required[key] = value
    rollout, trainer = required["rollout_logprobs"], required["action_log_probs"]
    response_mask = required["response_mask"]
    loss_mask = fields.get("loss_mask")
    if loss_mask is None:
        loss_mask = response_mask
    for key, array in (("action_log_probs", trainer), ("loss_mask", loss_mask), ("response_mask", response_mask)):
        if array.shape != rollout.shape or rollout.ndim != 2:
            raise InputError(
                f"{path}: field '{key}' has shape {tuple(array.shape)}, rollout_logprobs {tuple(rollout.shape)}; "
                "expected one [batch, response_len] shape."
            )
    metadata = state.get("metadata") or {}
    pad_size = metadata.get("pad_size", 0) if isinstance(metadata, dict) else 0
    real_rows = rollout.shape[0] - (pad_size if isinstance(pad_size, int) and pad_size > 0 else 0)
    sequences = fields.get("sequences")
    step = step_of(Path(path)) or 0
    rows = []
    for index in range(real_rows):
        length = int(np.count_nonzero(response_mask[index]))
        start = rollout.shape[1] - length  # right-aligned: the response is the last `length` columns
        token_ids = None
        if sequences is not None and sequences.ndim == 2 and sequences.shape[0] == rollout.shape[0]:
            token_ids = sequences[index, sequences.shape[1] - length :].astype(np.int64)
        rows.append(
            Row(
                step=step,
                sample_id=str(index),
                rollout=rollout[index, start:].astype(np.float64),
                trainer=trainer[index, start:].astype(np.float64),
                mask=_mask(loss_mask[index, start:]),
                token_ids=token_ids,
            )
        )
    return rows


def _mask(values: np.ndarray) -> np.ndarray:
    """0/1 as int8; any other value becomes 2 so that the reader reports the row."""
    return np.where(values == 0, 0, np.where(values == 1, 1, 2)).astype(np.int8)


register_pickle(NAME, "a SkyRL *.pkl", step_of, open_file, order=40, markers=MARKERS)
