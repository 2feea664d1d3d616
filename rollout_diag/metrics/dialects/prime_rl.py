"""prime-rl: ``mismatch_kl/all/{mean,std,min,max}``, the k3 estimator over the step's trainable tokens; with
advantages, the DPPO trust-region metrics of its default loss; with environment names, ``mismatch_kl/<env>/…``.

Definitions, PrimeIntellect-ai/prime-rl at commit 559b44772e471d1538537b8805cc77f3824a5e64:
- ``src/prime_rl/trainer/rl/loss.py`` ``compute_importance_ratio_and_mismatch_kl``: mismatch_kl = exp(δ) − δ − 1
  with δ = trainer − inference logprob.
- ``src/prime_rl/trainer/rl/train.py``: mismatch_kl values at the loss-mask tokens appended per micro-batch to
  ``mismatch_kl/all`` and, per token's ``env_name``, to ``mismatch_kl/<env>``.
- ``src/prime_rl/trainer/utils.py`` ``Tensors.compute_stats``: every key all-gathered over micro-batches and
  ranks, then mean / median / std / min / max.
- ``loss.py`` ``default_loss_fn`` (the DPPO+KL loss, ``loss.type = "default"``), per sample (sequence):
  p_diff = exp(a) − exp(r); high = p_diff > dppo_mask_high, low = p_diff < −dppo_mask_low (0.2 / 0.2,
  ``packages/prime-rl-configs/src/prime_rl/configs/trainer.py``); is_masked = where(A > 0, high, low);
  is_masked_high = (A > 0) & high; is_masked_low = (A < 0) & low; ``_safe_mean`` = Σ over a mask / max(count, 1).
  masked_mismatch_kl = _safe_mean(k3, loss_mask & is_masked), unmasked_mismatch_kl = _safe_mean(k3,
  loss_mask & ~is_masked), is_masked* = _safe_mean(·, loss_mask), masked_advantage_positive / _negative =
  _safe_mean(A > 0 / A < 0, loss_mask & is_masked). ``compute_loss`` stacks one value per
  sample whose rl mask (``loss_mask & (rl_weights != 0)``) has a token: a filtered sample (zero advantage, its rl
  weights zeroed by ``orchestrator/train_sink.py`` ``_prune_zero_advantages``) is left out, not counted as 0;
  ``compute_stats`` takes mean / std / min / max over the step's samples.

The advantage A comes from the dump's per-row ``advantages`` (or ``advantage``) column; a row's value applies
to each of its tokens, as GRPO's per-sample advantage does; a row whose advantage is null is left out of the
DPPO statistics (the prime-rl importer carries one per row: io/formats/prime_rl.py). Environment names from an
``env_name`` column.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from rollout_diag.engine import arrays
from rollout_diag.engine.arrays import Array, segment_moments, segment_sum
from rollout_diag.engine.state import merge_moments
from rollout_diag.engine.stats import stats
from rollout_diag.io.chunk import Chunk
from rollout_diag.metrics.base import State, StepAccumulator, as_float
from rollout_diag.metrics.dialects.base import Framework, by_step, reductions, row_extreme, statistics, token_moments

PREFIX = "mismatch_kl/all/"
ENV_PREFIX = "mismatch_kl/"
DPPO_MASK_LOW = DPPO_MASK_HIGH = 0.2  # DefaultLossConfig defaults
ADVANTAGE_COLUMNS = ("advantages", "advantage")
ENV_COLUMN = "env_name"
# per-sample values of default_loss_fn, each reported as <name>/{mean,std,min,max} over the step's samples: name ->
# (concept, formula) as docs/dialects.md gives them
_DPPO = {
    "masked_mismatch_kl": ("k3 KL over DPPO-masked tokens, per sample", "exp(δ) − δ − 1 where is_masked"),
    "unmasked_mismatch_kl": ("k3 KL over DPPO-kept tokens, per sample", "exp(δ) − δ − 1 where not is_masked"),
    "is_masked": (
        "share of tokens the DPPO trust region masks, per sample",
        "is_masked = A > 0 ? e^a − e^r > 0.2 : e^a − e^r < −0.2",
    ),
    "is_masked_low": ("share masked for a negative advantage, per sample", "A < 0 and e^a − e^r < −0.2"),
    "is_masked_high": ("share masked for a positive advantage, per sample", "A > 0 and e^a − e^r > 0.2"),
    "masked_advantage_positive": ("share of the masked tokens with A > 0, per sample", "A > 0 where is_masked"),
    "masked_advantage_negative": ("share of the masked tokens with A < 0, per sample", "A < 0 where is_masked"),
}
SAMPLE_METRICS = tuple(_DPPO)
STATISTICS = ("mean", "std", "min", "max")


def advantages(chunk: Chunk) -> Array | None:
    """The chunk's per-row advantages (float64 [R], NaN where null), or None when it carries none (text, or
    only nulls)."""
    for name in ADVANTAGE_COLUMNS:
        values = chunk.extra.get(name)
        if values is None:
            continue
        if isinstance(values, np.ndarray):
            if not np.issubdtype(values.dtype, np.number) and values.dtype != bool:
                return None
            array = values.astype(np.float64)
        else:
            items = [values[row] for row in range(chunk.rows)]
            if any(
                item is not None and (isinstance(item, str) or not isinstance(item, (int, float))) for item in items
            ):
                return None
            array = np.array([math.nan if item is None else float(item) for item in items], dtype=np.float64)
        if np.isnan(array).all():
            return None
        return arrays.like(array, chunk.trainer)
    return None


def _reductions(samples: tuple[str, ...]) -> dict[str, str]:
    return reductions(
        moments=("k3", *samples),
        max=("k3_max", *(name + "_max" for name in samples)),
        min=("k3_min", *(name + "_min" for name in samples)),
    )


def _statistics(n: float, mean: float, m2: float, low: float, high: float) -> list[float]:
    """mean, unbiased std (NaN for one value: torch.Tensor.std), min, max."""
    return [mean, math.sqrt(max(m2, 0.0) / (n - 1)) if n > 1 else math.nan, low, high]


class PrimeRLAccumulator(StepAccumulator):
    """Chan moments, max and min of the per-token k3 over the step's model tokens; with advantages, moments, max and
    min over the step's rows of each per-sample DPPO value."""

    SAMPLES: ClassVar[tuple[str, ...]] = SAMPLE_METRICS
    REDUCTIONS: ClassVar[dict[str, str]] = _reductions(SAMPLE_METRICS)

    def _stats(self, chunk: Chunk) -> dict[str, Array]:
        s = stats(chunk)
        out = {
            "k3": token_moments(s, "k3"),  # exp(δ) − δ − 1 (expm1 form: the same value, rounded better near 0)
            "k3_max": by_step(s, row_extreme(s, "k3", "amax"), "max"),
            "k3_min": by_step(s, row_extreme(s, "k3", "amin"), "min"),
        }
        groups = chunk.groups
        found = self._samples(s)
        if found is None:  # no sample enters: empty moments, max −inf, min +inf
            empty = np.zeros((groups.count, 6))
            for name in self.SAMPLES:
                out[name] = empty
                out[name + "_max"] = np.full(groups.count, -math.inf)
                out[name + "_min"] = np.full(groups.count, math.inf)
            return out
        per_row, sample = found
        for name, values in per_row.items():
            kept = values[sample]
            zeros = arrays.zeros(arrays.size(kept), kept)
            out[name] = segment_moments(kept, zeros, groups.row_group[sample], groups.count)
            out[name + "_max"] = by_step(s, arrays.where(sample, values, -math.inf), "max")
            out[name + "_min"] = by_step(s, arrays.where(sample, values, math.inf), "min")
        return out

    def _samples(self, s: Any) -> tuple[dict[str, Array], Array] | None:
        """The loss fn's per-sample values (float64 [R]) and which rows are samples, or None without any."""
        advantage = advantages(s.chunk)
        if advantage is None:
            return None
        # a row without an advantage is no sample of these statistics, nor is one without a trained token:
        # compute_loss runs the rl loss fn only where ``loss_mask & (rl_weights != 0)`` has a token (a filtered,
        # zero-advantage row has its rl weights zeroed by the orchestrator and is left out, not counted as 0)
        return per_sample(s, advantage), ~arrays.isnan(advantage) & (s.row_count > 0)

    def _finalize(self, state: State) -> dict[str, float]:
        n, mean, _, m2, _, _ = (float(v) for v in state["k3"])
        if n == 0:
            return {}
        out = dict(
            zip((PREFIX + s for s in STATISTICS), _statistics(n, mean, m2, *_extremes(state, "k3")), strict=True)
        )
        for name in self.SAMPLES:
            rows, mean, _, m2, _, _ = (float(v) for v in state[name])
            if rows:
                values = _statistics(rows, mean, m2, *_extremes(state, name))
                out.update(zip((f"{name}/{s}" for s in STATISTICS), values, strict=True))
        return out


