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

``werk_image_generation``: streams ``POST /images`` through the kit's
:func:`~werk_host.plugin.streams.run_streamed` (the worker's one seat, ``work.progress`` per
progress line, ``work.cancelled()`` polled between lines: the stream closed and ``conflict``
raised once true). A worker that dies during the work is ``unavailable`` (retryable): the next
request starts a new worker.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
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
    hookimpl,
)
from werk_host.plugin.checkpoints import DIFFUSERS_INDEX, diffusers_dir
from werk_host.plugin.engines import EngineWorker, started
from werk_host.plugin.http import post_json
from werk_host.plugin.pool import WorkerPool, files_identity
from werk_host.plugin.streams import run_streamed

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
        event = run_streamed(
            self.pool,
            self.slot,
            self._start,
            "/images",
            body,
            label="diffusers",
            cancelled=work.cancelled,
            progress=work.progress,
        )
        try:
            return _result(event)
        except (ValueError, KeyError, TypeError) as err:
            raise WerkError(
                ErrorCode.UNAVAILABLE, "the diffusers worker answered a malformed stream", retryable=True
            ) from err


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
