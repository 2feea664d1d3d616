"""The trainer side: the offline metrics inside the training loop, and duck-typed hooks for verl and SkyRL.

``compute_metrics`` builds a packed :class:`~rollout_diag.io.chunk.Chunk` straight from the padded [B, L]
tensors and feeds the engine's own accumulators (``passes.Analysis`` and ``metrics.outcome.CorrectionAnalysis``),
so the numbers logged during training are the digits ``analyze`` prints for the same batch after a
write + read. :class:`BatchMetrics` keeps that state across micro-batches and ranks: its state is one flat
float64 tensor (:meth:`BatchMetrics.layout` documents it) that ranks ``all_gather`` and merge in rank order.

The hooks import neither verl nor SkyRL: they read what those trainers' batches hold.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rollout_diag.drivers.passes import Analysis
from rollout_diag.engine.state import merge_states
from rollout_diag.errors import ConfigError
from rollout_diag.io.chunk import Chunk
from rollout_diag.io.writer import MASK, ROLLOUT, TRAINER, PackedRows, WarnOnce, pack_padded, row_problems
from rollout_diag.metrics.base import State, StepAccumulator
from rollout_diag.metrics.localize import DEFAULT_CATASTROPHIC
from rollout_diag.metrics.outcome import CorrectionAnalysis
from rollout_diag.metrics.rounds import DEFAULT_MAX_ROUNDS
from rollout_diag.presets import Preset, resolve_presets

BATCH_STEP = 0  # every update of a BatchMetrics is one training step: its state lives under this step key


@dataclass(frozen=True)
class StateSlice:
    """One entry of the flat state: ``flat[offset : offset + size]`` is accumulator ``family``'s ``name``,
    shaped ``shape``, merged across ranks by ``reduction``: ``sum`` (add), ``max``, ``min`` (elementwise), or
    ``moments`` (each trailing 6 values are count, mean_x, mean_y, M2_x, M2_y, C_xy, merged by Chan's formula:
    not a plain sum, which is why the state is gathered rather than all-reduced)."""

    offset: int
    size: int
    family: str
    name: str
    reduction: str
    shape: tuple[int, ...]


class BatchMetrics:
    """The metrics of one training step, accumulated over micro-batches and merged across ranks.

    ``presets``: names, groups (``verl``, ``legacy``, ``all``) or Preset objects whose §2/§3 (§8) metrics to
    add, each key prefixed with the preset's name; None adds none. ``update`` takes padded tensors like
    :meth:`DumpWriter.write_step`; ``compute`` returns the flat dict of verl-named floats.

    Across ranks: ``state()`` is a float64 tensor of ``len(layout()) `` slices (entry 0 is 1.0 when this rank
    saw rows, else 0.0), ``merge_state(flat)`` folds one in; ``all_gather()`` does both over a
    ``torch.distributed`` group, so every rank (rank 0 for logging) holds the merged step.
    """

    def __init__(
        self,
        presets: Sequence[str | Preset] | None = None,
        *,
        max_rounds: int = DEFAULT_MAX_ROUNDS,
        catastrophic: float = DEFAULT_CATASTROPHIC,
    ) -> None:
        if max_rounds < 1:
            raise ConfigError(f"max_rounds={max_rounds}: must be at least 1.")
        if not catastrophic > 0:
            raise ConfigError(f"catastrophic={catastrophic}: must be a positive |δ| threshold.")
        self.presets: list[Preset] = [] if presets is None else resolve_presets(presets)
        self.max_rounds = int(max_rounds)
        self.catastrophic = float(catastrophic)
        self.analysis = Analysis(max_rounds=self.max_rounds, catastrophic=self.catastrophic, top_k=1)
        self.corrections = CorrectionAnalysis(self.presets)
        self.skipped_rows = 0
        self.warn = WarnOnce()
        self._layout: list[StateSlice] | None = None

    # -- accumulating ------------------------------------------------------------------------------
    @property
    def families(self) -> list[tuple[str, StepAccumulator]]:
        """(name, accumulator) in the fixed order of the flat state."""
        named: list[tuple[str, StepAccumulator]] = list(self.analysis.family.items())  # FAMILIES' order
        named += [(_family_name(key), accumulator) for key, accumulator in self.corrections.accumulators.items()]
        return named

    def update(
        self,
        old_log_probs: Any,
        rollout_log_probs: Any,
        response_mask: Any,
        *,
        lengths: Any = None,
        padding_side: str = "right",
        sample_ids: Any = None,
        token_ids: Any = None,
        extra: Mapping[str, Any] | None = None,
    ) -> BatchMetrics:
        """Add a padded [B, L] (micro-)batch; padding is stripped as ``DumpWriter.write_step`` strips it.

        Rows the reader would skip (NaN, infinite or positive logprobs on model tokens, mask values other
        than 0/1) are left out and logged once, so the result equals ``analyze`` of the written dump.
        ``sample_ids``, ``token_ids`` and ``extra`` change no metric: they are accepted so that a hook's
        output (``from_verl_batch``) can be passed as it is. Raises ConfigError for wrong shapes or kinds.
        """
        packed = pack_padded(
            old_log_probs,
            rollout_log_probs,
            response_mask,
            lengths=lengths,
            padding_side=padding_side,
            token_ids=token_ids,
        )
        problems = row_problems(packed)
        if problems is not None:
            self.warn("bad_rows", f"{problems.count} row(s) left out of the metrics, e.g. {problems.examples[0]}")
            self.skipped_rows += problems.count
            packed = packed.select_rows(~problems.bad_rows)
        if packed.rows:
            chunk = batch_chunk(packed)
            # Worst-row tracking feeds the offline tables, not logged scalars: only the metric families run here.
            for _, family in self.families:
                family.update(chunk)
            chunk.cache.clear()
        return self

    def compute(self) -> dict[str, float]:
        """The step's metrics: §1, §5, §6, §7 under their verl/SkyRL keys (what ``analyze`` reports for the
        step), then each preset's §2/§3 (or §8) and ``summary/`` keys as ``<preset>/<key>``. Without a model
        token only §5's ``training/rollout_probs_diff_valid`` = 0 (and NaN §5 values) remain, as in verl;
        empty before any row was seen."""
        steps = self.analysis.step_results()
        if not steps:
            return {}
        metrics = dict(steps[0].metrics)
        if self.presets and metrics:
            finalized = self.corrections.finalize()
            for preset in self.presets:
                step_metrics, _ = finalized[preset.name]
                for key, value in step_metrics.get(BATCH_STEP, {}).items():
                    metrics[f"{preset.name}/{key}"] = value
        return metrics

    # -- the flat state ----------------------------------------------------------------------------
    def layout(self) -> list[StateSlice]:
        """The slices of :meth:`state`, in order. The first is ``present`` (1.0 when the rank saw rows; merged
        by ``sum`` it counts ranks with data); shapes depend only on the presets and options, never on data."""
        if self._layout is None:
            template = self if self._has_state() else self._probe()
            slices = [StateSlice(0, 1, "batch", "present", "sum", ())]
            offset = 1
            for family_name, family in template.families:
                state = family.steps[BATCH_STEP]
                for name, reduction in family.REDUCTIONS.items():
                    shape = tuple(state[name].shape)
                    size = int(np.prod(shape, dtype=np.int64))
                    slices.append(StateSlice(offset, size, family_name, name, reduction, shape))
                    offset += size
            self._layout = slices
        return self._layout

    def state(self) -> torch.Tensor:
        """The accumulated state as one float64 CPU tensor laid out as :meth:`layout` says (all zeros but the
        sizes when this rank saw no row)."""
        layout = self.layout()
        flat = np.zeros(layout[-1].offset + layout[-1].size, dtype=np.float64)
        if self._has_state():
            flat[0] = 1.0
            entries = iter(layout[1:])
            for _, family in self.families:
                state = family.steps[BATCH_STEP]
                for name in family.REDUCTIONS:
                    entry = next(entries)
                    flat[entry.offset : entry.offset + entry.size] = np.asarray(state[name], np.float64).reshape(-1)
        return torch.from_numpy(flat)

    def merge_state(self, flat: torch.Tensor) -> BatchMetrics:
        """Fold in another rank's :meth:`state` (same presets and options); a rank without rows is skipped.
        Raises ConfigError when the sizes differ (other presets or options)."""
        layout = self.layout()
        values = flat.detach().to("cpu", torch.float64).numpy().reshape(-1)
        expected = layout[-1].offset + layout[-1].size
        if values.shape[0] != expected:
            raise ConfigError(
                f"merge_state: a state of {values.shape[0]} values, this BatchMetrics has {expected}; "
                "every rank must use the same presets, max_rounds and catastrophic."
            )
        if values[0] == 0:
            return self
        entries = iter(layout[1:])
        for _, family in self.families:
            incoming: State = {}
            for name in family.REDUCTIONS:
                entry = next(entries)
                incoming[name] = values[entry.offset : entry.offset + entry.size].reshape(entry.shape).copy()
            current = family.steps.get(BATCH_STEP)
            merged = incoming if current is None else merge_states(current, incoming, family.REDUCTIONS)
            family.steps[BATCH_STEP] = merged
        return self

    def all_gather(self, group: Any = None) -> BatchMetrics:
        """Gather every rank's state over ``torch.distributed`` and merge them in rank order (the same digits on
        every rank). Call it on every rank of ``group``; NCCL groups gather on the current CUDA device."""
        import torch.distributed as dist

        flat = self.state()
        if dist.get_backend(group) == "nccl":
            flat = flat.to(torch.device("cuda", torch.cuda.current_device()))
        gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size(group))]
        dist.all_gather(gathered, flat, group=group)
        merged = self._fresh()
        for state in gathered:
            merged.merge_state(state)
        self.analysis, self.corrections = merged.analysis, merged.corrections
        return self

    def _has_state(self) -> bool:
        return BATCH_STEP in self.analysis.offpolicy.steps

    def _fresh(self) -> BatchMetrics:
        return BatchMetrics(self.presets or None, max_rounds=self.max_rounds, catastrophic=self.catastrophic)

    def _probe(self) -> BatchMetrics:
        """A copy fed one token, to read the state's shapes (they do not depend on the data)."""
        probe = self._fresh()
        probe.update(torch.full((1, 1), -1.0), torch.full((1, 1), -1.0), torch.ones((1, 1)))
        return probe


