"""``diff``: the bootstrap interval covers the truth, verdicts, step ranges, presets, JSON, report A --vs B."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from helpers.cli import error_line, invoke, succeeded
from helpers.dumps import random_rows, write_sequence_dump

import rollout_diag as rd
from rollout_diag.decisions.diff import BETTER, SAME, WORSE, DiffSide, diff
from rollout_diag.drivers.diff import diff_runs
from rollout_diag.errors import ConfigError
from rollout_diag.metrics.rowstats import ROW_SUMS
from rollout_diag.results import AnalysisResult, RowStats, StepResult

SAMPLE = Path(__file__).resolve().parents[2] / "sample_data" / "textgenrnn_bf16_vs_fp32.parquet"
SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def side(label: str, rows: RowStats) -> DiffSide:
    """A side whose values all come from its row sums (an AnalysisResult reporting no metric)."""
    run = StepResult(None, rows.rows, int(rows.tokens.sum()), {})
    return DiffSide(label, AnalysisResult([label], {}, "sequence", "cpu", run, [], [], []), rows)


def simulated_rows(
    rng: np.random.Generator, scale: tuple[float, float], steps: int = 4, per_step: int = 25
) -> RowStats:
    """Rows whose tokens have δ ~ N(0, σ_i²), σ_i ~ U(scale) per row (tokens of a row are alike: clustered)."""
    lengths = rng.integers(5, 41, steps * per_step)
    sigma = rng.uniform(*scale, lengths.size)
    sums = {name: np.zeros(lengths.size) for name in ROW_SUMS}
    for row, (length, s) in enumerate(zip(lengths, sigma, strict=True)):
        delta = rng.normal(0.0, s, length)
        sums["abs_log_ratio"][row] = np.abs(delta).sum()
        sums["k3"][row] = (np.expm1(delta) - delta).sum()
        sums["log_ratio"][row] = delta.sum()
    return RowStats(np.repeat(np.arange(steps), per_step), lengths.astype(np.float64), sums)


def truth(scale: tuple[float, float]) -> dict[str, float]:
    """Population values under simulated_rows (σ independent of the length, so ratio of expectations = E per token)."""
    low, high = scale
    grid = np.linspace(low, high, 200_001)
    return {
        "mismatch/logprob_abs_diff": (low + high) / 2 * math.sqrt(2 / math.pi),  # E|δ| = E[σ]·√(2/π)
        "rollout_kl/abs": (low + high) / 2 * math.sqrt(2 / math.pi),  # E over rows of the row mean |δ|
        "rollout_corr/k3_kl": float(np.mean(np.exp(grid**2 / 2))) - 1.0,  # E[exp(δ) − δ − 1] = E[exp(σ²/2)] − 1
    }


def test_the_interval_covers_the_true_difference_at_least_90_percent_of_the_time() -> None:
    rng = np.random.default_rng(20261123)
    scale_a, scale_b = (0.05, 0.35), (0.10, 0.40)
    true_difference = {name: truth(scale_b)[name] - truth(scale_a)[name] for name in truth(scale_a)}
    covered = dict.fromkeys(true_difference, 0)
    repetitions = 100
    for repetition in range(repetitions):
        a = side("A", simulated_rows(rng, scale_a))
        b = side("B", simulated_rows(rng, scale_b))
        found = {m.metric: m for m in diff(a, b, presets=[], replicates=300, seed=repetition).metrics}
        for name, difference in true_difference.items():
            covered[name] += found[name].low <= difference <= found[name].high
    for name, count in covered.items():
        assert count / repetitions >= 0.90, (name, count)


def constant_rows(values_by_step: list[float], per_step: int = 10) -> RowStats:
    """Every row of step s has |δ| = values_by_step[s] on each of its 4 tokens."""
    steps = np.repeat(np.arange(len(values_by_step)), per_step)
    tokens = np.full(steps.size, 4.0)
    sums = {name: np.zeros(steps.size) for name in ROW_SUMS}
    sums["abs_log_ratio"] = tokens * np.asarray(values_by_step)[steps]
    return RowStats(steps, tokens, sums)


def test_rows_are_resampled_within_steps() -> None:
    # rows alike within each step: a within-step resample always gives the same mean; a pooled one would not
    rows = constant_rows([0.1, 0.9])
    found = {m.metric: m for m in diff(side("A", rows), side("B", rows), presets=[], replicates=200).metrics}
    metric = found["mismatch/logprob_abs_diff"]
    assert metric.low == pytest.approx(0.0, abs=1e-15) and metric.high == pytest.approx(0.0, abs=1e-15)
    assert metric.verdict == SAME


def test_verdicts_seeds_and_bad_settings() -> None:
    rng = np.random.default_rng(1)
    small, large = simulated_rows(rng, (0.05, 0.1)), simulated_rows(rng, (0.3, 0.4))
    worse = {m.metric: m for m in diff(side("A", small), side("B", large), presets=[], replicates=200).metrics}
    better = {m.metric: m for m in diff(side("A", large), side("B", small), presets=[], replicates=200).metrics}
    assert worse["mismatch/logprob_abs_diff"].verdict == WORSE and better["rollout_corr/k3_kl"].verdict == BETTER
    assert worse["mismatch/logprob_abs_diff"].ratio == pytest.approx(
        worse["mismatch/logprob_abs_diff"].b / worse["mismatch/logprob_abs_diff"].a
    )
    again = {m.metric: m for m in diff(side("A", small), side("B", large), presets=[], replicates=200).metrics}
    other = {m.metric: m for m in diff(side("A", small), side("B", large), presets=[], replicates=200, seed=5).metrics}
    name = "rollout_corr/k3_kl"
    assert (again[name].low, again[name].high) == (worse[name].low, worse[name].high)
    assert (other[name].low, other[name].high) != (worse[name].low, worse[name].high)
    with pytest.raises(ConfigError, match="replicates"):
        diff(side("A", small), side("B", large), replicates=10)
    with pytest.raises(ConfigError, match="level"):
        diff(side("A", small), side("B", large), level=1.5)


# ----------------------------------------------------------------------------------------- on dumps
@pytest.fixture(scope="module")
def two_dumps(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """run A (steps 0–2), run B (steps 3–5, more mismatch) and both in one file."""
    folder = tmp_path_factory.mktemp("diff")
    rows_a = random_rows(11, steps=(0, 1, 2), rows_per_step=12)
    rows_b = random_rows(12, steps=(3, 4, 5), rows_per_step=12)
    for row in rows_b:  # B: the rollout logprobs sit twice as far from the trainer's
        pairs = zip(row["rollout"], row["trainer"], strict=True)
        row["rollout"] = [min(0.0, float(np.float32(2 * r - t))) for r, t in pairs]
    return (
        write_sequence_dump(folder / "a.parquet", rows_a),
        write_sequence_dump(folder / "b.parquet", rows_b),
        write_sequence_dump(folder / "ab.parquet", rows_a + rows_b),
    )


def same_tables(found: list[dict], expected: list[dict]) -> None:
    assert len(found) == len(expected)
    for row, want in zip(found, expected, strict=True):
        assert row.keys() == want.keys()
        for key, value in want.items():
            assert row[key] == (pytest.approx(value, rel=1e-12) if isinstance(value, float) else value), key


def test_two_dumps_and_one_dump_split_by_steps_give_the_same_values(two_dumps: tuple[Path, Path, Path]) -> None:
    path_a, path_b, both = two_dumps
    separate = diff_runs(str(path_a), str(path_b), device="cpu", presets=["verl"], chunk_tokens=37, replicates=200)
    split = diff_runs(str(both), steps_a=(0, 2), steps_b=(3, None), device="cpu", presets=["verl"], replicates=200)
    analysis_a, analysis_b = rd.analyze(str(path_a), device="cpu"), rd.analyze(str(path_b), device="cpu")
    for result in (separate, split):
        for metric in result.metrics:
            if metric.metric in analysis_a.run.metrics:
                assert metric.a == pytest.approx(analysis_a.run.metrics[metric.metric], rel=1e-12)
                assert metric.b == pytest.approx(analysis_b.run.metrics[metric.metric], rel=1e-12)
    # a step range of one dump is exactly the dump of those steps: per-round and per-position tables too
    same_tables(split.b.result.rounds, analysis_b.rounds)
    same_tables(split.a.result.positions, analysis_a.positions)
    assert [step.step for step in split.a.result.steps] == [0, 1, 2]


def test_preset_rejection_shares_equal_compare_presets(two_dumps: tuple[Path, Path, Path]) -> None:
    path_a, path_b, _ = two_dumps
    result = diff_runs(str(path_a), str(path_b), device="cpu", replicates=200)
    comparison = rd.compare_presets(str(path_b), device="cpu")
    for preset in result.presets:
        expected = comparison.preset(preset.preset).run.metrics["summary/rejected_token_fraction"]
        assert preset.b == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert {p.preset for p in result.changed_presets} == {p.preset for p in result.presets if p.low > 0 or p.high < 0}


def test_cli_json_follows_the_schema_and_names_changed_presets(two_dumps: tuple[Path, Path, Path]) -> None:
    path_a, path_b, _ = two_dumps
    document = json.loads(succeeded(invoke("diff", path_a, path_b, "--device", "cpu", "-f", "json")))
    jsonschema.validate(document, json.loads((SCHEMAS / "diff.schema.json").read_text()))
    assert document["bootstrap"] == {"replicates": 1000, "level": 0.95, "seed": 0, "unit": "rows"}
    by_metric = {m["metric"]: m for m in document["metrics"]}
    assert by_metric["mismatch/logprob_abs_diff"]["verdict"] == "worse"
    assert document["changed_presets"] == [p["preset"] for p in document["presets"] if p["changed"]]
    table = succeeded(invoke("diff", path_a, path_b, "--device", "cpu", "--replicates", "200"))
    assert "logprob_abs_diff" in table and "worse" in table and "95% low" in table and "95% high" in table


def test_cli_errors_are_one_line(two_dumps: tuple[Path, Path, Path]) -> None:
    path_a, path_b, both = two_dumps
    assert "--steps-a and --steps-b" in error_line(invoke("diff", both, "--device", "cpu"))
    assert "one or two dumps" in error_line(invoke("diff", path_a, path_b, both, "--device", "cpu"))
    assert "FIRST:LAST" in error_line(invoke("diff", both, "--steps-a", "a:b", "--steps-b", "3:5"))
    assert "no step in steps 10:20" in error_line(
        invoke("diff", both, "--steps-a", "10:20", "--steps-b", "3:5", "--device", "cpu")
    )
    assert "replicates" in error_line(invoke("diff", path_a, path_b, "--replicates", "5", "--device", "cpu"))


def test_report_vs_adds_the_a_b_section(two_dumps: tuple[Path, Path, Path], tmp_path: Path) -> None:
    path_a, path_b, _ = two_dumps
    out = tmp_path / "r.html"
    result = invoke("report", path_a, "--vs", path_b, "--device", "cpu", "--preset", "verl", "-o", out)
    assert result.exit_code == 0, result.output
    html = out.read_text()
    assert "Run A against run B" in html and 'data-figure="diff-rounds"' in html
    assert 'data-figure="diff-positions"' in html and "mismatch/logprob_abs_diff" in html
    assert re.search(r"[\d.,]+× (lower|higher)|>same<", html) and ">B/A<" not in html  # as the terminal says it
    assert "Which correction should I turn on?" in html
    # the A/B answer is in the banner, above every section (it was 11 560 px down the page)
    banner = html.split('<div class="overall', 1)[1].split("</div>", 1)[0]
    assert "<strong>A/B:</strong> B against A: " in banner and 'href="#diff"' in banner
    assert html.index("<strong>A/B:</strong>") < html.index('<section id="')


def test_presets_with_the_same_numbers_share_a_row_as_in_compare_presets(two_dumps: tuple[Path, Path, Path]) -> None:
    path_a, path_b, _ = two_dumps
    result = diff_runs(str(path_a), str(path_b), device="cpu", replicates=200)
    grouped = result.changed_preset_groups
    # verl's k3 rejection in decoupled and bypass mode drops the same tokens offline: one group, one row
    k3 = next(group for group in grouped if group[0].preset == "decoupled_k3_rs")
    assert "bypass_ppo_clip_k3_rs" in [p.preset for p in k3]
    assert [p.preset for group in grouped for p in group] == [p.preset for p in result.changed_presets]
    for group in grouped:
        assert len({(p.a, p.b, p.difference, p.low, p.high) for p in group}) == 1
    table = succeeded(invoke("diff", path_a, path_b, "--device", "cpu", "--replicates", "200"))
    rows = re.findall(r"^│ (\S+)(?: \+(\d+))? ", table[table.index("Presets whose share") :], re.MULTILINE)
    assert [(name, int(more or 0)) for name, more in rows] == [(g[0].preset, len(g) - 1) for g in grouped]
    assert "decoupled_k3_rs also stands for " in " ".join(table.split())
