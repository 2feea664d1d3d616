"""``tokenizer=``: the token ids a result shows, turned into text (``rollout_diag/io/tokenizer.py``). The dump's own
token text (a ``tokens`` column) wins; a token whose id the tokenizer does not know keeps no text."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import overload

from rollout_diag.io.tokenizer import TokenDecoder, decode_ids, load_tokenizer
from rollout_diag.results import AnalysisResult, RowTokens

Tokenizer = str | Path | TokenDecoder | None


def row_with_text(row: RowTokens, decoder: TokenDecoder) -> RowTokens:
    """``row`` with the text of each listed token filled from its id."""
    if row.token_id is None:
        return row
    return replace(row, token=decode_ids(decoder, row.token_id, row.token))


@overload
def with_token_text(shown: AnalysisResult, tokenizer: Tokenizer) -> AnalysisResult: ...
@overload
def with_token_text(shown: RowTokens, tokenizer: Tokenizer) -> RowTokens: ...
def with_token_text(shown: AnalysisResult | RowTokens, tokenizer: Tokenizer) -> AnalysisResult | RowTokens:
    """``shown`` (an AnalysisResult: its worst tokens and the rows the report draws; or one row's RowTokens) with the
    text of every token id it holds, read with ``tokenizer`` (``io.tokenizer.load_tokenizer``); unchanged without one.
    Raises ConfigError for a tokenizer that cannot be loaded."""
    decoder = load_tokenizer(tokenizer)
    if decoder is None:
        return shown
    if isinstance(shown, RowTokens):
        return row_with_text(shown, decoder)
    tokens = [
        token
        if token.token is not None or token.token_id is None
        else replace(token, token=decoder.text(token.token_id))
        for token in shown.worst_tokens
    ]
    rows = [row_with_text(row, decoder) for row in shown.worst_row_tokens]
    return replace(shown, worst_tokens=tokens, worst_row_tokens=rows)
