"""A comparison's corrections and its text output, the way the JSON writers' tests build them."""

from __future__ import annotations

import json

_SLOT = "\x00column\x00"


def comparison_text(document: dict) -> str:
    """The reference: the standard library's own encoder, indented, each list of a per-step block (the top-level
    ``steps`` and each preset's) encoded alone without spaces and put in its place."""
    lines: list[str] = []

    def slotted(block: dict) -> dict:
        out = {}
        for name, values in block.items():
            out[name] = f"{_SLOT}{len(lines)}"
            lines.append(json.dumps(values, separators=(",", ":"), allow_nan=False))
        return out

    marked = {**document, "steps": slotted(document["steps"])}
    marked["presets"] = [{**preset, "steps": slotted(preset["steps"])} for preset in document["presets"]]
    text = json.dumps(marked, indent=2, allow_nan=False) + "\n"
    for index, line in enumerate(lines):
        text = text.replace(json.dumps(f"{_SLOT}{index}"), line, 1)
    return text


class _Corrections:
    """Stands for CorrectionAnalysis: per part, (its steps, its key groups)."""

    def __init__(self, parts: list) -> None:
        self.parts = parts

    def step_columns(self, name: str) -> list:
        return self.parts
