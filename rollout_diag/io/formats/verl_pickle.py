"""verl ``DataProto`` pickles (``DataProto.save_to_disk``, i.e. ``pickle.dump`` of the batch).

Read from volcengine/verl at commit b178a3cd56f58b2d502255daba591e92833930a7 (``verl/protocol.py``):
``DataProto.__getstate__`` returns ``(batch_bytes, non_tensor_batch, meta_info)``, where ``batch_bytes`` is
``torch.save`` of the consolidated ``TensorDict`` (``batch.contiguous().consolidate()``) and
``non_tensor_batch`` a dict of numpy arrays. The trainer fills ``meta_info["global_steps"]``
(``verl/trainer/ppo/ray_trainer.py``). Batch keys used: ``rollout_log_probs`` (inference engine),
``old_log_probs`` (trainer), ``response_mask``, and ``attention_mask`` / ``responses`` for each row's
response length (verl right-pads responses: a row's response is the first
``attention_mask[:, -response_len:].sum()`` columns).

From pytorch/tensordict at commit a1a061e3dd4b4c892925525a726a72c9eef9a0cc (``tensordict/_reductions.py``):
a consolidated TensorDict pickles as ``_rebuild_tensordict_files_consolidated(metadata, storage)``: one
flat uint8 ``storage`` and, per key, ``metadata["leaves"][key] = (dtype name, shape, start, stop, pad)``
byte offsets into it. That call is answered here by slicing the storage into plain tensors; the outer
pickle goes through :mod:`safe_pickle` and the inner ``torch.save`` through ``torch.load(weights_only=True)``.
The ``VERL_DATAPROTO_SERIALIZATION_METHOD=numpy`` variant and non-consolidated TensorDicts are refused.
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

NAME = "verl"
FILE_GLOB = "*.pkl"
MARKERS = ("verl.protocol.DataProto",)


class DataProtoData:
    """Stand-in for verl's DataProto: keeps the pickled state (batch bytes, non-tensor batch, meta info)."""

    state: tuple | None = None

    def __setstate__(self, state: Any) -> None:
        self.state = state


FORMAT_GLOBALS: dict[tuple[str, str], Any] = {("verl.protocol", "DataProto"): DataProtoData}


def _rebuild_consolidated(metadata: dict[str, Any], storage: Any) -> dict[str, Any]:
    """The leaves of a consolidated TensorDict as {key: tensor}, sliced out of its flat byte storage."""
    import torch

    dtypes = {str(dtype): dtype for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64)}
    dtypes.update({str(dtype): dtype for dtype in (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)})
    dtypes[str(torch.bool)] = torch.bool
    leaves = {}
    for key, leaf in dict(metadata.get("leaves", {})).items():
        dtype_name, shape, start, stop, pad = leaf[:5]
        if dtype_name not in dtypes:
            raise ValueError(f"leaf '{key}' has dtype {dtype_name}, not a plain numeric dtype")
        value = storage[start:stop].view(dtypes[dtype_name])
        count = int(np.prod(shape)) if len(shape) else 1
        leaves[key] = (value[:count] if pad else value).view(*shape)
    return {"leaves": leaves, "nested": [key for key in metadata if key not in _KNOWN_METADATA]}


_KNOWN_METADATA = {"cls", "non_tensors", "leaves", "cls_metadata", "size"}
# torch.load finds allowlisted callables by module and name: give the stand-in tensordict's.
_rebuild_consolidated.__module__ = "tensordict._reductions"
_rebuild_consolidated.__name__ = _rebuild_consolidated.__qualname__ = "_rebuild_tensordict_files_consolidated"


def step_of(path: Path) -> int | None:
    return number_in(path.stem, r"(\d+)(?!.*\d)")


def open_file(path: str, trust_pickle: bool = False) -> RowsFile:
    rows = _read(path, trust_pickle)
    return RowsFile(path, len(rows), lambda: rows)


