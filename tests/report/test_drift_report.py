"""The report's "Why did it move?" section: drawn from the result's drift, the sentence when beyond noise, absent
without two steps."""

from __future__ import annotations

from pathlib import Path

from helpers.drift import write_scenario
from helpers.dumps import random_rows, write_sequence_dump

from rollout_diag.drivers.engine import analyze
from rollout_diag.report import render_report
from rollout_diag.report.drift import drift_section
from rollout_diag.report.sections import Canvas


def test_section_draws_each_metric(tmp_path: Path) -> None:
    result = analyze([str(write_scenario(tmp_path / "length.parquet", "length"))], workers=1)
    canvas = Canvas()
    section = drift_section(result, canvas)
    assert section is not None and section.title == "Why did it move?"
    assert set(canvas.figures) == {"drift-0", "drift-1"}
    figure = canvas.figures["drift-0"]
    assert [trace["name"] for trace in figure["data"]] == ["mix", "within"]
    assert figure["data"][0]["x"] == ["probability", "length", "position", "round"]
    assert figure["layout"]["shapes"][0]["y0"] == result.drift[0]["change"]  # the dotted line: the change
    assert "responses of 256–511 tokens (length mix)" in section.body
    assert 'id="drift"' in render_report(result) or "Why did it move?" in render_report(result)


def test_no_section_for_one_step(tmp_path: Path) -> None:
    path = write_sequence_dump(tmp_path / "one.parquet", random_rows(3, steps=(0,), rows_per_step=6))
    result = analyze([str(path)], workers=1)
    assert result.drift == [] and drift_section(result, Canvas()) is None
    assert "Why did it move?" not in render_report(result)
