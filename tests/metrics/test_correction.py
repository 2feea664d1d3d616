"""Correction presets against the float64 reference (METRICS.md §1, §2, §3, §8), read from a Parquet dump in
small chunks, plus chunking / merge-order invariance and the per-row decisions file."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers.presets import (
    ALL_PRESETS,
    CUSTOM_PRESETS,
    RTOL,
    Row,
    assert_metrics_close,
    make_chunk,
    random_steps,
    write_dump,
)
from helpers.reference import (
    EPS,
    SAFETY_BOUND,
    centred_population_std,
    clamp,
    clamp20,
    indicator,
    is_metrics,
    k1_as_written,
    log_ratio,
    offpolicy_metrics,
    parse_rs,
    per_token,
    plain_mean,
    raw_is_summary,
    raw_is_weights,
    row_mean,
    row_sum,
    rs_keep,
    rs_metrics,
    rs_row_values,
    sample_std,
    token_mean,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_diag.decisions.intrusive import INTRUSIVE_MIN_ESS, intrusive_reasons
from rollout_diag.drivers.compare import compare_presets
from rollout_diag.drivers.exports import export_decisions
from rollout_diag.engine.stats import ChunkStats
from rollout_diag.errors import ConfigError, DataError
from rollout_diag.metrics.outcome import CorrectionAnalysis
from rollout_diag.presets import PRESETS, RS_OPTIONS, LegacyCorrection, Preset, preset_from_options

# ------------------------------------------------------------------------------------------- data


# ------------------------------------------------------------------------------ the legacy reference
def _log_or(bound: float | None, missing: float) -> float:
    if bound is None:
        return missing
    return math.log(bound) if bound > 0 else -math.inf


def legacy_reference(rows: Sequence[Row], config: LegacyCorrection) -> tuple[dict[str, float], list[list[bool]]]:
    """§8 metrics (keys mismatch/…) and the keep flag per masked token (mask mode × veto), plain loops."""
    deltas = per_token(rows, log_ratio)
    if config.level == "token":
        weights = [[math.exp(clamp20(x)) for x in values] for values in deltas]
        level_log_ratio = None
    else:
        aggregate = row_sum if config.level == "sequence" else row_mean  # S_i[δ] or R_i[δ] (with +1e-8)
        level_log_ratio = [aggregate(values) for values in deltas]
        weights = [[math.exp(clamp20(ell))] * len(values) for ell, values in zip(level_log_ratio, deltas, strict=True)]
    upper, lower = config.upper, config.lower
    veto_low, veto_high = _log_or(config.veto_lower, -math.inf), _log_or(config.veto_upper, math.inf)
    catastrophic = [[x < veto_low or x > veto_high for x in values] for values in deltas]
    vetoed = [any(flags) for flags in catastrophic]
    metrics = {
        "rollout_is_veto_fraction": plain_mean([indicator(v) for v in vetoed]),
        "rollout_is_catastrophic_token_fraction": token_mean([[indicator(c) for c in v] for v in catastrophic]),
    }
    if config.level == "token":
        flat = [w for values in weights for w in values]
        metrics["rollout_is_max"], metrics["rollout_is_min"] = max(flat), min(flat)
        metrics["rollout_is_mean"] = token_mean(weights)
        metrics["rollout_is_ratio_fraction_high"] = token_mean([[indicator(w > upper) for w in v] for v in weights])
        metrics["rollout_is_ratio_fraction_low"] = token_mean([[indicator(w < lower) for w in v] for v in weights])
    else:
        metrics["rollout_is_max"] = math.exp(min(max(level_log_ratio), SAFETY_BOUND))
        metrics["rollout_is_min"] = math.exp(min(level_log_ratio))
        metrics["rollout_is_mean"] = token_mean(weights)
        high = [indicator(ell > _log_or(upper, math.inf)) for ell in level_log_ratio]
        low = [indicator(ell < _log_or(lower, -math.inf)) for ell in level_log_ratio]
        if config.level == "sequence":  # over all rows
            metrics["rollout_is_ratio_fraction_high"], metrics["rollout_is_ratio_fraction_low"] = (
                plain_mean(high),
                plain_mean(low),
            )
        else:  # geometric: broadcast to tokens
            metrics["rollout_is_ratio_fraction_high"] = token_mean(
                [[h] * len(v) for h, v in zip(high, deltas, strict=True)]
            )
            metrics["rollout_is_ratio_fraction_low"] = token_mean(
                [[lo] * len(v) for lo, v in zip(low, deltas, strict=True)]
            )
    clamped = [[clamp(w, lower, upper) for w in values] for values in weights]
    metrics["rollout_is_std"] = centred_population_std(clamped)
    mean_clamped = token_mean(clamped)
    normalised = token_mean([[(c / (mean_clamped + EPS)) ** 2 for c in v] for v in clamped])
    metrics["rollout_is_eff_sample_size"] = 1.0 / normalised if normalised > 0 else math.inf
    seq_weights = [row_mean(values) for values in weights]
    metrics["rollout_is_seq_mean"] = plain_mean(seq_weights)
    metrics["rollout_is_seq_std"] = sample_std(seq_weights)
    metrics["rollout_is_seq_max"], metrics["rollout_is_seq_min"] = max(seq_weights), min(seq_weights)
    metrics["rollout_is_seq_max_deviation"] = max(abs(q - 1.0) for q in seq_weights)
    metrics["rollout_is_seq_fraction_high"] = plain_mean([indicator(q > upper) for q in seq_weights])
    metrics["rollout_is_seq_fraction_low"] = plain_mean([indicator(q < lower) for q in seq_weights])
    masks = config.mode in ("mask", "both")
    mask_keep = [[(not masks) or config.mask_lower <= w <= config.mask_upper for w in v] for v in weights]
    if masks:
        metrics["rollout_is_masked_fraction"] = token_mean([[indicator(not k) for k in v] for v in mask_keep])
        if config.level == "token":
            row_masked = [indicator(not all(v)) for v in mask_keep]
        else:  # the row's broadcast weight (an empty row has ℓ = 0, w = 1)
            row_masked = [
                indicator(not config.mask_lower <= math.exp(clamp20(ell)) <= config.mask_upper)
                for ell in level_log_ratio
            ]
        metrics["rollout_is_seq_masked_fraction"] = plain_mean(row_masked)
    keep = [[k and not veto for k in v] for v, veto in zip(mask_keep, vetoed, strict=True)]
    return {"mismatch/" + name: value for name, value in metrics.items()}, keep


# ------------------------------------------------------------------------------ expected per preset
def masked_flags(rows: Sequence[Row], full_rows: list[np.ndarray]) -> list[list[bool]]:
    """reference arrays (0.0 where m = 0) -> the flag at each masked token."""
    return [
        [bool(value) for value, m in zip(full, row[2], strict=True) if m == 1]
        for full, row in zip(full_rows, rows, strict=True)
    ]


def expected_metrics(rows: Sequence[Row], preset: Preset) -> tuple[dict[str, float], list[list[bool]]]:
    """Reference metrics of one preset on one batch, and the keep flag per masked token."""
    metrics = {k: v for k, v in offpolicy_metrics(rows).items() if k.startswith("rollout_corr/")}
    keep = [[True] * len(values) for values in per_token(rows, log_ratio)]

    def restrict(flags: list[list[bool]]) -> None:
        for row_keep, row_flags in zip(keep, flags, strict=True):
            row_keep[:] = [k and f for k, f in zip(row_keep, row_flags, strict=True)]

    if preset.importance is not None:
        config = preset.importance
        lower = config.lower if config.icepop else None
        metrics.update(is_metrics(rows, config.level, config.upper, lower, config.batch_normalize))
        metrics.update(raw_is_summary(rows, config.level))
        if config.icepop:
            raw = raw_is_weights(rows, config.level)
            restrict([[config.lower <= w <= config.upper for w in values] for values in raw])
    if preset.rejection:
        options = list(preset.rollout_rs)
        thresholds = preset.rollout_rs_threshold.split(",")
        metrics.update(rs_metrics(rows, options, thresholds))
        for option, lower, upper in parse_rs(options, thresholds):  # the first asymmetric k1 option
            if option.endswith("k1") and abs(math.log(lower) + math.log(upper)) > 1e-9 * abs(math.log(upper)):
                metrics.update(k1_as_written(rows, option, lower, upper))
                break
        restrict(masked_flags(rows, rs_keep(rows, options, thresholds)))
    if preset.legacy is not None:
        legacy_metrics, legacy_keep = legacy_reference(rows, preset.legacy)
        metrics.update(legacy_metrics)
        if (
            preset.legacy.mode != "truncate"
            or preset.legacy.veto_lower is not None
            or preset.legacy.veto_upper is not None
        ):
            restrict(legacy_keep)
    tokens = sum(len(v) for v in keep)
    rejected = sum(not k for v in keep for k in v)
    rows_rejected = sum(not all(v) for v in keep)
    metrics.update(
        {
            "summary/tokens_rejected": rejected,
            "summary/tokens_kept": tokens - rejected,
            "summary/rejected_token_fraction": rejected / tokens,
            "summary/rows_rejected": rows_rejected,
            # over rows with a model token: the sweep's denominator too (base.sequence_share)
            "summary/rejected_row_fraction": rows_rejected / sum(1 for v in keep if len(v)),
        }
    )
    return metrics, keep


# ------------------------------------------------------------------------------------------ tests
@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    steps = random_steps(seed=4)
    path = tmp_path_factory.mktemp("correction") / "dump.parquet"
    write_dump(path, steps)
    return path, steps


@pytest.fixture(scope="module")
def compared(dump):
    path, _ = dump
    return compare_presets(path, ALL_PRESETS, device="cpu", chunk_tokens=37)


def test_every_preset_matches_the_reference_per_step_and_run(dump, compared):
    _, steps = dump
    all_rows = [row for rows in steps.values() for row in rows]
    assert [p.name for p in compared.presets] == [p.name for p in ALL_PRESETS]
    for preset, result in zip(ALL_PRESETS, compared.presets, strict=True):
        assert result.config == preset.config() and result.mode == preset.mode
        assert [s.step for s in result.steps] == sorted(steps)
        for step_result in result.steps:
            rows = steps[step_result.step]
            if not any(m.any() for _, _, m in rows):
                assert step_result.metrics == {}  # §1: a step with N = 0 has no metrics
                continue
            expected, _ = expected_metrics(rows, preset)
            assert_metrics_close(step_result.metrics, expected, f"{preset.name} step {step_result.step}", RTOL)
        expected, _ = expected_metrics(all_rows, preset)
        assert_metrics_close(result.run.metrics, expected, f"{preset.name} run", RTOL)


def test_reference_data_exercises_every_branch(dump, compared):
    """Guard against vacuous agreement: the random data must reject, truncate, veto and zero something."""
    run = {p.name: p.run.metrics for p in compared.presets}
    for option in RS_OPTIONS:
        fraction = run[f"rs_{option}"][f"rollout_corr/rollout_rs_{option}_masked_fraction"]
        assert 0 < fraction < 1, option
    assert (
        run["chain"]["rollout_corr/rollout_rs_masked_fraction"]
        > run["rs_seq_mean_k3"]["rollout_corr/rollout_rs_masked_fraction"]
    )
    assert run["decoupled_token_icepop"]["rollout_corr/rollout_is_oob_ratio"] > 0
    assert run["decoupled_token_is"]["rollout_corr/rollout_is_ratio_fraction_high"] > 0
    assert run["decoupled_seq_is"]["rollout_corr/rollout_is_ratio_fraction_low"] > 0
    assert run["legacy_token_truncate"]["mismatch/rollout_is_veto_fraction"] > 0
    assert run["legacy_sequence_mask"]["mismatch/rollout_is_masked_fraction"] > 0
    assert run["legacy_seq_both"]["mismatch/rollout_is_veto_fraction"] > 0
    assert run["token_tis_bn"]["rollout_corr/rollout_is_batch_norm_factor"] != 1.0
    assert run["seq_tis_bn"]["rollout_corr/rollout_is_batch_norm_factor"] != 1.0
    assert compared.presets[0].steps[0].empty_rows + compared.presets[0].run.empty_rows > 0


def test_chunk_size_does_not_change_results(dump, compared):
    path, _ = dump
    whole = compare_presets(path, ALL_PRESETS, device="cpu", chunk_tokens=1 << 20)
    for chunked, single in zip(compared.presets, whole.presets, strict=True):
        assert_metrics_close(chunked.run.metrics, single.run.metrics, f"{chunked.name} run", rtol=1e-12)
        for a, b in zip(chunked.steps, single.steps, strict=True):
            assert_metrics_close(a.metrics, b.metrics, f"{chunked.name} step {a.step}", rtol=1e-12)


def test_json_shape(compared):
    data = compared.to_json()
    assert data["schema_version"] == 2 and {row["option"] for row in data["sweep"]} >= {"is_token", "seq_mean_k3"}
    assert {"inputs", "steps", "presets", "warnings", "skipped"} <= set(data)
    assert {"step", "rows", "tokens", "empty_rows", "rollout_corr/k3_kl"} <= set(data["steps"])
    first = data["presets"][0]
    assert {"name", "config", "steps", "run", "mode", "intrusive"} <= set(first)
    assert first["steps"]["step"] == data["steps"]["step"] and "metrics" in first["run"]
    assert any("no model token" in warning for warning in data["warnings"])


def test_intrusive_flags():
    assert intrusive_reasons({"summary/rejected_token_fraction": 0.2}) == ("drops 20.0% of model tokens (> 10%)",)
    assert intrusive_reasons({"summary/rejected_token_fraction": 0.05}) == ()
    assert intrusive_reasons({"rollout_corr/rollout_is_eff_sample_size": 0.3}) == (
        f"IS effective sample size 0.3 (< {INTRUSIVE_MIN_ESS:g})",
    )
    assert intrusive_reasons({"summary/rejected_token_fraction": 0.05}, rejected_fraction=0.01) != ()


def test_decisions_file_matches_the_reference(dump, tmp_path):
    path, steps = dump
    presets = [PRESETS["decoupled_k3_rs_token_tis"], PRESETS["decoupled_token_icepop"], PRESETS["legacy_token_mask"]]
    presets.append(next(p for p in CUSTOM_PRESETS if p.name == "chain"))
    out = tmp_path / "decisions.parquet"
    written = export_decisions(path, out, presets, device="cpu", chunk_tokens=50)
    table = pq.read_table(out).to_pylist()
    total_rows = sum(len(rows) for rows in steps.values())
    assert written == len(table) == total_rows * len(presets)
    by_key = {(r["preset"], r["sample_id"]): r for r in table}
    for preset in presets:
        for step, rows in steps.items():
            if not any(m.any() for _, _, m in rows):
                continue
            _, keep = expected_metrics(rows, preset)
            options = list(preset.rollout_rs)
            for index, row_keep in enumerate(keep):
                record = by_key[(preset.name, f"s{step}-{index}")]
                assert record["step"] == step and record["tokens"] == len(row_keep)
                assert record["tokens_rejected"] == sum(not k for k in row_keep)
                assert record["kept"] == all(row_keep)
                for option in RS_OPTIONS:
                    value = record.get(f"stat_{option}")
                    if option in options:
                        expected_value = rs_row_values(rows, option)[index]
                        assert math.isclose(value, expected_value, rel_tol=RTOL, abs_tol=1e-13)
                    else:
                        assert value is None
                if preset.importance is None and preset.legacy is None:
                    assert record["is_weight"] is None
    # compare_presets writes the same file in its single pass
    again = tmp_path / "again.parquet"
    compare_presets(path, presets, device="cpu", chunk_tokens=50, export_decisions_to=again)
    assert pq.read_table(again).equals(pq.read_table(out))


# ---------------------------------------------------------------------------- merge-order invariance


MERGE_PRESETS = [
    PRESETS[name] for name in ("decoupled_k3_rs_token_tis", "decoupled_seq_is_rs", "decoupled_token_icepop")
]
MERGE_PRESETS += [PRESETS["legacy_geometric_mask"], *(p for p in CUSTOM_PRESETS if p.name in ("chain", "seq_tis_bn"))]


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    cuts=st.lists(st.integers(1, 40), min_size=1, max_size=6),
    order_seed=st.integers(0, 99),
)
def test_any_chunking_and_merge_order_gives_the_same_digits(seed, cuts, order_seed):
    steps = random_steps(seed)
    records = [(step, row) for step, rows in steps.items() for row in rows]
    whole = CorrectionAnalysis(MERGE_PRESETS)
    whole.update(make_chunk(records))
    # contiguous chunks at the drawn cut points, fed to separate analyses, merged in a shuffled order
    bounds = sorted({min(c, len(records)) for c in np.cumsum(cuts)} | {0, len(records)})
    parts = []
    for start, stop in itertools.pairwise(bounds):
        part = CorrectionAnalysis(MERGE_PRESETS)
        part.update(make_chunk(records[start:stop]))
        parts.append(part)
    np.random.default_rng(order_seed).shuffle(parts)
    merged = CorrectionAnalysis(MERGE_PRESETS)
    for part in parts:
        merged.merge(part)
    expected, actual = whole.finalize(), merged.finalize()
    for name, (expected_steps, expected_run) in expected.items():
        actual_steps, actual_run = actual[name]
        assert_metrics_close(actual_run, expected_run, f"{name} run", rtol=1e-12)
        assert set(actual_steps) == set(expected_steps)
        for step, metrics in expected_steps.items():
            assert_metrics_close(actual_steps[step], metrics, f"{name} step {step}", rtol=1e-12)


def test_interleaved_steps_reduce_through_rows_to_the_same_digits(dump, compared, monkeypatch):
    """With every chunk's step groups taken as interleaved (no contiguous token range per group), token reductions
    go through rows instead of step slices."""
    path, _ = dump
    monkeypatch.setattr(ChunkStats, "group_token_ranges", property(lambda self: None))
    through_rows = compare_presets(path, ALL_PRESETS, device="cpu", chunk_tokens=37)
    for by_rows, by_runs in zip(through_rows.presets, compared.presets, strict=True):
        assert_metrics_close(by_rows.run.metrics, by_runs.run.metrics, f"{by_rows.name} run", rtol=1e-12)
        for a, b in zip(by_rows.steps, by_runs.steps, strict=True):
            assert_metrics_close(a.metrics, b.metrics, f"{a.step}", rtol=1e-12)


def test_legacy_sequence_mask_by_hand():
    """Three rows, r = −1: δ = (0.5, 0.25), (−10), and an empty row. legacy_sequence_mask: U 2, L 0.5, veto 1e-4.

    s = (0.75, −10, 0); w = (e^0.75 ≈ 2.117, e^−10, 1): row 0 is above U, row 1 below L and vetoed (ρ = e^−10 <
    1e-4), the empty row has w = 1 (kept). c = clamp(w, 0.5, 2) = (2, 2, 0.5) over the 3 tokens: T[c] = 1.5,
    T[c²] = 2.75, std = √0.5, ESS = 1.5² / 2.75.
    """
    rows = [
        (np.array([-0.5, -0.75]), np.array([-1.0, -1.0]), np.ones(2)),
        (np.array([-11.0]), np.array([-1.0]), np.ones(1)),
    ]
    rows.append((np.array([-0.3]), np.array([-0.2]), np.zeros(1)))
    analysis = CorrectionAnalysis([PRESETS["legacy_sequence_mask"]])
    analysis.update(make_chunk([(0, row) for row in rows]))
    metrics = analysis.finalize()["legacy_sequence_mask"][1]
    n = 3 + 1e-8  # N + ε
    expected = {
        "mismatch/rollout_is_veto_fraction": 1 / 3,
        "mismatch/rollout_is_catastrophic_token_fraction": 1 / n,
        "mismatch/rollout_is_max": math.exp(0.75),
        "mismatch/rollout_is_min": math.exp(-10),
        "mismatch/rollout_is_mean": (2 * math.exp(0.75) + math.exp(-10)) / n,
        "mismatch/rollout_is_ratio_fraction_high": 1 / 3,  # over all rows: s_0 = 0.75 > log 2
        "mismatch/rollout_is_ratio_fraction_low": 1 / 3,
        "mismatch/rollout_is_std": math.sqrt(0.5),
        "mismatch/rollout_is_eff_sample_size": 1.5**2 / 2.75,
        "mismatch/rollout_is_seq_fraction_high": 1 / 3,  # q_0 = 2·e^0.75 / (2 + ε) > 2
        "mismatch/rollout_is_seq_fraction_low": 2 / 3,  # q_1 = e^−10, q_2 = 0 (empty row)
        "mismatch/rollout_is_masked_fraction": 3 / n,
        "mismatch/rollout_is_seq_masked_fraction": 2 / 3,  # rows 0 and 1; the empty row's w = 1 is inside
        "summary/tokens_rejected": 3.0,
        "summary/rows_rejected": 2.0,
    }
    for name, value in expected.items():
        assert metrics[name] == pytest.approx(value, rel=1e-7), name


def test_hand_computed_token_tis_and_seq_max_k3():
    """One row, δ = (ln 3, 0, −ln 2): token TIS at 2 gives w = (2, 1, 0.5); seq_max_k3 = max(3 − 1 − ln 3, 0,
    0.5 − 1 + ln 2) = 2 − ln 3 ≈ 0.901 > 0.5: the row is rejected."""
    trainer = np.array([math.log(3) - 2.0, -2.0, -2.0 - math.log(2)])
    preset = preset_from_options(
        "hand", rollout_is="token", rollout_is_threshold=2.0, rollout_rs="seq_max_k3", rollout_rs_threshold=0.5
    )
    analysis = CorrectionAnalysis([preset])
    analysis.update(make_chunk([(0, (trainer, np.full(3, -2.0), np.ones(3)))]))
    metrics = analysis.finalize()["hand"][1]
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(3.5 / (3 + 1e-8), rel=1e-12)
    assert metrics["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(1 / 3, rel=1e-8)
    assert metrics["rollout_corr/rollout_rs_seq_max_k3_max"] == pytest.approx(2 - math.log(3), rel=1e-12)
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(1.0, rel=1e-8)
    assert metrics["summary/tokens_kept"] == 0.0


def test_decisions_file_errors(dump, tmp_path):
    path, _ = dump
    with pytest.raises(ConfigError, match=r"export_decisions_to=.*: cannot write"):
        export_decisions(path, tmp_path / "missing" / "d.parquet", ["disabled"], device="cpu")
    bad = tmp_path / "bad.parquet"
    write_dump(
        bad, {0: [(np.array([-0.5]), np.array([-1.0]), np.ones(1)), (np.array([0.5]), np.array([-1.0]), np.ones(1))]}
    )
    out = tmp_path / "out.parquet"
    with pytest.raises(DataError, match="positive logprob"):
        export_decisions(bad, out, ["disabled"], device="cpu", strict=True)
    assert not out.exists()  # a failed pass leaves no half-written file


def test_derived_names_are_remembered_and_tell_the_signs_of_zero_apart():
    """``derived`` answers from a memo after the first call: the same name, registered once, and a bound of −0.0
    stays a quantity of its own (it compares equal to +0.0, and its name differs)."""
    from rollout_diag.engine.formulas import DERIVED, TOKEN_QUANTITIES, derived

    positive = derived("token_is_weight", "below", lower=0.0)
    negative = derived("token_is_weight", "below", lower=-0.0)
    assert positive != negative
    assert positive == "below(token_is_weight; 0.0, inf)" and negative == "below(token_is_weight; -0.0, inf)"
    assert derived("token_is_weight", "below", 0, math.inf) == positive  # an int bound names the same quantity
    for name in (positive, negative):
        assert DERIVED[name].name == name and name in TOKEN_QUANTITIES
    assert DERIVED[negative].lower == 0.0 and math.copysign(1.0, DERIVED[negative].lower) == -1.0
