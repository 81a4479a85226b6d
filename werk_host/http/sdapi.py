"""AUTOMATIC1111's (stable-diffusion-webui) ``/sdapi/v1`` routes (docs/media.md, "AUTOMATIC1111").

The fields A1111 clients send (the PyPI ``webuiapi`` client, web UIs) become one
:class:`~werk_host.protocol.media.ImageRequest` run through
:class:`~werk_host.service.media.MediaService` (werk_host/http/media.py: the same bounds, gate
and backends as every image route). Keys as on ``/v1``: ``Authorization: Bearer KEY``, or
HTTP Basic with the key as password (A1111's ``--api-auth``). Here:

* ``POST /sdapi/v1/txt2img`` and ``POST /sdapi/v1/img2img`` answer A1111's
  ``{"images": [base64 PNG], "parameters": {...}, "info": "<JSON text>"}`` synchronously.
  Mapped: ``prompt``, ``negative_prompt``, ``width``/``height`` (absent: the backend's default
  size), ``steps`` (absent: the backend's default), ``cfg_scale`` → ``guidance_scale``,
  ``seed`` (``-1``: drawn), ``sampler_name`` (else ``sampler_index``; neither: the backend's
  default), ``batch_size`` × ``n_iter`` images (the product at most the media bound; image *i*
  has seed ``seed + i``, as in A1111), ``send_images`` (``false``: no images),
  ``override_settings`` (the options below for this request; ``sd_model_checkpoint`` picks the
  model, kept for the key when ``override_settings_restore_afterwards`` is ``false``). img2img
  adds ``init_images`` (base64, a ``data:`` URL prefix allowed; one image, or the first when
  one image is asked for: A1111 cycles them over a batch), ``denoising_strength`` → ``strength``,
  ``include_init_images``.
  Fields that ask for what no Werk backend does are refused (400) unless they have their
  neutral value: ``enable_hr``, ``restore_faces``, ``tiling``, ``styles``, ``script_name``,
  ``alwayson_scripts``, ``subseed_strength``, ``seed_resize_from_*``, ``refiner_checkpoint``,
  ``infotext``, ``save_images`` (the host keeps no image files), sampler tuning (``eta`` 0 or
  1, ``s_churn``/``s_tmin``/``s_tmax``/``s_min_uncond`` 0, ``s_noise`` 1), ``scheduler``
  (``automatic``); img2img's ``mask``/``latent_mask`` (no inpainting), ``resize_mode`` (0),
  ``initial_noise_multiplier`` (1). Fields that only act with one of those (``hr_*``, the
  inpainting knobs, ``subseed``, ``script_args``, ...) are accepted and ignored, as A1111 does;
  unknown fields are ignored, as A1111's request models do (pydantic's default
  ``extra="ignore"``). ``parameters`` echoes the known fields (A1111's defaults filled in; the
  init images only with ``include_init_images``); ``info`` carries ``seed``, ``all_seeds``,
  ``sampler_name``, ``steps``, ``cfg_scale``, ``width``, ``height``, ``sd_model_name``,
  ``sd_model_hash``, ``infotexts`` and the rest of A1111's ``Processed.js()`` that applies.
* ``GET /sdapi/v1/sd-models``: the media instances (``title`` and ``model_name`` are the
  instance id, ``filename`` the model's name, never a path; ``hash``/``sha256`` the weights'
  digest). ``GET /sdapi/v1/samplers``: the caller's model's samplers (``aliases`` empty: only
  the names are accepted). ``GET``/``POST /sdapi/v1/options``: ``sd_model_checkpoint`` (the
  model selected **for the calling key**, in memory, never another key's; an unknown one is
  404), ``sd_checkpoint_hash`` (derived, ignored on POST), and the fixed ``samples_format``
  (``png``), ``sd_vae`` (``Automatic``/``None``: the model's own), ``CLIP_stop_at_last_layers``
  (1), ``eta_noise_seed_delta`` (0); setting one of those to another value, or any other
  option, is 400 (A1111 would store it and act on it; this host can't). The POST answers
  ``null``, as A1111's.
* ``GET /sdapi/v1/progress``: the caller's own running generations (any route's: jobs and
  Comfy prompts too), A1111's formula (``progress`` 0.01 + step/steps over ``job_count``,
  ``eta_relative``, ``state``), ``current_image`` always ``null``. ``POST /sdapi/v1/interrupt``
  cancels the caller's running generations only and answers ``{}``. An interrupted
  txt2img/img2img answers 409 (``cancelled``): A1111 returns the partly denoised images with
  200, but Werk's backends stop without an image, and an empty 200 would read as success.
  ``/sdapi/v1/skip`` (skip one image of a batch) is not served: no backend can skip one image.
* Errors use A1111's ``api_middleware`` shape (modules/api/api.py, ``handle_exception``, which
  answers every ``HTTPException`` the API raises): ``{"error": "HTTPException", "detail":
  message, "body": "", "errors": "STATUS: message"}``; the message is the error's public one.
  Everything is validated before any generation runs.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import falcon

from werk_host.errors import ErrorCode, WerkError
from werk_host.http.io import json_body, principal
from werk_host.http.media import run_image
from werk_host.protocol.media import MAX_IMAGE_BATCH, ImageMode, ImageResult
from werk_host.service.jobs import JobService, image_request
from werk_host.service.media import MediaService, Prepared
from werk_host.service.principals import Principal

if TYPE_CHECKING:
    from werk_host.deployments.instances import Instance

__all__ = ["add_routes", "render_error"]

PREFIX: Final = "/sdapi/v1"
_TITLE_HASH = re.compile(r" \[[0-9a-fA-F]{8,64}\]$")

#: A1111's defaults of the fields both generation routes know (StableDiffusionProcessing).
_COMMON: Final[dict[str, Any]] = {
    "prompt": "", "negative_prompt": None, "styles": None, "seed": -1, "subseed": -1,
    "subseed_strength": 0, "seed_resize_from_h": -1, "seed_resize_from_w": -1, "sampler_name": None,
    "scheduler": None, "batch_size": 1, "n_iter": 1, "steps": None, "cfg_scale": 7.0, "width": None,
    "height": None, "restore_faces": None, "tiling": None, "do_not_save_samples": False,
    "do_not_save_grid": False, "eta": None, "s_min_uncond": None, "s_churn": None, "s_tmax": None,
    "s_tmin": None, "s_noise": None, "override_settings": None, "override_settings_restore_afterwards": True,
    "refiner_checkpoint": None, "refiner_switch_at": None, "disable_extra_networks": False,
    "firstpass_image": None, "comments": None, "sampler_index": "Euler", "script_name": None,
    "script_args": [], "send_images": True, "save_images": False, "alwayson_scripts": {},
    "force_task_id": None, "infotext": None,
}  # fmt: skip
_TXT2IMG: Final[dict[str, Any]] = {
    **_COMMON, "enable_hr": False, "denoising_strength": 0.75, "firstphase_width": 0, "firstphase_height": 0,
    "hr_scale": 2.0, "hr_upscaler": None, "hr_second_pass_steps": 0, "hr_resize_x": 0, "hr_resize_y": 0,
    "hr_checkpoint_name": None, "hr_sampler_name": None, "hr_scheduler": None, "hr_prompt": "",
    "hr_negative_prompt": "",
}  # fmt: skip
_IMG2IMG: Final[dict[str, Any]] = {
    **_COMMON, "init_images": None, "resize_mode": 0, "denoising_strength": 0.75, "image_cfg_scale": None,
    "mask": None, "mask_blur_x": 4, "mask_blur_y": 4, "mask_blur": None, "mask_round": True,
    "inpainting_fill": 0, "inpaint_full_res": True, "inpaint_full_res_padding": 0, "inpainting_mask_invert": 0,
    "initial_noise_multiplier": None, "latent_mask": None, "include_init_images": False,
}  # fmt: skip


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _off(value: object) -> bool:
    return value is None or value is False


def _empty(value: object) -> bool:
    return value is None or (isinstance(value, str | list | dict) and not value)


def _one_of(*allowed: float) -> Callable[[object], bool]:
    return lambda value: value is None or (_number(value) and value in allowed)


def _word(*allowed: str) -> Callable[[object], bool]:
    return lambda value: value is None or (isinstance(value, str) and value.lower() in allowed)


#: Fields refused unless neutral: (check, what the refusal says).
_NEUTRAL: Final[dict[str, tuple[Callable[[object], bool], str]]] = {
    "styles": (_empty, "prompt styles (styles) are not supported: put their text in the prompt"),
    "subseed_strength": (_one_of(0), "variation seeds (subseed_strength) are not supported"),
    "seed_resize_from_h": (_one_of(-1, 0), "seed resizing (seed_resize_from_h) is not supported"),
    "seed_resize_from_w": (_one_of(-1, 0), "seed resizing (seed_resize_from_w) is not supported"),
    "restore_faces": (_off, "face restoration (restore_faces) is not supported"),
    "tiling": (_off, "tiling is not supported"),
    "script_name": (_empty, "scripts (script_name) are not supported"),
    "alwayson_scripts": (_empty, "extensions (alwayson_scripts) are not supported"),
    "refiner_checkpoint": (_word("", "none"), "refiner models (refiner_checkpoint) are not supported"),
    "infotext": (_empty, "infotext is not supported: send the fields themselves"),
    "save_images": (_off, "save_images is not supported: this host keeps no image files (send_images returns them)"),
    "eta": (_one_of(0, 1), "eta must be 0 or 1: the backend's sampler keeps its own"),
    "s_churn": (_one_of(0), "sampler tuning (s_churn) is not supported"),
    "s_tmin": (_one_of(0), "sampler tuning (s_tmin) is not supported"),
    "s_tmax": (_one_of(0), "sampler tuning (s_tmax) is not supported"),
    "s_min_uncond": (_one_of(0), "sampler tuning (s_min_uncond) is not supported"),
    "s_noise": (_one_of(1), "sampler tuning (s_noise) is not supported"),
    "scheduler": (_word("", "automatic"), 'scheduler must be "automatic": the sampler chooses its schedule'),
    "enable_hr": (_off, "hires fix (enable_hr) is not supported: ask for the final size"),
    "mask": (_empty, "masks (inpainting) are not supported"),
    "latent_mask": (_empty, "masks (inpainting) are not supported"),
    "resize_mode": (_one_of(0), "resize_mode must be 0 (just resize)"),
    "initial_noise_multiplier": (_one_of(1), "initial_noise_multiplier must be 1"),
}
#: The options this host reports, and the values it accepts for each (the first reported).
_FIXED_OPTIONS: Final[dict[str, tuple[object, ...]]] = {
    "samples_format": ("png",),
    "sd_vae": ("Automatic", "None"),
    "CLIP_stop_at_last_layers": (1,),
    "eta_noise_seed_delta": (0,),
}
_DERIVED_OPTIONS: Final = frozenset({"sd_checkpoint_hash"})


def _invalid(message: str) -> WerkError:
    return WerkError(ErrorCode.INVALID_REQUEST, message)


def render_error(resp: falcon.Response, status: int, error: WerkError) -> None:
    """A typed error in A1111's ``api_middleware`` shape (module docstring)."""
    message = error.public_message()
    resp.status = status
    resp.content_type = "application/json"
    if error.code is ErrorCode.UNAUTHORIZED:
        resp.set_header("WWW-Authenticate", "Basic")
    resp.text = json.dumps({"error": "HTTPException", "detail": message, "body": "", "errors": f"{status}: {message}"})


