"""The terminal, the report's options and the CLI's compatibility: hostile strings, narrow terminals,
``-o`` with tables, report options and ``--from-json`` merging, explicitly named options.

Tables are rendered through the CLI at a fixed width (CliRunner: no colour, COLUMNS pinned) and checked for what
must appear (each key metric's short name and value) and what must not ("…", raw escape sequences, markup errors).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from pathlib import Path
from typing import get_args, get_origin, get_type_hints

import numpy as np
import pytest
from helpers.cli import TUNED, invoke, one_error_line, succeeded
from helpers.dumps import random_rows, seq_row, write_sequence_dump
from rich.console import Console
from typer.models import OptionInfo

from rollout_diag.cli import app
from rollout_diag.cli.options import Reading
from rollout_diag.formatting import numbers
from rollout_diag.render.export import sweep_csv
from rollout_diag.render.format import number, percent, visible
from rollout_diag.render.presets import presets_table
from rollout_diag.render.summary import short_name
from rollout_diag.render.table import Column, FitTable
from rollout_diag.results import ComparisonResult, PresetResult, StepResult, SweepOption, SweepResult, SweepTarget

SAMPLE = Path(__file__).resolve().parents[2] / "sample_data" / "textgenrnn_bf16_vs_fp32.parquet"
MULTI_TURN = SAMPLE.parent / "synthetic_multiturn.parquet"
NUMBER = re.compile(r"-?[\d,]+(\.\d+)?(e-?\d+)?")
INTEGER = re.compile(r"-?[\d,]+")
HOSTILE_IDS = ("x[/]", "[bold]boom[/bold]", "\x1b[2Jclear", "\x1b]8;;http://evil\x07link\x1b]8;;\x07", "cr\rret")
RAW_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202e]")  # anything but \n and \t reaching the terminal


@pytest.fixture(scope="module")
def hostile_dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Rows whose sample ids and tokens carry rich markup, escape sequences, OSC 8 links and a bidi override,
    plus one invalid row (so the skipped-rows table shows too)."""
    rows = random_rows(3, steps=(0, 1), rows_per_step=len(HOSTILE_IDS), min_length=4)
    for index, row in enumerate(rows):
        row["sample_id"] = f"{HOSTILE_IDS[index % len(HOSTILE_IDS)]}-{index}"
        row["tokens"] = [HOSTILE_IDS[(index + t) % len(HOSTILE_IDS)] + "\u202e" for t in range(len(row["rollout"]))]
    broken = seq_row(1, "[red]bad[/red]", [-0.1, -0.2], [-0.1])  # lengths differ: skipped with a reason
    broken["tokens"] = ["a", "b"]
    return write_sequence_dump(tmp_path_factory.mktemp("hostile") / "hostile.parquet", [*rows, broken])


# ------------------------------------------------------------------------------------- hostile strings
def test_visible_escapes_every_control_character_and_nothing_else() -> None:
    assert visible("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert visible("\x1b]8;;http://x\x07y") == "\\x1b]8;;http://x\\x07y"
    assert visible("r\rn\nt\t\x85\u202e\u2028") == "r\\rn\\nt\\t\\x85\\u202e\\u2028"
    assert visible("plain [bold] ünïcödé δ ρ") == "plain [bold] ünïcödé δ ρ"


@pytest.mark.parametrize("width", [80, 200])
def test_analyze_shows_hostile_strings_verbatim_and_inert(hostile_dump: Path, width: int) -> None:
    output = succeeded(invoke("analyze", hostile_dump, "--device", "cpu", width=width))
    assert not RAW_CONTROL.search(output), "a control character reached the terminal"
    assert "[bold]boom[/bold]" in output  # markup shown as text, not applied
    assert "\\x1b[2Jclear" in output and "\\x1b]8;;http://evil\\x07link" in output
    assert "Skipped rows: 1" in output
    assert "…" not in output


def test_inspect_hostile_row(hostile_dump: Path) -> None:
    output = succeeded(invoke("inspect", hostile_dump, "--device", "cpu", "--sample", "x[/]-0"))
    assert not RAW_CONTROL.search(output)
    assert "x[/]-0" in output and "\\u202e" in output


# ------------------------------------------------------------------------------------- widths
@pytest.fixture(scope="module")
def sample_json() -> dict:
    return json.loads(succeeded(invoke("analyze", SAMPLE, "--device", "cpu", "-f", "json")))


