"""Worst rows and tokens: top-K tables and, per worst row, a token strip coloured by δ."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rollout_diag.formatting import extra_cell, number
from rollout_diag.paths import file_labels
from rollout_diag.report.markup import Column, Markup, code, escape, note, table
from rollout_diag.report.sections import Canvas, Section
from rollout_diag.report.series import MAX_STRIP_ROWS, MAX_STRIP_TOKENS, MAX_TABLE_ROWS, MAX_TOKEN_TEXT, clip_text
from rollout_diag.results import AnalysisResult, RowTokens, extra_names

ROW_CRITERIA = {
    "log_ppl_abs_diff": "|log-ppl diff| of the row",
    "max_abs_diff": "largest token |δ| in the row",
    "k3_sum": "row sum of k3 = Σ (exp(δ) − δ − 1)",
    "catastrophic_share": "share of catastrophic tokens",
}
ROW_COLUMNS = (
    Column("#", True),
    Column("score", True, "the row's value under this ranking"),
    Column("step", True),
    Column("sample id"),
    Column("row", False, "row number within its input file (hover for the file)"),
    Column("model / all tokens", True),
    Column("rounds", True),
    Column("worst round", True, "round with the highest mean |δ| in the row"),
    Column("log-ppl diff", True, "d = R[rollout] − R[trainer]"),
    Column("max |δ|", True),
    Column("k3 sum", True),
    Column("catastrophic", True, "tokens with |δ| above the catastrophic threshold"),
)
TOKEN_COLUMNS = (
    Column("#", True),
    Column("δ", True, "trainer − rollout logprob"),
    Column("step", True),
    Column("sample id"),
    Column("position", True),
    Column("round", True),
    Column("token"),
    Column("trainer logprob (p)", True),
    Column("rollout logprob (p)", True),
)


def worst_section(result: AnalysisResult, canvas: Canvas) -> Section:
    title = "Worst rows and tokens"
    if not result.worst_rows and not result.worst_tokens:
        return Section("worst", title, note("No worst-row data in this result."))
    strips = _strip_rows(result)
    anchors = {(s.file, s.row): f"strip-{i}" for i, s in enumerate(strips)}
    files = {row.file for row in result.worst_rows}
    # with rows from several files each says which, labelled as the terminal tables and inspect --row do
    labels = file_labels(sorted({*result.inputs, *files})) if len(files) > 1 else None
    body = [_row_tables(result, anchors, labels), _token_table(result)]
    if strips:
        body.append(_strips(result, strips, canvas))
    else:
        body.append(note("This result has no per-token data for its worst rows: tables only."))
    return Section("worst", title, "".join(body))


# ------------------------------------------------------------------------------------------ tables
def _row_tables(result: AnalysisResult, anchors: dict[tuple[Any, Any], str], labels: dict[str, str] | None) -> str:
    if not result.worst_rows:
        return ""
    parts = ['<h3>Worst rows</h3><p class="note">Ranked four ways; open a ranking to see its top rows.</p>']
    # The dump's extra per-row columns (reward, advantage, …), the same in every ranking's table.
    extras = extra_names(result.worst_rows)
    columns = (*ROW_COLUMNS, *(_extra_column(name, result.worst_rows) for name in extras))
    for index, (criterion, label) in enumerate(_criteria(result).items()):
        rows = [r for r in result.worst_rows if r.criterion == criterion][:MAX_TABLE_ROWS]
        cells = [_row_cells(rank, row, anchors, labels) + _extra_cells(row, extras) for rank, row in enumerate(rows, 1)]
        opened = " open" if index == 0 else ""
        parts.append(
            f"<details{opened}><summary>by {escape(label)} ({len(rows)})</summary>{table(columns, cells)}</details>"
        )
    return "".join(parts)


def _criteria(result: AnalysisResult) -> dict[str, str]:
    present = dict.fromkeys(row.criterion for row in result.worst_rows)
    return {criterion: ROW_CRITERIA.get(criterion, criterion) for criterion in sorted(present, key=_criterion_order)}


def _criterion_order(criterion: str) -> int:
    order = list(ROW_CRITERIA)
    return order.index(criterion) if criterion in order else len(order)


def _row_cells(rank: int, row: Any, anchors: dict[tuple[Any, Any], str], labels: dict[str, str] | None) -> list[object]:
    anchor = anchors.get((row.file, row.row))
    sample = escape(row.sample_id, limit=80) + (f' <a class="jump" href="#{anchor}">tokens ↓</a>' if anchor else "")
    return [
        rank,
        row.value,
        row.step,
        Markup(sample),
        _file_row(row.file, row.row, labels),
        Markup(f"{row.model_tokens:,} / {row.length:,}"),
        row.rounds,
        row.worst_round if row.worst_round >= 0 else "–",
        row.log_ppl_diff,
        row.max_abs_diff,
        row.k3_sum,
        row.catastrophic_count,
    ]


def _extra_column(name: str, rows: Sequence[Any]) -> Column:
    numeric = not any(isinstance((getattr(row, "extra", None) or {}).get(name), str) for row in rows)
    return Column(name, numeric, "a column of the dump (per row), carried as it is")


def _extra_cells(row: Any, names: Sequence[str]) -> list[object]:
    """The row's extra values as the terminal shows them (escaped by the table); empty where the row has none."""
    extra = getattr(row, "extra", None) or {}
    return [extra_cell(extra[name]) if name in extra else "" for name in names]


