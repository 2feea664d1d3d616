"""``check``: gates, their files, the metric lookup, exit codes, JSON and JUnit XML."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from helpers.cli import error_line, invoke
from helpers.dumps import random_rows, write_sequence_dump
from helpers.reference import debug_metrics, offpolicy_metrics, rollout_kl_metrics
from helpers.steps import SAMPLE

from rollout_diag import catalogue
from rollout_diag.decisions.check import DEFAULT_GATES, Gate, check, load_gates, metric_values, parse_gate
from rollout_diag.decisions.rowmetrics import KEY_METRICS, by_step
from rollout_diag.drivers.rowpass import row_pass
from rollout_diag.errors import ConfigError
from rollout_diag.results import AnalysisResult, StepResult

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def result_of(run: dict[str, float], steps: dict[int, dict[str, float]]) -> AnalysisResult:
    """A hand-built AnalysisResult: only what check reads."""
    return AnalysisResult(
        inputs=["run.parquet"],
        columns={},
        layout="sequence",
        device="cpu",
        run=StepResult(None, 10, 100, run),
        steps=[StepResult(step, 5, 50, metrics) for step, metrics in steps.items()],
        rounds=[],
        verdicts=[],
    )


HAND = result_of(
    {"rollout_corr/k3_kl": 2e-3, "training/rollout_actor_probs_pearson_corr": 0.95},
    {
        0: {"rollout_corr/k3_kl": 5e-4, "training/rollout_actor_probs_pearson_corr": 0.99},
        1: {"rollout_corr/k3_kl": 4e-3, "training/rollout_actor_probs_pearson_corr": math.nan},
        2: {},  # a step without model tokens reports no metric
    },
)


# ----------------------------------------------------------------------------------------- gates on results
def test_max_and_min_gates_pass_and_fail_by_the_right_amount() -> None:
    outcome = check(HAND, [parse_gate("rollout_corr/k3_kl=1e-3", "max")]).outcomes
    assert [(o.step, o.status) for o in outcome] == [(None, "fail")]
    assert outcome[0].excess == pytest.approx(1e-3)
    passing = check(HAND, [parse_gate("training/rollout_actor_probs_pearson_corr=0.9", "min")])
    assert passing.passed and passing.outcomes[0].excess == pytest.approx(-0.05)
    failing = check(HAND, [parse_gate("training/rollout_actor_probs_pearson_corr = 0.97", "min")])
    assert not failing.passed and failing.failures[0].excess == pytest.approx(0.02)


def test_per_step_gates_each_step_and_a_nan_fails_and_a_missing_metric_is_skipped() -> None:
    result = check(HAND, [Gate("training/rollout_actor_probs_pearson_corr", "min", 0.9)], per_step=True)
    statuses = {o.step: o.status for o in result.outcomes}
    assert statuses == {None: "pass", 0: "pass", 1: "fail", 2: "skipped"}
    assert "NaN" in result.failures[0].message()
    # a gate's own per_step wins over the flag
    only_run = check(HAND, [Gate("rollout_corr/k3_kl", "max", 1.0, per_step=False)], per_step=True)
    assert [o.step for o in only_run.outcomes] == [None]


def test_an_unknown_metric_is_an_error_naming_the_closest_names() -> None:
    with pytest.raises(ConfigError, match=r"no metric 'rollout_corr/k3kl'.*did you mean rollout_corr/k3_kl"):
        check(HAND, [parse_gate("rollout_corr/k3kl=1", "max")])
    with pytest.raises(ConfigError, match="no gate"):
        check(HAND, [])


def test_a_short_name_stands_for_the_one_metric_the_tables_print_under_it() -> None:
    outcome = check(HAND, [parse_gate("k3_kl=1e-3", "max")], per_step=True)
    # the run's 2e-3 exceeds 1e-3 by 1e-3; step 0 (5e-4) passes, step 1 (4e-3) fails, step 2 has no value
    assert [(o.gate.metric, o.step, o.status) for o in outcome.outcomes] == [
        ("rollout_corr/k3_kl", None, "fail"),
        ("rollout_corr/k3_kl", 0, "pass"),
        ("rollout_corr/k3_kl", 1, "fail"),
        ("rollout_corr/k3_kl", 2, "skipped"),
    ]
    assert outcome.gates[0].metric == "rollout_corr/k3_kl"
    # the catalogue's own short name, not only the key's last part
    assert check(HAND, [Gate("actor_probs_pearson_corr", "min", 0.9)]).gates[0].metric == (
        "training/rollout_actor_probs_pearson_corr"
    )


def test_per_round_and_framework_copies_do_not_make_a_short_name_ambiguous() -> None:
    run = DialectStep(
        None,
        4,
        40,
        {"rollout_corr/k3_kl": 1e-3, "per_round/round_0/k3_kl": 2e-3},
        0,
        {"verl": {"rollout_corr/k3_kl": 1e-3}},
    )
    result = AnalysisResult(["x"], {}, "sequence", "cpu", run, [], [], [])
    assert check(result, [Gate("k3_kl", "max", 1.0)]).gates[0].metric == "rollout_corr/k3_kl"
    # only per-round keys: those are the candidates, and two of them are ambiguous
    rounds = result_of({"per_round/round_0/seq_count": 1.0, "per_round/round_1/seq_count": 2.0}, {})
    with pytest.raises(ConfigError, match=r"ambiguous: it could mean per_round/round_0/seq_count, "):
        check(rounds, [Gate("seq_count", "max", 1.0)])
    single = result_of({"per_round/round_0/seq_count": 1.0}, {})
    assert check(single, [Gate("seq_count", "max", 1.0)]).gates[0].metric == "per_round/round_0/seq_count"


def test_a_short_name_several_metrics_share_lists_their_full_names() -> None:
    shared = result_of({"rollout_corr/rollout_is_mean": 1.0, "mismatch/rollout_is_mean": 1.0}, {})
    names = {catalogue.short_name("rollout_corr/rollout_is_mean"), catalogue.short_name("mismatch/rollout_is_mean")}
    (short,) = names  # both rows print the same short name
    with pytest.raises(ConfigError) as error:
        check(shared, [Gate(short, "max", 1.0)])
    assert "mismatch/rollout_is_mean" in str(error.value) and "rollout_corr/rollout_is_mean" in str(error.value)
    assert "name one in full" in (error.value.hint or "")


def test_a_short_name_that_starts_a_key_metrics_is_ambiguous() -> None:
    """``k3`` is SkyRL's ``rollout_kl/k3`` by its short name, and reads as the start of ``k3_kl``: an error listing
    both, never a gate on one of them chosen silently; ``k3_kl`` itself still names ``rollout_corr/k3_kl``."""
    both = result_of({"rollout_kl/k3": 0.5, "rollout_corr/k3_kl": 1e-3, "diag/k3_kl_without_catastrophic": 1e-4}, {})
    with pytest.raises(ConfigError, match=r"'k3' is ambiguous: it could mean rollout_kl/k3, rollout_corr/k3_kl\."):
        check(both, [Gate("k3", "max", 1.0)])
    assert check(both, [Gate("k3_kl", "max", 1.0)]).gates[0].metric == "rollout_corr/k3_kl"
    assert check(both, [Gate("rollout_kl/k3", "max", 1.0)]).gates[0].metric == "rollout_kl/k3"
    line = error_line(invoke("check", SAMPLE, "--device", "cpu", "--max", "k3=1"))
    assert "rollout_kl/k3" in line and "rollout_corr/k3_kl" in line and "name one in full" in line


@pytest.mark.parametrize("text", ["rollout_corr/k3_kl", "=1", "rollout_corr/k3_kl=abc", "x=nan"])
def test_malformed_gate_options_are_errors(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_gate(text, "max")


@dataclass(frozen=True)
class DialectStep(StepResult):
    """A step that carries dialect metrics (what the dialects feature adds to StepResult)."""

    dialects: dict[str, dict[str, float]] = field(default_factory=dict)


def test_dialect_metrics_are_found_by_name_and_by_framework() -> None:
    run = DialectStep(None, 4, 40, {"rollout_corr/k3_kl": 1e-3}, 0, {"prime-rl": {"mismatch_kl": 1e-3}})
    step = DialectStep(0, 4, 40, {"rollout_corr/k3_kl": 1e-3}, 0, {"prime-rl": {"mismatch_kl": 2e-3}})
    result = AnalysisResult(["x"], {}, "sequence", "cpu", run, [step], [], [])
    gates = [Gate("mismatch_kl", "max", 1.5e-3), Gate("prime-rl:mismatch_kl", "max", 1.5e-3)]
    outcome = check(result, gates, per_step=True)
    assert [(o.gate.metric, o.step, o.status) for o in outcome.outcomes] == [
        ("mismatch_kl", None, "pass"),
        ("mismatch_kl", 0, "fail"),
        ("prime-rl:mismatch_kl", None, "pass"),
        ("prime-rl:mismatch_kl", 0, "fail"),
    ]


# ----------------------------------------------------------------------------------------- gates files
def test_gates_file_in_toml_with_tables_and_gate_entries(tmp_path: Path) -> None:
    path = tmp_path / "gates.toml"
    path.write_text(
        'per_step = true\n[max]\n"rollout_corr/k3_kl" = 1e-3\n'
        '[min]\n"training/rollout_actor_probs_pearson_corr" = 0.99\n'
        '[[gate]]\nmetric = "mismatch/logprob_abs_diff"\nmax = 0.05\nper_step = false\nsource = "team"\n'
    )
    gates = load_gates(path)
    assert gates == [
        Gate("rollout_corr/k3_kl", "max", 1e-3, True),
        Gate("training/rollout_actor_probs_pearson_corr", "min", 0.99, True),
        Gate("mismatch/logprob_abs_diff", "max", 0.05, False, "team"),
    ]
    json_path = tmp_path / "gates.json"
    json_path.write_text(json.dumps({"max": {"rollout_corr/k3_kl": 1e-3}}))
    assert load_gates(json_path) == [Gate("rollout_corr/k3_kl", "max", 1e-3)]


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("g.toml", "[maximum]\nx = 1\n", "unknown key"),
        ("g.toml", '[max]\nx = "big"\n', "not a number"),
        ("g.toml", "[max\n", "not valid TOML"),
        ("g.toml", '[[gate]]\nmetric = "x"\n', "needs max"),
        ("g.toml", "per_step = 3\n[max]\nx = 1\n", "per_step"),
        ("g.json", "{}", "no gate"),
        ("g.txt", "x", "unknown gates file type"),
    ],
)
def test_bad_gates_files_are_one_line_errors(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_gates(path)
    with pytest.raises(ConfigError, match="cannot read"):
        load_gates(tmp_path / "missing.toml")


def test_default_gates_carry_their_sources() -> None:
    assert load_gates("default") == list(DEFAULT_GATES)
    for gate in DEFAULT_GATES:
        assert gate.per_step and "@" in gate.source  # repository@commit of the public CI bound


# ----------------------------------------------------------------------------------------- row metrics
def token_mult_prob_error(rows: list[dict]) -> tuple[float, dict[int, float]]:
    """NeMo-RL's Σ m·exp(|a − r|) / (N + 1e-8), run and per step, as plain loops."""

    def of(selected: list[dict]) -> float:
        total, count = 0.0, 0
        for row in selected:
            for a, r, m in zip(row["trainer"], row["rollout"], row["mask"], strict=True):
                if m:
                    total += math.exp(abs(a - r))
                    count += 1
        return total / (count + 1e-8)

    steps = sorted({row["step"] for row in rows})
    return of(rows), {step: of([row for row in rows if row["step"] == step]) for step in steps}