@pytest.mark.parametrize("width", [80, 120, 200])
def test_analyze_fits_the_terminal_without_cutting_anything(width: int, sample_json: dict) -> None:
    output = succeeded(invoke("analyze", SAMPLE, "--device", "cpu", width=width))
    assert "…" not in output
    assert max(len(line) for line in output.splitlines()) <= width
    values = numbers([verdict["value"] for verdict in sample_json["verdicts"]])  # one notation per column
    for verdict, value in zip(sample_json["verdicts"], values, strict=True):
        line = next(line for line in output.splitlines() if f"│ {short_name(verdict['metric'])} " in line)
        assert f" {value} " in line
    for name in ("rollout_corr/k3_kl", "rollout_corr/chi2_seq", "mismatch/logprob_abs_diff"):
        column = numbers([step["metrics"][name] for step in sample_json["steps"]])
        for step, value in zip(sample_json["steps"], column, strict=True):  # every value, in one of the parts
            assert re.search(rf"│\s+{step['step']} │.* {re.escape(value)} │", output)


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("command", ["compare-presets", "sweep"])
def test_presets_and_sweep_fit_the_terminal(command: str, width: int) -> None:
    output = succeeded(invoke(command, SAMPLE, "--device", "cpu", width=width))
    assert "…" not in output
    assert max(len(line) for line in output.splitlines()) <= width
    if command == "compare-presets":
        assert "decoupled_geo_rs_token_tis" in output and "legacy_geometric_mask" in output


def test_fit_table_splits_and_repeats_the_key_column() -> None:
    table = FitTable("t", [Column("step", key=True), *(Column(f"metric_number_{i}") for i in range(8))])
    table.add_row("7", *(number(1.2345e-5 * (i + 1)) for i in range(8)))
    out = io.StringIO()
    Console(file=out, width=60, color_system=None).print(table)
    text = out.getvalue()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 60
    assert text.count("│    7 │") >= 3  # the key column in every part
    for i in range(8):
        assert f"metric_number_{i}" in text and number(1.2345e-5 * (i + 1)) in text


def test_numbers_have_four_significant_digits_in_both_notations() -> None:
    """One rule (the legend's): 4 significant digits, fixed or scientific, trailing zeros dropped; NaN is a dash."""
    values = (0.00342, 0.0169122, 4.40232, -0.00593695, 25416, 1.0, 2e-6, 12345.678, 9999.7, math.nan, None)
    assert [number(v) for v in values] == [
        "3.42e-3",
        "0.01691",
        "4.402",
        "-5.937e-3",
        "25,416",
        "1",
        "2e-6",
        "1.235e4",
        "1e4",  # rounds up out of the fixed range: never the ``1e+04`` of a %g format
        "–",
        "–",
    ]


def test_a_column_takes_one_notation() -> None:
    """Any value that needs scientific notation puts the column's values below 1 in it; counts stay integers, and
    1 ≤ |value| < 10 000 (logprobs, O(1) ratios) stays fixed: ``-13.05`` reads better than ``-1.305e1`` and cannot
    pass for a small number (issue 39)."""
    assert numbers([0.1115, 1.132e-4, 11.38, 2256.4, 3.0, None, 4.40232, -13.0512, -0.5, 9999.7, 12345.6]) == [
        "1.115e-1",
        "1.132e-4",
        "11.38",
        "2256",
        "3",
        "–",
        "4.402",
        "-13.05",
        "-5e-1",
        "1e4",  # 9999.7 rounds to 1e+04 in fixed notation: the column's scientific form
        "1.235e4",
    ]
    assert numbers([0.1115, 11.38, 2256.4]) == ["0.1115", "11.38", "2256"]


def test_fixed_values_in_a_scientific_column_are_never_wider() -> None:
    """The column keeps its width: for 1 ≤ |value| < 10 000 the fixed form is never longer than the scientific one."""
    for value in (1.0001, 4.40232, -13.0512, -99.99, 123.456, -1234.5, 9998.4, 1.5, -2.0001):
        fixed, scientific = numbers([value, 1e-6])[0], f"{value:.3e}".split("e")[0].rstrip("0").rstrip(".")
        assert len(fixed) <= len(scientific) + 2 + len(str(int(math.log10(abs(value))))), (value, fixed)


def test_percentages_always_have_two_decimals() -> None:
    assert [percent(v) for v in (0.0, 0.00013, 1e-7, -1e-7, 0.4009, 1.0, math.nan, None)] == [
        "0.00 %",
        "0.01 %",
        "< 0.01 %",
        "> -0.01 %",
        "40.09 %",
        "100.00 %",
        "–",
        "–",
    ]