def _family_name(key: Any) -> str:
    """Readable name of a CorrectionAnalysis accumulator key, e.g. ``is:token:2.0`` or ``rs:seq_mean_k1``."""
    kind, config = key
    return f"{kind}:{config!r}"


def batch_chunk(packed: PackedRows) -> Chunk:
    """A one-step Chunk of packed rows, built as the reader builds one: float64 logprobs, mask = (value == 1),
    logprobs zeroed where the mask is 0 (so fill values there never enter a sum)."""
    device = packed.trainer.device
    mask = packed.mask == 1
    trainer = packed.trainer.to(torch.float64).masked_fill(~mask, 0.0)
    rollout = packed.rollout.to(torch.float64).masked_fill(~mask, 0.0)
    rows = packed.rows
    return Chunk(
        step=torch.full((rows,), BATCH_STEP, dtype=torch.int64, device=device),
        offsets=packed.offsets.to(device),
        trainer=trainer,
        rollout=rollout,
        mask=mask,
        sample_id=[str(row) for row in range(rows)],
        file=["<batch>"] * rows,
        file_row=list(range(rows)),
        token_ids=None,
        float32=any(values.dtype.itemsize <= 4 for values in (packed.trainer, packed.rollout)),
    )


def compute_metrics(
    old_log_probs: Any,
    rollout_log_probs: Any,
    response_mask: Any,
    *,
    presets: Sequence[str | Preset] | None = None,
    lengths: Any = None,
    padding_side: str = "right",
    max_rounds: int = DEFAULT_MAX_ROUNDS,
    catastrophic: float = DEFAULT_CATASTROPHIC,
    sample_ids: Any = None,
    token_ids: Any = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, float]:
    """The mismatch metrics of one batch of padded [B, L] tensors, as a flat dict of verl-named floats ready for
    a logger: METRICS.md §1, §5, §6, §7 and, with ``presets``, each preset's §2/§3 keys as ``<preset>/<key>``.

    Equal to what ``analyze`` gives for the same batch after ``DumpWriter.write_step`` + read (float32 storage
    holds bf16/fp16/fp32 logprobs exactly; float64 tensors need ``DumpWriter(logprob_type="float64")``).
    Tensors may be of any float dtype (upcast to float64) on any device; the work stays on that device.
    Padding: right by default, a row ending at its last non-zero mask position unless ``lengths`` are given
    (``padding_side="left"`` for right-aligned rows, as SkyRL's). Accepts a hook's output as keywords
    (``compute_metrics(**from_verl_batch(batch))``). Raises ConfigError for programmer errors.
    """
    metrics = BatchMetrics(presets, max_rounds=max_rounds, catastrophic=catastrophic)
    metrics.update(
        old_log_probs,
        rollout_log_probs,
        response_mask,
        lengths=lengths,
        padding_side=padding_side,
        sample_ids=sample_ids,
        token_ids=token_ids,
        extra=extra,
    )
    return metrics.compute()


