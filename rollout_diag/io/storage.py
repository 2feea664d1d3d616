"""Dumps on object storage: ``s3://``, ``gs://`` and ``hf://`` paths, read through pyarrow's filesystems.

``s3://`` and ``gs://`` go through ``pyarrow.fs.S3FileSystem`` and ``GcsFileSystem`` (in pyarrow's PyPI wheels);
``hf://`` through ``huggingface_hub``'s fsspec filesystem wrapped as a pyarrow one (the ``cloud`` extra). A file is
opened as the filesystem's random-access file, so the reader fetches the footer and then, row group by row group,
only the column chunks it reads (ranged GETs; nothing is downloaded first). A prefix (``s3://bucket/run/``) lists
its ``*.parquet`` files in natural order as a local directory does; a glob matches keys component by component.

Credentials come from where each client looks for them: AWS's environment (``AWS_ACCESS_KEY_ID``, …, ``AWS_PROFILE``,
``~/.aws``; ``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``, for an S3-compatible server), Google's application
default credentials (``STORAGE_EMULATOR_HOST`` for an emulator), ``HF_TOKEN``. ``ROLLOUT_DIAG_ANONYMOUS=1`` reads
public buckets and repositories unsigned. Every failure is one :class:`InputError` line naming the path. pyarrow is
imported only when a remote path is read: :func:`remote_uri` is what the CLI calls before pyarrow loads.
"""

from __future__ import annotations

import fnmatch
import functools
import importlib.util
import os
import re
from collections.abc import Callable, Iterator
from pathlib import PurePosixPath
from typing import Any, TypeVar
from urllib.parse import urlsplit

from rollout_diag.errors import InputError
from rollout_diag.paths import natural_key

T = TypeVar("T")

READABLE = {"s3": "s3", "gs": "gs", "gcs": "gs", "hf": "hf"}  # scheme as typed -> the filesystem that reads it
EXTRA = "pip install 'rollout-diag[cloud]'"
ANONYMOUS = "ROLLOUT_DIAG_ANONYMOUS"
_URI = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):/+(.*)", re.DOTALL)  # a pathlib.Path folds "s3://" into "s3:/"
_GLOB_CHARS = set("*?[")
# what changes which filesystem a path gets: a test (or a long-lived process) that changes them gets a new one
_SETTINGS = (
    ANONYMOUS,
    "AWS_ENDPOINT_URL_S3",
    "AWS_ENDPOINT_URL",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_PROFILE",
    "STORAGE_EMULATOR_HOST",
    "HF_ENDPOINT",
    "HF_TOKEN",
)


def remote_uri(text: str) -> str | None:
    """``text`` as a readable remote URI (``s3://bucket/run``, scheme lower-cased, "//" restored after pathlib folded
    it, no trailing "/"), or None when it names no scheme that is read here (a local path, ``file://``, …)."""
    found = _URI.match(text)
    if found is None or found.group(1).lower() not in READABLE or os.path.exists(text):
        return None
    return f"{READABLE[found.group(1).lower()]}://{found.group(2).rstrip('/')}"


def is_remote(text: str) -> bool:
    return remote_uri(text) is not None


def check_client(uri: str) -> None:
    """Raises InputError when what reads ``uri``'s scheme is not installed (no pyarrow loaded to tell)."""
    scheme = uri.split(":", 1)[0]
    if scheme == "hf" and importlib.util.find_spec("huggingface_hub") is None:
        raise InputError(f"{uri}: hf:// paths are read through huggingface_hub, not installed; {EXTRA}.")


def _split(uri: str) -> tuple[str, str]:
    scheme, _, path = uri.partition("://")
    return scheme, path


def _bucket(scheme: str, path: str) -> str:
    """The part of ``path`` one filesystem serves: the bucket (s3, gs); all of the Hub for hf."""
    return "" if scheme == "hf" else path.split("/", 1)[0]


def _anonymous() -> bool:
    return os.environ.get(ANONYMOUS, "").strip().lower() not in ("", "0", "false", "no")


def filesystem(uri: str) -> tuple[Any, str]:
    """(the pyarrow filesystem that reads ``uri``, the path within it). Raises InputError."""
    scheme, path = _split(uri)
    check_client(uri)
    settings = tuple(os.environ.get(name) for name in _SETTINGS)
    try:
        return _filesystem(scheme, _bucket(scheme, path), settings), path
    except (OSError, ValueError) as exc:
        raise failure(uri, exc) from None


