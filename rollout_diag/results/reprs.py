"""What a result shows of itself: short reprs (what it is about in one line: a notebook cell or a log line, never a
dump) and its views (``to_polars()``, ``to_pandas()``, ``_repr_html_()``), which rollout_diag/export draws and
registers in rollout_diag/views.py."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from rollout_diag.views import views_of

if TYPE_CHECKING:
    import pandas as pd
    import polars as pl

# ----------------------------------------------------------------------- views


class ResultViews:
    """The views of a result whose class names its kind (``VIEW_KIND``): its tables and a notebook's HTML, drawn by
    export (rollout_diag/export/frames.py, notebook.py), found through rollout_diag/views.py."""

    VIEW_KIND: ClassVar[str]

    def to_polars(self) -> dict[str, pl.DataFrame]:
        """The tables a user slices, as polars DataFrames (which tables: the result's class says). Raises ConfigError
        without polars."""
        return views_of(self.VIEW_KIND).frames(self)

    def to_pandas(self) -> dict[str, pd.DataFrame]:
        """``to_polars()``'s tables as pandas DataFrames; raises ConfigError (saying what to install) without pandas."""
        return views_of(self.VIEW_KIND).pandas(self.to_polars())

    def _repr_html_(self) -> str:
        """What a notebook shows: the verdict, where the mismatch sits and the key numbers (not the dataclass)."""
        return views_of(self.VIEW_KIND).html(self)


# ----------------------------------------------------------------------- short reprs
REPR_MAX = 1000  # characters of any result's repr, whatever the data: a notebook cell or a log line, never a dump


REPR_TEXT = 160  # characters of one data string (a sentence, a file name) inside a repr


def short_repr(kind: str, *parts: str) -> str:
    """``<kind: part; part; …>`` cut to REPR_MAX characters: what a result is about (verdict, sizes, worst step), so
    that ``repr`` in a REPL or a log shows an answer rather than every token and per-step dict."""
    text = f"<{kind}: {'; '.join(part for part in parts if part)}>"
    return text if len(text) <= REPR_MAX else f"{text[: REPR_MAX - 2]}…>"


def repr_text(text: object) -> str:
    """A data string quoted for a repr, cut to REPR_TEXT characters."""
    shown = repr(str(text))
    return shown if len(shown) <= REPR_TEXT else f"{shown[: REPR_TEXT - 2]}…{shown[0]}"


def repr_inputs(inputs: Sequence[str]) -> str:
    """``1 input 'a.parquet'`` or ``12 inputs 'a.parquet', …``."""
    if not inputs:
        return ""
    more = ", …" if len(inputs) > 1 else ""
    return f"{len(inputs):,} input{'s' if len(inputs) != 1 else ''} {repr_text(inputs[0])}{more}"
