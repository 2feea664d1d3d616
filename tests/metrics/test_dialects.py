"""Dialects (``--dialect``) against the slow float64 reference in tests/helpers/reference_dialects.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from helpers.dialect_dumps import one_step, write_dump
from helpers.reference_dialects import REFERENCES

import rollout_diag as rd
from rollout_diag.errors import ConfigError
from rollout_diag.metrics.dialects import FRAMEWORKS, TRAINERS, VARIANTS, markdown, resolve

RTOL = 1e-9  # the library sums in another order than the reference; both are float64
EVERY = ",".join(FRAMEWORKS)  # every trainer and every variant (``all`` is the trainers at their current code)
DOCS = Path(__file__).resolve().parents[2] / "docs" / "dialects.md"


def random_rows(rng: np.random.Generator, count: int, max_len: int = 30) -> list[dict]:
    """Multi-round rows (environment runs of mask 0), ~15 % empty rows, and a heavy tail of |δ| up to ~30 so that
    clamps at 20, TRL's sequence masking above 3 and AReaL's rejection above 5 all fire; values exactly float32."""
    rows = []
    for _ in range(count):
        length = int(rng.integers(0, max_len))
        mask = np.ones(length, dtype=np.int8)
        for _ in range(int(rng.integers(0, 4))):
            start = int(rng.integers(0, max(length, 1)))
            mask[start : start + int(rng.integers(1, 5))] = 0
        if rng.random() < 0.15:
            mask[:] = 0
        rollout = -rng.exponential(1.0, length)
        delta = rng.normal(0, 0.05, length) + (rng.random(length) < 0.05) * rng.normal(0, 12, length)
        trainer = np.minimum(rollout + delta, 0.0)
        # GRPO-like per-row advantages (some 0 and some null) and environment names (some null): prime-rl's
        # DPPO values and mismatch_kl/<env> read them
        advantage = [0.0, None, float(rng.normal(0, 1))][min(int(rng.integers(0, 8)), 2)]
        env = ["math", "code", None][min(int(rng.integers(0, 5)), 2) if rng.random() < 0.9 else 2]
        rows.append(
            {
                "rollout": rollout.astype(np.float32),
                "trainer": trainer.astype(np.float32),
                "mask": mask,
                "advantage": advantage,
                "env": env,
            }
        )
    return rows


def as_reference(rows: list[dict]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    return [
        (r["trainer"].astype(np.float64), r["rollout"].astype(np.float64), r["mask"].astype(np.int64)) for r in rows
    ]


def expected_dialects(rows: list[dict]) -> dict[str, dict[str, float]]:
    ref = as_reference(rows)
    out = {}
    for name, reference in REFERENCES.items():
        if name == "prime-rl" and any("advantage" in row for row in rows):
            values = reference(ref, [row.get("advantage") for row in rows], [row.get("env") for row in rows])
        elif name == "prime-rl:ipo" and any("env" in row for row in rows):
            values = reference(ref, [row.get("env") for row in rows])
        else:
            values = reference(ref)
        if name.startswith("verl"):  # verl's dialect is verl's names only (mismatch/… is rollout-diag's own key)
            values = {k: v for k, v in values.items() if k.startswith(("rollout_corr/", "training/"))}
        if values:
            out[name] = values
    return out


def assert_dialects_match(actual: dict[str, dict[str, float]], expected: dict[str, dict[str, float]]) -> None:
    assert sorted(actual) == sorted(expected)
    for framework, values in expected.items():
        assert sorted(actual[framework]) == sorted(values), framework
        for name, value in values.items():
            got = actual[framework][name]
            if math.isnan(value):
                assert math.isnan(got), (framework, name)
            else:
                assert got == pytest.approx(value, rel=RTOL, abs=1e-12), (framework, name)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> tuple[Path, dict[int, list[dict]]]:
    rng = np.random.default_rng(7)
    steps = {step: random_rows(rng, int(rng.integers(6, 25))) for step in (1, 2, 5, 9)}
    steps[4] = [{"rollout": np.zeros(3, np.float32), "trainer": np.zeros(3, np.float32), "mask": np.zeros(3, np.int8)}]
    path = tmp_path_factory.mktemp("dialects") / "dump.parquet"
    write_dump(path, steps, row_group_size=7)
    return path, steps


@pytest.fixture(scope="module")
def all_result(dataset) -> rd.AnalysisResult:
    return rd.analyze(str(dataset[0]), device="cpu", dialect=EVERY)


@pytest.mark.parametrize("chunk_tokens", [17, 113, 1 << 20])
def test_every_dialect_matches_the_reference_per_step_and_for_the_run(dataset, chunk_tokens):
    path, steps = dataset
    result = rd.analyze(str(path), device="cpu", dialect=EVERY, chunk_tokens=chunk_tokens)
    by_step = {s.step: s for s in result.steps}
    for step, rows in steps.items():
        assert_dialects_match(by_step[step].dialects, expected_dialects(rows))
    assert by_step[4].dialects == {}  # no model token: no dialect values
    all_rows = [row for rows in steps.values() for row in rows]
    assert_dialects_match(result.run.dialects, expected_dialects(all_rows))


def test_merged_parts_equal_one_pass(dataset, all_result):
    """Chunks dealt alternately to two accumulators (rows of one step on both sides), merged in reverse order."""
    path, _ = dataset
    parts = [rd.Analysis(dialects=resolve(EVERY)), rd.Analysis(dialects=resolve(EVERY))]
    for index, (chunk, _) in enumerate(rd.DumpReader([str(path)], chunk_tokens=29).chunks("cpu")):
        parts[index % 2].update(chunk)
    parts[1].merge(parts[0])
    whole = all_result
    assert_dialects_match(parts[1].run_result().dialects, whole.run.dialects)
    for merged, single in zip(parts[1].step_results(), whole.steps, strict=True):
        assert_dialects_match(merged.dialects, single.dialects)


def test_verl_is_the_default_and_repeats_todays_numbers_exactly(dataset):
    path, _ = dataset
    result = rd.analyze(str(path), device="cpu", chunk_tokens=113)
    for batch in [result.run, *result.steps]:
        if batch.tokens == 0:
            assert batch.dialects == {}
            continue
        assert list(batch.dialects) == ["verl"]
        verl = batch.dialects["verl"]
        today = {k: v for k, v in batch.metrics.items() if k.startswith(("rollout_corr/", "training/"))}
        assert {k: v for k, v in verl.items() if "@" not in k} == pytest.approx(today, rel=0, abs=0, nan_ok=True)
        assert {k for k in verl if "@" in k} == {
            f"rollout_corr/{name}@valid_rows"
            for name in (
                "training_ppl",
                "training_log_ppl",
                "rollout_ppl",
                "rollout_log_ppl",
                "log_ppl_diff",
                "log_ppl_abs_diff",
                "ppl_ratio",
                "chi2_seq",
                "log_ppl_diff_max",
                "log_ppl_diff_min",
            )
        }


def test_dilution_warning_says_how_far_empty_rows_moved_verls_row_means(tmp_path):
    # row0: δ = [0.5, 0.5] → d_0 = −0.5·2/(2 + 1e-8); row1 is empty (d_1 = 0): verl's log_ppl_abs_diff halves
    path = one_step(tmp_path / "d.parquet", [([-1.0, -1.0], [-1.5, -1.5], [1, 1]), ([-1.0], [-1.0], [0])])
    result = rd.analyze(str(path), device="cpu")
    verl = result.run.dialects["verl"]
    d0 = 1.0 / (2 + 1e-8)
    assert verl["rollout_corr/log_ppl_abs_diff"] == pytest.approx(d0 / 2, rel=1e-15)
    assert verl["rollout_corr/log_ppl_abs_diff@valid_rows"] == pytest.approx(d0, rel=1e-15)
    [warning] = [w for w in result.warnings if "In the verl dialect" in w]  # one warning with the empty rows'
    assert warning.startswith("1 row(s) have no model token")
    assert "(-50.0%)" in warning  # every row mean of this batch moves by the same half; the largest is named
    clean = rd.analyze(str(one_step(tmp_path / "c.parquet", [([-1.0], [-1.5], [1])])), device="cpu")
    assert not [w for w in clean.warnings if "verl dialect" in w]


def test_hand_checked_quirks(tmp_path):
    """SkyRL's padded min / std, slime's empty-sample denominators, TRL's sequence mask, AReaL's rejection."""
    # row0: δ = [ln 2, 0] over two model tokens, length 3 (one environment token); row1: δ = [ln 8] (ratio 8 > 5, > 3)
    ln2 = math.log(2.0)
    rows = [([ln2 - 1.0, -1.0, -1.0], [-1.0, -1.0, -1.0], [1, 1, 0]), ([3 * ln2 - 4.0], [-4.0], [1])]
    path = one_step(tmp_path / "q.parquet", rows)
    d = rd.analyze(str(path), device="cpu", dialect="all").run.dialects
    a = [np.float64(np.float32(x)) for x in (ln2 - 1.0, 3 * ln2 - 4.0)]  # the float32 trainer values as stored
    delta0, delta1 = a[0] + 1.0, a[1] + 4.0
    # SkyRL: padded [2, 3] tensor = [e^δ0, 1, 0; e^δ1, 0, 0]: min 0, mean over the 3 model tokens only
    skyrl = d["skyrl"]
    assert skyrl["policy/loss_metrics/is_ratio_min"] == 0.0
    assert skyrl["policy/loss_metrics/is_ratio_mean"] == pytest.approx((math.exp(delta0) + 1 + math.exp(delta1)) / 3)
    cells = [math.exp(delta0), 1.0, 0.0, math.exp(delta1), 0.0, 0.0]
    assert skyrl["policy/loss_metrics/is_ratio_std"] == pytest.approx(float(np.std(cells, ddof=1)))
    # TRL: sequence ratios e^δ0 ≈ 2 (kept) and e^δ1 ≈ 8 > 3 (set to 0)
    assert d["trl"]["sampling/importance_sampling_ratio/min"] == 0.0
    assert d["trl"]["sampling/importance_sampling_ratio/mean"] == pytest.approx(math.exp(delta0) / 2)
    # AReaL: the ratio-8 token is rejected (> 5), the mean of δ is over the two kept tokens
    assert d["areal"]["ppo_actor/update/behave_approx_kl/avg"] == pytest.approx(delta0 / 2)
    assert d["areal"]["ppo_actor/update/behave_imp_weight/max"] == pytest.approx(math.exp(delta0))
    assert d["areal"]["ppo_actor/update/rs_filtered_fraction"] == pytest.approx(1 / 3)  # 1 of 3 loss-mask tokens
    # slime: mean of per-sample means (δ0/2 and δ1) over 2 samples, or Σ|δ| / Σ max(n_i, 1) = (δ0 + δ1)/3
    assert d["slime"]["train/train_rollout_logprob_abs_diff"] == pytest.approx((delta0 / 2 + delta1) / 2)
    assert d["slime"]["train/train_rollout_logprob_abs_diff (--calculate-per-token-loss)"] == pytest.approx(
        (delta0 + delta1) / 3
    )
    # ROLL, segment level: row0 has one segment (mean δ0/2), so segment = geometric there
    assert d["roll"]["actor/train_infer_ratio_segment_mean"] == pytest.approx(
        d["roll"]["actor/train_infer_ratio_geometric_mean"], rel=1e-15
    )


def test_resolve_names_and_refuse_unknown_ones():
    assert resolve("all") == tuple(f.name for f in TRAINERS)
    assert resolve("all,verl@b178a3c") == (*(f.name for f in TRAINERS), "verl@b178a3c")
    assert set(FRAMEWORKS) == {f.name for f in (*TRAINERS, *VARIANTS)}
    assert resolve("TRL, skyrl,trl") == ("trl", "skyrl")
    with pytest.raises(ConfigError, match="dialect=grpo: not a dialect"):
        resolve("grpo")
    with pytest.raises(ConfigError):
        resolve("")


def test_reductions_keep_the_order_given_and_refuse_a_field_named_twice():
    from rollout_diag.metrics.dialects.base import reductions

    table = reductions(sum=("tokens", "kl_sum"), max=(name for name in ("kl_max",)), moments=("ratio",))
    assert list(table.items()) == [("tokens", "sum"), ("kl_sum", "sum"), ("kl_max", "max"), ("ratio", "moments")]
    with pytest.raises(ValueError, match="named twice"):
        reductions(sum=("tokens",), max=("tokens",))


def test_every_framework_cites_repo_and_commit_and_its_metrics_are_the_ones_it_reports(all_result):
    run = all_result.run
    for name, framework in FRAMEWORKS.items():
        assert len([word for word in framework.source.split() if len(word) == 40 and word.isalnum()]) == 1, name
        reported = [metric_name(name, key) for key in run.dialects[name]]
        assert list(dict.fromkeys(reported)) == [m.name for m in framework.metrics if m.name in reported]
        assert set(reported) == {m.name for m in framework.metrics}, name


def metric_name(framework: str, key: str) -> str:
    """The declared name of a reported key: prime-rl's per-environment keys stand for ``mismatch_kl/<env>/…``."""
    if framework.startswith("prime-rl") and key.startswith("mismatch_kl/") and not key.startswith("mismatch_kl/all/"):
        return "mismatch_kl/<env>/" + key.rsplit("/", 1)[1]
    return key


