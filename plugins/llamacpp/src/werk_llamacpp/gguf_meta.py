"""A GGUF file's header metadata, read with the standard library, and the default context.

:func:`read_metadata` reads the key/value section of a GGUF (version 2 or 3) file and stops
before the tensor infos: numbers, booleans and strings are kept, arrays are skipped (the
vocabulary is an array of tens of thousands of strings; nothing here needs it). It never loads
``gguf``/numpy, so ``werk serve`` pays a few milliseconds for it, not an import.

:func:`default_context` is the per-slot context a llama.cpp instance gets when its profile
names no ``ctx`` (docs/deployments.md, "llama.cpp options"): the model's trained context
(``<arch>.context_length``), at least :data:`MIN_SLOT_CONTEXT`, and only as much as the KV
cache of every slot fits in :data:`KV_MEMORY_SHARE` of the host memory available when the
instance starts (f16 K and V: ``2 × 2 bytes × layers × kv heads × head size`` per token). A
file whose header cannot be read gets :data:`MIN_SLOT_CONTEXT`, the earlier default.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO, Final

__all__ = [
    "KV_MEMORY_SHARE",
    "MIN_SLOT_CONTEXT",
    "GgufError",
    "default_context",
    "kv_bytes_per_token",
    "partial_cache",
    "read_metadata",
]

#: The smallest per-slot context a default gives (the default before the trained context was read).
MIN_SLOT_CONTEXT: Final = 4096
#: The share of available host memory the default context's KV cache may take.
KV_MEMORY_SHARE: Final = 0.25

_MAGIC: Final = b"GGUF"
#: GGUF value type → struct format of its scalar (8: string, 9: array are read apart).
_SCALARS: Final = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
#: Bounds against a corrupt header (a real one has a few dozen keys and short strings).
_MAX_KEYS: Final = 100_000
_MAX_STRING: Final = 1 << 26


class GgufError(ValueError):
    """The file is not a GGUF file this reader understands."""


Value = int | float | bool | str | None


def _read(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise GgufError("the file ends inside the GGUF header")
    return data


def _scalar(f: BinaryIO, kind: int) -> int | float | bool:
    fmt = _SCALARS.get(kind)
    if fmt is None:
        raise GgufError(f"unknown GGUF value type {kind}")
    value: int | float | bool = struct.unpack(fmt, _read(f, struct.calcsize(fmt)))[0]
    return value


def _string(f: BinaryIO) -> str:
    (size,) = struct.unpack("<Q", _read(f, 8))
    if size > _MAX_STRING:
        raise GgufError("a GGUF string is too long")
    return _read(f, size).decode("utf-8", "replace")


def _skip_array(f: BinaryIO) -> None:
    kind, count = struct.unpack("<IQ", _read(f, 12))
    if kind == _STRING:
        for _ in range(count):
            (size,) = struct.unpack("<Q", _read(f, 8))
            f.seek(size, 1)
    elif kind == _ARRAY:
        for _ in range(count):
            _skip_array(f)
    else:
        fmt = _SCALARS.get(kind)
        if fmt is None:
            raise GgufError(f"unknown GGUF array type {kind}")
        f.seek(struct.calcsize(fmt) * count, 1)


def read_metadata(path: Path) -> dict[str, Value]:
    """The header's key/value pairs (arrays as ``None``); :class:`GgufError` or :class:`OSError`
    for a file that is not GGUF version 2 or 3."""
    with open(path, "rb", buffering=1 << 16) as f:
        if _read(f, 4) != _MAGIC:
            raise GgufError("not a GGUF file")
        (version,) = struct.unpack("<I", _read(f, 4))
        if version not in (2, 3):
            raise GgufError(f"GGUF version {version} is not read here")
        _tensors, keys = struct.unpack("<QQ", _read(f, 16))
        if keys > _MAX_KEYS:
            raise GgufError("the GGUF header claims too many keys")
        found: dict[str, Value] = {}
        for _ in range(keys):
            key = _string(f)
            (kind,) = struct.unpack("<I", _read(f, 4))
            if kind == _STRING:
                found[key] = _string(f)
            elif kind == _ARRAY:
                _skip_array(f)
                found[key] = None
            else:
                found[key] = _scalar(f, kind)
        return found


def _int(meta: dict[str, Value], key: str) -> int | None:
    value = meta.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def trained_context(meta: dict[str, Value]) -> int | None:
    """``<arch>.context_length``: the context the model was trained for."""
    arch = meta.get("general.architecture")
    return _int(meta, f"{arch}.context_length") if isinstance(arch, str) else None


def kv_bytes_per_token(meta: dict[str, Value]) -> int | None:
    """The f16 KV cache bytes one token of context takes, from the header; ``None`` when the
    header does not say enough (an architecture without the usual attention keys)."""
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        return None
    layers = _int(meta, f"{arch}.block_count")
    heads = _int(meta, f"{arch}.attention.head_count")
    kv_heads = _int(meta, f"{arch}.attention.head_count_kv") or heads
    width = _int(meta, f"{arch}.embedding_length")
    if layers is None or heads is None or kv_heads is None or width is None:
        return None
    key = _int(meta, f"{arch}.attention.key_length") or width // heads
    value = _int(meta, f"{arch}.attention.value_length") or width // heads
    return 2 * layers * kv_heads * (key + value)


#: Header key fragments of layers whose state is not a per-token KV cache (state-space,
#: short-convolution and RWKV time-mix layers), after ``<arch>.``.
_RECURRENT_KEYS: Final = (".ssm.", ".shortconv.", ".wkv.", ".time_mix_", ".token_shift_")


def partial_cache(meta: dict[str, Value]) -> str | None:
    """What keeps part of this model's cache outside a restorable slot file, from its header:
    ``"sliding-window"`` (``<arch>.attention.sliding_window`` or a chunked attention,
    ``<arch>.attention.chunk_size``), ``"recurrent"`` (state-space, short-convolution or RWKV
    layers), else ``None``. llama-server reuses such a cache after a restore only when it keeps
    the full cache (``--swa-full``; docs/prompt-cache.md, "Sliding-window models")."""
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        return None
    if any(_int(meta, f"{arch}.attention.{key}") is not None for key in ("sliding_window", "chunk_size")):
        return "sliding-window"
    if any(key.startswith(arch) and fragment in key for key in meta for fragment in _RECURRENT_KEYS):
        return "recurrent"
    return None


def default_context(path: Path, slots: int, available_bytes: int) -> int:
    """The per-slot context of an instance whose profile names no ``ctx`` (module docstring)."""
    try:
        meta = read_metadata(path)
    except (OSError, GgufError, struct.error):
        return MIN_SLOT_CONTEXT
    trained = trained_context(meta)
    if trained is None or trained <= MIN_SLOT_CONTEXT:
        return MIN_SLOT_CONTEXT
    per_token = kv_bytes_per_token(meta)
    if per_token is None:
        return MIN_SLOT_CONTEXT
    affordable = int(available_bytes * KV_MEMORY_SHARE) // (per_token * max(slots, 1))
    return max(MIN_SLOT_CONTEXT, min(trained, affordable))
