"""Dumps on object storage (io/storage.py) against a local S3-compatible server: moto's server mode on 127.0.0.1 (the
real S3 protocol through pyarrow's S3FileSystem, nothing of pyarrow mocked). Skipped, saying so, without moto."""

from __future__ import annotations

import json
import logging
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.cli import one_error_line
from helpers.dumps import random_rows, write_sequence_dump

from rollout_diag.cli import app
from rollout_diag.io.reader import DumpReader
from tests.helpers.cli import runner

SAMPLE = Path(__file__).resolve().parents[2] / "sample_data" / "synthetic_multiturn.parquet"
BUCKET = "dumps"


class ServedBytes:
    """WSGI middleware in front of moto: counts the body bytes of every GET the server answers."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.total = 0

    def __call__(self, environ: dict, start_response: Any) -> Iterator[bytes]:
        for block in self.app(environ, start_response):
            if environ["REQUEST_METHOD"] == "GET":
                self.total += len(block)
            yield block


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, ServedBytes, Any]]:
    """(endpoint URL, the served-bytes counter, a boto3 client) of a moto S3 server on a free loopback port."""
    moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed: S3 tests skipped")
    boto3 = pytest.importorskip("boto3", reason="boto3 (moto[server]) is not installed: S3 tests skipped")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise
    threaded = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    threaded.start()
    counter = ServedBytes(threaded._server.app)  # the running WSGI server's app, wrapped: bytes as sent
    threaded._server.app = counter
    host, port = threaded.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    client.create_bucket(Bucket=BUCKET)
    yield endpoint, counter, client
    threaded.stop()


@pytest.fixture
def s3(server: tuple[str, ServedBytes, Any], monkeypatch: pytest.MonkeyPatch) -> tuple[ServedBytes, Any]:
    """The server's counter and client, with the environment a user of an S3-compatible server sets."""
    endpoint, counter, client = server
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_REGION", "ROLLOUT_DIAG_ANONYMOUS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return counter, client


def upload(client: Any, local: Path, prefix: str) -> str:
    """Every file under ``local`` (or ``local`` itself) put under ``prefix``; returns its s3:// URI."""
    files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
    for path in files:
        key = f"{prefix}/{path.name}" if local.is_file() else f"{prefix}/{path.relative_to(local).as_posix()}"
        client.put_object(Bucket=BUCKET, Key=key, Body=path.read_bytes())
    return f"s3://{BUCKET}/{prefix}/{local.name}" if local.is_file() else f"s3://{BUCKET}/{prefix}"


def step_dump(directory: Path) -> Path:
    """step=1/, step=2/, step=10/ (one file each), a _SUCCESS marker and a stray text file: a directory dump."""
    for step in (10, 2, 1):
        write_sequence_dump(directory / f"step={step}" / "part-0.parquet", random_rows(step, steps=(step,)))
    (directory / "_SUCCESS").write_text("")
    (directory / "notes.txt").write_text("not data")
    return directory


def cli_json(*args: object) -> dict:
    result = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def same_except_paths(remote: dict, local: dict, uri: str, directory: Path) -> None:
    """The two documents equal once the remote prefix is spelled as the local directory."""
    text = json.dumps(remote)
    for spelling in (uri, uri.replace("://", ":/", 1)):  # pathlib folds "//" where a label is built from a Path
        text = text.replace(spelling, str(directory))
    assert json.loads(text) == local


# ------------------------------------------------------------------ reading
def test_one_file_reads_as_the_local_file(s3: tuple[ServedBytes, Any]) -> None:
    _, client = s3
    uri = upload(client, SAMPLE, "one")
    remote = cli_json("analyze", uri, "--device", "cpu", "-f", "json")
    local = cli_json("analyze", SAMPLE, "--device", "cpu", "-f", "json")
    same_except_paths(remote, local, uri, SAMPLE)


def test_a_prefix_lists_its_parquet_files_in_natural_order(s3: tuple[ServedBytes, Any], tmp_path: Path) -> None:
    _, client = s3
    uri = upload(client, step_dump(tmp_path / "run"), "order/run")
    for given in (uri, f"{uri}/", uri.replace("s3://", "s3:/")):  # as typed, with "/", as a pathlib.Path folds it
        reader = DumpReader([given])
        assert reader.log.files == [f"{uri}/step={step}/part-0.parquet" for step in (1, 2, 10)]
        assert [source.partition for source in reader.sources] == [{"step": 1}, {"step": 2}, {"step": 10}]
    matched = DumpReader([f"{uri}/step=1*/*.parquet"]).log.files
    assert matched == [f"{uri}/step=1/part-0.parquet", f"{uri}/step=10/part-0.parquet"]
    assert DumpReader([f"s3://{BUCKET}/order/**/part-0.parquet"]).log.files == reader.log.files


