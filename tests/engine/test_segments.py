"""The per-chunk engine (engine/stats.py) on PerToken values: row and step-group sums, extrema, moments, flags
and broadcasts against plain float64 loops, on contiguous and on interleaved step groups; and the sharing that makes
it one engine (a preset pass computes exp(c) once, the weights of §2 and §8 are the same tensors)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_diag.engine.stats import ChunkStats, PerToken, stats
from rollout_diag.io.chunk import Chunk
from rollout_diag.metrics.correction import importance_weights, sequence_weight
from rollout_diag.metrics.legacy import legacy_weights
from rollout_diag.metrics.outcome import CorrectionAnalysis
from rollout_diag.presets import PRESETS, ImportanceSampling

RTOL = 1e-12


def random_chunk(seed: int, rows: int, sorted_steps: bool) -> Chunk:
    """``rows`` rows of 0–30 tokens over 1–3 steps, random masks (some rows without a model token)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 31, size=rows)
    steps = rng.integers(0, 3, size=rows)
    if sorted_steps:
        steps = np.sort(steps)
    total = int(lengths.sum())
    mask = rng.random(total) < rng.choice([0.0, 0.5, 1.0], size=rows).repeat(lengths)
    trainer = np.where(mask, -rng.exponential(1.0, total), 0.0)
    rollout = np.where(mask, trainer - rng.normal(0.0, 0.5, total), 0.0)
    return Chunk(
        step=torch.tensor(steps, dtype=torch.int64),
        offsets=torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int64),
        trainer=torch.tensor(trainer),
        rollout=torch.tensor(rollout),
        mask=torch.tensor(mask),
        sample_id=[str(i) for i in range(rows)],
        file=["memory"] * rows,
        file_row=list(range(rows)),
    )


def per_row(s: ChunkStats, token_values: np.ndarray) -> list[np.ndarray]:
    """Each row's model-token values (the reference's view of a chunk)."""
    row_of = s.chunk.model.row.numpy()
    return [token_values[row_of == row] for row in range(s.chunk.rows)]


def per_group(s: ChunkStats, token_values: np.ndarray) -> list[np.ndarray]:
    token_group = s.chunk.groups.row_group.numpy()[s.chunk.model.row.numpy()]
    return [token_values[token_group == group] for group in range(s.chunk.groups.count)]


def engines(seed: int, rows: int, sorted_steps: bool) -> list[ChunkStats]:
    """The chunk's engine twice: as built (contiguous groups reduce slice by slice when steps are sorted), and with
    step groups taken as interleaved, so every token reduction goes through rows."""
    contiguous, through_rows = (
        stats(random_chunk(seed, rows, sorted_steps)),
        ChunkStats(random_chunk(seed, rows, sorted_steps)),
    )
    through_rows.__dict__["group_token_ranges"] = None
    return [contiguous, through_rows]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), rows=st.integers(1, 12), sorted_steps=st.booleans())
