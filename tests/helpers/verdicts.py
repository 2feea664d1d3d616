"""Altered copies of the bundled samples, each with one known pipeline bug or shape
(tests/decisions/test_verdict.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SAMPLES = Path(__file__).resolve().parents[2] / "sample_data"
REAL = SAMPLES / "textgenrnn_bf16_vs_fp32.parquet"
MULTITURN = SAMPLES / "synthetic_multiturn.parquet"
COLUMNS = ("step", "sample_id", "rollout_log_probs", "old_log_probs", "response_mask")


def _rows(path: Path) -> dict[str, list]:
    return pq.read_table(path, columns=list(COLUMNS)).to_pydict()


def _write(rows: dict[str, list], path: Path) -> Path:
    types = {
        "step": pa.int64(),
        "sample_id": pa.string(),
        "rollout_log_probs": pa.list_(pa.float32()),
        "old_log_probs": pa.list_(pa.float32()),
        "response_mask": pa.list_(pa.int8()),
    }
    pq.write_table(pa.table({name: pa.array(rows[name], type=types[name]) for name in rows}), path)
    return path


def shifted(path: Path) -> Path:
    """The real sample with the trainer logprobs one position late (a_t holds a_{t+1}: an off-by-one gather)."""
    rows = _rows(REAL)
    rows["old_log_probs"] = [[*a[1:], a[-1]] for a in rows["old_log_probs"]]
    return _write(rows, path)


def processed(path: Path, temperature: float = 0.7, vocabulary: int = 64, seed: int = 0) -> Path:
    """Synthetic rows from a known distribution: tokens drawn from softmax(logits), the trainer's logprob
    log-softmax(logits)[token], the rollout's log-softmax(logits / temperature)[token] (processed logprobs)."""
    rng = np.random.default_rng(seed)
    rows: dict[str, list] = {name: [] for name in COLUMNS}
    for step in range(3):
        for index in range(16):
            length = int(rng.integers(80, 200))
            logits = rng.normal(0.0, 2.5, size=(length, vocabulary))
            trainer = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
            rollout = logits / temperature - np.logaddexp.reduce(logits / temperature, axis=1, keepdims=True)
            tokens = [int(rng.choice(vocabulary, p=np.exp(p))) for p in trainer]
            rows["step"].append(step)
            rows["sample_id"].append(f"s{step}-{index:03d}")
            rows["old_log_probs"].append([float(trainer[t, k]) for t, k in enumerate(tokens)])
            rows["rollout_log_probs"].append([float(rollout[t, k]) for t, k in enumerate(tokens)])
            rows["response_mask"].append([1] * length)
    return _write(rows, path)


def mask_dropped(path: Path) -> Path:
    """The real sample without its mask column: environment tokens (rollout logprob 0.0) counted as model tokens."""
    rows = _rows(REAL)
    del rows["response_mask"]
    return _write(rows, path)


def concatenated(path: Path, target: int = 8192) -> Path:
    """The real sample's model tokens regrouped into rows of about ``target`` tokens per step, with |δ| clipped to
    1 (no catastrophic token): clean token-level numbers in long responses."""
    rows = _rows(REAL)
    out: dict[str, list] = {name: [] for name in COLUMNS}
    pending: dict[int, tuple[list, list]] = {}

    def flush(step: int) -> None:
        trainer, rollout = pending.pop(step)
        out["step"].append(step)
        out["sample_id"].append(f"s{step}-long{len(out['step']):03d}")
        out["old_log_probs"].append(trainer)
        out["rollout_log_probs"].append(rollout)
        out["response_mask"].append([1] * len(trainer))

    for step, a_row, r_row, m_row in zip(
        rows["step"], rows["old_log_probs"], rows["rollout_log_probs"], rows["response_mask"], strict=True
    ):
        trainer, rollout = pending.setdefault(step, ([], []))
        for a, r, m in zip(a_row, r_row, m_row, strict=True):
            if m:
                trainer.append(r + max(-1.0, min(1.0, a - r)))
                rollout.append(r)
        if len(trainer) >= target:
            flush(step)
    for step in sorted(pending):
        flush(step)
    return _write(out, path)


def one_row(path: Path) -> Path:
    """The first row of the real sample alone."""
    rows = _rows(REAL)
    return _write({name: values[:1] for name, values in rows.items()}, path)


def identical(path: Path) -> Path:
    """The real sample with the trainer logprobs replaced by the rollout's (trainer == rollout on every token)."""
    rows = _rows(REAL)
    rows["old_log_probs"] = [list(values) for values in rows["rollout_log_probs"]]
    return _write(rows, path)


def long_rows(
    path: Path, length: int = 8192, rows: int = 16, sigma: float = 0.02, seed: int = 0, shift: float = 0.0
) -> Path:
    """Synthetic rows of ``length`` model tokens with δ ~ N(shift, sigma²): k3_kl ≈ sigma²/2 = 2e-4 and chi2_token ≈
    2·sigma² = 8e-4 are ok, chi2_seq (expected exp(2·length·sigma²) − 1 ≈ 700) is bad; rollout p around 0.1.
    ``shift`` = −sigma²/2 makes ρ = exp(δ) a likelihood ratio (E[ρ] = 1), as a real trainer/rollout pair's is."""
    rng = np.random.default_rng(seed)
    out: dict[str, list] = {name: [] for name in COLUMNS}
    for index in range(rows):
        rollout = -1.5 - 0.5 * rng.standard_exponential(length)
        trainer = rollout + rng.normal(shift, sigma, length)
        out["step"].append(index // 4)
        out["sample_id"].append(f"long-{index:02d}")
        out["rollout_log_probs"].append(rollout.tolist())
        out["old_log_probs"].append(np.minimum(trainer, 0.0).tolist())
        out["response_mask"].append([1] * length)
    return _write(out, path)