# --------------------------------------------------------------------------- hooks (duck typing)
def unique_sample_ids(prompt_ids: Sequence[Any]) -> list[str]:
    """``<id>#<k>``: the k-th row (in batch order) that carries prompt id ``<id>``. GRPO's n responses share
    their prompt's id (verl's ``uid``, SkyRL's ``uids``); the suffix makes every row's id unique in the step."""
    seen: dict[str, int] = {}
    ids = []
    for value in prompt_ids:
        text = str(value)
        k = seen.get(text, 0)
        seen[text] = k + 1
        ids.append(f"{text}#{k}")
    return ids


def from_verl_batch(batch: Any) -> dict[str, Any]:
    """The keyword arguments of ``DumpWriter.write_step`` (and ``compute_metrics``) from a verl ``DataProto``
    (or anything with a ``.batch`` mapping and a ``.non_tensor_batch`` dict, or a plain mapping).

    Reads ``old_log_probs``, ``rollout_log_probs``, ``response_mask`` (right padded); row lengths from the
    response part of ``attention_mask`` (environment tokens after the last model token stay); sample ids
    from ``non_tensor_batch["uid"]`` made unique per row (:func:`unique_sample_ids`); token ids from
    ``responses``; and, when the batch already has them, ``reward`` (row sum of ``token_level_scores``) and
    ``advantage`` (masked row mean of ``advantages``) as extra columns. Raises ConfigError for a missing tensor.
    """
    tensors = getattr(batch, "batch", batch)
    non_tensor = getattr(batch, "non_tensor_batch", None) or {}
    keys = set(tensors.keys())
    _require(
        keys,
        {TRAINER: "recompute old_log_probs (verl's decoupled mode) before the hook", ROLLOUT: _VERL_ROLLOUT, MASK: ""},
        "verl",
    )
    mask = tensors[MASK]
    rows, width = mask.shape
    out: dict[str, Any] = {TRAINER: tensors[TRAINER], ROLLOUT: tensors[ROLLOUT], MASK: mask}
    if "attention_mask" in keys:
        out["lengths"] = tensors["attention_mask"][:, -width:].sum(-1)
    if "uid" in non_tensor:
        out["sample_ids"] = unique_sample_ids(list(non_tensor["uid"]))
    if "responses" in keys and tuple(tensors["responses"].shape) == (rows, width):
        out["token_ids"] = tensors["responses"]
    extra = {}
    if "token_level_scores" in keys:
        extra["reward"] = tensors["token_level_scores"].sum(-1)
    if "advantages" in keys:
        extra["advantage"] = _masked_row_mean(tensors["advantages"], mask)
    if extra:
        out["extra"] = extra
    return out