def test_per_token_and_per_row_values_reduce_as_plain_loops(seed, rows, sorted_steps):
    for s in engines(seed, rows, sorted_steps):
        rng = np.random.default_rng(seed + 1)
        tokens = s.chunk.model.row.numel()
        values = rng.normal(1.0, 0.3, tokens)  # IS-weight-like: far from 0, so moments need centring
        flags = rng.random(tokens) < 0.3
        row_values = rng.normal(0.0, 2.0, s.chunk.rows)
        count = np.array([len(part) for part in per_row(s, values)], dtype=np.float64)
        valid = count > 0
        token_value, token_flag = PerToken(torch.tensor(values)), PerToken(torch.tensor(flags))
        row_value = PerToken(torch.tensor(row_values), by_row=True)

        np.testing.assert_allclose(s.row_sum(token_value).numpy(), [p.sum() for p in per_row(s, values)], rtol=RTOL)
        assert s.row_sum(token_flag).numpy().tolist() == [float(p.sum()) for p in per_row(s, flags)]  # exact counts
        np.testing.assert_array_equal(s.row_sum(row_value).numpy(), count * row_values)
        np.testing.assert_allclose(
            s.row_mean(token_value).numpy(), [p.sum() / (len(p) + 1e-8) for p in per_row(s, values)], rtol=RTOL
        )
        assert s.rows_with(token_flag).numpy().tolist() == [bool(p.any()) for p in per_row(s, flags)]
        row_flags = PerToken(torch.tensor(row_values > 0), by_row=True)
        assert s.rows_with(row_flags).numpy().tolist() == ((row_values > 0) & valid).tolist()

        broadcast = row_values[s.chunk.model.row.numpy()]
        np.testing.assert_array_equal(s.broadcast_rows(torch.tensor(row_values)).numpy(), broadcast)
        both = s.both(token_flag, row_flags)
        assert not both.by_row and both.values.numpy().tolist() == (flags & (broadcast > 0)).tolist()
        assert s.both(row_flags, row_flags).by_row

        groups = per_group(s, values)
        group_flags = per_group(s, flags)
        group_of_row = s.chunk.groups.row_group.numpy()
        np.testing.assert_allclose(s.group_sum(token_value).numpy(), [g.sum() for g in groups], rtol=RTOL, atol=0)
        assert s.group_sum(token_flag).numpy().tolist() == [float(g.sum()) for g in group_flags]
        expected_max = [g.max() if len(g) else -math.inf for g in groups]
        expected_min = [g.min() if len(g) else math.inf for g in groups]
        assert s.group_max(token_value).numpy().tolist() == expected_max
        assert s.group_min(token_value).numpy().tolist() == expected_min
        broadcast_groups = per_group(s, broadcast)
        np.testing.assert_allclose(s.group_sum(row_value).numpy(), [g.sum() for g in broadcast_groups], rtol=RTOL)
        assert s.group_max(row_value).numpy().tolist() == [g.max() if len(g) else -math.inf for g in broadcast_groups]
        assert s.group_min(row_value).numpy().tolist() == [g.min() if len(g) else math.inf for g in broadcast_groups]
        assert s.group_tokens.numpy().tolist() == [float(len(g)) for g in groups]
        assert s.group_rows.numpy().tolist() == np.bincount(group_of_row, minlength=len(groups)).tolist()
        assert s.group_valid_rows.numpy().tolist() == np.bincount(group_of_row[valid], minlength=len(groups)).tolist()

        for quantity, parts in ((token_value, groups), (row_value, broadcast_groups)):
            moments = s.group_moments(quantity).numpy()
            for group, part in enumerate(parts):
                mean = part.mean() if len(part) else 0.0
                m2 = ((part - mean) ** 2).sum()
                assert moments[group, 0] == len(part)
                np.testing.assert_allclose(moments[group, [1, 3]], [mean, m2], rtol=1e-10, atol=1e-13)
                assert moments[group, [2, 4, 5]].tolist() == [0.0, 0.0, 0.0]
        flagged = torch.tensor(valid)
        row_moments = s.group_moments_rows(torch.tensor(row_values), flagged).numpy()
        for group in range(s.chunk.groups.count):
            part = row_values[(group_of_row == group) & valid]
            mean = part.mean() if len(part) else 0.0
            np.testing.assert_allclose(row_moments[group, :2], [len(part), mean], rtol=RTOL, atol=1e-15)
            np.testing.assert_allclose(row_moments[group, 3], ((part - mean) ** 2).sum(), rtol=1e-10, atol=1e-13)


def test_memo_computes_once_per_chunk_and_key():
    s = stats(random_chunk(3, 5, sorted_steps=True))
    calls = []
    first = s.memo("key", lambda: calls.append(1) or torch.ones(2))
    assert s.memo("key", lambda: calls.append(1) or torch.zeros(2)) is first
    assert len(calls) == 1


