"""Skipped data is part of the answer (docs/hints.md, "Skipped rows").

Rows that reading skipped as invalid (NaN or positive logprobs, null or ragged lists, bad mask values) are not in
any metric. Past ``SKIPPED_SHARE_LIMIT`` of the rows or of the model tokens read, the answer would describe a part of
the data chosen by a bug, not the run: the finding ``invalid_rows`` makes the verdict a pipeline bug (which also
withholds the recommendation) and ``check``'s default gate ``skipped_row_share`` fails.
"""

from __future__ import annotations

from rollout_diag.results import Hint, SkippedData, SkippedRow, share_text

# Above 1 % of the rows (or tokens) skipped the answer no longer describes the run: a writer that puts NaN in a few
# rows of a batch is rare noise; one that loses half a batch (a crash mid-write, a side that never scored) is a bug.
SKIPPED_SHARE_LIMIT = 0.01
INVALID_ROWS = "invalid_rows"
SKIPPED_ROW_SHARE = "skipped_row_share"  # check's gate on SkippedData.row_share


def skipped_data(
    rows: int, tokens: int, skipped_rows: int, skipped_tokens: int, reasons: dict[str, int], first: SkippedRow | None
) -> SkippedData:
    """What was skipped of the ``rows`` analysed + ``skipped_rows`` read (and of their model tokens), its reasons most
    rows first."""
    ordered = dict(sorted(reasons.items(), key=lambda item: (-item[1], item[0])))
    return SkippedData(skipped_rows, rows + skipped_rows, skipped_tokens, tokens + skipped_tokens, ordered, first)


def too_much_skipped(skipped: SkippedData) -> bool:
    """Whether more than SKIPPED_SHARE_LIMIT of the rows or of the model tokens read were skipped."""
    return skipped.row_share > SKIPPED_SHARE_LIMIT or skipped.token_share > SKIPPED_SHARE_LIMIT


def invalid_rows_hint(skipped: SkippedData) -> Hint | None:
    """The pipeline finding ``invalid_rows`` (what was wrong, how many rows and tokens, the first row) when too much
    was skipped; None otherwise."""
    if not too_much_skipped(skipped):
        return None
    message = (
        f"{skipped.detail()}. Above {share_text(SKIPPED_SHARE_LIMIT)} skipped, the metrics describe the rows that "
        "happened to be valid, not the run."
    )
    evidence = {
        "rows_skipped": float(skipped.rows),
        "input_rows": float(skipped.input_rows),
        "row_share": skipped.row_share,
        "tokens_skipped": float(skipped.tokens),
        "input_tokens": float(skipped.input_tokens),
        "token_share": skipped.token_share,
    }
    look_at = (
        "the skipped rows (listed with file, row and column; --format json lists the first 1000); what writes the "
        "dump (a side that wrote no logprobs, a job killed mid-write)"
    )
    return Hint(INVALID_ROWS, message, evidence, look_at=look_at)