def _answer(resp: falcon.Response, doc: object) -> None:
    resp.status = 200
    resp.content_type = "application/json"
    resp.text = json.dumps(doc)


def _object(req: falcon.Request) -> dict[str, Any]:
    body = json_body(req)
    if not isinstance(body, dict):
        raise _invalid("the request body must be a JSON object")
    return body


def _count(value: object, name: str) -> int:
    if type(value) is float and value.is_integer():
        value = int(value)
    if type(value) is not int or value < 1:
        raise _invalid(f"{name} must be a positive integer")
    return value


def _same(value: object, allowed: object) -> bool:
    return type(value) is not bool and value == allowed


def model_sha256(instance: Instance) -> str:
    """The digest A1111 lists as a checkpoint's ``sha256``: the weights file's, or the manifest's
    identity for a model of several files."""
    files = instance.manifest.files
    return files[0].sha256 if len(files) == 1 and files[0].sha256 else instance.manifest.identity


def _model_entry(instance: Instance) -> dict[str, Any]:
    sha256 = model_sha256(instance)
    return {
        "title": instance.id,
        "model_name": instance.id,
        "hash": sha256[:10],
        "sha256": sha256,
        "filename": instance.manifest.name,
        "config": None,
    }


class _Route:
    """A route's base: a method it doesn't serve is 405 in A1111's shape, ``Allow`` set."""

    def _not_allowed(self, req: falcon.Request, resp: falcon.Response) -> None:
        methods = [m for m in ("GET", "POST") if getattr(type(self), f"on_{m.lower()}") is not _Route._not_allowed]
        resp.set_header("Allow", ", ".join(methods))
        render_error(resp, 405, _invalid("method not allowed on this route"))

    on_get = on_post = on_put = on_patch = on_delete = _not_allowed