def _extremes(state: State, name: str) -> tuple[float, float]:
    return as_float(state[name + "_min"]), as_float(state[name + "_max"])


def per_sample(s: Any, advantage: Array) -> dict[str, Array]:
    """default_loss_fn's per-sample values (float64 [R]) with the rows' advantages over their model tokens."""
    chunk = s.chunk
    row = chunk.model.row
    trainer, rollout = s.token("trainer"), s.token("rollout")
    probs_diff = arrays.exp(trainer) - arrays.exp(rollout)
    high, low = probs_diff > DPPO_MASK_HIGH, probs_diff < -DPPO_MASK_LOW
    a = advantage[row]
    positive, negative = a > 0, a < 0
    masked = arrays.where(positive, high, low)
    k3 = s.token("k3")

    def rows_sum(values: Array) -> Array:
        return segment_sum(arrays.float64(values), row, chunk.rows)

    n = rows_sum(arrays.ones(arrays.size(k3), k3))
    n_masked = rows_sum(masked)
    safe_n, safe_masked = arrays.clamp(n, lower=1.0), arrays.clamp(n_masked, lower=1.0)
    return {
        "masked_mismatch_kl": rows_sum(arrays.where(masked, k3, 0.0)) / safe_masked,
        "unmasked_mismatch_kl": rows_sum(arrays.where(masked, 0.0, k3)) / arrays.clamp(n - n_masked, lower=1.0),
        "is_masked": n_masked / safe_n,
        "is_masked_low": rows_sum(negative & low) / safe_n,
        "is_masked_high": rows_sum(positive & high) / safe_n,
        # _safe_mean(advantages > 0, drop_mask), drop_mask = loss_mask & is_masked
        "masked_advantage_positive": rows_sum(masked & positive) / safe_masked,
        "masked_advantage_negative": rows_sum(masked & negative) / safe_masked,
    }


