"""Mergeable per-step accumulators over float64 sufficient statistics.

An accumulator keeps one *state* per training step: a dict of float64 numpy arrays, each merged by
the reduction its family declares (``sum``, ``max``, ``min``, or ``moments``: Chan's pairwise update of
count / means / centred second moments). ``update(chunk)`` computes the partial state of every step
group in the chunk with vectorised torch ops and merges it in; ``merge(other)`` folds in another
accumulator (another chunk range, another Ray worker). A run is every row as one batch, so the run
state is the merge of all step states. Metric values are derived only in ``finalize``.
"""

from __future__ import annotations

import importlib
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import ClassVar

import numpy as np
import torch

from rollout_diag.catalogue import CLAMP, EPS
from rollout_diag.io.chunk import Chunk

State = dict[str, np.ndarray]


# ----------------------------------------------------------------------- segment reductions (torch)
def segment_sum(values: torch.Tensor, index: torch.Tensor, count: int) -> torch.Tensor:
    """Sum ``values`` [n, ...] into ``count`` buckets by ``index`` [n] (float64)."""
    out = torch.zeros((count, *values.shape[1:]), dtype=torch.float64, device=values.device)
    return out.index_add_(0, index, values.to(torch.float64))


def segment_max(values: torch.Tensor, index: torch.Tensor, count: int) -> torch.Tensor:
    """Max per bucket; empty buckets get -inf (the identity of max)."""
    out = torch.full((count,), -torch.inf, dtype=torch.float64, device=values.device)
    return out.scatter_reduce_(0, index, values.to(torch.float64), reduce="amax", include_self=True)


def segment_min(values: torch.Tensor, index: torch.Tensor, count: int) -> torch.Tensor:
    """Min per bucket; empty buckets get +inf (the identity of min)."""
    out = torch.full((count,), torch.inf, dtype=torch.float64, device=values.device)
    return out.scatter_reduce_(0, index, values.to(torch.float64), reduce="amin", include_self=True)


def segment_moments(x: torch.Tensor, y: torch.Tensor, index: torch.Tensor, count: int) -> torch.Tensor:
    """Per bucket [n, mean_x, mean_y, M2_x, M2_y, C_xy], two passes (means, then centred sums).

    Exact enough for values far from zero (probabilities near 1, IS weights near 1), where raw sums of
    squares would cancel.
    """
    n = segment_sum(torch.ones_like(x, dtype=torch.float64), index, count)
    safe_n = n.clamp(min=1.0)
    mean_x = segment_sum(x, index, count) / safe_n
    mean_y = segment_sum(y, index, count) / safe_n
    dx = x - mean_x[index]
    dy = y - mean_y[index]
    m2_x = segment_sum(dx * dx, index, count)
    m2_y = segment_sum(dy * dy, index, count)
    c_xy = segment_sum(dx * dy, index, count)
    return torch.stack([n, mean_x, mean_y, m2_x, m2_y, c_xy], dim=-1)