@dataclass
class _KeyState:
    """What one key has set here: its model (an instance id) and whether it interrupted."""

    model: str | None = None
    interrupted: bool = False


class SdApi:
    """The state the routes share: the media service and each key's selection."""

    def __init__(self, media: MediaService) -> None:
        self.media = media
        self._lock = threading.Lock()
        self._keys: dict[str, _KeyState] = {}

    def key(self, who: Principal) -> _KeyState:
        with self._lock:
            return self._keys.setdefault(who.id, _KeyState())

    def find(self, name: object) -> Instance:
        """The media instance ``name`` selects: an instance id (a title's `` [hash]`` tail
        allowed), else a served model name or alias (404 when none)."""
        if not isinstance(name, str) or not name:
            raise _invalid("sd_model_checkpoint must be a model title (GET /sdapi/v1/sd-models)")
        instances = self.media.instances()
        for candidate in (name, _TITLE_HASH.sub("", name)):
            for instance in instances:
                if candidate == instance.id:
                    return instance
        if self.media.fleet.deployments is not None:
            try:
                return self.media.resolve(name)
            except WerkError as err:
                if err.code is not ErrorCode.NOT_FOUND:
                    raise
        known = ", ".join(i.id for i in instances) or "none"
        raise WerkError(ErrorCode.NOT_FOUND, f"model {name[:64]!r} not found (known: {known})")

    def current(self, who: Principal) -> Instance | None:
        """The caller's model: its selection, else the first media instance."""
        selected = self.key(who).model
        if selected is not None:
            for instance in self.media.instances():
                if instance.id == selected:
                    return instance
        instances = self.media.instances()
        return instances[0] if instances else None

    def options(self, who: Principal) -> dict[str, Any]:
        instance = self.current(who)
        doc: dict[str, Any] = {
            "sd_model_checkpoint": instance.id if instance is not None else None,
            "sd_checkpoint_hash": model_sha256(instance) if instance is not None else None,
        }
        doc.update({name: values[0] for name, values in _FIXED_OPTIONS.items()})
        return doc

    def checked_options(self, options: object, where: str) -> Instance | None:
        """``options`` (a POST /options body or ``override_settings``) checked whole before
        anything changes; the model it selects, if any."""
        if options is None:
            return None
        if not isinstance(options, dict):
            raise _invalid(f"{where} must be a JSON object")
        selected = None
        for name, value in options.items():
            if name == "sd_model_checkpoint":
                selected = None if value is None else self.find(value)
            elif name in _FIXED_OPTIONS:
                allowed = _FIXED_OPTIONS[name]
                if not any(_same(value, a) for a in allowed):
                    shown = " or ".join(json.dumps(a) for a in allowed)
                    raise _invalid(f"{where}: option {name} can only be {shown} on this host")
            elif name not in _DERIVED_OPTIONS:
                raise _invalid(f"{where}: option {name[:64]!r} is not supported by this host")
        return selected


