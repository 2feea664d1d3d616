"""``analyze --export-repro FILE``: the rows of the prompts that are extreme every time, as a JSON-lines fixture an
engine developer can replay (one row a line: the prompt, where the row is, its token ids, both logprobs, the mask);
``runs --export-repro FILE``: the same for the deterministic outliers across runs, each line naming its run too.

A second, targeted pass over the dump: the first pass keeps per prompt only a few numbers (``metrics/prompts.py``),
since which prompts qualify is known only once every row's score is (the worst 1 % threshold); keeping the tokens of
every row that might qualify would grow with the dump. This pass reads the dump again and keeps only the rows of the
listed prompts (at most ``MAX_ROWS_PER_PROMPT`` each, in reading order): memory bounded by 20 × 8 rows (``runs``:
50 × 8 rows a run, one run at a time).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rollout_diag.drivers.dump import reads_dump
from rollout_diag.drivers.passes import Inputs, Progress, open_reader, run_chunks
from rollout_diag.engine import arrays
from rollout_diag.io.chunk import Chunk
from rollout_diag.io.outputs import write_text
from rollout_diag.io.reader import DEFAULT_CHUNK_TOKENS
from rollout_diag.metrics.prompts import prompt_texts
from rollout_diag.results import AnalysisResult, prompt_label

if TYPE_CHECKING:
    from rollout_diag.drivers.dump import Dump
    from rollout_diag.results import RunsResult

MAX_ROWS_PER_PROMPT = 8


class _ReproRows:
    """Collects the rows of the wanted prompts (by key), at most MAX_ROWS_PER_PROMPT each."""

    def __init__(
        self, wanted: Mapping[int, str], steps: set[int] | None, fields: Mapping[str, Any] | None = None
    ) -> None:
        self.wanted = dict(wanted)
        self.steps = steps
        self.fields = dict(fields or {})  # set first in every line (``runs``: the run's name)
        self.rows: dict[int, list[dict[str, Any]]] = {key: [] for key in self.wanted}

    def update(self, chunk: Chunk) -> None:
        if chunk.prompt_key is None:
            return
        hits = np.flatnonzero(np.isin(chunk.prompt_key, np.fromiter(self.wanted, np.int64, len(self.wanted))))
        if hits.size == 0:
            return
        offsets = arrays.host(chunk.offsets)
        step = arrays.host(chunk.step)
        trainer, rollout, mask = arrays.host(chunk.trainer), arrays.host(chunk.rollout), arrays.host(chunk.mask)
        token_ids = None if chunk.token_ids is None else arrays.host(chunk.token_ids)
        version = None if chunk.policy_version is None else arrays.host(chunk.policy_version)
        text = prompt_texts(chunk)  # the id's text where the listing had only the key (no example row carried it)
        for row in hits.tolist():
            key = int(chunk.prompt_key[row])
            kept = self.rows[key]
            if len(kept) >= MAX_ROWS_PER_PROMPT or (self.steps is not None and int(step[row]) not in self.steps):
                continue
            begin, end = int(offsets[row]), int(offsets[row + 1])
            model = mask[begin:end].astype(bool)
            a, r = trainer[begin:end], rollout[begin:end]
            tokens = max(int(model.sum()), 0)
            score = abs(float(r[model].sum() - a[model].sum())) / (tokens + 1e-8)
            kept.append(
                {
                    **self.fields,
                    "prompt": text(row) or self.wanted[key],
                    "prompt_key": prompt_label(key),
                    "step": int(step[row]),
                    "policy_version": None if version is None else int(version[row]),
                    "sample_id": chunk.sample_id[row],
                    "file": chunk.file[row],
                    "row": int(chunk.file_row[row]),
                    "row_score": score,
                    "token_ids": None if token_ids is None else token_ids[begin:end].tolist(),
                    "rollout_log_probs": r.tolist(),
                    "old_log_probs": a.tolist(),
                    "response_mask": model.astype(np.int8).tolist(),
                }
            )

    def lines(self) -> list[str]:
        ordered = [row for key in self.wanted for row in self.rows[key]]
        return [json.dumps(row, allow_nan=False) for row in ordered]


@reads_dump
def repro_lines(
    inputs: Inputs,
    wanted: Mapping[int, str],
    *,
    steps: set[int] | None = None,
    fields: Mapping[str, Any] | None = None,
    columns: Mapping[str, str] | None = None,
    strict: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    progress: Progress | None = None,
) -> list[str]:
    """The JSON lines of the rows of the prompts ``wanted`` (key → id text) in ``inputs`` (in ``steps`` when given;
    ``fields`` first in each line), at most MAX_ROWS_PER_PROMPT a prompt, in the order of ``wanted`` then reading
    order; reads ``inputs`` only when ``wanted`` has a prompt. Raises RolloutDiagError for bad input."""
    collected = _ReproRows(wanted, steps, fields)
    if wanted:
        reader = open_reader(inputs, columns, strict=strict, chunk_tokens=chunk_tokens)
        run_chunks(reader, [collected.update], "cpu", progress)
    return collected.lines()


@reads_dump
def export_repro(
    inputs: Inputs,
    path: str | Path,
    result: AnalysisResult,
    *,
    columns: Mapping[str, str] | None = None,
    strict: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    progress: Progress | None = None,
) -> int:
    """Write the rows of ``result``'s prompts that are extreme every time (``result.prompts.extreme``) to the
    JSON-lines file ``path`` (atomically; mask-0 tokens carry 0.0 logprobs, as the reader zeroes them), reading
    ``inputs`` once more. Returns the rows written (0, and an empty file, when no prompt is listed).

    Raises RolloutDiagError for bad input (ConfigError when ``path`` cannot be written)."""
    listed = [] if result.prompts is None else result.prompts.extreme
    wanted = {_key(item.key): item.prompt for item in listed}
    steps = {step.step for step in result.steps if step.step is not None} or None
    lines = repro_lines(
        inputs, wanted, steps=steps, columns=columns, strict=strict, chunk_tokens=chunk_tokens, progress=progress
    )
    write_text(path, "".join(line + "\n" for line in lines))
    return len(lines)


def export_runs_repro(runs: Sequence[tuple[str, Dump]], path: str | Path, result: RunsResult) -> int:
    """Write the rows of ``result``'s deterministic outliers across runs (``result.prompts.listed``) in every run
    that has them to the JSON-lines file ``path`` (atomically): one line a row, ``run`` first, then what
    ``analyze --export-repro`` writes; run after run in the order of ``runs`` (name, its dump), each read once more
    (only a run holding a listed prompt). Returns the rows written (0, and an empty file, when none is listed).

    Raises RolloutDiagError for bad input (ConfigError when ``path`` cannot be written)."""
    listed = [] if result.prompts is None else result.prompts.listed
    lines: list[str] = []
    for name, dump in runs:
        wanted = {_key(item.key): item.prompt for item in listed if item.cell(name) is not None}
        lines.extend(repro_lines(dump, wanted, fields={"run": name}))
    write_text(path, "".join(line + "\n" for line in lines))
    return len(lines)


def _key(text: str) -> int:
    """A prompt key back from its 16 hex digits (``prompt_label``), as the signed int64 the chunks carry."""
    value = int(text, 16)
    return value - (1 << 64) if value >= 1 << 63 else value