@functools.lru_cache(maxsize=32)
def _filesystem(scheme: str, bucket: str, settings: tuple[str | None, ...]) -> Any:
    import pyarrow.fs as pafs

    anonymous = _anonymous()
    if scheme == "hf":
        from huggingface_hub import HfFileSystem

        return pafs.PyFileSystem(pafs.FSSpecHandler(HfFileSystem(token=False if anonymous else None)))
    name = "S3FileSystem" if scheme == "s3" else "GcsFileSystem"
    if not hasattr(pafs, name):
        raise InputError(
            f"{scheme}://{bucket}: this pyarrow was built without {name}; install pyarrow's PyPI wheel "
            f"(pip install --force-reinstall pyarrow), which has it."
        )
    options: dict[str, Any] = {"anonymous": anonymous}
    if scheme == "gs":
        emulator = os.environ.get("STORAGE_EMULATOR_HOST")
        if emulator:
            endpoint = urlsplit(emulator if "://" in emulator else f"http://{emulator}")
            options.update(endpoint_override=endpoint.netloc, scheme=endpoint.scheme)
        return pafs.GcsFileSystem(**options)
    # AWS's rule: the service's own variable before the general one
    endpoint_url = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint_url:
        endpoint = urlsplit(endpoint_url if "://" in endpoint_url else f"https://{endpoint_url}")
        options.update(endpoint_override=endpoint.netloc, scheme=endpoint.scheme)
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        options["region"] = region
    elif not endpoint_url:  # a bucket answers only in its own region: ask AWS which
        options["region"] = pafs.resolve_s3_region(bucket)
    return pafs.S3FileSystem(**options)


def failure(uri: str, exc: BaseException) -> InputError:
    """``exc``, raised reading ``uri``, as one line naming the path and what to do."""
    text = " ".join(str(exc).split())
    if "NO_SUCH_BUCKET" in text or "NoSuchBucket" in text or ("not found" in text and "Bucket" in text):
        return InputError(f"{uri}: no such bucket ({_bucket(*_split(uri))}).")
    if isinstance(exc, FileNotFoundError) or "NO_SUCH_KEY" in text or "NoSuchKey" in text:
        return InputError(f"{uri}: no such file or prefix.")
    if any(code in text for code in ("ACCESS_DENIED", "AccessDenied", "Forbidden", "403", "401")):
        return InputError(
            f"{uri}: access denied; give credentials that may read it (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or "
            f"AWS_PROFILE, GOOGLE_APPLICATION_CREDENTIALS, HF_TOKEN), or {ANONYMOUS}=1 for a public one."
        )
    if any(code in text for code in ("credentials", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken")):
        return InputError(f"{uri}: no valid credentials ({_short(text)}).")
    if any(code in text for code in ("connect", "Connection", "resolve host", "curlCode", "timed out")):
        return InputError(f"{uri}: cannot reach the storage server ({_short(text)}).")
    return InputError(f"{uri}: cannot be read ({_short(text)}).")


def _short(text: str) -> str:
    return text[:160] + ("…" if len(text) > 160 else "")


# ------------------------------------------------------------------------------------------- files
def _asked(uri: str, question: Callable[[Any, str], T]) -> T:
    """``question(filesystem, path)`` of ``uri``'s filesystem; raises InputError (:func:`failure`) where it fails."""
    fs, path = filesystem(uri)
    try:
        return question(fs, path)
    except (OSError, ValueError) as exc:
        raise failure(uri, exc) from None


def file_info(uri: str) -> Any:
    """``uri``'s pyarrow FileInfo (a file, a prefix, or NotFound). Raises InputError for any failure."""
    return _asked(uri, lambda fs, path: fs.get_file_info(path))


def identity(uri: str) -> tuple[int, int]:
    """(size, modification time in ns) of the file at ``uri``: another object, or the same rewritten, has another.
    Raises InputError when there is no such file (or bucket)."""
    info = file_info(uri)
    if info.type.name == "Directory":
        raise InputError(f"{uri}: a prefix, not a file.")
    if info.type.name != "File":
        raise _missing(uri)
    return int(info.size or 0), int(info.mtime_ns or 0)


def signature(uri: str) -> tuple[int, int] | None:
    """:func:`identity`, or None when ``uri`` is no file (or cannot be asked)."""
    try:
        return identity(uri)
    except InputError:
        return None


def is_prefix(uri: str) -> bool:
    """Whether ``uri`` is a bucket or a prefix that holds objects (a "directory")."""
    try:
        return file_info(uri).type.name == "Directory"
    except InputError:
        return False


def open_file(uri: str) -> Any:
    """The file at ``uri`` as pyarrow's random-access file (ranged reads). Raises InputError."""
    return _asked(uri, lambda fs, path: fs.open_input_file(path))


def _check_bucket(uri: str) -> None:
    """Raises InputError when ``uri``'s bucket does not exist (S3 answers a missing key and bucket alike)."""
    scheme, path = _split(uri)
    bucket = _bucket(scheme, path)
    if bucket and path != bucket and file_info(f"{scheme}://{bucket}").type.name == "NotFound":
        raise InputError(f"{uri}: no such bucket ({bucket}).")


def _missing(uri: str) -> InputError:
    """Why ``uri`` is not found: its bucket is missing, or nothing is at or under it."""
    _check_bucket(uri)
    return InputError(f"{uri}: no such file or prefix.")


def _listing(uri: str) -> list[Any]:
    """Every object and implied directory under the prefix ``uri`` (recursive); [] when there is none."""
    import pyarrow.fs as pafs

    return _asked(uri, lambda fs, path: fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True)))


