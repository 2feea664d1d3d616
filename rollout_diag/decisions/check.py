"""``check``: gates on any metric of a run (and of every step), for CI.

A gate is ``metric ≤ value`` (``--max``) or ``metric ≥ value`` (``--min``). A metric is named in full, or by
the short name the tables print (``k3_kl`` for ``rollout_corr/k3_kl``) where only one metric has it. Metrics
are looked up by their full name in what ``analyze`` reports (verl names, ``per_round/round_<k>/…``,
``diag/…``), then in the step's ``dialects`` (``name`` or ``framework:name``) when the result carries them,
then among the key metrics computed from per-row sums (``token_mult_prob_error``), and the share of model tokens a
built-in preset drops, ``summary/rejected_token_fraction[PRESET]`` (as ``diff`` names it), from each row's count of
them. When such a preset has a k1 rejection with asymmetric bounds L_U (L·U ≠ 1), the result says in one line that
verl applies ρ ∈ [1/U, 1/L] and what [L, U] as written would reject (``K1Bounds``). Pure functions over result
objects: no file is read here.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from rollout_diag import catalogue
from rollout_diag.catalogue import EPS
from rollout_diag.decisions.rowmetrics import KEY_METRICS, RowMetric, by_step, rejected_share
from rollout_diag.decisions.skipped import SKIPPED_ROW_SHARE, SKIPPED_SHARE_LIMIT
from rollout_diag.errors import ConfigError, option_name
from rollout_diag.presets import PRESETS, Preset, parse_bounds
from rollout_diag.results import (
    SCHEMA_VERSION,
    AnalysisResult,
    Converted,
    GroupResult,
    MetricColumns,
    RowStats,
    StepResult,
    StepTable,
    json_number,
    repr_inputs,
    short_repr,
)
from rollout_diag.results.wording import k1_bounds_line

MAX, MIN = "max", "min"
PASS, FAIL, SKIP = "pass", "fail", "skipped"


@dataclass(frozen=True)
class Gate:
    """``metric`` ≤ ``limit`` (bound ``max``) or ≥ ``limit`` (bound ``min``); ``per_step`` None follows --per-step."""

    metric: str
    bound: str
    limit: float
    per_step: bool | None = None
    source: str = ""

    def describe(self) -> str:
        return f"{self.metric} {'≤' if self.bound == MAX else '≥'} {self.limit:g}"


# --gates default: each limit as its project applies it in CI (docs/gates.md gives the files and formulas).
DEFAULT_GATES: tuple[Gate, ...] = (
    Gate(
        catalogue.K3_KL.key,
        MAX,
        5e-4,
        per_step=True,
        source="prime-rl nightly band on mismatch_kl = token mean of exp(δ) − δ − 1 "
        "(tests/nightly/test_hendrycks_sanity.py MISMATCH_KL_MAX, PrimeIntellect-ai/prime-rl@559b447)",
    ),
    Gate(
        catalogue.ROLLOUT_KL_ABS.key,
        MAX,
        0.1,
        per_step=True,
        source="slime's CI assert on train/train_rollout_logprob_abs_diff = mean over sequences of the mean |δ| "
        "(--ci-train-rollout-logprob-abs-diff-threshold default, THUDM/slime@624b824)",
    ),
    Gate(
        catalogue.TOKEN_MULT_PROB_ERROR.key,
        MAX,
        1.05,
        per_step=True,
        source="NeMo-RL's test-suite bound on train/token_mult_prob_error = token mean of exp(|δ|) "
        "(tests/functional/grpo_megatron.sh: max(...) < 1.05, NVIDIA-NeMo/RL@7ea279a)",
    ),
)


# `check` gates the share of rows skipped as invalid unless told otherwise: a dump that lost half its rows must not
# pass on the half that was read (decisions/skipped.py). Judged on the run only: a step's share is not kept.
SKIPPED_GATE = Gate(
    SKIPPED_ROW_SHARE,
    MAX,
    SKIPPED_SHARE_LIMIT,
    per_step=False,
    source="rollout-diag's default: more than 1 % of the rows skipped as invalid (docs/gates.md, 'Skipped rows'); "
    "set it with --max skipped_row_share=VALUE; --strict makes any skipped row an error",
)
# ``check --exact``: no model token whose two logprobs differ in any bit (batch-invariant inference's gate, as slime's
# 1e-6 CI check but exact); a failure names the first differing token (drivers/check.py).
EXACT_GATE = Gate(
    catalogue.MISMATCHED_TOKENS.key,
    MAX,
    0.0,
    source="--exact: every model token's two logprobs bitwise equal (float32 where either column is)",
)


def with_skipped_gate(gates: Sequence[Gate]) -> list[Gate]:
    """``gates`` and, unless one of them names ``skipped_row_share``, the default SKIPPED_GATE after them."""
    if any(gate.metric == SKIPPED_ROW_SHARE for gate in gates):
        return list(gates)
    return [*gates, SKIPPED_GATE]


@dataclass(frozen=True)
class GateOutcome:
    """One gate on the run (``step`` None) or on one step: the value, pass / fail / skipped, and by how much."""

    gate: Gate
    step: int | None
    value: float | None
    status: str
    excess: float | None  # how far past the limit (> 0 on failure), in the metric's units
    group: str | None = None  # --by: the group of rows judged ("env_name=math"); None: all rows
    detail: str = ""  # what the value stands for, said after the message (the skipped rows and their reasons)

    @property
    def where(self) -> str:
        place = "run" if self.step is None else f"step {self.step}"
        return place if self.group is None else f"{self.group} {place}"

    def message(self) -> str:
        if self.status == SKIP and self.group is not None:
            return (
                f"{self.where}: {self.gate.metric} not reported for the group (no model token there, or not one of "
                "the key metrics computed per group)"
            )
        if self.status == SKIP:
            return f"{self.where}: {self.gate.metric} not reported (a step without model tokens)"
        shown = "NaN" if self.value is None or math.isnan(self.value) else f"{self.value:.6g}"
        if self.status == PASS:
            return f"{self.where}: {self.gate.metric} = {shown} (limit {self.gate.limit:g})"
        if self.excess is None:
            return f"{self.where}: {self.gate.metric} = {shown}: not a number, the gate cannot pass"
        side = "above" if self.gate.bound == MAX else "below"
        failed = f"{self.where}: {self.gate.metric} = {shown} is {self.excess:.3g} {side} the limit {self.gate.limit:g}"
        return f"{failed} ({self.detail})" if self.detail else failed


@dataclass(frozen=True)
class K1Bounds:
    """A gated preset's first k1 rejection option with asymmetric bounds L_U (L·U ≠ 1): verl keeps log L ≤ k1 ≤ log U
    with k1 = −log ρ, so it applies ρ ∈ [1/U, 1/L] (verl #6377; its numbers are the ones gated), and what that and ρ
    ∈ [L, U] as written reject of the run: a share of model tokens (Σ rejected / (N + 1e-8)) and of the rows with a
    model token (0 without one), as compare-presets' ``rollout_rs_<option>_masked_fraction``, ``_seq_masked_fraction``
    and ``summary/k1_as_written_*`` give them."""

    preset: str
    option: str
    threshold: str  # the option's bounds as written, "L_U"
    lower: float  # L
    upper: float  # U
    token_fraction: float  # verl's, ρ ∈ [1/U, 1/L]
    row_fraction: float
    as_written_token_fraction: float  # ρ ∈ [L, U]
    as_written_row_fraction: float
    line: str  # the one line compare-presets and the report print for the preset

    def to_json(self) -> dict[str, Any]:
        return {
            "preset": self.preset,
            "option": self.option,
            "threshold": self.threshold,
            "applied": [1.0 / self.upper, 1.0 / self.lower],
            "as_written": [self.lower, self.upper],
            "token_fraction": json_number(self.token_fraction),
            "row_fraction": json_number(self.row_fraction),
            "as_written_token_fraction": json_number(self.as_written_token_fraction),
            "as_written_row_fraction": json_number(self.as_written_row_fraction),
            "line": self.line,
        }


@dataclass(frozen=True)
class CheckResult:
    """Each gate's outcome on the run and, where asked, on every step (JSON: schemas/check.schema.json)."""

    inputs: list[str]
    gates: list[Gate]
    outcomes: list[GateOutcome]
    warnings: list[str] = field(default_factory=list)
    k1_bounds: list[K1Bounds] = field(default_factory=list)  # gated presets' asymmetric k1 bounds (issue 42)

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def failures(self) -> list[GateOutcome]:
        return [outcome for outcome in self.outcomes if outcome.status == FAIL]

    @property
    def failed_gates(self) -> list[Gate]:
        """The gates with at least one failed check (a gate checks the run, and per step or group many more)."""
        failed = {(outcome.gate.metric, outcome.gate.bound, outcome.gate.limit) for outcome in self.failures}
        return [gate for gate in self.gates if (gate.metric, gate.bound, gate.limit) in failed]

    def __repr__(self) -> str:
        failed = len(self.failures)
        return short_repr(
            "CheckResult",
            "passed" if failed == 0 else f"failed: {failed:,} of {len(self.outcomes):,} outcomes",
            f"{len(self.gates):,} gates",
            repr_inputs(self.inputs),
        )

    def to_json(self) -> dict[str, Any]:
        document = self.json_document()
        return {**document, "outcomes": list(document["outcomes"])}

    def json_document(self) -> dict[str, Any]:
        """``to_json`` with ``outcomes`` a sequence whose dicts are made when read (``render.export.json_pieces``
        writes them one by one: 600 000 outcomes of 200 000 steps are never held as dicts and one string)."""
        document = {
            "schema_version": SCHEMA_VERSION,
            "inputs": list(self.inputs),
            "passed": self.passed,
            "gates": [
                {
                    "metric": gate.metric,
                    "bound": gate.bound,
                    "limit": gate.limit,
                    "per_step": bool(gate.per_step),
                    "source": gate.source,
                }
                for gate in self.gates
            ],
            "outcomes": Converted(self.outcomes, _outcome_json),
            "failures": len(self.failures),
            "failed_gates": len(self.failed_gates),
            "warnings": list(self.warnings),
        }
        if self.k1_bounds:  # only where a gated preset has asymmetric k1 bounds
            document["k1_bounds"] = [bounds.to_json() for bounds in self.k1_bounds]
        return document


def _outcome_json(outcome: GateOutcome) -> dict[str, Any]:
    return {
        "metric": outcome.gate.metric,
        "bound": outcome.gate.bound,
        "limit": outcome.gate.limit,
        "step": outcome.step,
        "group": outcome.group,
        "value": json_number(outcome.value),
        "status": outcome.status,
        "excess": json_number(outcome.excess),
        "message": outcome.message(),
    }


# ----------------------------------------------------------------------------------------- gates
# A gate on the share of model tokens a built-in preset drops, named as ``diff`` names it (the prefix may be left out).
PRESET_SHARE = re.compile(r"^(?:summary/)?rejected_token_fraction\[([^\]]+)\]$")
# The suffixes of a preset's name under which the row statistics carry its asymmetric k1 option alone, as verl applies
# it and as written: ``RowStats.rejected`` keys that no preset has ('|' is not allowed in a preset's name).
K1_APPLIED, K1_AS_WRITTEN = "|k1 as applied", "|k1 as written"


def gate_presets(gates: Sequence[Gate]) -> list[Preset]:
    """The built-in presets whose dropped-token share a gate names (``summary/rejected_token_fraction[NAME]`` or
    ``rejected_token_fraction[NAME]``), once each, in the gates' order: the presets check's pass must count. Raises
    ConfigError when there is no gate, or for a name no built-in preset has (with the closest names)."""
    if not gates:
        raise ConfigError(
            "no gate given.",
            hint=f"add {option_name('max')} NAME=VALUE, {option_name('min')} NAME=VALUE or "
            f"{option_name('gates')} FILE|default.",
        )
    found: dict[str, Preset] = {}
    for gate in gates:
        match = PRESET_SHARE.match(gate.metric)
        if match is None:
            continue
        name = match.group(1)
        if name not in PRESETS:
            close = difflib.get_close_matches(name, list(PRESETS), n=3, cutoff=0.6)
            hint = f"did you mean {' or '.join(close)}?" if close else f"built-in presets: {', '.join(PRESETS)}."
            raise ConfigError(f"gate {gate.describe()}: no built-in preset '{name}'.", hint=hint)
        found.setdefault(name, PRESETS[name])
    return list(found.values())


def _preset_share_named(gate: Gate) -> Gate:
    """``gate`` with a preset's dropped-token share under its full name (``summary/rejected_token_fraction[NAME]``)."""
    match = PRESET_SHARE.match(gate.metric)
    if match is None:
        return gate
    return Gate(rejected_share(match.group(1)).name, gate.bound, gate.limit, gate.per_step, gate.source)


def _row_metrics(rows: RowStats | None, presets: Sequence[Preset]) -> tuple[RowMetric, ...]:
    """The metrics gateable from the row statistics: the key metrics, then each gated preset's dropped-token share
    (where the rows carry its count)."""
    if rows is None:
        return KEY_METRICS
    return (*KEY_METRICS, *(rejected_share(preset.name) for preset in presets if preset.name in rows.rejected))


def k1_bounds(presets: Sequence[Preset], rows: RowStats | None) -> list[K1Bounds]:
    """For each preset whose first asymmetric k1 option the row statistics carry alone (``rejected[NAME|k1 as
    applied]`` and ``[NAME|k1 as written]``): what verl rejects of the run with it and what [L, U] as written would."""
    found: list[K1Bounds] = []
    for preset in presets:
        option = preset.asymmetric_k1
        if option is None or rows is None or preset.name + K1_AS_WRITTEN not in rows.rejected:
            continue
        token, row = _dropped_shares(rows, preset.name + K1_APPLIED)
        written_token, written_row = _dropped_shares(rows, preset.name + K1_AS_WRITTEN)
        prefix = f"{catalogue.OFFPOLICY_PREFIX}rollout_rs_{option.option}"
        metrics = {
            f"{prefix}_masked_fraction": token,
            f"{prefix}_seq_masked_fraction": row,
            catalogue.K1_WRITTEN_TOKENS.key: written_token,
            catalogue.K1_WRITTEN_ROWS.key: written_row,
        }
        line = k1_bounds_line(preset.name, preset.config(), metrics)
        lower, upper = parse_bounds(option.spec, "rollout_rs_threshold")
        assert line is not None and lower is not None, "an asymmetric k1 option has bounds L_U"
        found.append(
            K1Bounds(
                preset.name, option.option, option.spec, lower, upper, token, row, written_token, written_row, line
            )
        )
    return found


def _dropped_shares(rows: RowStats, name: str) -> tuple[float, float]:
    """(Σ rejected / (N + 1e-8), rows with a rejected model token / rows with a model token, 0 without one) of
    ``rows.rejected[name]``: whole-number sums, so the same digits as compare-presets' per-step counts summed."""
    rejected = rows.rejected[name]
    valid = int(np.count_nonzero(rows.tokens > 0))
    token_share = float(rejected.sum() / (rows.tokens.sum() + EPS))
    row_share = int(np.count_nonzero(rejected > 0)) / valid if valid else 0.0
    return token_share, row_share


def parse_gate(text: str, bound: str) -> Gate:
    """``NAME=VALUE`` of --max / --min; raises ConfigError."""
    name, sep, value = text.rpartition("=")
    if not sep or not name.strip():
        raise ConfigError(f"--{bound} {text}: expected NAME=VALUE, e.g. rollout_corr/k3_kl=1e-3.")
    return Gate(name.strip(), bound, _limit(value, f"--{bound} {text}"))


def _limit(value: Any, where: str) -> float:
    try:
        limit = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: the limit {value!r} is not a number.") from None
    if math.isnan(limit):
        raise ConfigError(f"{where}: the limit is NaN.")
    return limit


def load_gates(path: str | Path) -> list[Gate]:
    """Gates from a TOML, YAML or JSON file (docs/gates.md)::

        per_step = true                       # optional, for every gate of the file
        [max]
        "rollout_corr/k3_kl" = 1e-3
        [min]
        "training/rollout_actor_probs_pearson_corr" = 0.99
        [[gate]]                              # or one table per gate
        metric = "mismatch/logprob_abs_diff"
        max = 0.05
        per_step = false

    ``default`` gives :data:`DEFAULT_GATES`. Raises ConfigError for an unreadable file or a malformed gate.
    """
    if str(path) == "default":
        return list(DEFAULT_GATES)
    path = Path(path)
    document = _read_document(path)
    per_step = _file_per_step(document, path)
    gates = _table_gates(document, path, per_step) + _listed_gates(document, path, per_step)
    if not gates:
        raise ConfigError(f"{path}: no gate in the file.")
    return gates


def _file_per_step(document: Any, path: Path) -> bool | None:
    """The file's ``per_step``, after checking that the document is a table of known keys."""
    if not isinstance(document, Mapping):
        raise ConfigError(f"{path}: expected a table of gates at the top level.")
    unknown = sorted(set(document) - {"per_step", MAX, MIN, "gate"})
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(unknown)}; expected per_step, max, min, gate.")
    per_step = document.get("per_step")
    if per_step is not None and not isinstance(per_step, bool):
        raise ConfigError(f"{path}: per_step must be true or false.")
    return per_step


