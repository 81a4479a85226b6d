"""Read the few GGUF metadata values the bridge needs, without loading the model.

The engine (mistral.rs) reads the same keys when it loads a GGUF file: the chat template
(``tokenizer.chat_template``), the special tokens (``tokenizer.ggml.{bos,eos,unk}_token_id``
into ``tokenizer.ggml.tokens``) and the context length (``<architecture>.context_length``).
Werk reads them to render prompts (:mod:`werk_candle_bridge.template`) and to answer chat
limits before the model is loaded.

Only the header's key/value section is parsed (tensor data is never touched). Every length is
bounded, so a corrupt or hostile file fails with :class:`GgufError` instead of allocating
without limit. GGUF versions 2 and 3 are read (little-endian).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

__all__ = ["GgufError", "GgufMetadata", "read_metadata"]

MAGIC = b"GGUF"
MAX_STRING_BYTES = 16 << 20
MAX_ARRAY_ITEMS = 16 << 20
MAX_KV_ENTRIES = 1 << 16

# GGUF value types (the GGUF specification's gguf_type enumeration).
_SCALARS: dict[int, str] = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING = 8
_ARRAY = 9

Value = int | float | bool | str | list["Value"]


class GgufError(ValueError):
    """The file is not a readable GGUF model (the message names no path)."""


@dataclass(frozen=True)
class GgufMetadata:
    """What the bridge reads from a GGUF header (``None`` where the file has no such key)."""

    architecture: str | None
    context_length: int | None
    chat_template: str | None
    bos_token: str | None
    eos_token: str | None
    unk_token: str | None


class _Reader:
    def __init__(self, handle: BinaryIO) -> None:
        self.handle = handle

    def take(self, n: int) -> bytes:
        data = self.handle.read(n)
        if len(data) != n:
            raise GgufError("the GGUF header ends early")
        return data

    def scalar(self, kind: int) -> int | float | bool:
        fmt = _SCALARS[kind]
        value: int | float | bool = struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]
        return value

    def u32(self) -> int:
        return int(self.scalar(4))

    def u64(self) -> int:
        return int(self.scalar(10))

    def string(self) -> str:
        size = self.u64()
        if size > MAX_STRING_BYTES:
            raise GgufError("a GGUF string is implausibly long")
        return self.take(size).decode("utf-8", errors="replace")

    def value(self, kind: int, keep: bool) -> Value | None:
        """One value of ``kind``; arrays not ``keep``-ed are skipped without building them."""
        if kind in _SCALARS:
            return self.scalar(kind)
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY:
            raise GgufError(f"unknown GGUF value type {kind}")
        item_kind, count = self.u32(), self.u64()
        if count > MAX_ARRAY_ITEMS:
            raise GgufError("a GGUF array is implausibly long")
        if not keep and item_kind in _SCALARS:
            self.take(struct.calcsize(_SCALARS[item_kind]) * count)
            return None
        items = [self.value(item_kind, keep) for _ in range(count)]
        return [i for i in items if i is not None] if keep else None


#: Keys whose values are kept (everything else is skipped).
_KEPT = ("general.architecture", "tokenizer.chat_template", "tokenizer.ggml.tokens")
_TOKEN_IDS = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "unk": "tokenizer.ggml.unknown_token_id",
}


def _token(values: dict[str, Value], which: str) -> str | None:
    tokens = values.get("tokenizer.ggml.tokens")
    index = values.get(_TOKEN_IDS[which])
    if not isinstance(tokens, list) or not isinstance(index, int) or isinstance(index, bool):
        return None
    token = tokens[index] if 0 <= index < len(tokens) else None
    return token if isinstance(token, str) else None


def read_metadata(path: Path) -> GgufMetadata:
    """The bridge's metadata of the GGUF file at ``path`` (module docstring).

    Raises :class:`GgufError` for anything that is not a GGUF v2/v3 header, ``OSError`` when
    the file cannot be read."""
    values: dict[str, Value] = {}
    with path.open("rb") as handle:
        reader = _Reader(handle)
        if reader.take(4) != MAGIC:
            raise GgufError("not a GGUF file")
        version = reader.u32()
        if version not in (2, 3):
            raise GgufError(f"GGUF version {version} is not supported")
        reader.u64()  # tensor count
        entries = reader.u64()
        if entries > MAX_KV_ENTRIES:
            raise GgufError("the GGUF header has implausibly many entries")
        for _ in range(entries):
            key = reader.string()
            kind = reader.u32()
            keep = key in _KEPT or key in _TOKEN_IDS.values() or key.endswith(".context_length")
            value = reader.value(kind, keep)
            if keep and value is not None:
                values[key] = value
    arch = values.get("general.architecture")
    architecture = arch if isinstance(arch, str) else None
    context = values.get(f"{architecture}.context_length") if architecture else None
    template = values.get("tokenizer.chat_template")
    return GgufMetadata(
        architecture=architecture,
        context_length=context if isinstance(context, int) and not isinstance(context, bool) and context > 0 else None,
        chat_template=template if isinstance(template, str) and template else None,
        bos_token=_token(values, "bos"),
        eos_token=_token(values, "eos"),
        unk_token=_token(values, "unk"),
    )
