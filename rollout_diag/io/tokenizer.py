"""``--tokenizer PATH|NAME``: token ids shown as the text they stand for.

Trainer dumps carry ``token_ids``, not text (verl, prime-rl, NeMo-RL, SkyRL and slime all do). A tokenizer turns the
few ids a result shows (the worst tokens, the rows a report draws, ``inspect``'s row) into text, read with the
``tokenizers`` library (``pip install 'rollout-diag[tokenizer]'``) from:

- a ``tokenizer.json`` file;
- a local Hugging Face model directory holding one;
- a model name (``Qwen/Qwen2.5-7B``) looked up in the local Hugging Face cache only
  (``$HF_HUB_CACHE``, ``$HF_HOME/hub``, ``~/.cache/huggingface/hub``: ``models--Qwen--Qwen2.5-7B/snapshots/*/``);
  nothing is downloaded.

Each id becomes the bytes it stands for: byte-level BPE (GPT-2, Llama 3, Qwen) through the byte alphabet, byte
fallback tokens (``<0x0A>``) as that byte, SentencePiece's ``▁`` as a space. Bytes that are not valid UTF-8 on their
own (half of a multi-byte character) are written as ``\\xNN`` escapes; special tokens (``<|im_end|>``) as their name.
The renderers escape control characters on top (``formatting.visible``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from rollout_diag.errors import ConfigError, option_name

INSTALL_HINT = "pip install 'rollout-diag[tokenizer]'."
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")


def tokenizers_module() -> Any:
    """The ``tokenizers`` package; raises ConfigError saying what to install without it."""
    try:
        import tokenizers
    except ImportError:
        raise ConfigError(f"{option_name('tokenizer')} needs the tokenizers package.", hint=INSTALL_HINT) from None
    return tokenizers


@lru_cache(maxsize=1)
def _byte_of_char() -> dict[str, int]:
    """GPT-2's byte alphabet inverted: the printable character byte-level BPE writes for each byte -> the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    shifted = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + shifted)
            shifted += 1
    return {chr(char): byte for byte, char in zip(printable, chars, strict=True)}