def test_analyze_columns_do_not_mix_notations() -> None:
    """On the multi-turn sample (main printed 0.1115 above 1.13e-4 in one per-step column), the values below 1 of
    every numeric column of every table are either all fixed or all scientific; from 1 on they print fixed."""
    output = succeeded(invoke("analyze", MULTI_TURN, "--device", "cpu", width=200))
    assert "nan" not in output
    for block in output.split("┏")[1:]:
        lines = [line for line in block.splitlines() if line.startswith("│")]
        columns = zip(*(line.strip("│").split("│") for line in lines), strict=False)
        for column in columns:
            numeric = [cell.strip() for cell in column if NUMBER.fullmatch(cell.strip())]
            fractions = [cell for cell in numeric if not INTEGER.fullmatch(cell)]
            kinds = {"e" in cell for cell in fractions if abs(float(cell.replace(",", ""))) < 1}
            assert len(kinds) <= 1, numeric
            assert not [cell for cell in fractions if "e" in cell and 1 <= abs(float(cell)) < 1e4], numeric


# ------------------------------------------------------------------------------------- first screen
def test_first_screen_has_the_verdict_and_where_it_sits(sample_json: dict) -> None:
    lines = succeeded(invoke("analyze", SAMPLE, "--device", "cpu", width=200)).splitlines()
    head = "\n".join(lines[:6])
    worst_level = next(lvl for lvl in ("bad", "watch", "ok") if any(v["level"] == lvl for v in sample_json["verdicts"]))
    assert f"Verdict: {worst_level.upper()} — " in head
    worst = max(sample_json["steps"], key=lambda s: s["metrics"]["rollout_corr/k3_kl"])
    first_row = next(r for r in sample_json["worst_rows"] if r["criterion"] == "log_ppl_abs_diff")
    assert f"Where: worst step {worst['step']} " in head
    assert f"{SAMPLE.name}:{first_row['row']}" in head
    # round 0 is highest by 1.1×: within the rounds' scatter, so not named as the most divergent (issue 21)
    assert "no round stands out (the highest, round 0" in head


def test_labels_raw_max_and_both_k3s() -> None:
    presets = succeeded(invoke("compare-presets", SAMPLE, "--device", "cpu", "--preset", "decoupled_seq_is", width=200))
    assert re.search(r"decoupled_seq_is .* raw │", presets) and "raw = raw max ρ before truncation" in presets
    analysis = succeeded(invoke("analyze", SAMPLE, "--device", "cpu", width=200))
    assert "KL(trainer‖rollout)" in analysis and "KL(rollout‖trainer)" in analysis


# ------------------------------------------------------------------------------------- -o FILE
@pytest.mark.parametrize("command", ["analyze", "sweep", "compare-presets"])
def test_output_file_format_follows_the_extension(command: str, tmp_path: Path) -> None:
    text_file, json_file, csv_file = tmp_path / "out.txt", tmp_path / "out.json", tmp_path / "out.csv"
    for path in (text_file, json_file, csv_file):
        result = invoke(command, SAMPLE, "--device", "cpu", "-o", path)
        assert result.exit_code == 0 and result.stdout == "", result.output
    assert "│" in text_file.read_text() and "\x1b" not in text_file.read_text()
    assert isinstance(json.loads(json_file.read_text()), dict)
    assert len(list(csv.DictReader(io.StringIO(csv_file.read_text())))) > 1


def test_explicit_table_format_to_a_file_writes_the_table(tmp_path: Path) -> None:
    path = tmp_path / "analysis.json"  # --format wins over the extension
    succeeded(invoke("analyze", SAMPLE, "--device", "cpu", "-f", "table", "-o", path))
    assert "Key metrics (whole run)" in path.read_text()


def test_sweep_csv_prints_plain_numbers() -> None:
    entry = SweepTarget(np.float64(0.01), np.float64(1.25), np.float64(0.0093))
    option = SweepOption("seq_mean_k3", "sequence", "0.01", 40, True, [entry], default_share=np.float64(0.0078))
    text = sweep_csv(SweepResult([], {}, [0.01], [option], []))
    assert "np." not in text and "float64" not in text
    assert text.splitlines()[1] == ",seq_mean_k3,sequence,0.01,1.25,0.0093,0.01,0.0078"  # the run: step null


# ------------------------------------------------------------------------------------- report options
def test_report_takes_the_analyze_and_compare_presets_options(tmp_path: Path) -> None:
    html = tmp_path / "r.html"
    succeeded(
        invoke(
            "report",
            SAMPLE,
            "--device",
            "cpu",
            "-o",
            html,
            *TUNED,
            "--rollout-rs",
            "seq_mean_k3",
            "--rollout-rs-threshold",
            "0.005",
            "--target",
            "0.02",
            "--intrusive-reject",
            "0.9",
        )
    )
    text = html.read_text()
    assert "catastrophic token(s) (|δ| &gt; 0.2)" in text
    assert "custom" in text and "decoupled_k3_rs" in text
    assert "≥ 2" in text  # rounds pooled from 2 on
    assert "more than 90% of model tokens" in text


