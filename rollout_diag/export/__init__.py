"""Results handed to the tools users already use: polars / pandas dataframes, Parquet tables, TensorBoard event files,
a notebook's HTML.

Readers only: every function here reads a result object and writes or returns a table; nothing is computed anew. A
result's ``to_polars()``, ``to_pandas()`` and ``_repr_html_()`` call the views named here (imported when called).
"""

from rollout_diag.export.frames import analysis_frames, comparison_frames, to_pandas
from rollout_diag.export.notebook import analysis_html, comparison_html

__all__ = ["analysis_frames", "analysis_html", "comparison_frames", "comparison_html", "to_pandas"]
