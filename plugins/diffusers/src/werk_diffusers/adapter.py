"""The diffusers adapter: one deployment instance of a Diffusers folder, served by the plugin's
ONE resident worker (the kit's :class:`~werk_host.plugin.engines.EngineWorker` with
``per_model = False``: every model of the backend shares the worker, which keeps a bounded LRU
of pipelines keyed by each model's files identity; docs/diffusers.md).

What it claims, each from evidence (docs/plugin-kit.md, "Capabilities" and "Engine workers"):
``runtime.model_residency`` and ``media.image.txt2img`` are ``supported`` while the live worker
answers ``/pipelines`` with this model's pipeline loaded, ``unavailable`` otherwise (the next
request loads it); ``media.image.img2img`` likewise, ``unsupported`` when the loaded pipeline
has no image-to-image form.

``werk_image_limits`` (cheap: reads ``model_index.json`` and ``unet/config.json``, starts
nothing): the samplers :data:`SAMPLERS` (AUTOMATIC1111's names), default ``Euler a``, 20 steps,
the UNet's ``sample_size`` times the VAE's scale factor as the default size (512 when unknown),
image-to-image for the pipeline classes in :data:`IMG2IMG_CLASSES`.

``werk_image_generation``: holds the worker's one seat, streams ``POST /images`` (the worker's
NDJSON lines) and calls ``work.progress`` per progress line; between lines it polls
``work.cancelled()`` and, once true, closes the stream (the worker stops at its next step) and
raises ``conflict`` ("cancelled"). A worker that dies during the work is ``unavailable``
(retryable): the next request starts a new worker.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from werk_host.plugin import (
    CapabilityId,
    CapabilityReport,
    CapabilityStatus,
    ErrorCode,
    HostConfig,
    ImageLimits,
    ImageMode,
    ImageResult,
    ImageWork,
    ModelManifest,
    WerkError,
    client_disconnected,
    hookimpl,
)
from werk_host.plugin.checkpoints import DIFFUSERS_INDEX, diffusers_dir
from werk_host.plugin.engines import EngineWorker, started
from werk_host.plugin.http import BackendCut, ClientGone, forward, post_json
from werk_host.plugin.pool import WorkerPool, files_identity

from .settings import PYTHON_ENV, Settings, cache_size, parse_options

__all__ = [
    "BACKEND_ID",
    "IMG2IMG_CLASSES",
    "REPORTED",
    "SAMPLERS",
    "DiffusersAdapter",
    "accepts",
    "create_adapter",
]

BACKEND_ID = "diffusers"
WORKER = Path(__file__).with_name("worker.py")
#: One resident worker per host (per interpreter and runtime settings); it holds the pipelines.
POOL = WorkerPool(lambda: 1)
REPORTED = (CapabilityId.MODEL_RESIDENCY, CapabilityId.IMAGE_TXT2IMG, CapabilityId.IMAGE_IMG2IMG)
#: The sampler names the worker maps to diffusers schedulers (worker.py's ``SAMPLERS``).
SAMPLERS = ("Euler", "Euler a", "DDIM", "PNDM", "PLMS", "DPM++ 2M", "LMS", "Heun")
DEFAULT_SAMPLER = "Euler a"
DEFAULT_STEPS = 20
DEFAULT_SIZE = 512
#: Pipeline classes (``model_index.json``'s ``_class_name``) that
#: ``AutoPipelineForImage2Image.from_pipe`` turns into image-to-image.
IMG2IMG_CLASSES = frozenset(
    {
        "StableDiffusionPipeline",
        "StableDiffusionImg2ImgPipeline",
        "StableDiffusionXLPipeline",
        "StableDiffusionXLImg2ImgPipeline",
        "StableDiffusion3Pipeline",
        "StableDiffusion3Img2ImgPipeline",
        "LatentConsistencyModelPipeline",
        "LatentConsistencyModelImg2ImgPipeline",
        "FluxPipeline",
        "FluxImg2ImgPipeline",
    }
)
MAX_JSON_BYTES = 1 << 20
MAX_LINE_BYTES = 256 << 20


def _small_json(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as source:
            raw = source.read(MAX_JSON_BYTES + 1)
        doc = json.loads(raw) if len(raw) <= MAX_JSON_BYTES else None
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def read_limits(directory: Path) -> ImageLimits:
    """What the folder's pipeline accepts (module docstring), from its config files alone."""
    index = _small_json(directory / DIFFUSERS_INDEX)
    unet = _small_json(directory / "unet" / "config.json")
    vae = _small_json(directory / "vae" / "config.json")
    size = DEFAULT_SIZE
    sample = unet.get("sample_size")
    blocks = vae.get("block_out_channels")
    if isinstance(sample, int) and not isinstance(sample, bool) and sample > 0:
        factor = 2 ** (len(blocks) - 1) if isinstance(blocks, list) and blocks else 8
        size = sample * factor
    return ImageLimits(
        samplers=list(SAMPLERS),
        default_sampler=DEFAULT_SAMPLER,
        default_steps=DEFAULT_STEPS,
        default_size=size,
        img2img=index.get("_class_name") in IMG2IMG_CLASSES,
    )