def test_report_merges_an_analysis_and_a_comparison(tmp_path: Path) -> None:
    analysis, comparison = tmp_path / "a.json", tmp_path / "c.json"
    succeeded(invoke("analyze", SAMPLE, "--device", "cpu", "-o", analysis))
    succeeded(invoke("compare-presets", SAMPLE, "--device", "cpu", "--preset", "verl", "-o", comparison))
    html = tmp_path / "merged.html"
    succeeded(invoke("report", "--from-json", analysis, "--from-json", comparison, "-o", html))
    text = html.read_text()
    assert 'id="rounds"' in text and 'id="presets"' in text and "decoupled_k3_rs" in text
    # conflicts: two analyses, dumps and saved results, a live-only option with saved results
    assert "both analyze results" in one_error_line(invoke("report", "--from-json", analysis, "--from-json", analysis))
    assert "not both" in one_error_line(invoke("report", SAMPLE, "--from-json", analysis))
    assert "--top-k" in one_error_line(invoke("report", "--from-json", analysis, "--top-k", "3"))


# ------------------------------------------------------------------------------------- typer compatibility
def test_every_option_is_declared_with_its_name() -> None:
    """typer 0.27 turned an option declared without a name (``typer.Option(help=..., metavar="DEVICE")``) into
    ``--DEVICE``: every option names its flags."""
    import inspect

    from typer.main import get_command

    commands = get_command(app).commands
    for name, command in commands.items():
        callback = command.callback
        function = inspect.unwrap(callback)
        hints = inspect.signature(function, eval_str=True).parameters
        for parameter in hints.values():
            annotation = parameter.annotation
            if get_origin(annotation) is None or not hasattr(annotation, "__metadata__"):
                continue
            for info in annotation.__metadata__:
                if isinstance(info, OptionInfo):
                    # typer keeps the first flag of ``typer.Option("--name", ...)`` in ``default``
                    declared = (info.default, *info.param_decls)
                    long = [decl for decl in declared if isinstance(decl, str) and decl.startswith("--")]
                    assert long, f"{name}: option {parameter.name} has no explicit --name"
                    assert all(re.fullmatch(r"--[a-z0-9][a-z0-9-]*", decl) for decl in long), long
        for option in command.params:
            assert all(flag == flag.lower() for flag in option.opts), (name, option.opts)
    device = get_args(get_type_hints(Reading, include_extras=True)["device"])[1]  # declared once, in its group
    assert "--device" in (device.default, *device.param_decls)


def test_sweep_charts_one_per_option_with_unrepeated_ticks() -> None:
    from rollout_diag.report.figures import sweep_figure

    curves = [("seq_sum_k1", [1.0, 10.0, 1e8], [0.5, 0.1, 0.0]), ("seq_mean_k1", [1.0, 1.03, 1.07], [0.6, 0.1, 0.0])]
    figure = sweep_figure(curves, [("seq_sum_k1: verl default 0.5_2.0", 2.0, 0.07)])
    layout = figure["layout"]
    assert [trace["xaxis"] for trace in figure["data"]] == ["x", "x", "x2"]  # the mark sits on its option's chart
    assert layout["xaxis"]["type"] == "log" and layout["xaxis"]["dtick"] == 2  # whole decades only
    assert layout["xaxis2"]["type"] == "linear"  # a narrow range: no log minor ticks
    assert layout["yaxis"]["tickformat"] == "~%"


def test_report_has_a_rounds_section_only_for_multi_turn_data(tmp_path: Path) -> None:
    from rollout_diag.drivers.engine import analyze
    from rollout_diag.report import render_report

    single = write_sequence_dump(tmp_path / "single.parquet", random_rows(5, env_share=0.0))
    multi = write_sequence_dump(tmp_path / "multi.parquet", random_rows(5, min_length=8, env_share=0.4))
    assert 'id="rounds"' not in render_report(analyze(single, device="cpu"))
    assert 'id="rounds"' in render_report(analyze(multi, device="cpu"))


def test_error_line_shows_control_characters_escaped(tmp_path: Path) -> None:
    line = one_error_line(invoke("analyze", tmp_path / "\x1b[2Jmissing.parquet", "--device", "cpu"))
    assert "\\x1b[2Jmissing" in line and "\x1b" not in line


