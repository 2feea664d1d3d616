"""``--drift-windows`` and the drift sentence as a user meets them: one line when the change is beyond noise, nothing
on a flat run, one-line errors for a bad window."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.cli import error_line, invoke, succeeded
from helpers.drift import write_scenario


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("drift_cli")
    return {name: write_scenario(root / f"{name}.parquet", name) for name in ("length", "flat")}


def test_planted_length_shift_is_said_once(dumps: dict[str, Path]) -> None:
    text = " ".join(succeeded(invoke("analyze", dumps["length"], "--workers", "1")).split())  # unwrapped
    assert text.count("from the shift toward responses of 256–511 tokens (length mix)") == 2  # k3_kl and mean |δ|
    assert "k3_kl rose 1.5× from steps 0–1 to 8–9" in text


def test_flat_run_says_nothing(dumps: dict[str, Path]) -> None:
    text = " ".join(succeeded(invoke("analyze", dumps["flat"], "--workers", "1")).split())
    assert " mix)" not in text and "within buckets" not in text and "from steps" not in text


@pytest.mark.parametrize(
    ("windows", "says"),
    [
        ("0:9", "give two step ranges"),
        ("x:1,2:3", "is not FIRST:LAST"),
        ("5:1,6:7", "FIRST ≤ LAST"),
        ("0:5,3:9", "must start after"),
        ("20:30,40:50", "no step of the input"),
    ],
)
def test_bad_windows_are_one_line(dumps: dict[str, Path], windows: str, says: str) -> None:
    line = error_line(invoke("analyze", dumps["flat"], "--workers", "1", "--drift-windows", windows))
    assert "--drift-windows" in line and says in line


def test_windows_reach_the_json(dumps: dict[str, Path], tmp_path: Path) -> None:
    import json

    out = tmp_path / "result.json"
    succeeded(
        invoke("analyze", dumps["length"], "--workers", "1", "--drift-windows", "0:3,6:9", "-f", "json", "-o", out)
    )
    drift = json.loads(out.read_text())["drift"]
    assert [entry["metric"] for entry in drift] == ["rollout_corr/k3_kl", "mismatch/logprob_abs_diff"]
    assert drift[0]["from_steps"] == [0, 3] and drift[0]["to_steps"] == [6, 9]