@pytest.mark.parametrize("chunk_tokens", [23, 1 << 20])
def test_row_metrics_equal_the_reference_definitions(tmp_path: Path, chunk_tokens: int) -> None:
    rows = random_rows(7, steps=(0, 1, 2), rows_per_step=9)
    rows[3]["mask"] = [0] * len(rows[3]["mask"])  # an empty row enters row means with R = 0
    path = write_sequence_dump(tmp_path / "d.parquet", rows)
    stats = row_pass(str(path), device="cpu", chunk_tokens=chunk_tokens).row_stats()
    triples = [(row["trainer"], row["rollout"], row["mask"]) for row in rows]  # the reference's row form
    expected = {**offpolicy_metrics(triples), **debug_metrics(triples), **rollout_kl_metrics(triples)}
    expected["token_mult_prob_error"] = token_mult_prob_error(rows)[0]
    for metric in KEY_METRICS:
        assert metric.value(stats) == pytest.approx(expected[metric.name], rel=1e-9), metric.name
    step_values = by_step(next(m for m in KEY_METRICS if m.name == "token_mult_prob_error"), stats)
    assert step_values == pytest.approx(token_mult_prob_error(rows)[1], rel=1e-12)


def test_row_metrics_match_analyze_to_the_last_digits() -> None:
    done = row_pass(str(SAMPLE), device="cpu")
    result, stats = done.result(), done.row_stats()
    table = metric_values(result, stats)
    for metric in KEY_METRICS:
        if metric.name in result.run.metrics:
            assert metric.value(stats) == pytest.approx(result.run.metrics[metric.name], rel=1e-12)
    # token_mult_prob_error is not an analyze metric: check gates it from the row sums, per step too
    assert set(table) == {None, 0, 1, 2, 3} and all("token_mult_prob_error" in values for values in table.values())


