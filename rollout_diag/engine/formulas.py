"""The token quantities' formulas, as the torch engine computes them (float64, numpy arrays or torch tensors alike):
``TOKEN_QUANTITIES`` maps each name of ``engine/quantities.py`` (and any a family adds with ``quantity``) to its
formula; ``Derived`` quantities (truncated and IcePop weights, clamped statistics, bound flags) are registered on first
use by ``derived``. The numba engine computes the same values in compiled passes (``kernels/``)."""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from rollout_diag.catalogue import CLAMP, EPS
from rollout_diag.engine import arrays
from rollout_diag.engine.arrays import Array
from rollout_diag.engine.quantities import BANDS, BKL_EPS, CLIP, COUNTS, EXTREME_BOUNDS, KPOP_EPS


class TokenSource(Protocol):
    """What a formula reads (an engine's ``ChunkStats``): the chunk, and other quantities by name."""

    chunk: Any

    def token(self, name: str) -> Array: ...


# ----------------------------------------------------------------------- elementwise functions of a chunk's tokens
def row_mean(row_sum: Array, row_count: Array) -> Array:
    """R_i[x] = Σ_t m·x / (n_i + 1e-8): verl's masked mean (empty rows give 0)."""
    return row_sum / (arrays.float64(row_count) + EPS)


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


def _host_or_torch(numpy_function, torch_name: str, numpy_on_cpu: bool = True) -> Callable[[Array], Array]:
    """An elementwise function: numpy's loop on numpy arrays (the numba engine), and on CPU tensors when
    ``numpy_on_cpu``; torch's kernel ``torch_name`` on other tensors. The two agree within 1 ulp
    (tests/metrics/test_metrics.py); which one runs depends only on the CPU and the engine, never on timing, so a
    machine gives the same digits run after run."""

    def apply(values: Array) -> Array:
        if not arrays.is_tensor(values):
            with np.errstate(over="ignore", invalid="ignore"):  # inf / NaN as torch gives them, without a warning
                return numpy_function(values)
        if numpy_on_cpu and values.device.type == "cpu":
            import torch

            with np.errstate(over="ignore", invalid="ignore"):
                return torch.from_numpy(numpy_function(values.contiguous().numpy()))
        return getattr(values, torch_name)()

    return apply


NUMPY_SVML = _numpy_has_svml()
token_exp = _host_or_torch(np.exp, "exp", numpy_on_cpu=NUMPY_SVML)  # per-token exp of a whole chunk
token_expm1 = _host_or_torch(np.expm1, "expm1")  # numpy's: faster with SVML, about equal without


def clamp20(values: Array) -> Array:
    return arrays.clamp(values, -CLAMP, CLAMP)


# ----------------------------------------------------------------------- the formulas (the torch engine's)
# Per-token quantities over model tokens (δ = a − r), each computed at most once per chunk.
TOKEN_QUANTITIES: dict[str, Callable[[TokenSource], Array]] = {}


def quantity(name: str):
    def register(function: Callable[[TokenSource], Array]) -> Callable[[TokenSource], Array]:
        TOKEN_QUANTITIES[name] = function
        return function

    return register


@quantity("trainer")
def _trainer(s: TokenSource) -> Array:
    return s.chunk.model.trainer


@quantity("rollout")
def _rollout(s: TokenSource) -> Array:
    return s.chunk.model.rollout


@quantity("log_ratio")
def _log_ratio(s: TokenSource) -> Array:
    return s.chunk.model.log_ratio


@quantity("abs_log_ratio")
def _abs_log_ratio(s: TokenSource) -> Array:
    return abs(s.token("log_ratio"))


@quantity("k3")
def _k3(s: TokenSource) -> Array:  # exp(δ) − δ − 1 (§1 k3_kl), expm1 for accuracy near 0
    return token_expm1(s.token("log_ratio")) - s.token("log_ratio")


# COUNTS (engine/quantities.py): 1.0 at the model tokens they count, so that their sums are exact counts.
@quantity("mismatched")
def _mismatched(s: TokenSource) -> Array:  # a and r differ in any bit (as float32 where either column was float32)
    model = s.chunk.model
    return arrays.float64(arrays.bits_differ(model.trainer, model.rollout, bool(s.chunk.float32)))


def _counted(name: str, test: Callable[[Array], Array]) -> None:
    quantity(name)(lambda s: arrays.float64(test(s.token("abs_log_ratio"))))


def _above(bound: float) -> Callable[[Array], Array]:
    return lambda abs_delta: abs_delta > bound


def _within(band: float) -> Callable[[Array], Array]:
    return lambda abs_delta: abs_delta <= band


for _bound, _name in zip(EXTREME_BOUNDS, COUNTS[1:3], strict=True):  # above_ln2, above_ln5: |δ| > bound
    _counted(_name, _above(_bound))
for _band, _name in zip(BANDS, COUNTS[3:], strict=True):  # within_<ε>: |δ| ≤ ε
    _counted(_name, _within(_band))


