"""Outputs that would destroy an input, atomic outputs, huge
rows in ``inspect``, malformed saved results, stray Parquet files beside a dump, and small inputs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers.cli import one_error_line
from helpers.dumps import random_rows, seq_row, write_sequence_dump
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout_diag.cli import app
from rollout_diag.errors import ConfigError, InputError
from rollout_diag.io.outputs import atomic_path, check_outputs
from tests.helpers.cli import runner


def cli(*args: object, env: dict | None = None):
    result = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "160", **(env or {})})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"exception escaped the CLI: {result.exception!r}\n{result.output}") from result.exception
    assert "Traceback" not in result.output
    return result


def hidden_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.rglob(".*"))


@pytest.fixture
def dump(tmp_path: Path) -> Path:
    return write_sequence_dump(tmp_path / "run.parquet", random_rows(0, steps=(0, 1), rows_per_step=3))


# ------------------------------------------------------------------ an output that is an input is refused
WRITING_COMMANDS = [
    ("analyze", "{dump}", "-f", "json", "-o", "{out}"),
    ("analyze", "{dump}", "-o", "{out}"),
    ("compare-presets", "{dump}", "--export-decisions", "{out}"),
    ("compare-presets", "{dump}", "-f", "json", "-o", "{out}"),
    ("report", "{dump}", "-o", "{out}"),
    ("sweep", "{dump}", "-o", "{out}"),
    ("check", "{dump}", "--max", "rollout_corr/k3_kl=1", "--junit", "{out}"),
    ("check", "{dump}", "--max", "rollout_corr/k3_kl=1", "-o", "{out}"),
    ("diff", "{dump}", "--steps-a", "0:0", "--steps-b", "1:1", "-o", "{out}"),
    ("inspect", "{dump}", "-o", "{out}"),
    ("convert", "{dump}", "-o", "{out}", "--overwrite"),
]


@pytest.mark.parametrize("command", WRITING_COMMANDS, ids=lambda c: " ".join(c[:1] + c[2:3]))
@pytest.mark.parametrize("spelling", ["same", "dot", "relative", "symlink", "hardlink"])
def test_an_output_that_is_an_input_is_refused_and_the_input_kept(
    dump: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: tuple, spelling: str
) -> None:
    monkeypatch.chdir(tmp_path)
    before = dump.read_bytes()
    out = {
        "same": str(dump),
        "dot": f"./{dump.name}",
        "relative": f"../{tmp_path.name}/{dump.name}",
        "symlink": str(tmp_path / "link.parquet"),
        "hardlink": str(tmp_path / "hard.parquet"),
    }[spelling]
    if spelling == "symlink":
        os.symlink(dump, out)
    if spelling == "hardlink":
        os.link(dump, out)
    args = [part.format(dump=dump, out=out) for part in command]
    line = one_error_line(cli(*args))
    assert "is an input" in line and "destroy" in line, line
    assert dump.read_bytes() == before
    assert hidden_files(tmp_path) == []


def test_an_output_into_a_dump_directory_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    first = write_sequence_dump(run / "step=0" / "part-0.parquet", random_rows(0, steps=(0,)))
    before = first.read_bytes()
    line = one_error_line(cli("analyze", run, "-f", "json", "-o", first))
    assert "is an input" in line
    # convert --partition over the directory that holds the input would delete it
    line = one_error_line(cli("convert", run, "-o", run, "--partition", "step", "--overwrite"))
    assert "holds an input" in line
    assert first.read_bytes() == before


def test_saved_results_and_presets_files_count_as_inputs(dump: Path, tmp_path: Path) -> None:
    saved = tmp_path / "saved.json"
    assert cli("analyze", dump, "-f", "json", "-o", saved).exit_code == 0
    before = saved.read_bytes()
    assert "is an input" in one_error_line(cli("report", "--from-json", saved, "-o", saved))
    assert saved.read_bytes() == before
    presets = tmp_path / "mine.yaml"
    presets.write_text("mine:\n  rollout_is: token\n  rollout_is_threshold: 2.0\n")
    assert "is an input" in one_error_line(cli("compare-presets", dump, "--presets-file", presets, "-o", presets))
    assert presets.read_text().startswith("mine:")


def test_two_outputs_that_are_one_file_are_refused(dump: Path, tmp_path: Path) -> None:
    out = tmp_path / "gates.txt"
    line = one_error_line(cli("check", dump, "--max", "rollout_corr/k3_kl=1", "--junit", out, "-o", out))
    assert "same file" in line
    assert not out.exists()


def test_an_output_that_is_a_directory_is_refused(dump: Path, tmp_path: Path) -> None:
    (tmp_path / "somewhere").mkdir()
    assert "is a directory" in one_error_line(cli("analyze", dump, "-o", tmp_path / "somewhere"))


def test_library_convert_refuses_overwriting_its_input(dump: Path) -> None:
    from rollout_diag.io.convert import convert

    before = dump.read_bytes()
    with pytest.raises(ConfigError, match="is an input"):
        convert(str(dump), dump, overwrite=True)
    assert dump.read_bytes() == before


def test_check_outputs_allows_new_and_unrelated_files(dump: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text("{}")
    check_outputs({"--output": other, "--junit": tmp_path / "new.xml", "--none": None}, [dump])
    check_outputs({"--output": tmp_path / "x.json"}, [str(tmp_path / "*.parquet")])
    with pytest.raises(ConfigError, match="No such file or directory"):  # said before a long run, not after
        check_outputs({"--output": tmp_path / "missing" / "x.json"}, [dump])
    with pytest.raises(ConfigError, match="is an input"):
        check_outputs({"--output": dump}, [str(tmp_path / "*.parquet")])  # a glob names it


# ------------------------------------------------------------------ atomic outputs
def test_atomic_path_keeps_the_old_file_when_writing_fails(tmp_path: Path) -> None:
    target = tmp_path / "result.json"
    target.write_text("good")
    with pytest.raises(RuntimeError), atomic_path(target) as temporary:
        temporary.write_text("trunc")
        raise RuntimeError("disk full")
    assert target.read_text() == "good"
    assert hidden_files(tmp_path) == []
    with atomic_path(target) as temporary:
        temporary.write_text("better")
    assert target.read_text() == "better"
    assert hidden_files(tmp_path) == []


def test_atomic_path_writes_through_a_symlink_and_keeps_the_mode(tmp_path: Path) -> None:
    real = tmp_path / "real.txt"
    real.write_text("old")
    real.chmod(0o640)
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    with atomic_path(link) as temporary:
        temporary.write_text("new")
    assert link.is_symlink() and real.read_text() == "new"
    assert real.stat().st_mode & 0o777 == 0o640


def test_a_failed_export_leaves_the_previous_decisions_file(tmp_path: Path) -> None:
    rows = random_rows(0, steps=(0, 1), rows_per_step=3)
    rows.append(seq_row(1, "bad", [-0.5, float("nan")], [-0.4, -0.3]))
    dump = write_sequence_dump(tmp_path / "run.parquet", rows)
    decisions = tmp_path / "decisions.parquet"
    decisions.write_bytes(b"a good file from yesterday")
    result = cli("compare-presets", dump, "--strict", "--export-decisions", decisions)
    assert result.exit_code == 1
    assert decisions.read_bytes() == b"a good file from yesterday"
    assert hidden_files(tmp_path) == []


def test_a_failed_convert_leaves_the_previous_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import rollout_diag.io.convert as convert_module

    rows = random_rows(0, steps=(0, 1), rows_per_step=3)
    dump = write_sequence_dump(tmp_path / "run.parquet", rows, row_group_size=3)  # two row groups, two batches
    out = tmp_path / "out.parquet"
    out.write_bytes(b"previous")
    canonical = convert_module._canonical
    calls = []

    def fails_the_second_time(*args, **kwargs):  # a read error half-way through the input
        calls.append(1)
        if len(calls) > 1:
            raise InputError("run.parquet: row 3: unreadable.")
        return canonical(*args, **kwargs)

    monkeypatch.setattr(convert_module, "_canonical", fails_the_second_time)
    assert cli("convert", dump, "-o", out, "--overwrite").exit_code == 1
    assert out.read_bytes() == b"previous"
    assert hidden_files(tmp_path) == []
    monkeypatch.undo()
    assert cli("convert", dump, "-o", out, "--overwrite").exit_code == 0
    assert out.read_bytes() != b"previous"
    partitioned = tmp_path / "parts"
    assert cli("convert", dump, "-o", partitioned, "--partition", "step").exit_code == 0
    assert cli("convert", dump, "-o", partitioned, "--partition", "step", "--overwrite").exit_code == 0
    assert sorted(p.name for p in partitioned.iterdir()) == ["step=0", "step=1"]
    assert hidden_files(tmp_path) == []


# ------------------------------------------------------------------ small inputs
@pytest.mark.parametrize("uri", ["https://host/run/", "ftp://host/run.parquet", "file:///tmp/x"])
def test_a_uri_not_read_is_a_one_line_error(uri: str) -> None:  # s3://, gs://, hf:// are read: tests/io/test_storage.py
    line = one_error_line(cli("analyze", uri))
    assert uri.rstrip("/") in line and "URIs are not read" in line, line


def test_a_remote_uri_in_the_library_and_as_output(dump: Path, tmp_path: Path) -> None:
    import rollout_diag as rd

    with pytest.raises(rd.RolloutDiagError, match="URIs are not read"):
        rd.analyze("https://host/run.parquet", device="cpu")
    line = one_error_line(cli("analyze", dump, "-o", "s3://bucket/out.json"))
    assert "remote URIs are not written" in line


# ------------------------------------------------------------------ inspect on a huge row
def _long_row_dump(path: Path, length: int, worst: int) -> Path:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    trainer = -rng.exponential(1.0, length).astype(np.float32)
    rollout = np.minimum(trainer + rng.normal(0, 0.05, length).astype(np.float32), 0)
    rollout[worst] = trainer[worst] - 3  # the largest |δ|
    mask = np.ones(length, np.int8)
    mask[::50] = 0

    def lists(values: np.ndarray, kind: pa.DataType) -> pa.Array:
        return pa.ListArray.from_arrays(pa.array([0, length], pa.int32()), pa.array(values, kind))

    table = pa.table(
        {
            "step": pa.array([0], pa.int64()),
            "sample_id": ["long"],
            "rollout_log_probs": lists(rollout, pa.float32()),
            "old_log_probs": lists(trainer, pa.float32()),
            "response_mask": lists(mask, pa.int8()),
        }
    )
    pq.write_table(table, path)
    return path


def test_inspect_on_a_2m_token_row_returns_a_window_in_seconds(tmp_path: Path) -> None:
    import json
    import time

    dump = _long_row_dump(tmp_path / "long.parquet", 2_000_000, 1_234_567)
    started = time.process_time()
    result = cli("inspect", dump, "--device", "cpu")
    table = result.stdout
    document = json.loads(cli("inspect", dump, "--device", "cpu", "-f", "json").stdout)
    # before: the whole row was listed (2 M table lines; minutes and gigabytes); CPU time, not wall (shared machine)
    assert time.process_time() - started < 60
    assert result.exit_code == 0
    header = " ".join(table.split())  # the header wraps at the terminal's width
    assert "tokens 1234517–1234616 of 2000000 (showing 100; --window / --around / --all for more)" in header
    assert len(table.splitlines()) < 150
    assert len(document["mask"]) == len(document["log_ratio"]) == 100
    assert document["start"] == 1_234_517 and document["row_length"] == 2_000_000


def test_inspect_lists_short_rows_whole_and_long_ones_with_all(tmp_path: Path) -> None:
    import json

    short = _long_row_dump(tmp_path / "short.parquet", 1000, 10)
    document = json.loads(cli("inspect", short, "--device", "cpu", "-f", "json").stdout)
    assert len(document["mask"]) == 1000 and document["row_length"] is None
    long = _long_row_dump(tmp_path / "long.parquet", 1001, 900)
    document = json.loads(cli("inspect", long, "--device", "cpu", "-f", "json").stdout)
    assert len(document["mask"]) == 100 and document["row_length"] == 1001
    document = json.loads(cli("inspect", long, "--device", "cpu", "-f", "json", "--all").stdout)
    assert len(document["mask"]) == 1001 and document["row_length"] is None
    line = one_error_line(cli("inspect", long, "--device", "cpu", "--all", "--window", "5"))
    assert "--all lists the whole row" in line and "--window" in line


# ------------------------------------------------------------------ saved results of the wrong shape
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


def _paths(document, prefix=()):
    """Every (path to a value) in a JSON document, containers and leaves."""
    yield prefix
    if isinstance(document, dict):
        for key, value in document.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(document, list):
        for index, value in enumerate(document[:3]):
            yield from _paths(value, (*prefix, index))


def _replaced(document, path, value):
    import copy

    if not path:
        return value
    changed = copy.deepcopy(document)
    parent = changed
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return changed


@pytest.fixture(scope="module")
def saved_results(tmp_path_factory) -> dict:
    import json

    directory = tmp_path_factory.mktemp("saved")
    dump = write_sequence_dump(directory / "run.parquet", random_rows(3, steps=(0, 1, 2), rows_per_step=4))
    documents = {}
    for command in ("analyze", "compare-presets"):
        options = ("--preset", "verl") if command == "compare-presets" else ()
        result = cli(command, dump, "--device", "cpu", "-f", "json", *options)
        assert result.exit_code == 0, result.output
        documents[command] = json.loads(result.stdout)
    return documents


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ({"run": 1, "steps": 2}, "field 'run': expected an object, found a number (1)"),
        ({"run": {}, "steps": 2}, "field 'run.rows': missing"),
        ({"presets": {"a": 1}, "inputs": ["a.parquet"], "columns": {}}, "field 'presets': expected a list"),
    ],
)
def test_report_from_json_of_the_wrong_shape_names_the_field(tmp_path: Path, document: dict, field: str) -> None:
    import json

    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps(document))
    line = one_error_line(cli("report", "--from-json", saved, "-o", tmp_path / "report.html"))
    assert line.startswith(f"Error: {saved}: not a") and field in line, line
    assert not (tmp_path / "report.html").exists()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), kind=st.sampled_from(["analyze", "compare-presets"]))
def test_loaders_of_saved_results_raise_one_line_input_errors_on_any_wrong_shape(saved_results, data, kind) -> None:
    from rollout_diag.results import result_from_json

    document = saved_results[kind]
    path = data.draw(st.sampled_from(list(_paths(document))), label="path")
    broken = _replaced(document, path, data.draw(JSON_VALUES, label="value"))
    try:
        result_from_json(broken)
    except InputError as exc:
        assert "\n" not in str(exc)


# ------------------------------------------------------------------ a stray Parquet file beside the dump
def _stats_file(path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"step": [0, 1], "loss": [0.5, 0.4], "grad_norm": [1.0, 0.9]}), path)
    return path


def test_an_unrelated_parquet_file_in_the_dump_directory_is_skipped_with_a_warning(tmp_path: Path) -> None:
    import json

    import rollout_diag as rd

    run = tmp_path / "run"
    rows = random_rows(0, steps=(0, 1), rows_per_step=3)
    write_sequence_dump(run / "dump.parquet", rows)
    alone = rd.analyze(str(run), device="cpu").to_json()
    stats = _stats_file(run / "train_stats.parquet")
    result = cli("analyze", run, "--device", "cpu", "-f", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["run"] == alone["run"] and document["steps"] == alone["steps"]
    assert document["inputs"] == [str(run / "dump.parquet")]
    (warning,) = [w for w in document["warnings"] if "train_stats" in w]
    assert warning.startswith(f"{stats}: skipped: not part of the dump") and "loss" in warning
    # by a glob too
    assert cli("analyze", str(run / "*.parquet"), "--device", "cpu", "-f", "json").exit_code == 0


def test_a_file_with_some_roles_or_named_alone_stays_an_error(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    run = tmp_path / "run"
    write_sequence_dump(run / "dump.parquet", random_rows(0, steps=(0,), rows_per_step=3))
    stats = _stats_file(tmp_path / "train_stats.parquet")
    assert "no rollout logprob column" in one_error_line(cli("analyze", stats, "--device", "cpu"))
    assert "no rollout logprob column" in one_error_line(cli("analyze", run / "dump.parquet", stats, "--device", "cpu"))
    only_stats = tmp_path / "only"
    _stats_file(only_stats / "a.parquet")
    assert "no rollout logprob column" in one_error_line(cli("analyze", only_stats, "--device", "cpu"))
    half = pa.table({"step": [0], "rollout_log_probs": pa.array([[-0.1, -0.2]], pa.list_(pa.float32()))})
    pq.write_table(half, run / "half.parquet")
    assert "no trainer logprob column" in one_error_line(cli("analyze", run, "--device", "cpu"))


def test_a_role_given_two_columns_is_an_error(dump: Path) -> None:
    line = one_error_line(cli("analyze", dump, "--device", "cpu", "-c", "mask=a", "-c", "mask=b"))
    assert "--column mask=a and mask=b: one column per role" in line
    same = cli("analyze", dump, "--device", "cpu", "-c", "mask=response_mask", "-c", "mask=response_mask")
    assert same.exit_code == 0, same.output


@pytest.mark.parametrize("layout", ["sequence", "token"])
def test_an_integral_float_step_column_is_read_as_integers(tmp_path: Path, layout: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from helpers.dumps import sequence_table, token_table

    import rollout_diag as rd

    rows = random_rows(0, steps=(0, 1, 2), rows_per_step=3)
    table = (sequence_table if layout == "sequence" else token_table)(rows)
    expected = rd.analyze(str(write_sequence_dump(tmp_path / "int.parquet", rows)), device="cpu").to_json()
    index = table.schema.get_field_index("step")
    as_float = table.set_column(index, "step", table.column("step").cast(pa.float64()))  # what pandas writes
    pq.write_table(as_float, tmp_path / "float.parquet")
    result = rd.analyze(str(tmp_path / "float.parquet"), device="cpu").to_json()
    assert result["run"] == expected["run"] and result["steps"] == expected["steps"]
    # a value that is not whole is an error naming its row
    steps = [float(v) for v in table.column("step").to_pylist()]
    steps[4] = 1.5
    broken = table.set_column(index, "step", pa.array(steps, pa.float64()))
    pq.write_table(broken, tmp_path / "broken.parquet")
    line = one_error_line(cli("analyze", tmp_path / "broken.parquet", "--device", "cpu"))
    assert "row 4, column 'step': step 1.5 is not a whole number" in line


def test_trainer_rows_a_constant_k_tokens_longer_are_named(tmp_path: Path) -> None:
    import json

    rows = random_rows(0, steps=(0, 1), rows_per_step=3)
    for row in rows:
        row["trainer"] = [-0.5] * 7 + row["trainer"]  # the trainer side kept the prompt's last 7 tokens
    every = write_sequence_dump(tmp_path / "every.parquet", rows)
    line = one_error_line(cli("analyze", every, "--device", "cpu"))
    assert (
        "the trainer side (old_log_probs) has 7 more tokens than rollout_log_probs (a prompt prefix?) in every row"
        in (line)
    )
    most = random_rows(0, steps=(0, 1), rows_per_step=3)
    for row in most[:-2]:
        row["trainer"] = [-0.5] * 7 + row["trainer"]
    document = json.loads(
        cli("analyze", write_sequence_dump(tmp_path / "most.parquet", most), "--device", "cpu", "-f", "json").stdout
    )
    assert any(
        "7 more tokens than rollout_log_probs (a prompt prefix?) in each of the 4 rows" in w
        for w in document["warnings"]
    )
    mixed = random_rows(0, steps=(0, 1), rows_per_step=3)
    for extra, row in enumerate(mixed[:-1]):
        row["trainer"] = [-0.5] * (extra + 1) + row["trainer"]  # different lengths: a generic ragged skip only
    document = json.loads(
        cli("analyze", write_sequence_dump(tmp_path / "mixed.parquet", mixed), "--device", "cpu", "-f", "json").stdout
    )
    assert not any("prompt prefix" in w for w in document["warnings"])
    assert document["skipped_rows"] == 5


def test_a_one_file_dumpwriter_killed_before_close_says_so(tmp_path: Path) -> None:
    import numpy as np

    import rollout_diag as rd

    path = tmp_path / "run.parquet"
    rollout = -np.ones((2, 3), dtype=np.float32) * 0.5
    writer = rd.DumpWriter(path)
    writer.write(0, rollout, rollout - 0.01, np.ones((2, 3)))
    killed = tmp_path / "killed.parquet"
    killed.write_bytes(path.read_bytes())  # what a job killed now leaves: no footer yet
    writer.close()
    line = one_error_line(cli("analyze", killed, "--device", "cpu"))
    assert "not a readable Parquet file" in line
    assert "was a DumpWriter killed before close()? Use the directory mode" in line
    other = tmp_path / "other.parquet"
    other.write_bytes(b"not parquet at all")
    assert "DumpWriter" not in one_error_line(cli("analyze", other, "--device", "cpu"))


def test_make_synthetic_writes_the_steps_it_says(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util
    import sys

    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    script = Path(__file__).resolve().parents[2] / "sample_data" / "make_synthetic.py"
    spec = importlib.util.spec_from_file_location("make_synthetic", script)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "make_synthetic", module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    out = tmp_path / "s40.parquet"
    # 200 000 tokens make 108 rows: ceil-sized steps of 3 rows ended after 36 steps while it printed 40
    assert module.main(["--tokens", "200000", "--steps", "40", "--out", str(out)]) == 0
    assert "40 steps, 108 rows" in capsys.readouterr().out
    table = pq.read_table(out)
    assert sorted(pc.unique(table.column("step")).to_pylist()) == list(range(40))
    assert table.schema.metadata[b"steps"] == b"40"
    sizes = pc.value_counts(table.column("step")).field("counts").to_pylist()
    assert max(sizes) - min(sizes) <= 1
    # the bundled sample (no --tokens) is unchanged by the fix
    sample = tmp_path / "sample.parquet"
    assert module.main(["--out", str(sample)]) == 0
    assert pq.read_table(sample).equals(pq.read_table(script.parent / "synthetic_multiturn.parquet"))


# ------------------------------------------------------------------ --help
def test_help_lists_commands_in_the_readme_order_uncut_with_an_example_each() -> None:
    import re

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    order = ["analyze", "compare-presets", "sweep", "report", "inspect", "check", "diff", "runs", "watch", "convert"]
    for width in ("80", "120"):
        text = cli("--help", env={"COLUMNS": width}).stdout
        listed = re.findall(r"^  ([a-z-]+)  ", text.split("Commands:")[1], flags=re.MULTILINE)
        assert listed == order, listed
        assert "..." not in text.split("Commands:")[1]  # "[ARGS]..." in the usage line is click's
    for command in order:
        assert f"rollout-diag {command}" in readme
        text = cli(command, "--help", env={"COLUMNS": "80"}).stdout
        assert "Examples:" in text and f"rollout-diag {command} " in text, command


def test_check_and_diff_take_input_format_and_trust_pickle(dump: Path, tmp_path: Path) -> None:
    from helpers.formats import dataset, write_slime

    slime = write_slime(tmp_path / "slime", dataset())
    for command in (["check", slime, "--max", "rollout_corr/k3_kl=10"], ["diff", slime, slime]):
        result = cli(*command, "--device", "cpu", "--input-format", "slime", "--trust-pickle")
        assert result.exit_code == 0, result.output
        line = one_error_line(cli(*command, "--device", "cpu", "--input-format", "nemo-rl"))
        assert "nemo-rl" in line.lower() or "NeMo-RL" in line, line
    assert cli("diff", dump, dump, "--device", "cpu", "--input-format", "parquet").exit_code == 0


@pytest.mark.parametrize("layout", ["sequence", "token"])
def test_a_float16_logprob_column_gets_a_warning(tmp_path: Path, layout: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from helpers.dumps import sequence_table, token_table

    import rollout_diag as rd

    rows = random_rows(0)
    table = (sequence_table if layout == "sequence" else token_table)(rows)
    plain = tmp_path / "float32.parquet"
    pq.write_table(table, plain)
    assert not any("float16" in w for w in rd.analyze(str(plain), device="cpu").warnings)
    index = table.schema.get_field_index("old_log_probs")
    half = pa.list_(pa.float16()) if layout == "sequence" else pa.float16()
    pq.write_table(table.set_column(index, "old_log_probs", table.column(index).cast(half)), tmp_path / "half.parquet")
    (warning,) = [w for w in rd.analyze(str(tmp_path / "half.parquet"), device="cpu").warnings if "float16" in w]
    assert "column 'old_log_probs' (trainer logprobs) is float16 (quantised)" in warning
    assert "not mismatch" in warning


def test_the_verl_dilution_note_needs_a_visible_effect_and_joins_the_empty_row_warning(tmp_path: Path) -> None:
    import rollout_diag as rd

    rows = random_rows(0, steps=(0,), rows_per_step=200)
    rows.append(seq_row(0, "empty", [-0.5, -0.4], [-0.6, -0.3], [0, 0]))  # one empty row in 201: verl's means -0.5 %
    warnings = rd.analyze(str(write_sequence_dump(tmp_path / "small.parquet", rows)), device="cpu").warnings
    assert [w for w in warnings if "no model token" in w] == [w for w in warnings if "row(s) have no model token" in w]
    assert len([w for w in warnings if "no model token" in w]) == 1
    assert not any("verl dialect" in w for w in warnings)  # it said "(-0.0%)" or "(-0.5%)" in a warning of its own
    few = random_rows(0, steps=(0,), rows_per_step=3)
    few.append(seq_row(0, "empty", [-0.5], [-0.6], [0]))  # one in four: 25 %
    warnings = rd.analyze(str(write_sequence_dump(tmp_path / "big.parquet", few)), device="cpu").warnings
    (note,) = [w for w in warnings if "no model token" in w]
    assert note.startswith("1 row(s) have no model token") and "In the verl dialect they move" in note
    assert "(-25.0%)" in note


def test_an_output_beside_the_data_in_a_dump_directory_can_be_rewritten(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_sequence_dump(run / "step=0" / "part-0.parquet", random_rows(0, steps=(0,)))
    for _ in range(2):  # the second run replaces its own earlier output
        assert cli("analyze", run, "--device", "cpu", "-f", "json", "-o", run / "result.json").exit_code == 0
    # the result is no data file: the next read of the directory ignores it
    assert cli("analyze", run, "--device", "cpu", "-f", "json", "-o", run / "result.json").exit_code == 0


def test_an_unwritable_output_directory_names_the_output(dump: Path, tmp_path: Path) -> None:
    from rollout_diag.io.outputs import write_text

    missing = tmp_path / "gone" / "out.json"
    with pytest.raises(OSError) as raised:
        write_text(missing, "{}")  # its directory vanished after the check
    assert raised.value.filename == str(missing)


def test_outputs_get_the_usual_permissions(dump: Path, tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        assert cli("analyze", dump, "--device", "cpu", "-f", "json", "-o", tmp_path / "r.json").exit_code == 0
        assert cli("convert", dump, "-o", tmp_path / "parts", "--partition", "step").exit_code == 0
    finally:
        os.umask(umask)
    assert (tmp_path / "r.json").stat().st_mode & 0o777 == 0o644  # not mkstemp's private 0600
    assert (tmp_path / "parts").stat().st_mode & 0o777 == 0o755  # not mkdtemp's 0700


def test_convert_overwrite_replaces_a_directory_by_a_file_and_back(dump: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert cli("convert", dump, "-o", out, "--partition", "step").exit_code == 0
    assert cli("convert", dump, "-o", out, "--overwrite").exit_code == 0
    assert out.is_file()
    assert cli("convert", dump, "-o", out, "--partition", "step", "--overwrite").exit_code == 0
    assert out.is_dir() and hidden_files(tmp_path) == []


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), kind=st.sampled_from(["analyze", "compare-presets"]))
def test_a_saved_result_that_loads_also_renders_a_report(saved_results, data, kind) -> None:
    # what loads must not crash the report later (a null histogram count, a string in a rounds row, a null target)
    from rollout_diag.errors import RolloutDiagError
    from rollout_diag.report import render_report
    from rollout_diag.results import result_from_json

    document = saved_results[kind]
    path = data.draw(st.sampled_from([p for p in _paths(document) if p]), label="path")
    value = data.draw(st.sampled_from([None, True, 0, -1, 1.5, "x", [], {}, [1], {"a": 1}]), label="value")
    try:
        render_report(result_from_json(_replaced(document, path, value)))
    except RolloutDiagError as exc:
        assert "\n" not in str(exc)


@pytest.mark.parametrize(
    ("name", "change"),
    [("rollout_logprob", "empty"), ("trainer_logprob", "longer"), ("token_id", "longer"), ("mask", "empty")],
)
def test_a_saved_row_whose_token_lists_disagree_is_refused(saved_results, name, change) -> None:
    # found by hypothesis: an empty rollout_logprob loaded, and the report crashed later in RowTokens.log_ratio
    # (zip strict); the lists of one row are one value per token, so their lengths must agree when read
    import copy

    from rollout_diag.results import result_from_json

    document = copy.deepcopy(saved_results["analyze"])
    row = document["worst_row_tokens"][0]
    assert row["mask"]  # the fixture's row lists tokens (its ids are null: no token_id column)
    row[name] = [] if change == "empty" else [*(row[name] or [0] * len(row["mask"])), 0]
    with pytest.raises(InputError) as raised:
        result_from_json(document)
    wrong = "trainer_logprob" if name == "mask" else name  # with the mask cut, the first list that disagrees
    found = len(row[wrong])
    assert f"result: field 'worst_row_tokens[0].{wrong}': expected {len(row['mask'])} values" in str(raised.value)
    assert str(raised.value).endswith(f"found {found}.") and "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("kind", "path", "value", "message"),
    [  # found by hypothesis: each loaded, then the report crashed (KeyError, a format code on a string)
        ("analyze", ("rounds", 0), {}, "field 'rounds[0].round': missing."),
        (
            "analyze",
            ("divergent_round",),
            {
                "round": 0,
                "pooled": False,
                "logprob_abs_diff_mean": 0.1,
                "token_count": 9,
                "others_mean": 0.1,
                "factor": "x",
                "stands_out": False,
            },
            "field 'divergent_round.factor': expected a number",
        ),
        ("analyze", ("divergent_round",), {}, "field 'divergent_round.round': missing."),
        ("compare-presets", ("sweep", 0, "level"), "x", "field 'sweep[0].level': expected 'token' or 'sequence'"),
    ],
)
def test_a_saved_table_row_or_sweep_option_of_the_wrong_shape_is_refused(saved_results, kind, path, value, message):
    import copy

    from rollout_diag.results import result_from_json

    document = copy.deepcopy(saved_results[kind])
    parent = document
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    with pytest.raises(InputError) as raised:
        result_from_json(document)
    assert message in str(raised.value)


def test_a_wrong_value_under_a_key_with_a_newline_is_still_one_line(saved_results) -> None:
    # found by hypothesis: the field path carries the file's own key, which may hold control characters
    import copy

    from rollout_diag.results import result_from_json

    document = copy.deepcopy(saved_results["analyze"])
    document["run"]["metrics"]["a\nb"] = False
    with pytest.raises(InputError) as raised:
        result_from_json(document)
    assert "\n" not in str(raised.value) and "metrics.a\\nb" in str(raised.value)


@pytest.mark.parametrize("version", [[], "1", 1.5, True, {}])
def test_a_schema_version_that_is_no_number_is_one_line(saved_results, version) -> None:
    # found by hypothesis in CI: schema_version [] reached a `>` comparison (TypeError, an internal error)
    import copy

    from rollout_diag.results import result_from_json

    document = copy.deepcopy(saved_results["analyze"])
    document["schema_version"] = version
    with pytest.raises(InputError, match="field 'schema_version': expected a whole number"):
        result_from_json(document)


def test_inspect_around_says_the_windows_largest_and_the_rows(tmp_path: Path) -> None:
    import json

    from rollout_diag.formatting import number

    dump = _long_row_dump(tmp_path / "long.parquet", 5_000, 4_001)  # the row's largest |δ| at position 4 001
    header = " ".join(cli("inspect", dump, "--device", "cpu", "--around", "100", "--window", "20").stdout.split())

    options = ("--device", "cpu", "--around", "100", "--window", "20")
    document = json.loads(cli("inspect", dump, *options, "-f", "json").stdout)
    assert document["start"] == 90 and document["row_largest_position"] == 4_001
    largest = document["row_largest_abs_delta"]
    window = max(abs(d) for d, m in zip(document["log_ratio"], document["mask"], strict=True) if m)
    assert largest > window  # the planted token is outside the window
    assert "largest |δ| in the window = " in header and f"in the row = {number(largest)} at position 4001" in header
    whole = " ".join(cli("inspect", dump, "--device", "cpu", "--all").stdout.split()[:60])
    assert "largest |δ| = " in whole and "in the window" not in whole  # the whole row: one largest
