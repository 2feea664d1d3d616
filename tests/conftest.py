"""Settings every test shares.

``auto`` runs the torch engine on the CPU for an input of fewer than ``SMALL_INPUT_TOKENS`` tokens where the chunks
are tensors (``inspect``: loading numba costs more than it saves there beside torch; engine/kernels/). Every dump
of this suite is that small, so the suite sets the bound to 0: ``auto`` then means the numba kernels on the CPU, as
for a real dump, and the tests that compare the engines or run the size rule itself (tests/kernels/test_kernel.py)
choose them explicitly. Set here, before any test imports the package, so the CLI subprocesses the tests start
inherit it too.
"""

from __future__ import annotations

import os

import pytest

os.environ["ROLLOUT_DIAG_SMALL_INPUT_TOKENS"] = "0"


@pytest.fixture
def engines_seen(monkeypatch) -> list[str]:
    """The engine class of every chunk's statistics (``KernelStats``: numba, ``ChunkStats``: torch), in the order
    ``engine.stats.stats`` made them; clear the list between runs."""
    from rollout_diag.engine import stats as segments

    seen: list[str] = []
    original = segments.stats

    def spy(chunk):
        found = original(chunk)
        seen.append(type(found).__name__)
        return found

    monkeypatch.setattr(segments, "stats", spy)
    return seen
