"""compute_metrics / BatchMetrics / the verl and SkyRL hooks: the in-loop numbers are the offline numbers."""

from __future__ import annotations

import logging
import math
import socket
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from helpers.reference import offpolicy_metrics
from helpers.trainers import padded_batch
from hypothesis import given, settings
from hypothesis import strategies as st

import rollout_diag as rd
from rollout_diag.trainers import unique_sample_ids

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")


def assert_same_metrics(got: dict[str, float], expected: dict[str, float], rel: float = 1e-12) -> None:
    assert sorted(got) == sorted(expected)
    for key, value in expected.items():
        assert math.isclose(got[key], value, rel_tol=rel, abs_tol=1e-15) or (
            math.isnan(got[key]) and math.isnan(value)
        ), (key, got[key], value)


# ----------------------------------------------------------------------------- round trip
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_compute_metrics_equals_analyze_after_write(tmp_path, dtype):
    old, rollout, mask, lengths, _ = padded_batch(1, dtype=dtype)
    with rd.DumpWriter(tmp_path / "dump") as dump:
        dump.write_step(5, old_log_probs=old, rollout_log_probs=rollout, response_mask=mask, lengths=lengths)
    (step,) = rd.analyze(str(tmp_path / "dump"), device="cpu").steps
    assert step.empty_rows == 1
    in_loop = rd.compute_metrics(old, rollout, mask, lengths=lengths)
    assert in_loop["per_round/num_rounds_max"] > 1  # multi-turn: §7 is exercised
    assert_same_metrics(in_loop, step.metrics)


def test_compute_metrics_with_presets_equals_compare_presets(tmp_path):
    old, rollout, mask, lengths, _ = padded_batch(2)
    path = tmp_path / "one.parquet"
    with rd.DumpWriter(path) as dump:
        dump.write_step(0, old_log_probs=old, rollout_log_probs=rollout, response_mask=mask, lengths=lengths)
    comparison = rd.compare_presets(str(path), ["all"], device="cpu")
    in_loop = rd.compute_metrics(old, rollout, mask, lengths=lengths, presets=["all"])
    analysis = rd.analyze(str(path), device="cpu")
    expected = dict(analysis.steps[0].metrics)
    for preset in comparison.presets:
        own = {k: v for k, v in preset.steps[0].metrics.items() if k not in expected}
        assert own, preset.name
        expected.update({f"{preset.name}/{key}": value for key, value in own.items()})
    assert_same_metrics(in_loop, expected)


def test_float64_tensors_round_trip_with_float64_storage(tmp_path):
    old, rollout, mask, lengths, _ = padded_batch(3, dtype=torch.float64)
    with rd.DumpWriter(tmp_path / "dump", logprob_type="float64") as dump:
        dump.write_step(0, old_log_probs=old, rollout_log_probs=rollout, response_mask=mask, lengths=lengths)
    expected = rd.analyze(str(tmp_path / "dump"), device="cpu").steps[0].metrics
    assert_same_metrics(rd.compute_metrics(old, rollout, mask, lengths=lengths), expected)


def test_offpolicy_metrics_match_the_float64_reference():
    old, rollout, mask, lengths, plain = padded_batch(4)
    in_loop = rd.compute_metrics(old, rollout, mask, lengths=lengths)
    for key, value in offpolicy_metrics(plain).items():
        assert in_loop[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


def test_padding_is_stripped_by_the_mask_or_the_lengths_on_either_side():
    right = padded_batch(5, empty_row=False)
    left = padded_batch(5, empty_row=False, side="left")
    with_lengths = rd.compute_metrics(*right[:3], lengths=right[3])
    assert_same_metrics(rd.compute_metrics(*left[:3], lengths=left[3], padding_side="left"), with_lengths)
    # without lengths a row ends at its last mask-1 token: same metrics (trailing mask-0 tokens count nowhere)
    assert_same_metrics(rd.compute_metrics(*right[:3]), with_lengths)
    assert_same_metrics(rd.compute_metrics(*left[:3], padding_side="left"), with_lengths)


def test_micro_batches_merge_to_the_whole_batch():
    old, rollout, mask, lengths, _ = padded_batch(6, rows=16, dtype=torch.bfloat16)
    whole = rd.compute_metrics(old, rollout, mask, lengths=lengths, presets=["verl"])
    metrics = rd.BatchMetrics(["verl"])
    for part in (slice(0, 5), slice(5, 6), slice(6, 16)):
        metrics.update(old[part], rollout[part], mask[part], lengths=lengths[part])
    assert_same_metrics(metrics.compute(), whole)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=5), st.integers(0, 10_000))
