"""Threshold sweep against brute force over the float64 reference's row and token statistics."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers.metrics import as_reference_rows, random_rows, write_dump
from helpers.reference import rs_row_values, rs_token_stats
from hypothesis import given, settings
from hypothesis import strategies as st

import rollout_diag as rd

TARGETS = (0.01, 0.1, 0.3)


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    rng = np.random.default_rng(5)
    steps = {step: random_rows(rng, 60, max_len=50) for step in (1, 2)}
    path = tmp_path_factory.mktemp("sweep") / "dump.parquet"
    write_dump(path, steps, row_group_size=13)
    result = rd.threshold_sweep(str(path), targets=TARGETS, device="cpu", chunk_tokens=211)
    rows = as_reference_rows([row for rows in steps.values() for row in rows])
    return {row.option: row.to_json() for row in result.run}, rows  # the documented JSON rows


def valid(rows):
    return [row for row in rows if row[2].sum() > 0]


@pytest.mark.parametrize(
    "option",
    ["seq_sum_k1", "seq_mean_k1", "seq_sum_k2", "seq_mean_k2", "seq_max_k2", "seq_sum_k3", "seq_mean_k3", "seq_max_k3"],
)
def test_sequence_thresholds_are_exact(swept, option):
    table, rows = swept
    values = np.array(rs_row_values(valid(rows), option))
    scores = np.abs(values) if option.endswith("k1") else values
    for entry in table[option]["thresholds"]:
        metric = math.log(entry["threshold"]) if option.endswith("k1") else entry["threshold"]
        share = np.mean(scores > metric * (1 + 1e-12))
        assert entry["share"] == pytest.approx(share)
        assert share <= entry["target"]
        # the threshold is a row's own score: the next score down would reject more than the target
        below = scores[scores < metric * (1 - 1e-12)]
        if below.size:
            assert np.mean(scores > below.max()) > entry["target"] or np.mean(scores >= metric) > entry["target"]


def test_verl_default_shares_are_exact(swept):
    table, rows = swept
    # seq_mean_k3 ≤ 0.01 (verl's k3 RS default): share of valid rows above 0.01
    k3 = np.array(rs_row_values(valid(rows), "seq_mean_k3"))
    assert table["seq_mean_k3"]["default_share"] == pytest.approx(np.mean(k3 > 0.01))
    # seq_mean_k1 "0.999_1.001": keep log 0.999 ≤ R_i[k1] ≤ log 1.001
    k1 = np.array(rs_row_values(valid(rows), "seq_mean_k1"))
    outside = (k1 < math.log(0.999)) | (k1 > math.log(1.001))
    assert table["seq_mean_k1"]["default_share"] == pytest.approx(np.mean(outside))
    # IS sequence level: s_i = S_i[δ] > log 2
    s = np.array([float(((a - r) * m).sum()) for a, r, m in valid(rows)])
    assert table["is_sequence"]["default_share"] == pytest.approx(np.mean(s > math.log(2.0)))


@pytest.mark.parametrize("option", ["token_k1", "token_k2", "token_k3", "is_token"])
def test_token_thresholds_are_conservative_and_within_one_bin(swept, option):
    table, rows = swept
    statistic = "token_k1" if option == "is_token" else option
    tokens = np.array([v for row in rs_token_stats(rows, statistic) for v in row])
    if option == "is_token":
        scores, to_metric = -tokens, math.log  # c = −k1; truncated when c > log U
    elif option == "token_k1":
        scores, to_metric = np.abs(tokens), math.log
    else:
        scores, to_metric = tokens, float
    bin_factor = 10 ** (1 / 32)
    for entry in table[option]["thresholds"]:
        metric = to_metric(entry["threshold"])
        exact = np.mean(scores > metric)
        assert exact <= entry["share"] + 1e-12 <= entry["target"] + 1e-12  # the reported share bounds the truth
        # two bins lower (in |c|) the target would be exceeded: the threshold is not loose
        if option in ("token_k1", "is_token"):
            assert np.mean(scores > metric / bin_factor**2) > entry["target"]
        elif option == "token_k2":
            assert np.mean(scores > metric / bin_factor**4) > entry["target"]  # k2 = ½c²: squared factor


def test_curves_pass_through_the_verl_default_marker(swept):
    """The report marks verl's default on each curve: the curve holds a point at that threshold, whose share is
    the default's share (symmetric defaults) or at least it (seq_mean_k1's 0.999_1.001 rejects a hair less below
    than above). Drawn between 41 log-spaced samples of a step function, the marker once sat off the line."""
    table, _ = swept
    checked = 0
    for name, row in table.items():
        curve, default = row.get("curve") or [], row.get("default_threshold")
        if default is None or not curve or not curve[0]["threshold"] < default < curve[-1]["threshold"]:
            continue
        at = [point for point in curve if point["threshold"] == pytest.approx(default, rel=1e-12)]
        assert len(at) == 1, name
        assert at[0]["share"] >= row["default_share"] - 1e-15, name
        if name != "seq_mean_k1":
            assert at[0]["share"] == pytest.approx(row["default_share"]), name
        checked += 1
    assert checked >= 1


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.text(max_size=4),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
            lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=4),
            max_leaves=20,
        ),
        max_size=5,
    )
)
def test_json_pieces_are_the_indented_document(document: dict) -> None:
    """``sweep -f json`` writes its document piece by piece: joined, the pieces are json.dumps(indent=2) + newline,
    for any document of JSON values (empty lists and dicts, nesting, non-ASCII text, signed zeros, big ints)."""
    from rollout_diag.render.export import json_pieces, to_json_text

    assert "".join(json_pieces(document)) == to_json_text(document)


def test_json_pieces_refuse_what_to_json_text_refuses() -> None:
    from rollout_diag.render.export import json_pieces, to_json_text

    for bad in ({"steps": [{"x": math.nan}]}, {"run": math.inf}, {"x": [object()]}):
        with pytest.raises((ValueError, TypeError)) as expected:
            to_json_text(bad)
        with pytest.raises(expected.type):
            "".join(json_pieces(bad))
