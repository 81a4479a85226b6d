"""The HTTP glue the Anthropic and Ollama resources share: calling the ``/v1`` inference service
with a translated body, and handing its answer back for translation.

The call is made exactly as ``/v1`` makes it (werk_host/http/openai.py): the hook can poll
waitress's ``client_disconnected`` check while it waits for the backend, the serving instance
is named in ``X-Werk-Deployment`` and labels the request's metrics. The Anthropic and Ollama
routes call with ``clamp_output_tokens=True``: both protocols treat ``max_tokens`` (``num_predict``)
as a ceiling, so admission lowers a requested output above the instance's ceiling instead of
refusing it, and the value sent is named in ``X-Werk-Max-Tokens-Applied`` (docs/compat.md,
"Output budget"; werk_host/service/inference.py). A translated stream closes
the inference response when it ends or when the server closes it because the client went away,
which closes the upstream request and stops the generation.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final, Protocol

import falcon

from werk_host.compat.upstream import SseEvents, coalesced, error_message, read_document
from werk_host.deployments.registry import DEPLOYMENT_HEADER
from werk_host.seam import InferenceResponse, JsonObject, client_disconnected
from werk_host.service.inference import MAX_TOKENS_HEADER
from werk_host.service.principals import Principal


class Call(Protocol):
    """A ``/v1`` inference call (werk_host/service/inference.py): ``clamp_output`` clamps a
    requested output above what the instance allows instead of refusing it."""

    def __call__(self, principal: Principal, body: JsonObject, *, clamp_output: bool = False) -> InferenceResponse: ...


#: The most of an error answer read back (the host's own OpenAI error bodies are small).
MAX_ERROR_BYTES: Final = 64 * 1024
FAILED: Final = "the backend failed to process the request"


def invoke(
    req: falcon.Request, resp: falcon.Response, call: Call, body: JsonObject, *, clamp_output_tokens: bool = False
) -> InferenceResponse:
    """``call(principal, body)`` with the client's disconnect check bound (and, with
    ``clamp_output_tokens``, output clamping on: module docstring); names the serving instance
    on ``resp`` and in ``req.context.instance_id``, and a clamped output in its header."""
    check = req.env.get("waitress.client_disconnected")
    token = client_disconnected.set(check if callable(check) else None)
    try:
        response = call(req.context.principal, body, clamp_output=clamp_output_tokens)  # principal: the middleware's
    finally:
        client_disconnected.reset(token)
    applied = response.headers.get(MAX_TOKENS_HEADER)
    if applied is not None:
        resp.set_header(MAX_TOKENS_HEADER, applied)
    served_by = response.headers.get(DEPLOYMENT_HEADER)
    if served_by is not None:
        resp.set_header(DEPLOYMENT_HEADER, served_by)
        req.context.instance_id = served_by
    return response


def failure(response: InferenceResponse) -> tuple[int, str]:
    """``(status, public message)`` of an error answer, which is read (bounded) and closed.
    The message is the host's sanitized one (werk_host/service/inference.py)."""
    raw = b""
    try:
        for chunk in response.body:
            raw += chunk[: MAX_ERROR_BYTES - len(raw)]
            if len(raw) >= MAX_ERROR_BYTES:
                break
    finally:
        response.close()
    return response.status, error_message(raw) or FAILED


def document(response: InferenceResponse) -> JsonObject:
    """The whole JSON answer; the response is closed."""
    try:
        return read_document(response.body)
    finally:
        response.close()


def streamed(
    response: InferenceResponse, translated: Iterator[bytes], events: SseEvents | None = None
) -> Iterator[bytes]:
    """``translated`` (a translation of ``response.body``) as the client's stream: ``response``
    is closed when it ends or is closed early. The body iterator is closed first, so that the
    host's accounting of it sees what was read even when the translation stopped early. With
    ``events`` (the :class:`SseEvents` ``translated`` reads), the pieces made from events that
    arrived together go out as one write (:func:`~werk_host.compat.upstream.coalesced`)."""
    try:
        yield from (translated if events is None else coalesced(translated, events))
    finally:
        close_body = getattr(response.body, "close", None)
        if callable(close_body):
            close_body()
        response.close()