def test_a_preset_pass_takes_exp_of_the_clamped_log_ratio_once(monkeypatch):
    """Every preset (token TIS / IcePop at several bounds, k3 options, legacy token weights) reads one exp(c), numpy's
    on the CPU in either engine (``arrays.host_exp``; the numba engine's ``KernelStats.token_weights``)."""
    chunk = random_chunk(11, 40, sorted_steps=True)
    s = stats(chunk)
    tokens = chunk.model.row.numel()
    raw_tokens = chunk.trainer.numel()
    full_size_exps, raw_size_exps = [], []
    original_exp = np.exp

    class CountingNumpy:  # numpy as the modules that take the exp see it, with its full-size exps counted
        def __getattr__(self, name):
            return getattr(np, name)

        @staticmethod
        def exp(values, *args, **kwargs):
            if np.size(values) == tokens:
                full_size_exps.append(values)
            elif np.size(values) == raw_tokens:
                raw_size_exps.append(values)
            return original_exp(values, *args, **kwargs)

    from rollout_diag.engine import arrays, chunkstats, kernelstats
    from rollout_diag.engine.kernels import presets as kernel_presets

    monkeypatch.setattr(arrays, "np", CountingNumpy())
    monkeypatch.setattr(chunkstats, "np", CountingNumpy())
    monkeypatch.setattr(kernelstats, "np", CountingNumpy())
    monkeypatch.setattr(kernel_presets, "np", CountingNumpy())
    CorrectionAnalysis([preset for preset in PRESETS.values() if not preset.gated]).update(chunk)
    assert len(full_size_exps) == 1 and not raw_size_exps
    # the probability gates take p = exp(a) and q = exp(r) inside the compiled pass (kernels.presets._gate_exp): no
    # more of numpy's
    CorrectionAnalysis(list(PRESETS.values())).update(chunk)
    assert len(full_size_exps) == 1 and not raw_size_exps

    token_weight = s.token("token_is_weight")
    clamped = s.token("clamped_log_ratio")
    numpy_exp = torch.from_numpy(original_exp(clamped.numpy()))
    assert torch.equal(token_weight, numpy_exp)
    # §3 k3 rounds as verl writes it, exp(c) − 1 − c, so a row at a threshold falls on verl's side
    assert torch.equal(s.token("rs_k3"), numpy_exp - 1.0 - clamped)
    token_tis = ImportanceSampling("token", 2.0, 0.5, icepop=False, batch_normalize=False)
    assert importance_weights(s, token_tis)[0].values is token_weight
    assert legacy_weights(s, "token").values is token_weight
    sequence_tis = ImportanceSampling("sequence", 2.0, 0.5, icepop=False, batch_normalize=False)
    assert importance_weights(s, sequence_tis)[0] is sequence_weight(s) is legacy_weights(s, "sequence")


@pytest.mark.parametrize("how", ["sum", "max", "min"])
def test_empty_rows_and_groups_get_the_identity(how):
    """A row without a model token: 0 / −inf / +inf; the same for a step group whose rows have none."""
    chunk = random_chunk(5, 6, sorted_steps=True)
    chunk.mask[:] = False
    s = stats(chunk)
    identity = {"sum": 0.0, "max": -math.inf, "min": math.inf}[how]
    assert s._row_reduce(torch.zeros(0, dtype=torch.float64), how).tolist() == [identity] * chunk.rows
    empty = PerToken(torch.zeros(0, dtype=torch.float64))
    reduce = {"sum": s.group_sum, "max": s.group_max, "min": s.group_min}[how]
    assert reduce(empty).tolist() == [identity] * chunk.groups.count


@pytest.mark.parametrize("sorted_steps", [True, False])
def test_a_named_quantity_reduces_through_its_cached_segment_reductions(sorted_steps):
    """PerToken.quantity keeps the quantity's name: its row sums are the cached ones (the very tensor), and its step
    sums, extrema and moments equal those of the same values without a name."""
    s = stats(random_chunk(8, 30, sorted_steps))
    named = PerToken.quantity(s, "rs_k2")
    anonymous = PerToken(s.token("rs_k2").clone())
    assert s.row_sum(named) is s.row_sum("rs_k2")
    np.testing.assert_allclose(s.group_sum(named).numpy(), s.group_sum(anonymous).numpy(), rtol=RTOL)
    assert s.group_max(named).tolist() == s.group_max(anonymous).tolist()
    assert s.group_min(named).tolist() == s.group_min(anonymous).tolist()
    np.testing.assert_allclose(s.group_moments(named).numpy(), s.group_moments(anonymous).numpy(), rtol=1e-10)
    assert named.map(torch.neg).name is None  # a derived value is no longer the quantity
