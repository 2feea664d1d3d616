"""prime-rl token export (``trainer.enable_token_export = true``).

Read from PrimeIntellect-ai/prime-rl at commit 559b44772e471d1538537b8805cc77f3824a5e64:
- ``src/prime_rl/trainer/rl/token_export.py``: ``<output_dir>/token_exports/step_<step>/rank_<rank>.jsonl``,
  one JSON object per exported sequence (packed micro-batches already split, right padding trimmed),
  written with ``allow_nan=False`` after turning every non-finite float into ``null``. Fields used here:
  ``step``, ``rank``, ``export_sequence_idx`` (per (step, rank) file), ``token_ids``, ``loss_mask`` (bools),
  ``inference_logprobs``, ``trainer_logprobs`` and the optional weight streams ``rl_weights`` /
  ``ref_kl_weights`` (lists of null when absent). Records cover the prompt too; there the inference
  logprobs are 0.0.
- ``mark_stable`` touches ``STABLE`` in a step directory after every rank flushed (``train.py``): a step
  directory without it is still being written and is left out.
- ``src/prime_rl/trainer/rl/train.py``: the tokens whose mismatch is measured are
  ``loss_mask & (rl_weights != 0 | ref_kl_weights != 0)`` when a weight stream is present, else
  ``loss_mask``; that is the mask used here. Steps are the trainer's ``progress.step`` (1-based).

A ``null`` logprob on a trained token makes its row invalid (skipped and counted, like NaN in Parquet).

Two per-row fields ride along for the prime-rl dialect (``metrics/dialects/prime_rl.py``) and ``convert``:
``env_name`` (the record's, for ``mismatch_kl/<env>``) and ``advantage``, the ``advantages`` value at the row's
trained tokens when they share one sign (0.0 for a row without trained tokens): only the sign enters
``default_loss_fn``'s DPPO rule (``loss.py``: ``torch.where(advantages > 0, high, low)``), so a sign-consistent
row is exact; a row whose trained tokens carry advantages of different signs, or without a full list of
numbers, has none (null) and is left out of the DPPO values.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from rollout_diag.io.formats.base import (
    FastLines,
    ParsedLines,
    Row,
    RowsFile,
    canonical_batch,
    jsonl_file,
    list_lengths,
    null_flags,
    number_in,
    row_any,
    row_count,
)
from rollout_diag.io.formats.registry import TrainerFormat, register
from rollout_diag.paths import natural_key

NAME = "prime-rl"
STABLE_MARKER = "STABLE"
FILE_GLOB = "rank_*.jsonl"
REQUIRED_FIELDS = ("inference_logprobs", "trainer_logprobs", "loss_mask")
EXTRA = pa.schema([("advantage", pa.float64()), ("env_name", pa.string())])  # per-row fields carried along


def looks_like(record: dict[str, Any]) -> bool:
    """A first JSON record of this format: the two logprob fields side by side, not batch-wrapped."""
    return all(field in record for field in REQUIRED_FIELDS) and not _wrapped(record.get("loss_mask"))


def _wrapped(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and isinstance(value[0], list)


def step_of(path: Path) -> int | None:
    """The step of a ``step_<N>/rank_<R>.jsonl`` file, from its directory name."""
    return number_in(path.parent.name, r"^step_(\d+)$")


def open_file(path: str, fast: bool = True) -> RowsFile:
    """The file's rows; ``fast=False`` reads every line with Python's json (the reference the fast path equals)."""
    # the step in the file name is the fallback for records that do not carry their own
    return jsonl_file(path, step_of(Path(path)) or 0, _row, FAST if fast else None, EXTRA)


def _row(line: str, line_index: int, fallback_step: int) -> Row:
    sample_id = f"line{line_index + 1}"
    if not line.strip():
        return Row.unreadable(fallback_step, sample_id, "blank line")
    try:
        record = json.loads(line)
    except ValueError as exc:
        return Row.unreadable(fallback_step, sample_id, f"not JSON ({exc.args[0] if exc.args else exc})")
    if not isinstance(record, dict):
        return Row.unreadable(fallback_step, sample_id, "not a JSON object")
    step = record.get("step", fallback_step)
    if not isinstance(step, int) or isinstance(step, bool):  # true is no step (Arrow refused it mid-batch)
        return Row.unreadable(fallback_step, sample_id, f"step {step!r} is not an integer", "step")
    rank, index = record.get("rank"), record.get("export_sequence_idx")
    if rank is not None and index is not None:
        sample_id = f"rank{rank}-{index}"
    for field in REQUIRED_FIELDS:
        if not isinstance(record.get(field), list):
            return Row.unreadable(step, sample_id, "missing" if field not in record else "not a list", field)
    try:
        mask = _trained_tokens(record)
    except (TypeError, ValueError):
        return Row.unreadable(step, sample_id, "loss_mask or a weight stream holds non-numbers", "loss_mask")
    token_ids = record.get("token_ids")
    env = record.get("env_name")
    return Row(
        step=step,
        sample_id=sample_id,
        rollout=record["inference_logprobs"],
        trainer=record["trainer_logprobs"],
        mask=mask,
        token_ids=token_ids if isinstance(token_ids, list) else None,
        extra={
            "advantage": _advantage(record.get("advantages"), mask),
            "env_name": env if isinstance(env, str) else None,
        },
    )


def _advantage(values: Any, mask: np.ndarray) -> float | None:
    """The row's advantage at its trained tokens when their signs agree, 0.0 without trained tokens, else None."""
    if not isinstance(values, list) or len(values) != len(mask):
        return None
    if not all(isinstance(value, (int, float)) and not isinstance(value, bool) for value in values):
        return None
    trained = [float(values[int(token)]) for token in np.flatnonzero(mask)]
    if not trained:
        return 0.0
    signs = {(value > 0) - (value < 0) for value in trained}
    return trained[0] if len(signs) == 1 else None