def _check_neutral(body: dict[str, Any], known: dict[str, Any]) -> None:
    for name, (neutral, message) in _NEUTRAL.items():
        if name in known and name in body and not neutral(body[name]):
            raise _invalid(message)
    for name in ("send_images", "include_init_images", "override_settings_restore_afterwards"):
        if name in body and body[name] is not None and not isinstance(body[name], bool):
            raise _invalid(f"{name} must be true or false")


def _image_doc(body: dict[str, Any], mode: ImageMode) -> tuple[dict[str, Any], int]:
    """The request's A1111 fields as an image request document, and its batch_size."""
    doc: dict[str, Any] = {"prompt": "" if body.get("prompt") is None else body["prompt"]}
    negative = body.get("negative_prompt")
    if negative is not None:
        doc["negative_prompt"] = negative
    for name in ("width", "height", "steps"):
        if body.get(name) is not None:
            doc[name] = body[name]
    if body.get("cfg_scale") is not None:
        doc["guidance_scale"] = body["cfg_scale"]
    seed = body.get("seed")
    if seed is not None and not (_number(seed) and seed == -1):
        doc["seed"] = seed
    sampler = body.get("sampler_name") or body.get("sampler_index")
    if sampler is not None:
        doc["sampler"] = sampler
    batch_size, n_iter = (_count(1 if body.get(k) is None else body[k], k) for k in ("batch_size", "n_iter"))
    if batch_size * n_iter > MAX_IMAGE_BATCH:
        raise _invalid(f"batch_size x n_iter must be at most {MAX_IMAGE_BATCH}")
    doc["n"] = batch_size * n_iter
    if mode is ImageMode.IMG2IMG:
        images = body.get("init_images")
        if not isinstance(images, list) or not images:
            raise _invalid("init_images is required: a list of base64 images")
        if len(images) > 1 and doc["n"] > 1:
            raise _invalid("several init_images over a batch are not supported: send one")
        doc["init_image"] = images[0]
        if body.get("denoising_strength") is not None:
            doc["strength"] = body["denoising_strength"]
    return doc, batch_size