def _lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """The NDJSON lines of a streamed body, as they complete."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if line.strip():
                yield line
        if len(pending) > MAX_LINE_BYTES:
            raise ValueError("a line of the worker's stream is too long")
    if pending.strip():
        yield pending


class DiffusersAdapter(EngineWorker):
    backend = BACKEND_ID
    label = "diffusers"
    python_env = PYTHON_ENV
    key_env = "WERK_DIFFUSERS_WORKER_KEY"
    worker = WORKER
    pool = POOL
    per_model = False

    def __init__(self, config: HostConfig, manifest: ModelManifest, settings: Settings, directory: Path) -> None:
        self.settings = settings
        #: The pipeline's key in the worker's LRU: the exact files (docs/diffusers.md).
        self.model_identity = files_identity(manifest)
        self.limits = read_limits(directory)
        super().__init__(
            config,
            manifest,
            directory,
            python=settings.python,
            startup_timeout=settings.startup_timeout,
            runtime=(settings.device, settings.threads),
        )

    def worker_args(self) -> list[str]:
        settings = self.settings
        return ["--device", settings.device, "--threads", str(settings.threads), "--pipelines", str(cache_size())]

    # -- evidence -----------------------------------------------------------------------------
    def loaded_pipelines(self) -> list[dict[str, Any]] | None:
        """The live worker's ``/pipelines`` answer (most recently used last); ``None`` when no
        worker is alive or it does not answer. Starts nothing."""
        current = self.slot.started
        if current is None or not current.run.alive():
            return None
        try:
            answer = post_json(current.pool, "/pipelines", {})
        except WerkError:
            return None
        loaded = answer.get("loaded")
        return [e for e in loaded if isinstance(e, dict)] if isinstance(loaded, list) else None

    @hookimpl(specname="werk_capabilities")
    def capabilities(self) -> dict[CapabilityId, CapabilityReport]:
        loaded = self.loaded_pipelines()
        entry = next((e for e in loaded or [] if e.get("identity") == self.model_identity), None)
        if entry is None:
            why = (
                "no live diffusers worker" if loaded is None else "the live worker does not hold this model's pipeline"
            )
            absent = CapabilityReport(CapabilityStatus.UNAVAILABLE, f"{why}; the next request loads it")
            return {
                CapabilityId.MODEL_RESIDENCY: absent,
                CapabilityId.IMAGE_TXT2IMG: absent,
                CapabilityId.IMAGE_IMG2IMG: absent,
            }
        kind = str(entry.get("class", "pipeline"))
        here = CapabilityReport(CapabilityStatus.SUPPORTED, f"{kind} is loaded in the live diffusers worker")
        img2img = (
            CapabilityReport(CapabilityStatus.SUPPORTED, f"{kind} is loaded with its image-to-image form")
            if entry.get("img2img") is True
            else CapabilityReport(CapabilityStatus.UNSUPPORTED, f"{kind} has no image-to-image form")
        )
        return {
            CapabilityId.MODEL_RESIDENCY: here,
            CapabilityId.IMAGE_TXT2IMG: here,
            CapabilityId.IMAGE_IMG2IMG: img2img,
        }

    # -- media hooks (docs/plugin-hooks.md) ---------------------------------------------------------
    @hookimpl(specname="werk_image_limits")
    def image_limits(self) -> ImageLimits:
        return self.limits

    def request_body(self, work: ImageWork) -> dict[str, Any]:
        """The worker's ``/images`` body for ``work`` (invalid_request for what it cannot run)."""
        request = work.request
        sampler = request.sampler or self.limits.default_sampler
        if sampler not in SAMPLERS:
            raise WerkError(ErrorCode.INVALID_REQUEST, f"unknown sampler (known: {', '.join(SAMPLERS)})")
        img2img = request.mode is ImageMode.IMG2IMG
        if img2img and not self.limits.img2img:
            raise WerkError(ErrorCode.INVALID_REQUEST, f"model {self.manifest.name} cannot do image-to-image")
        seed = request.seed if request.seed is not None else secrets.randbelow(2**32)
        return {
            "model_dir": str(self.directory),
            "identity": self.model_identity,
            "mode": "img2img" if img2img else "txt2img",
            "prompt": request.prompt,
            "negative_prompt": request.negative_prompt,
            "width": request.width,
            "height": request.height,
            "steps": request.steps or self.limits.default_steps,
            "guidance_scale": request.guidance_scale,
            "seed": seed,
            "sampler": sampler,
            "n": request.n,
            "init_image": base64.b64encode(request.init_image).decode() if request.init_image is not None else None,
            "strength": request.strength,
        }

    @hookimpl(specname="werk_image_generation")
    def generate_image(self, work: ImageWork) -> ImageResult:
        body = self.request_body(work)
        if work.cancelled():
            raise WerkError(ErrorCode.CONFLICT, "cancelled")
        outer = client_disconnected.get()

        def gone() -> bool:
            return work.cancelled() or (outer is not None and outer())

        token = client_disconnected.set(gone)  # the seat's wait and the first byte's give up on it
        try:
            with self.pool.use(self.slot, self._start) as current, self.slot.hold():
                response = forward(current.pool, "/images", body)
                try:
                    return self._read(response.status, response.body, work)
                finally:
                    response.close()
        except (ClientGone, WerkError) as err:
            if work.cancelled() and not isinstance(err, BackendCut):
                raise WerkError(ErrorCode.CONFLICT, "cancelled") from err
            raise
        finally:
            client_disconnected.reset(token)

    def _read(self, status: int, chunks: Iterator[bytes], work: ImageWork) -> ImageResult:
        if status != 200:
            raw = b"".join(chunks)[:4096]
            message = ""
            with contextlib.suppress(ValueError, AttributeError):
                message = str(json.loads(raw).get("error", {}).get("message", ""))[:300]
            if status == 400:
                raise WerkError(ErrorCode.INVALID_REQUEST, f"the diffusers worker refused the request: {message}")
            raise WerkError(
                ErrorCode.UNAVAILABLE, f"the diffusers worker could not run the pipeline ({status})", retryable=True
            )
        try:
            for line in _lines(chunks):
                if work.cancelled():
                    raise WerkError(ErrorCode.CONFLICT, "cancelled")
                event = json.loads(line)
                kind = event.get("event") if isinstance(event, dict) else None
                if kind == "progress":
                    work.progress(int(event["step"]), int(event["steps"]))
                elif kind == "result":
                    return _result(event)
                elif kind == "cancelled":
                    raise WerkError(ErrorCode.CONFLICT, "cancelled")
                elif kind == "error":
                    _raise_error(event)
        except BackendCut as err:
            raise _stopped() from err
        except (ValueError, KeyError, TypeError) as err:
            raise WerkError(
                ErrorCode.UNAVAILABLE, "the diffusers worker answered a malformed stream", retryable=True
            ) from err
        raise _stopped()