IPO_THRESHOLD = 0.1  # IPOLossConfig.ipo_threshold default
_IPO = {
    "masked_mismatch_kl": (
        "k3 KL over IPO-masked tokens, per sample",
        f"exp(δ) − δ − 1 where |e^a − e^r| > {IPO_THRESHOLD:g}",
    ),
    "unmasked_mismatch_kl": (
        "k3 KL over IPO-kept tokens, per sample",
        f"exp(δ) − δ − 1 where |e^a − e^r| ≤ {IPO_THRESHOLD:g}",
    ),
    "is_masked": ("share of tokens the IPO trust region masks, per sample", f"|e^a − e^r| > {IPO_THRESHOLD:g}"),
}
IPO_METRICS = tuple(_IPO)


def per_sample_ipo(s: Any) -> dict[str, Array]:
    """ipo_loss_fn's per-sample values (float64 [R]): is_masked = |exp(a) − exp(r)| > ipo_threshold, both sides."""
    chunk = s.chunk
    row = chunk.model.row
    masked = abs(arrays.exp(s.token("trainer")) - arrays.exp(s.token("rollout"))) > IPO_THRESHOLD
    k3 = s.token("k3")

    def rows_sum(values: Array) -> Array:
        return segment_sum(arrays.float64(values), row, chunk.rows)

    n = rows_sum(arrays.ones(arrays.size(k3), k3))
    n_masked = rows_sum(masked)
    return {
        "masked_mismatch_kl": rows_sum(arrays.where(masked, k3, 0.0)) / arrays.clamp(n_masked, lower=1.0),
        "unmasked_mismatch_kl": rows_sum(arrays.where(masked, 0.0, k3)) / arrays.clamp(n - n_masked, lower=1.0),
        "is_masked": n_masked / arrays.clamp(n, lower=1.0),
    }


class PrimeRLIPOAccumulator(PrimeRLAccumulator):
    """``loss.type = "ipo"``: the k3 statistics, and ipo_loss_fn's three per-sample values over every row with a
    trained token (the IPO rule reads no advantage)."""

    SAMPLES: ClassVar[tuple[str, ...]] = IPO_METRICS
    REDUCTIONS: ClassVar[dict[str, str]] = _reductions(IPO_METRICS)

    def _samples(self, s: Any) -> tuple[dict[str, Array], Array] | None:
        return per_sample_ipo(s), s.row_count > 0


