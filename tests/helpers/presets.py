"""Every correction preset and random steps, chunks and dumps to run them on."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from rollout_diag.io.chunk import Chunk
from rollout_diag.metrics.outcome import CorrectionAnalysis
from rollout_diag.presets import PRESETS, Preset, preset_from_options

RTOL = 1e-9  # library and reference sum in different orders; both float64


Row = tuple[np.ndarray, np.ndarray, np.ndarray]  # (trainer, rollout, mask) as reference.py takes them


# One custom preset per RS option (thresholds picked to split random data), chains, IcePop, batch norm.
OPTION_THRESHOLDS = {
    "token_k1": "0.8_1.25",
    "token_k2": "0.02",
    "token_k3": "0.02",
    "seq_sum_k1": "0.5_2.0",
    "seq_sum_k2": "0.3",
    "seq_sum_k3": "0.3",
    "seq_mean_k1": "1.05",  # single U: L = 1/U
    "seq_mean_k2": "0.02",
    "seq_mean_k3": "0.02",
    "seq_max_k2": "0.5",
    "seq_max_k3": "0.5",
    # the probability gates (kpop, bkl, tv): thresholds that split the random steps' tokens and rows
    "token_kpop": "0.005",
    "token_bkl": "0.002",
    "token_tv": "0.01",
    "seq_sum_kpop": "0.05",
    "seq_sum_bkl": "0.02",
    "seq_sum_tv": "0.1",
    "seq_mean_kpop": "0.003",
    "seq_mean_bkl": "0.001",
    "seq_mean_tv": "0.005",
    "seq_max_kpop": "0.02",
    "seq_max_bkl": "0.01",
    "seq_max_tv": "0.03",
}


CUSTOM_PRESETS = [
    *(preset_from_options(f"rs_{o}", rollout_rs=o, rollout_rs_threshold=spec) for o, spec in OPTION_THRESHOLDS.items()),
    preset_from_options(
        "chain", rollout_rs="seq_mean_k3,token_k1,seq_max_k2", rollout_rs_threshold="0.02,0.8_1.25,0.5"
    ),
    preset_from_options("chain_shared", rollout_rs="token_k2,seq_mean_k2", rollout_rs_threshold="0.05"),
    preset_from_options("token_tis_bn", rollout_is="token", rollout_is_threshold="1.5", batch_normalize=True),
    preset_from_options("seq_tis_bn", rollout_is="sequence", rollout_is_threshold="3", batch_normalize=True),
    preset_from_options("seq_icepop", rollout_is="sequence", rollout_is_threshold="0.2_3"),
    preset_from_options(
        "icepop_bn_rs", rollout_is="token", rollout_is_threshold="0.7_1.3", batch_normalize=True,
        rollout_rs="seq_mean_k1,token_k3", rollout_rs_threshold="0.9_1.1,0.05",
    ),
    preset_from_options("token_tis_below_one", rollout_is="token", rollout_is_threshold="0.8"),  # L' = 1.25 > U
    Preset("legacy_seq_both", mode="legacy", legacy_is="sequence", legacy_is_mode="both",
           legacy_is_threshold="0.5_3", legacy_is_mask_threshold="0.3_2", legacy_is_veto_threshold="0.001_1000"),
    Preset("legacy_geo_truncate", mode="legacy", legacy_is="geometric", legacy_is_mode="truncate",
           legacy_is_threshold="1.05"),
]  # fmt: skip


ALL_PRESETS = [*PRESETS.values(), *CUSTOM_PRESETS]


def random_step(rng: np.random.Generator, rows: int, max_len: int = 30) -> list[Row]:
    """Rows with environment runs, empty rows (no tokens, or mask all 0) and heavy-tailed δ (some δ < −9.3
    to trip the legacy veto at ratio 1e-4); every value exact in float32."""
    out = []
    for _ in range(rows):
        length = int(rng.integers(0, max_len))
        mask = (rng.random(length) > 0.25).astype(np.float64)
        if rng.random() < 0.08:
            mask[:] = 0.0
        rollout = -rng.exponential(1.5, length) - 0.01
        delta = rng.normal(0, 0.08, length) * rng.choice([0.1, 1.0, 3.0], size=length)
        delta += (rng.random(length) < 0.03) * rng.choice([-12.0, -4.0, 3.0], size=length)
        trainer = np.minimum(rollout + delta, 0.0)
        out.append((trainer.astype(np.float32).astype(np.float64), rollout.astype(np.float32).astype(np.float64), mask))
    return out


def random_steps(seed: int) -> dict[int, list[Row]]:
    rng = np.random.default_rng(seed)
    steps = {step: random_step(rng, int(rng.integers(1, 14))) for step in (0, 1, 3, 7)}
    steps[5] = [(np.zeros(3), np.zeros(3), np.zeros(3)), (np.zeros(0), np.zeros(0), np.zeros(0))]  # N = 0
    return steps


def write_dump(path, steps: dict[int, list[Row]]) -> None:
    """Sequence layout, verl's column names; rows of a step are not contiguous (steps interleave)."""
    records = [(step, index, row) for step, rows in steps.items() for index, row in enumerate(rows)]
    records.sort(key=lambda record: (record[1], record[0]))
    table = pa.table(
        {
            "step": pa.array([step for step, _, _ in records], pa.int64()),
            "sample_id": pa.array([f"s{step}-{index}" for step, index, _ in records], pa.string()),
            "rollout_log_probs": pa.array([row[1].tolist() for _, _, row in records], pa.list_(pa.float32())),
            "old_log_probs": pa.array([row[0].tolist() for _, _, row in records], pa.list_(pa.float32())),
            "response_mask": pa.array([row[2].astype(np.int8).tolist() for _, _, row in records], pa.list_(pa.int8())),
        }
    )
    pq.write_table(table, path, row_group_size=7)