_VERL_ROLLOUT = "turn on actor_rollout_ref.rollout.calculate_log_probs=True"


def from_skyrl_batch(batch: Any) -> dict[str, Any]:
    """The keyword arguments of ``DumpWriter.write_step`` (and ``compute_metrics``) from SkyRL's
    ``TrainingInputBatch`` (a dict of tensors with a ``.metadata`` dict, or a plain mapping).

    Reads ``action_log_probs``, ``rollout_logprobs`` and ``loss_mask``. SkyRL right-aligns response tensors
    (left padding): the side is read from ``response_mask`` (left when every row ends with a response token)
    and row lengths are its row sums. The rows SkyRL appends to fill data-parallel shards
    (``metadata["pad_size"]``, mask all 0) are dropped. Sample ids from ``metadata["uids"]`` made unique per
    row; token ids from the response part of ``sequences``; ``reward`` (row sum of ``rewards``) and
    ``advantage`` (masked row mean of ``advantages``) when present. Raises ConfigError for a missing tensor.
    """
    metadata = getattr(batch, "metadata", None) or {}
    keys = {key for key in batch if batch[key] is not None}
    _require(
        keys,
        {
            "action_log_probs": "SkyRL skipped the policy forward pass (a loss that reads only rollout logprobs); "
            "call the hook after fwd_logprobs_values_reward with a loss that recomputes them",
            "rollout_logprobs": "the generator returned no rollout logprobs (enable sampling logprobs)",
            "loss_mask": "",
        },
        "SkyRL",
    )
    mask = batch["loss_mask"]
    rows = int(mask.shape[0]) - int(metadata.get("pad_size", 0) or 0)
    width = int(mask.shape[1])

    def real(tensor: torch.Tensor) -> torch.Tensor:
        return tensor[:rows]

    out: dict[str, Any] = {
        TRAINER: real(batch["action_log_probs"]),
        ROLLOUT: real(batch["rollout_logprobs"]),
        MASK: real(mask),
        "padding_side": "left",
    }
    if "response_mask" in keys:
        response_mask = real(batch["response_mask"])
        out["lengths"] = (response_mask != 0).sum(-1)
        out["padding_side"] = "left" if bool((response_mask[:, -1] != 0).all()) else "right"
    uids = metadata.get("uids")
    if uids is not None:
        out["sample_ids"] = unique_sample_ids(list(uids)[:rows])
    if "sequences" in keys and batch["sequences"].shape[1] >= width and out["padding_side"] == "left":
        out["token_ids"] = real(batch["sequences"][:, -width:])  # responses sit at the end of each sequence
    extra = {}
    if "rewards" in keys:
        extra["reward"] = real(batch["rewards"]).sum(-1)
    if "advantages" in keys:
        extra["advantage"] = _masked_row_mean(real(batch["advantages"]), real(mask))
    if extra:
        out["extra"] = extra
    return out


def _require(keys: set[str], needed: Mapping[str, str], trainer: str) -> None:
    for key, hint in needed.items():
        if key not in keys:
            raise ConfigError(f"{trainer} batch: no tensor '{key}'{'; ' + hint if hint else ''}.")


def _masked_row_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    weights = (mask != 0).to(torch.float64)
    return (values.to(torch.float64) * weights).sum(-1) / weights.sum(-1).clamp(min=1.0)


__all__ = [
    "BatchMetrics",
    "StateSlice",
    "compute_metrics",
    "from_skyrl_batch",
    "from_verl_batch",
    "unique_sample_ids",
]