def _batch(path: str, batch_bytes: Any) -> dict[str, np.ndarray]:
    import pickle

    import torch

    if not isinstance(batch_bytes, bytes):
        raise InputError(
            f"{path}: the DataProto batch is a {type(batch_bytes).__name__}, not torch.save bytes "
            "(VERL_DATAPROTO_SERIALIZATION_METHOD=numpy pickles are not supported)."
        )
    try:
        with torch.serialization.safe_globals([_rebuild_consolidated]):
            loaded = torch.load(io.BytesIO(batch_bytes), weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        refused = str(exc).split("Unsupported global: GLOBAL ")[-1].split(" ")[0] if "GLOBAL" in str(exc) else "?"
        raise InputError(
            f"{path}: refused to load the DataProto batch: it needs {refused}, not a plain tensor "
            "(only consolidated TensorDicts are read).",
        ) from exc
    except (RuntimeError, ValueError, TypeError, KeyError) as exc:
        raise InputError(f"{path}: the DataProto batch is not readable ({exc}).") from exc
    if not isinstance(loaded, dict) or "leaves" not in loaded:
        raise InputError(f"{path}: the DataProto batch is a {type(loaded).__name__}, not a consolidated TensorDict.")
    return {key: _numpy(tensor) for key, tensor in loaded["leaves"].items()}


def _numpy(tensor: Any) -> np.ndarray:
    return tensor.float().numpy() if tensor.is_floating_point() else tensor.numpy()


def _read(path: str, trust_pickle: bool) -> list[Row]:
    loaded = safe_pickle.load(path, path, FORMAT_GLOBALS, trust=trust_pickle)
    state = getattr(loaded, "state", None)
    if not isinstance(loaded, DataProtoData) or not isinstance(state, tuple) or len(state) != 3:
        raise InputError(f"{path}: not a verl DataProto pickle (found {type(loaded).__name__}).")
    batch_bytes, non_tensor_batch, meta_info = state
    fields = _batch(path, batch_bytes)
    rollout, trainer, mask = _log_probs(path, fields)
    rows_count, width = rollout.shape
    lengths = _response_lengths(fields.get("attention_mask"), rows_count, width)
    responses = fields.get("responses")
    step = meta_info.get("global_steps") if isinstance(meta_info, dict) else None
    if not isinstance(step, (int, np.integer)):
        step = step_of(Path(path)) or 0
    uids = non_tensor_batch.get("uid") if isinstance(non_tensor_batch, dict) else None
    rows = []
    for index in range(rows_count):
        length = int(lengths[index])
        token_ids = None
        if responses is not None and responses.shape == rollout.shape:
            token_ids = responses[index, :length].astype(np.int64)
        sample_id = str(index) if uids is None or len(uids) != rows_count else f"{uids[index]}#{index}"
        rows.append(
            Row(
                step=int(step),
                sample_id=sample_id,
                rollout=rollout[index, :length].astype(np.float64),
                trainer=trainer[index, :length].astype(np.float64),
                mask=np.where(mask[index, :length] == 0, 0, np.where(mask[index, :length] == 1, 1, 2)).astype(np.int8),
                token_ids=token_ids,
            )
        )
    return rows


def _log_probs(path: str, fields: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The batch's rollout and trainer logprobs and response mask (all ones without one), of one [batch,
    response_len] shape; raises InputError."""
    for key in ("rollout_log_probs", "old_log_probs"):
        if key not in fields:
            raise InputError(f"{path}: the DataProto batch has no '{key}' (keys: {', '.join(sorted(fields))}).")
    rollout, trainer = fields["rollout_log_probs"], fields["old_log_probs"]
    mask = fields.get("response_mask")
    if mask is None:
        mask = np.ones(rollout.shape, dtype=np.int8)
    for key, array in (("old_log_probs", trainer), ("response_mask", mask)):
        if array.shape != rollout.shape or rollout.ndim != 2:
            raise InputError(
                f"{path}: '{key}' has shape {tuple(array.shape)}, rollout_log_probs {tuple(rollout.shape)}; "
                "expected one [batch, response_len] shape."
            )
    return rollout, trainer, mask


def _response_lengths(attention: np.ndarray | None, rows_count: int, width: int) -> np.ndarray:
    """Each row's response length: the attention mask's ones over the response positions, else the full width."""
    if attention is not None and attention.ndim == 2 and attention.shape[0] == rows_count:
        return np.count_nonzero(attention[:, attention.shape[1] - width :], axis=1)
    return np.full(rows_count, width)


register_pickle(NAME, "a verl *.pkl", step_of, open_file, order=50, markers=MARKERS)
