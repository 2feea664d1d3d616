"""Settings every test shares."""

from __future__ import annotations

import pytest


@pytest.fixture
def engines_seen(monkeypatch) -> list[str]:
    """The engine class of every chunk's statistics (``KernelStats``: numba, ``ChunkStats``: torch), in the order
    ``metrics.segments.stats`` made them; clear the list between runs."""
    from rollout_diag.metrics import segments

    seen: list[str] = []
    original = segments.stats

    def spy(chunk):
        found = original(chunk)
        seen.append(type(found).__name__)
        return found

    monkeypatch.setattr(segments, "stats", spy)
    return seen
