"""The Falcon WSGI application: ``create_app`` wires middleware, routes and error mapping."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import falcon

from werk_host.control import WerkControl
from werk_host.errors import ErrorCode, WerkError
from werk_host.http import anthropic, comfy, embeddings, ollama, openai, responses, sdapi, speech, ui
from werk_host.http import media as media_routes
from werk_host.http.browser import BrowserPolicy
from werk_host.http.errors import error_body, from_falcon, retry_after, status_for
from werk_host.http.metrics import METRICS_PATH, HostMetrics
from werk_host.http.middleware import (
    RequestMiddleware,
    is_anthropic_path,
    is_comfy_path,
    is_ollama_path,
    is_openai_path,
    is_sdapi_path,
    protocol_headers,
)
from werk_host.http.resources import ROUTES, OpenApiDocument, OpenApiResource, RawOpenApiResource
from werk_host.logs import TracebackThrottle
from werk_host.protocol.envelope import error_json
from werk_host.service.counters import ChatStats
from werk_host.service.embeddings import EmbeddingService
from werk_host.service.fleet import Fleet
from werk_host.service.jobs import JobService
from werk_host.service.media import MediaService
from werk_host.service.principals import Authenticator

log = logging.getLogger("werk_host.http")


def _render_error(req: falcon.Request, resp: falcon.Response, error: WerkError) -> None:
    request_id = getattr(req.context, "request_id", None) or "req_unknown"
    status = status_for(error)
    after = retry_after(error)
    if after is not None:  # docs/operations.md, "Inference concurrency"
        resp.set_header("Retry-After", str(after))
    if is_anthropic_path(req.path):  # before /v1: these routes live under it
        anthropic.render_error(req, resp, status, error)
        return
    if is_ollama_path(req.path):
        ollama.render_error(resp, status, error)
        return
    if is_sdapi_path(req.path):
        sdapi.render_error(resp, status, error)
        return
    if is_comfy_path(req.path):
        comfy.render_error(resp, status, error)
        return
    if is_openai_path(req.path):
        openai.render_error(resp, status, error)
        return
    resp.status = status
    protocol_headers(resp, request_id)
    if error.code is ErrorCode.UNAUTHORIZED:
        resp.set_header("WWW-Authenticate", "Bearer")
    resp.text = error_json(request_id, error_body(error))


def _handle_werk_error(req: falcon.Request, resp: falcon.Response, ex: WerkError, params: dict[str, Any]) -> None:
    if ex.code in (ErrorCode.INTERNAL, ErrorCode.CORRUPT_STATE):
        log.error("request %s failed: %s: %s", getattr(req.context, "request_id", "?"), ex.code.value, ex.message)
    _render_error(req, resp, ex)


def _handle_http_error(
    req: falcon.Request, resp: falcon.Response, ex: falcon.HTTPError, params: dict[str, Any]
) -> None:
    error = from_falcon(ex)
    _render_error(req, resp, error)
    if ex.status_code == 405:
        resp.status = 405
        allowed = dict(ex.headers or {}).get("Allow")
        if allowed:
            resp.set_header("Allow", allowed)


class _UnexpectedErrors:
    """Renders any unexpected exception as ``internal``: one log line per error with its request
    id and error site, the traceback at most once per site per minute (:mod:`werk_host.logs`)."""

    def __init__(self) -> None:
        self.throttle = TracebackThrottle()

    def __call__(self, req: falcon.Request, resp: falcon.Response, ex: Exception, params: dict[str, Any]) -> None:
        if isinstance(ex, falcon.HTTPError):
            _handle_http_error(req, resp, ex, params)
            return
        kind, filename, line = TracebackThrottle.site(ex)
        request_id = getattr(req.context, "request_id", "?")
        where = f"{kind} at {Path(filename).name}:{line}"
        if self.throttle.should_log_traceback(ex):
            log.error("request %s raised an unexpected error: %s", request_id, where, exc_info=ex)
        else:
            log.error("request %s raised an unexpected error: %s (traceback logged earlier)", request_id, where)
        _render_error(req, resp, WerkError(ErrorCode.INTERNAL, "internal error"))


def create_app(
    control: WerkControl,
    auth: Authenticator,
    *,
    openapi: Callable[[], dict[str, Any]],
    inference: Any | None = None,
    fleet: Fleet | None = None,
    browser: BrowserPolicy | None = None,
    media: MediaService | None = None,
    jobs: JobService | None = None,
    embedder: EmbeddingService | None = None,
) -> falcon.App[Any, Any]:
    """Build the WSGI app serving ``/werk/v1`` (and ``/v1`` when ``inference`` is given) and
    the document ``openapi()`` makes (:func:`werk_host.openapi.build_openapi`; the document module
    sits above this layer: it reads the routes), made once, when it is first asked for: most
    starts never serve it (docs/operations.md, "Where the start-up time goes"). With ``fleet``,
    ``/werk/v1`` requests select their deployment instance (``X-Werk-Deployment``). ``browser``
    is the browser-safety policy (default: a host bound to loopback with nothing more allowed;
    docs/operations.md, "Browser safety"). With ``media`` and ``jobs``, the image and job routes
    (docs/media.md). With ``embedder``, the embedding and rerank routes (docs/embeddings.md)."""
    metrics = HostMetrics.for_control(control)
    middleware: list[Any] = [
        metrics.middleware,  # first, so that it sees every response (401s included)
        RequestMiddleware(auth, fleet, browser or BrowserPolicy("127.0.0.1")),
    ]
    app: falcon.App[Any, Any] = falcon.App(middleware=middleware, router=metrics.router)
    app.req_options.auto_parse_qs_csv = False
    app.req_options.keep_blank_qs_values = True
    app.resp_options.default_media_type = "application/json"
    for path, resource_class in ROUTES:
        app.add_route(path, resource_class(control))
    document = OpenApiDocument(openapi)
    app.add_route("/werk/v1/openapi.json", OpenApiResource(document))
    app.add_route("/openapi.json", RawOpenApiResource(document))
    if inference is not None:
        openai.add_routes(app, inference)
        anthropic.add_routes(app, control, inference)  # docs/compat.md
        responses.add_routes(app, control, inference)  # docs/compat.md, "OpenAI Responses"
        if fleet is not None:
            embedder = embedder or EmbeddingService(fleet, ChatStats())
            ollama.add_routes(app, control, inference, fleet, embedder)
            embeddings.add_routes(app, embedder)  # docs/embeddings.md
    if media is not None and jobs is not None:
        media_routes.add_routes(app, media, jobs)  # docs/media.md
        sdapi.add_routes(app, media, jobs)
        comfy.add_routes(app, media, jobs)
        speech.add_routes(app, media)  # docs/media.md, "Speech"
    app.add_route(METRICS_PATH, metrics.resource)
    ui.add_routes(app)  # the operator's page, docs/ui.md
    # Registration order matters: Falcon picks the most specific handler class.
    app.add_error_handler(Exception, _UnexpectedErrors())
    app.add_error_handler(falcon.HTTPError, _handle_http_error)
    app.add_error_handler(WerkError, _handle_werk_error)
    return app
