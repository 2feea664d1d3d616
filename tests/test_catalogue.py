"""The metric catalogue: every key the tool reports has one row, every row is reported, and no consumer spells a key.

The families under ``rollout_diag/metrics/`` write the keys they compute (``PREFIX + name``, the prefix from the
catalogue); the catalogue states each key once with everything said about it. The two are tied here: the keys
``analyze``, ``compare-presets`` (every built-in preset plus custom ones that exercise every rejection option and
batch normalisation), ``compute_metrics`` and ``diff``/``check`` produce are exactly the catalogue's rows."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

from rollout_diag import catalogue
from rollout_diag.catalogue import CATALOGUE, PREFIXES, SECTIONS, lookup, parse_round_key, short_name

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "rollout_diag"
SAMPLES = (
    REPO / "sample_data" / "synthetic_multiturn.parquet",
    REPO / "sample_data" / "textgenrnn_bf16_vs_fp32.parquet",
)


def _every_option_presets() -> list:
    """Custom presets that, together with the built-in ones, make every §2/§3 key appear."""
    from rollout_diag import preset_from_options
    from rollout_diag.presets import RS_OPTIONS

    thresholds = ["0.5_2.0" if option.endswith("k1") else "0.01" for option in RS_OPTIONS]
    return [
        preset_from_options(
            "every_rs_option", rollout_rs=list(RS_OPTIONS), rollout_rs_threshold=thresholds, mode="decoupled"
        ),
        preset_from_options(
            "token_is_normalised", rollout_is="token", rollout_is_threshold="2.0", batch_normalize=True
        ),
        preset_from_options(
            "seq_is_normalised", rollout_is="sequence", rollout_is_threshold="0.5_5.0", batch_normalize=True
        ),
    ]


@pytest.fixture(scope="module")
def analyses() -> list:
    from rollout_diag import analyze

    return [analyze(sample, device="cpu") for sample in SAMPLES]


@pytest.fixture(scope="module")
def produced_keys(analyses) -> set[str]:
    """Every metric key the public entry points report on the sample data."""
    from rollout_diag import compare_presets, compute_metrics, get_presets
    from rollout_diag.decisions.rowmetrics import KEY_METRIC_NAMES, rejected_share

    keys: set[str] = set(KEY_METRIC_NAMES) | {rejected_share("decoupled_geo_rs").name}
    presets = [*get_presets(None), *_every_option_presets()]
    for analysis in analyses:
        for step in [analysis.run, *analysis.steps]:
            keys |= set(step.metrics)
        keys |= {verdict.metric for verdict in analysis.verdicts}
        keys |= {anomaly.metric for anomaly in analysis.anomalies}
    comparison = compare_presets(SAMPLES[0], presets, device="cpu")
    for preset in comparison.presets:
        for step in [preset.run, *preset.steps]:
            keys |= set(step.metrics)
    trainer = torch.tensor([[-0.5, -1.0, -0.2, 0.0], [-2.0, -0.1, -0.3, -0.4]], dtype=torch.float64)
    rollout = trainer + torch.tensor([[0.1, -0.3, 0.0, 0.0], [0.5, 0.0, -0.2, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 1], [1, 1, 1, 0]])
    keys |= set(compute_metrics(trainer, rollout, mask, presets=["decoupled_geo_rs", "legacy_token_mask"]))
    return keys


def test_every_key_the_tool_reports_has_a_catalogue_row(produced_keys) -> None:
    missing = sorted(key for key in produced_keys if lookup(key) is None)
    assert missing == []


def test_every_catalogue_row_is_reported_somewhere(produced_keys) -> None:
    """No dead row: each row (pattern rows through a concrete key) is a key something computes."""
    reached = {lookup(key).key for key in produced_keys}
    assert sorted(set(CATALOGUE) - reached) == []


def test_round_rows_name_the_fields_of_the_rounds_table(analyses) -> None:
    """The terminal's per-round table reads each catalogue round row's value from the result's rounds table."""
    rounds = analyses[0].rounds
    assert len(rounds) > 1
    quantities = {catalogue.round_quantity(row) for row in CATALOGUE.values() if row.key.startswith("per_round/round_")}
    assert all(quantities <= set(entry) for entry in rounds)


def test_verl_dialect_keys_are_catalogue_keys() -> None:
    """verl's dialect logs §1 and §5 under the catalogue's own keys (plus its documented @valid_rows variants)."""
    from rollout_diag.metrics.dialects.verl import FRAMEWORK

    names = [metric.name.removesuffix("@valid_rows") for metric in FRAMEWORK.metrics]
    assert names and [name for name in names if name not in CATALOGUE] == []


def test_families_write_their_keys_under_the_catalogue_prefixes() -> None:
    from rollout_diag.metrics import correction, debug, legacy, offpolicy, outcome, rollout_kl, rounds

    assert offpolicy.PREFIX == correction.PREFIX == catalogue.OFFPOLICY_PREFIX
    assert debug.PREFIX == catalogue.DEBUG_PREFIX
    assert rollout_kl.PREFIX == catalogue.ROLLOUT_KL_PREFIX
    assert rounds.PREFIX == catalogue.ROUNDS_PREFIX
    assert legacy.PREFIX == catalogue.LEGACY_PREFIX
    assert outcome.SUMMARY == catalogue.SUMMARY_PREFIX


