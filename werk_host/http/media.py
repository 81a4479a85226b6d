"""The native job routes and OpenAI's image routes (docs/media.md, "Routes").

Every image route translates its own fields into one
:class:`~werk_host.protocol.media.ImageRequest` and runs it through
:class:`~werk_host.service.media.MediaService` (werk_host/service/media.py: routing, the
adapter's limits, the gate); the job routes go through
:class:`~werk_host.service.jobs.JobService`. Here:

* ``POST /werk/v1/jobs`` ``{"kind": "image" | "speech", "model"?, "input": {...}}`` answers 202 with the
  job (``data.id``, ``data.status``); ``GET /werk/v1/jobs`` lists the caller's jobs;
  ``GET /werk/v1/jobs/{id}`` one of them; ``GET /werk/v1/jobs/{id}/result/{name}`` a result
  file's bytes with its content type; ``POST /werk/v1/jobs/{id}/cancel``. Another key's job is
  404, as for states. Envelope and errors as every ``/werk/v1`` route.
* ``POST /v1/images/generations`` (JSON) and ``POST /v1/images/edits`` (``multipart/form-data``,
  the one non-JSON body the host takes: the browser policy admits it on this path alone, its
  ``Origin`` checks unchanged) answer OpenAI's ``{"created", "data": [{"b64_json"}]}``
  synchronously. ``size`` is ``WIDTHxHEIGHT`` (``auto``: the backend's default); only
  ``response_format: "b64_json"`` (the default here): the host keeps no public file URLs. A
  mask is refused (no inpainting). Werk's extensions: ``negative_prompt``, ``steps``,
  ``guidance_scale``, ``seed``, ``sampler``, ``strength``. OpenAI's error shape.
"""

from __future__ import annotations

import base64
import contextlib
import email.parser
import email.policy
import re
import time
from collections.abc import Iterator
from typing import Any, Final

import falcon

from werk_host.errors import ErrorCode, WerkError
from werk_host.http.io import object_body, parse_body, principal, render_data
from werk_host.protocol.media import MAX_IMAGE_BATCH, ImageRequest, ImageResult, JobCreate
from werk_host.seam import client_disconnected
from werk_host.service.jobs import JobService, image_request
from werk_host.service.media import MediaService, Prepared
from werk_host.store.jobs import JOB_ID_RE

__all__ = ["add_routes", "disconnect_bound", "run_image", "EDITS_PATH"]

EDITS_PATH: Final = "/v1/images/edits"
_SIZE = re.compile(r"([1-9][0-9]{0,4})x([1-9][0-9]{0,4})")
_RESULT_NAME = re.compile(r"image-[0-9]{1,2}\.png|speech\.(?:wav|pcm|flac|mp3|opus|aac)")
#: OpenAI's fields the image routes take, and Werk's extensions.
_OPENAI_FIELDS: Final = frozenset({"model", "prompt", "n", "size", "response_format", "quality", "style", "user"})
_EXTENSIONS: Final = frozenset({"negative_prompt", "steps", "guidance_scale", "seed", "sampler", "strength"})
_EDIT_FILES: Final = frozenset({"image", "image[]", "mask"})


@contextlib.contextmanager
def disconnect_bound(req: falcon.Request) -> Iterator[None]:
    """The client's disconnect check bound for the block (a generation stops at its next step
    once the client has gone)."""
    check = req.env.get("waitress.client_disconnected")
    token = client_disconnected.set(check if callable(check) else None)
    try:
        yield
    finally:
        client_disconnected.reset(token)


def run_image(req: falcon.Request, media: MediaService, request: ImageRequest) -> tuple[Prepared, ImageResult]:
    """``request`` prepared and generated synchronously for the request's principal."""
    with disconnect_bound(req):
        prepared = media.prepare(request)
        req.context.instance_id = prepared.instance.id  # the metrics label of this request
        return prepared, media.generate(principal(req), prepared)


# -- native jobs ----------------------------------------------------------------------------------
def _job_id(value: str) -> str:
    if not JOB_ID_RE.fullmatch(value):
        raise WerkError(ErrorCode.INVALID_REQUEST, "a job id is job_ followed by 24 hex digits")
    return value


class Jobs:
    def __init__(self, jobs: JobService) -> None:
        self.jobs = jobs

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        render_data(req, resp, self.jobs.listing(principal(req)))

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        create = parse_body(req, JobCreate)
        with disconnect_bound(req):
            view = self.jobs.submit(principal(req), create)
        render_data(req, resp, view, status=202)


class Job:
    def __init__(self, jobs: JobService) -> None:
        self.jobs = jobs

    def on_get(self, req: falcon.Request, resp: falcon.Response, job_id: str) -> None:
        render_data(req, resp, self.jobs.get(principal(req), _job_id(job_id)))


class JobCancel:
    def __init__(self, jobs: JobService) -> None:
        self.jobs = jobs

    def on_post(self, req: falcon.Request, resp: falcon.Response, job_id: str) -> None:
        render_data(req, resp, self.jobs.cancel(principal(req), _job_id(job_id)))


class JobResult:
    def __init__(self, jobs: JobService) -> None:
        self.jobs = jobs

    def on_get(self, req: falcon.Request, resp: falcon.Response, job_id: str, name: str) -> None:
        if not _RESULT_NAME.fullmatch(name):
            raise WerkError(ErrorCode.NOT_FOUND, "the job has no result of that name")
        data, content_type = self.jobs.result(principal(req), _job_id(job_id), name)
        req.context.binary = True  # the middleware keeps this content type
        resp.content_type = content_type
        resp.data = data