def hf_cache_dirs() -> list[Path]:
    """Where the Hugging Face hub cache may sit, in the order huggingface_hub looks (no network)."""
    found = []
    if os.environ.get("HF_HUB_CACHE"):
        found.append(Path(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        found.append(Path(os.environ["HF_HOME"]) / "hub")
    xdg = os.environ.get("XDG_CACHE_HOME")
    found.append((Path(xdg) if xdg else Path.home() / ".cache") / "huggingface" / "hub")
    return found


def _cached_tokenizer(name: str) -> Path | None:
    """``tokenizer.json`` of model ``name`` in the local hub cache: the snapshot ``refs/main`` names, else the
    newest snapshot holding one; None when none is cached."""
    for cache in hf_cache_dirs():
        model = cache / ("models--" + name.replace("/", "--"))
        snapshots = model / "snapshots"
        if not snapshots.is_dir():
            continue
        ref = model / "refs" / "main"
        if ref.is_file():
            chosen = snapshots / ref.read_text(encoding="utf-8").strip() / "tokenizer.json"
            if chosen.is_file():
                return chosen
        held = [path for path in snapshots.glob("*/tokenizer.json") if path.is_file()]
        if held:
            return max(held, key=lambda path: path.stat().st_mtime)
    return None


def tokenizer_file(spec: str | Path) -> Path:
    """The ``tokenizer.json`` that ``spec`` (a file, a model directory or a cached model name) names; raises
    ConfigError saying where it looked."""
    path = Path(spec).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        if (path / "tokenizer.json").is_file():
            return path / "tokenizer.json"
        raise ConfigError(f"{option_name('tokenizer')} {spec}: the directory holds no tokenizer.json.")
    text = str(spec)
    if _NAME.fullmatch(text):
        cached = _cached_tokenizer(text)
        if cached is not None:
            return cached
        places = ", ".join(str(cache) for cache in hf_cache_dirs())
        raise ConfigError(
            f"{option_name('tokenizer')} {spec}: no such file or directory, and no tokenizer.json of the model "
            f"'{text}' in the local Hugging Face cache ({places}); nothing is downloaded.",
            hint=f"huggingface-cli download {text} tokenizer.json, or give the path of a tokenizer.json.",
        )
    raise ConfigError(f"{option_name('tokenizer')} {spec}: no such file or directory.")


class TokenDecoder:
    """Token id -> the text it stands for (see the module's docstring); ids outside the vocabulary give None."""

    def __init__(self, tokenizer: Any, source: str) -> None:
        self.tokenizer = tokenizer
        self.source = source
        described = json.loads(tokenizer.to_str())
        kinds = set(_types(described.get("decoder"))) | set(_types(described.get("pre_tokenizer")))
        self.byte_level = "ByteLevel" in kinds
        self.metaspace = "Metaspace" in kinds or any(
            step.get("type") == "Replace" and "▁" in json.dumps(step.get("pattern", ""), ensure_ascii=False)
            for step in _steps(described.get("decoder"))
        )
        self.special = {
            int(token["id"]): str(token["content"])
            for token in described.get("added_tokens") or []
            if token.get("special")
        }
        self.cache: dict[int, str | None] = {}

    def text(self, token_id: int) -> str | None:
        """The token's text: special tokens by name, bytes that are not valid UTF-8 as ``\\xNN``."""
        token_id = int(token_id)
        if token_id in self.cache:
            return self.cache[token_id]
        found = self._text(token_id)
        if len(self.cache) < 1 << 20:
            self.cache[token_id] = found
        return found

    def _text(self, token_id: int) -> str | None:
        if token_id < 0:
            return None
        if token_id in self.special:
            return self.special[token_id]
        piece = self.tokenizer.id_to_token(token_id)
        if piece is None:
            return None
        byte = _BYTE_TOKEN.fullmatch(piece)
        if byte:
            return _bytes_text(bytes([int(byte.group(1), 16)]))
        if self.byte_level:
            table = _byte_of_char()
            if all(char in table for char in piece):
                return _bytes_text(bytes(table[char] for char in piece))
            return piece
        if self.metaspace:
            return piece.replace("▁", " ")
        return piece

    def texts(self, token_ids: Iterable[int]) -> list[str | None]:
        return [self.text(token_id) for token_id in token_ids]


def _bytes_text(data: bytes) -> str:
    return data.decode("utf-8", errors="backslashreplace")


def _steps(component: Any) -> list[dict[str, Any]]:
    """A tokenizer.json component (decoder, pre-tokenizer) as its list of steps (a Sequence's, or itself)."""
    if not isinstance(component, dict):
        return []
    nested = component.get("decoders") or component.get("pretokenizers")
    if isinstance(nested, list):
        return [step for part in nested for step in _steps(part)]
    return [component]


def _types(component: Any) -> list[str]:
    return [str(step.get("type")) for step in _steps(component)]


def load_tokenizer(spec: str | Path | TokenDecoder | None) -> TokenDecoder | None:
    """A TokenDecoder for ``spec`` (``tokenizer.json``, a model directory or a cached model name; a TokenDecoder is
    returned as it is; None: None). Raises ConfigError for a missing tokenizer, an unreadable file or a missing
    ``tokenizers`` package."""
    if spec is None or isinstance(spec, TokenDecoder):
        return spec
    module = tokenizers_module()
    path = tokenizer_file(spec)
    try:
        tokenizer = module.Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust side raises a bare Exception for a malformed file
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(
            f"{option_name('tokenizer')} {path}: not a tokenizer.json the tokenizers library reads ({first})."
        ) from None
    return TokenDecoder(tokenizer, str(path))


def decode_ids(decoder: TokenDecoder, token_ids: Sequence[int] | None, texts: Sequence[str | None] | None):
    """``texts`` with each None filled from ``token_ids`` (the dump's own text wins); None without ids."""
    if token_ids is None:
        return None if texts is None else list(texts)
    if texts is None:
        return decoder.texts(token_ids)
    return [
        text if text is not None else decoder.text(token_id) for text, token_id in zip(texts, token_ids, strict=True)
    ]
