"""Names a package loads when they are first read (PEP 562): the ``__getattr__`` that ``rollout_diag`` and
``rollout_diag.results`` share, so that importing either costs only the modules a caller reads."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(package: str, exports: Mapping[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``: a name of ``exports`` (name -> the module that defines it) is
    imported from its module when first read and kept in ``namespace`` (the package's globals), so later reads do not
    come here; any other name raises AttributeError."""

    def found(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module '{package}' has no attribute '{name}'")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return found