def assert_metrics_close(
    actual: dict[str, float],
    expected: dict[str, float],
    where: str,
    rtol: float = RTOL,
    abs_tolerances: dict[str, float] | None = None,
) -> None:
    assert set(actual) == set(expected), (
        f"{where}: extra {set(actual) - set(expected)}, missing {set(expected) - set(actual)}"
    )
    for name, value in expected.items():
        got = actual[name]
        if math.isinf(value) or math.isnan(value):
            assert got == value or (math.isnan(got) and math.isnan(value)), f"{where} {name}: {got} != {value}"
        else:
            abs_tol = max(1e-13, (abs_tolerances or {}).get(name, 0.0))
            assert math.isclose(got, value, rel_tol=rtol, abs_tol=abs_tol), f"{where} {name}: {got} != {value}"


def make_chunk(records: list[tuple[int, Row]]) -> Chunk:
    """A Chunk as the reader builds it: whole rows, values under mask 0 zeroed."""
    lengths = [len(row[0]) for _, row in records]
    offsets = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
    trainer = torch.tensor(np.concatenate([row[0] for _, row in records] or [np.zeros(0)]))
    rollout = torch.tensor(np.concatenate([row[1] for _, row in records] or [np.zeros(0)]))
    mask = torch.tensor(np.concatenate([row[2] for _, row in records] or [np.zeros(0)]) == 1)
    return Chunk(
        step=torch.tensor([step for step, _ in records], dtype=torch.int64),
        offsets=offsets,
        trainer=trainer.masked_fill(~mask, 0.0),
        rollout=rollout.masked_fill(~mask, 0.0),
        mask=mask,
        sample_id=[str(i) for i in range(len(records))],
        file=["memory"] * len(records),
        file_row=list(range(len(records))),
    )


def _fed(seed: int) -> CorrectionAnalysis:
    analysis = CorrectionAnalysis(ALL_PRESETS)
    records = [(step, row) for step, rows in random_steps(seed).items() for row in rows]
    for begin in range(0, len(records), 5):  # chunks that cut steps
        analysis.update(make_chunk(records[begin : begin + 5]))
    return analysis