# The hint evidence's token quantities (metrics/hints.py): y = min(|δ|, CLIP), y², δ·r and r² (the δ ≈ c·r fit).
@quantity("hint_clipped_abs")
def _clipped_abs(s: TokenSource) -> Array:
    return arrays.clamp(s.token("abs_log_ratio"), upper=CLIP)


@quantity("hint_clipped_square")
def _clipped_square(s: TokenSource) -> Array:
    y = s.token("hint_clipped_abs")
    return y * y


@quantity("hint_cross")
def _cross(s: TokenSource) -> Array:
    return s.token("log_ratio") * s.token("rollout")


@quantity("hint_rollout_square")
def _rollout_square(s: TokenSource) -> Array:
    rollout = s.token("rollout")
    return rollout * rollout


@quantity("chi2_term")
def _chi2_term(s: TokenSource) -> Array:  # exp(2·clamp20(δ)) (§1 chi2_token)
    return token_exp(s.token("clamped_log_ratio") * 2.0)


@quantity("square")
def _square(s: TokenSource) -> Array:  # δ² (§6 k2 = ½δ²)
    delta = s.token("log_ratio")
    return delta * delta


@quantity("skyrl_k3")
def _skyrl_k3(s: TokenSource) -> Array:  # exp(−x) − 1 + x, x = a − r (§6 k3)
    delta = s.token("log_ratio")
    return token_expm1(-delta) + delta


@quantity("clamped_log_ratio")
def _clamped(s: TokenSource) -> Array:  # c = clamp20(δ): what §2 weights and §3 statistics see
    return clamp20(s.token("log_ratio"))


@quantity("rs_k2")
def _rs_k2(s: TokenSource) -> Array:  # §3 k2 = ½·c²
    clamped = s.token("clamped_log_ratio")
    return 0.5 * clamped * clamped


@quantity("token_is_weight")
def _token_is_weight(s: TokenSource) -> Array:
    # §2 token-level w_raw = exp(c) (§8 token level too), numpy's exp on the CPU in both engines (torch's on a GPU): a
    # weight at a truncation or IcePop bound falls on the same side in either engine, on any CPU
    return arrays.host_exp(s.token("clamped_log_ratio"))


@quantity("rs_k3")
def _rs_k3(s: TokenSource) -> Array:
    # §3 k3 = exp(c) − 1 − c, rounded as verl writes it (not expm1): a row value that sits exactly at a
    # rejection threshold must fall on the same side as in verl, in presets and in the sweep alike
    weight, clamped = s.token("token_is_weight"), s.token("clamped_log_ratio")
    if arrays.is_tensor(weight):
        return (weight - 1.0).sub_(clamped)  # one temporary, same rounding
    out = weight - 1.0
    out -= clamped
    return out


@quantity("trainer_prob")
def _trainer_prob(s: TokenSource) -> Array:
    return token_exp(s.token("trainer"))


@quantity("rollout_prob")
def _rollout_prob(s: TokenSource) -> Array:
    return token_exp(s.token("rollout"))


@quantity("prob_diff")
def _prob_diff(s: TokenSource) -> Array:  # |p_a − p_r| (§5)
    return abs(s.token("trainer_prob") - s.token("rollout_prob"))


@quantity("rs_k1")
def _rs_k1(s: TokenSource) -> Array:  # §3 k1 = −c
    return -s.token("clamped_log_ratio")


# The probability gates (presets.GATE_STATISTICS), of p = exp(a), q = exp(r) of the sampled token, in float64. The
# exps and logs on the host are the compiled preset pass's own (``kernels.presets.gate_exp``, ``gate_log``: fdlibm's,
# within 1 ulp of libm's) in both engines, torch's on a GPU: both CPU engines give the same bits, and a value on a
# gate's bound falls on the same side in both (as the IS weights do with numpy's exp: ``arrays.host_exp``).
def _gate_function(name: str) -> Callable[[Array], Array]:
    """The gates' ``name`` ("exp" or "log"): the compiled pass's on host values (a numpy array, a CPU tensor's
    memory), torch's on a GPU."""

    def apply(values: Array) -> Array:
        if arrays.is_tensor(values) and values.device.type != "cpu":
            return getattr(values, name)()
        from rollout_diag.engine.kernels import compiled_presets

        function = getattr(compiled_presets(), f"gate_{name}")
        host = np.ascontiguousarray(arrays.host(values), dtype=np.float64)
        return arrays.like(function(host.reshape(-1)).reshape(host.shape), values)

    return apply


_gate_exp, _gate_log = _gate_function("exp"), _gate_function("log")


