"""What importing costs: the CLI's --help and the package's top level must not load torch, pyarrow or plotly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.imports import loaded_after

import rollout_diag
import rollout_diag.results


def test_package_and_cli_import_nothing_heavy():
    assert loaded_after("import rollout_diag, rollout_diag.cli, rollout_diag.errors") == set()


def test_help_imports_nothing_heavy():
    code = (
        "from typer.testing import CliRunner\nfrom rollout_diag.cli import app\n"
        "result = CliRunner().invoke(app, ['--help'])\nassert result.exit_code == 0, result.output"
    )
    assert loaded_after(code) == set()


@pytest.mark.parametrize("name", rollout_diag.__all__)
def test_every_public_name_resolves(name):
    assert getattr(rollout_diag, name) is not None


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_thing"):
        rollout_diag.no_such_thing  # noqa: B018


@pytest.mark.parametrize("name", rollout_diag.results.__all__)
def test_every_results_name_resolves(name):
    """``rollout_diag.results`` loads each name's module when the name is first read; every name is there."""
    assert getattr(rollout_diag.results, name) is not None


def test_results_names_are_the_listed_ones():
    assert set(rollout_diag.results._EXPORTS) == set(rollout_diag.results.__all__)
    with pytest.raises(AttributeError, match="no_such_thing"):
        rollout_diag.results.no_such_thing  # noqa: B018


def test_analyze_loads_no_other_commands_results():
    """``analyze`` loads neither the other commands' results (compare-presets', sweep's, runs'), nor reading a
    document back, nor ``diff``'s decisions: ~0.02 s of every process."""
    sample = Path(__file__).resolve().parent.parent / "sample_data" / "synthetic_multiturn.parquet"
    code = (
        "from typer.testing import CliRunner\nfrom rollout_diag.cli import app\n"
        f"result = CliRunner().invoke(app, ['analyze', {str(sample)!r}, '-f', 'json'])\n"
        "assert result.exit_code == 0, result.output"
    )
    others = tuple(
        f"rollout_diag.{name}"
        for name in ("results.comparison", "results.sweep", "results.runs", "results.loading", "decisions.diff")
    )
    assert loaded_after(code, modules=others) == set()


@pytest.mark.parametrize("command", ["analyze", "compare-presets", "sweep", "report", "inspect", "check"])
def test_input_errors_come_before_torch(tmp_path, command):
    """A missing file or column is found by opening the footers, before the arithmetic loads torch (1–3 s)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    no_roles = tmp_path / "no_roles.parquet"
    pq.write_table(pa.table({"x": [1, 2]}), no_roles)
    extra = {
        "report": ["-o", str(tmp_path / "r.html")],
        "inspect": ["--sample", "s"],
        "check": ["--gates", "default"],
    }.get(command, [])
    for path, message in ((tmp_path / "missing.parquet", "no such file"), (no_roles, "no rollout logprob column")):
        code = (
            "from typer.testing import CliRunner\nfrom rollout_diag.cli import app\n"
            f"result = CliRunner().invoke(app, [{command!r}, {str(path)!r}, *{extra!r}])\n"
            f"assert result.exit_code == 1 and {message!r} in result.output, result.output"
        )
        assert "torch" not in loaded_after(code)


@pytest.mark.parametrize("command", ["analyze", "compare-presets", "check", "convert"])
def test_a_mistyped_path_is_reported_before_pyarrow_and_numpy_load(tmp_path, command):
    """The commonest input error, a path that does not exist, is told without loading pyarrow or numpy (0.3–0.5 s
    of a fresh process on the build machine), with the reader's own message."""
    missing = tmp_path / "no" / "such.parquet"
    extra = {"convert": ["-o", str(tmp_path / "out.parquet")], "check": ["--gates", "default"]}.get(command, [])
    code = (
        "from typer.testing import CliRunner\nfrom rollout_diag.cli import app\n"
        f"result = CliRunner().invoke(app, [{command!r}, {str(missing)!r}, *{extra!r}])\n"
        f"assert result.exit_code == 1 and 'such.parquet: no such file or directory' in result.output, result.output"
    )
    assert loaded_after(code, modules=("pyarrow", "numpy", "torch")) == set()


# The modules that run torch, and only they, may import it when imported: the trainer-side writer and API, and the
# driver of ``inspect`` (a row's tensors). Every other module (the reader, the chunk, the numba engine, every family
# with the preset families, the drivers of analyze, check, compare-presets, report, sweep, diff and watch) imports
# without torch.
TORCH_MODULES = {
    "rollout_diag.io.writer",
    "rollout_diag.trainers",
}