def test_a_prefix_gives_the_local_directory_s_results(s3: tuple[ServedBytes, Any], tmp_path: Path) -> None:
    _, client = s3
    directory = step_dump(tmp_path / "run")
    uri = upload(client, directory, "same/run")
    for command in ("analyze", "compare-presets"):
        remote = cli_json(command, f"{uri}/", "--device", "cpu", "-f", "json")
        local = cli_json(command, directory, "--device", "cpu", "-f", "json")
        same_except_paths(remote, local, uri, directory)


def test_only_the_needed_columns_and_row_groups_are_fetched(s3: tuple[ServedBytes, Any], tmp_path: Path) -> None:
    counter, client = s3
    rows = random_rows(3, steps=tuple(range(8)), rows_per_step=16, min_length=64, max_length=64)
    table = pq.read_table(write_sequence_dump(tmp_path / "dump.parquet", rows))
    # a wide column no role reads (a list, never carried), of random values (no encoding shrinks it): most of the file
    hidden = np.random.default_rng(0).random((table.num_rows, 2048))
    padding = pa.ListArray.from_arrays(np.arange(0, hidden.size + 1, 2048), hidden.ravel())
    write = tmp_path / "wide.parquet"
    pq.write_table(table.append_column("hidden_states", padding), write, row_group_size=16, compression="none")
    size = write.stat().st_size
    uri = upload(client, write, "wide")

    before = counter.total
    list(DumpReader([uri]).chunks())
    whole = counter.total - before
    assert 0 < whole < 0.2 * size, (whole, size)  # the footer and the read columns; hidden_states never fetched

    before = counter.total
    reader = DumpReader([uri])
    opened = counter.total - before  # the footer
    reader.narrow(step=5)
    list(reader.chunks())
    one_step = counter.total - before - opened
    assert 0 < one_step < whole / 4, (one_step, whole)  # one row group of eight


# ------------------------------------------------------------------ errors
def test_a_missing_key_or_bucket_is_one_line(s3: tuple[ServedBytes, Any]) -> None:
    line = one_error_line(runner.invoke(app, ["analyze", f"s3://{BUCKET}/nothing/here.parquet"]))
    assert line == f"Error: s3://{BUCKET}/nothing/here.parquet: no such file or prefix.", line
    line = one_error_line(runner.invoke(app, ["analyze", "s3://no-such-bucket/run/"]))
    assert line == "Error: s3://no-such-bucket/run: no such bucket (no-such-bucket).", line
    line = one_error_line(runner.invoke(app, ["analyze", f"s3://{BUCKET}/nothing/step=*/"]))
    assert "no file matches this pattern" in line, line


def test_access_denied_is_one_line(s3: tuple[ServedBytes, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    _, client = s3
    uri = upload(client, SAMPLE, "private")
    monkeypatch.setenv("ROLLOUT_DIAG_ANONYMOUS", "1")  # unsigned requests: the bucket is not public
    line = one_error_line(runner.invoke(app, ["analyze", uri]))
    assert line.startswith(f"Error: {uri}: access denied;") and "ROLLOUT_DIAG_ANONYMOUS=1" in line, line


def test_hf_without_the_extra_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # as if not installed
    line = one_error_line(runner.invoke(app, ["analyze", "hf://datasets/org/run/step=1/part-0.parquet"]))
    assert "huggingface_hub, not installed; pip install 'rollout-diag[cloud]'" in line, line


def test_outputs_stay_local(s3: tuple[ServedBytes, Any], tmp_path: Path) -> None:
    _, client = s3
    uri = upload(client, SAMPLE, "outputs")
    line = one_error_line(runner.invoke(app, ["analyze", uri, "-o", f"s3://{BUCKET}/outputs/result.json"]))
    assert "remote URIs are not written" in line, line
    local = tmp_path / SAMPLE.name
    shutil.copy(SAMPLE, local)
    line = one_error_line(runner.invoke(app, ["analyze", uri, str(local), "-o", str(local)]))
    assert "this is an input" in line, line


# ------------------------------------------------------------------ watch
def test_watch_polls_a_prefix(s3: tuple[ServedBytes, Any], tmp_path: Path) -> None:
    from rollout_diag.drivers.watch import Watcher

    _, client = s3
    directory = step_dump(tmp_path / "run")
    watcher = Watcher(f"s3://{BUCKET}/watched/run", device="cpu")
    assert "waiting for the trainer" in " ".join(watcher.poll().notes)
    for step in (1, 2):
        upload(client, directory / f"step={step}", f"watched/run/step={step}")
    first = watcher.poll()
    assert first.result is not None and sorted(watcher.versions) == [1, 2]
    upload(client, directory / "step=10", "watched/run/step=10")
    watcher.poll()
    assert sorted(watcher.versions) == [1, 2, 10]
    assert not watcher.poll().changed  # nothing new: nothing read again
