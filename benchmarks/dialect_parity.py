"""Parity of the verl@b178a3c, areal and areal:kpop dialects with the frameworks' own functions, run with torch.

    git -C <verl> show b178a3cd5:verl/trainer/ppo/rollout_corr_helper.py > /tmp/verl_rch.py
    git -C <AReaL> show cbff54d:areal/utils/functional/functional.py > /tmp/areal_fn.py
    python benchmarks/dialect_parity.py /tmp/verl_rch.py /tmp/areal_fn.py [SEED]

Extracts ``compute_rollout_correction_weights`` / ``compute_is_metrics`` (verl, with verl_F's masked_sum / masked_mean
as verl writes them) and ``apply_rejection_sampling`` / ``compute_binary_kl_divergence`` (AReaL) from the sources,
runs them on one random step (float32 logprobs, heavy-tailed δ, certain tokens, empty rows) in verl's float64 and
AReaL's float32 padded layout, aggregates AReaL's values as its stats_tracker does, and prints each value beside
rollout-diag's. verl: every value to 4e-8 (verl's fractions are float32 means); AReaL: the gate and every min / max
exact, averages to float32 summation noise (< 1e-6).
"""

import ast
import math
import sys
import tempfile
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

import rollout_diag as rd

VERL_SOURCE, AREAL_SOURCE = sys.argv[1], sys.argv[2]


def load(path, names, env):
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    keep = [
        n
        for n in tree.body
        if (isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in names)
        or (isinstance(n, ast.Assign) and any(getattr(t, "id", "") in names for t in n.targets))
    ]
    exec(compile(ast.Module(body=keep, type_ignores=[]), path, "exec"), env)
    return env


def masked_sum(values, mask, axis=None):
    return (torch.where(mask.bool(), values, 0.0) * mask).sum(axis=axis)


def masked_mean(values, mask, axis=None):
    return masked_sum(values, mask, axis) / (mask.sum(axis=axis) + 1e-8)


verl_F = types.SimpleNamespace(masked_sum=masked_sum, masked_mean=masked_mean)
venv = load(
    VERL_SOURCE,
    {"compute_rollout_correction_weights", "compute_is_metrics", "SAFETY_BOUND"},
    {"torch": torch, "verl_F": verl_F, "math": math, "Optional": Optional, "Any": Any},
)
aenv = load(
    AREAL_SOURCE,
    {"apply_rejection_sampling", "_check_bounds", "compute_binary_kl_divergence", "RejectionSamplingResult"},
    {"torch": torch, "dataclass": dataclass, "RejectionSamplingConfig": object, "KLEstimator": None},
)

rng = np.random.default_rng(int(sys.argv[3]) if len(sys.argv) > 3 else 0)
rows = []
for _ in range(40):
    n = int(rng.integers(1, 40))
    r = -rng.exponential(1.0, n)
    d = rng.normal(0, 0.05, n) + (rng.random(n) < 0.05) * rng.normal(0, 12, n)
    a = np.minimum(r + d, 0.0)
    a[rng.random(n) < 0.03] = 0.0  # certain tokens: AReaL KPop's NaN trap
    m = (rng.random(n) > 0.1).astype(np.int8)
    if rng.random() < 0.1:
        m[:] = 0
    rows.append((a.astype(np.float32), r.astype(np.float32), m))
path = str(Path(tempfile.mkdtemp()) / "parity.parquet")
pq.write_table(
    pa.table(
        {
            "step": [0] * len(rows),
            "sample_id": [str(i) for i in range(len(rows))],
            "rollout_log_probs": pa.array([x[1].tolist() for x in rows], pa.list_(pa.float32())),
            "old_log_probs": pa.array([x[0].tolist() for x in rows], pa.list_(pa.float32())),
            "response_mask": pa.array([x[2].tolist() for x in rows], pa.list_(pa.int8())),
        }
    ),
    path,
)
L = max(len(x[0]) for x in rows)


def pad(i, dtype):
    out = torch.zeros(len(rows), L, dtype=dtype)
    for k, x in enumerate(rows):
        out[k, : len(x[i])] = torch.tensor(x[i].astype(np.float64), dtype=dtype)
    return out


res = rd.analyze(path, device="cpu", dialect="verl@b178a3c,verl@b178a3c:seq,areal,areal:kpop").run.dialects
worst = 0.0
# verl b178a3c, in float64 (rollout-diag computes in float64)
a64, r64, m64 = pad(0, torch.float64), pad(1, torch.float64), pad(2, torch.float64)
for level, name in (("token", "verl@b178a3c"), ("sequence", "verl@b178a3c:seq")):
    _, metrics = venv["compute_rollout_correction_weights"](
        (a64 - r64) * m64, m64, rollout_is=level, rollout_is_threshold=2.0
    )
    for k, v in metrics.items():
        ours = res[name]["rollout_corr/" + k]
        rel = abs(ours - v) / max(abs(v), 1e-300)
        worst = max(worst, rel)
        print(f"{name:18s} {k:32s} verl {v:.12g}  ours {ours:.12g}  rel {rel:.1e}")
# AReaL cbff54d, float32 tensors in the 2D padded layout, stats_tracker's aggregation
a32, r32, mask = pad(0, torch.float32), pad(1, torch.float32), pad(2, torch.float32).bool()
for metric, upper, name in (("ratio", 5.0, "areal"), ("binary_kl", 2.0, "areal:kpop")):
    cfg = types.SimpleNamespace(metric=metric, upper=upper, lower=None, level="token", action="mask", agg="mean")
    rs = aenv["apply_rejection_sampling"](a32, r32, mask, None, cfg)
    w = rs.behave_imp_weight
    behave = (w > 0) & rs.loss_mask.bool()
    x = a32 - r32
    stat = {
        "behave_imp_weight": (w, behave),
        "behave_approx_kl": (torch.where(behave, x, 0.0), behave),
        "logp_diff": ((r32 - a32) * mask, mask),
        "logp_abs_diff": (((r32 - a32) * mask).abs(), mask),
        "behave_filtered_ratio": ((mask & ~behave).float(), mask),
        "compute_logp/kl_div_dual": (x.exp() - 1 - x, behave),
        "compute_logp/kl_div_taylor": (x**2 / 2.0, behave),
    }
    for k, (v, d) in stat.items():
        for s, val in (
            ("avg", torch.where(d, v, 0.0).sum() / d.sum()),
            ("min", torch.where(d, v, math.inf).min()),
            ("max", torch.where(d, v, -math.inf).max()),
        ):
            key = f"ppo_actor/update/{k}/{s}"
            val = float(val)
            if math.isinf(val) and s != "avg":
                assert key not in res[name], key
                continue
            ours = res[name][key]
            rel = abs(ours - val) / max(abs(val), 1e-30)
            worst = max(worst, rel if rel > 1e-5 else 0)
            print(f"{name:18s} {k + '/' + s:40s} AReaL {val:.9g}  ours {ours:.9g}  rel {rel:.1e}")
    print(
        name,
        "rs_filtered_fraction AReaL",
        rs.filtered_fraction,
        "ours",
        res[name]["ppo_actor/update/rs_filtered_fraction"],
        "NaN-filtered",
        res[name]["note: tokens AReaL filters for a NaN binary-KL score (a logprob of 0.0)"],
    )
    assert abs(rs.filtered_fraction - res[name]["ppo_actor/update/rs_filtered_fraction"]) < 1e-15
print("worst relative difference (AReaL's above float32 noise 1e-5 only):", worst)
