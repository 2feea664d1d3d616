"""200 000 one-row steps within 30 s and 1.5 GB (issue 20, item 3): blocks cut at MAX_BLOCK_STEPS steps, check's
gate values read from the step columns and its long table written line by line, the sweep's per-step JSON written
from its columns. Each fast way gives what the plain way gives, to the byte."""

from __future__ import annotations

import io
import math
from dataclasses import replace

import numpy as np
import pytest
from helpers.dumps import write_sequence_dump
from helpers.steps import SAMPLE, tiny_rows
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import rollout_diag as rd
from rollout_diag.decisions.check import DEFAULT_GATES, FAIL, CheckResult, Gate, GateOutcome, check
from rollout_diag.drivers import rowpass
from rollout_diag.drivers.sweep import threshold_sweep
from rollout_diag.io import reader as reader_module
from rollout_diag.io.decode import MAX_BLOCK_STEPS, Block, split_steps
from rollout_diag.io.reader import DumpReader
from rollout_diag.render.decisions import _excess, check_table
from rollout_diag.render.export import json_pieces, to_json_text
from rollout_diag.render.format import number
from rollout_diag.results import SkippedRow, SweepResult


@pytest.fixture(scope="module")
def many(tmp_path_factory) -> str:
    """More one-row steps than a block holds, in one row group."""
    folder = tmp_path_factory.mktemp("many")
    steps = MAX_BLOCK_STEPS + 904
    return str(write_sequence_dump(folder / "many.parquet", tiny_rows(steps), row_group_size=steps))


# ----------------------------------------------------------------------------------------- blocks of steps
def _block(steps: list[int], lengths: list[int]) -> Block:
    tokens = sum(lengths)
    return Block(
        file="f.parquet",
        file_row=np.arange(10, 10 + 2 * len(steps), 2, dtype=np.int64),  # every other file row (rows skipped between)
        step=np.asarray(steps, dtype=np.int64),
        sample_id=[f"s{i}" for i in range(len(steps))],
        lengths=np.asarray(lengths, dtype=np.int64),
        trainer=-np.arange(tokens, dtype=np.float64),
        rollout=-np.arange(tokens, dtype=np.float64) / 2,
        mask=np.ones(tokens, dtype=np.int8),
        token_ids=np.arange(tokens, dtype=np.int64),
        policy_version=np.arange(len(steps), dtype=np.int64),
        extra={"env": np.array([f"e{i}" for i in range(len(steps))], dtype=object)},
        skipped=[SkippedRow("f.parquet", row, "x", "null list") for row in (9, 13, 17, 23)],
    )


def test_a_block_is_cut_at_changes_of_step_into_pieces_of_at_most_max_steps() -> None:
    block = _block([0, 0, 1, 2, 2, 3, 4, 4], [1, 2, 3, 1, 1, 2, 2, 1])
    pieces = split_steps(block, max_steps=2)
    assert [piece.step.tolist() for piece in pieces] == [[0, 0, 1], [2, 2, 3], [4, 4]]
    assert [piece.lengths.tolist() for piece in pieces] == [[1, 2, 3], [1, 1, 2], [2, 1]]
    for name in ("trainer", "rollout", "mask", "token_ids"):
        assert np.array_equal(np.concatenate([getattr(piece, name) for piece in pieces]), getattr(block, name))
    for name in ("file_row", "policy_version"):
        assert np.array_equal(np.concatenate([getattr(piece, name) for piece in pieces]), getattr(block, name))
    assert [s for piece in pieces for s in piece.sample_id] == block.sample_id
    assert [list(piece.extra["env"]) for piece in pieces] == [["e0", "e1", "e2"], ["e3", "e4", "e5"], ["e6", "e7"]]
    # the file rows of the pieces start at 10, 16 and 22: a skip record goes with the piece around its row
    assert [[skip.row for skip in piece.skipped] for piece in pieces] == [[9, 13], [17], [23]]
    assert split_steps(block, max_steps=5) == [block]


