"""The statistics every hint's test reads: a group of tokens (count, Σy, Σy² of y = min(|δ|, 1)) and an elevated
group against a baseline (``Contrast``: the means' ratio and Welch's t over tokens), the thresholds they share, and the
hint's common pieces (the steps that pass on their own, example rows). docs/hints.md gives the reason for each
threshold."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from rollout_diag.results import Evidence, HintRow, Sums

MIN_GROUP_TOKENS = 30  # each side of a comparison needs this many tokens
MIN_T = 5.0  # Welch's t over tokens; tokens of one row are correlated, so well above the usual 2–3
MIN_GAP = 1e-3  # the elevated group's mean min(|δ|, 1) exceeds the other's by at least this: negligible otherwise
MAX_STEPS = 10  # steps listed per hint
EXAMPLES = 5  # example rows listed per hint (the schema's bound)
PROBABILITY_LABELS = ("p ≥ 0.9", "0.5 ≤ p < 0.9", "0.1 ≤ p < 0.5", "0.01 ≤ p < 0.1", "p < 0.01")
LOW_BUCKETS, HIGH_BUCKETS = (3, 4), (0, 1)


@dataclass(frozen=True)
class Group:
    """Count, Σy and Σy² of y = min(|δ|, 1) over a group of tokens."""

    n: float
    total: float
    squares: float

    @property
    def mean(self) -> float:
        return self.total / self.n if self.n > 0 else math.nan

    @property
    def variance(self) -> float:
        if self.n < 2:
            return 0.0
        return max(self.squares - self.n * self.mean * self.mean, 0.0) / (self.n - 1)

    def __add__(self, other: Group) -> Group:
        return Group(self.n + other.n, self.total + other.total, self.squares + other.squares)


@dataclass(frozen=True)
class Contrast:
    """An elevated group against a baseline group: the means, their ratio and Welch's t."""

    high: Group
    low: Group

    @property
    def factor(self) -> float:
        return self.high.mean / self.low.mean if self.low.mean > 0 else math.inf

    @property
    def t(self) -> float:
        spread = math.sqrt(self.high.variance / self.high.n + self.low.variance / self.low.n)
        gap = self.high.mean - self.low.mean
        return gap / spread if spread > 0 else (math.inf if gap > 0 else 0.0)

    def holds(self, min_factor: float) -> bool:
        """Both groups large enough, the high mean ``min_factor`` × the low one, clearly apart and not negligible."""
        if min(self.high.n, self.low.n) < MIN_GROUP_TOKENS:
            return False
        gap = self.high.mean - self.low.mean
        return gap >= MIN_GAP and self.high.mean >= min_factor * self.low.mean and self.t >= MIN_T


def strongest_steps(evidence: Evidence, measure: Callable[[Sums], float | None]) -> list[int]:
    """Steps whose own sums pass the hint's test (``measure`` returns a strength, None when it fails),
    strongest first."""
    passing = [(strength, step) for step, sums in evidence.steps.items() if (strength := measure(sums)) is not None]
    return [step for _, step in sorted(passing, key=lambda item: (-item[0], item[1]))[:MAX_STEPS]]


def example_rows(evidence: Evidence, kind: str) -> list[HintRow]:
    return [HintRow(ref.step, ref.sample_id, ref.file, ref.row) for ref in evidence.examples.get(kind, ())]


def group_of(sums: Sums, prefix: str) -> Group:
    return Group(sums[prefix], sums[f"{prefix}_y"], sums[f"{prefix}_y2"])


def fmt(value: float) -> str:
    return f"{value:.3g}"


def bucket_group(bucket: Mapping[str, float]) -> Group:
    return Group(bucket["tokens"], bucket["y"], bucket["y2"])