def _infotext(prepared: Prepared, seed: int, model: str, model_hash: str) -> str:
    r = prepared.request
    lines = [r.prompt]
    if r.negative_prompt:
        lines.append(f"Negative prompt: {r.negative_prompt}")
    fields = [
        f"Steps: {r.steps}",
        f"Sampler: {r.sampler}",
        f"CFG scale: {r.guidance_scale}",
        f"Seed: {seed}",
        f"Size: {r.width}x{r.height}",
        f"Model hash: {model_hash}",
        f"Model: {model}",
    ]
    if r.mode is ImageMode.IMG2IMG:
        fields.append(f"Denoising strength: {r.strength}")
    lines.append(", ".join(fields))
    return "\n".join(lines)


def _info(body: dict[str, Any], prepared: Prepared, result: ImageResult, batch_size: int) -> str:
    """A1111's ``Processed.js()``: what ran, as a JSON text."""
    r = prepared.request
    seeds = result.seeds
    subseed = body.get("subseed")
    first_subseed = subseed if type(subseed) is int and subseed >= 0 else seeds[0]
    model = prepared.instance.id
    model_hash = model_sha256(prepared.instance)[:10]
    infotexts = [_infotext(prepared, seed, model, model_hash) for seed in seeds]
    info = {
        "prompt": r.prompt,
        "all_prompts": [r.prompt] * len(seeds),
        "negative_prompt": r.negative_prompt,
        "all_negative_prompts": [r.negative_prompt] * len(seeds),
        "seed": seeds[0],
        "all_seeds": seeds,
        "subseed": first_subseed,
        "all_subseeds": [first_subseed + i for i in range(len(seeds))],
        "subseed_strength": 0,
        "width": r.width,
        "height": r.height,
        "sampler_name": r.sampler,
        "cfg_scale": r.guidance_scale,
        "steps": r.steps,
        "batch_size": batch_size,
        "restore_faces": False,
        "face_restoration_model": None,
        "sd_model_name": model,
        "sd_model_hash": model_hash,
        "sd_vae_name": None,
        "sd_vae_hash": None,
        "seed_resize_from_w": -1,
        "seed_resize_from_h": -1,
        "denoising_strength": r.strength if r.mode is ImageMode.IMG2IMG else None,
        "extra_generation_params": {},
        "index_of_first_image": 0,
        "infotexts": infotexts,
        "styles": [],
        "job_timestamp": time.strftime("%Y%m%d%H%M%S"),
        "clip_skip": 1,
        "is_using_inpainting_conditioning": False,
    }
    return json.dumps(info)


