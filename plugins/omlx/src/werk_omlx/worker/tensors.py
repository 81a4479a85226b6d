"""Where each expert's tensors lie in a checkpoint's safetensors files, and reading them with ``pread``.

A safetensors file is an 8-byte little-endian header length, a JSON header naming every
tensor's dtype, shape and ``data_offsets`` (relative to the end of the header), then the data.
:func:`read_index` parses the headers of a model's ``*.safetensors`` files (nothing else is
read); :class:`TensorFiles` keeps one read-only descriptor per file and reads a byte range with
``os.pread`` straight into a new MLX array, so an expert is loaded without mapping or touching
the rest of the file.

Two expert layouts are recognised (:func:`expert_slices`):

* **stacked** (what mlx-lm's ``convert`` writes, and every quantized MLX model):
  ``<switch>.<proj>.<part>`` with shape ``[num_experts, …]``; expert ``e`` is the ``e``-th
  contiguous row block;
* **per-expert** (Hugging Face float checkpoints, which mlx-lm stacks when loading):
  ``<parent>.experts.<e>.<proj>.weight`` where ``<switch>`` is ``<parent>.switch_mlp``.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

#: safetensors dtype → (numpy dtype the bytes are read as, MLX dtype they are viewed as).
DTYPES: dict[str, tuple[type[np.generic], mx.Dtype]] = {
    "F32": (np.float32, mx.float32),
    "F16": (np.float16, mx.float16),
    "BF16": (np.uint16, mx.bfloat16),
    "U32": (np.uint32, mx.uint32),
    "I32": (np.int32, mx.int32),
    "U8": (np.uint8, mx.uint8),
    "I8": (np.int8, mx.int8),
}
MAX_HEADER_BYTES = 100 * 1024 * 1024


class LayoutError(ValueError):
    """The checkpoint's expert tensors are not in a layout this module reads."""


@dataclass(frozen=True)
class TensorRef:
    """One tensor of a safetensors file: absolute byte ``offset`` and ``nbytes`` in ``file``."""

    file: str
    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Slice:
    """A byte range of ``file`` holding one tensor of ``shape`` (one expert's part)."""

    file: str
    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]


def read_header(path: Path) -> dict[str, TensorRef]:
    """The tensors of one safetensors file (its header only is read)."""
    with path.open("rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise LayoutError(f"{path.name} is not a safetensors file")
        (length,) = struct.unpack("<Q", raw)
        if length > MAX_HEADER_BYTES:
            raise LayoutError(f"{path.name} has an implausible header")
        header = json.loads(f.read(length))
    base = 8 + length
    refs: dict[str, TensorRef] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        start, end = entry["data_offsets"]
        refs[name] = TensorRef(
            str(path), base + int(start), int(end) - int(start), str(entry["dtype"]), tuple(entry["shape"])
        )
    return refs


def read_index(model_dir: Path) -> dict[str, TensorRef]:
    """Every tensor of ``model_dir``'s ``*.safetensors`` files, by name."""
    index: dict[str, TensorRef] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        index.update(read_header(path))
    return index


def expert_slices(
    index: dict[str, TensorRef], switch: str, parts: dict[str, tuple[int, ...]], num_experts: int
) -> list[dict[str, Slice]]:
    """For each expert of the switch module at ``switch``, the slice of every part.

    ``parts`` maps a part name relative to the module (``gate_proj.weight``, ``up_proj.scales``,
    …) to the stacked shape mlx-lm expects (``[num_experts, …]``). Raises :class:`LayoutError`
    when a part is in neither layout or its size disagrees with that shape."""
    experts: list[dict[str, Slice]] = [{} for _ in range(num_experts)]
    parent = switch.removesuffix(".switch_mlp")
    for part, shape in parts.items():
        if shape[0] != num_experts:
            raise LayoutError(f"{switch}.{part} does not have one row block per expert")
        stacked = index.get(f"{switch}.{part}")
        if stacked is not None:
            if stacked.shape != shape or stacked.dtype not in DTYPES or stacked.nbytes % num_experts:
                raise LayoutError(f"{switch}.{part} has an unexpected shape or dtype")
            step = stacked.nbytes // num_experts
            for e in range(num_experts):
                experts[e][part] = Slice(stacked.file, stacked.offset + e * step, step, stacked.dtype, shape[1:])
            continue
        proj, _, leaf = part.rpartition(".")
        if parent == switch or leaf != "weight":
            raise LayoutError(f"{switch}.{part} is not in the checkpoint")
        for e in range(num_experts):
            ref = index.get(f"{parent}.experts.{e}.{proj}.weight")
            if ref is None or ref.shape != shape[1:] or ref.dtype not in DTYPES:
                raise LayoutError(f"expert {e} of {switch} has no usable {proj} weight")
            experts[e][part] = Slice(ref.file, ref.offset, ref.nbytes, ref.dtype, ref.shape)
    return experts


class TensorFiles:
    """Read-only descriptors of a checkpoint's files; :meth:`read` loads one slice."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}

    def _fd(self, file: str) -> int:
        fd = self._fds.get(file)
        if fd is None:
            fd = os.open(file, os.O_RDONLY | os.O_CLOEXEC)
            self._fds[file] = fd
        return fd

    def read(self, piece: Slice) -> mx.array:
        """The slice's bytes as an MLX array (one ``pread``; a short read is an error)."""
        raw = os.pread(self._fd(piece.file), piece.nbytes, piece.offset)
        if len(raw) != piece.nbytes:
            raise OSError(f"short read of an expert tensor ({len(raw)} of {piece.nbytes} bytes)")
        np_dtype, mx_dtype = DTYPES[piece.dtype]
        array = mx.array(np.frombuffer(raw, dtype=np_dtype).reshape(piece.shape))
        return array.view(mx_dtype) if array.dtype != mx_dtype else array

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
