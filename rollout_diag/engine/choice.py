"""Which engine computes each chunk's token statistics.

Two engines give the same metrics (tests/kernels/test_kernel.py requires 1e-12 relative, exact counts):

- ``numba``: the compiled CPU kernels of ``kernels/cpu.py``: one pass over a chunk's raw arrays builds its segments
  and every per-segment sum, maximum and minimum in registers. CPU only.
- (``kernels/presets.py`` is the preset pass's compiled twin of ``engine/formulas.py``'s derived token quantities, and
  ``io/jsonl/`` the byte scanner of the JSON-lines importers: compiled CPU code, whatever the engine.)
- ``torch``: the device-generic engine of ``engine/chunkstats.py`` (vectorised torch / numpy over token tensors);
  what runs on CUDA.
- ``auto`` (default): numba for a chunk on the CPU, torch on a GPU. The commands whose families take numpy chunks
  (every family does, through ``rollout_diag.engine.arrays``: ``analyze``, ``check``, ``compare-presets``, ``report``,
  ``sweep``, ``diff``, ``watch``, ``inspect``) then never import torch on the CPU, and run the kernels whatever the
  input's size (their reader asks without a size): loading numba and the cached kernels costs less than importing
  torch. A reading of tensor chunks (``DumpReader.chunks`` without ``numpy``, a caller that wants tensors and loads
  torch anyway) runs torch on the CPU for an input of fewer than
  ``SMALL_INPUT_TOKENS`` tokens in fewer than ``SMALL_INPUT_ROWS`` rows (read from the Parquet footers before the
  first chunk), where loading numba and its cached kernels (~0.8 s of CPU) costs more than the kernels save
  (measured in docs/benchmarks.md: the two break even near 4M tokens; the torch engine's cost per step is higher,
  so many short rows, each perhaps its own step, go to the kernels).

The choice is a process setting (``ROLLOUT_DIAG_ENGINE``, or :func:`use_engine` around a call, or
``Dump(engine=…)``), so worker processes inherit it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from rollout_diag.engine import kernels
from rollout_diag.errors import ConfigError, option_name

ENGINES = ("auto", "numba", "torch")
ENVIRONMENT = "ROLLOUT_DIAG_ENGINE"
# ``auto`` below this many input tokens and rows on the CPU is torch (see above); the variable sets another token
# bound (0: never).
SMALL_INPUT_ENVIRONMENT = "ROLLOUT_DIAG_SMALL_INPUT_TOKENS"
SMALL_INPUT_TOKENS = 1 << 22
SMALL_INPUT_ROWS = 1 << 12
InputSize = tuple[int, int]  # (tokens, rows) of a reader's whole input


def check_engine(engine: str) -> str:
    """``engine`` if it names an engine, else a ConfigError naming the option."""
    if engine not in ENGINES:
        raise ConfigError(f"{option_name('engine')}={engine}: not an engine (use {', '.join(ENGINES)}).")
    return engine


def selected_engine() -> str:
    """The engine this process uses (``auto`` unless set)."""
    engine = os.environ.get(ENVIRONMENT) or "auto"
    if engine not in ENGINES:
        raise ConfigError(f"{ENVIRONMENT}={engine}: not an engine (use {', '.join(ENGINES)}).")
    return engine


@contextmanager
def use_engine(engine: str | None) -> Iterator[None]:
    """Run the body with ``engine`` (None: leave the setting as it is)."""
    if engine is None:
        yield
        return
    check_engine(engine)
    before = os.environ.get(ENVIRONMENT)
    os.environ[ENVIRONMENT] = engine
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENVIRONMENT, None)
        else:
            os.environ[ENVIRONMENT] = before


def kernel_for(device_type: str, input_size: InputSize | None = None) -> bool:
    """Whether a chunk on ``device_type`` is computed by the numba kernels. ``input_size``: (tokens, rows) of the
    whole input the chunk comes from, where a reader knows them and its chunks are tensors (``auto`` on the
    CPU is torch below :func:`small_input_tokens` tokens and SMALL_INPUT_ROWS rows); None: no size rule (numpy
    chunks, which load no torch; the trainer-side API, whose chunk's size is not a run's)."""
    engine = selected_engine()
    if engine == "numba" and device_type != "cpu":
        raise ConfigError(
            f"{option_name('engine')}=numba runs on the CPU; the chunks are on {device_type}.",
            hint=f"use {option_name('engine')}=torch (or auto) with a GPU, or {option_name('device')}=cpu.",
        )
    if engine == "auto" and input_size is not None:
        tokens, rows = input_size
        if tokens < small_input_tokens() and rows < SMALL_INPUT_ROWS:
            return False
    return device_type == "cpu" and engine != "torch"


def small_input_tokens() -> int:
    """The input size below which ``auto`` runs the torch engine on the CPU (``SMALL_INPUT_TOKENS`` unless
    ``ROLLOUT_DIAG_SMALL_INPUT_TOKENS`` says otherwise)."""
    configured = os.environ.get(SMALL_INPUT_ENVIRONMENT)
    if not configured:
        return SMALL_INPUT_TOKENS
    try:
        value = int(configured)
    except ValueError:
        value = -1
    if value < 0:
        raise ConfigError(f"{SMALL_INPUT_ENVIRONMENT}={configured}: must be a whole number of tokens, 0 or more.")
    return value


def expect_presets() -> None:
    """The presets' compiled pass will run in this process: on the numba engine its kernels are compiled ahead, on
    another core, where the compile cache lacks them (``kernels.expect_presets``)."""
    kernels.expect_presets()