class Generate(_Route):
    """``POST /sdapi/v1/txt2img`` and ``/img2img`` (module docstring)."""

    def __init__(self, sd: SdApi, mode: ImageMode) -> None:
        self.sd = sd
        self.mode = mode
        self.known = _TXT2IMG if mode is ImageMode.TXT2IMG else _IMG2IMG

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        sd, media = self.sd, self.sd.media
        body = _object(req)
        _check_neutral(body, self.known)
        who = principal(req)
        override = sd.checked_options(body.get("override_settings"), "override_settings")
        doc, batch_size = _image_doc(body, self.mode)
        image_request(doc, None)  # every bound, before any instance starts
        instance = override or sd.current(who) or media.resolve(None)  # none: unsupported
        if "width" not in doc or "height" not in doc:
            size = media.limits(instance).default_size
            doc.setdefault("width", size)
            doc.setdefault("height", size)
        request = image_request(doc, instance.id)
        sd.key(who).interrupted = False
        prepared, result = run_image(req, media, request)
        if override is not None and body.get("override_settings_restore_afterwards") is False:
            sd.key(who).model = override.id  # A1111 keeps such overrides as the new options
        parameters = {name: body.get(name, default) for name, default in self.known.items()}
        r = prepared.request
        for name, value in (("steps", r.steps), ("width", r.width), ("height", r.height)):
            if parameters[name] is None:
                parameters[name] = value
        if not (body.get("sampler_name") or body.get("sampler_index")):
            parameters["sampler_name"] = r.sampler
        if self.mode is ImageMode.IMG2IMG and not body.get("include_init_images"):
            parameters["init_images"] = None
            parameters["mask"] = None
        send = body.get("send_images") is not False
        images = [base64.b64encode(image).decode() for image in result.images] if send else []
        _answer(resp, {"images": images, "parameters": parameters, "info": _info(body, prepared, result, batch_size)})


class SdModels(_Route):
    def __init__(self, sd: SdApi) -> None:
        self.sd = sd

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        _answer(resp, [_model_entry(instance) for instance in self.sd.media.instances()])


class Samplers(_Route):
    def __init__(self, sd: SdApi) -> None:
        self.sd = sd

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        instance = self.sd.current(principal(req))
        if instance is None:
            _answer(resp, [])
            return
        limits = self.sd.media.limits(instance)
        _answer(resp, [{"name": name, "aliases": [], "options": {}} for name in limits.samplers])


class Options(_Route):
    def __init__(self, sd: SdApi) -> None:
        self.sd = sd

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        _answer(resp, self.sd.options(principal(req)))

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        body = _object(req)
        selected = self.sd.checked_options(body, "options")
        if selected is not None:
            self.sd.key(principal(req)).model = selected.id
        _answer(resp, None)


class Progress(_Route):
    def __init__(self, sd: SdApi) -> None:
        self.sd = sd

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        who = principal(req)
        running = self.sd.media.active(who)
        state: dict[str, Any] = {
            "skipped": False,
            "interrupted": self.sd.key(who).interrupted,
            "stopping_generation": False,
            "job": "",
            "job_count": len(running),
            "job_timestamp": "0",
            "job_no": 0,
            "sampling_step": 0,
            "sampling_steps": 0,
        }
        progress = eta = 0.0
        if running:
            first = running[0]
            elapsed = max(time.monotonic() - first.started, 0.0)
            progress = 0.01 + first.fraction / len(running)
            eta = elapsed / progress - elapsed
            progress = min(progress, 1.0)
            state["job"] = first.job_id or ""
            state["job_timestamp"] = time.strftime("%Y%m%d%H%M%S", time.localtime(time.time() - elapsed))
            state["sampling_step"], state["sampling_steps"] = first.step, first.steps
        _answer(
            resp, {"progress": progress, "eta_relative": eta, "state": state, "current_image": None, "textinfo": None}
        )


class Interrupt(_Route):
    def __init__(self, sd: SdApi) -> None:
        self.sd = sd

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        who = principal(req)
        if self.sd.media.interrupt(who):
            self.sd.key(who).interrupted = True
        _answer(resp, {})


def add_routes(app: falcon.App[Any, Any], media: MediaService, jobs: JobService) -> None:
    sd = SdApi(media)
    app.add_route(f"{PREFIX}/txt2img", Generate(sd, ImageMode.TXT2IMG))
    app.add_route(f"{PREFIX}/img2img", Generate(sd, ImageMode.IMG2IMG))
    app.add_route(f"{PREFIX}/sd-models", SdModels(sd))
    app.add_route(f"{PREFIX}/samplers", Samplers(sd))
    app.add_route(f"{PREFIX}/options", Options(sd))
    app.add_route(f"{PREFIX}/progress", Progress(sd))
    app.add_route(f"{PREFIX}/interrupt", Interrupt(sd))
