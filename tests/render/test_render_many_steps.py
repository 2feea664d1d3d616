"""The terminal tables and the report on many steps (issue 20 item 3: 200 000 one-row steps): the per-step table made
from a StepTable's columns (``Nums`` blocks, numbers formatted a column at a time, rows written a block at a time),
the report's series read from the columns, min-max decimation by numpy. Each is checked against the plain row-by-row
reading it replaces (a reference written here), and neither builds a StepResult per step."""

from __future__ import annotations

import dataclasses
import io
import math
import re

import numpy as np
import pytest
from helpers.dumps import write_sequence_dump
from helpers.steps import tiny_rows
from hypothesis import example, given, settings
from hypothesis import strategies as st
from rich.console import Console

import rollout_diag as rd
from rollout_diag.catalogue import short_name
from rollout_diag.formatting import numbers
from rollout_diag.render import cells as cells_module
from rollout_diag.render.analysis import STEP_METRICS, STEPS_SHOWN_EACH_END, render_analysis, steps_table
from rollout_diag.render.format import level
from rollout_diag.render.table import Column, FitTable, Num, Nums
from rollout_diag.report import render_report
from rollout_diag.report.series import bucket_bounds, decimate, step_series
from rollout_diag.results import MetricColumns, StepResult, StepTable
from rollout_diag.results.wording import HEADLINE, worst_step

_FLOATS = (
    st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([0.0, -0.0, 0.01, 0.00999999, 9999.49, 9999.5, 9999.99, 1e4, 1e15, -1e15, 12.0, 1e-300])
    | st.floats(-1e5, 1e5)
)


def _written(renderable: object, width: int = 120, colour: bool = False) -> str:
    sink = io.StringIO()
    Console(
        file=sink, width=width, force_terminal=colour, color_system="truecolor" if colour else None, soft_wrap=False
    ).print(renderable)
    return sink.getvalue()


# ----------------------------------------------------------------------------------------- number columns
@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(_FLOATS, st.booleans()), max_size=60),
    st.integers(1, 6),
    st.sampled_from(["", " raw"]),
    st.lists(st.none() | st.integers(-(10**6), 10**6) | _FLOATS, max_size=5),
)
def test_a_number_column_is_written_as_numbers_writes_it(
    cells: list[tuple[float, bool]], digits: int, suffix: str, singles: list
) -> None:
    """A float64 Nums block (absent cells a dash) beside Num cells: one notation over all of them, each value as
    ``formatting.numbers`` writes the column."""
    values = np.array([value for value, _ in cells], dtype=np.float64)
    present = np.array([there for _, there in cells], dtype=bool)
    chunks = [[Num(value, suffix, digits) for value in singles], Nums(values, present, suffix, digits)]
    expected = numbers([*singles, *(value if there else None for value, there in cells)], digits)
    assert cells_module.column_cells(chunks) == [text + suffix for text in expected]
    # the same values as a list, and integer arrays
    listed = Nums([value if there else None for value, there in cells], None, suffix, digits)
    assert cells_module.column_cells([listed]) == [text + suffix for text in numbers(listed.values, digits)]  # type: ignore[arg-type]
    integers = np.array([int(value) for value, _ in cells if abs(value) < 2**62], dtype=np.int64)
    assert cells_module.column_cells([Nums(integers)]) == numbers(integers.tolist())


def test_add_rows_adds_what_add_row_adds() -> None:
    """Rows given column by column (a Nums block among them) render as the same rows given one by one: whole, split
    into parts, coloured or not, on rich's layout and the line writer's."""
    count = 150
    verdicts = [level(["ok", "watch", "bad", "n/a"][index % 4]) for index in range(count)]
    values = np.array([1.0 / (index + 3) if index % 9 else math.nan for index in range(count)])
    columns = [Column("step", key=True), Column("tokens"), Column("k3_kl"), Column("note", "left"), Column("verdict")]
    by_row, by_column = FitTable("t", columns), FitTable("t", columns)
    by_row.add_row("⋮", "", "", "", "")
    by_column.add_row("⋮", "", "", "", "")
    for index in range(count):
        by_row.add_row(str(index), Num(index * 1000), Num(values[index]), f"n{index % 11}", verdicts[index])
    by_column.add_rows(
        [str(index) for index in range(count)],
        Nums(np.arange(count) * 1000),
        Nums(values, ~np.isnan(values)),
        [f"n{index % 11}" for index in range(count)],
        verdicts,
    )
    for width in (40, 80, 200):
        for colour in (False, True):
            assert _written(by_column, width, colour) == _written(by_row, width, colour)
    with pytest.raises(ValueError):
        by_column.add_rows([], [])