def test_inspect_window_shows_positions_of_the_row_not_of_the_window() -> None:
    from rollout_diag.render.inspect import render_row
    from rollout_diag.results import RowTokens

    # a window of 3 tokens starting at position 280 of a 301-token row; the largest |δ| is the middle one
    window = RowTokens(
        step=3, sample_id="s", file="f.parquet", row=7, mask=[1, 1, 1],
        rollout_logprob=[-0.5, -2.0, -0.1], trainer_logprob=[-0.5, -9.0, -0.1],
        token=None, token_id=None, start=280, row_length=301,
    )  # fmt: skip
    out = io.StringIO()
    Console(file=out, width=160, color_system=None).print(render_row(window))
    text = out.getvalue()
    assert "tokens 280–282 of 301" in text
    assert "at position 281" in text
    assert [line.split()[0] for line in text.splitlines() if line.strip()[:3].isdigit()] == ["280", "281", "282"]
    assert "round" not in text.split("\n")[1]  # rounds that began before the window are unknown: no column


def test_anomaly_counts_include_the_flags_the_result_cut() -> None:
    import dataclasses

    from rollout_diag.drivers.engine import analyze
    from rollout_diag.render.analysis import render_analysis
    from rollout_diag.report import render_report
    from rollout_diag.results import Anomaly

    kept = [
        Anomaly(step=3, metric="rollout_corr/k3_kl", value=10.0 + i, baseline=1.0, factor=10.0 + i) for i in range(12)
    ]
    # 12 flags kept by the result, 5 more cut: 17 in all, 10 shown in the terminal, 7 smaller ones counted
    result = dataclasses.replace(analyze(SAMPLE, device="cpu"), anomalies=kept, anomalies_cut=5)
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(render_analysis(result))
    assert "and 7 smaller anomalies (the 12 largest in --format json)" in out.getvalue()
    assert "Anomalies: 17 flag(s)" in render_report(result)


def test_a_sweep_target_below_one_sequence_says_so() -> None:
    """0.1 % of the sample's 128 sequences is less than one: no threshold rejects that little (main printed the
    largest value, a threshold that rejects nothing); token targets (25,416 tokens) keep their threshold."""
    output = succeeded(invoke("sweep", SAMPLE, "--device", "cpu", "--target", "0.001", width=200))
    sequence_row = next(line for line in output.splitlines() if line.startswith("│ is_sequence "))
    token_row = next(line for line in output.splitlines() if line.startswith("│ is_token "))
    assert "– (< 1 sequence)" in sequence_row
    assert "(< 1" not in token_row and re.search(r"\d \(\d+\.\d\d %\)", token_row)


# ------------------------------------------------------------------------------------- compare-presets table
def _preset(name: str, metrics: dict[str, float]) -> PresetResult:
    from rollout_diag.decisions.intrusive import intrusive_reasons
    from rollout_diag.presets import PRESETS

    preset = PRESETS[name]
    return PresetResult(
        preset.name, preset.config(), preset.mode, [], StepResult(None, 10, 1000, metrics), intrusive_reasons(metrics)
    )


def test_presets_with_identical_effect_share_a_row_and_presets_that_correct_nothing_come_last() -> None:
    weights = {
        "rollout_corr/rollout_is_mean": 0.98,
        "rollout_corr/rollout_is_max": 3.5,
        "rollout_corr/rollout_is_eff_sample_size": 0.88,
        "summary/tokens_kept": 1000.0,
    }
    nothing = {"summary/tokens_kept": 1000.0, "summary/rejected_token_fraction": 0.0}
    result = ComparisonResult(
        ["dump.parquet"],
        {},
        [
            _preset("disabled", nothing),
            _preset("decoupled_seq_is", weights),
            _preset("decoupled_k3_rs", {"summary/rejected_token_fraction": 0.03, "summary/tokens_kept": 970.0}),
            _preset("bypass_pg_is", weights),
            _preset("bypass_ppo_clip", nothing),
        ],
    )
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(presets_table(result))
    text = out.getvalue()
    names = [line.split("│")[1].strip() for line in text.splitlines() if line.startswith("│")]
    first_part = names[: names.index("decoupled_seq_is +1") + 3]
    assert first_part == ["decoupled_seq_is +1", "decoupled_k3_rs", "disabled +1"]
    flat = " ".join(text.split())
    assert (
        "decoupled_seq_is also stands for bypass_pg_is" in flat and "disabled also stands for bypass_ppo_clip" in flat
    )
    columns = [column.header for column in presets_table(result).columns]
    assert columns.index("tok rejected") < columns.index("mode") < columns.index("IS") < columns.index("RS")
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
