"""Array operations that take numpy arrays or torch tensors alike, so the families' arithmetic runs on either.

A chunk of the numba engine (on the CPU) holds numpy arrays and its statistics are numpy: that path never loads
torch. A chunk of the torch engine (any device, CUDA included) holds torch tensors on that device. The families do
their rows-, groups- and segments-sized arithmetic through these helpers, which take numpy first and reach torch
only with a tensor in hand, when torch is loaded already: the import inside each torch branch costs a dict lookup.
Each numpy operation is the one its torch twin performs, in the same order where the order sets the digits
(``index_add``: one sequential sum per bucket, like ``index_add_`` on the CPU); elementwise functions agree within
1 ulp (libm against Sleef), which is the engines' contract (1e-12 relative).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

# A numpy array or a torch tensor (every helper returns the kind it was given).
Array = Any

_DTYPES = ("float64", "int64", "bool", "uint8")


def is_tensor(values: Any) -> bool:
    """Whether ``values`` is a torch tensor (never imports torch: a tensor exists only once torch is loaded)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(values, torch.Tensor)


def device_name(device: str | torch.device) -> str:
    """A device as its name (``cpu``, ``cuda:0``), without loading torch for a name already given as one."""
    return device if isinstance(device, str) else str(device)


def device_kind(device: str | torch.device) -> str:
    """A device's type: ``cpu``, ``cuda``, …"""
    return device_name(device).split(":")[0]


def _torch() -> Any:
    import torch

    return torch


def _torch_dtype(dtype: str) -> torch.dtype:
    return getattr(_torch(), dtype)


def host(values: Array) -> np.ndarray:
    """``values`` as a numpy array on the host (a CPU tensor's memory, zero-copy; a GPU tensor's, copied)."""
    if is_tensor(values):
        return values.detach().cpu().numpy()
    return np.asarray(values)


def like(values: np.ndarray, reference: Array) -> Array:
    """A host array as the kind of ``reference``: itself beside numpy, a tensor on the reference's device beside a
    tensor (zero-copy on the CPU)."""
    if is_tensor(reference):
        return _torch().from_numpy(np.ascontiguousarray(values)).to(reference.device)
    return values


def astype(values: Array, dtype: str) -> Array:
    """``values`` as ``dtype`` (one of float64, int64, bool, uint8); itself when it already is."""
    if is_tensor(values):
        return values.to(_torch_dtype(dtype))
    return values.astype(dtype, copy=False)


def float64(values: Array) -> Array:
    return astype(values, "float64")


def is_bool(values: Array) -> bool:
    if is_tensor(values):
        return values.dtype == _torch().bool
    return values.dtype == np.bool_


def size(values: Array) -> int:
    """Number of elements."""
    return int(values.numel()) if is_tensor(values) else int(values.size)


def full(shape: int | tuple[int, ...], fill: float | bool, like: Array, dtype: str = "float64") -> Array:
    """A new array of ``shape`` filled with ``fill``, of the kind (and device) of ``like``."""
    if is_tensor(like):
        return _torch().full(
            (shape,) if isinstance(shape, int) else shape, fill, dtype=_torch_dtype(dtype), device=like.device
        )
    return np.full(shape, fill, dtype=dtype)


def zeros(shape: int | tuple[int, ...], like: Array, dtype: str = "float64") -> Array:
    return full(shape, False if dtype == "bool" else 0, like, dtype)


def ones(shape: int | tuple[int, ...], like: Array, dtype: str = "float64") -> Array:
    return full(shape, True if dtype == "bool" else 1, like, dtype)


def arange(count: int, like: Array) -> Array:
    """0 … count − 1 as int64."""
    if is_tensor(like):
        return _torch().arange(count, device=like.device)
    return np.arange(count, dtype=np.int64)


def index_add(out: Array, index: Array, values: Array) -> Array:
    """``out[index[k]] += values[k]`` for each k in order (in place; returns ``out``): each bucket's sum is taken
    sequentially, as torch's ``index_add_`` does on the CPU."""
    if is_tensor(out):
        return out.index_add_(0, index, values.to(out.dtype))
    if out.ndim == 1 and out.dtype == np.float64 and not out.any() and not np.signbit(out).any():
        # Into +0.0 (every caller's case): bincount adds each bucket's values in the same order from +0.0, so the
        # same bits, ~17× faster than ufunc.at on the segment sums (3.5 against 58 ns an element on 10m's calls).
        sums = np.bincount(index, weights=values, minlength=len(out))
        if len(sums) > len(out):
            raise IndexError(f"index {int(index.max())} is out of bounds for {len(out)} buckets")
        out[:] = sums
        return out
    with np.errstate(over="ignore", invalid="ignore"):  # inf / NaN as torch gives them, without a warning
        np.add.at(out, index, values)
    return out


def scatter_max(out: Array, index: Array, values: Array) -> Array:
    """``out[index[k]] = max(out[index[k]], values[k])`` (in place; returns ``out``; NaN wins, as in torch)."""
    if is_tensor(out):
        return out.scatter_reduce_(0, index, values.to(out.dtype), reduce="amax")
    return _scatter_extreme(np.maximum, out, index, values)