def _stopped() -> WerkError:
    return WerkError(ErrorCode.UNAVAILABLE, "the diffusers worker stopped during the generation", retryable=True)


def _raise_error(event: dict[str, Any]) -> None:
    kind, message = str(event.get("type", "")), str(event.get("message", ""))[:300]
    if kind in ("ValueError", "TypeError", "KeyError"):
        raise WerkError(ErrorCode.INVALID_REQUEST, f"the diffusers pipeline refused the request: {message}")
    raise WerkError(ErrorCode.UNAVAILABLE, f"the diffusers pipeline failed ({kind}): {message}", retryable=True)


def _result(event: dict[str, Any]) -> ImageResult:
    try:
        images = [base64.b64decode(i, validate=True) for i in event["images"]]
    except (binascii.Error, TypeError) as err:
        raise ValueError("bad image") from err
    seeds = [int(s) for s in event["seeds"]]
    info = event.get("info")
    return ImageResult(images=images, seeds=seeds, info=info if isinstance(info, dict) else {})


def accepts(manifest: ModelManifest | None) -> bool:
    """A manifest pinned to this backend, or an unpinned Diffusers folder (``model_index.json``
    with its components in subfolders; no other installed backend takes one)."""
    if manifest is None:
        return False
    if manifest.backend is not None:
        return manifest.backend == BACKEND_ID
    return diffusers_dir(manifest) is not None


def create_adapter(config: HostConfig, manifest: ModelManifest | None) -> DiffusersAdapter:
    if manifest is None:
        raise WerkError(ErrorCode.INVALID_REQUEST, "the diffusers backend needs a model")
    directory = diffusers_dir(manifest)
    if directory is None:
        raise WerkError(
            ErrorCode.INVALID_REQUEST,
            f"model {manifest.name} is not a Diffusers folder (model_index.json and its subfolders)",
        )
    try:
        settings = parse_options(config.backend_options.get(BACKEND_ID, {}))
        cache_size()
    except ValueError as err:
        raise WerkError(ErrorCode.INVALID_REQUEST, f"diffusers options: {err}") from err
    return started(DiffusersAdapter(config, manifest, settings, directory))