def test_any_split_into_ranks_merges_to_the_whole_batch(sizes, seed):
    rows = sum(sizes)
    old, rollout, mask, lengths, _ = padded_batch(seed, rows=rows, width=12, empty_row=rows > 3)
    whole = rd.BatchMetrics(["decoupled_seq_is_rs"]).update(old, rollout, mask, lengths=lengths)
    merged = rd.BatchMetrics(["decoupled_seq_is_rs"])
    merged.merge_state(rd.BatchMetrics(["decoupled_seq_is_rs"]).state())  # a rank that saw nothing
    start = 0
    for size in sizes:
        part = slice(start, start + size)
        rank = rd.BatchMetrics(["decoupled_seq_is_rs"])
        merged.merge_state(rank.update(old[part], rollout[part], mask[part], lengths=lengths[part]).state())
        start += size
    assert_same_metrics(merged.compute(), whole.compute())


def test_bad_rows_are_left_out_as_analyze_skips_them_and_logged_once(tmp_path, caplog):
    old, rollout, mask, lengths, _ = padded_batch(7, empty_row=False)
    rollout[2, 0], mask[2, 0] = 0.5, 1  # a positive logprob on a model token
    old[6, 0], mask[6, 0] = float("nan"), 1
    with caplog.at_level(logging.WARNING, logger="rollout_diag"):
        metrics = rd.BatchMetrics()
        metrics.update(old, rollout, mask, lengths=lengths)
        metrics.update(old, rollout, mask, lengths=lengths)
    assert metrics.skipped_rows == 4
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "row 2, column 'rollout_log_probs': positive logprob 0.5 at position 0 (logprobs are ≤ 0)" in warnings[0]
    with rd.DumpWriter(tmp_path / "dump") as dump:
        dump.write_step(0, old_log_probs=old, rollout_log_probs=rollout, response_mask=mask, lengths=lengths)
    result = rd.analyze(str(tmp_path / "dump"), device="cpu")
    assert result.skipped_rows == 2
    assert_same_metrics(rd.compute_metrics(old, rollout, mask, lengths=lengths), result.steps[0].metrics)


def test_no_model_token_gives_only_verl_s_invalid_debug_flag():
    metrics = rd.compute_metrics(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.int64))
    assert metrics["training/rollout_probs_diff_valid"] == 0.0  # METRICS.md §5: 0 with NaN values
    assert not any(key.startswith(("rollout_corr/", "rollout_kl/", "per_round/")) for key in metrics)
    assert rd.BatchMetrics().compute() == {}


def test_programmer_errors_raise_config_errors():
    old, rollout, mask, lengths, _ = padded_batch(8)
    with pytest.raises(rd.ConfigError, match=r"\[B, L\]"):
        rd.compute_metrics(old[:, :-1], rollout, mask)
    with pytest.raises(rd.ConfigError, match=r"old_log_probs: torch.int64 values.*swapped"):
        rd.compute_metrics(mask, rollout, old)
    with pytest.raises(rd.ConfigError, match="response_mask: float values other than 0 and 1"):
        rd.compute_metrics(old, rollout, rollout)
    with pytest.raises(rd.ConfigError, match="lengths: every length must lie in"):
        rd.compute_metrics(old, rollout, mask, lengths=lengths + 100)
    with pytest.raises(rd.ConfigError, match="padding_side"):
        rd.compute_metrics(old, rollout, mask, padding_side="top")
    with pytest.raises(rd.ConfigError, match=r"unknown preset|no preset"):
        rd.compute_metrics(old, rollout, mask, presets=["no_such_preset"])