# ----------------------------------------------------------------------- merging (numpy, host)
def merge_moments(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Chan et al.'s pairwise merge of [n, mean_x, mean_y, M2_x, M2_y, C_xy] (works elementwise on [..., 6])."""
    n_a, n_b = a[..., 0], b[..., 0]
    n = n_a + n_b
    with np.errstate(invalid="ignore", divide="ignore"):
        weight_b = np.where(n > 0, n_b / np.where(n > 0, n, 1.0), 0.0)
        cross = np.where(n > 0, n_a * n_b / np.where(n > 0, n, 1.0), 0.0)
    d_x = b[..., 1] - a[..., 1]
    d_y = b[..., 2] - a[..., 2]
    out = np.empty_like(a)
    out[..., 0] = n
    out[..., 1] = a[..., 1] + d_x * weight_b
    out[..., 2] = a[..., 2] + d_y * weight_b
    out[..., 3] = a[..., 3] + b[..., 3] + d_x * d_x * cross
    out[..., 4] = a[..., 4] + b[..., 4] + d_y * d_y * cross
    out[..., 5] = a[..., 5] + b[..., 5] + d_x * d_y * cross
    return out


_MERGE = {
    "sum": np.add,
    "max": np.maximum,
    "min": np.minimum,
    "moments": merge_moments,
    "concat": lambda a, b: np.concatenate([a, b]),  # per-row values (grows with rows, never with tokens)
}


def merge_states(a: State, b: State, reductions: Mapping[str, str]) -> State:
    return {name: _MERGE[reductions[name]](a[name], b[name]) for name in reductions}


class StepAccumulator(ABC):
    """Base of every metric family. Subclasses declare ``REDUCTIONS`` and write ``_stats``/``_finalize``."""

    REDUCTIONS: ClassVar[dict[str, str]] = {}

    def __init__(self) -> None:
        self.steps: dict[int, State] = {}

    # -- to write in a family --------------------------------------------------------------------
    @abstractmethod
    def _stats(self, chunk: Chunk) -> dict[str, torch.Tensor | list[np.ndarray]]:
        """Partial state of each step group of ``chunk``: name -> tensor [G, ...] (or a list of G arrays)."""

    @abstractmethod
    def _finalize(self, state: State) -> dict[str, float]:
        """Metric values from one merged state (a step's, or the run's)."""

    # -- shared machinery ------------------------------------------------------------------------
    def update(self, chunk: Chunk) -> None:
        partial = {
            name: value.cpu().numpy() if isinstance(value, torch.Tensor) else value
            for name, value in self._stats(chunk).items()
        }
        for group, step in enumerate(chunk.groups.steps):
            state = {name: np.array(value[group], dtype=np.float64) for name, value in partial.items()}
            current = self.steps.get(step)
            self.steps[step] = state if current is None else merge_states(current, state, self.REDUCTIONS)

    def merge(self, other: StepAccumulator) -> None:
        for step, state in other.steps.items():
            current = self.steps.get(step)
            self.steps[step] = state if current is None else merge_states(current, state, self.REDUCTIONS)

    def run_state(self) -> State | None:
        merged: State | None = None
        for step in sorted(self.steps):
            state = self.steps[step]
            merged = state if merged is None else merge_states(merged, state, self.REDUCTIONS)
        return merged

    def finalize_steps(self) -> dict[int, dict[str, float]]:
        return {step: self._finalize(self.steps[step]) for step in sorted(self.steps)}

    def finalize_run(self) -> dict[str, float]:
        state = self.run_state()
        return {} if state is None else self._finalize(state)


def row_mean(row_sum: torch.Tensor, row_count: torch.Tensor) -> torch.Tensor:
    """R_i[x] = Σ_t m·x / (n_i + 1e-8): verl's masked mean (empty rows give 0)."""
    return row_sum / (row_count.to(torch.float64) + EPS)


def sequence_share(rows_dropped: float, valid_rows: float) -> float:
    """The one definition of "share of sequences" a rule drops (preset table, sweep): over rows with at least one
    model token, since an empty row has nothing to keep or drop; 0.0 when no row has one."""
    return rows_dropped / valid_rows if valid_rows > 0 else 0.0


def _numpy_has_svml() -> bool:
    """Whether numpy runs its SVML float64 loops (exp, expm1) on this CPU: they need AVX-512 (Skylake-X class).

    Measured (docs/benchmarks.md): with AVX-512, numpy's float64 exp and expm1 are 2.4× torch's; on an AVX2-only
    CPU numpy falls back to libm, its exp is 2.7× slower than torch's (Sleef) and its expm1 about equal."""
    for module in ("numpy._core._multiarray_umath", "numpy.core._multiarray_umath"):  # numpy 2.x, 1.x
        try:
            features = importlib.import_module(module).__cpu_features__
        except (ImportError, AttributeError):
            continue
        return bool(features.get("AVX512_SKX", False))
    return False


def _host_or_torch(numpy_function, torch_function, numpy_on_cpu: bool = True):
    """An elementwise function: numpy's loop on CPU tensors when ``numpy_on_cpu``, torch's kernel otherwise.
    The two agree within 1 ulp (tests/test_metrics.py); which one runs depends only on the CPU, never on timing,
    so a machine gives the same digits run after run."""

    def apply(values: torch.Tensor) -> torch.Tensor:
        if numpy_on_cpu and values.device.type == "cpu":
            return torch.from_numpy(numpy_function(values.contiguous().numpy()))
        return torch_function(values)

    return apply


NUMPY_SVML = _numpy_has_svml()
token_exp = _host_or_torch(np.exp, torch.exp, numpy_on_cpu=NUMPY_SVML)  # per-token exp of a whole chunk
token_expm1 = _host_or_torch(np.expm1, torch.expm1)  # numpy's: faster with SVML, about equal without


def clamp20(values: torch.Tensor) -> torch.Tensor:
    return values.clamp(-CLAMP, CLAMP)


def as_float(value: np.ndarray | float) -> float:
    return float(np.asarray(value).reshape(()))


# ----------------------------------------------------------------------- finalize helpers (every family)
def population_std(moments: np.ndarray) -> float:
    """§2/§3 ``_std``: the population std of c over model tokens when N > 1, else 0, from [N, mean, ·, M2, ·, ·].

    sqrt(M2 / N) from centred moments, so constant c gives exactly 0. verl writes T[c²] − T[c]², whose 1e-8
    guards add N·mean²·ε / (N+ε)² to the variance: sqrt(ε/N)·|mean| (5.5e-6 for 330 tokens of weight 1) where
    the spread is 0. We leave that artefact out: the variances differ by exactly that term, never more.
    """
    count, m2 = float(moments[0]), float(moments[3])
    if count <= 1:
        return 0.0
    return math.sqrt(max(m2, 0.0) / count)


def effective_sample_size(moments: np.ndarray) -> float:
    """§2 ESS = 1 / T[(c / (T[c] + ε))²] = (T[c] + ε)² · (N + ε) / Σc², from [N, mean, ·, M2, ·, ·].

    All-zero weights (IcePop rejecting every token) give 1/0: inf (verl raises there).
    """
    count, mean, m2 = float(moments[0]), float(moments[1]), float(moments[3])
    sum_squares = m2 + count * mean * mean
    if sum_squares <= 0:
        return math.inf
    token_mean = count * mean / (count + EPS)
    return (token_mean + EPS) ** 2 * (count + EPS) / sum_squares


def sample_std(moments: np.ndarray) -> float:
    """Notation: unbiased (n−1) std over rows; 0 with fewer than 2 values."""
    count, m2 = float(moments[0]), float(moments[3])
    return math.sqrt(max(m2, 0.0) / (count - 1)) if count >= 2 else 0.0


def safe_exp(value: float) -> float:
    """exp that gives inf instead of raising on overflow (a row's summed log ratio can be huge)."""
    with np.errstate(over="ignore"):
        return float(np.exp(value))
