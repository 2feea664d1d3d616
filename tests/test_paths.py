"""How commands name their inputs (rollout_diag/paths.py)."""

from __future__ import annotations

import pytest

from rollout_diag.paths import file_labels, inputs_label
from rollout_diag.report import default_title


@pytest.mark.parametrize(
    ("files", "label"),
    [
        (["run.parquet"], "run.parquet"),
        # a directory dump: the directory and the count, not its first step and rank
        (["/data/run/step=0/rank-0.parquet", "/data/run/step=1/rank-0.parquet"], "/data/run/ (2 files)"),
        (["run/a.parquet", "run/b.parquet", "run/c.parquet"], "run/ (3 files)"),
        # files in no common directory (or only the root): the first one's label and how many more
        (["a.parquet", "b.parquet"], "a.parquet and 1 more"),
        (["/x/a.parquet", "/y/a.parquet"], "x/a.parquet and 1 more"),
        ([], ""),
    ],
)
def test_inputs_are_named_by_their_directory(files: list[str], label: str) -> None:
    assert inputs_label(files) == label


def test_the_report_title_names_a_directory_dump_by_its_directory() -> None:
    files = [f"/data/run/step={step}/rank-{rank}.parquet" for step in range(4) for rank in range(2)]
    assert default_title(files) == "rollout-diag report: /data/run/ (8 files)"
    assert file_labels(files)[files[0]] == "step=0/rank-0.parquet"  # tables still tell the files apart