# ----------------------------------------------------------------------------- the flat state
def test_state_layout_is_fixed_by_the_options_and_documents_each_reduction():
    empty = rd.BatchMetrics(["verl"])
    short = rd.BatchMetrics(["verl"]).update(torch.tensor([[-0.5]]), torch.tensor([[-0.4]]), torch.tensor([[1]]))
    long = rd.BatchMetrics(["verl"]).update(*padded_batch(9)[:3])
    assert empty.layout() == short.layout() == long.layout()
    layout = long.layout()
    assert layout[0].name == "present" and empty.state()[0] == 0 and long.state()[0] == 1
    assert {entry.reduction for entry in layout} == {"sum", "max", "min", "moments"}
    assert all(entry.shape[-1] == 6 for entry in layout if entry.reduction == "moments")
    assert [e.offset for e in layout[1:]] == [e.offset + e.size for e in layout[:-1]]  # contiguous
    assert long.state().dtype == torch.float64 and long.state().shape[0] == layout[-1].offset + layout[-1].size
    with pytest.raises(rd.ConfigError, match="same presets"):
        rd.BatchMetrics().merge_state(long.state())


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _gloo_rank(rank: int, port: int, parts: list, results: dict) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        old, rollout, mask, lengths = parts[rank]
        metrics = rd.BatchMetrics(["verl"]).update(old, rollout, mask, lengths=lengths)
        results[rank] = metrics.all_gather().compute()
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_merge_to_one_process_on_the_concatenated_batch():
    old, rollout, mask, lengths, _ = padded_batch(10, rows=10, dtype=torch.bfloat16)
    parts = [(old[:4], rollout[:4], mask[:4], lengths[:4]), (old[4:], rollout[4:], mask[4:], lengths[4:])]
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_gloo_rank, args=(_free_port(), parts, results), nprocs=2, join=True)
        per_rank = dict(results)
    whole = rd.compute_metrics(old, rollout, mask, lengths=lengths, presets=["verl"])
    assert per_rank[0] == per_rank[1]  # every rank merges in rank order: the same digits
    assert_same_metrics(per_rank[0], whole)


# ----------------------------------------------------------------------------- CUDA
@CUDA
def test_cuda_tensors_give_the_cpu_metrics(tmp_path):
    old, rollout, mask, lengths, _ = padded_batch(11, dtype=torch.bfloat16)
    cpu = rd.compute_metrics(old, rollout, mask, lengths=lengths, presets=["verl"])
    gpu = [t.cuda() for t in (old, rollout, mask, lengths)]
    assert_same_metrics(rd.compute_metrics(*gpu[:3], lengths=gpu[3], presets=["verl"]), cpu, rel=1e-9)
    with rd.DumpWriter(tmp_path / "dump") as dump:
        dump.write_step(0, old_log_probs=gpu[0], rollout_log_probs=gpu[1], response_mask=gpu[2], lengths=gpu[3])
    expected = rd.analyze(str(tmp_path / "dump"), device="cpu").steps[0].metrics
    assert_same_metrics(rd.compute_metrics(*gpu[:3], lengths=gpu[3]), expected, rel=1e-9)


# ----------------------------------------------------------------------------- hooks
def verl_batch(seed: int = 12, group: int = 3):
    """A DataProto look-alike: ``.batch`` tensors, ``.non_tensor_batch`` (a uid shared by a prompt's responses)."""
    old, rollout, mask, lengths, _ = padded_batch(seed, empty_row=False)
    rows, width = mask.shape
    prompt = 5
    attention = torch.zeros(rows, prompt + width, dtype=torch.int64)
    attention[:, :prompt] = 1
    attention[:, prompt:] = (torch.arange(width)[None, :] < lengths[:, None]).long()
    tensors = {
        "old_log_probs": old,
        "rollout_log_probs": rollout,
        "response_mask": mask,
        "attention_mask": attention,
        "responses": torch.randint(0, 1000, (rows, width)),
        "advantages": torch.arange(rows, dtype=torch.float32)[:, None].expand(rows, width) * mask,
    }
    uids = np.array([f"p{row // group}" for row in range(rows)], dtype=object)
    return SimpleNamespace(batch=tensors, non_tensor_batch={"uid": uids}), lengths


