"""``matched_prompts`` by hand: two runs' per-prompt evidence built here, the worst-1 % cut, the chance guard and the
matrix's values worked out in the comments."""

from __future__ import annotations

import numpy as np
import pytest

from rollout_diag.decisions.prompts import matched_prompts
from rollout_diag.metrics.prompts import SCORE_BINS, score_bin, score_bin_edge
from rollout_diag.results import PromptCells, PromptEvidence, prompt_label

EDGES = [score_bin_edge(index) for index in range(SCORE_BINS)]
P, Q, R = 11, 22, 33  # prompt keys


def _evidence(prompts: dict[int, list[float]], background: int) -> PromptEvidence:
    """A run: each prompt's rows (their scores, one step each: step = row index), ``background`` rows of score 0.01
    without a prompt in the histogram."""
    keys, steps, scores = [], [], []
    for key, values in prompts.items():
        for step, value in enumerate(values):
            keys.append(key)
            steps.append(step)
            scores.append(value)
    score = np.array(scores)
    histogram = np.bincount(score_bin(np.concatenate([score, np.full(background, 0.01)])), minlength=SCORE_BINS)
    count = len(keys)
    return PromptEvidence(
        source="column prompt_id",
        rows_keyed=count,
        rows_without=0,
        sampled_share=1.0,
        has_versions=False,
        cells=PromptCells(
            key=np.array(keys, np.int64),
            version=np.array(steps, np.int64),
            step=np.array(steps, np.int64),
            rows=np.ones(count),
            tokens=np.full(count, 10.0),
            y=np.zeros(count),
            y2=np.zeros(count),
            score=score,
            score_min=score,
            score_max=score,
        ),
        score_histogram=histogram,
        score_edges=EDGES,
    )


def test_a_prompt_extreme_in_both_runs_is_listed_by_hand():
    # run a: 200 rows: P's 2 and R's 1 at 1.0, Q's 2 and 195 more at 0.01. The worst 1 % is ceil(0.01 · 200) = 2 rows;
    # the bin of 1.0 holds 3: threshold = that bin's edge, share = 3/200 = 0.015.
    # run b: 200 rows: P's at 1.0 and 2.0, Q's 2 and 196 more at 0.01: the bins of 2.0 then 1.0 hold the 2 wanted
    # rows: threshold = 1.0's bin edge, share = 2/200 = 0.01.
    a = _evidence({P: [1.0, 1.0], Q: [0.01, 0.01], R: [1.0]}, background=195)
    b = _evidence({P: [1.0, 2.0], Q: [0.01, 0.01]}, background=196)
    found = matched_prompts([("a", a), ("b", b), ("c", None)])
    assert found.runs == ["a", "b"] and found.without == ["c"]
    assert [(w.share, w.prompts) for w in found.worst] == [(0.015, 3), (0.01, 2)]
    assert found.worst[0].threshold == score_bin_edge(int(score_bin(np.array([1.0]))[0]))
    assert found.shared == 2 and found.in_every_run == 2 and found.outliers == 1  # P and Q recur; R is in a alone
    listed, other = found.matrix
    # P: chance = 0.015² · 0.01² = 2.25e-8; × 2 candidates ≤ 1 %: listed
    assert listed.key == prompt_label(P) and listed.listed and listed.chance == pytest.approx(2.25e-8, rel=1e-12)
    cell_a, cell_b = listed.cells
    assert (cell_a.rows, cell_a.score_mean, cell_a.worst, cell_a.steps) == (2, 1.0, True, [0, 1])
    assert cell_a.tail == pytest.approx(0.015)  # 3 of a's 200 rows score in 1.0's bin or above
    assert (cell_b.score_mean, cell_b.score_min, cell_b.score_max) == (1.5, 1.0, 2.0)
    assert cell_b.tail == pytest.approx(0.01)
    # Q: every row at 0.01, below both cuts: not listed, second in the matrix
    assert other.key == prompt_label(Q) and not other.listed and not any(cell.worst for cell in other.cells)
    assert found.matrix_cut == 0


def test_the_chance_guard_keeps_one_row_a_run_among_many_prompts_out():
    # P has one row at 1.0 in each run, 100 other prompts one row at 0.01 in each, 99 rows without a prompt: 200 rows.
    # 2 rows are wanted and 1 scores above 0.01, so the cut falls to 0.01's bin: every row is in the "worst" share
    # (share 1.0): each prompt qualifies, with chance 1: none listed.
    others = {key: [0.01] for key in range(100, 200)}
    a = _evidence({P: [1.0], **others}, background=99)
    b = _evidence({P: [1.0], **others}, background=99)
    found = matched_prompts([("a", a), ("b", b)])
    assert found.shared == 101 and found.outliers == 0 and all(w.share == 1.0 for w in found.worst)
    # one more row at 1.0 in each run (R in a, 44 in b, each in one run only): the 2 worst rows are P's and that one,
    # share 2/200 = 0.01 each; P's chance 0.01 · 0.01 = 1e-4, × 101 candidates = 0.0101 > 1 %: not listed
    a = _evidence({P: [1.0], R: [1.0], **others}, background=98)
    b = _evidence({P: [1.0], 44: [1.0], **others}, background=98)
    found = matched_prompts([("a", a), ("b", b)])
    assert [w.share for w in found.worst] == [0.01, 0.01]
    (p,) = [item for item in found.matrix if item.key == prompt_label(P)]
    assert all(cell.worst for cell in p.cells) and p.chance == pytest.approx(1e-4)
    assert found.shared == 101 and not p.listed and found.outliers == 0  # 1e-4 × 101 = 0.0101 > 0.01


def test_no_identity_is_none():
    assert matched_prompts([("a", None), ("b", None)]) is None