# ----------------------------------------------------------------------------------------- command line
def test_exit_codes_zero_three_one() -> None:
    assert invoke("check", SAMPLE, "--device", "cpu", "--max", "rollout_corr/k3_kl=0.01").exit_code == 0
    failing = invoke("check", SAMPLE, "--device", "cpu", "--max", "rollout_corr/k3_kl=1e-3", "--per-step")
    assert failing.exit_code == 3
    # one gate of two fails (the default skipped_row_share gate passes), on the run and step 3: 2 of its 5 checks and
    # the skipped gate's 1
    assert "FAIL: 1 of 2 gates failed, in 2 of 6 checks" in failing.stdout and "step 3" in failing.stdout
    short = invoke("check", SAMPLE, "--device", "cpu", "--max", "k3_kl=1e-3", "--per-step")
    assert short.exit_code == 3 and "FAIL: 1 of 2 gates failed, in 2 of 6 checks" in short.stdout
    assert "rollout_corr/k3_kl" in short.stdout
    unknown = error_line(invoke("check", SAMPLE, "--device", "cpu", "--max", "rollout_corr/k3kl=1"))
    assert "did you mean rollout_corr/k3_kl" in unknown
    assert "no gate" in error_line(invoke("check", SAMPLE, "--device", "cpu"))
    assert "Error:" in error_line(invoke("check", "/nonexistent.parquet", "--max", "x=1"))