def test_only_the_torch_modules_import_torch():
    """Every module outside TORCH_MODULES imports with torch made unimportable (one interpreter per module: a module
    imported by an earlier one would hide its own top-level import)."""
    import pkgutil

    modules = sorted(info.name for info in pkgutil.walk_packages(rollout_diag.__path__, "rollout_diag."))
    assert set(modules) >= TORCH_MODULES
    failing = []
    for name in modules:
        if name in TORCH_MODULES:
            continue
        code = f"import sys\nsys.modules['torch'] = None\nimport {name}"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        if done.returncode:
            failing.append(f"{name}: {done.stderr.strip().splitlines()[-1]}")
    assert failing == []


@pytest.fixture(scope="module")
def grouped_dump(tmp_path_factory):
    """The bundled multi-turn sample with a per-row environment and reward (for --by and --where)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sample = Path(__file__).resolve().parent.parent / "sample_data" / "synthetic_multiturn.parquet"
    table = pq.read_table(sample)
    rows = table.num_rows
    table = table.append_column("env_name", pa.array(["math" if row % 3 else "code" for row in range(rows)]))
    table = table.append_column("reward", pa.array([float(row % 5) - 2.0 for row in range(rows)]))
    path = tmp_path_factory.mktemp("grouped") / "grouped.parquet"
    pq.write_table(table, path)
    return path


@pytest.mark.parametrize(
    "arguments",
    [
        ["analyze"],
        ["analyze", "--all-steps", "-f", "json"],
        ["analyze", "--dialect", "all", "-f", "json"],
        ["analyze", "--by", "env_name", "--by", "reward:sign", "--where", "reward > 0", "--steps", "1:"],
        ["check", "--gates", "default", "--per-step", "--by", "env_name"],
    ],
    ids=["analyze", "all-steps-json", "dialects", "by-where-steps", "check"],
)
@pytest.mark.parametrize("engine", ["numba", "auto"])
def test_analyze_and_check_on_the_cpu_never_import_torch(grouped_dump, arguments, engine):
    """The numba engine on the CPU (``auto`` there too, at any size: this small dump falls under the small-input rule,
    which is for readings of tensor chunks) reads, computes and renders without torch."""
    command, *options = arguments
    assert "torch" not in loaded_by_the_cli(["--engine", engine, command, str(grouped_dump), *options])


def loaded_by_the_cli(invocation: list[str]) -> set[str]:
    """Which heavy modules (``loaded_after``'s) a fresh process holds after running the command line with
    ``invocation`` (through typer's runner; the command must end with 0, or 3 where a gate failed), with the
    small-input bound the user's, not the suite's."""
    code = (
        "from typer.testing import CliRunner\nfrom rollout_diag.cli import app\n"
        f"result = CliRunner().invoke(app, {invocation!r})\n"
        "assert result.exit_code in (0, 3), result.output"
    )
    env = {name: value for name, value in os.environ.items() if name != "ROLLOUT_DIAG_SMALL_INPUT_TOKENS"}
    return loaded_after(code, env=env)


@pytest.mark.parametrize(
    "arguments",
    [
        ["compare-presets"],
        ["compare-presets", "-f", "json", "--by", "env_name", "--where", "reward > 0"],
        ["report", "-o", "{tmp}/report.html"],
        ["sweep", "-f", "json"],
        ["diff", "{dump}", "--by", "env_name"],
        ["diff", "--steps-a", "0:1", "--steps-b", "2:", "-f", "json"],
        ["runs", "b={dump}", "--workers", "1", "-f", "json"],
        ["watch", "--exit-after-idle", "0", "-f", "jsonl"],
        ["inspect"],
        ["inspect", "--step", "1", "--window", "20"],
        ["inspect", "--row", "grouped.parquet:3"],
    ],
    ids=[
        "compare-presets",
        "compare-by-where",
        "report",
        "sweep",
        "diff",
        "diff-steps",
        "runs",
        "watch",
        "inspect",
        "inspect-step",
        "inspect-row",
    ],
)
@pytest.mark.parametrize("engine", ["numba", "auto"])
def test_the_preset_and_sweep_commands_on_the_cpu_never_import_torch(grouped_dump, tmp_path, arguments, engine):
    """compare-presets, report, sweep, diff, watch and inspect run on numpy chunks: the numba engine on the CPU
    (``auto`` there too, at any size) reads, computes and renders without torch."""
    command, *options = arguments
    target = str(grouped_dump)
    if command == "watch":  # a directory of the dump, read once and left at once
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "part.parquet").write_bytes(grouped_dump.read_bytes())
        target = str(tmp_path / "run")
    options = [option.format(tmp=tmp_path, dump=grouped_dump) for option in options]
    assert "torch" not in loaded_by_the_cli(["--engine", engine, command, target, *options])


@pytest.mark.parametrize(("given", "expected"), [(None, "1"), ("3", "3")])
def test_the_cli_gives_openblas_one_thread_before_numpy_loads(given, expected):
    """OpenBLAS reads OPENBLAS_NUM_THREADS once, when numpy loads it: the CLI sets it (unless the user did) before
    anything it imports loads numpy. A meta-path hook records the variable at the moment numpy is first looked up."""
    env = {key: value for key, value in os.environ.items() if key != "OPENBLAS_NUM_THREADS"}
    if given is not None:
        env["OPENBLAS_NUM_THREADS"] = given
    code = (
        "import os, sys\nseen = []\n"
        "class Hook:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'numpy' and not seen:\n"
        "            seen.append(os.environ.get('OPENBLAS_NUM_THREADS'))\n"
        "sys.meta_path.insert(0, Hook())\n"
        "import rollout_diag.cli\nimport numpy\nprint(seen[0])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [expected]


@pytest.mark.parametrize(
    "arguments", [["--help"], ["analyze", "--help"], ["analyze", "no/such.parquet", "--top-k", "5", "-f", "json"]]
)
def test_help_and_an_input_error_load_no_pydantic_nor_rich_console(arguments):
    """Typer converts option text through pydantic (0.24 s of a 0.46 s missing-file error) and the tables need
    rich.console: neither loads for --help or an input error (issue 39: startup ≤ 2× importing typer + rich)."""
    code = (
        "from typer.testing import CliRunner\nfrom rollout_diag.cli import app\n"
        f"result = CliRunner().invoke(app, {arguments!r})\n"
        "assert result.exit_code in (0, 1), result.output\n"
        "assert 'Traceback' not in result.output and ('--help' in "
        + repr(arguments)
        + " or 'no such file' in result.output)"
    )
    heavy = ("numpy", "pyarrow", "torch", "pydantic", "rich.console")
    assert loaded_after(code, modules=heavy) == set()


def test_option_text_converts_as_typer_would_and_hands_the_rest_to_typer():
    from rollout_diag.cli.coercion import _UNCONVERTED, _light_value
    from rollout_diag.cli.options import DataFormat

    assert _light_value(int, "12") == 12 and _light_value(int, "-3") == -3 and _light_value(int, 7) == 7
    assert _light_value(float, "1e-3") == 0.001 and _light_value(float, "2") == 2.0 and _light_value(float, 3) == 3.0
    assert _light_value(Path, "a/b.parquet") == Path("a/b.parquet") and _light_value(str, "x") == "x"
    assert _light_value(DataFormat, "json") is DataFormat.json and _light_value(bool, True) is True
    for annotation, text in ((int, "abc"), (int, "1.5"), (float, "1_000"), (float, "nan"), (DataFormat, "JSON")):
        assert _light_value(annotation, text) is _UNCONVERTED  # typer's pydantic adapter decides, with its message


def test_a_bad_option_value_keeps_typers_message():
    from typer.testing import CliRunner

    from rollout_diag.cli import app

    done = CliRunner().invoke(app, ["analyze", "x.parquet", "--top-k", "abc"])
    assert done.exit_code == 2 and "Invalid value for '--top-k'" in done.output and "valid integer" in done.output
    done = CliRunner().invoke(app, ["analyze", "x.parquet", "-f", "bogus"])
    assert done.exit_code == 2 and "'bogus' is not one of 'table', 'json', 'csv', 'parquet'" in done.output


@pytest.mark.parametrize(
    "arguments",
    [["analyze"], ["inspect"], ["report", "-o", "{tmp}/report.html"]],
    ids=["analyze", "inspect", "report"],
)
def test_the_optional_extras_load_only_when_asked_for(grouped_dump, tmp_path, arguments):
    """Without --tokenizer and --wandb no command loads tokenizers or wandb (optional extras: each a one-line error
    saying what to install where asked for and missing: tests/io/test_tokenizer.py, tests/export/test_wandb.py)."""
    command, *options = arguments
    options = [option.format(tmp=tmp_path) for option in options]
    code = (
        "from typer.testing import CliRunner\nfrom rollout_diag.cli import app\n"
        f"result = CliRunner().invoke(app, {[command, str(grouped_dump), *options]!r})\n"
        "assert result.exit_code == 0, result.output"
    )
    assert not loaded_after(code, modules=("tokenizers", "wandb"))