class EnvironmentAccumulator:
    """``mismatch_kl/<env>/…``: moments, min and max of the per-token k3 per step and environment name."""

    def __init__(self) -> None:
        self.steps: dict[int, dict[str, np.ndarray]] = {}  # step -> env -> [n, mean, 0, M2, 0, 0, min, max]

    def update(self, chunk: Chunk) -> None:
        names = chunk.extra.get(ENV_COLUMN)
        if names is None or not chunk.rows:
            return
        envs = [names[row] for row in range(chunk.rows)]
        labels = sorted({str(env) for env in envs if env is not None})
        if not labels:
            return
        code = {label: index for index, label in enumerate(labels)}
        row_env = np.array([-1 if env is None else code[str(env)] for env in envs], dtype=np.int64)
        s = stats(chunk)
        k3 = arrays.host(arrays.float64(s.token("k3")))  # on the host: a few values per step and environment
        row = arrays.host(chunk.model.row)
        token_env = row_env[row]
        token_group = arrays.host(chunk.groups.row_group)[row]
        known = token_env >= 0
        key = token_group[known] * len(labels) + token_env[known]
        values = k3[known]
        count = chunk.groups.count * len(labels)
        moments = segment_moments(values, np.zeros_like(values), key, count)
        high = arrays.scatter_max(np.full(count, -math.inf), key, values)
        low = arrays.scatter_min(np.full(count, math.inf), key, values)
        for group, step in enumerate(chunk.groups.steps):
            for label, env in code.items():
                at = group * len(labels) + env
                if moments[at, 0] == 0:
                    continue
                self._add(step, label, np.concatenate([moments[at], [low[at], high[at]]]))

    def _add(self, step: int, env: str, state: np.ndarray) -> None:
        envs = self.steps.setdefault(step, {})
        current = envs.get(env)
        envs[env] = state if current is None else _merge(current, state)

    def merge(self, other: EnvironmentAccumulator) -> None:
        for step, envs in other.steps.items():
            for env, state in envs.items():
                self._add(step, env, state)

    def finalize_steps(self) -> dict[int, dict[str, float]]:
        return {step: _env_values(envs) for step, envs in sorted(self.steps.items())}

    def finalize_run(self) -> dict[str, float]:
        run: dict[str, np.ndarray] = {}
        for step in sorted(self.steps):
            for env, state in self.steps[step].items():
                run[env] = state if env not in run else _merge(run[env], state)
        return _env_values(run)


