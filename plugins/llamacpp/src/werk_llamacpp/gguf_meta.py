"""A GGUF file's header metadata, read with the standard library, and the default context.

:func:`read_metadata` reads the key/value section of a GGUF (version 2 or 3) file and stops
before the tensor infos: numbers, booleans and strings are kept, arrays are skipped (the
vocabulary is an array of tens of thousands of strings, skipped by walking their lengths in
read-ahead blocks; nothing here needs it). It never loads ``gguf``/numpy, so ``werk serve`` pays
a few milliseconds for it, not an import, and once per file: a process that asks again about an
unchanged file (same device, inode, size, mtime and ctime; the memory estimate, the default
context and the partial-cache check all read it) gets the first reading, and a later process
the reading remembered under the user cache by the same status
(:func:`werk_host.plugin.remembered_by_status`; docs/operations.md, "Start-up").

:func:`read_tensors` goes on past the key/value pairs through the tensor directory (the CPU
expert page preparation, :mod:`.prefetch`, needs it): each tensor's name, ggml type, dims and
offset relative to the data section, whose absolute start is the directory's end rounded up to
``general.alignment`` (default 32). A tensor's byte size comes from :data:`GGML_TYPE_SIZES`
(elements per block, bytes per block); no payload is read, so a scalar (no dims) I32 tensor is
just four bytes at its offset. Bounded: an unknown type, more than :data:`MAX_TENSORS`
tensors, more than four dims, a misaligned offset or a tensor past the file's end is a
:class:`GgufError`, never a guess.

:func:`default_context` is the per-slot context a llama.cpp instance gets when its profile
names no ``ctx`` (docs/deployments.md, "llama.cpp options"): the model's trained context
(``<arch>.context_length``), at least :data:`MIN_SLOT_CONTEXT`, and only as much as the KV
cache of every slot fits in :data:`KV_MEMORY_SHARE` of the host memory available when the
instance starts (f16 K and V: ``2 × 2 bytes × layers × kv heads × head size`` per token). A
file whose header cannot be read gets :data:`MIN_SLOT_CONTEXT`, the earlier default.

:func:`kv_cache_bytes` is the KV cache llama-server allocates for a context (docs/deployments.md,
"Memory estimate"): every layer holds K and V rows of ``kv heads × head size`` elements per
cell, in the cache type's bytes (``--cache-type-k``/``--cache-type-v``, :data:`CACHE_TYPE_BYTES`);
a full-attention layer has a cell per context token, a sliding-window layer (:func:`kv_shape`)
only the window plus a micro-batch per slot, unless ``--swa-full``.
"""

from __future__ import annotations

import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final, TypeGuard

from werk_host.plugin import remembered_by_status

