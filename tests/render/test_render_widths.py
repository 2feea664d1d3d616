"""The README's promise "nothing is ever cut": every command's terminal output, on both bundled samples, at 80 and
120 columns, has no "…" and no line wider than the terminal; and what a reader meets on the way (split-table
titles, diff's ratios, --top-k, single-turn data, the analyze header).

Rendered through the CLI (CliRunner: no colour, COLUMNS pinned), as a user sees it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers.dumps import seq_row, write_sequence_dump
from rich.cells import cell_len
from typer.testing import CliRunner, Result

from rollout_diag.cli import app
from rollout_diag.render.diff import change

SAMPLES = Path(__file__).resolve().parents[2] / "sample_data"
BF16 = SAMPLES / "textgenrnn_bf16_vs_fp32.parquet"
MULTI_TURN = SAMPLES / "synthetic_multiturn.parquet"
WIDTHS = (80, 120)
runner = CliRunner()

# Every command that prints to the terminal, on both samples (diff: one against the other).
COMMANDS = {
    "analyze": lambda sample, other: ("analyze", sample),
    "analyze --dialect all": lambda sample, other: ("analyze", sample, "--dialect", "all"),
    "analyze --dialect prime-rl": lambda sample, other: ("analyze", sample, "--dialect", "prime-rl"),
    "diff": lambda sample, other: ("diff", sample, other, "--replicates", "200"),
    "compare-presets": lambda sample, other: ("compare-presets", sample),
    "sweep": lambda sample, other: ("sweep", sample),
    "inspect": lambda sample, other: ("inspect", sample),
    "check": lambda sample, other: ("check", sample, "--gates", "default"),
}


def run(*args: object, width: int) -> Result:
    result = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": str(width)})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"exception escaped the CLI: {result.exception!r}\n{result.output}") from result.exception
    return result


def assert_fits(output: str, width: int) -> None:
    assert output.strip()
    assert "…" not in output, [line for line in output.splitlines() if "…" in line]
    widest = max(output.splitlines(), key=cell_len)
    assert cell_len(widest) <= width, widest


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("sample", [BF16, MULTI_TURN], ids=["bf16", "multiturn"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_nothing_is_ever_cut(command: str, sample: Path, width: int) -> None:
    other = MULTI_TURN if sample == BF16 else BF16
    result = run(*COMMANDS[command](sample, other), "--device", "cpu", width=width)
    assert result.exit_code in (0, 3), result.output  # check exits 3 when a gate fails
    assert_fits(result.stdout, width)
    for line in result.stdout.splitlines():  # a split table's later parts carry a one-line title
        if "(continued, " in line:
            assert re.search(r"\(continued, \d+/\d+\)$", line.rstrip()), line


def test_split_table_titles_are_one_short_line() -> None:
    output = run("analyze", MULTI_TURN, "--device", "cpu", width=80).stdout
    continued = [line.rstrip() for line in output.splitlines() if "continued" in line]
    assert "Per round (continued, 2/2)" in continued and "Per step (continued, 3/3)" in continued
    assert all(cell_len(line) < 60 for line in continued), continued
    assert "(continued, 2 of" not in output


def test_diff_says_how_many_times_lower_or_higher() -> None:
    assert change(1.0, 0.00916) == "109× lower"
    assert change(0.001, 3.5224) == "3,522× higher"
    assert change(2.0, 3.0) == "1.5× higher"
    assert change(1.0, 1.0004) == "same"
    assert change(-0.1, 0.2) == "–" and change(None, 1.0) == "–" and change(0.0, 1.0) == "–"
    output = run("diff", BF16, MULTI_TURN, "--device", "cpu", "--replicates", "200", width=80).stdout
    assert "B/A" not in output and re.search(r"│ k3_kl +│.*│ [\d.,]+× higher", output)
    assert "nan" not in output


def test_the_terminal_says_where_the_rest_of_top_k_is() -> None:
    output = " ".join(run("analyze", BF16, "--device", "cpu", "--top-k", "50", width=120).stdout.split())
    assert "Worst rows by |log-ppl diff| (top 10 of the 50 that --top-k kept;" in output
    assert "Worst tokens by |δ| (top 10 of the 50 that --top-k kept; all in --format json)" in output
    narrow = " ".join(run("analyze", BF16, "--device", "cpu", "--top-k", "5", width=120).stdout.split())
    assert "Worst tokens by |δ| (top 5)" in narrow


def test_single_turn_data_gets_one_line_instead_of_a_per_round_table(tmp_path: Path) -> None:
    rows = [
        seq_row(step, f"s{step}-{i}", [-0.1 * (i + 1)] * 5, [-0.11 * (i + 1)] * 5) for step in (0, 1) for i in range(3)
    ]
    path = write_sequence_dump(tmp_path / "single.parquet", rows)
    output = run("analyze", path, "--device", "cpu", width=120).stdout
    assert "Per round (" not in output
    assert "Per round: single-turn data" in output


def test_the_analyze_header_has_no_double_space() -> None:
    first = run("analyze", BF16, "--device", "cpu", width=120).stdout.splitlines()[0]
    assert first.startswith("rollout-diag analyze: 1 parquet file(s)") and "  " not in first.rstrip()


def test_the_readme_compare_presets_excerpt_is_the_codes_output() -> None:
    """README.md shows what compare-presets prints today: docs/regenerate.py rewrites the excerpt (and
    docs/report.png); this fails when the code's output and the README part."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("regenerate", SAMPLES.parent / "docs" / "regenerate.py")
    assert spec is not None and spec.loader is not None
    regenerate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(regenerate)
    readme = (SAMPLES.parent / "README.md").read_text(encoding="utf-8")
    excerpt = regenerate.compare_presets_excerpt()
    assert "Rollout-correction presets on this data" in excerpt
    assert regenerate.readme_with_excerpt(readme, excerpt) == readme, (
        "README.md's compare-presets excerpt is stale: run PYTHONPATH=. python docs/regenerate.py"
    )