def test_json_output_follows_the_schema(tmp_path: Path) -> None:
    out = tmp_path / "check.json"
    result = invoke("check", SAMPLE, "--device", "cpu", "--gates", "default", "--per-step", "-f", "json", "-o", out)
    assert result.exit_code == 3
    document = json.loads(out.read_text())
    jsonschema.validate(document, json.loads((SCHEMAS / "check.schema.json").read_text()))
    assert document["passed"] is False and document["failures"] == sum(
        outcome["status"] == "fail" for outcome in document["outcomes"]
    )
    assert [gate["metric"] for gate in document["gates"]] == [gate.metric for gate in DEFAULT_GATES] + [
        "skipped_row_share"
    ]
    assert document["failed_gates"] == len({o["metric"] for o in document["outcomes"] if o["status"] == "fail"})


def test_junit_xml_is_read_back_by_a_real_parser(tmp_path: Path) -> None:
    junit = tmp_path / "check.xml"
    gates = ["--max", "rollout_corr/k3_kl=1e-3", "--min", "training/rollout_actor_probs_pearson_corr=0.99"]
    result = invoke("check", SAMPLE, "--device", "cpu", *gates, "--per-step", "--junit", junit)
    assert result.exit_code == 3
    root = ElementTree.parse(junit).getroot()
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    cases = suite.findall("testcase")
    # 2 gates × (run + 4 steps), and the default skipped_row_share gate on the run
    assert len(cases) == int(suite.get("tests")) == int(root.get("tests")) == 2 * 5 + 1
    failed = [case for case in cases if case.find("failure") is not None]
    assert len(failed) == int(suite.get("failures")) == 2
    assert {case.get("classname") for case in failed} == {"rollout-diag.run", "rollout-diag.step_3"}
    assert all(case.get("name") == "rollout_corr/k3_kl ≤ 0.001" for case in failed)
    assert "is 0.00184 above the limit" in failed[1].find("failure").get("message")
    for case in cases:  # JUnit's required attributes, and exactly one outcome element at most
        assert case.get("name") and case.get("classname") and case.get("time") is not None
        assert len([child for child in case if child.tag in ("failure", "error", "skipped")]) <= 1


