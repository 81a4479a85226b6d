"""Request-scoped middleware (:class:`RequestMiddleware`): request id, browser safety,
authentication, negotiation, deployment selection and the body bound.

Order per request: request id → browser safety (403 Host/Origin, 415 media type, CORS
preflights answered: werk_host/http/browser.py) → authentication (401) → protocol negotiation for
``/werk/v1`` (406) → deployment selection for ``/werk/v1`` (400/404) → body bound on POST
(413) → resource. Authentication and selection end in the request's
:class:`~werk_host.service.scope.RequestScope` (``req.context.scope``), which resources pass
to the service explicitly and which is closed when the response is done. One middleware does
all of it: every request passes here, so each call and each header lookup counts
(docs/operations.md, "Control-plane throughput").
"""

from __future__ import annotations

import base64
import functools
import random
import re
import secrets
from typing import Any, Final

import falcon

from werk_host.deployments.instances import Instance
from werk_host.deployments.registry import DEPLOYMENT_HEADER
from werk_host.errors import ErrorCode, WerkError
from werk_host.http.browser import BrowserPolicy, respond
from werk_host.http.errors import StatusError
from werk_host.protocol import MAX_REQUEST_BYTES, PROTOCOL_MAJOR, PROTOCOL_VERSION
from werk_host.protocol.media import MAX_MEDIA_REQUEST_BYTES
from werk_host.service.fleet import Fleet
from werk_host.service.principals import Authenticator
from werk_host.service.scope import RequestScope

PROTOCOL_PREFIX = "/werk/v1"
OPENAI_PREFIX = "/v1"
ANTHROPIC_PREFIX = "/v1/messages"
OLLAMA_PREFIX = "/api"
SDAPI_PREFIX = "/sdapi"
#: The ComfyUI routes Werk serves (docs/media.md, "Comfy"): their first path segment.
COMFY_ROUTES: Final = frozenset(
    {"prompt", "history", "view", "queue", "object_info", "interrupt", "system_stats", "ws"}
)


def is_protocol_path(path: str) -> bool:
    return path == PROTOCOL_PREFIX or path.startswith(PROTOCOL_PREFIX + "/")


def is_openai_path(path: str) -> bool:
    return path == OPENAI_PREFIX or path.startswith(OPENAI_PREFIX + "/")


def is_anthropic_path(path: str) -> bool:
    """The Anthropic Messages routes under ``/v1`` (docs/compat.md): Anthropic's error shape."""
    return path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/")


def is_ollama_path(path: str) -> bool:
    """The Ollama routes (docs/compat.md): Ollama's error shape, keys as on ``/v1``."""
    return path == OLLAMA_PREFIX or path.startswith(OLLAMA_PREFIX + "/")


def is_sdapi_path(path: str) -> bool:
    """The AUTOMATIC1111 routes (docs/media.md): their error shape, keys as on ``/v1``."""
    return path.startswith(SDAPI_PREFIX + "/")


def is_comfy_path(path: str) -> bool:
    """The ComfyUI routes (docs/media.md): their error shape, keys as on ``/v1``."""
    return path.partition("/")[2].partition("/")[0] in COMFY_ROUTES


def is_media_body_path(path: str) -> bool:
    """The routes whose bodies may carry an image (:data:`MAX_MEDIA_REQUEST_BYTES`)."""
    return path.startswith(("/v1/images/", "/sdapi/", "/werk/v1/jobs")) or path == "/prompt"


class BodyTooLarge(StatusError):
    """The HTTP body limit: 1 MiB, media routes :data:`MAX_MEDIA_REQUEST_BYTES` (413, code
    ``resource_exhausted``)."""

    status = 413

    def __init__(self, limit: int = MAX_REQUEST_BYTES) -> None:
        super().__init__(ErrorCode.RESOURCE_EXHAUSTED, f"request body exceeds {limit >> 20} MiB", retryable=False)


def protocol_headers(resp: falcon.Response, request_id: str, *, json: bool = True) -> None:
    """The headers of every ``/werk/v1`` answer; ``json``: it is a JSON document (a job's result
    file keeps its own content type)."""
    resp.set_header("X-Werk-Request-Id", request_id)
    resp.set_header("X-Werk-Protocol-Version", PROTOCOL_VERSION)
    resp.set_header("Cache-Control", "no-store")
    resp.set_header("Vary", "accept")
    resp.set_header("X-Content-Type-Options", "nosniff")
    if json:
        resp.content_type = "application/json"


def presented_key(env: dict[str, Any]) -> str | None:
    """The API key a request presents: ``Authorization: Bearer KEY``, else ``X-API-Key``."""
    auth = env.get("HTTP_AUTHORIZATION")
    if auth:
        scheme, _, token = auth.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return str(token.strip())
        if scheme.lower() == "basic" and token.strip():  # AUTOMATIC1111's --api-auth: the password
            try:
                decoded = base64.b64decode(token.strip(), validate=True).decode()
            except (ValueError, UnicodeDecodeError):
                return None
            password = decoded.partition(":")[2]
            return password or None
    api_key = env.get("HTTP_X_API_KEY")
    return str(api_key.strip()) if api_key else None


@functools.lru_cache(maxsize=256)  # clients send few distinct Accept headers
def _media_quality(accept: str) -> float:
    """Quality the Accept header gives ``application/json`` (most specific range wins)."""
    best: tuple[int, float] | None = None
    for part in accept.split(","):
        fields = [f.strip() for f in part.split(";")]
        media = fields[0].lower()
        if not media:
            continue
        quality = 1.0
        for param in fields[1:]:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    quality = float(value.strip())
                except ValueError:
                    quality = 0.0
                if not 0.0 <= quality <= 1.0:
                    quality = 0.0
        specificity = {"application/json": 3, "application/*": 2, "*/*": 1}.get(media)
        if specificity is None:
            continue
        if best is None or specificity > best[0]:
            best = (specificity, quality)
    return best[1] if best else 0.0


