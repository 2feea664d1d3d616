"""rollout_diag/views.py: where a result finds the views export registers (``to_polars``, ``to_pandas``,
``_repr_html_``), so that results import nothing of export."""

from __future__ import annotations

import pytest

from rollout_diag import views
from rollout_diag.export import analysis_frames, analysis_html, comparison_frames, comparison_html, to_pandas
from rollout_diag.results import AnalysisResult, ComparisonResult
from rollout_diag.results.reprs import ResultViews


def test_export_registers_the_views_of_both_result_kinds():
    assert views.views_of(AnalysisResult.VIEW_KIND) == views.Views(analysis_frames, analysis_html, to_pandas)
    assert views.views_of(ComparisonResult.VIEW_KIND) == views.Views(comparison_frames, comparison_html, to_pandas)


def test_a_kind_without_views_is_a_lookup_error():
    with pytest.raises(LookupError, match="'no such kind'"):
        views.views_of("no such kind")


class _Fake(ResultViews):
    VIEW_KIND = "fake (tests/test_views.py)"


def test_a_result_calls_the_views_registered_for_its_kind():
    calls = []
    views.register(
        _Fake.VIEW_KIND,
        frames=lambda result: calls.append(("frames", result)) or {},
        html=lambda result: calls.append(("html", result)) or "<b>fake</b>",
        pandas=lambda tables: calls.append(("pandas", dict(tables))) or {},
    )
    fake = _Fake()
    try:
        assert fake.to_polars() == {} and fake._repr_html_() == "<b>fake</b>" and fake.to_pandas() == {}
        assert calls == [("frames", fake), ("html", fake), ("frames", fake), ("pandas", {})]
    finally:
        del views._VIEWS[_Fake.VIEW_KIND]