def _trained_tokens(record: dict[str, Any]) -> np.ndarray:
    """``loss_mask`` narrowed to tokens with sampling logprobs, as prime-rl's train.py measures mismatch."""
    loss_mask = np.asarray(record["loss_mask"], dtype=bool)

    def stream(name: str) -> np.ndarray | None:
        values = record.get(name)
        if not isinstance(values, list) or all(v is None for v in values):
            return None  # written as a list of nulls when the stream is absent
        weights = np.asarray(values, dtype=float)
        return weights if weights.shape == loss_mask.shape else None  # ragged: the reader names the row

    rl_weights, ref_kl_weights = stream("rl_weights"), stream("ref_kl_weights")
    if rl_weights is None and ref_kl_weights is None:
        return loss_mask.astype(np.int8)
    sampled = (rl_weights != 0) if rl_weights is not None else loss_mask.copy()
    if ref_kl_weights is not None:
        sampled |= ref_kl_weights != 0
    return (loss_mask & sampled).astype(np.int8)


# ------------------------------------------------------------------ the fast path (io/formats/base.py FastLines)
_WEIGHTS = ("rl_weights", "ref_kl_weights")
_FAST_SCHEMA = pa.schema(
    [
        ("step", pa.int64()),
        ("rank", pa.int64()),
        ("export_sequence_idx", pa.int64()),
        ("token_ids", pa.list_(pa.int64())),
        ("loss_mask", pa.list_(pa.bool_())),
        ("inference_logprobs", pa.list_(pa.float64())),
        ("trainer_logprobs", pa.list_(pa.float64())),
        ("rl_weights", pa.list_(pa.float64())),
        ("ref_kl_weights", pa.list_(pa.float64())),
        ("advantages", pa.list_(pa.float64())),
        ("env_name", pa.string()),
    ]
)


def _fast_rows(parsed: ParsedLines, fallback_step: int) -> tuple[pa.RecordBatch, np.ndarray]:
    """The rows ``_row`` would give, for the lines where that is certain (the others are left to ``_row``)."""
    columns = parsed.columns
    ok = ~parsed.written_null["step"]  # an explicit null step is "not an integer"
    for field in REQUIRED_FIELDS:
        ok &= parsed.present(field)
    ok &= ~row_any(columns["loss_mask"], null_flags(columns["loss_mask"].values))

    kept = parsed.filtered(ok)
    columns = kept.columns
    loss_mask = columns["loss_mask"].flatten().to_numpy(zero_copy_only=False).astype(bool)
    lengths = list_lengths(columns["loss_mask"])
    # as _trained_tokens: a weight stream counts in a row where it is a list of the loss mask's length
    # that is not all null (a null weight reads as NaN there, which is not 0); tokens of a row without an
    # rl stream count as sampled, a ref-KL stream adds its non-zero tokens
    sampled = loss_mask.copy()
    for field in _WEIGHTS:
        weights = columns[field]
        nulls = row_count(weights, null_flags(weights.values))
        present = (list_lengths(weights) == lengths) & (nulls < lengths)
        if not present.any():
            continue
        tokens = np.repeat(present, lengths)
        nonzero = weights.filter(pa.array(present)).flatten().fill_null(np.nan).to_numpy(zero_copy_only=False) != 0
        if field == "rl_weights":
            sampled[tokens] = nonzero
        else:
            sampled[tokens] |= nonzero
    trained = loss_mask & sampled
    mask = pa.ListArray.from_arrays(columns["loss_mask"].offsets, pa.array(trained.astype(np.int8)))
    steps = columns["step"].fill_null(fallback_step)
    ranks, indexes = columns["rank"].to_pylist(), columns["export_sequence_idx"].to_pylist()
    sample_ids = [
        f"line{line + 1}" if rank is None or index is None else f"rank{rank}-{index}"
        for rank, index, line in zip(ranks, indexes, kept.lines.tolist(), strict=True)
    ]
    batch = canonical_batch(
        steps,
        sample_ids,
        columns["inference_logprobs"],
        columns["trainer_logprobs"],
        mask,
        columns["token_ids"],
        [_advantages(columns["advantages"], lengths, trained), columns["env_name"]],
        EXTRA,
    )
    return batch, ok


