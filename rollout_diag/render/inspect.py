"""One row, token by token, coloured by |δ|, with environment segments folded."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from rollout_diag.formatting import numbers, token_cell
from rollout_diag.render.format import extra_cell, number, plain
from rollout_diag.results import RowTokens

# |δ| colour bands: the same bands the report uses.
BANDS = ((1.0, "bold white on red"), (0.3, "red"), (0.1, "yellow"), (0.03, "default"), (0.0, "dim"))


def delta_style(abs_delta: float) -> str:
    return next(style for floor, style in BANDS if abs_delta >= floor)


def _largest(row: RowTokens, worst: int | None, windowed: bool) -> str:
    """The largest |δ|: the row's; for a window, the window's and the whole row's (which may lie outside it)."""
    if worst is None and row.row_largest_abs_delta is None:
        return ""
    here = "" if worst is None else f"{number(abs(row.log_ratio[worst]))} at position {row.start + worst}"
    if not windowed or row.row_largest_abs_delta is None:
        return f"; largest |δ| = {here}"
    whole = f"{number(row.row_largest_abs_delta)} at position {row.row_largest_position}"
    return f"; largest |δ| in the window = {here or '– (no model token)'}, in the row = {whole}"


def _first_differing(row: RowTokens) -> str:
    """ "; first bitwise difference at position 40" (or "; every model token bitwise equal") where inspect found it."""
    if row.first_differing_position is None:
        return "; every model token bitwise equal (δ ≡ 0)" if row.row_length is None and _all_equal(row) else ""
    return f"; first bitwise difference at position {row.first_differing_position}"


def _all_equal(row: RowTokens) -> bool:
    """Whether every listed model token has δ exactly 0 and at least one is listed (a whole row: what inspect says)."""
    listed = [d for d, m in zip(row.log_ratio, row.mask, strict=True) if m]
    return bool(listed) and all(d == 0.0 for d in listed)


def render_row(row: RowTokens) -> RenderableType:
    deltas = row.log_ratio
    model = [i for i, m in enumerate(row.mask) if m]
    worst = max(model, key=lambda i: abs(deltas[i]), default=None)
    # A window (inspect --around/--window) lists part of the row: positions count from the row's start, and
    # round numbers are left out, since rounds that began before the window are not known here.
    windowed = row.start > 0 or (row.row_length is not None and row.row_length != len(row.mask))
    extent = (
        f"tokens {row.start}–{row.start + len(row.mask) - 1} of {row.row_length} (showing {len(row.mask)}; "
        "--window / --around / --all for more)"
        if windowed
        else f"{len(row.mask)} tokens"
    )
    header = Text.assemble(
        (f"step {row.step}", "bold"),
        ", sample ",
        plain(row.sample_id, style="bold"),
        " (",
        plain(row.file),
        f" row {row.row}): {extent}, {len(model)} from the model",
        _largest(row, worst, windowed),
        _first_differing(row),
    )
    if row.extra:  # the row's extra dump columns (reward, advantage, …)
        header.append("\n")
        for index, (name, value) in enumerate(row.extra.items()):
            header.append_text(Text.assemble("" if index == 0 else ", ", plain(name), " = ", plain(extra_cell(value))))
    table = Table(title_justify="left", show_edge=False)
    headings = ("pos", "round", "token", "rollout logp", "trainer logp", "δ = trainer − rollout")
    for heading in headings if not windowed else tuple(h for h in headings if h != "round"):
        # numbers never wrap or shorten; a long token folds onto more lines
        table.add_column(
            heading, justify="left" if heading == "token" else "right", overflow="fold", no_wrap=heading != "token"
        )
    # each number column in one notation (formatting.numbers), over the model tokens it lists
    rollout = dict(zip(model, numbers([row.rollout_logprob[i] for i in model]), strict=True))
    trainer = dict(zip(model, numbers([row.trainer_logprob[i] for i in model]), strict=True))
    shown = dict(zip(model, numbers([deltas[i] for i in model]), strict=True))
    round_index, previous_mask, environment_run = -1, 0, 0
    for position, mask in enumerate(row.mask):
        if not mask:
            environment_run += 1
            previous_mask = 0
            continue
        if environment_run:
            table.add_row(*_environment_row(environment_run, windowed))
            environment_run = 0
        if not previous_mask:
            round_index += 1
        previous_mask = 1
        delta = deltas[position]
        table.add_row(
            str(row.start + position),
            *(() if windowed else (str(round_index),)),
            plain(_token_text(row, position)),
            rollout[position],
            trainer[position],
            Text(shown[position], style=delta_style(abs(delta))),
        )
    if environment_run:
        table.add_row(*_environment_row(environment_run, windowed))
    legend = Text(
        "|δ| colours: ≥ 1 red block, ≥ 0.3 red, ≥ 0.1 yellow, < 0.03 dim; ⋯ N env tokens: environment/tool "
        "tokens (mask 0) folded",
        style="dim",
    )
    return Group(header, table, legend)


def _environment_row(tokens: int, windowed: bool) -> tuple:
    """``⋯`` in the token column and the count in the δ column, whose header keeps it on one line at any
    terminal width (in the narrow token column "── environment: 17 tokens ──" folded over 4 lines)."""
    mark, count = Text("⋯", style="cyan"), Text(f"{tokens:,} env tokens", style="cyan")
    return ("", mark, "", "", count) if windowed else ("", "", mark, "", "", count)


def _token_text(row: RowTokens, position: int) -> str:
    text = token_cell(
        None if row.token is None else row.token[position], None if row.token_id is None else row.token_id[position]
    )
    return "–" if text is None else text
