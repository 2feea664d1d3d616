"""Issue 11's ``extra``: per-row scalar columns of a dump (reward, advantage, policy_version, …) carried by the
reader into the worst rows: the result objects, their JSON, the terminal tables, the HTML report and ``inspect``.

Every check compares against the values that went into the file, looked up by (step, sample id): a row that
picked up another row's values (a misaligned skip, a chunk boundary, a worker's merge) fails it.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import re
from pathlib import Path

import jsonschema
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from helpers.dumps import random_rows, sequence_table, token_table, write_table
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

import rollout_diag as rd
from rollout_diag.cli import app
from rollout_diag.io.opening import MAX_EXTRA_COLUMNS
from rollout_diag.io.reader import DumpReader
from rollout_diag.render.analysis import EXTRAS_SHOWN, worst_rows_table
from rollout_diag.render.format import number
from rollout_diag.report import render_report, result_from_json
from tests.helpers.cli import runner

SCHEMA = Path(__file__).resolve().parent.parent / "schemas" / "result.schema.json"
SAMPLE = Path(__file__).resolve().parent.parent / "sample_data" / "textgenrnn_bf16_vs_fp32.parquet"
STANDARD_HEADERS = [
    "step",
    "sample_id",
    "file:row",
    "tokens",
    "rounds",
    "worst round",
    "log-ppl diff",
    "max |δ|",
    "Σ k3",
    "catastrophic",
]
ROWS, WIDTH, STEPS = 6, 9, 3


def padded(step: int) -> dict[str, torch.Tensor]:
    from helpers.trainers import padded_batch

    old, rollout, mask, lengths, _ = padded_batch(step, rows=ROWS, width=WIDTH, empty_row=False)
    return {"old_log_probs": old, "rollout_log_probs": rollout, "response_mask": mask, "lengths": lengths}


def step_extras(step: int) -> dict[str, object]:
    """What a trainer hands ``extra=``: a bf16 tensor, an int tensor, a list of strings and a policy version."""
    return {
        "advantage": torch.linspace(-1.0, 1.0, ROWS, dtype=torch.bfloat16) + step,
        "reward": torch.arange(ROWS) * 10 + step,
        "tag": [f"<script>alert({step}{row})</script>" for row in range(ROWS)],
        "policy_version": [step - 1] * ROWS,
    }


def expected_extra(step: int, row: int) -> dict[str, object]:
    """The values ``step_extras`` holds for one row, as the reader gives them back (bf16 → float exactly)."""
    values = step_extras(step)
    return {
        "policy_version": step - 1,  # read by its role, carried once, first
        "advantage": float(values["advantage"][row]),
        "reward": int(values["reward"][row]),
        "tag": f"<script>alert({step}{row})</script>",
    }


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("extras") / "dump"
    with rd.DumpWriter(root) as dump:
        for step in range(STEPS):
            dump.write_step(
                step, **padded(step), sample_ids=[f"s{row}" for row in range(ROWS)], extra=step_extras(step)
            )
    return root


@pytest.fixture(scope="module")
def analysed(written: Path) -> rd.AnalysisResult:
    return rd.analyze(str(written), device="cpu", top_k=ROWS * STEPS)  # every row enters every top-K list


def rendered(table: object, width: int = 200) -> str:
    """What a terminal of ``width`` columns shows, without colour."""
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(table)
    return out.getvalue()


def by_row(result: rd.AnalysisResult) -> dict[tuple[int, str], dict]:
    extras: dict[tuple[int, str], dict] = {}
    for row in result.worst_rows:
        assert extras.setdefault((row.step, row.sample_id), row.extra) == row.extra  # one row, one extra
    return extras


# ------------------------------------------------------------------------------------- writer → analyze
def test_write_step_extras_come_back_on_exactly_their_rows(analysed: rd.AnalysisResult) -> None:
    extras = by_row(analysed)
    assert len(extras) == ROWS * STEPS
    for (step, sample_id), extra in extras.items():
        assert extra == expected_extra(step, int(sample_id[1:])), (step, sample_id)
    # by hand: step 2, row 4: linspace(-1, 1, 6)[4] = 0.6 is 0.6015625 in bf16; + 2 rounds to bf16's grid of
    # 1/64 there, to even: 2.59375; reward 4·10 + 2
    assert extras[(2, "s4")] == {
        "policy_version": 1,
        "advantage": 2.59375,
        "reward": 42,
        "tag": "<script>alert(24)</script>",
    }
    assert list(extras[(2, "s4")]) == ["policy_version", "advantage", "reward", "tag"]  # column order
    for tokens in analysed.worst_row_tokens:
        assert tokens.extra == expected_extra(tokens.step, int(tokens.sample_id[1:]))


def test_workers_and_chunk_sizes_keep_the_same_extras(written: Path, analysed: rd.AnalysisResult) -> None:
    on_workers = rd.analyze(str(written), device="cpu", top_k=ROWS * STEPS, workers=2)
    assert on_workers.worst_rows == analysed.worst_rows
    assert on_workers.worst_row_tokens == analysed.worst_row_tokens
    chunked = rd.analyze(str(written), device="cpu", top_k=ROWS * STEPS, chunk_tokens=7)
    assert chunked.worst_rows == analysed.worst_rows


def test_extras_do_not_change_a_metric(tmp_path: Path, analysed: rd.AnalysisResult) -> None:
    plain = tmp_path / "plain"
    with rd.DumpWriter(plain) as dump:
        for step in range(STEPS):
            dump.write_step(step, **padded(step), sample_ids=[f"s{row}" for row in range(ROWS)])
    result = rd.analyze(str(plain), device="cpu", top_k=ROWS * STEPS)
    assert result.run.metrics == analysed.run.metrics
    assert [row.extra for row in result.worst_rows] == [{}] * len(result.worst_rows)
    assert [(r.criterion, r.step, r.sample_id, r.value) for r in result.worst_rows] == [
        (r.criterion, r.step, r.sample_id, r.value) for r in analysed.worst_rows
    ]


# ------------------------------------------------------------------------------------- no extra columns
def test_a_dump_without_extra_columns_has_no_extra_noise() -> None:
    result = rd.analyze(str(SAMPLE), device="cpu")
    assert result.worst_rows and all(row.extra == {} for row in result.worst_rows)
    assert all(tokens.extra == {} for tokens in result.worst_row_tokens)
    assert [column.header for column in worst_rows_table(result).columns] == STANDARD_HEADERS
    assert "extra column" not in worst_rows_table(result).title
    assert all(row["extra"] == {} for row in result.to_json()["worst_rows"])


# ------------------------------------------------------------------------------------- reading
def table_with_extras(rows: list[dict], extras: dict[str, pa.Array], token_layout: bool = False) -> pa.Table:
    table = token_table(rows) if token_layout else sequence_table(rows)
    for name, values in extras.items():
        table = table.append_column(name, values)
    return table


def test_skipped_rows_leave_every_other_row_its_own_extras(tmp_path: Path) -> None:
    """Rows dropped while decoding (ragged lists) and while validating (NaN, positive logprobs) must take their
    extras with them; a null reward (a list, not an array, inside the reader) stays None."""
    rows = random_rows(1, steps=(0,), rows_per_step=8)
    rows[1]["trainer"] = [*rows[1]["trainer"][:-1], float("nan")]  # invalid: skipped in validation
    rows[3]["trainer"] = [*rows[3]["trainer"], -0.5]  # ragged: skipped while decoding
    rows[6]["rollout"] = [0.5, *rows[6]["rollout"][1:]]  # positive: skipped in validation
    rewards = [None if index == 5 else index * 1.5 for index in range(8)]
    tags = [f"tag-{row['sample_id']}" for row in rows]
    path = write_table(
        tmp_path / "skips.parquet",
        table_with_extras(rows, {"reward": pa.array(rewards, pa.float64()), "tag": pa.array(tags)}),
        row_group_size=3,
    )
    for chunk_tokens in (1, 10, 1 << 20):
        result = rd.analyze(str(path), device="cpu", top_k=8, chunk_tokens=chunk_tokens)
        assert result.skipped_rows == 3
        extras = by_row(result)
        assert sorted(extras) == [(0, f"s0-{index}") for index in (0, 2, 4, 5, 7)]
        for (_, sample_id), extra in extras.items():
            index = int(sample_id.rsplit("-", 1)[1])
            assert extra == {"reward": rewards[index], "tag": f"tag-{sample_id}"}


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**16),
    chunk_tokens=st.integers(1, 200),
    row_group_size=st.integers(1, 40),
    token_layout=st.booleans(),
)
def test_any_chunking_and_layout_keeps_each_rows_extras(
    tmp_path_factory: pytest.TempPathFactory, seed: int, chunk_tokens: int, row_group_size: int, token_layout: bool
) -> None:
    rows = random_rows(seed, steps=(0, 1), rows_per_step=5)
    rng = np.random.default_rng(seed)
    score = {(row["step"], row["sample_id"]): float(rng.normal()) if rng.random() > 0.2 else None for row in rows}
    table = token_table(rows) if token_layout else sequence_table(rows)
    keys = list(zip(table.column("step").to_pylist(), table.column("sample_id").to_pylist(), strict=True))
    table = table.append_column("score", pa.array([score[key] for key in keys], pa.float64()))
    table = table.append_column("label", pa.array([f"{step}/{sample_id}" for step, sample_id in keys]))
    path = write_table(tmp_path_factory.mktemp("any") / "dump.parquet", table, row_group_size=row_group_size)
    result = rd.analyze(str(path), device="cpu", top_k=len(rows), chunk_tokens=chunk_tokens)
    extras = by_row(result)
    assert len(extras) == len(rows)
    for (step, sample_id), extra in extras.items():
        assert extra == {"score": score[(step, sample_id)], "label": f"{step}/{sample_id}"}


def test_token_layout_takes_each_rows_first_token_in_file_order(tmp_path: Path) -> None:
    rows = random_rows(2, steps=(0, 1), rows_per_step=3, min_length=3)
    table = token_table(rows, shuffle_seed=5)  # positions shuffled within each row: file order ≠ position order
    per_token = np.arange(table.num_rows, dtype=np.float64) / 4  # differs on every token
    table = table.append_column("entropy", pa.array(per_token)).append_column(
        "reward", pa.array([int(step) * 100 for step in table.column("step").to_pylist()])
    )
    path = write_table(tmp_path / "tokens.parquet", table, row_group_size=5)  # groups cut sequences
    results = [rd.analyze(str(path), device="cpu", top_k=6, chunk_tokens=size) for size in (2, 1 << 20)]
    assert results[0].worst_rows == results[1].worst_rows
    assert len(by_row(results[0])) == 6
    for row in results[0].worst_rows:
        assert row.extra == {"entropy": row.row / 4, "reward": row.step * 100}  # row.row: the first token's


def test_token_layout_rows_dropped_for_duplicate_positions_take_their_extras(tmp_path: Path) -> None:
    rows = random_rows(3, steps=(0,), rows_per_step=4, min_length=2)
    table = token_table(rows)
    positions = table.column("position").to_pylist()
    sample_ids = table.column("sample_id").to_pylist()
    first_of_s1 = sample_ids.index("s0-1")
    positions[first_of_s1 + 1] = positions[first_of_s1]  # s0-1 has a duplicate position: skipped
    table = table.set_column(table.schema.get_field_index("position"), "position", pa.array(positions, pa.int64()))
    table = table.append_column("tag", pa.array([f"t-{sample_id}" for sample_id in sample_ids]))
    result = rd.analyze(str(write_table(tmp_path / "dup.parquet", table)), device="cpu", top_k=4)
    assert result.skipped_rows == 1
    assert {key: extra["tag"] for key, extra in by_row(result).items()} == {
        (0, sample_id): f"t-{sample_id}" for sample_id in ("s0-0", "s0-2", "s0-3")
    }


def test_only_scalar_numbers_bools_and_strings_are_extras_and_roles_are_not(tmp_path: Path) -> None:
    rows = random_rows(4, steps=(0,), rows_per_step=3)
    count = len(rows)
    table = table_with_extras(
        rows,
        {
            "uid": pa.array([f"prompt-{index // 2}" for index in range(count)]),  # a sample_id candidate
            "__index_level_0__": pa.array(range(count)),  # pandas' index: not data
            "advantages": pa.array([[0.5] * 2] * count, pa.list_(pa.float64())),  # a list: per token, not per row
            "created": pa.array([0] * count, pa.timestamp("s")),  # another scalar type: not carried
            "weights_version": pa.array([7] * count, pa.int32()),
            "correct": pa.array([True, False, None]),
            "source": pa.array(["gsm8k", "math", "gsm8k"]).dictionary_encode(),  # polars' Categorical
        },
    )
    path = write_table(tmp_path / "kinds.parquet", table)
    result = rd.analyze(
        str(path), device="cpu", top_k=3, columns={"sample_id": "uid", "policy_version": "weights_version"}
    )
    assert result.columns["sample_id"] == "uid" and result.columns["policy_version"] == "weights_version"
    extras = {row.row: row.extra for row in result.worst_rows}
    # sample_id is now a column no role takes, so an extra; policy_version shows once, under its column's name
    assert extras == {
        index: {
            "weights_version": 7,
            "sample_id": rows[index]["sample_id"],
            "correct": [True, False, None][index],
            "source": ["gsm8k", "math", "gsm8k"][index],
        }
        for index in range(count)
    }


def test_string_extras_that_are_not_utf8_are_shown_not_fatal(tmp_path: Path) -> None:
    rows = random_rows(5, steps=(0,), rows_per_step=2)
    broken = pa.array([b"ok", b"bad \xff byte"], pa.binary()).view(pa.string())
    path = write_table(tmp_path / "bytes.parquet", table_with_extras(rows, {"note": broken}))
    result = rd.analyze(str(path), device="cpu", top_k=2)
    assert sorted(row.extra["note"] for row in result.worst_rows[:2]) == ["bad \ufffd byte", "ok"]


def test_more_extra_columns_than_the_cap_are_cut_with_one_warning(tmp_path: Path) -> None:
    rows = random_rows(6, steps=(0,), rows_per_step=2)
    names = [f"meta_{index:02d}" for index in range(MAX_EXTRA_COLUMNS + 4)]
    table = table_with_extras(rows, {name: pa.array([index] * len(rows)) for index, name in enumerate(names)})
    files = [write_table(tmp_path / f"part-{part}.parquet", table) for part in range(2)]
    result = rd.analyze([str(f) for f in files], device="cpu", top_k=2)
    assert all(list(row.extra) == names[:MAX_EXTRA_COLUMNS] for row in result.worst_rows)
    assert result.worst_rows[0].extra["meta_15"] == 15
    cap = [warning for warning in result.warnings if "extra columns" in warning]
    assert len(cap) == 1, result.warnings  # one line for both files, not one per file
    assert "the first 16 in file order and leave out meta_16, meta_17, meta_18, meta_19." in cap[0]
    assert str(files[0]) in cap[0] and str(files[1]) in cap[0]
    assert DumpReader(str(files[0])).files[0].extras_left_out == tuple(names[MAX_EXTRA_COLUMNS:])


def test_long_text_columns_are_not_carried_and_long_labels_are_cut_in_the_table(tmp_path: Path) -> None:
    rows = random_rows(9, steps=(0,), rows_per_step=4)
    prompts = [f"prompt {index}: " + "lorem ipsum " * 100 for index in range(4)]  # ~1.2 kB a row
    labels = [f"label-{index}-" + "x" * 60 for index in range(4)]  # 68 characters: a label, if a long one
    extras = {"prompt": pa.array(prompts), "label": pa.array(labels), "reward": pa.array([1.0, 2.0, 3.0, 4.0])}
    path = write_table(tmp_path / "text.parquet", table_with_extras(rows, extras))
    result = rd.analyze(str(path), device="cpu", top_k=4)
    assert all(list(row.extra) == ["label", "reward"] for row in result.worst_rows)
    assert {row.extra["label"] for row in result.worst_rows} == set(labels)  # whole in the result
    (warning,) = [w for w in result.warnings if "prompt" in w]
    assert re.search(
        r"text columns prompt \(~[\d,]+ bytes a row\) are longer than a per-row label \(256 bytes\)", warning
    )
    text = " ".join(rendered(worst_rows_table(result)).split())
    assert "long extra text cut, whole in --format json" in text
    assert "label-0-" + "x" * 31 + "…" in text and "x" * 33 not in text  # 40 characters with the "…"


# ------------------------------------------------------------------------------------- JSON
def test_json_round_trip_and_schema_with_extras(tmp_path: Path, analysed: rd.AnalysisResult) -> None:
    rows = random_rows(7, steps=(0,), rows_per_step=3)
    odd = {"reward": pa.array([math.nan, math.inf, -2.5]), "flag": pa.array([True, None, False])}
    result = rd.analyze(str(write_table(tmp_path / "odd.parquet", table_with_extras(rows, odd))), device="cpu")
    assert {row.sample_id: row.extra["reward"] for row in result.worst_rows} == {
        "s0-0": None,
        "s0-1": None,
        "s0-2": -2.5,
    }
    schema = json.loads(SCHEMA.read_text())
    for source in (result, analysed):
        document = json.loads(json.dumps(source.to_json(), allow_nan=False))
        jsonschema.validate(document, schema)
        back = result_from_json(document)
        assert back.worst_rows == source.worst_rows
        assert back.worst_row_tokens == source.worst_row_tokens
    broken = json.loads(json.dumps(analysed.to_json()))
    broken["worst_rows"][0]["extra"]["tag"] = ["a list"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)


def test_to_json_writes_a_hand_made_non_finite_extra_as_null(analysed: rd.AnalysisResult) -> None:
    row = dataclasses.replace(analysed.worst_rows[0], extra={"reward": math.nan, "kl": -math.inf, "n": 3})
    result = dataclasses.replace(analysed, worst_rows=[row])
    assert result.to_json()["worst_rows"][0]["extra"] == {"reward": None, "kl": None, "n": 3}


# ------------------------------------------------------------------------------------- terminal, report, inspect
def run(*args: object, width: int = 120) -> str:
    result = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.parametrize("width", [80, 120, 200])
def test_terminal_table_shows_the_first_extras_and_fits(written: Path, analysed: rd.AnalysisResult, width: int) -> None:
    output = run("analyze", written, "--device", "cpu", width=width)
    assert "…" not in output and max(len(line) for line in output.splitlines()) <= width
    table = output[output.index("Worst rows by") : output.index("Worst tokens by")]
    for header in ("policy_version", "advantage", "reward", "tag"):
        assert header in table
    assert "more extra column" not in table  # exactly EXTRAS_SHOWN of them
    worst = next(row for row in analysed.worst_rows if row.criterion == "log_ppl_abs_diff")
    assert number(worst.extra["advantage"]) in table and str(worst.extra["reward"]) in table
    assert "<script>alert(" in table  # a tag, as text (long ones fold)


def test_terminal_table_counts_the_extras_it_leaves_out_and_shows_names_as_text(tmp_path: Path) -> None:
    rows = random_rows(8, steps=(0,), rows_per_step=2)
    names = ["[bold]b[/bold]", "\x1b[2Jc", *(f"m{index}" for index in range(EXTRAS_SHOWN))]
    path = write_table(tmp_path / "many.parquet", table_with_extras(rows, {n: pa.array([1, 2]) for n in names}))
    text = rendered(worst_rows_table(rd.analyze(str(path), device="cpu")))
    assert "[bold]b[/bold]" in text and "\\x1b[2Jc" in text and "\x1b" not in text
    assert "2 more extra columns in --format json" in " ".join(text.split())  # the title may wrap
    assert "m0" in text and "m1" in text and "m2" not in text


def test_html_report_shows_extras_escaped(analysed: rd.AnalysisResult) -> None:
    html = render_report(analysed)
    section = html[html.index('id="worst"') :]
    assert "&lt;script&gt;alert(24)&lt;/script&gt;" in section
    assert "<script>alert(24)" not in html
    for header in ("policy_version", "advantage", "reward", "tag"):
        assert f">{header}</th>" in section
    assert re.search(r"<td[^>]*>2\.594</td>", section)  # advantage 2.59375, 4 significant digits
    headings = re.findall(r'<h4 class="strip-title">(.*?)</h4>', section)
    assert headings and all(
        re.search(r" · policy_version -?\d · advantage [-\d.]+ · reward \d+ · tag &lt;script&gt;alert\(\d+\)", h)
        for h in headings
    ), headings


def test_inspect_row_shows_the_rows_extras(written: Path) -> None:
    file = written / "step=2" / "rank-0.parquet"
    output = run("inspect", written, "--device", "cpu", "--row", f"{file}:4")
    assert "policy_version = 1, advantage = 2.594, reward = 42, tag = <script>alert(24)</script>" in output
    document = json.loads(run("inspect", written, "--device", "cpu", "--row", f"{file}:4", "-f", "json"))
    assert document["extra"] == expected_extra(2, 4)
    assert rd.inspect_row(str(written), "s4", step=2, device="cpu").extra == expected_extra(2, 4)


# ------------------------------------------------------------------------------------- convert keeps them
def test_convert_writes_every_extra_column_and_policy_version_on_its_row(written: Path, tmp_path: Path) -> None:
    """``convert`` must not drop the per-row columns: after a round trip each row holds its own values, read back
    through analyze's worst rows (which look them up by step and sample id)."""
    from rollout_diag.io.convert import convert

    out = tmp_path / "converted.parquet"
    result = convert(str(written), out)
    names = pq.read_schema(out).names
    assert names[-4:] == ["policy_version", "advantage", "reward", "tag"], names
    again = rd.analyze(str(out), device="cpu", top_k=ROWS * STEPS)
    for (step, sample_id), extra in by_row(again).items():
        assert extra == expected_extra(step, int(sample_id[1:])), (step, sample_id)
    assert not result.warnings


