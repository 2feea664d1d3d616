"""Read pickles without running their code: an unpickler that resolves only an explicit allowlist.

Unpickling calls whatever callable the file names, so an arbitrary ``.pkl`` can run any code. This
unpickler resolves a global only when it is on the allowlist: a few harmless builtins and numpy's array
reconstruction, plus the batch classes of the trainer format being read, which are mapped to small
stand-ins here that only keep the pickled state as plain data (the trainer's own classes are never
imported). Anything else is refused with an error naming the class. ``trust=True`` (``--trust-pickle``)
lets other globals resolve as plain :mod:`pickle` would, importing and calling them.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Mapping
from typing import Any, BinaryIO

from rollout_diag.errors import InputError, option_name

# Globals that build plain data and nothing else.
SAFE_GLOBALS: dict[tuple[str, str], Any] = {
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "complex"): complex,
    ("builtins", "slice"): slice,
    ("collections", "OrderedDict"): dict,
}


def _numpy_globals() -> dict[tuple[str, str], Any]:
    import numpy as np

    reconstruct = np.ndarray.__reduce__(np.zeros(0))[0]  # numpy's own _reconstruct, wherever it lives
    scalar = np.float64(0).__reduce__()[0]
    allowed: dict[tuple[str, str], Any] = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype}
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[(module, "_reconstruct")] = reconstruct
        allowed[(module, "scalar")] = scalar
    for name in ("float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8", "bool_"):
        allowed[("numpy", name)] = getattr(np, name)
    return allowed


def _torch_globals() -> dict[tuple[str, str], Any]:
    import torch

    return {("torch", "device"): torch.device, ("torch", "Size"): torch.Size}


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, file: BinaryIO, path: str, allowed: Mapping[tuple[str, str], Any], trust: bool) -> None:
        super().__init__(file)
        self.path = path
        self.allowed = allowed
        self.trust = trust

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self.allowed:
            return self.allowed[(module, name)]
        if self.trust:
            return super().find_class(module, name)
        raise InputError(
            f"{self.path}: refused to unpickle {module}.{name}: not on the allowlist of plain data classes, and "
            "unpickling it could run code.",
            hint=f"if you trust this file, pass {option_name('trust_pickle')}.",
        )

    def persistent_load(self, pid: Any) -> Any:
        raise InputError(f"{self.path}: the pickle refers to external storage ({type(pid).__name__}); not plain data.")


def load(source: str | bytes, path: str, format_globals: Mapping[tuple[str, str], Any], *, trust: bool = False) -> Any:
    """Unpickle ``source`` (a file path, or bytes read from ``path``) resolving only allowlisted globals.

    Raises InputError naming the first refused class, or saying the file is not a readable pickle.
    """
    allowed = {**SAFE_GLOBALS, **_numpy_globals(), **_torch_globals(), **format_globals}
    try:
        if isinstance(source, bytes):
            return _RestrictedUnpickler(io.BytesIO(source), path, allowed, trust).load()
        with open(source, "rb") as handle:
            return _RestrictedUnpickler(handle, path, allowed, trust).load()
    except InputError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError) as exc:
        raise InputError(f"{path}: not a readable pickle ({type(exc).__name__}: {exc}).") from exc


def global_names(path: str, limit: int = 1 << 20) -> set[str]:
    """``module.name`` of the globals a pickle refers to, read from its first ``limit`` bytes without
    unpickling (for detection)."""
    import pickletools

    names: set[str] = set()
    strings: list[str] = []
    with open(path, "rb") as handle:
        head = handle.read(limit)
    try:
        for opcode, argument, _ in pickletools.genops(io.BytesIO(head)):
            if opcode.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
                strings.append(str(argument))
            elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
                names.add(f"{strings[-2]}.{strings[-1]}")
            elif opcode.name in ("GLOBAL", "INST"):
                names.add(str(argument).replace(" ", "."))
    except (ValueError, EOFError, pickle.UnpicklingError):
        pass  # a truncated head or a non-pickle: what was found so far is all
    return names
