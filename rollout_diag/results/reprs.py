"""Short reprs: what a result is about in one line (a notebook cell or a log line, never a dump)."""

from __future__ import annotations

from collections.abc import Sequence

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