def test_a_chunk_holds_at_most_max_block_steps_steps(many: str) -> None:
    reader = DumpReader([many])
    sizes = [len(chunk.groups.steps) for chunk, _ in reader.chunks("cpu", prefetch=0)]
    assert sum(sizes) == MAX_BLOCK_STEPS + 904
    assert max(sizes) <= MAX_BLOCK_STEPS  # was one chunk of every step of the row group


def test_cutting_blocks_changes_no_digit(many: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cut = to_json_text(rd.analyze(many, device="cpu").to_json())
    monkeypatch.setattr(reader_module, "split_steps", lambda block: [block])
    whole = to_json_text(rd.analyze(many, device="cpu").to_json())
    assert cut == whole


# ----------------------------------------------------------------------------------------- check
def _same(a: GateOutcome, b: GateOutcome) -> bool:
    nan = a.value is not None and b.value is not None and math.isnan(a.value) and math.isnan(b.value)
    return (a.gate, a.step, a.status, a.group) == (b.gate, b.step, b.status, b.group) and (
        nan or (a.value, a.excess) == (b.value, b.excess)
    )


def test_gate_values_from_the_step_columns_are_metric_values_per_step(tmp_path) -> None:
    path = write_sequence_dump(tmp_path / "steps.parquet", tiny_rows(300), row_group_size=64)
    done = rowpass.row_pass(str(path), device="cpu")
    result, rows = done.result(), done.row_stats()
    framework, columns = next(iter(result.steps.dialects.items()))
    dialect_name = next(name for present, values in columns.groups if present.any() for name in values)
    gates = [
        *DEFAULT_GATES,
        Gate(dialect_name, "max", 0.0),
        Gate(f"{framework}:{dialect_name}", "min", 1.0),
        Gate("per_round/round_1/k3_kl", "max", 1e-3),  # a metric only odd steps report
        Gate("training/rollout_actor_probs_pearson_corr", "min", 0.999),
    ]
    listed = replace(result, steps=list(result.steps))  # the same steps as StepResults: metric_values' dicts
    for with_rows in (rows, None):
        # without the rows' sums, token_mult_prob_error is no metric of the result (an error on either way)
        chosen = gates if with_rows is not None else [g for g in gates if g.metric != "token_mult_prob_error"]
        fast = check(result, chosen, per_step=True, rows=with_rows)
        plain = check(listed, chosen, per_step=True, rows=with_rows)
        assert len(fast.outcomes) == len(plain.outcomes) > 300 * len(chosen)
        assert all(_same(a, b) for a, b in zip(fast.outcomes, plain.outcomes, strict=True))
        assert {o.status for o in fast.outcomes} >= {"pass", "fail", "skipped"}


def _rich_check_table(result: CheckResult) -> Table:
    """The table as a plain rich Table (how check_table wrote it before it wrote long tables line by line)."""
    table = Table(title="Failed gates", title_justify="left")
    for header, justify in (("metric", "left"), ("where", "left"), ("value", "right"), ("limit", "right")):
        table.add_column(header, justify=justify, no_wrap=header == "metric")  # type: ignore[arg-type]
    table.add_column("past the limit by", justify="right")
    for outcome in result.failures:
        gate = outcome.gate
        limit = f"{'≤' if gate.bound == 'max' else '≥'} {number(gate.limit, 4)}"
        last = "NaN" if outcome.excess is None else _excess(outcome.excess, gate.limit)
        place = "run" if outcome.step is None else f"step {outcome.step}"
        table.add_row(escape(gate.metric), place, number(outcome.value, 4), limit, last)
    return table


def _written(renderable, width: int, colour: bool) -> str:
    sink = io.StringIO()
    console = Console(file=sink, width=width, force_terminal=colour, color_system="truecolor" if colour else None)
    console.print(renderable)
    return sink.getvalue()


@pytest.mark.parametrize("width", [160, 80, 40])
@pytest.mark.parametrize("colour", [False, True])
def test_a_long_failure_table_is_what_rich_writes(width: int, colour: bool) -> None:
    gates = [Gate("rollout_corr/k3_kl", "max", 5e-4), Gate("a[bold]metric[/bold]_with_markup", "min", 0.5)]
    outcomes = [
        GateOutcome(gate, step, value, FAIL, (value - gate.limit) if gate.bound == "max" else gate.limit - value)
        for step in [None, *range(0, 12_000, 37)]
        for gate, value in zip(gates, (1e-3 * (1 + (step or 0) % 13), 0.25 / (1 + (step or 0) % 5)), strict=True)
    ]
    outcomes.append(GateOutcome(gates[0], 99_999_999, math.nan, FAIL, None))
    result = CheckResult(["x"], gates, outcomes)
    group = check_table(result)
    assert _written(group.renderables[1], width, colour) == _written(_rich_check_table(result), width, colour)


# ----------------------------------------------------------------------------------------- sweep JSON
def test_the_sweep_json_written_from_the_columns_is_the_document(tmp_path) -> None:
    path = write_sequence_dump(tmp_path / "steps.parquet", tiny_rows(500), row_group_size=128)
    result = threshold_sweep(str(path), device="cpu")
    assert "".join(json_pieces(result.json_document())) == to_json_text(result.to_json())
    listed = SweepResult(result.inputs, result.columns, result.targets, result.run, list(result.steps))
    assert "".join(json_pieces(listed.json_document())) == to_json_text(listed.to_json())


def test_the_cli_sets_glibc_to_give_freed_blocks_back() -> None:
    import platform

    from rollout_diag.memory import return_large_blocks

    assert return_large_blocks() is (platform.system() == "Linux" and platform.libc_ver()[0] == "glibc")


def test_the_cli_sets_glibc_to_keep_freed_chunks() -> None:
    import platform

    from rollout_diag.memory import keep_large_blocks

    assert keep_large_blocks() is (platform.system() == "Linux" and platform.libc_ver()[0] == "glibc")


@pytest.mark.parametrize("short", [True, False])
def test_the_cli_picks_the_heap_bounds_by_the_rows(monkeypatch, short) -> None:
    """A command's dump opens with freed blocks given back for many short rows, kept for the next chunk otherwise."""
    from rollout_diag import memory
    from rollout_diag.cli.options import Reading

    called: list[str] = []
    monkeypatch.setattr(memory, "many_short_rows", lambda size: short)
    monkeypatch.setattr(memory, "return_large_blocks", lambda: called.append("return"))
    monkeypatch.setattr(memory, "keep_large_blocks", lambda: called.append("keep"))
    monkeypatch.setattr(memory, "defer_collection", lambda: False)  # the test process keeps its collector
    Reading().open([SAMPLE])
    assert called == ["return" if short else "keep"]


def test_only_many_short_rows_set_the_allocator() -> None:
    """The small fixed mmap bound is for inputs of many short rows (per-step state dominates); long rows, and an
    input whose size the footers do not give, get the large bounds (the small one cost them page faults)."""
    from rollout_diag.memory import MANY_ROWS, SHORT_ROW_TOKENS, many_short_rows

    assert many_short_rows((4 * 200_000, 200_000))  # /work/bench/200k.parquet: one-row steps of 4 tokens
    assert not many_short_rows((100_000_000, 100_000))  # make_synthetic.py --tokens 1e8: rows of ~1000 tokens
    assert not many_short_rows((SHORT_ROW_TOKENS * MANY_ROWS, MANY_ROWS))
    assert many_short_rows((SHORT_ROW_TOKENS * MANY_ROWS - 1, MANY_ROWS))
    assert not many_short_rows((MANY_ROWS - 1, MANY_ROWS - 1))
    assert not many_short_rows(None)