def test_inspect_folds_an_environment_segment_into_one_line() -> None:
    """main wrote "── environment: 17 tokens ──" in the token column, folded over 4 lines at 80 columns."""
    output = run("inspect", MULTI_TURN, "--device", "cpu", width=80).stdout
    separators = [line for line in output.splitlines() if "env tokens" in line and "│" in line]
    assert separators and all(re.search(r"│ ⋯ +│.*│ +[\d,]+ env tokens", line) for line in separators)
    assert "environmen" not in output.replace("environment/tool", "")
    rows = [line.split("│") for line in output.splitlines() if re.match(r"^ +\d+ │", line)]
    for column in (3, 4, 5):  # rollout, trainer, δ: one notation per column below 1, fixed from 1 on (-6.124)
        fractions = [cells[column].strip() for cells in rows if "." in cells[column]]
        kinds = {"e" in cell for cell in fractions if abs(float(cell)) < 1}
        assert len(kinds) == 1, fractions
        assert not [cell for cell in fractions if "e" in cell and abs(float(cell)) >= 1], fractions


def _long_table(rows: int) -> object:
    """A FitTable of ``rows`` rows like --all-steps' (numbers, a coloured verdict, gap rows), with a few cells rich
    lays out otherwise (trailing space, a line break, a cell wider than the rest of its column would be)."""
    from rich.text import Text

    from rollout_diag.render.format import level
    from rollout_diag.render.table import Column, FitTable, Num

    table = FitTable(
        "Per step (a long title that wraps at narrow widths)",
        [
            Column("step", key=True),
            Column("tokens"),
            Column("k3_kl"),
            Column("mid", "center"),
            Column("note", "left", wrap=True, fold_width=12),
            Column("verdict", "left"),
        ],
        caption="caption",
    )
    for index in range(rows):
        if index % 37 == 36:
            table.add_row("⋮", "", "", "", "", "")
            continue
        verdict = level(["ok", "watch", "bad", "n/a"][index % 4])
        if index == rows // 2:
            verdict.append(" ◀ worst")
        note = {rows - 5: "two\nlines", rows - 9: "trailing ", rows - 3: "a rather long free-text note here"}
        table.add_row(
            str(index),
            Num(index * 7),
            Num(1.0 / (index + 3)),
            Text("•" * (index % 3), style="bold" if index % 5 == 0 else ""),
            note.get(index, f"n{index % 11}"),
            verdict,
        )
    return table


@pytest.mark.parametrize("rows", [64, 65, 200])
@pytest.mark.parametrize("width", [40, 60, 100, 200])
@pytest.mark.parametrize("colour", [True, False])
def test_long_tables_are_written_as_rich_lays_them_out(
    rows: int, width: int, colour: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From FAST_ROWS rows a part is written line by line (rich lays out only the header and first rows): the same
    bytes as rich laying out every cell, coloured or not, whole or split into parts, with rows rich must fold."""
    import io

    from rich.console import Console

    from rollout_diag.render import table as table_module

    def written() -> str:
        sink = io.StringIO()
        console = Console(
            file=sink, width=width, force_terminal=colour, color_system="truecolor" if colour else None, soft_wrap=False
        )
        console.print(_long_table(rows))
        return sink.getvalue()

    fast = written()
    monkeypatch.setattr(table_module, "FAST_ROWS", 10**9)
    assert fast == written()


def test_long_tables_take_the_line_by_line_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The steps of the test above go through the line-by-line writer (not only the fallback to rich)."""
    import io

    from rich.console import Console

    from rollout_diag.render import table as table_module

    calls: list[int] = []
    original = table_module.Table.add_row

    def counted(self, *cells, **options):
        calls.append(1)
        return original(self, *cells, **options)

    monkeypatch.setattr(table_module.Table, "add_row", counted)
    Console(file=io.StringIO(), width=200, color_system=None).print(_long_table(2000))
    assert 0 < len(calls) < 100  # rich saw the first rows, distinct coloured cells and the odd rows, not 2000
