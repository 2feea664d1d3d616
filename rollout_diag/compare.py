"""Every rollout-correction preset on one dump, side by side, in one streaming pass (issue 4).

``compare_presets`` reads the dump once: per chunk the off-policy family (METRICS.md §1) and one shared
:class:`~rollout_diag.metrics.correction.ChunkDivergences` feeding every preset's §2/§3/§8 accumulators
(and, if asked, the per-row decision file). Results are plain dataclasses; ``to_json()`` gives the
documented JSON.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rollout_diag.dump import reads_dump
from rollout_diag.engine import (
    Inputs,
    Progress,
    build_result,
    check_targets,
    open_reader,
    resolve_device,
    run_chunks,
)
from rollout_diag.errors import ConfigError, InputError, option_name
from rollout_diag.io.reader import DEFAULT_CHUNK_TOKENS
from rollout_diag.io.writer import RowTableWriter
from rollout_diag.metrics.correction import ChunkDivergences
from rollout_diag.metrics.legacy import legacy_weights
from rollout_diag.metrics.outcome import DropRule
from rollout_diag.metrics.sweep import DEFAULT_TARGETS, sweep_tables
from rollout_diag.presets import Preset, get_presets
from rollout_diag.results import SCHEMA_VERSION, AnalysisResult, SkippedRow, StepResult

# A preset is "intrusive" (highlighted) when, over the run, it would drop more than this share of model
# tokens (RS rejection, IcePop zero weights, legacy mask/veto) ...
INTRUSIVE_REJECTED_FRACTION = 0.10
# ... or its IS weights leave an effective sample size (rollout_is_eff_sample_size) below this.
INTRUSIVE_MIN_ESS = 0.5
OFFPOLICY_PREFIX = "rollout_corr/"


@dataclass(frozen=True)
class PresetResult:
    """One preset: its settings, §1 + §2/§3 (or §8) + ``summary/`` metrics per step and for the run."""

    name: str
    config: dict[str, Any]
    mode: str
    steps: list[StepResult]
    run: StepResult
    intrusive_reasons: tuple[str, ...] = ()

    @property
    def intrusive(self) -> bool:
        return bool(self.intrusive_reasons)


@dataclass(frozen=True)
class ComparisonResult:
    """What ``compare_presets`` found; ``to_json()`` is the documented JSON. ``sweep`` is filled by the sweep."""

    inputs: list[str]
    columns: dict[str, str]
    presets: list[PresetResult]
    warnings: list[str] = field(default_factory=list)
    skipped: list[SkippedRow] = field(default_factory=list)
    skipped_rows: int = 0
    layout: str = ""
    device: str = ""
    sweep: list[dict[str, Any]] = field(default_factory=list)
    intrusive_rejected_fraction: float = INTRUSIVE_REJECTED_FRACTION
    intrusive_min_ess: float = INTRUSIVE_MIN_ESS

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> ComparisonResult:
        """Inverse of ``to_json`` (``compare-presets --format json``); raises InputError for another document."""
        try:
            presets = [
                PresetResult(
                    name=item["name"],
                    config=item["config"],
                    mode=item["mode"],
                    steps=[StepResult.from_json(step) for step in item["steps"]],
                    run=StepResult.from_json(item["run"]),
                    intrusive_reasons=tuple(item.get("intrusive_reasons", ())),
                )
                for item in document["presets"]
            ]
            intrusive = document.get("intrusive", {})
            return cls(
                inputs=document["inputs"],
                columns=document["columns"],
                presets=presets,
                warnings=document.get("warnings", []),
                skipped=[SkippedRow(**item) for item in document.get("skipped", [])],
                skipped_rows=document.get("skipped_rows", 0),
                layout=document.get("layout", ""),
                device=document.get("device", ""),
                sweep=document.get("sweep", []),
                intrusive_rejected_fraction=intrusive.get("rejected_fraction", INTRUSIVE_REJECTED_FRACTION),
                intrusive_min_ess=intrusive.get("min_ess", INTRUSIVE_MIN_ESS),
            )
        except (KeyError, TypeError) as exc:
            raise InputError(f"not a `compare-presets --format json` result (missing {exc}).") from exc

    def preset(self, name: str) -> PresetResult:
        """The result of preset ``name``; raises KeyError."""
        for result in self.presets:
            if result.name == name:
                return result
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "inputs": list(self.inputs),
            "columns": dict(self.columns),
            "layout": self.layout,
            "device": self.device,
            "intrusive": {"rejected_fraction": self.intrusive_rejected_fraction, "min_ess": self.intrusive_min_ess},
            "presets": [
                {
                    "name": preset.name,
                    "mode": preset.mode,
                    "config": dict(preset.config),
                    "intrusive": preset.intrusive,
                    "intrusive_reasons": list(preset.intrusive_reasons),
                    "steps": [step.to_json() for step in preset.steps],
                    "run": preset.run.to_json(),
                }
                for preset in self.presets
            ],
            "sweep": list(self.sweep),
            "warnings": list(self.warnings),
            "skipped": [asdict(s) for s in self.skipped],
            "skipped_rows": self.skipped_rows,
        }


def resolve_presets(presets: Sequence[str | Preset] | None) -> list[Preset]:
    """None -> every built-in preset; names (and groups) are looked up; Preset objects pass as they are.
    Raises ConfigError for an unknown name or two presets with one name."""
    if presets is None:
        return get_presets(None)
    chosen: list[Preset] = []
    for item in presets:
        chosen.extend([item] if isinstance(item, Preset) else get_presets([item]))
    unique: dict[str, Preset] = {}
    for preset in chosen:
        if preset.name in unique and unique[preset.name] != preset:
            raise ConfigError(f"preset '{preset.name}' is given twice with different settings; rename one.")
        unique[preset.name] = preset
    if not unique:
        raise ConfigError("no preset chosen.", hint=f"leave out {option_name('presets')} to compare all presets.")
    return list(unique.values())


@reads_dump
def compare_presets(
    inputs: Inputs,
    presets: Sequence[str | Preset] | None = None,
    *,
    columns: Mapping[str, str] | None = None,
    device: str | torch.device = "auto",
    strict: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    progress: Progress | None = None,
    export_decisions_to: str | Path | None = None,
    targets: Sequence[float] = DEFAULT_TARGETS,
    intrusive_rejected_fraction: float = INTRUSIVE_REJECTED_FRACTION,
    intrusive_min_ess: float = INTRUSIVE_MIN_ESS,
    workers: int = 1,
    backend: str = "process",
) -> ComparisonResult:
    """Every chosen preset's §1, §2/§3 (or §8) and ``summary/`` metrics per step and for the run, and the
    threshold sweep (``sweep``: the run-level table of rollout_diag.metrics.sweep), in one pass.

    ``presets``: names, groups (``all``, ``verl``, ``legacy``) or Preset objects; None = every built-in
    preset. ``export_decisions_to``: also write the per-row decisions (see :func:`export_decisions`).
    Raises RolloutDiagError (InputError, ColumnError, DataError, ConfigError) for bad input or options.
    """
    _, comparison = _one_pass(
        inputs,
        presets,
        {"offpolicy_only": True},
        columns=columns,
        device=device,
        strict=strict,
        chunk_tokens=chunk_tokens,
        progress=progress,
        export_decisions_to=export_decisions_to,
        targets=targets,
        intrusive=(intrusive_rejected_fraction, intrusive_min_ess),
        workers=workers,
        backend=backend,
    )
    return comparison


@reads_dump
def analyze_and_compare(
    inputs: Inputs,
    presets: Sequence[str | Preset] | None = None,
    *,
    columns: Mapping[str, str] | None = None,
    device: str | torch.device = "auto",
    strict: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    progress: Progress | None = None,
    targets: Sequence[float] = DEFAULT_TARGETS,
    workers: int = 1,
    backend: str = "process",
    analysis_options: Mapping[str, Any] | None = None,
    intrusive_rejected_fraction: float = INTRUSIVE_REJECTED_FRACTION,
    intrusive_min_ess: float = INTRUSIVE_MIN_ESS,
    dialect: str | Sequence[str] = "verl",
) -> tuple[AnalysisResult, ComparisonResult]:
    """``analyze`` and ``compare_presets`` in one pass over the data (what ``rollout-diag report`` shows).

    ``analysis_options``: ``analyze``'s knobs (``max_rounds``, ``catastrophic``, ``top_k``) for the analysis part;
    ``dialect`` as for ``analyze`` (the report shows a section for dialects other than verl).
    """
    from rollout_diag.metrics.dialects import resolve

    return _one_pass(
        inputs,
        presets,
        {**(analysis_options or {}), "dialects": resolve(dialect)},
        columns=columns,
        device=device,
        strict=strict,
        chunk_tokens=chunk_tokens,
        progress=progress,
        export_decisions_to=None,
        targets=targets,
        intrusive=(intrusive_rejected_fraction, intrusive_min_ess),
        workers=workers,
        backend=backend,
    )


def _one_pass(
    inputs: Inputs,
    presets: Sequence[str | Preset] | None,
    options: Mapping[str, Any],
    *,
    columns: Mapping[str, str] | None,
    device: str | torch.device,
    strict: bool,
    chunk_tokens: int,
    progress: Progress | None,
    export_decisions_to: str | Path | None,
    targets: Sequence[float],
    intrusive: tuple[float, float],
    workers: int = 1,
    backend: str = "process",
) -> tuple[AnalysisResult, ComparisonResult]:
    """analysis (with ``options``) + every preset + the sweep over the data, serially or on workers."""
    from rollout_diag.distributed import PassSpec, check_workers, run_parts

    check_workers(workers, backend)
    chosen = resolve_presets(presets)
    checked_targets = check_targets(targets)
    torch_device = resolve_device(device)
    reader = open_reader(inputs, columns, strict=strict, chunk_tokens=chunk_tokens)
    spec = PassSpec(options, chosen)
    if workers > 1:
        if export_decisions_to is not None:
            raise ConfigError(
                f"{option_name('export_decisions_to')} writes one file from one process: leave out "
                f"{option_name('workers')}."
            )
        state = run_parts(reader, workers, backend, torch_device, spec, progress)
    else:
        state = spec.new()
        writer = None if export_decisions_to is None else DecisionWriter(export_decisions_to, chosen)
        consumers = state.consumers()
        if writer is not None:
            consumers.append(lambda chunk: writer.write(ChunkDivergences.of(chunk)))
        with writer or contextlib.nullcontext():
            run_chunks(reader, consumers, torch_device, progress, state.analysis.prepare)
    base = build_result(state.analysis, reader.log, torch_device, strict)
    sweep, corrections = state.sweep, state.corrections
    results = []
    finalized = corrections.finalize()
    for preset in chosen:
        step_metrics, run_metrics = finalized[preset.name]
        steps = [_with_metrics(step, step_metrics.get(step.step, {})) for step in base.steps]
        run = _with_metrics(base.run, run_metrics)
        results.append(
            PresetResult(
                name=preset.name,
                config=preset.config(),
                mode=preset.mode,
                steps=steps,
                run=run,
                intrusive_reasons=intrusive_reasons(run.metrics, *intrusive),
            )
        )
    comparison = ComparisonResult(
        inputs=base.inputs,
        columns=base.columns,
        presets=results,
        warnings=base.warnings,
        skipped=base.skipped,
        skipped_rows=base.skipped_rows,
        layout=base.layout,
        device=base.device,
        sweep=sweep_tables(sweep, checked_targets)[0],
        intrusive_rejected_fraction=intrusive[0],
        intrusive_min_ess=intrusive[1],
    )
    return base, comparison


def _with_metrics(offpolicy: StepResult, metrics: Mapping[str, float]) -> StepResult:
    """The step's §1 metrics (``rollout_corr/`` keys only) followed by the preset's own."""
    own = {name: value for name, value in offpolicy.metrics.items() if name.startswith(OFFPOLICY_PREFIX)}
    return StepResult(offpolicy.step, offpolicy.rows, offpolicy.tokens, {**own, **metrics}, offpolicy.empty_rows)


def intrusive_reasons(
    metrics: Mapping[str, float],
    rejected_fraction: float = INTRUSIVE_REJECTED_FRACTION,
    min_ess: float = INTRUSIVE_MIN_ESS,
) -> tuple[str, ...]:
    """Why a preset's run metrics make it intrusive: too many tokens dropped, or too low an ESS."""
    reasons = []
    dropped = metrics.get("summary/rejected_token_fraction")
    if dropped is not None and dropped > rejected_fraction:
        reasons.append(f"drops {dropped:.1%} of model tokens (> {rejected_fraction:.0%})")
    for key in ("rollout_corr/rollout_is_eff_sample_size", "mismatch/rollout_is_eff_sample_size"):
        ess = metrics.get(key)
        if ess is not None and not math.isnan(ess) and ess < min_ess:
            reasons.append(f"IS effective sample size {ess:.3g} (< {min_ess:g})")
    return tuple(reasons)


