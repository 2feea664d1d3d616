"""The command line on the bundled real dump: help, table / JSON / CSV output, ``-o``, ``inspect``, ``--version``.

Tables are rendered at a fixed width (COLUMNS=160, no colour: CliRunner is not a terminal) and checked
for what must appear and what must not (tracebacks, debug text, NaN verdicts). Numbers in the tables are
checked against the JSON of the same run, so no golden value depends on which slice of the sample ships.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main
from helpers.cli import WIDTH, error_line, invoke, succeeded
from helpers.dumps import random_rows, write_sequence_dump
from typer.testing import Result

from rollout_diag import __version__
from rollout_diag.cli import app
from rollout_diag.formatting import numbers
from rollout_diag.render.format import number
from rollout_diag.render.summary import short_name

REPO = Path(__file__).resolve().parents[2]
SAMPLE_CANDIDATES = (
    REPO / "sample_data" / "textgenrnn_bf16_vs_fp32.parquet",
    REPO.parent / "shared" / "data" / "textgenrnn_bf16_vs_fp32.parquet",
)


@pytest.fixture(scope="module")
def sample() -> Path:
    for path in SAMPLE_CANDIDATES:
        if path.exists():
            return path
    pytest.fail(f"the bundled sample dump is missing (looked for {', '.join(map(str, SAMPLE_CANDIDATES))})")


@pytest.fixture(scope="module")
def sample_json(sample: Path) -> dict:
    return json.loads(succeeded(invoke("analyze", sample, "--device", "cpu", "--format", "json")))


@pytest.fixture(scope="module")
def sample_table(sample: Path) -> Result:
    result = invoke("analyze", sample, "--device", "cpu")
    succeeded(result)
    return result


def section(text: str, title: str, next_title: str) -> str:
    start = text.index(title)
    return text[start : text.index(next_title, start)]


# ------------------------------------------------------------------------------------------ help
def test_root_help_lists_the_commands() -> None:
    output = succeeded(invoke("--help"))
    assert "Usage: rollout-diag" in output
    assert re.search(r"^\s+analyze\s+Every mismatch metric", output, re.MULTILINE)
    assert re.search(r"^\s+inspect\s+One row token by token", output, re.MULTILINE)
    assert "--version" in output


@pytest.mark.parametrize("command", ["analyze", "inspect", "sweep", "compare-presets", "report"])
def test_command_help_describes_every_option(command: str) -> None:
    output = succeeded(invoke(command, "--help"))
    flat = "".join(output.split())  # help text is wrapped (at spaces and hyphens): compare without whitespace
    click_command = typer.main.get_command(app).commands[command]
    assert click_command.help and "".join(click_command.help.split()[:6]) in flat
    for parameter in click_command.params:
        help_text = getattr(parameter, "help", None)
        assert help_text and len(help_text) > 10, f"{command}: {parameter.name} has no help"
        assert "".join(help_text.split()) in flat, parameter.name
        for flag in getattr(parameter, "opts", []):
            if flag.startswith("-"):
                assert re.search(rf"(^|[\s,]){re.escape(flag)}([\s,]|$)", output), flag


def test_version() -> None:
    result = invoke("--version")
    assert result.exit_code == 0, result.output
    assert result.stdout == f"rollout-diag {__version__}\n"


# --------------------------------------------------------------------------------- analyze: table
def test_analyze_table_has_every_section(sample_table: Result, sample_json: dict) -> None:
    output = sample_table.stdout
    run = sample_json["run"]
    assert f"sequence layout, {number(run['rows'])} rows, {number(run['tokens'])} model tokens" in output
    assert f"{len(sample_json['steps'])} step(s)" in output
    assert "columns: rollout=rollout_log_probs, trainer=old_log_probs, mask=response_mask" in output
    titles = [
        "Verdict: ",
        "Where: ",
        "Key metrics (whole run)",
        "All metrics (whole run",
        "Per step",
        "Per round",
        "Per token position",
        "Worst rows by |log-ppl diff|",
        "Worst tokens by |δ|",
    ]
    positions = [output.index(title) for title in titles]
    assert positions == sorted(positions)  # in this order, each once found


def without_compile_notice(stderr: str) -> str:
    """``stderr`` without the line of a run that compiles the kernels (a cache of another numba, or none yet: the
    lowest-versions CI run shares the package's cache directory with the main one)."""
    from rollout_diag.engine.kernels import COMPILE_NOTICE

    return "".join(line for line in stderr.splitlines(keepends=True) if not line.startswith(COMPILE_NOTICE))


def test_analyze_table_shows_no_debug_text(sample_table: Result) -> None:
    output = sample_table.stdout
    assert without_compile_notice(sample_table.stderr) == ""
    for unwanted in ("Traceback", "DEBUG", "\x1b[", "internal error"):
        assert unwanted not in output
    assert max(len(line) for line in output.splitlines()) <= WIDTH


def test_verdict_table_matches_the_json(sample_table: Result, sample_json: dict) -> None:
    verdicts = section(sample_table.stdout, "Key metrics (whole run)", "All metrics")
    assert "nan" not in verdicts.lower()
    assert {v["metric"] for v in sample_json["verdicts"]} >= {
        "rollout_corr/k3_kl",
        "rollout_corr/chi2_token",
        "rollout_corr/log_ppl_abs_diff",
        "training/rollout_probs_diff_mean",
    }
    columns = {  # each column in one notation (formatting.numbers)
        field: numbers([verdict[field] for verdict in sample_json["verdicts"]]) for field in ("value", "watch", "bad")
    }
    for index, verdict in enumerate(sample_json["verdicts"]):
        short = short_name(verdict["metric"])
        line = next(line for line in verdicts.splitlines() if f" {short} " in line)
        cells = [cell.strip() for cell in line.strip("│ ").split("│")]
        assert cells[:5] == [
            short,
            columns["value"][index],
            verdict["level"],
            columns["watch"][index],
            columns["bad"][index],
        ]
        assert f"{short} = {verdict['metric']}" in sample_table.stdout.replace("\n", " ")  # the legend
        assert verdict["level"] in ("ok", "watch", "bad")


def test_per_step_table_marks_the_worst_step(sample_table: Result, sample_json: dict) -> None:
    steps = section(sample_table.stdout, "Per step", "Per round")
    worst = max(sample_json["steps"], key=lambda s: s["metrics"]["rollout_corr/k3_kl"])
    marked = [line for line in steps.splitlines() if "◀ worst" in line]
    assert len(marked) == 1
    assert marked[0].strip("│ ").split("│")[0].strip() == str(worst["step"])
    for step in sample_json["steps"]:
        assert re.search(rf"^│\s+{step['step']} │\s+{step['rows']} │\s+{number(step['tokens'])} │", steps, re.MULTILINE)


def test_worst_rows_table_points_at_the_file_row(sample_table: Result, sample_json: dict, sample: Path) -> None:
    table = section(sample_table.stdout, "Worst rows by", "Worst tokens by")
    first = next(r for r in sample_json["worst_rows"] if r["criterion"] == "log_ppl_abs_diff")
    assert f"{sample.name}:{first['row']}" in table
    assert first["sample_id"] in table


# ---------------------------------------------------------------------------- analyze: json / csv
def test_json_has_the_documented_shape(sample_json: dict, sample: Path) -> None:
    document = sample_json
    assert document["schema_version"] == 2
    for key in ("inputs", "columns", "run", "steps", "rounds", "warnings", "skipped", "skipped_rows"):
        assert key in document, key
    assert document["inputs"] == [str(sample)]
    assert document["columns"]["rollout"] == "rollout_log_probs"
    assert document["columns"]["trainer"] == "old_log_probs"
    run = document["run"]
    assert isinstance(run["rows"], int) and isinstance(run["tokens"], int)
    for name in ("rollout_corr/k3_kl", "rollout_corr/chi2_token", "training/rollout_probs_diff_mean", "rollout_kl/k3"):
        assert isinstance(run["metrics"][name], float), name
    assert [s["step"] for s in document["steps"]] == sorted(s["step"] for s in document["steps"])
    assert sum(s["rows"] for s in document["steps"]) == run["rows"]
    assert sum(s["tokens"] for s in document["steps"]) == run["tokens"]
    for step in document["steps"]:
        assert set(step) >= {"step", "rows", "tokens", "metrics"}
        assert "rollout_corr/k3_kl" in step["metrics"]
    assert document["rounds"] and "round" in document["rounds"][0]
    assert document["skipped"] == [] and document["skipped_rows"] == 0


def test_csv_has_one_line_per_step(sample: Path, sample_json: dict) -> None:
    text = succeeded(invoke("analyze", sample, "--device", "cpu", "--format", "csv"))
    records = list(csv.reader(io.StringIO(text)))
    header, lines = records[0], records[1:]
    assert header[:3] == ["step", "rows", "tokens"]
    assert "rollout_corr/k3_kl" in header and "training/rollout_probs_diff_mean" in header
    assert len(lines) == len(sample_json["steps"]) + 1  # and the run, last (issue 22)
    run = {**sample_json["run"], "step": ""}  # the run's step is null: an empty cell, the column stays numeric
    assert lines[-1][:3] == ["", str(run["rows"]), str(run["tokens"])]
    for line, step in zip(lines, [*sample_json["steps"], run], strict=True):
        assert len(line) == len(header)
        assert [int(v) for v in line[1:3]] == [step["rows"], step["tokens"]] and line[0] == str(step["step"])
        for name, value in zip(header[3:], line[3:], strict=True):
            expected = step["metrics"].get(name)
            if expected is None:
                assert value == "", name
            else:
                assert float(value) == expected, name  # repr round-trips exactly


@pytest.mark.parametrize("format_", ["json", "csv"])
def test_output_option_writes_the_file(tmp_path: Path, sample: Path, sample_json: dict, format_: str) -> None:
    target = tmp_path / f"result.{format_}"
    result = invoke("analyze", sample, "--device", "cpu", "--format", format_, "-o", target)
    assert succeeded(result) == ""
    assert f"wrote {target}" in result.stderr
    text = target.read_text(encoding="utf-8")
    if format_ == "json":
        assert json.loads(text)["run"] == sample_json["run"]
    else:
        assert len(text.splitlines()) == 1 + len(sample_json["steps"]) + 1  # header, steps, run


# ------------------------------------------------------------------------------------------ inspect
def test_inspect_defaults_to_the_worst_row(sample: Path, sample_json: dict) -> None:
    worst = next(r for r in sample_json["worst_rows"] if r["criterion"] == "log_ppl_abs_diff")
    output = succeeded(invoke("inspect", sample, "--device", "cpu"))
    assert f"step {worst['step']}, sample {worst['sample_id']} ({sample} row {worst['row']})" in output
    assert f"{worst['length']} tokens, {worst['model_tokens']} from the model" in output
    assert "δ = trainer − rollout" in output


def test_inspect_one_sample_as_json(sample: Path, sample_json: dict) -> None:
    chosen = sample_json["worst_rows"][-1]
    text = succeeded(invoke("inspect", sample, "--sample", chosen["sample_id"], "--device", "cpu", "--format", "json"))
    row = json.loads(text)
    assert (row["sample_id"], row["step"], row["row"]) == (chosen["sample_id"], chosen["step"], chosen["row"])
    assert len(row["mask"]) == len(row["trainer_logprob"]) == len(row["log_ratio"]) == chosen["length"]
    assert sum(row["mask"]) == chosen["model_tokens"]
    for a, r, delta in zip(row["trainer_logprob"], row["rollout_logprob"], row["log_ratio"], strict=True):
        assert math.isclose(delta, a - r, rel_tol=0.0, abs_tol=0.0)


def test_inspect_sample_and_step(sample: Path, sample_json: dict) -> None:
    chosen = sample_json["worst_rows"][0]
    sample_id, step = chosen["sample_id"], chosen["step"]
    output = succeeded(invoke("inspect", sample, "-s", sample_id, "--step", step, "--device", "cpu"))
    assert f"step {step}, sample {sample_id} " in output
    other = next(s["step"] for s in sample_json["steps"] if s["step"] != step)
    line = error_line(invoke("inspect", sample, "-s", sample_id, "--step", other, "--device", "cpu"))
    assert f"{sample}: column 'sample_id': no row with sample id '{sample_id}' in step {other}" in line


def test_inspect_unknown_sample(sample: Path) -> None:
    line = error_line(invoke("inspect", sample, "--sample", "no-such-sample", "--device", "cpu"))
    assert str(sample) in line
    assert "column 'sample_id'" in line and "'no-such-sample'" in line


def test_inspect_sample_id_repeated_across_steps_needs_step(tmp_path: Path) -> None:
    rows = random_rows(4, steps=(0, 1), rows_per_step=2)
    for row in rows:
        row["sample_id"] = f"prompt-{row['sample_id'][-1]}"  # the same ids in both steps
    path = write_sequence_dump(tmp_path / "dump.parquet", rows)
    line = error_line(invoke("inspect", path, "--sample", "prompt-1", "--device", "cpu"))
    assert "'prompt-1' names 2 rows (steps 0, 1)" in line
    assert "--step" in line
    row = json.loads(succeeded(invoke("inspect", path, "-s", "prompt-1", "--step", 1, "--device", "cpu", "-f", "json")))
    assert (row["step"], row["row"], row["mask"]) == (1, 3, rows[3]["mask"])


def test_inspect_refuses_csv(sample: Path) -> None:
    result = invoke("inspect", sample, "--format", "csv", "--device", "cpu")
    assert result.exit_code == 2  # a usage error, caught by the option parser
    assert "'csv' is not one of 'table', 'json'" in result.output


# ------------------------------------------------------------------------------------ console script
def test_console_script_runs_analyze(sample: Path, sample_json: dict) -> None:
    script = Path(sys.executable).parent / "rollout-diag"
    process = subprocess.run(
        [str(script), "analyze", str(sample), "--device", "cpu", "--format", "csv"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert process.returncode == 0, process.stderr
    assert without_compile_notice(process.stderr) == ""
    assert "Traceback" not in process.stdout
    assert len(process.stdout.splitlines()) == 1 + len(sample_json["steps"]) + 1  # header, steps, run


def _exiting(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    """Run ``body`` (Python, ``tmp`` the test's directory) in a fresh interpreter, then ``cli.exit_now(3)``."""
    script = f"import atexit, sys, threading, time\nfrom pathlib import Path\ntmp = Path({str(tmp_path)!r})\n{body}\n"
    script += "from rollout_diag.cli import exit_now\nexit_now(3)\n"
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)


def test_exit_now_runs_the_atexit_functions_and_flushes(tmp_path: Path) -> None:
    # the console script ends with exit_now, skipping the interpreter's teardown: what the user would miss of it
    # (atexit functions, buffered output) must still happen, and the code must be the command's
    body = 'atexit.register(lambda: (tmp / "atexit").write_text("ran"))\nsys.stdout.write("no newline, buffered")'
    process = _exiting(tmp_path, body)
    assert process.returncode == 3, process.stderr
    assert process.stdout == "no newline, buffered"
    assert (tmp_path / "atexit").read_text() == "ran"


def test_exit_now_waits_for_a_thread_still_working(tmp_path: Path) -> None:
    # a thread that is not a daemon (a writer's) still running: the interpreter's own exit, which waits for it
    body = (
        'def write():\n    time.sleep(0.5)\n    (tmp / "late").write_text("written")\n'
        "threading.Thread(target=write).start()"
    )
    process = _exiting(tmp_path, body)
    assert process.returncode == 3, process.stderr
    assert (tmp_path / "late").read_text() == "written"


def test_exit_now_codes() -> None:
    # SystemExit's codes: None is 0, a number itself, text printed on stderr and 1
    for code, status in ((None, 0), (0, 0), (2, 2)):
        script = f"from rollout_diag.cli import exit_now\nexit_now({code!r})"
        assert subprocess.run([sys.executable, "-c", script], timeout=60).returncode == status
    process = subprocess.run(
        [sys.executable, "-c", "from rollout_diag.cli import exit_now\nexit_now('bad option')"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (process.returncode, process.stderr) == (1, "bad option\n")


def test_exit_now_into_a_closed_pipe() -> None:
    # `rollout-diag … | head -1`: the reader has closed the pipe when the buffered rest of the output is flushed; no
    # "Exception ignored … BrokenPipeError" (the interpreter's own exit prints one, and exits 120)
    script = "import sys, time\ntime.sleep(0.5)\nsys.stdout.write('x' * 100)\n"
    script += "from rollout_diag.cli import exit_now\nexit_now(0)\n"
    buffered = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    process = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=buffered
    )
    process.stdout.close()
    _, errors = process.communicate(timeout=60)
    assert process.returncode == 0
    assert errors == ""


def test_cli_chunk_default_is_the_readers() -> None:
    from rollout_diag.cli import CHUNK_TOKENS
    from rollout_diag.drivers.dump import DEFAULT_CHUNK_TOKENS as DUMP_CHUNK_TOKENS
    from rollout_diag.io.reader import DEFAULT_CHUNK_TOKENS

    assert CHUNK_TOKENS == DUMP_CHUNK_TOKENS == DEFAULT_CHUNK_TOKENS


def test_the_preset_commands_read_larger_chunks_by_default() -> None:
    """compare-presets and report, on the command line and in the library, read PRESET_CHUNK_TOKENS-token chunks (their
    accumulators' fixed cost per chunk: docs/benchmarks.md, issue 20 session 11); analyze the reader's default."""
    import inspect

    from rollout_diag.cli import analyze, check, presets, report
    from rollout_diag.drivers import compare
    from rollout_diag.drivers.dump import DEFAULT_CHUNK_TOKENS, PRESET_CHUNK_TOKENS

    def default(function) -> int:
        return inspect.signature(function).parameters["chunk_tokens"].default

    assert PRESET_CHUNK_TOKENS == 2 * DEFAULT_CHUNK_TOKENS
    assert default(presets.compare_presets) == default(report.report) == PRESET_CHUNK_TOKENS
    assert default(compare.compare_presets) == default(compare.analyze_and_compare) == PRESET_CHUNK_TOKENS
    assert default(analyze.analyze) == default(presets.sweep) == default(check.check) == DEFAULT_CHUNK_TOKENS


def test_progress_bar_on_a_terminal(monkeypatch: pytest.MonkeyPatch, sample: Path) -> None:
    import io as stdio

    from rollout_diag.cli import output as cli

    class Terminal(stdio.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(cli.sys, "stderr", terminal)
    monkeypatch.setattr(cli, "PROGRESS_MIN_BYTES", 0)
    with cli.progress_bar([sample]) as update:
        assert update is not None  # a terminal and a big enough input get a bar
        update(10, 100)
        update(100, 100)
    assert "100/100" in terminal.getvalue()


def test_each_shared_option_is_declared_once_whatever_command_shows_it() -> None:
    """The option groups (Reading, PresetChoice, AnalysisKnobs, Selection, Gates, Logging: rollout_diag/cli/options.py)
    declare each option once: every command that shows it gives the same help and flags; only a command's own default
    may differ (compare-presets' chunks, watch's device)."""
    import dataclasses

    from typer._click import Context

    from rollout_diag.cli.options import OPTION_GROUPS

    group = typer.main.get_command(app)
    root = Context(group, info_name="rollout-diag")
    shown: dict[str, set[tuple[str, ...]]] = {}
    for name in group.list_commands(root):
        command = group.get_command(root, name)
        for param in command.params:
            if param.name in {field.name for kind in OPTION_GROUPS for field in dataclasses.fields(kind)}:
                shown.setdefault(param.name, set()).add((*param.opts, re.sub(r"\s+", " ", param.help or "")))
    assert set(shown) >= {"column", "device", "strict", "chunk_tokens", "input_format", "trust_pickle", "workers"}
    assert set(shown) >= {"max_", "min_", "gates", "tensorboard", "wandb", "wandb_group", "wandb_run_id"}
    shown.pop("preset")  # diff's --preset is its own (presets whose dropped share to compare)
    shown.pop("by")  # check's and diff's --by are their own (what a group's gate or interval is)
    assert all(len(records) == 1 for records in shown.values()), shown
    assert {p.name: p.default for p in group.get_command(root, "compare-presets").params}["chunk_tokens"] == 1 << 21


def test_a_group_option_shown_without_its_group_is_a_programming_error() -> None:
    from rollout_diag.cli.layout import command

    def shows_column(top_k: int = 20) -> None:
        """Shows --column but takes no Reading."""

    shows_column.__annotations__ = {"top_k": int, "return": None}  # resolved here, not in this module's globals
    with pytest.raises(TypeError, match="column is shown but no argument takes Reading"):
        command("top_k column")(shows_column)


def test_a_layout_names_each_own_option_and_only_known_ones() -> None:
    """``@command``'s layout is the --help order: an own option it leaves out, or a name that is no option, is a
    programming error at import, not an option silently missing from --help."""
    import inspect

    from rollout_diag.cli.layout import command

    def takes_two(top_k: int = 20, seed: int = 0) -> None:
        """Two own options."""

    takes_two.__annotations__ = {"top_k": int, "seed": int, "return": None}
    with pytest.raises(TypeError, match="not laid out: seed"):
        command("top_k")(takes_two)
    with pytest.raises(TypeError, match="colour is neither an option of the command nor of a group"):
        command("top_k seed colour")(takes_two)
    with pytest.raises(TypeError, match="not laid out: chunk_tokens"):  # a default for an option not shown
        command("top_k seed", chunk_tokens=1)(takes_two)
    shown = command("seed top_k")(takes_two)
    assert list(inspect.signature(shown).parameters) == ["seed", "top_k", "debug"]
