"""``compare-presets -f json`` written piece by piece from the pass's columns (200 000 steps × 25 presets, issue 20
item 3): joined, the pieces are exactly ``json.dumps(document, indent=2)`` + newline of the document ``to_json()``
builds, with each list of a per-step block on one line (``comparison_text``), whatever the presets' parts report per
step (steps a part has not seen, key groups on some steps only, a preset value overriding a §1 key, NaN and
infinities)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers.compare import _Corrections, comparison_text
from helpers.dumps import write_sequence_dump
from helpers.steps import tiny_rows
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_diag.decisions.recommend import sort_by_intrusiveness
from rollout_diag.drivers.compare import compare_presets
from rollout_diag.metrics.outcome import PresetSteps
from rollout_diag.render.export import comparison_json_pieces
from rollout_diag.results import (
    ComparisonResult,
    MetricColumns,
    PresetResult,
    StepResult,
    StepTable,
    json_number,
)

SAMPLES = Path(__file__).resolve().parents[2] / "sample_data"


_dumps = comparison_text


@pytest.fixture(scope="module")
def tiny_steps(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("json_writers_compare")
    return str(write_sequence_dump(folder / "steps.parquet", tiny_rows(300), row_group_size=256))


def test_compare_json_written_from_columns_is_the_document(tiny_steps: str) -> None:
    result = compare_presets(tiny_steps, device="cpu", workers=1)
    assert isinstance(result.presets[0].steps, PresetSteps) and len(result.presets) > 10
    written = "".join(comparison_json_pieces(result))
    assert written == _dumps(result.to_json())
    assert json.loads(written)["presets"][2]["steps"]["step"][5] == 5


@pytest.mark.parametrize(
    "options",
    [
        {"presets": ["verl"]},
        {"presets": ["legacy"], "steps": "10:40"},
        {"presets": ["decoupled_token_icepop", "legacy_token_mask"], "by": ["num_rounds"]},
    ],
)
def test_compare_json_of_a_choice_of_presets_is_the_document(tiny_steps: str, options: dict) -> None:
    from rollout_diag.selection import parse_step_range

    if "steps" in options:
        options = {**options, "steps": parse_step_range(options["steps"], "--steps")}
    result = compare_presets(tiny_steps, device="cpu", workers=1, **options)
    assert "".join(comparison_json_pieces(result)) == _dumps(result.to_json())
    ordered = sort_by_intrusiveness(result)
    assert "".join(comparison_json_pieces(ordered)) == _dumps(ordered.to_json())


@pytest.mark.parametrize("name", ["synthetic_multiturn.parquet", "textgenrnn_bf16_vs_fp32.parquet"])
def test_compare_json_of_the_samples_is_the_document(name: str) -> None:
    result = compare_presets(str(SAMPLES / name), device="cpu")
    assert "".join(comparison_json_pieces(result)) == _dumps(result.to_json())


def test_compare_json_of_a_result_read_back_is_the_document(tiny_steps: str) -> None:
    """A result from JSON holds plain lists of steps: written step by step, the same text."""
    result = compare_presets(tiny_steps, device="cpu", presets=["verl"], workers=1)
    again = ComparisonResult.from_json(json.loads("".join(comparison_json_pieces(result))))
    assert not isinstance(again.presets[0].steps, PresetSteps)
    assert "".join(comparison_json_pieces(again)) == _dumps(again.to_json()) == _dumps(result.to_json())


def test_compare_json_without_steps() -> None:
    empty = ComparisonResult(inputs=["x"], columns={}, presets=[])
    assert "".join(comparison_json_pieces(empty)) == _dumps(empty.to_json())


def test_the_cli_writes_the_document(tiny_steps: str, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from rollout_diag.cli import app

    out = tmp_path / "c.json"
    run = CliRunner().invoke(app, ["compare-presets", tiny_steps, "-f", "json", "-o", str(out), "--preset", "verl"])
    assert run.exit_code == 0, run.output
    assert run.stderr.count(f"wrote {out}") == 1
    expected = compare_presets(tiny_steps, device="cpu", presets=["verl"])
    assert out.read_text() == _dumps(expected.to_json())


# ----------------------------------------------------------------------------------------- preset step columns
_OWN = ["rollout_corr/k3_kl", "rollout_corr/ppl", "other/x"]
_PART = ["rollout_corr/k3_kl", "rollout_corr/is_mean", "summary/dropped", "b"]
_FLOATS = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, -0.0, 1e-300, 1e300])


def _floats(draw, count: int) -> np.ndarray:
    return np.array(draw(st.lists(_FLOATS, min_size=count, max_size=count)), dtype=np.float64)


def _flags(draw, count: int) -> np.ndarray:
    return np.array(draw(st.lists(st.booleans(), min_size=count, max_size=count)), dtype=bool)


@st.composite
def _preset_steps(draw) -> PresetSteps:
    count = draw(st.integers(0, 30))
    ids = np.array(sorted(draw(st.lists(st.integers(-3, 10**12), min_size=count, max_size=count, unique=True))))
    groups = []
    for _ in range(draw(st.integers(0, 3))):
        names = draw(st.lists(st.sampled_from(_OWN), min_size=1, max_size=3, unique=True))
        if draw(st.booleans()):
            values = {name: _floats(draw, count) for name in names}
        else:  # values kept as the family gave them
            values = {}
            for name in names:
                column = np.empty(count, dtype=object)
                column[:] = draw(st.lists(st.none() | st.integers(-5, 5), min_size=count, max_size=count))
                values[name] = column
        groups.append((_flags(draw, count), values))
    counts = [np.array(draw(st.lists(st.integers(0, 10**6), min_size=count, max_size=count))) for _ in range(3)]
    base = StepTable(ids.astype(np.int64), *counts, MetricColumns(groups, count))
    parts = []
    for _ in range(draw(st.integers(0, 3))):
        # the part's steps: some of the base's (a part may not have seen a step), maybe others
        seen = sorted(
            {int(i) for i, keep in zip(ids.tolist(), _flags(draw, count).tolist(), strict=True) if keep}
            | set(draw(st.lists(st.integers(-3, 50), max_size=3)))
        )
        size = len(seen)
        part_groups = []
        for _ in range(draw(st.integers(1, 3))):
            names = draw(st.lists(st.sampled_from(_PART), min_size=1, max_size=3, unique=True))
            part_groups.append((_flags(draw, size), {name: _floats(draw, size) for name in names}))
        parts.append((np.array(seen, dtype=np.int64), part_groups))
    return PresetSteps(base, _Corrections(parts), "p")  # type: ignore[arg-type]


# the settings every preset's config names (comparison.schema.json, which a document read back is checked against)
CONFIG = {
    "rollout_is": None,
    "rollout_is_threshold": None,
    "rollout_is_batch_normalize": False,
    "rollout_rs": None,
    "rollout_rs_threshold": None,
}


@settings(max_examples=150, deadline=None)
@given(_preset_steps())
def test_preset_columns_are_each_steps_values(steps: PresetSteps) -> None:
    """A preset's columns hold each step's value of its own keys (null where the step has none); laid over the
    top-level §1 columns they give each step's metrics, and a preset read back from them equals the pass's."""
    expected = list(steps)
    result = ComparisonResult(
        inputs=["x"],
        columns={},
        presets=[PresetResult("p", CONFIG, "m", steps, expected[0] if expected else StepResult(None, 0, 0, {}))],
    )  # type: ignore[arg-type]
    document = result.to_json()
    top, own = document["steps"], document["presets"][0]["steps"]
    assert top["step"] == own["step"] == [step.step for step in expected]
    assert [top[name] for name in ("rows", "tokens", "empty_rows")] == [
        [getattr(step, name) for step in steps.base] for name in ("rows", "tokens", "empty_rows")
    ]
    for index, step in enumerate(expected):
        folded = {name: values[index] for name, values in top.items() if name.startswith("rollout_corr/")}
        folded.update((name, values[index]) for name, values in own.items() if values[index] is not None)
        folded = {name: value for name, value in folded.items() if value is not None and name != "step"}
        for name, value in step.metrics.items():
            if json_number(value) is not None:
                assert folded.pop(name) == value, (index, name)
            elif name in folded:  # a non-finite preset value of a §1 key: null, which a reader reads as "no value"
                assert name in top and top[name][index] == folded.pop(name)
        assert not folded, index
    assert "".join(comparison_json_pieces(result)) == comparison_text(document)
    again = ComparisonResult.from_json(json.loads(comparison_text(document)))
    assert "".join(comparison_json_pieces(again)) == comparison_text(document)
