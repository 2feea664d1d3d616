"""Where a result finds its views: ``to_polars()`` (its tables as polars DataFrames), ``to_pandas()`` and
``_repr_html_()`` (what a notebook shows). rollout_diag/export draws them and registers its functions here, by the
result's kind, when the package loads (``rollout_diag/__init__.py`` imports export); a result's method
(``results/reprs.py`` ``ResultViews``) looks its view up here. So results import nothing of export, export reads
results, and no module is loaded by name: every arrow points one way. Imports nothing of the package."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import pandas as pd
    import polars as pl

Result = TypeVar("Result")


@dataclass(frozen=True)
class Views:
    """One kind of result's views. The functions take that kind's result (a type this module cannot name without
    importing results): ``register`` checks that frames and html take the same type."""

    frames: Callable[..., dict[str, pl.DataFrame]]
    html: Callable[..., str]
    pandas: Callable[[Mapping[str, pl.DataFrame]], dict[str, pd.DataFrame]]


_VIEWS: dict[str, Views] = {}


def register(
    kind: str,
    frames: Callable[[Result], dict[str, pl.DataFrame]],
    html: Callable[[Result], str],
    pandas: Callable[[Mapping[str, pl.DataFrame]], dict[str, pd.DataFrame]],
) -> None:
    """Make ``frames``, ``html`` and ``pandas`` the views of the results of ``kind`` (``"analysis"``,
    ``"comparison"``); a later registration of the same kind replaces the earlier one."""
    _VIEWS[kind] = Views(frames=frames, html=html, pandas=pandas)


def views_of(kind: str) -> Views:
    """The views registered for ``kind``; raises LookupError when none is (export registers them as the package
    loads, so only a kind no renderer draws has none)."""
    try:
        return _VIEWS[kind]
    except KeyError:
        raise LookupError(f"no views are registered for a result of kind {kind!r}") from None
