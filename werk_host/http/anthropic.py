"""Anthropic Messages routes: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

Thin resources over :mod:`werk_host.compat.anthropic` (docs/compat.md): a request is validated
and translated, served by the same inference service as ``/v1/chat/completions`` (admission,
routing, counters, disconnect cancellation), and its answer translated back. Every error on
these paths, from validation to a backend failure, is Anthropic's error shape
(:func:`render_error`, chosen by path in werk_host/http/app.py). The key may come as
``x-api-key`` (what Anthropic's SDKs send) or a bearer token; the ``anthropic-version`` and
``anthropic-beta`` headers (and Claude Code's ``x-app``, ``?beta=true``) are accepted whatever
their value.

``thinking`` becomes a reasoning tier chosen from the serving instance's verified reasoning
profile (:func:`~werk_host.compat.anthropic_request.thinking_tier`), read here as discovery
(a cold instance has no profile yet). ``max_tokens`` is a ceiling: the call clamps it to the
instance's output ceiling and context (werk_host/compat/calls.py). A count with thinking
resolves its tier for the instance's output ceiling, the output a large request gets.

The translator (its pydantic models are most of its cost) is imported on the first request of
these routes, not when the app is built: a start that serves no Anthropic client never pays for
it (docs/operations.md, "Where the start-up time goes").
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Protocol

import falcon

from werk_host.compat import calls
from werk_host.compat.upstream import sse_events
from werk_host.control import WerkControl
from werk_host.errors import ErrorCode, WerkError
from werk_host.http.errors import retry_after
from werk_host.http.io import parse_body, scope
from werk_host.http.middleware import ANTHROPIC_PREFIX
from werk_host.protocol import ReasoningProfile
from werk_host.seam import InferenceResponse, JsonObject
from werk_host.service.principals import Principal

if TYPE_CHECKING:
    from werk_host.compat.anthropic import CountTokensRequest

#: The response header Anthropic's SDKs read the request id from.
REQUEST_ID_HEADER = "request-id"
#: Anthropic's status for "temporarily overloaded" (its SDKs retry it, honouring ``Retry-After``).
OVERLOADED = 529


class ChatInference(Protocol):
    def chat_completion(
        self, principal: Principal, body: JsonObject, *, clamp_output: bool = False
    ) -> InferenceResponse: ...


def _request_id(req: falcon.Request) -> str:
    found: str = getattr(req.context, "request_id", None) or "req_unknown"
    return found


def _json(req: falcon.Request, resp: falcon.Response, status: int, doc: JsonObject) -> None:
    resp.status = status
    resp.content_type = "application/json"
    resp.set_header(REQUEST_ID_HEADER, _request_id(req))
    resp.text = json.dumps(doc)


def render_error(req: falcon.Request, resp: falcon.Response, status: int, error: WerkError) -> None:
    """A typed error in Anthropic's shape (the app's error mapper calls this for these paths).
    An overload refusal (a 503 asking to retry later) is Anthropic's 529 ``overloaded_error``."""
    if status == 503 and retry_after(error) is not None:
        status = OVERLOADED
    if error.code is ErrorCode.UNAUTHORIZED:
        resp.set_header("WWW-Authenticate", "Bearer")
    from werk_host.compat import anthropic as translate

    _json(req, resp, status, translate.error_document(status, error.public_message(), _request_id(req)))


def _profile(control: WerkControl, req: falcon.Request, model: str, output: int) -> ReasoningProfile | None:
    """The reasoning profile of the instance ``model`` names for ``output`` tokens; ``None`` for
    an unknown model (the chat or count answers that itself)."""
    try:
        return control.reasoning(scope(req), model, output)
    except WerkError:
        return None


def _tier(control: WerkControl, req: falcon.Request, request: CountTokensRequest, output: int) -> str | None:
    """The reasoning tier ``request.thinking`` asks for; the profile is read only where the
    choice depends on it (``adaptive`` is always the default tier)."""
    from werk_host.compat import anthropic as translate

    thinking = request.thinking
    if thinking is None or thinking.type == "adaptive":
        return translate.thinking_tier(thinking, None)
    return translate.thinking_tier(thinking, _profile(control, req, request.model, output))


def _ceiling(control: WerkControl, req: falcon.Request, model: str) -> int | None:
    """The instance's output ceiling (discovery: ``None`` while it is cold or unknown)."""
    try:
        return control.chat_limits(scope(req), model).max_output_tokens
    except WerkError:
        return None


class Messages:
    def __init__(self, control: WerkControl, inference: ChatInference) -> None:
        self.control = control
        self.inference = inference

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        from werk_host.compat import anthropic as translate

        request = parse_body(req, translate.MessagesRequest)
        body = translate.chat_body(request, _tier(self.control, req, request, request.max_tokens))
        response = calls.invoke(req, resp, self.inference.chat_completion, body, clamp_output_tokens=True)
        if response.status >= 400:
            status, text = calls.failure(response)
            _json(req, resp, status, translate.error_document(status, text, _request_id(req)))
            return
        if request.stream:
            resp.content_type = "text/event-stream"
            resp.set_header("Cache-Control", "no-cache")
            resp.set_header(REQUEST_ID_HEADER, _request_id(req))
            events = sse_events(response.body)
            resp.stream = calls.streamed(response, translate.message_stream(events, request), events)
            return
        _json(req, resp, 200, translate.message(calls.document(response), request))


class CountTokens:
    def __init__(self, control: WerkControl) -> None:
        self.control = control

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        from werk_host.compat import anthropic as translate

        request = parse_body(req, translate.CountTokensRequest)
        tier = None
        ceiling = None
        if request.thinking is not None:
            ceiling = _ceiling(self.control, req, request.model)
            tier = _tier(self.control, req, request, ceiling or 1)
        count = self.control.count_tokens(scope(req), translate.count_request(request, tier, ceiling))
        _json(req, resp, 200, {"input_tokens": count.input_tokens})


def add_routes(app: falcon.App[Any, Any], control: WerkControl, inference: ChatInference) -> None:
    app.add_route(ANTHROPIC_PREFIX, Messages(control, inference))
    app.add_route(ANTHROPIC_PREFIX + "/count_tokens", CountTokens(control))
