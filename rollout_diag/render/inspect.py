"""One row, token by token, coloured by |δ|, with environment segments folded."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from rollout_diag.render.format import number, plain
from rollout_diag.results import RowTokens

# |δ| colour bands: the same bands the report uses.
BANDS = ((1.0, "bold white on red"), (0.3, "red"), (0.1, "yellow"), (0.03, "default"), (0.0, "dim"))


def delta_style(abs_delta: float) -> str:
    return next(style for floor, style in BANDS if abs_delta >= floor)


def render_row(row: RowTokens) -> RenderableType:
    deltas = row.log_ratio
    model = [i for i, m in enumerate(row.mask) if m]
    worst = max(model, key=lambda i: abs(deltas[i]), default=None)
    header = Text.assemble(
        (f"step {row.step}", "bold"),
        ", sample ",
        plain(row.sample_id, style="bold"),
        " (",
        plain(row.file),
        f" row {row.row}): {len(row.mask)} tokens, {len(model)} from the model",
        "" if worst is None else f"; largest |δ| = {number(abs(deltas[worst]))} at position {worst}",
    )
    table = Table(title_justify="left", show_edge=False)
    for heading in ("pos", "round", "token", "rollout logp", "trainer logp", "δ = trainer − rollout"):
        # numbers never wrap or shorten; a long token folds onto more lines
        table.add_column(
            heading, justify="left" if heading == "token" else "right", overflow="fold", no_wrap=heading != "token"
        )
    round_index, previous_mask, environment_run = -1, 0, 0
    for position, mask in enumerate(row.mask):
        if not mask:
            environment_run += 1
            previous_mask = 0
            continue
        if environment_run:
            table.add_row("", "", Text(f"── environment: {environment_run} tokens ──", style="cyan"), "", "", "")
            environment_run = 0
        if not previous_mask:
            round_index += 1
        previous_mask = 1
        delta = deltas[position]
        table.add_row(
            str(position),
            str(round_index),
            plain(_token_text(row, position)),
            number(row.rollout_logprob[position]),
            number(row.trainer_logprob[position]),
            Text(number(delta), style=delta_style(abs(delta))),
        )
    if environment_run:
        table.add_row("", "", Text(f"── environment: {environment_run} tokens ──", style="cyan"), "", "", "")
    legend = Text("|δ| colours: ≥ 1 red block, ≥ 0.3 red, ≥ 0.1 yellow, < 0.03 dim", style="dim")
    return Group(header, table, legend)


def _token_text(row: RowTokens, position: int) -> str:
    if row.token is not None and row.token[position] is not None:
        return row.token[position]
    if row.token_id is not None:
        return f"#{row.token_id[position]}"
    return "–"
