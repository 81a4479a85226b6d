"""ComfyUI's HTTP API, job-backed (docs/media.md, "Comfy"; shapes from ComfyUI's ``server.py``
and ``execution.py``).

A prompt becomes one ``kind: image`` job (werk_host/service/jobs.py: the same validation, gate
and backends as every image route); its ``prompt_id`` is the job's id. Keys as on ``/v1``
(``Authorization: Bearer KEY``); every route sees the caller's own jobs only. Here:

* ``POST /prompt`` ``{"prompt": {node_id: {"class_type", "inputs"}}, "client_id"?,
  "extra_data"?}``: workflows in ComfyUI's API format made of the nodes of
  werk_host/http/comfy_workflow.py (``CheckpointLoaderSimple``: ``ckpt_name`` a media instance
  id; ``CLIPTextEncode`` ×2; ``EmptyLatentImage``; ``KSampler``, its ``sampler_name`` ComfyUI's
  name of a backend sampler (``euler`` → ``Euler``, ``euler_ancestral`` → ``Euler a``, ...),
  ``scheduler`` ``normal`` (the backend's own schedule for that sampler) or ``karras`` where the
  backend has the ``<name> Karras`` sampler, ``denoise`` 1.0; ``VAEDecode``; ``SaveImage``
  or ``PreviewImage``). The whole graph is validated before a job exists: anything else is
  ComfyUI's 400 ``{"error": {"type", "message", "details", "extra_info"}, "node_errors":
  {node_id: {"errors", "dependent_outputs", "class_type"}}}`` naming the node and input
  (``LoadImage``/``VAEEncode``: image-to-image is not served here, the message says so). It
  answers ``{"prompt_id", "number", "node_errors": {}}``. ``front`` and a client's ``number``
  are refused: the job queue is first in, first out. ``GET /prompt``: ``exec_info.queue_remaining``.
* ``GET /history/{prompt_id}`` and ``GET /history`` (``max_items``): ComfyUI's entries
  (``prompt`` as ``[number, prompt_id, prompt, extra_data, outputs_to_execute]``, the nodes that
  ran with their known inputs only; ``outputs``; ``status`` with ``status_str``, ``completed``
  and ComfyUI's ``messages``; ``meta``) of the prompts this process accepted, once their job has
  ended: nothing while queued or running, as ComfyUI. Another key's id, or an unknown one, is
  ``{}``. Kept in memory (the last :data:`MAX_HISTORY`), as ComfyUI's history: a restart
  forgets them, the job records and their images stay. ``POST /history`` ``{"delete"}``/
  ``{"clear"}`` forgets entries (the jobs stay: ``/werk/v1/jobs``, ``werk jobs purge``).
* Images are named ``{filename_prefix}_{job_id}_{i:05}_.png`` (``i`` from 1; the prefix made
  ``[A-Za-z0-9_-]``, at most 64), ``subfolder`` ``""``, ``type`` ``output`` (``temp`` for
  ``PreviewImage``). ``GET /view?filename=...&type=output&subfolder=`` parses the job id back
  out (a strict pattern: no path ever reaches the file system) and serves the job's PNG bytes
  as ``image/png``; another key's job, a malformed name, a subfolder or ``type=input`` is 404.
  The PNGs are the backend's bytes: no workflow is embedded in them; ``preview``/``channel``
  are ignored (the answer's content type says what it is).
* ``GET /queue``: ``queue_running``/``queue_pending`` of the caller's jobs (any route's: they
  share one runner; a job not submitted here shows an empty prompt). ``POST /queue``
  ``{"delete": [ids]}``/``{"clear": true}`` cancels the caller's queued jobs; running ones
  are left, as ComfyUI. ``POST /interrupt`` (``{"prompt_id"}`` optional) cancels the caller's
  running jobs only; the job ends ``cancelled``, its history ``execution_interrupted``.
* ``GET /object_info`` and ``/object_info/{node_class}``: the nodes above in ComfyUI's format,
  Werk's bounds as their ranges, ``ckpt_name``'s choices the media instances, ``sampler_name``'s
  the mapped names the first media instance's backend runs (another instance's are checked on
  ``POST /prompt``). ``GET /system_stats``: ``os``, ``python_version``, ``comfyui_version``
  ``null`` (this is not ComfyUI) and no devices.
* **``/ws`` is not served**: waitress, the host's HTTP server, cannot upgrade a connection to a
  WebSocket, and a fake socket would hang clients. ``GET /ws`` answers 501 in the error shape
  below, so a WebSocket client fails at once. Poll instead: ``GET /history/{prompt_id}`` until
  it is there, ``GET /werk/v1/jobs/{prompt_id}`` for step progress.
* ComfyUI's ``/api/...`` aliases are not served (``/api`` is Ollama's here), nor are uploads
  (``/upload/image``), ``/free`` or ``/view_metadata``.
* Errors other than a refused prompt: ``{"error": {"type": code, "message", "details": "",
  "extra_info": {}}, "node_errors": {}}``, the message the error's public one.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final

import falcon

from werk_host.errors import ErrorCode, WerkError
from werk_host.http.comfy_workflow import (
    NODES,
    Choices,
    Node,
    Output,
    Workflow,
    WorkflowError,
    comfy_samplers,
    comfy_schedulers,
    parse,
    prompt_error,
)
from werk_host.http.io import json_body, principal
from werk_host.http.media import disconnect_bound
from werk_host.protocol.media import MAX_IMAGE_BATCH, JobCreate, JobStatus, JobView
from werk_host.service.jobs import JobService
from werk_host.service.media import MediaService
from werk_host.service.principals import Principal
from werk_host.store.jobs import JOB_ID_RE

__all__ = ["add_routes", "render_error", "view_name"]

MAX_HISTORY: Final = 512
#: The largest ``extra_data`` kept for the history, as JSON (a bigger one keeps ``client_id``).
MAX_EXTRA_BYTES: Final = 64 << 10
_VIEW_NAME: Final = re.compile(rf"[A-Za-z0-9_-]{{1,64}}_({JOB_ID_RE.pattern})_([0-9]{{5}})_\.png")
_RESULT_NAME: Final = re.compile(r"image-([0-9]{1,2})\.png")


def render_error(resp: falcon.Response, status: int, error: WerkError) -> None:
    """A typed error in ComfyUI's error shape (module docstring)."""
    resp.status = status
    resp.content_type = "application/json"
    if error.code is ErrorCode.UNAUTHORIZED:
        resp.set_header("WWW-Authenticate", "Bearer")
    body: dict[str, Any] = {
        "type": error.code.value,
        "message": error.public_message(),
        "details": "",
        "extra_info": {},
    }
    resp.text = json.dumps({"error": body, "node_errors": {}})


