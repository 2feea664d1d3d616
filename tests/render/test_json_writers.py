"""JSON documents written piece by piece from columns (``analyze -f json``, ``check -f json`` on 200 000 steps,
issue 20 item 3): joined, the pieces are exactly ``json.dumps(document, indent=2)`` + newline of the document
``to_json()`` builds, whatever the steps report (key groups present on some steps only, keys repeated across groups,
NaN and infinities, values kept as objects, a framework's key order)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from helpers.dumps import write_sequence_dump
from helpers.steps import tiny_rows
from hypothesis import given, settings
from hypothesis import strategies as st

import rollout_diag as rd
from rollout_diag.render.export import ItemTexts, analysis_json_pieces, json_pieces, row_texts, step_texts, to_json_text
from rollout_diag.results import MetricColumns, Rows, StepResult, StepTable

SAMPLES = Path(__file__).resolve().parents[2] / "sample_data"


def _dumps(document: dict) -> str:
    """The reference: the standard library's own encoder."""
    return json.dumps(document, indent=2, allow_nan=False) + "\n"


# ----------------------------------------------------------------------------------------- analyze
@pytest.fixture(scope="module")
def tiny_steps(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("json_writers")
    return str(write_sequence_dump(folder / "steps.parquet", tiny_rows(700), row_group_size=256))


@pytest.mark.parametrize("dialect", ["verl", "all"])
def test_analyze_json_written_from_columns_is_the_document(tiny_steps: str, dialect: str) -> None:
    result = rd.analyze(tiny_steps, device="cpu", dialect=dialect)
    assert isinstance(result.steps, StepTable) and isinstance(result.positions, Rows)
    written = "".join(analysis_json_pieces(result))
    assert written == _dumps(result.to_json())
    assert json.loads(written)["steps"][3]["step"] == 3


@pytest.mark.parametrize("name", ["synthetic_multiturn.parquet", "textgenrnn_bf16_vs_fp32.parquet"])
def test_analyze_json_of_the_samples_is_the_document(name: str) -> None:
    result = rd.analyze(str(SAMPLES / name), device="cpu", dialect="all")
    assert "".join(analysis_json_pieces(result)) == _dumps(result.to_json())


def test_analyze_json_of_a_result_read_back_is_the_document(tiny_steps: str) -> None:
    """A result from JSON holds plain lists: written item by item, the same text."""
    result = rd.analyze(tiny_steps, device="cpu")
    again = type(result).from_json(json.loads(to_json_text(result.to_json())))
    assert not isinstance(again.steps, StepTable)
    assert "".join(analysis_json_pieces(again)) == _dumps(again.to_json())


# ----------------------------------------------------------------------------------------- step columns
_NAMES = ["a", "b", "c/d", "per_round/round_0/k3_kl", "é"]
_FLOATS = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, -0.0, 1e-300, 1e300])


@st.composite
def _metric_columns(draw, count: int) -> MetricColumns:
    groups = []
    for _ in range(draw(st.integers(0, 4))):
        present = np.array(draw(st.lists(st.booleans(), min_size=count, max_size=count)), dtype=bool)
        names = draw(st.lists(st.sampled_from(_NAMES), min_size=1, max_size=3, unique=True))
        values: dict[str, np.ndarray] = {}
        for name in names:
            if draw(st.booleans()):
                values[name] = np.array(draw(st.lists(_FLOATS, min_size=count, max_size=count)), dtype=np.float64)
            else:  # values kept as the family gave them
                items = draw(
                    st.lists(st.none() | st.integers(-5, 5) | st.text(max_size=3), min_size=count, max_size=count)
                )
                column = np.empty(count, dtype=object)
                column[:] = items
                values[name] = column
        groups.append((present, values))
    order = draw(st.none() | st.permutations(_NAMES).map(lambda names: {n: i for i, n in enumerate(names[:3])}))
    return MetricColumns(groups, count, order)


@st.composite
def _step_tables(draw) -> StepTable:
    count = draw(st.integers(0, 40))
    ids = np.array(sorted(draw(st.lists(st.integers(-3, 10**12), min_size=count, max_size=count, unique=True))))
    counts = [np.array(draw(st.lists(st.integers(0, 10**6), min_size=count, max_size=count))) for _ in range(3)]
    dialects = {
        name: draw(_metric_columns(count)) for name in draw(st.lists(st.sampled_from(["verl", "x"]), unique=True))
    }
    return StepTable(ids.astype(np.int64), *counts, draw(_metric_columns(count)), dialects)