def test_verl_hook_gives_write_step_arguments_with_unique_ids(tmp_path):
    batch, lengths = verl_batch()
    from_verl = rd.from_verl_batch(batch)
    assert torch.equal(from_verl["lengths"], lengths)
    assert from_verl["sample_ids"][:4] == ["p0#0", "p0#1", "p0#2", "p1#0"]
    assert len(set(from_verl["sample_ids"])) == len(from_verl["sample_ids"])
    with rd.DumpWriter(tmp_path / "dump") as dump:
        dump.write_step(3, **from_verl)
    result = rd.analyze(str(tmp_path / "dump"), device="cpu")
    assert_same_metrics(rd.compute_metrics(**from_verl), result.steps[0].metrics)
    row = rd.inspect_row(str(tmp_path / "dump"), "p1#2", device="cpu")
    assert row.token_id == batch.batch["responses"][5, : int(lengths[5])].tolist()
    table = pq.read_table(tmp_path / "dump" / "step=3" / "rank-0.parquet")
    assert table.column("advantage").to_pylist() == [float(i) for i in range(len(lengths))]


def test_verl_hook_names_what_is_missing():
    batch, _ = verl_batch()
    del batch.batch["rollout_log_probs"]
    with pytest.raises(rd.ConfigError, match=r"no tensor 'rollout_log_probs'; turn on .*calculate_log_probs"):
        rd.from_verl_batch(batch)


class SkyRLBatch(dict):
    """SkyRL's TrainingInputBatch is a dict of tensors with a ``metadata`` dict."""

    metadata: dict


def test_skyrl_hook_reads_right_aligned_rows_and_drops_shard_padding(tmp_path):
    old, rollout, loss_mask, lengths, _ = padded_batch(13, empty_row=False, side="left")
    rows, width = loss_mask.shape
    pad = 2  # SkyRL appends copies of row 0 with loss_mask 0 to fill data-parallel shards
    response_mask = (torch.arange(width)[None, :] >= (width - lengths)[:, None]).long()

    def padded(tensor: torch.Tensor, zero: bool = False) -> torch.Tensor:
        filler = torch.zeros_like(tensor[:pad]) if zero else tensor[[0] * pad]
        return torch.cat([tensor, filler])

    batch = SkyRLBatch(
        action_log_probs=padded(old),
        rollout_logprobs=padded(rollout),
        loss_mask=padded(loss_mask, zero=True),
        response_mask=padded(response_mask),
        sequences=padded(torch.cat([torch.full((rows, 4), 7), torch.randint(0, 1000, (rows, width))], dim=1)),
        values=None,
    )
    batch.metadata = {"uids": [f"q{r // 4}" for r in range(rows)] + ["pad0", "pad1"], "pad_size": pad}
    hook = rd.from_skyrl_batch(batch)
    assert hook["padding_side"] == "left" and len(hook["sample_ids"]) == rows
    assert torch.equal(hook["lengths"], lengths)
    right = padded_batch(13, empty_row=False)
    assert_same_metrics(rd.compute_metrics(**hook), rd.compute_metrics(*right[:3], lengths=right[3]))
    with rd.DumpWriter(tmp_path / "dump") as dump:
        dump.write_step(1, **hook)
    result = rd.analyze(str(tmp_path / "dump"), device="cpu")
    assert result.run.rows == rows
    row = rd.inspect_row(str(tmp_path / "dump"), "q0#1", device="cpu")
    assert row.token_id == batch["sequences"][1, -int(lengths[1]) :].tolist()


def test_skyrl_hook_says_when_the_policy_forward_was_skipped():
    batch = SkyRLBatch(action_log_probs=None, rollout_logprobs=torch.zeros(1, 2), loss_mask=torch.ones(1, 2))
    batch.metadata = {}
    with pytest.raises(rd.ConfigError, match="no tensor 'action_log_probs'; SkyRL skipped the policy forward"):
        rd.from_skyrl_batch(batch)


def test_unique_sample_ids_number_each_prompts_responses():
    assert unique_sample_ids(["a", "b", "a", "a", 7]) == ["a#0", "b#0", "a#1", "a#2", "7#0"]
