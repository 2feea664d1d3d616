"""`check` gates a built-in preset's dropped-token share, and says what asymmetric k1 bounds would reject as written
(issue 42 item 4: verl applies ρ ∈ [1/U, 1/L] for k1 bounds L_U with L·U ≠ 1)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa
import pytest
from helpers.cli import error_line, invoke
from helpers.dumps import write_sequence_dump
from helpers.schema import validator
from helpers.steps import SAMPLE

from rollout_diag.decisions.check import Gate, gate_presets
from rollout_diag.drivers.check import check_run
from rollout_diag.drivers.compare import compare_presets
from rollout_diag.errors import ConfigError

GEO = "decoupled_geo_rs"  # seq_mean_k1 0.999_1.001: verl keeps ρ_i = exp(R_i[δ]) ∈ [1/1.001, 1/0.999]
GATE = f"rejected_token_fraction[{GEO}]"
KEY = f"summary/rejected_token_fraction[{GEO}]"

# Rows of one step, every token of a row with the same δ = log ρ, so that the row's geometric ratio is ρ (R_i[δ] =
# n·δ / (n + 1e-8) moves ρ by ~5e-12, far inside the 5e-7 margins below). verl keeps ρ ∈ [0.999000999, 1.001001001];
# as written, ρ ∈ [0.999, 1.001].
#   row  tokens  ρ           verl (applied)  as written
#   A    2       1.0010005   kept            rejected (> 1.001)
#   B    3       0.9990005   rejected (< 0.999000999)   kept
#   C    4       1           kept            kept
#   D    1       1.5         rejected        rejected
#   E    2       1.0010008   kept            rejected
#   F    2 (mask 0, 0): no model token, in no share
# N = 2 + 3 + 4 + 1 + 2 = 12 model tokens, 5 rows with one.
# verl: B, D → 3 + 1 = 4 tokens: 4 / (12 + 1e-8); 2 of 5 rows = 0.4.
# as written: A, D, E → 2 + 1 + 2 = 5 tokens: 5 / (12 + 1e-8); 3 of 5 rows = 0.6.
ROWS = (("A", 2, 1.0010005), ("B", 3, 0.9990005), ("C", 4, 1.0), ("D", 1, 1.5), ("E", 2, 1.0010008))
VERL_TOKENS, VERL_ROWS = 4 / (12 + 1e-8), 0.4
WRITTEN_TOKENS, WRITTEN_ROWS = 5 / (12 + 1e-8), 0.6


def write_rows(path: Path) -> Path:
    rows = []
    for index, (_, length, ratio) in enumerate(ROWS):
        rollout = [-0.5] * length
        trainer = [-0.5 + math.log(ratio)] * length
        rows.append({"step": 0, "sample_id": index, "rollout": rollout, "trainer": trainer, "mask": [1] * length})
    rows.append({"step": 0, "sample_id": len(ROWS), "rollout": [-0.5, -0.5], "trainer": [-0.4, -0.4], "mask": [0, 0]})
    return write_sequence_dump(path, rows, logprob_type=pa.float64())  # float32 would round ρ by ~1e-7


def test_a_preset_gate_keeps_verls_numbers_and_says_what_the_bounds_as_written_reject(tmp_path: Path) -> None:
    path = write_rows(tmp_path / "k1.parquet")
    result = check_run(path, [Gate(GATE, "max", 0.3)], device="cpu")
    gate, skipped = result.outcomes[:2]
    assert gate.gate.metric == KEY and skipped.gate.metric == "skipped_row_share"
    # the gate reads verl's share as diff computes it from the rows: Σ rejected / Σ tokens = 4 / 12 (no 1e-8)
    assert gate.status == "fail" and gate.value == pytest.approx(4 / 12, rel=1e-12)
    assert gate.excess == pytest.approx(4 / 12 - 0.3, rel=1e-12)
    (bounds,) = result.k1_bounds
    assert (bounds.preset, bounds.option, bounds.threshold) == (GEO, "seq_mean_k1", "0.999_1.001")
    assert (bounds.lower, bounds.upper) == (0.999, 1.001)
    assert bounds.token_fraction == pytest.approx(VERL_TOKENS, rel=1e-12)
    assert bounds.row_fraction == VERL_ROWS
    assert bounds.as_written_token_fraction == pytest.approx(WRITTEN_TOKENS, rel=1e-12)
    assert bounds.as_written_row_fraction == WRITTEN_ROWS
    assert bounds.line == (
        f"{GEO}: verl applies seq_mean_k1 0.999_1.001 as ρ ∈ [1/U, 1/L] = [0.999001, 1.001] (rejecting 33.33 % of "
        "tokens, 40.00 % of rows); ρ ∈ [0.999, 1.001] as written would reject 41.67 % of tokens, 60.00 % of rows"
    )


def test_terminal_and_json_carry_the_line_and_the_schema_holds(tmp_path: Path) -> None:
    path = write_rows(tmp_path / "k1.parquet")
    table = invoke("check", path, "--device", "cpu", "--max", f"{GATE}=0.5")
    assert table.exit_code == 0
    assert "• decoupled_geo_rs: verl applies seq_mean_k1 0.999_1.001 as ρ ∈ [1/U, 1/L]" in table.stdout
    out = tmp_path / "check.json"
    invoke("check", path, "--device", "cpu", "--max", f"{GATE}=0.5", "--per-step", "-f", "json", "-o", out)
    document = json.loads(out.read_text())
    validator("check.schema.json").validate(document)
    (bounds,) = document["k1_bounds"]
    assert bounds["applied"] == [1 / 1.001, 1 / 0.999] and bounds["as_written"] == [0.999, 1.001]
    assert bounds["as_written_row_fraction"] == WRITTEN_ROWS and bounds["row_fraction"] == VERL_ROWS
    steps = [o for o in document["outcomes"] if o["metric"] == KEY and o["step"] is not None]
    assert [o["step"] for o in steps] == [0] and steps[0]["value"] == pytest.approx(4 / 12, rel=1e-12)


def test_no_k1_bounds_without_an_asymmetric_k1_option(tmp_path: Path) -> None:
    path = write_rows(tmp_path / "k1.parquet")
    out = tmp_path / "check.json"
    gates = ["--max", "rejected_token_fraction[decoupled_k3_rs]=1", "--max", "rollout_corr/k3_kl=1"]
    assert invoke("check", path, "--device", "cpu", *gates, "-f", "json", "-o", out).exit_code == 0
    assert "k1_bounds" not in json.loads(out.read_text())  # the document is unchanged where there is nothing to say


def test_an_unknown_preset_is_an_error_naming_the_closest() -> None:
    with pytest.raises(ConfigError, match="no built-in preset 'decoupled_geo'") as raised:
        gate_presets([Gate("rejected_token_fraction[decoupled_geo]", "max", 0.1)])
    assert "decoupled_geo_rs" in str(raised.value.hint)
    assert "no built-in preset" in error_line(invoke("check", SAMPLE, "--max", "rejected_token_fraction[nope]=1"))


def test_the_shares_are_compare_presets_digits_on_the_sample() -> None:
    checked = check_run(SAMPLE, [Gate(GATE, "max", 1.0)], device="cpu")
    (bounds,) = checked.k1_bounds
    metrics = compare_presets(SAMPLE, [GEO], device="cpu").presets[0].run.metrics
    option = "rollout_corr/rollout_rs_seq_mean_k1"
    assert bounds.token_fraction == metrics[f"{option}_masked_fraction"]
    assert bounds.row_fraction == metrics[f"{option}_seq_masked_fraction"]
    assert bounds.as_written_token_fraction == metrics["summary/k1_as_written_token_fraction"]
    assert bounds.as_written_row_fraction == metrics["summary/k1_as_written_row_fraction"]
    assert checked.outcomes[0].value == pytest.approx(metrics["summary/rejected_token_fraction"], rel=1e-12)


def test_a_group_without_model_tokens_skips_the_preset_gate() -> None:
    # the sample's rows without a model round (num_rounds = 0) drop nothing and have no share: skipped, not NaN
    multiturn = SAMPLE.parent / "synthetic_multiturn.parquet"
    result = check_run(multiturn, [Gate(GATE, "max", 1.0)], by=["num_rounds"], device="cpu")
    empty = [o for o in result.outcomes if o.group == "num_rounds=0" and o.gate.metric == KEY]
    assert [(o.step, o.status) for o in empty] == [(None, "skipped")]
    assert result.passed