def _advantages(values: pa.ListArray, lengths: np.ndarray, trained: np.ndarray) -> pa.Array:
    """As _advantage, for every row at once (``trained``: the rows' trained-token flags, concatenated).

    Work over the trained tokens only (not per token of the block): each row's trained tokens are a run of
    ``flatnonzero(trained)``, found by binary search of the row bounds; a row holds one sign where the sign does not
    change along its run."""
    full = (list_lengths(values) == lengths) & (row_count(values, null_flags(values.values)) == 0)
    if full.all():  # the usual block: every row's list is whole, its items in order
        numbers = values.flatten().to_numpy(zero_copy_only=False)
        counted = trained
    else:
        numbers = np.zeros(len(trained), dtype=np.float64)
        tokens = np.repeat(full, lengths)
        if full.any():
            numbers[tokens] = values.filter(pa.array(full)).flatten().to_numpy(zero_copy_only=False)
        counted = trained & tokens
    ends = np.cumsum(lengths)
    at = np.flatnonzero(counted)
    before, after = np.searchsorted(at, ends - lengths), np.searchsorted(at, ends)  # each row's run of ``at``
    has = after > before
    picked = numbers[at]
    sign = (picked > 0).astype(np.int8) - (picked < 0).astype(np.int8)  # NaN: 0, as (value > 0) - (value < 0)
    changes = np.flatnonzero(sign[1:] != sign[:-1])  # j: the sign changes from trained token j to j + 1
    mixed = np.zeros(len(lengths), dtype=bool)
    if len(changes):  # a change inside a row's run [before, after)
        mixed[has] = np.searchsorted(changes, after[has] - 1) > np.searchsorted(changes, before[has])
    first = np.zeros(len(lengths), dtype=np.float64)
    first[has] = picked[before[has]]
    return pa.array(first, pa.float64(), mask=~full | mixed)


FAST = FastLines(_FAST_SCHEMA, _fast_rows)


def stable_steps(files: list[Path], named: set[Path]) -> tuple[list[Path], list[str]]:
    """Keep files of step directories that carry the STABLE marker, and files the user named (with a warning when
    theirs lacks it); say which were left out."""
    kept, incomplete, warnings = [], set(), []
    for path in files:
        if (path.parent / STABLE_MARKER).exists():
            kept.append(path)
        elif path in named:
            kept.append(path)
            warnings.append(f"{path}: its directory has no STABLE marker; the step may be incomplete.")
        else:
            incomplete.add(path.parent)
    if incomplete:
        names = ", ".join(str(d) for d in sorted(incomplete, key=natural_key))
        warnings.append(
            f"{len(incomplete)} step director{'y' if len(incomplete) == 1 else 'ies'} without a STABLE marker "
            f"(still being written, or the run stopped mid-step) left out: {names}."
        )
    return kept, warnings


register(
    TrainerFormat(
        name=NAME,
        suffix=".jsonl",
        described="token_exports/step_N/rank_R.jsonl",
        step_of=step_of,
        open_file=lambda path, trust_pickle: open_file(path),
        order=10,
        by_name=lambda path: path.name.startswith("rank_") and step_of(path) is not None,
        by_content=lambda path, peek: peek.first_record is not None and looks_like(peek.first_record),
        select=stable_steps,
    )
)