def scatter_min(out: Array, index: Array, values: Array) -> Array:
    """``out[index[k]] = min(out[index[k]], values[k])`` (in place; returns ``out``; NaN wins, as in torch)."""
    if is_tensor(out):
        return out.scatter_reduce_(0, index, values.to(out.dtype), reduce="amin")
    return _scatter_extreme(np.minimum, out, index, values)


def _scatter_extreme(extreme: np.ufunc, out: np.ndarray, index: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``extreme.at(out, index, values)`` for np.maximum or np.minimum, as each run of one index's extreme by
    ``reduceat`` (``index_runs``: in place where ``index`` never goes down, as segments into their rows and rows into
    their step groups; else after a stable sort) and one update per bucket: the same values (a max or a min rounds
    nothing; which of +0.0 and -0.0 a tie keeps is no order's promise, torch's neither). ``ufunc.at`` took 33–45 ns an
    element (numpy 2.4), against ~3 here: 10m's `analyze` spent 8.4 ms in it, 0.7 ms this way (docs/benchmarks.md,
    issue 20 session 14); a round family's (step group, round) index, which goes down at each row, 0.27 ms a chunk."""
    order, starts, targets = index_runs(index, out.shape[0])
    if starts.shape[0]:
        with np.errstate(invalid="ignore"):  # NaN wins without a warning, as in torch
            out[targets] = extreme(out[targets], extreme.reduceat(values if order is None else values[order], starts))
    return out


def index_runs(index: np.ndarray, length: int) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """``index`` (integers in [0, length)) as runs of one value: (the stable order that sorts it, None where it never
    goes down; where each run starts in that order; each run's value). A reduction of ``values[order]`` by
    ``reduceat`` at the starts then reduces each index's values in their own order."""
    order, ordered = None, index
    if index.shape[0] > 1 and not bool((index[1:] >= index[:-1]).all()):
        # 16-bit keys sort by radix (linear): 23 against 37 µs for a chunk's 6 000 segments
        order = np.argsort(index.astype(np.uint16) if length <= 1 << 16 else index, kind="stable")
        ordered = index[order]
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))[: index.shape[0]]
    return order, starts, ordered[starts]


def bincount(index: Array, weights: Array | None, length: int) -> Array:
    """Counts (or Σ weights) of each index in [0, length) as float64 [length]."""
    if is_tensor(index):
        return _torch().bincount(index, weights=weights, minlength=length).to(_torch().float64)
    return np.bincount(index, weights=weights, minlength=length).astype(np.float64, copy=False)


def exp(values: Array) -> Array:
    if is_tensor(values):
        return _torch().exp(values)
    with np.errstate(over="ignore", invalid="ignore"):  # inf / NaN as torch gives them, without a warning
        return np.exp(values)


def host_exp(values: Array) -> Array:
    """exp taken by numpy wherever the values are on the host (a numpy array's; a CPU tensor's on its memory, as a
    tensor), torch's on a GPU. The preset families' weights take it: on the CPU both engines then give the same bits
    and a weight on a truncation or IcePop bound falls on the same side in both, on any CPU (torch's CPU exp and
    numpy's differ in the last bit on ~5 % of values where numpy has no AVX-512 loop)."""
    return _numpy_on_host(np.exp, "exp", values)


def host_log10(values: Array) -> Array:
    """log10 taken by numpy wherever the values are on the host (a CPU tensor's on its memory), torch's on a GPU: the
    sweep's histogram bins (``metrics.sweep.signed_bins``) are then the same in both CPU engines and in the compiled
    pass, whose bin edges are found with this function."""
    return _numpy_on_host(np.log10, "log10", values)


def _numpy_on_host(function: np.ufunc, torch_name: str, values: Array) -> Array:
    if is_tensor(values) and values.device.type != "cpu":
        return getattr(_torch(), torch_name)(values)
    with np.errstate(all="ignore"):  # inf / NaN (and log10's -inf) as torch gives them, without a warning
        return like(function(host(values)), values)


def maximum(first: Array, second: Array) -> Array:
    """Elementwise max (NaN if either is NaN, in both libraries)."""
    if is_tensor(first):
        return _torch().maximum(first, second)
    return np.maximum(first, second)


def expm1(values: Array) -> Array:
    if is_tensor(values):
        return _torch().expm1(values)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.expm1(values)


def logaddexp(first: Array, second: Array) -> Array:
    if is_tensor(first):
        return _torch().logaddexp(first, second)
    return np.logaddexp(first, second)


def clamp(values: Array, lower: float | None = None, upper: float | None = None) -> Array:
    """``values`` limited to [lower, upper] (either bound may be None; NaN stays NaN)."""
    if is_tensor(values):
        return values.clamp(min=lower, max=upper)
    if lower is not None:
        values = np.maximum(values, lower)
    if upper is not None:
        values = np.minimum(values, upper)
    return values