@settings(max_examples=150, deadline=None)
@given(_step_tables())
def test_step_texts_are_each_steps_json(table: StepTable) -> None:
    steps = list(table)
    documents = [step.to_json() for step in steps]
    written = "".join(json_pieces({"steps": ItemTexts(len(table), lambda: step_texts(table)) if len(table) else []}))
    assert written == _dumps({"steps": documents})
    # the same steps as a plain list: written step by step
    assert "".join(step_texts(steps)) == "".join(step_texts(table))


def test_a_step_reporting_a_key_twice_takes_its_first_place_and_last_value() -> None:
    present = np.array([True, True, False])
    groups = [
        (present, {"x": np.array([1.0, 2.0, 3.0]), "y": np.array([4.0, 5.0, 6.0])}),
        (np.array([False, True, True]), {"x": np.array([7.0, math.nan, 9.0])}),
    ]
    table = StepTable(np.arange(3), np.ones(3), np.ones(3), np.zeros(3), MetricColumns(groups, 3))
    texts = [json.loads(text)["metrics"] for text in step_texts(table)]
    assert texts == [{"x": 1.0, "y": 4.0}, {"x": None, "y": 5.0}, {"x": 9.0}]
    assert list(texts[1]) == ["x", "y"]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.dictionaries(st.sampled_from(["step", "k"]), st.integers(0, 9), min_size=2, max_size=2), max_size=3),
    st.integers(0, 30),
    st.data(),
)
def test_row_texts_are_each_rows_json(head: list[dict], count: int, data) -> None:
    columns = {
        "step": np.array(data.draw(st.lists(st.integers(-9, 9**9), min_size=count, max_size=count)), dtype=np.int64),
        "bucket": np.array(data.draw(st.lists(st.text(max_size=3), min_size=count, max_size=count)), dtype=object),
        "share": np.array(data.draw(st.lists(_FLOATS, min_size=count, max_size=count)), dtype=np.float64),
        "flag": np.array(data.draw(st.lists(st.booleans(), min_size=count, max_size=count)), dtype=bool),
    }
    rows = Rows(head, columns)
    expected = [
        {key: None if isinstance(v, float) and not math.isfinite(v) else v for key, v in row.items()} for row in rows
    ]
    written = "".join(json_pieces({"positions": ItemTexts(len(rows), lambda: row_texts(rows)) if len(rows) else []}))
    assert written == _dumps({"positions": expected})


def test_a_float32_metric_column_fails_as_the_document_does() -> None:
    """json cannot encode a numpy float32: the pieces raise as ``to_json_text`` does, never write other bytes."""
    groups = [(np.ones(2, dtype=bool), {"x": np.array([1.0, 2.0], dtype=np.float32)})]
    table = StepTable(np.arange(2), np.ones(2), np.ones(2), np.zeros(2), MetricColumns(groups, 2))
    with pytest.raises(TypeError):
        to_json_text({"steps": [step.to_json() for step in table]})
    with pytest.raises(TypeError):
        "".join(step_texts(table))


def test_step_results_equal_their_columns() -> None:
    """The guard of the templated text: a step read back from the written JSON is the step of the table."""
    groups = [(np.array([True, False]), {"x": np.array([0.5, 1.5])})]
    table = StepTable(np.array([4, 9]), np.array([1, 2]), np.array([3, 4]), np.array([0, 1]), MetricColumns(groups, 2))
    read = [StepResult.from_json(json.loads(text)) for text in step_texts(table)]
    assert read == list(table)


# ----------------------------------------------------------------------------------------- check
def test_check_json_written_outcome_by_outcome_is_the_document(tiny_steps: str) -> None:
    from rollout_diag.decisions.check import DEFAULT_GATES, FAIL, SKIP, CheckResult, Gate, GateOutcome
    from rollout_diag.drivers.check import check_run

    result = check_run(tiny_steps, list(DEFAULT_GATES), per_step=True, device="cpu")
    assert len(result.outcomes) > 700
    assert "".join(json_pieces(result.json_document())) == _dumps(result.to_json())
    gate = Gate("rollout_corr/k3_kl", "max", 5e-4)
    odd = CheckResult(
        ["x"],
        [gate],
        [
            GateOutcome(gate, None, math.nan, FAIL, None, group="env=a"),
            GateOutcome(gate, 3, None, SKIP, None),
            GateOutcome(gate, 4, math.inf, FAIL, math.inf),
        ],
        warnings=["w"],
    )
    document = odd.to_json()
    assert [outcome["value"] for outcome in document["outcomes"]] == [None, None, None]
    assert "".join(json_pieces(odd.json_document())) == _dumps(document)