def _file_row(file: str, row: int, labels: dict[str, str] | None) -> Markup:
    """Row number within its file; the file's label too when the rows come from several files."""
    name = f"{escape(labels.get(file, file), limit=60)} · " if labels is not None else ""
    return Markup(f'<span title="{escape(file, limit=400)}">{name}{row:,}</span>')


def _token_table(result: AnalysisResult) -> str:
    if not result.worst_tokens:
        return ""
    tokens = result.worst_tokens[:MAX_TABLE_ROWS]
    rows = [
        [
            rank,
            Markup(f"{token.log_ratio:+.4g}"),
            token.step,
            Markup(escape(token.sample_id, limit=80)),
            token.position,
            token.round,
            _token_text(token.token, token.token_id),
            Markup(escape(f"{number(token.trainer_logprob)} ({number(token.trainer_prob)})")),
            Markup(escape(f"{number(token.rollout_logprob)} ({number(token.rollout_prob)})")),
        ]
        for rank, token in enumerate(tokens, 1)
    ]
    return f"<h3>Worst tokens by |δ| (top {len(tokens)})</h3>" + table(TOKEN_COLUMNS, rows)


def _token_text(text: str | None, token_id: int | None) -> Markup:
    shown = code(_visible(text)) if text is not None else Markup("")
    identity = f' <span class="muted">id {token_id}</span>' if token_id is not None else ""
    return Markup(shown + identity) if shown or identity else Markup("–")


def _visible(text: str) -> str:
    """Whitespace a reader can see: newline ↵, tab ⇥, empty ∅."""
    return clip_text(text, 40).replace("\n", "↵").replace("\t", "⇥") or "∅"


# ------------------------------------------------------------------------------------------ strips
def _strip_rows(result: AnalysisResult) -> list[RowTokens]:
    """The worst rows' token data, at most MAX_STRIP_ROWS."""
    return [row for row in result.worst_row_tokens if row.mask][:MAX_STRIP_ROWS]


def _strips(result: AnalysisResult, rows: list[Any], canvas: Canvas) -> str:
    threshold = result.catastrophic_threshold
    parts = [
        "<h3>Token strips of the worst rows</h3>",
        Markup(
            '<p class="note">Each model token is coloured by δ (hover for token, logprobs and δ); environment tokens '
            "(mask 0, not scored) are grey; a label marks where each round starts.</p>"
        ),
        _legend(threshold),
    ]
    for index, row in enumerate(rows):
        payload = strip_payload(f"strip-{index}", row)
        canvas.strips.append(payload)
        parts.append(_strip_heading(row, payload))
        parts.append(f'<div class="strip" id="strip-{index}"></div>')
    return "".join(parts)


