"""The JSON-lines scanner's compiled cache (io/jsonl/__init__.py): numba keys a kernel's cache on its own file, and the
scan's compiled call graph spans the package's modules, so every cached kernel of the package must carry one stamp made
of all of their sources, or an edit to one module would leave another's cached kernel stale."""

from __future__ import annotations

import hashlib
import pkgutil
from pathlib import Path

from rollout_diag.io import jsonl


def test_every_module_of_the_package_is_stamped():
    names = {info.name for info in pkgutil.iter_modules(jsonl.__path__)}
    assert names == {module.__name__.rsplit(".", 1)[-1] for module in jsonl.KERNEL_MODULES}


def test_the_stamp_is_the_hash_of_every_module_source():
    digest = hashlib.sha256()
    for module in jsonl.KERNEL_MODULES:
        digest.update(Path(module.__file__).read_bytes())
    assert jsonl.SOURCE_STAMP.endswith(digest.hexdigest())


def test_every_cached_kernel_carries_the_stamp():
    kernels = [
        value
        for module in jsonl.KERNEL_MODULES
        for value in vars(module).values()
        if getattr(getattr(value, "_cache", None), "_cache_file", None) is not None
    ]
    assert {kernel.py_func.__name__ for kernel in kernels} >= {"scan", "skip_value", "line_ends", "_gather"}
    assert {kernel._cache._cache_file._source_stamp for kernel in kernels} == {jsonl.SOURCE_STAMP}
