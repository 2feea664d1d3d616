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


def named_paths(text: str) -> set[str]:
    """The files a page names in backticks or links (``io/reader.py``, ``docs/formats.md``), relative to the page, the
    repository or the package."""
    import re

    ours = {entry.name for entry in (*REPO.iterdir(), *(REPO / "rollout_diag").iterdir())}
    # a path in this repository or its package (``io/reader.py``); verl's or SkyRL's files are named too
    quoted = [name for name in re.findall(r"`([\w./-]+)`", text) if "/" in name and name.split("/")[0] in ours]
    linked = re.findall(r"\]\(([\w./-]+\.(?:md|png))(?:#[\w-]*)?\)", text)
    return {name for name in quoted + linked if not name.startswith("/") and re.search(r"\.(py|md|json|sh|png)$", name)}


def test_the_readme_and_docs_name_files_that_exist() -> None:
    # the reference pages (docs/gates.md, dialects.md and hints.md also cite the trainers' own repositories' files)
    reference = (
        "architecture",
        "bad-input",
        "benchmarks",
        "commands",
        "formats",
        "groups",
        "output",
        "python",
        "watch",
    )
    pages = [REPO / "README.md", *(REPO / "docs" / f"{name}.md" for name in reference)]
    for page in pages:
        bases = (page.parent, REPO, REPO / "rollout_diag")
        missing = [
            name
            for name in sorted(named_paths(page.read_text(encoding="utf-8")))
            if not any((base / name).exists() for base in bases)
        ]
        assert not missing, f"{page.relative_to(REPO)} names what is not there: {missing}"


def test_the_readme_and_benchmarks_stay_references() -> None:
    """README ≤ 400 lines with a table of contents, docs/benchmarks.md ≤ 300 (the session log lives in git)."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 400 and "\n## Contents\n" in readme
    benchmarks = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert len(benchmarks.splitlines()) <= 300
    assert not [line for line in benchmarks.splitlines() if line.startswith("#") and "session" in line.lower()]


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings (lower case, punctuation dropped, spaces as hyphens)."""
    import re

    found, fenced = set(), False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            found.add(re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-"))
    return found


def test_the_readme_and_docs_links_land_on_a_heading() -> None:
    import re

    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target, anchor in re.findall(r"\]\(([\w./-]*)#([\w-]+)\)", page.read_text(encoding="utf-8")):
            linked = page.parent / target if target else page
            assert anchor in anchors(linked.read_text(encoding="utf-8")), f"{page.name}: {target}#{anchor}"