def _table_gates(document: Mapping[str, Any], path: Path, per_step: bool | None) -> list[Gate]:
    """The gates of the ``[max]`` and ``[min]`` tables (metric = limit)."""
    gates: list[Gate] = []
    for bound in (MAX, MIN):
        table = document.get(bound, {})
        if not isinstance(table, Mapping):
            raise ConfigError(f"{path}: '{bound}' must be a table of metric = limit.")
        for metric, value in table.items():
            gates.append(Gate(str(metric), bound, _limit(value, f"{path}: {bound}.{metric}"), per_step))
    return gates


def _listed_gates(document: Mapping[str, Any], path: Path, per_step: bool | None) -> list[Gate]:
    """The gates of the ``[[gate]]`` list, one table each."""
    entries = document.get("gate", [])
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: 'gate' must be a list of tables.")
    gates: list[Gate] = []
    for index, entry in enumerate(entries):
        gates.extend(_entry_gates(entry, f"{path}: gate {index + 1}", per_step))
    return gates


def _entry_gates(entry: Any, where: str, per_step: bool | None) -> list[Gate]:
    """One ``[[gate]]`` table's gates: one per bound it names."""
    if not isinstance(entry, Mapping) or not isinstance(entry.get("metric"), str):
        raise ConfigError(f'{where}: needs a metric name (metric = "…").')
    bounds = [bound for bound in (MAX, MIN) if bound in entry]
    if not bounds:
        raise ConfigError(f"{where}: needs max = … or min = ….")
    own = entry.get("per_step", per_step)
    if own is not None and not isinstance(own, bool):
        raise ConfigError(f"{where}: per_step must be true or false.")
    source = str(entry.get("source", ""))
    return [
        Gate(entry["metric"], bound, _limit(entry[bound], f"{where} ({entry['metric']})"), own, source)
        for bound in bounds
    ]