def test_default_gates_on_the_bundled_sample() -> None:
    result = invoke("check", SAMPLE, "--device", "cpu", "--gates", "default", "-f", "json")
    document = json.loads(result.stdout)
    by_metric = {(o["metric"], o["step"]): o for o in document["outcomes"]}
    # step 3 of the real bf16 dump holds the token with δ ≈ −10: prime-rl's band and NeMo-RL's bound catch it
    assert by_metric[("rollout_corr/k3_kl", 3)]["status"] == "fail"
    assert by_metric[("token_mult_prob_error", 3)]["status"] == "fail"
    assert by_metric[("rollout_kl/abs", 3)]["status"] == "pass"
    assert np.isclose(by_metric[("rollout_corr/k3_kl", 0)]["value"], 0.000387059, rtol=1e-5)


def test_the_decisions_are_public_api() -> None:
    import rollout_diag as rd

    result = rd.check_run(str(SAMPLE), [rd.Gate("rollout_corr/k3_kl", "max", 1e-2)], device="cpu")
    assert isinstance(result, rd.CheckResult) and result.passed
    assert callable(rd.diff_runs) and callable(rd.recommend)


def test_the_table_goes_to_a_file_with_output(tmp_path: Path) -> None:
    out = tmp_path / "check.txt"
    result = invoke("check", SAMPLE, "--device", "cpu", "--max", "rollout_corr/k3_kl=1e-3", "-o", out)
    assert result.exit_code == 3 and result.stdout == ""
    assert "FAIL: 1 of 2 gates failed, in 1 of 2 checks" in out.read_text() and "\x1b[" not in out.read_text()


@pytest.mark.parametrize("seed", range(6))
def test_by_step_equals_the_metric_of_each_steps_rows(seed: int) -> None:
    """by_step (sums of small steps taken together, position by position) gives, bit for bit, the value the metric
    has on the rows of each step alone: steps of 1 to 20 rows in shuffled order, values spanning many decades,
    signed zeros and steps without a model token."""
    from rollout_diag.decisions.rowmetrics import rejected_share
    from rollout_diag.results import RowStats

    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 21, size=40)
    step = np.repeat(rng.permutation(1000)[: len(sizes)], sizes)
    rng.shuffle(step)
    rows = len(step)
    tokens = rng.integers(0, 5, size=rows).astype(np.float64)
    tokens[step == step[0]] = 0.0

    def spread() -> np.ndarray:
        values = rng.standard_normal(rows) * 10.0 ** rng.integers(-6, 9, size=rows)
        values[rng.random(rows) < 0.1] = -0.0
        return values * (tokens > 0)

    stats = RowStats(step, tokens, {}, {"rs": np.abs(spread())})
    while True:  # every sum a key metric's formula reads
        try:
            for metric in KEY_METRICS:
                metric.value(stats)
            break
        except KeyError as missing:
            stats.sums[missing.args[0]] = spread()
    for metric in [*KEY_METRICS, rejected_share("rs")]:
        got = by_step(metric, stats)
        assert list(got) == sorted(set(step.tolist()))
        for key, value in got.items():
            expected = metric.value(stats.select(step == key))
            assert (math.isnan(value) and math.isnan(expected)) or value == expected, (metric.name, key)
            assert math.copysign(1.0, value) == math.copysign(1.0, expected) or math.isnan(value)