def _answer(resp: falcon.Response, doc: object, status: int = 200) -> None:
    resp.status = status
    resp.content_type = "application/json"
    resp.text = json.dumps(doc)


def _empty(resp: falcon.Response) -> None:
    """ComfyUI's bare 200 (``/queue``, ``/interrupt``, ``/history`` POSTs)."""
    resp.status = 200
    resp.content_type = "text/plain"
    resp.text = ""


def _invalid(message: str) -> WerkError:
    return WerkError(ErrorCode.INVALID_REQUEST, message)


def _object(req: falcon.Request, *, optional: bool = False) -> dict[str, Any]:
    if optional and not req.context.body.strip():
        return {}
    body = json_body(req)
    if not isinstance(body, dict):
        raise _invalid("the request body must be a JSON object")
    return body


def _ids(value: object, name: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _invalid(f"{name} must be a list of prompt ids")
    return [v for v in value if JOB_ID_RE.fullmatch(v)]


def view_name(prefix: str, job_id: str, index: int) -> str:
    """The file name of image ``index`` (from 0) of a job (module docstring)."""
    return f"{prefix}_{job_id}_{index + 1:05}_.png"


@dataclass(frozen=True)
class Entry:
    """What ``/history`` and ``/queue`` show of one accepted prompt."""

    owner: str
    number: int
    prompt: dict[str, Any]
    extra_data: dict[str, Any]
    outputs: list[Output]
    sampler_node: str

    def item(self, job_id: str) -> list[Any]:
        """ComfyUI's queue item ``[number, prompt_id, prompt, extra_data, outputs_to_execute]``."""
        return [self.number, job_id, self.prompt, self.extra_data, [o.node_id for o in self.outputs]]


class Comfy:
    """The state the routes share: the services and the accepted prompts, in order."""

    def __init__(self, media: MediaService, jobs: JobService) -> None:
        self.media = media
        self.jobs = jobs
        self._lock = threading.Lock()
        self._number = 0
        self._entries: OrderedDict[str, Entry] = OrderedDict()

    # -- what is served ------------------------------------------------------------------------
    def checkpoints(self) -> list[str]:
        return [instance.id for instance in self.media.instances()]

    def samplers(self, model: str) -> list[str]:
        return list(self.media.limits(self.media.resolve(model)).samplers)

    def default_samplers(self) -> list[str]:
        instances = self.media.instances()
        return self.samplers(instances[0].id) if instances else []

    # -- accepted prompts ----------------------------------------------------------------------
    def next_number(self) -> int:
        with self._lock:
            number = self._number
            self._number += 1
            return number

    def remember(self, job_id: str, entry: Entry) -> None:
        with self._lock:
            self._entries[job_id] = entry
            while len(self._entries) > MAX_HISTORY:
                self._entries.popitem(last=False)

    def entries(self, who: Principal) -> list[tuple[str, Entry]]:
        with self._lock:
            return [(job_id, e) for job_id, e in self._entries.items() if e.owner == who.id]

    def entry(self, who: Principal, job_id: str) -> Entry | None:
        with self._lock:
            found = self._entries.get(job_id)
        return found if found is not None and found.owner == who.id else None

    def forget(self, who: Principal, ids: list[str] | None) -> None:
        with self._lock:
            for job_id, e in list(self._entries.items()):
                if e.owner == who.id and (ids is None or job_id in ids):
                    del self._entries[job_id]

    def views(self, who: Principal) -> dict[str, JobView]:
        return {view.id: view for view in self.jobs.listing(who)}


# -- history ---------------------------------------------------------------------------------
def _messages(job_id: str, entry: Entry, view: JobView) -> list[list[Any]]:
    started = view.started_unix_ms or view.created_unix_ms
    finished = view.finished_unix_ms or started
    messages: list[list[Any]] = [
        ["execution_start", {"prompt_id": job_id, "timestamp": started}],
        ["execution_cached", {"nodes": [], "prompt_id": job_id, "timestamp": started}],
    ]
    node = {"prompt_id": job_id, "node_id": entry.sampler_node, "node_type": "KSampler", "executed": []}
    if view.status is JobStatus.SUCCEEDED:
        messages.append(["execution_success", {"prompt_id": job_id, "timestamp": finished}])
    elif view.status is JobStatus.CANCELLED:
        messages.append(["execution_interrupted", {**node, "timestamp": finished}])
    else:
        code = view.error.code if view.error is not None else ErrorCode.INTERNAL.value
        message = view.error.message if view.error is not None else "the job failed"  # already public
        error = {
            "exception_message": message,
            "exception_type": code,
            "traceback": [],
            "current_inputs": {},
            "current_outputs": {},
        }
        messages.append(["execution_error", {**node, **error, "timestamp": finished}])
    return messages


def _images(job_id: str, view: JobView, output: Output) -> list[dict[str, str]]:
    indices = sorted(int(m[1]) for f in view.results if (m := _RESULT_NAME.fullmatch(f.name)))
    return [{"filename": view_name(output.prefix, job_id, i), "subfolder": "", "type": output.type} for i in indices]


def history_entry(job_id: str, entry: Entry, view: JobView) -> dict[str, Any]:
    """ComfyUI's history entry of an ended job (module docstring)."""
    succeeded = view.status is JobStatus.SUCCEEDED
    outputs = {o.node_id: {"images": _images(job_id, view, o)} for o in entry.outputs} if succeeded else {}
    meta = {
        o.node_id: {"node_id": o.node_id, "display_node": o.node_id, "parent_node": None, "real_node_id": o.node_id}
        for o in entry.outputs
    }
    status = {
        "status_str": "success" if succeeded else "error",
        "completed": succeeded,
        "messages": _messages(job_id, entry, view),
    }
    return {"prompt": entry.item(job_id), "outputs": outputs, "status": status, "meta": meta}


# -- routes ----------------------------------------------------------------------------------
class Prompt:
    def __init__(self, comfy: Comfy) -> None:
        self.comfy = comfy

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        active = [v for v in self.comfy.jobs.listing(principal(req)) if not v.status.terminal]
        _answer(resp, {"exec_info": {"queue_remaining": len(active)}})

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        try:
            workflow, extra_data = self.parse(req)
        except WorkflowError as err:
            _answer(resp, err.body, 400)
            return
        comfy, who = self.comfy, principal(req)
        create = JobCreate.model_validate({"kind": "image", "model": workflow.model, "input": workflow.fields})
        with disconnect_bound(req):
            view = comfy.jobs.submit(who, create)
        number = comfy.next_number()
        entry = Entry(who.id, number, workflow.prompt, extra_data, workflow.outputs, workflow.sampler_node)
        comfy.remember(view.id, entry)
        _answer(resp, {"prompt_id": view.id, "number": number, "node_errors": {}})

    def parse(self, req: falcon.Request) -> tuple[Workflow, dict[str, Any]]:
        body = json_body(req)
        if not isinstance(body, dict):
            raise prompt_error("invalid_prompt", "The request body must be a JSON object with a prompt")
        if body.get("front") not in (None, False) or "number" in body:
            raise prompt_error("invalid_prompt", "front and number are not supported: the queue is first in, first out")
        if "prompt" not in body:
            raise prompt_error("no_prompt", "No prompt provided", "No prompt provided")
        extra = body.get("extra_data", {})
        if not isinstance(extra, dict):
            raise prompt_error("invalid_prompt", "extra_data must be a JSON object")
        client_id = body.get("client_id")
        if client_id is not None and not (isinstance(client_id, str) and len(client_id) <= 256):
            raise prompt_error("invalid_prompt", "client_id must be a string of at most 256 characters")
        extra = dict(extra)
        if client_id is not None:
            extra["client_id"] = client_id
        if len(json.dumps(extra)) > MAX_EXTRA_BYTES:
            extra = {"client_id": client_id} if client_id is not None else {}
        comfy = self.comfy
        return parse(body["prompt"], Choices(comfy.checkpoints(), comfy.samplers)), extra


def _max_items(req: falcon.Request) -> int | None:
    value = req.params.get("max_items")
    if value is None:
        return None
    if not isinstance(value, str) or not value.isdigit() or len(value) > 6:
        raise _invalid("max_items must be a non-negative integer")
    return int(value)


class History:
    def __init__(self, comfy: Comfy) -> None:
        self.comfy = comfy

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        who = principal(req)
        limit = _max_items(req)
        views = self.comfy.views(who)
        found = [(job_id, e, views[job_id]) for job_id, e in self.comfy.entries(who) if job_id in views]
        ended = [(job_id, e, v) for job_id, e, v in found if v.status.terminal]
        if limit is not None:
            ended = ended[len(ended) - limit :] if limit else []
        _answer(resp, {job_id: history_entry(job_id, e, v) for job_id, e, v in ended})

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        body = _object(req)
        if body.get("clear") is True:
            self.comfy.forget(principal(req), None)
        if "delete" in body:
            self.comfy.forget(principal(req), _ids(body["delete"], "delete"))
        _empty(resp)


class HistoryItem:
    def __init__(self, comfy: Comfy) -> None:
        self.comfy = comfy

    def on_get(self, req: falcon.Request, resp: falcon.Response, prompt_id: str) -> None:
        who = principal(req)
        entry = self.comfy.entry(who, prompt_id) if JOB_ID_RE.fullmatch(prompt_id) else None
        if entry is None:
            _answer(resp, {})
            return
        try:
            view = self.comfy.jobs.get(who, prompt_id)
        except WerkError as err:
            if err.code is not ErrorCode.NOT_FOUND:
                raise
            _answer(resp, {})
            return
        _answer(resp, {prompt_id: history_entry(prompt_id, entry, view)} if view.status.terminal else {})


class View:
    def __init__(self, comfy: Comfy) -> None:
        self.comfy = comfy

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        params = req.params
        filename, kind, subfolder = (params.get(k) for k in ("filename", "type", "subfolder"))
        match = _VIEW_NAME.fullmatch(filename) if isinstance(filename, str) else None
        index = int(match[2]) - 1 if match is not None else -1
        if (
            match is None
            or not 0 <= index < MAX_IMAGE_BATCH
            or kind not in (None, "", "output", "temp")
            or subfolder not in (None, "")
        ):
            raise WerkError(ErrorCode.NOT_FOUND, "no such image")
        data, content_type = self.comfy.jobs.result(principal(req), match[1], f"image-{index}.png")
        resp.status = 200
        resp.content_type = content_type
        resp.set_header("Content-Disposition", f'filename="{filename}"')
        resp.set_header("Cache-Control", "no-store")
        resp.data = data


class Queue:
    def __init__(self, comfy: Comfy) -> None:
        self.comfy = comfy

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        who = principal(req)
        entries = dict(self.comfy.entries(who))
        views = sorted(self.comfy.views(who).values(), key=lambda v: v.created_unix_ms)

        def item(view: JobView) -> list[Any]:
            entry = entries.get(view.id)
            return entry.item(view.id) if entry is not None else [0, view.id, {}, {}, []]

        running = [item(v) for v in views if v.status is JobStatus.RUNNING]
        pending = [item(v) for v in views if v.status is JobStatus.QUEUED]
        _answer(resp, {"queue_running": running, "queue_pending": pending})

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        body = _object(req)
        who = principal(req)
        chosen = set(_ids(body["delete"], "delete")) if "delete" in body else set()
        clear = body.get("clear") is True
        for view in self.comfy.jobs.listing(who):
            if view.status is JobStatus.QUEUED and (clear or view.id in chosen):
                self.comfy.jobs.cancel(who, view.id)
        _empty(resp)


class Interrupt:
    def __init__(self, comfy: Comfy) -> None:
        self.comfy = comfy

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        body = _object(req, optional=True)
        only = body.get("prompt_id")
        if only is not None and not isinstance(only, str):
            raise _invalid("prompt_id must be a string")
        who = principal(req)
        for view in self.comfy.jobs.listing(who):
            if view.status is JobStatus.RUNNING and only in (None, view.id):
                self.comfy.jobs.cancel(who, view.id)
        _empty(resp)


def node_info(node: Node, comfy: Comfy) -> dict[str, Any]:
    """One node as ComfyUI's ``/object_info`` describes it (module docstring)."""
    backend: list[str] | None = None

    def choices(name: str) -> list[str]:
        nonlocal backend
        if name == "ckpt_name":
            return comfy.checkpoints()
        if backend is None:
            backend = comfy.default_samplers()
        return comfy_samplers(backend) if name == "sampler_name" else comfy_schedulers(backend)

    required: dict[str, list[Any]] = {}
    for name, input_ in node.inputs.items():
        kind: Any = choices(input_.choices) if input_.kind == "CHOICE" else input_.kind
        required[name] = [kind, dict(input_.options)] if input_.options else [kind]
    return {
        "input": {"required": required},
        "input_order": {"required": list(required)},
        "output": list(node.outputs),
        "output_is_list": [False] * len(node.outputs),
        "output_name": list(node.outputs),
        "name": node.name,
        "display_name": node.display_name,
        "description": node.description,
        "python_module": "nodes",
        "category": node.category,
        "output_node": node.output_node,
    }


class ObjectInfo:
    def __init__(self, comfy: Comfy) -> None:
        self.comfy = comfy

    def on_get(self, req: falcon.Request, resp: falcon.Response, node_class: str | None = None) -> None:
        names = list(NODES) if node_class is None else [n for n in NODES if n == node_class]
        _answer(resp, {name: node_info(NODES[name], self.comfy) for name in names})


class SystemStats:
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        system = {"os": os.name, "python_version": sys.version, "comfyui_version": None, "embedded_python": False}
        _answer(resp, {"system": system, "devices": []})


class WebSocket:
    """``/ws``: not served (module docstring)."""

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        message = (
            "WebSocket progress (/ws) is not served: this host's HTTP server cannot upgrade connections. "
            "Poll GET /history/{prompt_id} until it appears, or GET /werk/v1/jobs/{prompt_id} for step progress"
        )
        render_error(resp, 501, WerkError(ErrorCode.UNSUPPORTED, message))


def add_routes(app: falcon.App[Any, Any], media: MediaService, jobs: JobService) -> None:
    comfy = Comfy(media, jobs)
    app.add_route("/prompt", Prompt(comfy))
    app.add_route("/history", History(comfy))
    app.add_route("/history/{prompt_id}", HistoryItem(comfy))
    app.add_route("/view", View(comfy))
    app.add_route("/queue", Queue(comfy))
    app.add_route("/interrupt", Interrupt(comfy))
    app.add_route("/object_info", ObjectInfo(comfy))
    app.add_route("/object_info/{node_class}", ObjectInfo(comfy))
    app.add_route("/system_stats", SystemStats())
    app.add_route("/ws", WebSocket())