def test_rows_are_complete_and_stated_once() -> None:
    assert len(catalogue._ROWS) == len(CATALOGUE), "a key is stated twice"
    for row in CATALOGUE.values():
        assert row.section in SECTIONS and row.formula, row.key
        assert row.unit in catalogue.UNITS and row.direction in catalogue.DIRECTIONS, row.key
        assert row.short and row.title and "/" not in row.short, row.key
        assert row.key.startswith(PREFIXES) or row.section == "gates", row.key
        if row.verdict is not None:
            assert 0 < row.verdict.watch < row.verdict.bad and row.verdict.measures, row.key
            assert row.direction == catalogue.UP, "verdicts judge |value|: higher must be worse"


def test_diff_compares_only_metrics_where_higher_is_worse() -> None:
    """diff says "lower is better for every metric": true of each metric it recomputes, by the catalogue."""
    from rollout_diag.decisions.rowmetrics import KEY_METRICS

    for metric in KEY_METRICS:
        row = CATALOGUE[metric.name]
        assert row.direction == catalogue.UP and row.row_meaning == metric.meaning, metric.name


def test_verdict_rules_are_the_catalogue_thresholds() -> None:
    from rollout_diag.decisions.levels import RULES

    with_thresholds = {row.key: row.verdict for row in CATALOGUE.values() if row.verdict is not None}
    assert {rule.metric for rule in RULES} == set(with_thresholds)
    for rule in RULES:
        stated = with_thresholds[rule.metric]
        assert (rule.watch, rule.bad, rule.meaning) == (stated.watch, stated.bad, stated.measures)


def test_glossary_is_the_rows_with_glossary_text_and_skips_empty_sections() -> None:
    from rollout_diag.glossary import GLOSSARY, markdown
    from rollout_diag.report.sections import glossary_section

    assert list(GLOSSARY) == [row.key for row in CATALOGUE.values() if row.high_means]
    assert not any(row.high_means for row in CATALOGUE.values() if row.section == "gates")
    assert SECTIONS["gates"] not in glossary_section().body  # a section with no listed term gets no heading
    assert SECTIONS["gates"] not in markdown()


def test_lookup_maps_generated_keys_to_their_rows() -> None:
    round_kl = CATALOGUE["per_round/round_<k>/kl"]
    assert lookup("per_round/round_17/kl") is round_kl
    assert parse_round_key("per_round/round_17/kl") == (17, round_kl)
    assert catalogue.round_quantity(round_kl) == "kl"  # its name in a result's rounds table
    assert parse_round_key("per_round/num_rounds_max") is None
    assert parse_round_key("per_round/round_3/unknown") is None
    assert lookup("rollout_corr/rollout_rs_seq_max_k3_seq_max").key == "rollout_corr/rollout_rs_<opt>_seq_max"
    assert lookup("rollout_corr/rollout_rs_seq_max_k1_mean") is None  # no such option (§3)
    assert lookup("rollout_corr/rollout_rs_masked_fraction").key == "rollout_corr/rollout_rs_masked_fraction"
    assert lookup("decoupled_k3_rs/rollout_corr/k3_kl") is catalogue.K3_KL  # compute_metrics' preset prefix
    assert lookup("summary/rejected_token_fraction[bypass_pg_is]") is catalogue.REJECTED_TOKEN_FRACTION
    assert lookup("rollout_corr/no_such_metric") is None and lookup("k3_kl") is None


def test_short_names() -> None:
    assert short_name("rollout_corr/k3_kl") == "k3_kl"
    assert short_name("training/rollout_probs_diff_mean") == "probs_diff_mean"
    assert short_name("per_round/round_2/k3_kl") == "k3_kl"
    assert short_name("someone/else/metric") == "metric"  # uncatalogued: the last part of the key
    assert catalogue.legacy_twin(catalogue.IS_MEAN).key == "mismatch/rollout_is_mean"


# ------------------------------------------------------------------------------------------ no second key table
_KEY_SHAPED = re.compile(rf"^(?:{'|'.join(re.escape(prefix) for prefix in PREFIXES)})[\w<>\[\]@/.]*$")
# The catalogue states the keys; families build theirs from its prefixes and rows; dialects log each trainer's own
# names (verl's checked against the catalogue above). Nothing else spells a key.
_ALLOWED = (PACKAGE / "catalogue.py", PACKAGE / "metrics" / "dialects")


def _docstrings(tree: ast.AST) -> set[int]:
    nodes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    ids = set()
    for node in ast.walk(tree):
        first = node.body[0] if isinstance(node, nodes) and node.body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            ids.add(id(first.value))
    return ids


def key_literals(source: str) -> list[tuple[int, str]]:
    """(line, text) of each string literal outside docstrings that is a metric key, a key prefix or key-shaped
    (f-string parts included: ``f"rollout_corr/{name}"`` has the part ``rollout_corr/``)."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        literal = isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
        if literal and (node.value in CATALOGUE or _KEY_SHAPED.match(node.value)):
            found.append((node.lineno, node.col_offset, node.value))
    return [(line, text) for line, _, text in sorted(found)]


def test_key_literal_detector_finds_the_forms_a_key_table_takes() -> None:
    source = (
        '"""Docstrings may name rollout_corr/k3_kl."""\n'
        'RULES = ("rollout_corr/k3_kl", 1e-3)\n'
        'def f(name):\n    return {"k": f"mismatch/{name}", "m": "token_mult_prob_error", "t": "see training/ docs"}\n'
    )
    assert [text for _, text in key_literals(source)] == ["rollout_corr/k3_kl", "mismatch/", "token_mult_prob_error"]


def test_no_consumer_carries_its_own_metric_key_table() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if any(path == allowed or allowed in path.parents for allowed in _ALLOWED):
            continue
        for line, text in key_literals(path.read_text(encoding="utf-8")):
            offenders.append(f"{path.relative_to(REPO)}:{line}: {text!r}")
    assert offenders == [], "read the key from rollout_diag.catalogue instead"
