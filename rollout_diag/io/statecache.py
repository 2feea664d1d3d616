"""``runs --state-dir DIR``: each run's finished pass kept on disk, keyed by its inputs (paths, sizes, mtimes) and
the reading options, so that a run added later costs one pass and the others none.

The files are pickles: point ``--state-dir`` only at a directory you own (loading a pickle runs code it names).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rollout_diag.errors import ConfigError
from rollout_diag.io.sources import expand_inputs

CACHE_VERSION = 2  # bump when what a state holds changes (2: the per-prompt evidence): older files never found


def state_key(inputs: tuple[str, ...], options: Mapping[str, Any]) -> str | None:
    """The cache key of one run: a hash of every input file's resolved path, size and mtime (ns) and of
    ``options`` (JSON-able); None for remote inputs (no mtime to trust). Raises InputError for missing inputs."""
    files = []
    for source in expand_inputs(inputs):
        if "://" in source.path:
            return None
        status = os.stat(source.path)
        files.append([str(Path(source.path).resolve()), status.st_size, status.st_mtime_ns])
    from rollout_diag import __version__

    text = json.dumps([CACHE_VERSION, __version__, files, options], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def load_state(directory: str | Path, key: str) -> Any | None:
    """The state saved under ``key`` in ``directory``, None when there is none (or it cannot be read back)."""
    path = Path(directory) / f"run-{key}.pkl"
    try:
        with path.open("rb") as handle:
            return pickle.load(handle)
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
        return None


def save_state(directory: str | Path, key: str, state: Any) -> None:
    """Save ``state`` under ``key`` (a temporary file renamed: a killed run leaves no half file). Raises ConfigError
    when the directory cannot be written."""
    folder = Path(directory)
    target = folder / f"run-{key}.pkl"
    temporary = folder / f".run-{key}.pkl.{os.getpid()}.tmp"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with temporary.open("wb") as handle:
            pickle.dump(state, handle, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(temporary, target)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise ConfigError(f"--state-dir {folder}: cannot write ({' '.join(str(exc).split())}).") from None
