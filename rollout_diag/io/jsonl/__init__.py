"""A compiled (numba) reader of JSON lines for the fields a trainer format uses: the fast path of
:func:`rollout_diag.io.formats.base.jsonl_file`. Not a trainer format itself.

One pass over a block of lines, byte by byte, with no Python object per value. Each line must be one JSON
object; the fields named in the format's schema are read into typed arrays, every other value is checked
against JSON's grammar (as Python's ``json`` reads it, ``NaN``/``Infinity``/``-Infinity`` included) and
skipped. A line is **accepted** only where Python's ``json.loads`` would certainly read it to the same
values; any doubt sends the line back to the format's own line parser, which then gives the row (or the
message) it always gave. Doubt means: not an object, a grammar error anywhere, a key with an escape, a
field of interest given twice or with a value of another JSON type, an integer of more than 18 digits, an
integer literal of magnitude 2**53 or more in a float list (Python keeps it exact, ``pa.array`` refuses it),
a number of more than 19 significant digits or outside the normal double range, a string value with an
escape or a control character, nesting deeper than 64. ``-0`` (an integer to Python) reads as 0.0.
tests/io/test_jsonl_scan.py and tests/io/test_jsonl_blocks.py check it against Python's json on 1.4 million strings
and hypothesis. The scan holds no GIL (``nogil``): ``io/formats/base.py`` runs it on parts of a block on every core.

The modules, each one thing: ``words.py`` (eight-byte loads and word tests, JSON's literals and whitespace),
``numbers.py`` (numbers read and converted exactly, or only checked), ``skipping.py`` (values no field reads, checked
and passed over), ``records.py`` (the line and record state machine, :func:`records.scan`), ``lines.py`` (line ends and
counts of a block), ``scanner.py`` (:class:`Scanner`: the scan's arrays into one Arrow table).

The compiled cache: numba keys a kernel's cache on its own file only, and the scan's compiled call graph spans the
modules above. So every cached kernel of this package carries one stamp, the hash of all of its modules' sources
(:func:`_stamp_caches`, applied when the package is imported, before anything compiles): a change to any module makes
every kernel's cache stale and recompiles them, as a change to the one file did when the scanner was one module.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import ModuleType

from rollout_diag.io.jsonl import lines, numbers, records, scanner, skipping, words
from rollout_diag.io.jsonl.lines import line_ends, newlines_and_returns
from rollout_diag.io.jsonl.scanner import Scanned, Scanner

KERNEL_MODULES: tuple[ModuleType, ...] = (words, numbers, skipping, records, lines, scanner)

__all__ = ["KERNEL_MODULES", "Scanned", "Scanner", "line_ends", "newlines_and_returns"]


def _stamp_caches(modules: tuple[ModuleType, ...]) -> str:
    """Give every cached kernel of ``modules`` one source stamp, the hash of all their sources (numba compares the stamp
    its index holds with this one, and a differing index is stale); returns the stamp. Kernels whose cache numba
    does not lay out as expected keep numba's own stamp (their own file's)."""
    digest = hashlib.sha256()
    for module in modules:
        digest.update(Path(module.__file__ or "").read_bytes())
    stamp = f"rollout_diag.io.jsonl:{digest.hexdigest()}"
    for module in modules:
        for value in vars(module).values():
            cache_file = getattr(getattr(value, "_cache", None), "_cache_file", None)
            if cache_file is not None and hasattr(cache_file, "_source_stamp"):
                cache_file._source_stamp = stamp  # noqa: SLF001  (numba has no public hook for a kernel's sources)
    return stamp


SOURCE_STAMP = _stamp_caches(KERNEL_MODULES)