def test_docs_dialects_md_is_generated_from_the_code():
    stale = "regenerate: python -m rollout_diag.metrics.dialects > docs/dialects.md"
    assert DOCS.read_text(encoding="utf-8") == markdown(), stale


def test_json_carries_dialects_and_matches_the_schema(all_result):
    import jsonschema

    document = json.loads(json.dumps(all_result.to_json(), allow_nan=False))
    schema = json.loads((DOCS.parent.parent / "schemas" / "result.schema.json").read_text())
    jsonschema.validate(document, schema)
    assert set(document["run"]["dialects"]) == set(FRAMEWORKS)
    assert "dialects" not in next(s for s in document["steps"] if s["step"] == 4)  # the step without model tokens
    # the round trip through StepResult.from_json (report --from-json) keeps them
    assert rd.StepResult.from_json(document["run"]).dialects.keys() == document["run"]["dialects"].keys()


def test_cli_dialect_all_prints_one_table_and_where_they_differ(dataset):
    from typer.testing import CliRunner

    from rollout_diag.cli import app

    path, _ = dataset
    result = CliRunner().invoke(
        app, ["analyze", str(path), "--device", "cpu", "--dialect", "all"], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    assert "Every trainer's mismatch metrics" in result.output
    for title in ("verl", "prime-rl", "NeMo-RL", "slime", "SkyRL", "TRL", "ROLL", "AReaL", "OpenRLHF"):
        assert title in result.output
    for difference in ("token- vs sequence-normalised", "probability vs log space", "padding leaking", "empty rows"):
        assert difference in result.output
    assert "Traceback" not in result.output
    plain = CliRunner().invoke(app, ["analyze", str(path), "--device", "cpu"], env={"COLUMNS": "200"})
    assert "Every trainer's mismatch metrics" not in plain.output  # the default verl dialect adds no table
    bad = CliRunner().invoke(app, ["analyze", str(path), "--device", "cpu", "--dialect", "grpo"])
    assert bad.exit_code == 1
    assert bad.output.strip().startswith("Error: --dialect grpo: not a dialect")


def test_report_shows_the_dialects_section_only_when_asked(dataset, all_result, tmp_path):
    from rollout_diag.report import render_report

    page = render_report(all_result)
    assert "Trainer dialects" in page and "train/vllm_kl" in page and "Where they differ on this data" in page
    assert "Trainer dialects" not in render_report(rd.analyze(str(dataset[0]), device="cpu"))
    from typer.testing import CliRunner

    from rollout_diag.cli import app

    out = tmp_path / "r.html"
    run = CliRunner().invoke(app, ["report", str(dataset[0]), "--device", "cpu", "--dialect", "trl", "-o", str(out)])
    assert run.exit_code == 0, run.output
    assert "sampling/importance_sampling_ratio/mean" in out.read_text(encoding="utf-8")


def test_prime_rl_dppo_values_and_environments_hand_checked(tmp_path):
    """default_loss_fn on two samples, DPPO thresholds 0.2 on exp(a) − exp(r), the advantage's sign choosing the side.

    row0 (A = +1, env math): token1 p_a 0.9 vs p_r 0.6 (+0.3 > 0.2: masked, high); token2 0.5 vs 0.5 (kept).
    row1 (A = −2, env code): token1 0.3 vs 0.6 (−0.3 < −0.2: masked, low); token2 0.9 vs 0.6 (+0.3, but A < 0
    looks at the low side only: kept).
    """
    p_a = [[0.9, 0.5], [0.3, 0.9]]
    p_r = [[0.6, 0.5], [0.6, 0.6]]
    rows = [
        {
            "trainer": np.log(np.array(a)).astype(np.float32),
            "rollout": np.log(np.array(r)).astype(np.float32),
            "mask": np.ones(2, np.int8),
            "advantage": advantage,
            "env": env,
        }
        for a, r, advantage, env in zip(p_a, p_r, [1.0, -2.0], ["math", "code"], strict=True)
    ]
    path = tmp_path / "dppo.parquet"
    write_dump(path, {0: rows}, row_group_size=10)
    d = rd.analyze(str(path), device="cpu", dialect="prime-rl").run.dialects["prime-rl"]

    def k3(row: int, token: int) -> float:  # exp(δ) − δ − 1 of the float32 values as stored
        delta = float(rows[row]["trainer"][token]) - float(rows[row]["rollout"][token])
        return math.exp(delta) - delta - 1

    # k3(ln 1.5) = 1.5 − 0.405465 − 1 ≈ 0.094535; k3(ln 0.5) = 0.5 + 0.693147 − 1 ≈ 0.193147; k3(0) = 0
    assert k3(0, 0) == pytest.approx(0.094535, abs=1e-6) and k3(1, 0) == pytest.approx(0.193147, abs=1e-6)
    # masked_mismatch_kl per sample: row0 k3(0,0) / 1, row1 k3(1,0) / 1
    assert d["masked_mismatch_kl/mean"] == pytest.approx((k3(0, 0) + k3(1, 0)) / 2, rel=1e-12)
    assert d["masked_mismatch_kl/min"] == pytest.approx(k3(0, 0), rel=1e-12)
    assert d["masked_mismatch_kl/max"] == pytest.approx(k3(1, 0), rel=1e-12)
    # unmasked: row0 k3(0,1) = 0, row1 k3(1,1) = k3(ln 1.5)
    assert d["unmasked_mismatch_kl/mean"] == pytest.approx((k3(0, 1) + k3(1, 1)) / 2, rel=1e-12)
    assert d["unmasked_mismatch_kl/max"] == pytest.approx(k3(1, 1), rel=1e-12)
    # is_masked: 1 of 2 tokens in each row → 0.5 and 0.5 (std 0); high only in row0, low only in row1
    assert (d["is_masked/mean"], d["is_masked/std"]) == (0.5, 0.0)
    assert (d["is_masked_high/mean"], d["is_masked_high/max"], d["is_masked_high/min"]) == (0.25, 0.5, 0.0)
    assert (d["is_masked_low/mean"], d["is_masked_low/max"], d["is_masked_low/min"]) == (0.25, 0.5, 0.0)
    # masked_advantage_*: row0's one masked token has A > 0 (1/1), row1's has A < 0 (1/1)
    assert (d["masked_advantage_positive/mean"], d["masked_advantage_positive/max"]) == (0.5, 1.0)
    assert (d["masked_advantage_negative/mean"], d["masked_advantage_negative/min"]) == (0.5, 0.0)
    # mismatch_kl/<env>: the two tokens of each row; math = {k3(0,0), 0}, code = {k3(1,0), k3(1,1)}
    assert d["mismatch_kl/math/mean"] == pytest.approx(k3(0, 0) / 2, rel=1e-12)
    assert d["mismatch_kl/math/min"] == 0.0
    assert d["mismatch_kl/code/max"] == pytest.approx(k3(1, 0), rel=1e-12)
    assert d["mismatch_kl/code/std"] == pytest.approx(abs(k3(1, 0) - k3(1, 1)) / math.sqrt(2), rel=1e-9)


def test_prime_rl_without_advantages_or_environments_reports_only_mismatch_kl_all(tmp_path):
    path = one_step(tmp_path / "plain.parquet", [([-1.0, -2.0], [-1.5, -2.0], [1, 1])])
    d = rd.analyze(str(path), device="cpu", dialect="prime-rl").run.dialects["prime-rl"]
    assert list(d) == ["mismatch_kl/all/mean", "mismatch_kl/all/std", "mismatch_kl/all/min", "mismatch_kl/all/max"]


def test_nemo_rl_sampling_importance_ratio_hand_checked(tmp_path):
    """token mean of e^δ over the mask, Σ/(N + 1e-8); an exp that overflows counts 0 (nan_to_num posinf=0).

    δ = ln 2 and ln 0.5 on two tokens, and a third token with δ = 800 (e^800 overflows float64)."""
    ln2 = math.log(2.0)
    path = one_step(tmp_path / "is.parquet", [([ln2 - 1.0, -ln2 - 1.0], [-1.0, -1.0], [1, 1]), ([-1.0], [-801.0], [1])])
    d = rd.analyze(str(path), device="cpu", dialect="nemo-rl").run.dialects["nemo-rl"]
    a = [float(np.float32(ln2 - 1.0)), float(np.float32(-ln2 - 1.0))]
    # (e^{a0 + 1} + e^{a1 + 1} + 0) / (3 + 1e-8) ≈ (2 + 0.5 + 0) / 3 = 0.8333
    expected = (math.exp(a[0] + 1.0) + math.exp(a[1] + 1.0) + 0.0) / (3 + 1e-8)
    assert expected == pytest.approx(2.5 / 3, rel=1e-6)
    assert d["train/sampling_importance_ratio"] == pytest.approx(expected, rel=1e-12)