# -- OpenAI images -----------------------------------------------------------------------------------
def _size(value: object) -> tuple[int, int] | None:
    if value is None or value == "auto":
        return None
    match = _SIZE.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise WerkError(ErrorCode.INVALID_REQUEST, "size must be WIDTHxHEIGHT (for instance 512x512) or auto")
    return int(match[1]), int(match[2])


def _openai_request(fields: dict[str, Any], media: MediaService, *, form: bool = False) -> dict[str, Any]:
    """OpenAI's fields (plus Werk's extensions) as an image request document; a form's values
    are strings, read as numbers where the field is one."""
    unknown = sorted(set(fields) - _OPENAI_FIELDS - _EXTENSIONS)
    if unknown:
        raise WerkError(ErrorCode.INVALID_REQUEST, f"unknown field {unknown[0][:64]!r}")
    response_format = fields.get("response_format", "b64_json")
    if response_format != "b64_json":
        raise WerkError(ErrorCode.INVALID_REQUEST, 'response_format must be "b64_json": this host keeps no image URLs')
    doc: dict[str, Any] = {k: fields[k] for k in _EXTENSIONS | {"model", "prompt", "n"} if k in fields}
    if "prompt" not in doc:
        raise WerkError(ErrorCode.INVALID_REQUEST, "prompt is required")
    if form:
        for name in ("n", "steps", "seed"):
            if name in doc:
                doc[name] = _form_number(doc[name], name, int)
        for name in ("guidance_scale", "strength"):
            if name in doc:
                doc[name] = _form_number(doc[name], name, float)
    if isinstance(doc.get("n"), int) and not 1 <= doc["n"] <= MAX_IMAGE_BATCH:
        raise WerkError(ErrorCode.INVALID_REQUEST, f"n must be from 1 to {MAX_IMAGE_BATCH}")
    size = _size(fields.get("size"))
    if size is not None:
        doc["width"], doc["height"] = size
    return doc


def _form_number(value: object, name: str, kind: type[int] | type[float]) -> int | float:
    try:
        return kind(str(value))
    except ValueError as err:
        raise WerkError(ErrorCode.INVALID_REQUEST, f"{name} must be a number") from err


def _default_size(doc: dict[str, Any], media: MediaService) -> None:
    if "width" not in doc:
        size = media.limits(media.resolve(doc.get("model"))).default_size
        doc["width"] = doc["height"] = size


def _answer(resp: falcon.Response, result: ImageResult) -> None:
    resp.media = {
        "created": int(time.time()),
        "data": [{"b64_json": base64.b64encode(image).decode(), "revised_prompt": None} for image in result.images],
        "output_format": "png",
    }


class ImageGenerations:
    def __init__(self, media: MediaService) -> None:
        self.media = media

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        doc = _openai_request(object_body(req), self.media)
        image_request(doc, None)  # the bounds, before any instance starts
        _default_size(doc, self.media)
        _prepared, result = run_image(req, self.media, image_request(doc, None))
        _answer(resp, result)


def multipart_form(req: falcon.Request) -> tuple[dict[str, str], dict[str, bytes]]:
    """A ``multipart/form-data`` body (already read within the media bound) as its text fields
    and its files; anything malformed is ``invalid_request``."""
    content_type = req.env.get("CONTENT_TYPE") or ""
    if not content_type.lower().startswith("multipart/form-data"):
        raise WerkError(ErrorCode.INVALID_REQUEST, "this route takes multipart/form-data")
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + req.context.body)
    if not message.is_multipart():
        raise WerkError(ErrorCode.INVALID_REQUEST, "the multipart body is malformed")
    fields: dict[str, str] = {}
    files: dict[str, bytes] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str) or not name:
            raise WerkError(ErrorCode.INVALID_REQUEST, "a form part has no name")
        payload = part.get_payload(decode=True)
        data = payload if isinstance(payload, bytes) else b""
        if part.get_filename() is not None or name in _EDIT_FILES:
            files[name] = data
        else:
            fields[name] = data.decode("utf-8", errors="strict")
    return fields, files


class ImageEdits:
    def __init__(self, media: MediaService) -> None:
        self.media = media

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        try:
            fields, files = multipart_form(req)
        except UnicodeDecodeError as err:
            raise WerkError(ErrorCode.INVALID_REQUEST, "a form field is not UTF-8 text") from err
        if "mask" in files:
            raise WerkError(ErrorCode.INVALID_REQUEST, "masks (inpainting) are not supported")
        image = files.get("image", files.get("image[]"))
        if not image:
            raise WerkError(ErrorCode.INVALID_REQUEST, "image is required")
        doc = _openai_request(fields, self.media, form=True)
        doc["init_image"] = base64.b64encode(image).decode()
        image_request(doc, None)  # the bounds, before any instance starts
        _default_size(doc, self.media)
        _prepared, result = run_image(req, self.media, image_request(doc, None))
        _answer(resp, result)


def add_routes(app: falcon.App[Any, Any], media: MediaService, jobs: JobService) -> None:
    app.add_route("/werk/v1/jobs", Jobs(jobs))
    app.add_route("/werk/v1/jobs/{job_id}", Job(jobs))
    app.add_route("/werk/v1/jobs/{job_id}/cancel", JobCancel(jobs))
    app.add_route("/werk/v1/jobs/{job_id}/result/{name}", JobResult(jobs))
    app.add_route("/v1/images/generations", ImageGenerations(media))
    app.add_route(EDITS_PATH, ImageEdits(media))