def where(condition: Array, chosen: Array | float, other: Array | float) -> Array:
    """``chosen`` where ``condition`` holds, else ``other`` (either may be a Python scalar)."""
    if is_tensor(condition):
        return _torch().where(condition, chosen, other)
    return np.where(condition, chosen, other)


def bits_differ(first: Array, second: Array, float32: bool) -> Array:
    """Where two float64 arrays' values differ in any bit (bool), or, with ``float32``, their float32 roundings'."""
    if is_tensor(first):
        torch = _torch()
        kind, width = (torch.float32, torch.int32) if float32 else (torch.float64, torch.int64)
        return first.to(kind).view(width) != second.to(kind).view(width)
    kind, width = (np.float32, np.int32) if float32 else (np.float64, np.int64)
    return first.astype(kind, copy=False).view(width) != second.astype(kind, copy=False).view(width)


def minimum(first: Array, second: Array) -> Array:
    if is_tensor(first):
        return _torch().minimum(first, second)
    return np.minimum(first, second)


def isfinite(values: Array) -> Array:
    return _torch().isfinite(values) if is_tensor(values) else np.isfinite(values)


def isnan(values: Array) -> Array:
    return _torch().isnan(values) if is_tensor(values) else np.isnan(values)


def logical_not(values: Array) -> Array:
    return _torch().logical_not(values) if is_tensor(values) else np.logical_not(values)


def stack(arrays: Sequence[Array], axis: int = 0) -> Array:
    if is_tensor(arrays[0]):
        return _torch().stack(list(arrays), dim=axis)
    return np.stack(arrays, axis=axis)


def concat(arrays: Sequence[Array]) -> Array:
    if is_tensor(arrays[0]):
        return _torch().cat(list(arrays))
    return np.concatenate(arrays)


def cumsum(values: Array) -> Array:
    if is_tensor(values):
        return _torch().cumsum(values, 0)
    return np.cumsum(values)


def flatnonzero(values: Array) -> Array:
    """Indices (int64) where ``values`` is true / non-zero."""
    if is_tensor(values):
        return _torch().nonzero(values, as_tuple=True)[0]
    return np.flatnonzero(values)


def repeat(values: Array, counts: Array, total: int) -> Array:
    """Each value repeated counts[k] times (``total`` = Σ counts, which torch's GPU kernel needs up front)."""
    if is_tensor(values):
        return _torch().repeat_interleave(values, counts, output_size=total)
    return np.repeat(values, counts)


def searchsorted(sorted_values: Array, values: Array, right: bool = False) -> Array:
    if is_tensor(sorted_values):
        return _torch().searchsorted(sorted_values, values, right=right)
    return np.searchsorted(sorted_values, values, side="right" if right else "left")


def frexp_exponent(values: Array) -> Array:
    """The binary exponent e of each value (value = m·2^e, 0.5 ≤ |m| < 1; 0 for 0) as int64."""
    if is_tensor(values):
        return _torch().frexp(values.to(_torch().float64)).exponent.to(_torch().int64)
    return np.frexp(values.astype(np.float64, copy=False))[1].astype(np.int64)


def dot(first: Array, second: Array) -> float:
    """Σ first·second of two float64 vectors, as a Python float."""
    if is_tensor(first):
        return float(_torch().dot(first, second))
    return float(np.dot(first, second))


# ----------------------------------------------------------------------- segment reductions (numpy or torch)
def segment_sum(values: Array, index: Array, count: int) -> Array:
    """Sum ``values`` [n, ...] into ``count`` buckets by ``index`` [n] (float64)."""
    return index_add(zeros((count, *values.shape[1:]), values), index, float64(values))


def segment_max(values: Array, index: Array, count: int) -> Array:
    """Max per bucket; empty buckets get -inf (the identity of max)."""
    return scatter_max(full(count, -math.inf, values), index, float64(values))


def segment_min(values: Array, index: Array, count: int) -> Array:
    """Min per bucket; empty buckets get +inf (the identity of min)."""
    return scatter_min(full(count, math.inf, values), index, float64(values))


def segment_moments(x: Array, y: Array, index: Array, count: int) -> Array:
    """Per bucket [n, mean_x, mean_y, M2_x, M2_y, C_xy], two passes (means, then centred sums).

    Exact enough for values far from zero (probabilities near 1, IS weights near 1), where raw sums of
    squares would cancel.
    """
    n = segment_sum(ones(x.shape[0], x), index, count)
    safe_n = clamp(n, lower=1.0)
    mean_x = segment_sum(x, index, count) / safe_n
    mean_y = segment_sum(y, index, count) / safe_n
    dx = x - mean_x[index]
    dy = y - mean_y[index]
    m2_x = segment_sum(dx * dx, index, count)
    m2_y = segment_sum(dy * dy, index, count)
    c_xy = segment_sum(dx * dy, index, count)
    return stack([n, mean_x, mean_y, m2_x, m2_y, c_xy], axis=-1)
