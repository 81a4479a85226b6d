"""A reference media backend: the seam's image hooks in pure Python, for fast host tests and as
the smallest media adapter a plugin author can read (docs/media.md, "Writing a media backend").

:class:`ReferenceMediaPlugin` offers one factory, backend ``refmedia``, that serves any
manifest pinned to it. Its adapter "generates" an image from a hash of the exact request
(prompt, negative prompt, size, steps, guidance, sampler, strength, the init image's bytes and
the image's seed ``seed + i``), so the same request gives the same PNG bytes and a change to
any field gives others, as a real pipeline does. It reports progress after every step and stops
at the next step once cancelled, raising ``conflict``; ``step_delay_s`` (a manifest param) makes
each step last that long, for tests that cancel or kill mid-job. ``fail_after`` (a plugin
attribute) makes the next generation fail after that many steps with the plugin's ``failure``
(default ``unavailable``, as a worker that died would).
"""

from __future__ import annotations

import hashlib
import struct
import threading
import time
import zlib
from dataclasses import dataclass, field

from pydantic import JsonValue

from werk_host import hookimpl
from werk_host.config import HostConfig
from werk_host.errors import ErrorCode, WerkError
from werk_host.models import ModelManifest
from werk_host.protocol.base import CapabilityStatus
from werk_host.protocol.discovery import CapabilityId
from werk_host.protocol.media import ImageLimits, ImageRequest, ImageResult
from werk_host.seam import AdapterFactory, CapabilityReport, ImageWork

__all__ = ["MEDIA_BACKEND", "ReferenceMediaAdapter", "ReferenceMediaPlugin", "png", "reference_image"]

MEDIA_BACKEND = "refmedia"
SAMPLERS = ("Euler", "Euler a", "DDIM")


def png(width: int, height: int, rgb: bytes) -> bytes:
    """An 8-bit RGB PNG of ``rgb`` (``width * height * 3`` bytes), byte-for-byte deterministic."""

    def part(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + rgb[y * width * 3 : (y + 1) * width * 3] for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + part(b"IHDR", header) + part(b"IDAT", zlib.compress(rows, 6)) + part(b"IEND", b"")


def reference_image(request: ImageRequest, seed: int) -> bytes:
    """The reference backend's image for ``request`` with ``seed`` (module docstring)."""
    key = hashlib.sha256()
    init = hashlib.sha256(request.init_image).hexdigest() if request.init_image is not None else ""
    fields = (request.prompt, request.negative_prompt, request.width, request.height, request.steps)
    for value in (*fields, request.guidance_scale, request.sampler, request.strength, init, seed):
        key.update(repr(value).encode() + b"\x00")
    size = request.width * request.height * 3
    stream = bytearray()
    block = key.digest()
    while len(stream) < size:
        block = hashlib.sha256(block).digest()
        stream += block
    return png(request.width, request.height, bytes(stream[:size]))


@dataclass
class ReferenceMediaAdapter:
    """One instance of a ``refmedia`` model (module docstring)."""

    plugin: ReferenceMediaPlugin
    manifest: ModelManifest
    backend: str = MEDIA_BACKEND
    instance_id: str = ""
    generation: int = 0
    runs: int = 0
    closed: bool = False

    def __post_init__(self) -> None:
        self.instance_id = f"{MEDIA_BACKEND}:{self.manifest.name}"

    def identity(self) -> str:
        return f"{self.instance_id}#{self.generation}"

    def restart(self) -> None:
        self.generation += 1

    def close(self) -> None:
        self.closed = True

    @hookimpl(specname="werk_capabilities")
    def capabilities(self) -> dict[CapabilityId, CapabilityReport]:
        loaded = "the reference generator is in this process"
        return {
            CapabilityId.IMAGE_TXT2IMG: CapabilityReport(CapabilityStatus.SUPPORTED, loaded),
            CapabilityId.IMAGE_IMG2IMG: CapabilityReport(CapabilityStatus.SUPPORTED, loaded),
        }

    @hookimpl(specname="werk_image_limits")
    def image_limits(self) -> ImageLimits:
        return ImageLimits(samplers=list(SAMPLERS), default_sampler="Euler a", default_steps=4, img2img=True)

    @hookimpl(specname="werk_image_generation")
    def generate_image(self, work: ImageWork) -> ImageResult:
        request = work.request
        assert request.seed is not None and request.steps is not None, "the host fills seed and steps"
        delay = self.manifest.params.get("step_delay_s", 0)
        steps = request.steps * request.n
        with self.plugin.lock:  # one generation at a time, as a real worker
            self.runs += 1
            for step in range(1, steps + 1):
                if work.cancelled():
                    raise WerkError(ErrorCode.CONFLICT, "cancelled")
                if isinstance(delay, int | float) and delay > 0:
                    time.sleep(delay)
                if self.plugin.fail_after is not None and step > self.plugin.fail_after:
                    self.plugin.fail_after = None
                    self.generation += 1  # "a new worker" for the next request
                    raise self.plugin.failure
                work.progress(step, steps)
            images = [reference_image(request, request.seed + i) for i in range(request.n)]
        info: dict[str, JsonValue] = {"sampler": request.sampler, "steps": request.steps, "pipeline": "reference"}
        return ImageResult(images=images, seeds=[request.seed + i for i in range(request.n)], info=info)


@dataclass
class ReferenceMediaPlugin:
    """The plugin object (register it as ``PLUGIN_NAME``)."""

    PLUGIN_NAME: str = MEDIA_BACKEND
    adapters: list[ReferenceMediaAdapter] = field(default_factory=list)
    fail_after: int | None = None
    failure: WerkError = field(
        default_factory=lambda: WerkError(ErrorCode.UNAVAILABLE, "the reference worker stopped", retryable=True)
    )
    lock: threading.Lock = field(default_factory=threading.Lock)

    def create(self, config: HostConfig, model: ModelManifest | None) -> ReferenceMediaAdapter:
        if model is None:
            raise WerkError(ErrorCode.INVALID_REQUEST, "the reference media backend needs a model")
        adapter = ReferenceMediaAdapter(self, model)
        self.adapters.append(adapter)
        return adapter

    @hookimpl
    def werk_adapter_factories(self, config: HostConfig) -> list[AdapterFactory]:
        return [
            AdapterFactory(
                MEDIA_BACKEND,
                lambda m: m is not None and m.backend == MEDIA_BACKEND,
                self.create,
                "reference images from a hash of the request (tests)",
                (CapabilityId.IMAGE_TXT2IMG, CapabilityId.IMAGE_IMG2IMG),
            )
        ]