def _is_data_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name.endswith(".parquet") and not name.startswith((".", "_"))  # _SUCCESS, _metadata, .crc: markers


def expand(uri: str) -> Iterator[tuple[str, str | None]]:
    """(file URI, the prefix it was found under or None) for one remote input: the file itself, a prefix's
    ``*.parquet`` files or a glob's matches, in natural order (``step=2/`` before ``step=10/``). Raises InputError
    for a missing bucket or key, a prefix without Parquet files, a glob that matches nothing."""
    scheme, path = _split(uri)
    if _GLOB_CHARS & set(path):
        yield from _glob(scheme, path, uri)
        return
    info = file_info(uri)
    if info.type.name == "File":
        yield uri, None
        return
    if info.type.name == "NotFound":
        raise _missing(uri)
    found = sorted((entry.path for entry in _listing(uri) if entry.type.name == "File"), key=natural_key)
    data = [f"{scheme}://{key}" for key in found if _is_data_file(key)]
    if not data:
        raise InputError(f"{uri}: prefix holds no .parquet file.")
    for file in data:
        yield file, uri


def _glob(scheme: str, pattern: str, uri: str) -> Iterator[tuple[str, str | None]]:
    parts = pattern.split("/")
    fixed = next(i for i, part in enumerate(parts) if _GLOB_CHARS & set(part))
    if fixed == 0:
        raise InputError(f"{uri}: a pattern in the bucket name is not listed; name the bucket.")
    base = "/".join(parts[:fixed])
    entries = _listing(f"{scheme}://{base}")
    if not entries:
        _check_bucket(f"{scheme}://{base}")
    files = sorted((entry.path for entry in entries if entry.type.name == "File"), key=natural_key)
    matched: dict[str, str | None] = {}
    for entry in sorted(entries, key=lambda entry: natural_key(entry.path)):
        relative = entry.path[len(base) :].strip("/").split("/")
        if not _matches(parts[fixed:], relative):
            continue
        if entry.type.name == "File":
            matched.setdefault(f"{scheme}://{entry.path}", None)
            continue
        for key in files:  # a matched prefix contributes its Parquet files
            if key.startswith(f"{entry.path}/") and _is_data_file(key):
                matched.setdefault(f"{scheme}://{key}", f"{scheme}://{entry.path}")
    if not matched:
        raise InputError(f"{uri}: no file matches this pattern.")
    yield from sorted(matched.items(), key=lambda item: natural_key(item[0]))


def _matches(pattern: list[str], parts: list[str]) -> bool:
    """Whether key components ``parts`` match glob components ``pattern`` (``**``: any number of components;
    a name starting with "." only where the pattern's component does too), as the local glob matches."""
    if not pattern:
        return not parts
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return _matches(rest, parts) or (bool(parts) and not parts[0].startswith(".") and _matches(pattern, parts[1:]))
    if not parts or (parts[0].startswith(".") and not head.startswith(".")):
        return False
    return fnmatch.fnmatchcase(parts[0], head) and _matches(rest, parts[1:])


def partition_path(uri: str) -> PurePosixPath:
    """``uri``'s key as a path whose components carry hive partitions (``step=3``): the bucket left out."""
    scheme, path = _split(uri)
    bucket = _bucket(scheme, path)
    return PurePosixPath(path[len(bucket) :].lstrip("/") if bucket else path)