def _legend(threshold: float) -> Markup:
    return Markup(
        '<div class="legend"><span>δ ≤ −' + escape(f"{threshold:g}") + " (trainer less likely)</span>"
        '<span class="ramp"></span><span>δ ≥ +' + escape(f"{threshold:g}") + " (trainer more likely)</span>"
        '<span class="tok env swatch">env</span><span>environment token</span></div>'
    )


def _strip_heading(row: RowTokens, payload: dict[str, Any]) -> str:
    model = sum(1 for m in row.mask if m)
    step = row.step
    parts = [
        f"step {step}" if step is not None else "",
        f"sample {clip_text(str(row.sample_id), 80)}",
        f"{payload['length']:,} tokens ({model:,} model)",
        f"{payload['rounds']} round(s)",
        # the row's extra dump columns (reward, advantage, …), as in the tables above
        *(f"{name} {clip_text(extra_cell(value), 40)}" for name, value in row.extra.items()),
    ]
    heading = escape(" · ".join(p for p in parts if p))
    window = ""
    if payload["length"] > len(payload["mask"]):
        first, last = payload["start"], payload["start"] + len(payload["mask"]) - 1
        window = (
            f'<span class="muted"> — positions {first:,}–{last:,} shown, the {len(payload["mask"]):,} tokens '
            "around the largest |δ|</span>"
        )
    return f'<h4 class="strip-title">{heading}{window}</h4>'


def strip_payload(anchor: str, row: RowTokens) -> dict[str, Any]:
    """One strip's data for the page script, cut to a window of MAX_STRIP_TOKENS around the largest model |δ|."""
    mask = [int(m) for m in row.mask]
    delta = list(row.log_ratio)
    rounds = round_index(mask)
    start, end = strip_window(mask, delta)
    rollout = row.rollout_logprob
    tokens = row.token
    token_ids = row.token_id
    return {
        "id": anchor,
        "start": row.start + start,  # positions in the row, where the result carries a window of a long row
        "length": len(mask) if row.row_length is None else row.row_length,
        "rounds": max(rounds) + 1 if rounds else 0,
        "mask": mask[start:end],
        "round": rounds[start:end],
        "delta": [float(d) if m else 0 for d, m in zip(delta[start:end], mask[start:end], strict=True)],
        "rollout": None if rollout is None else [float(r) for r in rollout[start:end]],
        "token": None if tokens is None else [_strip_text(t) for t in tokens[start:end]],
        "token_id": None if token_ids is None else list(token_ids[start:end]),
    }


def _strip_text(text: str | None) -> str | None:
    return None if text is None else clip_text(str(text), MAX_TOKEN_TEXT)


def round_index(mask: Sequence[int]) -> list[int]:
    """Round of each token (k-th run of mask-1 tokens), −1 for environment tokens."""
    rounds, current, previous = [], -1, 0
    for value in mask:
        if value and not previous:
            current += 1
        rounds.append(current if value else -1)
        previous = value
    return rounds


def strip_window(mask: Sequence[int], delta: Sequence[float]) -> tuple[int, int]:
    """[start, end) of at most MAX_STRIP_TOKENS tokens, centred on the model token with the largest |δ|."""
    if len(mask) <= MAX_STRIP_TOKENS:
        return 0, len(mask)
    worst = max(range(len(mask)), key=lambda i: abs(delta[i]) if mask[i] else -1.0)
    start = min(max(0, worst - MAX_STRIP_TOKENS // 2), len(mask) - MAX_STRIP_TOKENS)
    return start, start + MAX_STRIP_TOKENS
