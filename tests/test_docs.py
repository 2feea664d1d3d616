"""The docs as a reference: docs/commands.md is what the CLI says today (docs/commands.py writes it), and the docs'
links and file names point at things that exist."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "docs" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_commands_md_is_what_the_cli_says() -> None:
    commands = load_script("commands")
    text = commands.render()
    assert (REPO / "docs" / "commands.md").read_text(encoding="utf-8") == text, (
        "docs/commands.md is stale: run PYTHONPATH=. python docs/commands.py"
    )


def test_commands_md_lists_every_command_option_and_default() -> None:
    text = load_script("commands").render()
    for command in ("analyze", "compare-presets", "sweep", "report", "inspect", "check", "diff", "watch", "convert"):
        assert f"\n## {command}\n" in text and f"Usage: `rollout-diag {command} " in text, command
    assert "`--chunk-tokens <int>`: Tokens per chunk" in text and "[default: 1048576]" in text
    assert "\x1b[" not in text and "\x08" not in text  # no colour codes, no click markers
