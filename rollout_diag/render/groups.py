"""The terminal view of ``--by``: one table per grouping, the worst group first, capped with a "+N more" line."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby

from rich.console import Group, RenderableType
from rich.text import Text

from rollout_diag import catalogue
from rollout_diag.catalogue import short_name
from rollout_diag.formatting import GROUPS_SHOWN, group_label, selection_sentence
from rollout_diag.render.format import level, number, percent, plain
from rollout_diag.render.table import Column, FitTable
from rollout_diag.results import GroupResult
from rollout_diag.results.wording import worst_group_line

GROUP_METRICS = (catalogue.K3_KL.key, catalogue.CHI2_TOKEN.key, catalogue.LOG_PPL_ABS_DIFF.key)  # all in JSON


def groups_tables(groups: Sequence[GroupResult], shown: int = GROUPS_SHOWN) -> RenderableType:
    """One table per ``--by`` spec, in the order the groups come (worst first)."""
    parts: list[RenderableType] = []
    for column, members in groupby(groups, key=lambda g: g.column):
        parts.extend(group_table(column, list(members), shown))
    line = worst_group_line(groups)
    if line:
        parts.append(plain(f"Where: {line}."))
    return Group(*parts)


def group_table(column: str, groups: Sequence[GroupResult], shown: int = GROUPS_SHOWN) -> list[RenderableType]:
    table = FitTable(
        f"By {column} (worst group first)",
        [
            Column(column, "left", key=True),
            Column("rows"),
            Column("model tokens"),
            Column("verdict", "left"),
            *(Column(short_name(key)) for key in GROUP_METRICS),
            Column("worst round"),
        ],
    )
    for group in groups[:shown]:
        table.add_row(
            plain(group_label(group.value)),
            number(group.rows),
            f"{number(group.tokens)} ({percent(group.token_share)})",
            level(group.verdict.get("level", "n/a")),
            *(number(group.metrics.get(key)) for key in GROUP_METRICS),
            "—" if group.most_divergent_round is None else str(group.most_divergent_round),
        )
    parts: list[RenderableType] = [table]
    hidden = len(groups) - shown
    if hidden > 0:
        parts.append(
            Text(
                f"+{hidden} more group(s) of {column} not shown (every group is in --format json / parquet).",
                style="yellow",
            )
        )
    return parts


def selection_line(selection: dict) -> Text:
    """The rows a result is about (``--where`` / ``--steps``) and how many were kept, as one bold line."""
    return plain(selection_sentence(selection), style="bold")
