"""Results handed to the tools users already use: polars / pandas dataframes, Parquet tables, TensorBoard event files,
Weights & Biases, a notebook's HTML.

A renderer: every function here reads a result object and writes or returns a table; nothing is computed anew.
Importing this package registers a result's views (``to_polars()``, ``to_pandas()``, ``_repr_html_()``) in
rollout_diag/views.py, which the package does as it loads; the HTML's module (``notebook.py``, which reads the results'
wording) loads when a notebook first asks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rollout_diag import views
from rollout_diag.export.frames import analysis_frames, comparison_frames, to_pandas

if TYPE_CHECKING:
    from rollout_diag.results import AnalysisResult, ComparisonResult


def analysis_html(result: AnalysisResult) -> str:
    """``AnalysisResult._repr_html_()``: notebook.py ``analysis_html``."""
    from rollout_diag.export import notebook

    return notebook.analysis_html(result)


def comparison_html(result: ComparisonResult) -> str:
    """``ComparisonResult._repr_html_()``: notebook.py ``comparison_html``."""
    from rollout_diag.export import notebook

    return notebook.comparison_html(result)


views.register("analysis", frames=analysis_frames, html=analysis_html, pandas=to_pandas)
views.register("comparison", frames=comparison_frames, html=comparison_html, pandas=to_pandas)

__all__ = ["analysis_frames", "analysis_html", "comparison_frames", "comparison_html", "to_pandas"]