# ----------------------------------------------------------------------------------------- the per-step table
def _reference_steps_table(steps: list[StepResult], all_steps: bool, levels: list[dict]) -> FitTable:
    """The per-step table as it was written row by row (a Num per cell, each step's dict read)."""
    if all_steps or len(steps) <= 3 * STEPS_SHOWN_EACH_END:
        shown, title = list(steps), "Per step"
    else:
        ranked = sorted((s for s in steps if HEADLINE in s.metrics), key=lambda s: s.metrics[HEADLINE], reverse=True)
        chosen = {s.step for s in [*steps[:STEPS_SHOWN_EACH_END], *steps[-STEPS_SHOWN_EACH_END:]]}
        chosen |= {s.step for s in ranked[:STEPS_SHOWN_EACH_END]}
        shown = [s for s in steps if s.step in chosen]
        title = (
            f"Per step: first {STEPS_SHOWN_EACH_END}, last {STEPS_SHOWN_EACH_END} and worst "
            f"{STEPS_SHOWN_EACH_END} by k3_kl of {len(steps)} (--all-steps for every step)"
        )
    scored = [s for s in steps if s.step is not None and s.metrics.get(HEADLINE) is not None]
    scored = [s for s in scored if math.isfinite(s.metrics[HEADLINE])]
    worst = max(scored, key=lambda s: s.metrics[HEADLINE]) if scored else None
    columns = [Column("step", key=True), Column("rows"), Column("tokens")]
    columns += [Column(short_name(name)) for name in STEP_METRICS]
    table = FitTable(title, [*columns, Column("verdict", "left")])
    position = {id(s): index for index, s in enumerate(steps)}
    step_level = {entry["step"]: entry["level"] for entry in levels}
    previous = None
    for step in shown:
        if previous is not None and position[id(step)] != position[id(previous)] + 1:
            table.add_row("⋮", *[""] * len(columns))
        verdict = level(step_level.get(step.step, "n/a"))
        if worst is not None and step.step == worst.step:
            verdict.append(" ◀ worst")
        table.add_row(
            str(step.step), Num(step.rows), Num(step.tokens), *(Num(step.metrics.get(k)) for k in STEP_METRICS), verdict
        )
        previous = step
    return table


@st.composite
def _step_tables(draw) -> StepTable:
    count = draw(st.integers(1, 90))
    ids = np.array(sorted(draw(st.lists(st.integers(-3, 10**9), min_size=count, max_size=count, unique=True))))
    groups = []
    for names in (list(STEP_METRICS[:4]), list(STEP_METRICS[3:])):
        present = np.array(draw(st.lists(st.booleans(), min_size=count, max_size=count)), dtype=bool)
        values: dict[str, np.ndarray] = {}
        for name in names:
            if draw(st.integers(0, 5)):
                column = st.lists(_FLOATS | st.floats(0, 1), min_size=count, max_size=count)
                values[name] = np.array(draw(column), dtype=np.float64)
            else:  # values kept as the family gave them: read step by step
                items = draw(st.lists(st.integers(-5, 5), min_size=count, max_size=count))
                values[name] = np.empty(count, dtype=object)
                values[name][:] = items
        groups.append((present, values))
    counts = [np.array(draw(st.lists(st.integers(0, 10**7), min_size=count, max_size=count))) for _ in range(3)]
    return StepTable(ids.astype(np.int64), *counts, MetricColumns(groups, count))


@settings(max_examples=120, deadline=None)
@given(_step_tables(), st.booleans(), st.integers(0, 3))
def test_the_steps_table_from_columns_is_the_table_row_by_row(table: StepTable, all_steps: bool, seed: int) -> None:
    """First, last and worst steps (gaps marked), every step with --all-steps, a value absent, NaN, ±inf, kept as an
    object: the same text as the row-by-row table, whether read from the columns or from a list of the steps."""
    kinds = ["ok", "watch", "bad"]
    levels = [{"step": step, "level": kinds[(step + seed) % 3]} for step in table.step_ids.tolist()[::2]]
    written = _written(steps_table(table, all_steps, levels), colour=seed % 2 == 0)
    if table.float_column(HEADLINE) is not None:  # (the worst of values kept as objects is found step by step)
        assert table._built is None  # nothing per step was built
    steps = list(table)
    expected = _written(_reference_steps_table(steps, all_steps, levels), colour=seed % 2 == 0)
    assert written == expected
    assert _written(steps_table(steps, all_steps, levels), colour=seed % 2 == 0) == expected
    found = worst_step(StepTable(table.step_ids, table.rows, table.tokens, table.empty_rows, table.metrics))
    by_step = worst_step(steps)
    assert (found and found.step) == (by_step and by_step.step)