# ------------------------------------------------------------------ texts made once (issue 20: 200 000 steps)
_POOL = [0.0, -0.0, 1.0, 0.1, 1e-300, 1e300, 3.0, math.inf, -math.inf, math.nan]
_NAN_PAYLOAD = np.array([0x7FF8000000000001], dtype=np.int64).view(np.float64)[0]


@settings(max_examples=100, deadline=None)
@given(
    st.integers(0, 400).flatmap(lambda n: st.lists(st.sampled_from([*_POOL, _NAN_PAYLOAD]), min_size=n, max_size=n)),
    st.lists(_FLOATS, max_size=20),
    st.booleans(),
)
def test_float_texts_are_each_values_json(repeated: list, other: list, shared: bool) -> None:
    """Repeated values (a block of 64 or more) and equal columns (``made``) are formatted once: the same texts,
    -0.0 and 0.0 apart, every NaN and infinity null."""
    from rollout_diag.render.export import _float_texts

    flat = repeated + other
    column = np.array(flat, dtype=np.float64)
    expected = [json.dumps(value if math.isfinite(value) else None) for value in flat]
    made: dict = {} if shared else None  # type: ignore[assignment]
    assert _float_texts(column, made) == expected
    assert _float_texts(column.copy(), made) == expected  # an equal column: the same texts


@settings(max_examples=60, deadline=None)
@given(st.integers(60, 300), st.data())
def test_step_texts_of_repeated_values_are_each_steps_json(count: int, data) -> None:
    """Blocks of repeated values and equal columns (a dialect copying a metric): the texts formatted once are the
    texts each step's own encoding writes."""
    pick = st.lists(st.sampled_from(_POOL), min_size=count, max_size=count)
    first = np.array(data.draw(pick), dtype=np.float64)
    groups = [(np.ones(count, dtype=bool), {"a": first, "b": np.array(data.draw(pick)), "c": first.copy()})]
    dialect = MetricColumns([(np.arange(count) % 3 > 0, {"x": first.copy()})], count)
    table = StepTable(
        np.arange(count),
        np.ones(count),
        np.ones(count),
        np.zeros(count),
        MetricColumns(groups, count),
        {"verl": dialect},
    )
    written = "".join(json_pieces({"steps": ItemTexts(count, lambda: step_texts(table))}))
    assert written == _dumps({"steps": [step.to_json() for step in table]})


def test_step_levels_are_written_around_their_shared_levels() -> None:
    from rollout_diag.render.export import level_texts

    shared = {"rollout_corr/k3_kl": "bad", "mismatch/x": "ok"}
    entries = [
        {"step": 0, "level": "bad", "levels": shared},
        {"step": 1, "level": "ok", "levels": {}},
        {"step": 2, "level": "bad", "levels": shared},
        {"step": None, "level": "ok", "levels": shared},  # other shapes: encoded as they are
        {"step": True, "level": "ok", "levels": shared},
        {"level": "ok", "step": 3, "levels": shared},
        {"step": 4, "level": "ok", "levels": shared, "more": 1},
        {"step": 5, "level": "ok", "levels": [1]},
        {"step": 6, "level": "é\n", "levels": {"ü": "\t"}},
    ]
    texts = list(level_texts(entries))
    assert texts == [json.dumps(entry, indent=2).replace("\n", "\n    ") for entry in entries]


def test_items_are_written_in_pieces_of_about_a_megabyte(tiny_steps: str, monkeypatch) -> None:
    """Items are joined into larger pieces (fewer writes); any piece size gives the same text."""
    import rollout_diag.render.export as export

    result = rd.analyze(tiny_steps, device="cpu")
    whole = "".join(analysis_json_pieces(result))
    monkeypatch.setattr(export, "_PIECE", 100)
    pieces = list(analysis_json_pieces(result))
    assert "".join(pieces) == whole == _dumps(result.to_json())
    monkeypatch.setattr(export, "_PIECE", 1 << 20)
    assert len(list(analysis_json_pieces(result))) < len(pieces)