# --------------------------------------------------------------------------------- decisions file
class DecisionWriter:
    """Streams, per preset and row, what the preset would do to the row, into one Parquet file.

    Columns: preset, step, sample_id, file, file_row, tokens (model tokens n_i), tokens_rejected (RS
    rejection, IcePop zero weights, legacy mask/veto), kept (no model token rejected), is_weight (R_i[w]
    before batch normalisation; legacy: of the raw w; null without IS), and ``stat_<option>`` per RS option
    of any chosen preset: the row value v_i (§3: S_i[k], R_i[k], max; R_i[k] for token options), null for
    presets without that option. The Parquet side is io.writer.RowTableWriter.
    """

    def __init__(self, path: str | Path, presets: Sequence[Preset]) -> None:
        self.path = Path(path)
        self.presets = list(presets)
        self.rules = [DropRule.of(preset) for preset in self.presets]
        self.options = list(dict.fromkeys(option.option for preset in self.presets for option in preset.rejection))
        self._file = RowTableWriter(
            self.path,
            [
                ("preset", "category"),
                ("step", "int64"),
                ("sample_id", "string"),
                ("file", "category"),
                ("file_row", "int64"),
                ("tokens", "int64"),
                ("tokens_rejected", "int64"),
                ("kept", "bool"),
                ("is_weight", "float64"),
                *[(f"stat_{option}", "float64") for option in self.options],
            ],
            setting=f"{option_name('export_decisions_to')}",
        )
        self.rows_written = 0

    def write(self, shared: ChunkDivergences) -> None:
        """Append one chunk's rows for every preset."""
        chunk = shared.chunk
        rows = chunk.rows
        missing = np.full(rows, np.nan)
        parts: dict[str, list[Any]] = {name: [] for name in self._file.schema.names}
        for preset, rule in zip(self.presets, self.rules, strict=True):
            rejected_tokens = rule.kept_tokens(shared).map(torch.logical_not)
            rejected = shared.row_sum(rejected_tokens).round().to(torch.int64).cpu().numpy()
            statistics = {option.option: shared.rs_row_value(option) for option in preset.rejection}
            parts["preset"].append([preset.name] * rows)
            parts["step"].append(chunk.step.cpu().numpy())
            parts["sample_id"].append(chunk.sample_id)
            parts["file"].append(chunk.file)
            parts["file_row"].append(np.asarray(chunk.file_row, dtype=np.int64))
            parts["tokens"].append(shared.row_tokens.cpu().numpy())
            parts["tokens_rejected"].append(rejected)
            parts["kept"].append(rejected == 0)
            parts["is_weight"].append(self._row_weight(shared, preset, missing))
            for name in self.options:
                values = statistics.get(name)
                parts[f"stat_{name}"].append(missing if values is None else values.cpu().numpy())
        self._file.write({name: _concatenate(pieces) for name, pieces in parts.items()})
        self.rows_written += rows * len(self.presets)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> DecisionWriter:
        return self

    def __exit__(self, error_type: type[BaseException] | None, *rest: Any) -> None:
        """Close the file; a pass that failed leaves no half-written file behind."""
        self._file.__exit__(error_type, *rest)

    def _row_weight(self, shared: ChunkDivergences, preset: Preset, missing: np.ndarray) -> np.ndarray:
        """R_i[w] of the preset's IS weights (legacy: of the raw w) before normalisation; NaN (null) without IS."""
        if preset.importance is not None:
            _, weight = shared.importance_weights(preset.importance)
        elif preset.legacy is not None:
            weight = legacy_weights(shared, preset.legacy.level)
        else:
            return missing
        return shared.row_mean(weight).cpu().numpy()


def _concatenate(pieces: list[Any]) -> np.ndarray:
    """One column from per-preset pieces; text stays as Python strings (object arrays)."""
    text = any(isinstance(piece, list) for piece in pieces)
    return np.concatenate([np.asarray(piece, dtype=object if text else None) for piece in pieces])


@reads_dump
def export_decisions(
    inputs: Inputs,
    path: str | Path,
    presets: Sequence[str | Preset] | None = None,
    *,
    columns: Mapping[str, str] | None = None,
    device: str | torch.device = "auto",
    strict: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    progress: Progress | None = None,
) -> int:
    """Write, per preset and row, whether the preset keeps the row and its statistics (columns: see
    :class:`DecisionWriter`) to the Parquet file ``path``, streaming. Returns the rows written.

    Raises RolloutDiagError for bad input or options (ConfigError when ``path`` cannot be written).
    """
    chosen = resolve_presets(presets)
    torch_device = resolve_device(device)
    reader = open_reader(inputs, columns, strict=strict, chunk_tokens=chunk_tokens)
    with DecisionWriter(path, chosen) as writer:
        run_chunks(reader, [lambda chunk: writer.write(ChunkDivergences.of(chunk))], torch_device, progress)
    return writer.rows_written
