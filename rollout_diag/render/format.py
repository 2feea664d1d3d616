"""Rich bits of the terminal tables: verdict colours, data strings as rich Text. The numbers themselves are
formatted by :mod:`rollout_diag.formatting`, which the HTML report shares."""

from __future__ import annotations

from rich.markup import escape as escape_markup
from rich.text import Text

from rollout_diag.formatting import FIXED_RANGE as FIXED_RANGE
from rollout_diag.formatting import extra_cell as extra_cell
from rollout_diag.formatting import number as number
from rollout_diag.formatting import percent as percent
from rollout_diag.formatting import visible

LEVEL_STYLE = {"ok": "green", "watch": "yellow", "bad": "bold red", "n/a": "dim"}


def level(text: str) -> Text:
    """A verdict level in its colour."""
    return Text(text, style=LEVEL_STYLE.get(text, ""))


def plain(text: object, style: str = "") -> Text:
    """A data string as a rich Text: control characters visible, never read as markup."""
    return Text(visible(text), style=style)


def safe_markup(text: object) -> str:
    """A data string to embed in rich markup: control characters visible, ``[`` escaped."""
    return escape_markup(visible(text))
