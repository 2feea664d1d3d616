"""``convert``: a dump in any trainer format written out in the canonical sequence layout, from file names or a
:class:`~rollout_diag.drivers.dump.Dump` (its reading options with it). The writing is ``io/convert.py``'s."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rollout_diag.drivers.dump import CALL_OPTIONS, Dump, call_options
from rollout_diag.io.convert import ConvertResult
from rollout_diag.io.convert import convert as convert_files

# What convert takes from a Dump; a Dump setting any other reading option (chunk_tokens, device, workers, backend:
# convert computes nothing and writes one file in one process) is refused, never silently ignored.
_READER_OPTIONS = ("input_format", "trust_pickle")  # the options other calls take through the Dump's reader
_TAKEN = ("columns", "strict", *_READER_OPTIONS)


def convert(
    inputs: str | Path | Sequence[str | Path] | Dump,
    output: str | Path,
    *,
    partition: str | None = None,
    columns: Mapping[str, str] | None = None,
    strict: bool | None = None,
    input_format: str | None = None,
    trust_pickle: bool | None = None,
    overwrite: bool = False,
) -> ConvertResult:
    """Write ``inputs`` (files, globs, directories, or a :class:`Dump`) to ``output`` in the canonical sequence
    layout; returns what was written. A Dump gives its columns, strictness, trainer format and pickle trust; one given
    here as well must agree. ``columns``, ``strict``, ``input_format``, ``trust_pickle`` left None: the Dump's, else
    none, False, detected, False.

    Raises ConfigError for a bad partition, an existing output (unless ``overwrite``) or a Dump's option convert
    cannot honour, InputError for unreadable input (and, under ``strict``, DataError for the first unreadable row).
    """
    reading: dict[str, Any] = {
        "columns": columns,
        "strict": strict,
        "input_format": input_format,
        "trust_pickle": trust_pickle,
    }
    if isinstance(inputs, Dump):  # its options fill those left None; one given both ways must agree
        reading.update(call_options(inputs, "convert", _TAKEN, reading, names=(*CALL_OPTIONS, *_READER_OPTIONS)))
        inputs = list(inputs.inputs)
    reading["strict"] = bool(reading["strict"])
    return convert_files(inputs, output, partition=partition, overwrite=overwrite, **reading)
