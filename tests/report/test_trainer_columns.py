"""The report's "Mismatch against the trainer's columns" section (rollout_diag/report/trainer_columns.py): a scatter per
column, a binned 2-D histogram for a large sample, nothing without trainer columns."""

from __future__ import annotations

from helpers.trainer_columns import planted, write_rows

import rollout_diag as rd
from rollout_diag.metrics import association
from rollout_diag.results import AnalysisResult


def test_report_draws_a_scatter_or_a_histogram_per_column(tmp_path, monkeypatch):
    from rollout_diag.report import render_report
    from rollout_diag.report.sections import Canvas
    from rollout_diag.report.trainer_columns import trainer_columns_section

    def drawn(result: AnalysisResult) -> list[str]:
        canvas = Canvas()
        trainer_columns_section(result, canvas)
        return [figure["data"][0]["type"] for name, figure in canvas.figures.items()]

    result = rd.analyze(str(planted(tmp_path, rows=300)), device="cpu")
    page = render_report(result)
    assert "Mismatch against the trainer&#x27;s columns" in page and "Row |log-ppl diff| rises with reward" in page
    assert page.count('data-figure="trainer-columns-') == 4  # reward, advantage, entropy, response length
    assert drawn(result) == ["scattergl"] * 4
    monkeypatch.setattr(association, "SCATTER_POINTS", 100)
    assert drawn(rd.analyze(str(planted(tmp_path, rows=300)), device="cpu")) == ["heatmap"] * 4
    plain = write_rows(tmp_path / "plain.parquet", [0.01 * i for i in range(40)])
    assert "trainer-columns" not in render_report(rd.analyze(str(plain), device="cpu"))
