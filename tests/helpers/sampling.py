"""Logprobs sampled from real distributions, to plant each processing class honestly.

Each context draws logits z over a small vocabulary; the token is sampled from the *rollout's* distribution q
(the trainer's softmax(z) processed by temperature, top-p or top-k), the trainer's logprob is log softmax(z)[tok] and
the rollout's log q[tok] — never a / T. Contexts mix peaked and flat distributions (the logit scale is log-uniform),
as language models do. ``numerics`` adds a small Gaussian noise to the trainer side (an engine-vs-trainer mismatch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Processing:
    """How the rollout engine turns the trainer's distribution into the one it samples and reports."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0

    def apply(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(log q [n, V] of the processed distribution, kept probability mass under softmax(z) [n])."""
        scaled = logits / self.temperature
        log_q = scaled - _logsumexp(scaled)
        keep = np.ones_like(log_q, dtype=bool)
        if self.top_k:
            kth = -np.sort(-log_q, axis=1)[:, self.top_k - 1 : self.top_k]
            keep &= log_q >= kth
        if self.top_p < 1.0:
            order = np.argsort(-log_q, axis=1)
            sorted_p = np.take_along_axis(np.exp(log_q), order, axis=1)
            before = np.cumsum(sorted_p, axis=1) - sorted_p  # mass strictly above each token
            kept_sorted = before < self.top_p  # the smallest prefix whose mass reaches top_p
            np.put_along_axis(keep, order, kept_sorted & np.take_along_axis(keep, order, axis=1), axis=1)
        trainer = logits - _logsumexp(logits)
        kept = np.where(keep, np.exp(trainer), 0.0).sum(axis=1)
        if keep.all():
            return log_q, kept
        masked = np.where(keep, log_q, -np.inf)
        return masked - _logsumexp(masked), kept


def _logsumexp(x: np.ndarray) -> np.ndarray:
    top = np.max(x, axis=1, keepdims=True)
    return top + np.log(np.exp(x - top).sum(axis=1, keepdims=True))


def sample(
    rng: np.random.Generator,
    count: int,
    processing: Processing = Processing(),
    *,
    vocab: int = 64,
    numerics: float = 0.0,
    scale: tuple[float, float] = (0.5, 8.0),
) -> dict[str, np.ndarray]:
    """``count`` sampled tokens: trainer and rollout logprobs, token ids, kept mass (float64 arrays)."""
    logit_scale = np.exp(rng.uniform(np.log(scale[0]), np.log(scale[1]), (count, 1)))
    logits = rng.normal(0.0, 1.0, (count, vocab)) * logit_scale
    log_q, kept = processing.apply(logits)
    q = np.exp(log_q)
    cumulative = np.cumsum(q, axis=1)
    draws = rng.random((count, 1)) * cumulative[:, -1:]
    token = np.minimum((cumulative < draws).sum(axis=1), vocab - 1)
    while True:  # a draw may land on a zero-probability token through rounding: redraw those
        bad = q[np.arange(count), token] == 0.0
        if not bad.any():
            break
        token[bad] = np.argmax(q[bad], axis=1)
    trainer = (logits - _logsumexp(logits))[np.arange(count), token]
    rollout = log_q[np.arange(count), token]
    if numerics:
        trainer = np.minimum(trainer + rng.normal(0.0, numerics, count) * np.sqrt(1.0 - np.exp(trainer)), 0.0)
    return {"trainer": trainer, "rollout": np.minimum(rollout, 0.0), "token": token, "kept": kept}


def sampled_rows(
    seed: int,
    processing: Processing = Processing(),
    *,
    steps: int = 3,
    rows_per_step: int = 16,
    length: int = 64,
    numerics: float = 0.01,
    first_step: int = 0,
    spread: float = 0.0,
) -> list[dict]:
    """Single-turn rows (``helpers.dumps.seq_row``) of sampled tokens, values rounded to float32 as a dump keeps them.
    ``spread``: an extra Gaussian noise of that scale on the rollout side (a spike)."""
    rng = np.random.default_rng(seed)
    out = []
    for step in range(first_step, first_step + steps):
        for index in range(rows_per_step):
            drawn = sample(rng, length, processing, numerics=numerics)
            rollout = drawn["rollout"]
            if spread:
                rollout = np.minimum(rollout - rng.normal(0.0, spread, length), 0.0)
            out.append(
                {
                    "step": step,
                    "sample_id": f"s{step}-{index:02d}",
                    "rollout": np.float32(rollout).astype(np.float64).tolist(),
                    "trainer": np.float32(drawn["trainer"]).astype(np.float64).tolist(),
                    "mask": [1] * length,
                }
            )
    return out
