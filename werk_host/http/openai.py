"""OpenAI-compatible ``/v1`` routes. Errors use OpenAI's error shape, not the Werk envelope.

Responses are relayed as the backend produces them. A client that disconnects is noticed in
two places: while a response streams, the WSGI server fails the next write and closes the app
iterator, which closes the upstream request; before the first byte, the backend's hook polls
:data:`werk_host.seam.client_disconnected`, which is bound here to waitress's
``waitress.client_disconnected`` check (it needs ``channel_request_lookahead >= 1``).

A backend that fails after its answer began (docs/operations.md, "Backend failures") cannot
change the status any more. An event stream then ends with an OpenAI error event
(``data: {"error": {"message", "type": "server_error", "param": null, "code"}}``), then
``data: [DONE]``, then the normal end of the HTTP body; any other body simply ends where the
backend stopped (a ``content-length`` body arrives short, and the server closes the
connection). Either way the failure is one log line, at most one per kind per interval
(:class:`werk_host.logs.RateLimitFilter`), never a traceback, and the client sees no backend
text. A stream that a loading notice began (docs/deployments.md, "Loading notice") ends the same
way when the start fails, with the host's reason (logged where the start failed).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import falcon

from werk_host.deployments.registry import DEPLOYMENT_HEADER
from werk_host.errors import ErrorCode, WerkError
from werk_host.http.io import object_body, principal
from werk_host.logs import RateLimitFilter
from werk_host.seam import PUMP_ENVIRON, InferenceResponse, JsonObject, Pumpable, client_disconnected
from werk_host.service.loading import LoadFailed
from werk_host.service.principals import Principal

log = logging.getLogger(__name__)
log.addFilter(RateLimitFilter())

#: The public message of a failure inside an answer that is not a :class:`WerkError`.
STREAM_FAILED = "the backend failed while it answered"

_TYPES = {
    ErrorCode.INVALID_REQUEST: "invalid_request_error",
    ErrorCode.UNAUTHORIZED: "authentication_error",
    ErrorCode.NOT_FOUND: "not_found_error",
    ErrorCode.RESOURCE_EXHAUSTED: "rate_limit_error",
}


class InferenceControl(Protocol):
    def chat_completion(self, principal: Principal, body: JsonObject) -> InferenceResponse: ...
    def text_completion(self, principal: Principal, body: JsonObject) -> InferenceResponse: ...
    def list_models(self, principal: Principal) -> list[JsonObject]: ...


def render_error(resp: falcon.Response, status: int, error: WerkError) -> None:
    resp.status = status
    resp.content_type = "application/json"
    if error.code is ErrorCode.UNAUTHORIZED:
        resp.set_header("WWW-Authenticate", "Bearer")
    code = error.details.get("openai_code") if error.details else None
    resp.text = json.dumps(
        {
            "error": {
                "message": error.public_message(),
                "type": _TYPES.get(error.code, "server_error" if status >= 500 else "invalid_request_error"),
                "param": None,
                "code": code or error.code.value,
            }
        }
    )


#: The serving layer's pump (werk_host/seam.py, ``PUMP_ENVIRON``).
Pump = Callable[[Iterator[bytes], Pumpable], bool]


def _stream(response: InferenceResponse, pump: Pump | None) -> Iterator[bytes]:
    """The relayed body; a failure inside it ends the answer as the module docstring says. With
    the serving layer's ``pump`` and a body that has a ``source``, one event loop relays it
    (werk_host/pump.py) until it ends, the client leaves or the client reads too slowly, when
    this thread goes on."""
    try:
        if pump is not None and response.source is not None and pump(response.body, response.source):
            return
        yield from response.body
    except Exception as err:  # the answer has begun: end it in words, not with a broken body
        failure = err if isinstance(err, WerkError) else WerkError(ErrorCode.UNAVAILABLE, STREAM_FAILED)
        if not isinstance(err, LoadFailed):  # a failed start was logged where it failed
            log.warning("an answer broke off: %s (%s)", failure.message, type(err).__name__)
        content_type = next((v for k, v in response.headers.items() if k.lower() == "content-type"), "")
        if content_type.lower().startswith("text/event-stream"):
            yield _error_event(failure)
    finally:
        response.close()  # also runs when the client disconnects and the server closes us


def _error_event(error: WerkError) -> bytes:
    """An OpenAI streaming error event and the stream's end marker."""
    code = error.details.get("openai_code") if error.details else None
    event = {
        "error": {
            "message": error.public_message(),
            "type": "server_error",
            "param": None,
            "code": code or error.code.value,
        }
    }
    return b"data: " + json.dumps(event).encode() + b"\n\ndata: [DONE]\n\n"


Call = Callable[[Principal, dict[str, Any]], InferenceResponse]


def _relay(req: falcon.Request, resp: falcon.Response, call: Call) -> None:
    check = req.env.get("waitress.client_disconnected")
    token = client_disconnected.set(check if callable(check) else None)
    try:
        response = call(principal(req), object_body(req))
    finally:
        client_disconnected.reset(token)
    resp.status = response.status
    for name, value in response.headers.items():
        resp.set_header(name, value)
    served_by = response.headers.get(DEPLOYMENT_HEADER)
    if served_by is not None:
        req.context.instance_id = served_by  # the metrics label of this request
    pump = req.env.get(PUMP_ENVIRON)
    resp.stream = _stream(response, pump if callable(pump) else None)


class ChatCompletions:
    def __init__(self, inference: InferenceControl) -> None:
        self.inference = inference

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        _relay(req, resp, self.inference.chat_completion)


class Completions:
    def __init__(self, inference: InferenceControl) -> None:
        self.inference = inference

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        _relay(req, resp, self.inference.text_completion)


class Models:
    def __init__(self, inference: InferenceControl) -> None:
        self.inference = inference

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = "application/json"
        resp.text = json.dumps({"object": "list", "data": self.inference.list_models(principal(req))})


def add_routes(app: falcon.App[Any, Any], inference: InferenceControl) -> None:
    app.add_route("/v1/chat/completions", ChatCompletions(inference))
    app.add_route("/v1/completions", Completions(inference))
    app.add_route("/v1/models", Models(inference))