def accept_allows_json(accept: str | None) -> bool:
    return accept is None or _media_quality(accept) > 0.0


#: ``X-Werk-Protocol-Version`` values that can consume this server's 1.0: a comma-separated list
#: of ``MAJOR.MINOR`` with the same major (any minor >= 0 consumes 1.0). The OpenAPI document
#: states this same pattern.
PROTOCOL_VERSION_HEADER_PATTERN: Final = (
    rf"^[ \t]*0*{PROTOCOL_MAJOR}\.[0-9]+[ \t]*(,[ \t]*0*{PROTOCOL_MAJOR}\.[0-9]+[ \t]*)*$"
)
_VERSION_LIST = re.compile(PROTOCOL_VERSION_HEADER_PATTERN)


def versions_consumable(header: str | None) -> bool:
    """Every listed ``MAJOR.MINOR`` must consume 1.0 (same major, minor >= 0)."""
    return header is None or _VERSION_LIST.fullmatch(header) is not None


def _negotiate(env: dict[str, Any]) -> None:
    if not accept_allows_json(env.get("HTTP_ACCEPT")):
        raise WerkError(ErrorCode.INCOMPATIBLE_PROTOCOL, "Accept must allow application/json")
    if not versions_consumable(env.get("HTTP_X_WERK_PROTOCOL_VERSION")):
        raise WerkError(
            ErrorCode.INCOMPATIBLE_PROTOCOL,
            f"this server speaks Werk Protocol {PROTOCOL_VERSION}; the requested version cannot consume it",
        )


#: Request ids correlate logs and answers; they authorize nothing, so they are drawn from a
#: generator seeded once from the OS (no system call per request).
_REQUEST_IDS: Final = random.Random(secrets.token_bytes(32))
_BODY_METHODS: Final = frozenset({"POST", "PUT", "PATCH"})
_DEPLOYMENT_ENV: Final = "HTTP_" + DEPLOYMENT_HEADER.upper().replace("-", "_")


class RequestMiddleware:
    """The host's steps for every request, in the order of the module docstring, as one
    middleware (each request pays one call per phase and classifies its path once).

    Sets on ``req.context``: ``request_id``; ``protocol`` (whether the path is under
    ``/werk/v1``); ``principal`` and ``scope`` (the principal and its instance: for
    ``/werk/v1`` the ``X-Werk-Deployment`` one, else the default) once authenticated, the
    scope closed when the response is done; for ``/werk/v1`` with deployments,
    ``instance_id``; ``body``, every POST/PUT/PATCH body up to the 1 MiB bound (chunked bodies
    too; ``b""`` otherwise). ``/werk/v1`` responses carry the protocol headers."""

    def __init__(
        self, auth: Authenticator, fleet: Fleet | None, browser: BrowserPolicy, limit: int = MAX_REQUEST_BYTES
    ) -> None:
        self._auth = auth
        self._browser = browser
        self._fleet = fleet
        self._limit = limit

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        context = req.context
        context.request_id = f"req_{_REQUEST_IDS.getrandbits(96):024x}"
        context.body = b""
        path = req.path
        protocol = context.protocol = is_protocol_path(path)
        if self._browser.check(req, resp):
            return  # an allowed preflight, answered
        if (
            protocol
            or is_openai_path(path)
            or is_ollama_path(path)
            or path == "/metrics"
            or is_sdapi_path(path)
            or is_comfy_path(path)
        ):
            principal = self._auth.authenticate(presented_key(req.env))
            if principal is None:
                raise WerkError(ErrorCode.UNAUTHORIZED, "missing or invalid API key")
            context.principal = principal
            instance = None
            if protocol:
                _negotiate(req.env)
                if self._fleet is not None:
                    instance = self._select(req)
            elif self._fleet is not None:
                instance = self._fleet.default
            context.scope = RequestScope(principal, instance)
        if req.method in _BODY_METHODS:
            context.body = self._read_body(req, MAX_MEDIA_REQUEST_BYTES if is_media_body_path(path) else self._limit)

    def _select(self, req: falcon.Request) -> Instance | None:
        """The instance a ``/werk/v1`` request controls (``X-Werk-Deployment``, else the default;
        docs/deployments.md, "Routing"), for the whole request. ``/v1`` requests are routed by
        their body's ``model`` in the inference service instead."""
        assert self._fleet is not None
        header = req.env.get(_DEPLOYMENT_ENV)
        deployments = self._fleet.deployments
        if deployments is None:
            if header is not None:
                raise WerkError(ErrorCode.NOT_FOUND, "no deployment instance has that id")
            return None
        instance = deployments.control(header)
        req.context.instance_id = instance.id
        return instance

    def _read_body(self, req: falcon.Request, limit: int) -> bytes:
        length = req.content_length
        if length is not None and length > limit:
            raise BodyTooLarge(limit)
        if length is None:
            # Chunked (or unframed) body: waitress marks a de-chunked, terminated input.
            if not req.env.get("wsgi.input_terminated"):
                return b""
            data: bytes = req.stream.read(limit + 1)
        else:
            data = req.bounded_stream.read(limit + 1)
        if len(data) > limit:
            raise BodyTooLarge(limit)
        return data

    def process_response(
        self, req: falcon.Request, resp: falcon.Response, resource: object, req_succeeded: bool
    ) -> None:
        context = req.context
        if context.protocol:
            protocol_headers(resp, context.request_id, json=not getattr(context, "binary", False))
        respond(req, resp)
        scope = getattr(context, "scope", None)
        if scope is not None:
            scope.close()
