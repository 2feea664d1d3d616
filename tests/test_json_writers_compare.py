"""``compare-presets -f json`` written piece by piece from the pass's columns (200 000 steps × 25 presets is about
12 GB of JSON, issue 20 item 3): joined, the pieces are exactly ``json.dumps(document, indent=2)`` + newline of the
document ``to_json()`` builds, whatever the presets' parts report per step (steps a part has not seen, key groups on
some steps only, a preset value overriding a §1 key, NaN and infinities)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from dumps import write_sequence_dump
from hypothesis import given, settings
from hypothesis import strategies as st
from test_many_steps import tiny_rows

from rollout_diag.decisions.recommend import sort_by_intrusiveness
from rollout_diag.drivers.compare import compare_presets
from rollout_diag.metrics.outcome import PresetSteps
from rollout_diag.render.export import comparison_json_pieces, preset_step_texts
from rollout_diag.results import ComparisonResult, MetricColumns, StepTable

SAMPLES = Path(__file__).resolve().parent.parent / "sample_data"


def _dumps(document: dict) -> str:
    """The reference: the standard library's own encoder."""
    return json.dumps(document, indent=2, allow_nan=False) + "\n"


@pytest.fixture(scope="module")
def tiny_steps(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("json_writers_compare")
    return str(write_sequence_dump(folder / "steps.parquet", tiny_rows(300), row_group_size=256))


def test_compare_json_written_from_columns_is_the_document(tiny_steps: str) -> None:
    result = compare_presets(tiny_steps, device="cpu", workers=1)
    assert isinstance(result.presets[0].steps, PresetSteps) and len(result.presets) > 10
    written = "".join(comparison_json_pieces(result))
    assert written == _dumps(result.to_json())
    assert json.loads(written)["presets"][2]["steps"][5]["step"] == 5


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


class _Corrections:
    """Stands for CorrectionAnalysis: per part, (its steps, its key groups)."""

    def __init__(self, parts: list) -> None:
        self.parts = parts

    def step_columns(self, name: str) -> list:
        return self.parts


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


@settings(max_examples=150, deadline=None)
@given(_preset_steps())
def test_preset_step_texts_are_each_steps_json(steps: PresetSteps) -> None:
    newline = "\n        "
    expected = [json.dumps(step.to_json(), indent=2, allow_nan=False).replace("\n", newline) for step in steps]
    assert list(preset_step_texts(steps, newline)) == expected
    assert list(preset_step_texts(list(steps), newline)) == expected  # a plain list: step by step


def test_a_preset_value_overrides_a_first_section_key_in_its_place() -> None:
    """``with_metrics``: the step's §1 keys first, a preset's value of one of them in that key's place."""
    groups = [(np.ones(2, dtype=bool), {"rollout_corr/k3_kl": np.array([1.0, 2.0]), "x": np.array([0.0, 0.0])})]
    base = StepTable(np.array([3, 4]), np.ones(2), np.ones(2), np.zeros(2), MetricColumns(groups, 2))
    part = (np.array([4]), [(np.array([True]), {"summary/y": np.array([5.0]), "rollout_corr/k3_kl": [math.inf]})])
    part = (part[0], [(part[1][0][0], {k: np.asarray(v, dtype=np.float64) for k, v in part[1][0][1].items()})])
    steps = PresetSteps(base, _Corrections([part]), "p")  # type: ignore[arg-type]
    texts = [json.loads(text)["metrics"] for text in preset_step_texts(steps, "\n")]
    assert texts == [{"rollout_corr/k3_kl": 1.0}, {"rollout_corr/k3_kl": None, "summary/y": 5.0}]
    assert list(texts[1]) == ["rollout_corr/k3_kl", "summary/y"]
