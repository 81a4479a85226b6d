"""OpenAI Responses route: ``POST /v1/responses`` (stateless; docs/compat.md, "OpenAI Responses").

A thin resource over :mod:`werk_host.compat.responses` and
:mod:`werk_host.compat.responses_answer`: the request is validated and translated into the
OpenAI chat body, served by the same inference service as ``/v1/chat/completions``
(admission, routing by ``model`` with ``X-Werk-Deployment``, counters and metrics, disconnect
cancellation), and its answer translated back. As on the Anthropic and Ollama routes, the
requested output (``max_output_tokens``, an upper bound in OpenAI's definition; 256 when absent
as on ``/v1``) is lowered to the instance's ceiling and to what the context leaves, not
refused, and the value sent is named in ``X-Werk-Max-Tokens-Applied``. Errors are OpenAI's shape, as on every ``/v1``
route (the app's error mapper renders a :class:`WerkError`; an error answer of the inference
service is already that shape and keeps its status and code).

``reasoning.effort`` is forwarded as a Werk reasoning tier only where the serving instance has
verified reasoning control and offers that tier for the request's output; elsewhere it is
ignored, as the page documents.

The translator is imported on the route's first request, not when the app is built
(docs/operations.md, "Where the start-up time goes").
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Protocol

import falcon

from werk_host.compat import calls
from werk_host.compat.upstream import as_object, sse_events
from werk_host.control import WerkControl
from werk_host.errors import WerkError
from werk_host.http.io import parse_body, scope
from werk_host.protocol.base import DEFAULT_OUTPUT_TOKENS
from werk_host.seam import InferenceResponse, JsonObject
from werk_host.service.principals import Principal

if TYPE_CHECKING:
    from werk_host.compat.responses import ResponsesRequest

PATH = "/v1/responses"


class ChatInference(Protocol):
    def chat_completion(
        self, principal: Principal, body: JsonObject, *, clamp_output: bool = False
    ) -> InferenceResponse: ...


def _json(resp: falcon.Response, status: int, doc: JsonObject) -> None:
    resp.status = status
    resp.content_type = "application/json"
    resp.text = json.dumps(doc)


def _relay_error(resp: falcon.Response, response: InferenceResponse) -> None:
    """The inference service's OpenAI error answer (read bounded, then closed) passed on with its
    status, type and code (werk_host/service/inference.py made it: no backend text)."""
    raw = b""
    try:
        for chunk in response.body:
            raw += chunk[: calls.MAX_ERROR_BYTES - len(raw)]
            if len(raw) >= calls.MAX_ERROR_BYTES:
                break
    finally:
        response.close()
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    error = as_object(doc.get("error")) if isinstance(doc, dict) else None
    if error is None or not isinstance(error.get("message"), str) or not error["message"]:
        error = {"message": calls.FAILED, "type": "server_error"}
    _json(resp, response.status, {"error": {k: error.get(k) for k in ("message", "type", "param", "code")}})


class Responses:
    def __init__(self, control: WerkControl, inference: ChatInference) -> None:
        self.control = control
        self.inference = inference

    def _tier(self, req: falcon.Request, request: ResponsesRequest) -> str | None:
        """The tier ``reasoning.effort`` asks for, where the serving runtime has a verified
        reasoning profile offering it for this request's output; else ``None``."""
        from werk_host.compat import responses as translate

        tier = translate.effort_tier(request)
        if tier is None:
            return None
        output = request.max_output_tokens or DEFAULT_OUTPUT_TOKENS
        try:
            profile = self.control.reasoning(scope(req), request.model, output)
        except WerkError:
            return None  # an unknown model: the chat answers that itself
        if not profile.supported:
            return None
        offered = {t.id.value for t in profile.tiers if t.available}
        return tier if tier in offered else None

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        from werk_host.compat import responses as translate
        from werk_host.compat import responses_answer as answers

        request = parse_body(req, translate.ResponsesRequest)
        body = translate.chat_body(request, self._tier(req, request))
        # max_output_tokens is an upper bound (docs/compat.md, "Output budget"): clamped, not refused
        response = calls.invoke(req, resp, self.inference.chat_completion, body, clamp_output_tokens=True)
        if response.status >= 400:
            _relay_error(resp, response)
            return
        if request.stream:
            resp.content_type = "text/event-stream"
            resp.set_header("Cache-Control", "no-cache")
            events = sse_events(response.body)
            resp.stream = calls.streamed(response, answers.response_stream(events, request), events)
            return
        _json(resp, 200, answers.response_object(calls.document(response), request))


def add_routes(app: falcon.App[Any, Any], control: WerkControl, inference: ChatInference) -> None:
    app.add_route(PATH, Responses(control, inference))