def _merge(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.concatenate([merge_moments(a[:6], b[:6]), [min(a[6], b[6]), max(a[7], b[7])]])


def _env_values(envs: dict[str, np.ndarray]) -> dict[str, float]:
    out: dict[str, float] = {}
    for env in sorted(envs):
        n, mean, _, m2, _, _, low, high = (float(v) for v in envs[env])
        values = _statistics(n, mean, m2, low, high)
        out.update(zip((f"{ENV_PREFIX}{env}/{s}" for s in STATISTICS), values, strict=True))
    return out


class PrimeRLFamily:
    """The whole dialect: the k3 and the loss fn's per-sample statistics, then the per-environment k3."""

    MAIN: ClassVar[type[PrimeRLAccumulator]] = PrimeRLAccumulator

    def __init__(self) -> None:
        self.main = self.MAIN()
        self.envs = EnvironmentAccumulator()

    def update(self, chunk: Chunk) -> None:
        self.main.update(chunk)
        self.envs.update(chunk)

    def merge(self, other: PrimeRLFamily) -> None:
        self.main.merge(other.main)
        self.envs.merge(other.envs)

    def step_accumulators(self) -> tuple[StepAccumulator, ...]:
        """The per-step table's accumulator (the per-environment states are kept by step in a dict of their own)."""
        return (self.main,)

    def finalize_steps(self) -> dict[int, dict[str, float]]:
        envs = self.envs.finalize_steps()
        return {step: _with_envs(values, envs.get(step, {})) for step, values in self.main.finalize_steps().items()}

    def finalize_run(self) -> dict[str, float]:
        return _with_envs(self.main.finalize_run(), self.envs.finalize_run())


class PrimeRLIPOFamily(PrimeRLFamily):
    """The dialect with ``loss.type = "ipo"``."""

    MAIN: ClassVar[type[PrimeRLAccumulator]] = PrimeRLIPOAccumulator


def _with_envs(values: dict[str, float], envs: dict[str, float]) -> dict[str, float]:
    return {**values, **envs} if values else {}  # a step without model tokens has no dialect values


_AGG = "over every trainable token of the step (all micro-batches and ranks gathered)"
_SAMPLES = (
    "over the step's samples (rows with a trained token; a filtered, empty row is left out), each Σ over its "
    "mask / max(count, 1); only when the dump has advantages"
)

FRAMEWORK = Framework(
    name="prime-rl",
    title="prime-rl",
    source=(
        "PrimeIntellect-ai/prime-rl `src/prime_rl/trainer/rl/loss.py`, `src/prime_rl/trainer/rl/train.py`, "
        "`src/prime_rl/trainer/utils.py`, `packages/prime-rl-configs/src/prime_rl/configs/trainer.py` "
        "@ 559b44772e471d1538537b8805cc77f3824a5e64"
    ),
    config=(
        "always logged; `all` = every environment, `mismatch_kl/<env>/…` per `env_name` when the dump has that "
        "column; the DPPO values with the default loss (`dppo_mask_low` = `dppo_mask_high` = 0.2) when the dump "
        "has a per-row `advantages` (or `advantage`) column, the row's value applying to each of its tokens "
        "(rows with a null one left out; prime-rl's token exports give each row the advantage of its trained "
        "tokens when their signs agree, all that the DPPO rule reads)"
    ),
    offline=(
        "The `median` of each key is left out: an exact median needs every value, which a streaming pass "
        "does not keep. W&B receives only mean and max (the other statistics go to the console and other "
        "monitors). prime-rl runs the DPPO values on the rl component's mask (loss mask ∧ rl weight ≠ 0); the "
        "dump's trained tokens also hold ref-KL tokens when that stream exists (the same without one). prime-rl "
        "pads a step's micro-batches to a multiple of its trainer workers with copies of the first whose loss "
        "mask is all false and that carry no rl weight stream (`batch.py` `_pad_group_for_distribution`): "
        "`compute_loss` runs the loss fn on each of their samples and stacks zeros into the per-sample "
        "statistics, a dilution that depends on the worker count and leaves no trace in a dump; the values here "
        "are prime-rl's without that padding."
    ),
    metrics=(
        *statistics(
            PREFIX,
            "exp(δ) − δ − 1",
            _AGG,
            {
                "mean": "k3 KL exp(δ) − δ − 1 (token mean)",
                "std": "k3 KL, std over tokens",
                "min": "k3 KL, min over tokens",
                "max": "k3 KL, max over tokens",
            },
            joined=", ",
        ),
        *(
            metric
            for name, (concept, formula) in _DPPO.items()
            for metric in statistics(f"{name}/", formula, _SAMPLES, dict.fromkeys(STATISTICS, concept))
        ),
        *statistics(
            f"{ENV_PREFIX}<env>/",
            "exp(δ) − δ − 1",
            "over the step's trainable tokens of rows whose `env_name` is <env>",
            {stat: f"k3 KL per environment ({stat} over tokens)" for stat in STATISTICS},
        ),
    ),
    accumulator=PrimeRLFamily,
)

_IPO_SAMPLES = (
    "over the step's samples (rows with a trained token; a filtered, empty row is left out), each Σ over its "
    "mask / max(count, 1)"
)

FRAMEWORK_IPO = Framework(
    name="prime-rl:ipo",
    title="prime-rl (ipo loss)",
    source=(
        "PrimeIntellect-ai/prime-rl `src/prime_rl/trainer/rl/loss.py` (ipo_loss_fn, #2798), "
        "`packages/prime-rl-configs/src/prime_rl/configs/trainer.py` (IPOLossConfig) "
        "@ 559b44772e471d1538537b8805cc77f3824a5e64"
    ),
    config=(
        f'`loss.type = "ipo"` with IPOLossConfig\'s defaults (`ipo_threshold` {IPO_THRESHOLD:g}, `adv_tau` 1, '
        "`kl_tau` 1e-3): a symmetric trust region on the probability difference; `mismatch_kl/all` and "
        "`mismatch_kl/<env>` as with the default loss"
    ),
    offline=FRAMEWORK.offline,
    metrics=(
        *FRAMEWORK.metrics[:4],
        *(
            metric
            for name, (concept, formula) in _IPO.items()
            for metric in statistics(f"{name}/", formula, _IPO_SAMPLES, dict.fromkeys(STATISTICS, concept))
        ),
        *FRAMEWORK.metrics[4 + 4 * len(_DPPO) :],
    ),
    accumulator=PrimeRLIPOFamily,
)