def _read_document(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the gates file ({exc.strerror}).") from None
    suffix = path.suffix.lower()
    try:
        if suffix == ".json":
            return json.loads(text)
        if suffix in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError:
                raise ConfigError(
                    f"{path}: YAML gates need PyYAML.", hint="pip install 'rollout-diag[yaml]', or use TOML or JSON."
                ) from None
            return yaml.safe_load(text)
        if suffix == ".toml":
            try:
                import tomllib
            except ImportError:  # Python 3.10
                try:
                    import tomli as tomllib
                except ImportError:
                    raise ConfigError(f"{path}: TOML needs Python 3.11 or tomli.", hint="pip install tomli") from None
            return tomllib.loads(text)
    except ConfigError:
        raise
    except Exception as exc:  # each parser raises its own class; the message says where
        raise ConfigError(f"{path}: not valid {suffix.lstrip('.').upper()}: {exc}") from None
    raise ConfigError(f"{path}: unknown gates file type '{suffix}'; use .toml, .yaml, .yml or .json.")


# ----------------------------------------------------------------------------------------- values
def metric_values(
    result: AnalysisResult, rows: RowStats | None = None, row_metrics: Sequence[RowMetric] = KEY_METRICS
) -> dict[int | None, dict[str, float]]:
    """Every gateable value, per step and for the run (key None): the step's metrics, its dialect metrics (as
    ``name`` unless a metric already has it, and as ``framework:name``), then ``row_metrics`` from row sums."""
    steps: list[StepResult] = [result.run, *result.steps]
    table: dict[int | None, dict[str, float]] = {step.step: _values_of(step) for step in steps}
    _add_row_metrics(table, rows, row_metrics)
    table[None][SKIPPED_ROW_SHARE] = result.skipped_data.row_share
    return table


def _values_of(step: StepResult) -> dict[str, float]:
    """One step's (or the run's) gateable values: its metrics, then its dialect metrics."""
    values = dict(step.metrics.items())  # one read of a step's metrics (a StepTable's steps read columns)
    dialects = getattr(step, "dialects", None) or {}
    for framework, named in dialects.items():
        for name, value in named.items():
            if value is None:
                value = math.nan
            values.setdefault(name, value)
            values[f"{framework}:{name}"] = value
    return values


class _ColumnValues:
    """``metric_values`` of a result whose steps are a StepTable, read one metric at a time from the columns (a dict
    of every value per step cost 200 000 dicts): ``self[None]`` is the run's dict, ``per_step(name)`` each step's
    value of ``name`` (None where the step has none), as ``metric_values(...)[step].get(name)`` gives it."""

    def __init__(
        self, result: AnalysisResult, rows: RowStats | None, row_metrics: Sequence[RowMetric] = KEY_METRICS
    ) -> None:
        self.steps: StepTable = result.steps  # type: ignore[assignment]
        self.rows = rows if rows is not None and rows.rows else None
        self.row_metrics = row_metrics
        self.run = _values_of(result.run)
        self.run[SKIPPED_ROW_SHARE] = result.skipped_data.row_share
        if self.rows is not None:
            for metric in row_metrics:
                if metric.name not in self.run:
                    self.run[metric.name] = metric.value(self.rows)

    def __getitem__(self, step: None) -> dict[str, float]:
        return self.run

    def known(self) -> list[str]:
        """Every name the run or a step reports (metric_values' keys over all steps)."""
        names = set(self.run)
        names.update(_reported(self.steps.metrics))
        for framework, columns in self.steps.dialects.items():
            reported = _reported(columns)
            names.update(reported)
            names.update(f"{framework}:{name}" for name in reported)
        if self.rows is not None:
            names.update(metric.name for metric in self.row_metrics)
        return sorted(names)

    def per_step(self, name: str) -> list[Any]:
        """Each step's value of ``name``, in the order metric_values folds them: the step's metrics, then the first
        framework reporting ``name`` (setdefault), overridden by a ``framework:name`` copy (None values as NaN),
        then a key metric from row sums where still missing and not NaN."""
        count = len(self.steps)
        values: list[Any] = [None] * count
        found = np.zeros(count, dtype=bool)
        _fill(values, found, self.steps.metrics, name, nan_for_none=False, override=True)
        for columns in self.steps.dialects.values():
            _fill(values, found, columns, name, nan_for_none=True, override=False)
        for framework, columns in self.steps.dialects.items():
            if name.startswith(f"{framework}:"):
                _fill(values, found, columns, name[len(framework) + 1 :], nan_for_none=True, override=True)
        if self.rows is not None and not found.all():
            for metric in self.row_metrics:
                if metric.name != name:
                    continue
                index = {step: i for i, step in enumerate(self.steps.step_ids.tolist())}
                for step, value in by_step(metric, self.rows).items():
                    at = index.get(step)
                    if at is not None and not found[at] and not math.isnan(value):
                        values[at], found[at] = value, True
        return values


def _reported(columns: MetricColumns) -> set[str]:
    """The names some step reports."""
    return {name for present, values in columns.groups if present.any() for name in values}


def _fill(
    values: list[Any], found: np.ndarray, columns: MetricColumns, name: str, *, nan_for_none: bool, override: bool
) -> None:
    """Write ``columns``' value of ``name`` into ``values`` where a step reports it (``override``: over what is there,
    as an assignment; else only where nothing is yet, as setdefault). A later group's value replaces an earlier one's
    at a step, as the fold of MetricColumns.row does."""
    reported = np.zeros(found.shape[0], dtype=bool)
    picked: list[Any] = [None] * found.shape[0]
    for group in columns.where.get(name, ()):
        present, named = columns.groups[group]
        column = named[name]
        index = np.flatnonzero(present)
        chosen = column[index].tolist() if column.dtype == np.float64 else [column[i] for i in index.tolist()]
        for at, value in zip(index.tolist(), chosen, strict=True):
            picked[at] = value
        reported |= present
    writes = reported if override else reported & ~found
    for at in np.flatnonzero(writes).tolist():
        value = picked[at]
        values[at] = math.nan if value is None and nan_for_none else value
    found |= reported


def group_values(
    group: GroupResult, rows: RowStats | None = None, row_metrics: Sequence[RowMetric] = KEY_METRICS
) -> dict[int | None, dict[str, float]]:
    """Every gateable value of one ``--by`` group, per step and for the run (key None): its key metrics
    (``GroupResult.metrics``), then ``row_metrics`` from its rows' sums (``rows``: that group's rows only)."""
    table: dict[int | None, dict[str, float]] = {None: dict(group.metrics)}
    for step in group.steps:
        table[step.step] = dict(step.metrics)
    _add_row_metrics(table, rows, row_metrics)
    return table


def _add_row_metrics(
    table: dict[int | None, dict[str, float]], rows: RowStats | None, row_metrics: Sequence[RowMetric]
) -> None:
    """``row_metrics`` computed from per-row sums, where ``table`` lacks them and the rows have a model token (a
    ``--by`` group without one does not report them: its gates are skipped, as a step's)."""
    if rows is not None and rows.rows:
        for metric in row_metrics:
            if metric.name not in table[None] and not math.isnan(run_value := metric.value(rows)):
                table[None][metric.name] = run_value
            for step, value in by_step(metric, rows).items():
                if step in table and not math.isnan(value):
                    table[step].setdefault(metric.name, value)


def check(
    result: AnalysisResult,
    gates: Sequence[Gate],
    *,
    per_step: bool = False,
    rows: RowStats | None = None,
    groups: Sequence[tuple[str, GroupResult, RowStats | None]] = (),
) -> CheckResult:
    """Every gate on the run and, when ``per_step`` (or the gate's own per_step), on each step; then the same on
    each of ``groups`` (name, ``--by`` group, its rows' statistics), outcomes carrying the group's name. A gate
    whose metric a group does not report is skipped for that group.

    A gate on ``summary/rejected_token_fraction[PRESET]`` (``gate_presets``) reads the preset's per-row counts in
    ``rows`` (``RowStats.rejected``, as ``drivers.check.check_run`` gathers them); where the rows also carry its
    asymmetric k1 option alone, the result's ``k1_bounds`` says what verl and [L, U] as written reject.

    Raises ConfigError when no gate is given or a gate names a metric the result does not have (with the
    closest names), a short name several metrics share (with their full names), or a preset no built-in has. The
    result's gates carry full names.
    """
    presets = gate_presets(gates)
    row_metrics = _row_metrics(rows, presets)
    if isinstance(result.steps, StepTable):  # many steps: each gate's values read from the columns
        table: Any = _ColumnValues(result, rows, row_metrics)
        known = table.known()
    else:
        table = metric_values(result, rows, row_metrics)
        known = sorted({name for values in table.values() for name in values})
    gates = [_resolved(_preset_share_named(gate), known) for gate in gates]
    tables = [
        (name, group_values(group, group_rows, _row_metrics(group_rows, presets)), group.steps)
        for name, group, group_rows in groups
    ]
    skipped = result.skipped_data
    detail = (
        f"{skipped.line()}; --strict (strict=True) makes any skipped row an error" if skipped.rows else "no row skipped"
    )
    outcomes = []
    for gate in gates:
        if gate.metric == SKIPPED_ROW_SHARE:  # the whole input's share: no step or group has its own
            outcomes.append(replace(_judge(gate, None, skipped.row_share), detail=detail))
            continue
        stepwise = gate.per_step if gate.per_step is not None else per_step
        for name, values, steps in [(None, table, result.steps), *tables]:
            outcomes.append(_judge(gate, None, values[None].get(gate.metric), name))
            if not stepwise:
                continue
            if isinstance(values, _ColumnValues):
                ids = values.steps.step_ids.tolist()
                for step, value in zip(ids, values.per_step(gate.metric), strict=True):
                    outcomes.append(_judge(gate, step, value, name))
                continue
            for step in steps:
                outcomes.append(_judge(gate, step.step, values[step.step].get(gate.metric), name))
    resolved = [
        Gate(
            g.metric,
            g.bound,
            g.limit,
            False if g.metric == SKIPPED_ROW_SHARE else g.per_step if g.per_step is not None else per_step,
            g.source,
        )
        for g in gates
    ]
    return CheckResult(list(result.inputs), resolved, outcomes, list(result.warnings), k1_bounds(presets, rows))


def full_names(short: str, known: Sequence[str]) -> list[str]:
    """The metrics of ``known`` that the tables print as ``short`` (``k3_kl`` → ``rollout_corr/k3_kl``).

    Per-round keys (``per_round/round_<k>/k3_kl``) and ``framework:name`` copies of dialect values share a
    short name with the run-level metric; they count only when nothing else does. A judged key metric whose short
    name starts with ``short`` and a word more counts too: ``k3`` names SkyRL's ``rollout_kl/k3`` and may mean
    ``rollout_corr/k3_kl``, so it is ambiguous.
    """
    named = [name for name in known if catalogue.short_name(name) == short]
    primary = [name for name in named if ":" not in name and not name.startswith(catalogue.ROUNDS_PREFIX)]
    return (primary or named) + [name for name in _judged_extending(short, known) if name not in named]


def _judged_extending(short: str, known: Sequence[str]) -> list[str]:
    """The judged key metrics whose short name is ``short`` plus more words (``k3`` → ``rollout_corr/k3_kl``): a
    name that reads as the start of a key metric's may mean it, so it never names another metric silently."""
    judged = catalogue.keys_with_role(catalogue.Role.JUDGED)
    return [name for name in judged if name in known and catalogue.short_name(name).startswith(f"{short}_")]


def _resolved(gate: Gate, known: Sequence[str]) -> Gate:
    """``gate`` with its metric's full name: a short name the tables print stands for the one metric it names.
    Raises ConfigError for a name nothing matches (closest names) or a short name several metrics share."""
    if gate.metric in known:
        return gate
    full = full_names(gate.metric, known)
    if len(full) == 1:
        return Gate(full[0], gate.bound, gate.limit, gate.per_step, gate.source)
    if full:
        listed = ", ".join(full[:8]) + (f" (and {len(full) - 8} more)" if len(full) > 8 else "")
        raise ConfigError(
            f"gate {gate.describe()}: '{gate.metric}' is ambiguous: it could mean {listed}.",
            hint="name one in full.",
        )
    close = difflib.get_close_matches(gate.metric, known, n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(close)}?" if close else "see `rollout-diag analyze --format json`."
    raise ConfigError(f"gate {gate.describe()}: no metric '{gate.metric}' in this result.", hint=hint)


def _judge(gate: Gate, step: int | None, value: float | None, group: str | None = None) -> GateOutcome:
    if value is None:
        return GateOutcome(gate, step, None, SKIP, None, group)
    if math.isnan(value):
        return GateOutcome(gate, step, value, FAIL, None, group)
    excess = value - gate.limit if gate.bound == MAX else gate.limit - value
    return GateOutcome(gate, step, value, FAIL if excess > 0 else PASS, excess, group)