def gate_values(trainer: Array, rollout: Array) -> tuple[Array, Array, Array]:
    """(kpop, bkl, tv) at every token of ``trainer`` and ``rollout`` logprobs (numpy arrays or tensors alike):

    - kpop: AReaL KPop (areal-project/AReaL@cbff54d, areal/utils/functional/functional.py): the larger of
      KL(B(p)‖B(q)) and KL(B(q)‖B(p)), p and q clamped to [1e-8, 1 − 1e-8];
    - bkl: OpenRLHF #1339's binary_kl gating, KL(B(q)‖B(p)) (rollout ‖ train), clamped to [1e-6, 1 − 1e-6];
    - tv: prime-rl's ipo (PrimeIntellect-ai/prime-rl@559b447, ipo_loss_fn): |p − q|, unclamped.

    B(x) is the Bernoulli (this token, any other); KL(B(x)‖B(y)) = x·log(x/y) + (1 − x)·log((1 − x)/(1 − y)), with
    log(x/y) = ±δ (δ = a − r) where neither is clamped. Both KLs are clamped at 0 (OpenRLHF #1354: roundoff below 0
    rejected valid rows); finite for any logprob ≤ 0, p → 0 and p → 1 included (the clamps)."""
    p, q = _gate_exp(trainer), _gate_exp(rollout)
    delta = trainer - rollout
    kpop_forward, kpop_reverse = _binary_kl_pair(p, q, delta, KPOP_EPS)
    _, bkl = _binary_kl_pair(p, q, delta, BKL_EPS)
    kpop = arrays.clamp(arrays.maximum(kpop_forward, kpop_reverse), lower=0.0)
    return kpop, arrays.clamp(bkl, lower=0.0), abs(p - q)


def _binary_kl_pair(p: Array, q: Array, delta: Array, eps: float) -> tuple[Array, Array]:
    """(KL(B(p')‖B(q')), KL(B(q')‖B(p'))) with p', q' = p, q clamped to [eps, 1 − eps]."""
    p_clamped, q_clamped = arrays.clamp(p, eps, 1.0 - eps), arrays.clamp(q, eps, 1.0 - eps)
    unclamped = (p_clamped == p) & (q_clamped == q)
    log_ratio = arrays.where(unclamped, delta, _gate_log(p_clamped / q_clamped))
    log_complement = _gate_log((1.0 - p_clamped) / (1.0 - q_clamped))
    forward = p_clamped * log_ratio + (1.0 - p_clamped) * log_complement
    reverse = -(q_clamped * log_ratio + (1.0 - q_clamped) * log_complement)
    return forward, reverse


def _gate(index: int) -> Callable[[TokenSource], Array]:
    return lambda s: gate_values(s.token("trainer"), s.token("rollout"))[index]


for _index, _name in enumerate(("rs_kpop", "rs_bkl", "rs_tv")):
    TOKEN_QUANTITIES[_name] = _gate(_index)


# ----------------------------------------------------------------------- derived token quantities
@dataclass(frozen=True)
class Derived:
    """A token quantity derived from one of the engine's (``base``: δ, c, w = exp(c), k1, k2, k3) and bounds: a
    truncated or IcePop weight, a clamped value, or a bound flag (1.0 / 0.0). Registered under ``name`` in
    ``TOKEN_QUANTITIES``, so either engine reduces it by name, each chunk once for every preset: the torch
    engine from the tensor ``torch_values`` builds, the numba engine from one compiled pass over every derived quantity
    of the pass (``kernels/presets.py``, ``KernelStats.prepare_derived``) with no token tensor."""

    base: str  # a key of kernels.presets.KINDS
    op: str  # a key of kernels.presets.OPS
    lower: float = -math.inf
    upper: float = math.inf

    @property
    def name(self) -> str:
        return f"{self.op}({self.base}; {self.lower!r}, {self.upper!r})"

    def torch_values(self, s: TokenSource) -> Array:
        """The quantity at every model token, with the torch engine's formulas (a flag as bool), of the chunk's kind."""
        v, lower, upper = s.token(self.base), self.lower, self.upper
        if self.op == "tis":
            return arrays.clamp(v, upper=upper)
        if self.op == "icepop":
            return arrays.where((v >= lower) & (v <= upper), v, 0.0)
        if self.op == "clamp":
            return arrays.clamp(v, lower, upper)
        if self.op == "above":
            return v > upper
        if self.op == "below":
            return v < lower
        if self.op == "outside":
            return ~((v >= lower) & (v <= upper))
        if self.op == "beyond":
            return (v < lower) | (v > upper)
        return ~(v <= upper)  # not_at_most


DERIVED: dict[str, Derived] = {}  # name -> quantity, every one registered in this process
# The engine's own w and k3 (min(max(v, −inf), inf) = v): the compiled pass fills their reductions too, so no tensor
# of k3 is made and w is summed beside everything else
for _base in ("token_is_weight", "rs_k3", "rs_kpop", "rs_bkl", "rs_tv"):
    DERIVED[_base] = Derived(_base, "clamp")


_NAMES: dict[tuple, str] = {}  # derived()'s arguments -> the quantity's name (accumulators ask every chunk)


def derived(base: str, op: str, lower: float = -math.inf, upper: float = math.inf) -> str:
    """The name of a derived token quantity (registered on first use)."""
    lower, upper = float(lower), float(upper)
    # the signs tell +0.0 from −0.0, which compare (and hash) equal but name different bounds
    key = (base, op, lower, upper, math.copysign(1.0, lower), math.copysign(1.0, upper))
    name = _NAMES.get(key)
    if name is None:
        quantity = Derived(base, op, lower, upper)
        name = quantity.name
        if name not in DERIVED:
            DERIVED[name] = quantity
            TOKEN_QUANTITIES[name] = quantity.torch_values
        _NAMES[key] = name
    return name
