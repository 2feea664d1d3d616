"""Which heavy modules a piece of code loads, in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "pyarrow", "plotly")


def loaded_after(code: str, modules: tuple[str, ...] = HEAVY, env: dict[str, str] | None = None) -> set[str]:
    """Which of ``modules`` (the heavy ones by default) are in sys.modules after ``code`` ran in a fresh interpreter
    (with ``env`` as its environment, default this one's)."""
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {modules!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())