# ----------------------------------------------------------------------------------------- decimation
def _reference_decimate(ids: list, values: list, keep: set, max_points: int) -> tuple[list, list]:
    """Min-max decimation value by value, as it was written."""
    if len(ids) <= max_points:
        return list(ids), list(values)
    chosen = {0, len(ids) - 1} | {index for index, step in enumerate(ids) if step in keep}
    for start, end in bucket_bounds(len(ids), max_points // 2):
        present = [index for index in range(start, end) if values[index] is not None]
        if present:
            chosen.add(min(present, key=lambda index: values[index]))
            chosen.add(max(present, key=lambda index: values[index]))
    order = sorted(chosen)
    return [ids[index] for index in order], [values[index] for index in order]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.none() | st.sampled_from([0.0, -0.0, 1.0, math.inf, -math.inf]) | st.floats(-3, 3), max_size=80),
    st.integers(2, 30),
    st.sets(st.integers(0, 80), max_size=4),
)
@example([None, None, None, math.inf, None, None, None, None, None], 8, set())  # a gap before +inf (nanargmin)
@example([1.0, None, None, -math.inf, None, None, None, None, None], 8, set())  # a gap before -inf (nanargmax)
def test_decimation_keeps_the_points_it_kept_value_by_value(values: list, max_points: int, keep: set) -> None:
    """Ties (the first smallest and largest stay), ±0.0, infinities, gaps, runs without a value: the same points."""
    ids = list(range(len(values)))
    got = decimate(ids, values, keep, max_points)
    expected = _reference_decimate(ids, values, keep, max_points)
    assert got[0] == expected[0]
    assert [repr(value) for value in got[1]] == [repr(value) for value in expected[1]]  # -0.0 stays -0.0


def test_decimation_of_values_that_are_not_floats_reads_them_one_by_one() -> None:
    values = [3, None, 1, 2, math.nan, 5, 4, 0, 7, 6]
    assert decimate(list(range(10)), values, (), 4) == _reference_decimate(list(range(10)), values, set(), 4)


# ----------------------------------------------------------------------------------------- whole outputs
@pytest.fixture(scope="module")
def many_steps(tmp_path_factory) -> rd.AnalysisResult:
    """2 300 one-row steps: beyond the report's 2 000 points per line, so its series are decimated."""
    folder = tmp_path_factory.mktemp("render_many_steps")
    path = write_sequence_dump(folder / "steps.parquet", tiny_rows(2300), row_group_size=512)
    return rd.analyze(str(path), device="cpu")


def _unstamped(html: str) -> str:
    return re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", "", html)


def test_rendering_many_steps_builds_no_step(many_steps: rd.AnalysisResult) -> None:
    """`analyze`, `--all-steps` and the report read the step columns: no StepResult per step is made (200 000 steps
    made them 0.3 GB and seconds), and the text is the text of the same steps as a list."""
    result = many_steps
    assert isinstance(result.steps, StepTable)
    table = _written(render_analysis(result, all_steps=True))
    plain = _written(render_analysis(result))
    html = _unstamped(render_report(result))
    assert result.steps._built is None
    assert table.count("\n") > 2300 and "◀ worst" in table and "◀ worst" in plain
    listed = dataclasses.replace(result, steps=list(result.steps), positions=list(result.positions))
    assert _written(render_analysis(listed, all_steps=True)) == table
    assert _written(render_analysis(listed)) == plain
    assert _unstamped(render_report(listed)) == html


def test_step_series_from_the_column_is_read_step_by_step(many_steps: rd.AnalysisResult) -> None:
    steps = many_steps.steps
    for name in (HEADLINE, *STEP_METRICS, "no/such_metric"):
        assert step_series(steps, name) == step_series(list(steps), name)
    assert steps._built is not None  # list(steps) built them, once


def test_a_thinned_out_line_says_so_on_its_plot(many_steps: rd.AnalysisResult) -> None:
    """Beyond 2 000 steps the trend lines are decimated: the figure says how, above its panels; with fewer steps
    every step is drawn and nothing is said."""
    from rollout_diag.report.sections import Canvas, trends_section

    canvas = Canvas()
    trends_section(many_steps, canvas, {})
    notes = [note["text"] for note in canvas.figures["trends"]["layout"]["annotations"] if "thinned" in note["text"]]
    assert notes == [
        "2,300 steps, thinned out: each line keeps the smallest and largest value of each of 1,000 runs of ~2 "
        "consecutive steps, the first and last step and every anomaly"
    ]
    few = dataclasses.replace(many_steps, steps=list(many_steps.steps)[:1500])
    canvas = Canvas()
    trends_section(few, canvas, {})
    assert not [note for note in canvas.figures["trends"]["layout"]["annotations"] if "thinned" in note["text"]]