__all__ = [
    "KV_MEMORY_SHARE",
    "MIN_SLOT_CONTEXT",
    "CACHE_TYPE_BYTES",
    "DEFAULT_ALIGNMENT",
    "GGML_TYPE_SIZES",
    "MAX_TENSORS",
    "GgufError",
    "KvShape",
    "TensorDirectory",
    "TensorInfo",
    "default_context",
    "file_identity",
    "kv_bytes_per_token",
    "kv_cache_bytes",
    "kv_shape",
    "partial_cache",
    "read_metadata",
    "read_tensors",
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
_U64: Final = struct.Struct("<Q")
#: Bytes read ahead at a time while skipping an array of strings.
_BLOCK: Final = 1 << 16
#: Headers read in this process, by the file's status (:func:`read_metadata`); a few at most.
_READ: dict[tuple[str, int, int, int, int, int], dict[str, Value]] = {}
_READ_LOCK = threading.Lock()
_READ_MAX: Final = 16


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


def _skip_strings(f: BinaryIO, count: int) -> None:
    """Skip ``count`` length-prefixed strings: their lengths are walked in read-ahead blocks,
    and what was read beyond the last one is given back (the file is left just after it)."""
    block, at, end = b"", 0, 0
    length = _U64.unpack_from  # the walk is a vocabulary long: ~50,000 strings for SmolLM2
    for _ in range(count):
        if end - at < 8:
            block = block[at:] + f.read(_BLOCK)
            at, end = 0, len(block)
            if end < 8:
                raise GgufError("the file ends inside the GGUF header")
        at += 8 + length(block, at)[0]
        if at > end:  # a string longer than what was read ahead
            f.seek(at - end, 1)
            block, at, end = b"", 0, 0
    f.seek(at - end, 1)


def _skip_array(f: BinaryIO) -> None:
    kind, count = struct.unpack("<IQ", _read(f, 12))
    if kind == _STRING:
        _skip_strings(f, count)
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
    for a file that is not GGUF version 2 or 3. Read once per file status (module docstring)."""
    real = os.path.realpath(path)
    st = os.stat(real)
    status = (real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    with _READ_LOCK:
        known = _READ.get(status)
    if known is not None:
        return dict(known)
    found = remembered_by_status(Path(real), _HEADER, lambda file: _read_header(str(file)), _is_header)
    with _READ_LOCK:
        if len(_READ) >= _READ_MAX:
            _READ.pop(next(iter(_READ)))
        _READ[status] = found
    return dict(found)


#: What :func:`read_metadata` remembers by the file's status across processes.
_HEADER: Final = "gguf-header"


def _is_header(value: object) -> TypeGuard[dict[str, Value]]:
    return isinstance(value, dict) and all(
        isinstance(key, str) and (item is None or isinstance(item, int | float | bool | str))
        for key, item in value.items()
    )


def _read_header(path: str) -> dict[str, Value]:
    with open(path, "rb", buffering=1 << 16) as f:
        return _read_kv(f)[0]


def _read_kv(f: BinaryIO) -> tuple[dict[str, Value], int]:
    """The key/value pairs and the tensor count; ``f`` is left at the first tensor info."""
    if _read(f, 4) != _MAGIC:
        raise GgufError("not a GGUF file")
    (version,) = struct.unpack("<I", _read(f, 4))
    if version not in (2, 3):
        raise GgufError(f"GGUF version {version} is not read here")
    tensors, keys = struct.unpack("<QQ", _read(f, 16))
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
    return found, tensors


#: ggml tensor type → (elements per block, bytes per block): ggml's type traits, as the ``gguf``
#: package lists them (``GGML_QUANT_SIZES``), copied so that reading needs neither it nor numpy.
GGML_TYPE_SIZES: Final[dict[int, tuple[int, int]]] = {
    0: (1, 4),  # F32
    1: (1, 2),  # F16
    2: (32, 18),  # Q4_0
    3: (32, 20),  # Q4_1
    6: (32, 22),  # Q5_0
    7: (32, 24),  # Q5_1
    8: (32, 34),  # Q8_0
    9: (32, 40),  # Q8_1
    10: (256, 84),  # Q2_K
    11: (256, 110),  # Q3_K
    12: (256, 144),  # Q4_K
    13: (256, 176),  # Q5_K
    14: (256, 210),  # Q6_K
    15: (256, 292),  # Q8_K
    16: (256, 66),  # IQ2_XXS
    17: (256, 74),  # IQ2_XS
    18: (256, 98),  # IQ3_XXS
    19: (256, 50),  # IQ1_S
    20: (32, 18),  # IQ4_NL
    21: (256, 110),  # IQ3_S
    22: (256, 82),  # IQ2_S
    23: (256, 136),  # IQ4_XS
    24: (1, 1),  # I8
    25: (1, 2),  # I16
    26: (1, 4),  # I32
    27: (1, 8),  # I64
    28: (1, 8),  # F64
    29: (256, 56),  # IQ1_M
    30: (1, 2),  # BF16
    34: (256, 54),  # TQ1_0
    35: (256, 66),  # TQ2_0
    39: (32, 17),  # MXFP4
}
#: The alignment of the data section and of every tensor in it when ``general.alignment`` is absent.
DEFAULT_ALIGNMENT: Final = 32
#: Bounds of the tensor directory (a large MoE model has a few thousand tensors of ≤ 4 dims).
MAX_TENSORS: Final = 1 << 16
_MAX_DIMS: Final = 4
_MAX_NAME: Final = 1 << 12


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the directory: ``dims`` in ggml order (innermost first; none: a scalar),
    ``offset`` relative to the data section, ``nbytes`` from :data:`GGML_TYPE_SIZES`. Its
    payload is never read."""

    name: str
    ggml_type: int
    dims: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class TensorDirectory:
    """A GGUF file's tensor directory (:func:`read_tensors`): the header's key/value pairs, the
    data section's absolute start and alignment, and the identity (device, inode, size,
    modification time) of the very file that was read."""

    path: Path
    metadata: dict[str, Value]
    alignment: int
    data_start: int
    file_size: int
    identity: tuple[int, int, int, int]
    tensors: tuple[TensorInfo, ...]

    def span(self, tensor: TensorInfo) -> tuple[int, int]:
        """The absolute ``[start, end)`` of ``tensor``'s bytes in the file."""
        start = self.data_start + tensor.offset
        return start, start + tensor.nbytes


def file_identity(st: os.stat_result) -> tuple[int, int, int, int]:
    """What names one version of a file: device, inode, size and modification time."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def read_tensors(path: Path, *, max_tensors: int = MAX_TENSORS) -> TensorDirectory:
    """The tensor directory of a GGUF (version 2 or 3) file, bounded (module docstring):
    :class:`GgufError` for an unknown ggml type, more than ``max_tensors`` tensors, more than 4
    dims, a misaligned offset or a tensor past the file's end; :class:`OSError` as reading
    raises it."""
    with open(path, "rb", buffering=1 << 16) as f:
        st = os.fstat(f.fileno())
        meta, count = _read_kv(f)
        if count > max_tensors:
            raise GgufError(f"the GGUF header claims {count} tensors (at most {max_tensors} are read)")
        align = meta.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(align, int) or isinstance(align, bool) or align <= 0 or align & (align - 1):
            raise GgufError(f"general.alignment {align!r} is not a power of two")
        tensors = tuple(_tensor_info(f) for _ in range(count))
        data_start = -(-f.tell() // align) * align
    names: set[str] = set()
    for t in tensors:
        if t.name in names:
            raise GgufError(f"tensor {t.name!r} is listed twice")
        names.add(t.name)
        if t.offset % align or data_start + t.offset + t.nbytes > st.st_size:
            raise GgufError(f"tensor {t.name!r} is misaligned or extends past the file's end")
    return TensorDirectory(Path(path), meta, align, data_start, st.st_size, file_identity(st), tensors)


def _tensor_info(f: BinaryIO) -> TensorInfo:
    (size,) = _U64.unpack(_read(f, 8))
    if size > _MAX_NAME:
        raise GgufError("a GGUF tensor name is too long")
    name = _read(f, size).decode("utf-8", "replace")
    (n_dims,) = struct.unpack("<I", _read(f, 4))
    if n_dims > _MAX_DIMS:
        raise GgufError(f"tensor {name!r} has {n_dims} dims")
    dims = struct.unpack(f"<{n_dims}Q", _read(f, 8 * n_dims))
    kind, offset = struct.unpack("<IQ", _read(f, 12))
    sizes = GGML_TYPE_SIZES.get(kind)
    if sizes is None:
        raise GgufError(f"tensor {name!r} has ggml type {kind}, which is not known here")
    block, block_bytes = sizes
    elements = 1
    for d in dims:
        elements *= d
    if dims and dims[0] % block:
        raise GgufError(f"tensor {name!r} has rows that are not whole blocks of its type")
    return TensorInfo(name, kind, tuple(dims), offset, elements // block * block_bytes)


def _int(meta: dict[str, Value], key: str) -> int | None:
    value = meta.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def trained_context(meta: dict[str, Value]) -> int | None:
    """``<arch>.context_length``: the context the model was trained for."""
    arch = meta.get("general.architecture")
    return _int(meta, f"{arch}.context_length") if isinstance(arch, str) else None


#: Bytes per block and elements per block of each KV cache type llama-server takes
#: (``--cache-type-k``/``--cache-type-v``; ggml's type sizes).
CACHE_TYPE_BYTES: Final = {
    "f32": (4, 1),
    "f16": (2, 1),
    "bf16": (2, 1),
    "q8_0": (34, 32),
    "q4_0": (18, 32),
    "q4_1": (20, 32),
    "iq4_nl": (18, 32),
    "q5_0": (22, 32),
    "q5_1": (24, 32),
}
#: The sliding-window layer period of architectures whose header leaves it out: of every
#: ``period`` layers the last has full attention, the others a window (llama.cpp's loaders).
_SWA_PERIODS: Final = {"gemma2": 2, "gemma3": 6, "cohere2": 4, "llama4": 4, "gpt-oss": 2, "exaone4": 4}
#: llama4's attention chunk when its header names none (llama.cpp's loader).
_LLAMA4_CHUNK: Final = 8192


@dataclass(frozen=True)
class KvShape:
    """What sizes a model's KV cache, from its header: ``layers`` of ``kv_heads`` heads of
    ``key_length``/``value_length`` elements; ``window_layers`` of them attend a sliding
    ``window`` of tokens (0: none)."""

    layers: int
    kv_heads: int
    key_length: int
    value_length: int
    window: int = 0
    window_layers: int = 0


def kv_shape(meta: dict[str, Value]) -> KvShape | None:
    """The KV shape of a header (``None`` when it lacks the usual attention keys). A model with
    multi-head latent attention (``attention.kv_lora_rank``) caches one latent head per layer.
    Sliding-window layers are counted by the header's ``attention.sliding_window_pattern`` or
    the architecture's known period; an unknown period counts every layer as full."""
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
    latent = _int(meta, f"{arch}.attention.kv_lora_rank")
    if latent is not None:
        kv_heads, key, value = 1, latent + (_int(meta, f"{arch}.rope.dimension_count") or 0), latent
    window = _int(meta, f"{arch}.attention.sliding_window") or _int(meta, f"{arch}.attention.chunk_size")
    if window is None and arch == "llama4":
        window = _LLAMA4_CHUNK
    period = _int(meta, f"{arch}.attention.sliding_window_pattern") or _SWA_PERIODS.get(arch)
    if window is None or period is None:
        return KvShape(layers, kv_heads, key, value)
    windowed = sum(1 for layer in range(layers) if layer % period < period - 1)
    return KvShape(layers, kv_heads, key, value, window, windowed)


def _row_bytes(elements: int, cache_type: str) -> int:
    block_bytes, block = CACHE_TYPE_BYTES.get(cache_type, CACHE_TYPE_BYTES["f32"])
    return -(-elements // block) * block_bytes


def kv_bytes_per_token(meta: dict[str, Value], type_k: str = "f16", type_v: str = "f16") -> int | None:
    """The KV cache bytes one token of context takes in every layer (no sliding window), from
    the header; ``None`` when the header does not say enough. A cache type llama-server's
    table lacks counts as ``f32``."""
    shape = kv_shape(meta)
    if shape is None:
        return None
    return shape.layers * _token_bytes(shape, type_k, type_v)


def _token_bytes(shape: KvShape, type_k: str, type_v: str) -> int:
    """One layer's bytes for one cell."""
    keys = _row_bytes(shape.kv_heads * shape.key_length, type_k)
    return keys + _row_bytes(shape.kv_heads * shape.value_length, type_v)


def kv_cache_bytes(
    shape: KvShape,
    ctx: int,
    parallel: int,
    *,
    type_k: str = "f16",
    type_v: str = "f16",
    swa_full: bool = False,
    unified: bool = False,
    ubatch: int = 512,
) -> int:
    """The KV cache llama-server allocates for ``ctx`` context tokens over ``parallel`` slots
    (module docstring): per slot ``ctx / parallel`` cells for a full-attention layer; for a
    sliding-window one, the window plus a micro-batch (``ubatch``) or the slot's context if that
    is less, rounded up to 256 cells (with ``unified``, one cache of ``window × parallel +
    ubatch``)."""
    parallel = max(parallel, 1)
    full_layers = shape.layers - shape.window_layers
    cells = ctx
    if shape.window_layers and not swa_full:
        if unified:
            window_cells = _pad(min(ctx, shape.window * parallel + ubatch))
        else:
            window_cells = parallel * _pad(min(ctx // parallel, shape.window + ubatch))
    else:
        window_cells = cells
    per_cell = _token_bytes(shape, type_k, type_v)
    return per_cell * (full_layers * cells + shape.window_layers * window_cells)


def _pad(cells: int, to: int = 256) -> int:
    return -(-cells // to) * to


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