def test_convert_writes_extras_beyond_what_analyze_shows_and_nulls_where_a_file_has_none(tmp_path: Path) -> None:
    """20 extra columns in one file (analyze carries 16 and warns), none in a second: all 20 are written, the
    second file's rows get nulls, and convert does not repeat analyze's warning about the 4 it leaves out."""
    from rollout_diag.io.convert import convert

    rows = random_rows(seed=3, steps=(0,), rows_per_step=3)
    extras = {f"x{index:02d}": pa.array([index * 100 + row for row in range(3)]) for index in range(20)}
    write_table(tmp_path / "in" / "a.parquet", table_with_extras(rows, extras))
    later = random_rows(seed=4, steps=(1,), rows_per_step=2)
    write_table(tmp_path / "in" / "b.parquet", sequence_table(later))
    assert any("more than" in w for w in DumpReader([str(tmp_path / "in")], None).log.warnings)
    result = convert(str(tmp_path / "in"), tmp_path / "out.parquet")
    table = pq.read_table(tmp_path / "out.parquet")
    assert [name for name in table.column_names if name.startswith("x")] == list(extras)
    assert table.column("x19").to_pylist() == [1900, 1901, 1902, None, None]
    assert table.column("x00").type == pa.int64()
    assert result.warnings == []


def test_convert_says_which_column_it_cannot_write_under_a_canonical_name(tmp_path: Path) -> None:
    """With ``step`` taken from another column (-c step=iteration), a scalar column named 'step' is an extra whose
    name the canonical layout gives the step role: convert leaves it out and says so, and writes the rest."""
    from rollout_diag.io.convert import convert

    rows = random_rows(seed=5, steps=(2,), rows_per_step=2)
    table = sequence_table(rows).rename_columns(
        ["iteration" if n == "step" else n for n in sequence_table(rows).column_names]
    )
    table = table.append_column("step", pa.array([7, 7])).append_column("reward", pa.array([0.5, 1.0]))
    write_table(tmp_path / "in.parquet", table)
    result = convert(str(tmp_path / "in.parquet"), tmp_path / "out.parquet", columns={"step": "iteration"})
    written_table = pq.read_table(tmp_path / "out.parquet")
    assert written_table.column("step").to_pylist() == [2, 2]  # the step role, not the extra column
    assert written_table.column("reward").to_pylist() == [0.5, 1.0]
    assert len(result.warnings) == 1 and "column 'step' is not written" in result.warnings[0], result.warnings
