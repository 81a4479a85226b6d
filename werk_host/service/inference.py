"""OpenAI-compatible inference through the active adapter's hooks, with admission.

Generation admission runs before the backend is called: a requested output above the
model's output ceiling is ``output_limit_exceeded``; input plus requested output above the
per-request context is ``context_length_exceeded``. A request admitted with *output clamping*
(the Anthropic and Ollama routes, which treat ``max_tokens`` as a ceiling: ``clamp_output=True``,
set by werk_host/compat/calls.py; on ``/v1`` an instance whose profile says
``output_limit = "clamp"``) instead has its requested output lowered to the ceiling and to what
the context leaves after the input; the value sent is named in the ``X-Werk-Max-Tokens-Applied``
response header and the request counts in ``requests_clamped`` (docs/compat.md). An input that
leaves no room is still ``context_length_exceeded``. The input is the backend's exact count
when it has one, else the shared estimator of :mod:`werk_host.service.admission`. The exact
count is skipped when :class:`~werk_host.service.admission.FitBounds` proves the request fits
(an upper bound from calibrated evidence, no backend call); answers are the same either way.
``/v1/completions`` (and so Ollama's ``raw`` generate) is admitted by the same two rules, its
input being each prompt's token ids or, for text, the estimator's count (no hook counts raw
text); its body is validated as :class:`~werk_host.protocol.chat.CompletionRequest` first.

Counters: an admitted request counts in ``requests_total`` and stays in ``requests_active``
until its relayed response is closed. It counts as failed when the backend raised or answered
an error status (a client that went away is not a failure). Token totals add the OpenAI
``usage`` object when the response carries one (found in a bounded tail of the relayed bytes;
nothing is buffered for it); without one they are not guessed.

Names: a relayed answer's ``model`` is the request's ``model`` as sent, else the serving
instance's id, never the backend's own name for it (:mod:`werk_host.service.naming`).

Concurrency: with a gate (werk_host/service/gate.py, as ``werk serve`` wires it) a request
enters it first (host-wide and per-key bounds, refused at once), is seated on its instance after
admission (waiting in the instance's bounded queue), and leaves it when its relayed response is
closed (its end, an error, or the client's disconnect); a refusal counts as rejected.

Loading notice (docs/deployments.md, "Loading notice"; werk_host/service/loading.py): when the
profile asks for one, a streamed chat request whose instance is not ready is answered at once
with a 200 event stream that shows the notice while the instance starts, then the real answer;
a failure from then on (start, admission, seat, backend refusal) ends that stream with the
route's error event (:class:`~werk_host.service.loading.LoadFailed`). Counters and usage are the
real answer's, as without the notice.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, TypeVar

from pydantic import ValidationError

from werk_host.deployments.instances import Instance
from werk_host.deployments.registry import DEPLOYMENT_HEADER
from werk_host.errors import ErrorCode, WerkError, validation_message
from werk_host.models import ModelManifest
from werk_host.protocol import ChatLimits, ChatRequest
from werk_host.protocol.chat import CompletionRequest
from werk_host.protocol.deployments import InstanceStateName
from werk_host.seam import Adapter, InferenceResponse, JsonObject, client_disconnected
from werk_host.service.admission import FitBounds, estimate_input_tokens, prompt_tokens
from werk_host.service.counters import DEFAULT_INSTANCE, ChatStats
from werk_host.service.fleet import Fleet
from werk_host.service.gate import InferenceGate, Ticket
from werk_host.service.loading import LoadFailed, notice_event
from werk_host.service.naming import named
from werk_host.service.principals import Principal
from werk_host.service.promptcache import PromptCaches
from werk_host.service.reasoning import resolve_reasoning
from werk_host.service.scope import no_backend
from werk_host.service.tail import Tail

log = logging.getLogger(__name__)

USAGE_TAIL_BYTES = 8192
_USAGE = re.compile(rb'"usage"\s*:\s*\{')
#: Called with the prompt tokens a relayed answer reports (see ``InferenceService._admit``).
UsageCheck = Callable[[int], None]
#: Names the requested output Werk sent when it clamped the client's (module docstring).
MAX_TOKENS_HEADER: Final = "X-Werk-Max-Tokens-Applied"
#: The body fields that carry a requested output.
_OUTPUT_FIELDS: Final = ("max_tokens", "max_completion_tokens")


def with_output(body: JsonObject, tokens: int) -> JsonObject:
    """``body`` (a copy) asking for ``tokens`` output tokens in every output field it has
    (``max_tokens`` when it has none)."""
    fields = [name for name in _OUTPUT_FIELDS if body.get(name) is not None] or ["max_tokens"]
    return {**body, **dict.fromkeys(fields, tokens)}


def admission_error(openai_code: str, message: str) -> WerkError:
    return WerkError(ErrorCode.INVALID_REQUEST, message, details={"openai_code": openai_code})


def usage_tokens(tail: bytes) -> tuple[int, int] | None:
    """``(prompt_tokens, completion_tokens)`` of the last OpenAI ``usage`` object in ``tail``."""
    found = None
    for found in _USAGE.finditer(tail):  # noqa: B007 - the last match is wanted
        pass
    if found is None:
        return None
    try:
        usage, _ = json.JSONDecoder().raw_decode(tail[found.end() - 1 :].decode("utf-8", "replace"))
    except ValueError:
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if type(prompt) is not int or type(completion) is not int or prompt < 0 or completion < 0:
        return None
    return prompt, completion


#: Backend error statuses as relayed on ``/v1``: (status, OpenAI type, code, public message).
#: A backend's own error text never reaches the client (it may carry file paths, template
#: source or parser internals); it goes to the server log, truncated.
_BACKEND_ERRORS: dict[int, tuple[int, str, str, str]] = {
    400: (400, "invalid_request_error", "invalid_request", "the backend refused this request as invalid"),
    404: (404, "not_found_error", "not_found", "the backend has no such resource"),
    413: (413, "invalid_request_error", "request_too_large", "the request is too large for the backend"),
    429: (429, "rate_limit_error", "rate_limited", "the backend is busy; retry later"),
    503: (503, "server_error", "unavailable", "the backend is temporarily unavailable; retry later"),
}
_BACKEND_FAILED = (502, "server_error", "backend_error", "the backend failed to process the request")
MAX_BACKEND_ERROR_BYTES = 64 * 1024


_ERROR_CODES = {400: ErrorCode.INVALID_REQUEST, 404: ErrorCode.NOT_FOUND, 429: ErrorCode.RESOURCE_EXHAUSTED}


def _relayed_error(response: InferenceResponse) -> WerkError:
    """The error of a sanitized error answer (:func:`sanitized_error`; the host's own public
    text), which is read and closed."""
    try:
        raw = b"".join(response.body)[:MAX_BACKEND_ERROR_BYTES]
    finally:
        response.close()
    try:
        error = json.loads(raw).get("error") or {}
    except (ValueError, AttributeError):
        error = {}
    message = error.get("message") if isinstance(error, dict) else None
    code = _ERROR_CODES.get(response.status, ErrorCode.UNAVAILABLE)
    text = message if isinstance(message, str) else _BACKEND_FAILED[3]
    return WerkError(code, text, retryable=response.status >= 429)


def sanitized_error(response: InferenceResponse) -> InferenceResponse:
    """An OpenAI-shaped error in place of a backend's error ``response`` (which is read, bounded,
    logged and closed). 4xx statuses other than those mapped become 400; 5xx and a backend's own
    401/403 (its credentials are ours, not the client's) become 502."""
    raw = b""
    try:
        for chunk in response.body:
            raw += chunk[: MAX_BACKEND_ERROR_BYTES - len(raw)]
            if len(raw) >= MAX_BACKEND_ERROR_BYTES:
                break
    finally:
        response.close()
    log.warning("backend answered %s: %.300s", response.status, raw.decode("utf-8", "replace"))
    if response.status in _BACKEND_ERRORS:
        status, kind, code, message = _BACKEND_ERRORS[response.status]
    elif 400 <= response.status < 500 and response.status not in (401, 403):
        status, kind, code, message = _BACKEND_ERRORS[400]
    else:
        status, kind, code, message = _BACKEND_FAILED
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()
    headers = {"Content-Type": "application/json", "Content-Length": str(len(body))}
    return InferenceResponse(status=status, headers=headers, body=iter([body]), close=lambda: None)


#: A ``/v1`` body as its route validates it.
Parsed = ChatRequest | CompletionRequest


@dataclass(frozen=True)
class _Call:
    """One ``/v1`` request's scope, passed explicitly from the gate to the answer: what it
    asks for (in words, for errors), its body and that body validated, its gate ticket, whether
    its output is clamped, and whose it is."""

    what: str
    body: JsonObject
    parsed: Parsed
    ticket: Ticket | None
    clamp: bool
    principal: Principal

    @property
    def chat(self) -> bool:
        return isinstance(self.parsed, ChatRequest)


_Shape = TypeVar("_Shape", ChatRequest, CompletionRequest)


def _validated(shape: type[_Shape], body: JsonObject) -> _Shape:
    """``body`` validated as ``shape``; ``invalid_request`` naming the failing fields."""
    try:
        return shape.model_validate(body)
    except ValidationError as err:
        raise WerkError(ErrorCode.INVALID_REQUEST, validation_message(err)) from err


def _client_gone() -> bool:
    gone = client_disconnected.get()
    return gone is not None and gone()


class InferenceService:
    """Serves ``/v1`` by delegating to the adapter; counts requests for observability."""

    def __init__(
        self,
        fleet: Fleet,
        stats: ChatStats,
        gate: InferenceGate | None = None,
        prompt_caches: PromptCaches | None = None,
    ) -> None:
        self.fleet = fleet
        self.stats = stats
        #: automatic prompt caches (werk_host/service/promptcache.py); ``None``: plain relays
        self.prompt_caches = prompt_caches
        #: ``werk serve``'s admission gate (werk_host/service/gate.py); ``None`` for in-process
        #: callers, which hold no server worker threads.
        self.gate = gate
        self.bounds = FitBounds(fleet.hooks.count_tokens)

    def _limits(self, adapter: Adapter, model: str | None) -> ChatLimits | None:
        return self.fleet.hooks.chat_limits(adapter, model)

    def _input_tokens(self, adapter: Adapter, request: ChatRequest) -> tuple[int, WerkError | None]:
        """The backend's exact count (checked against the fit bound), else the estimate, with
        the backend's ``unavailable`` when that is why there is no count: a refusal on the
        estimate alone would then blame the request for a backend that is down."""
        try:
            count = self.fleet.hooks.count_tokens(adapter, request)
        except WerkError as err:
            if err.code not in (ErrorCode.UNSUPPORTED, ErrorCode.UNAVAILABLE):
                raise
            down = err if err.code is ErrorCode.UNAVAILABLE else None
            return estimate_input_tokens(request), down
        if count is None:
            return estimate_input_tokens(request), None
        self.bounds.observe(adapter, request, count)
        return count, None

    def _fit_bound(self, adapter: Adapter, request: ChatRequest, budget: int) -> int | None:
        """An upper bound on the input that proves it fits in ``budget`` tokens, else ``None``."""
        bound = self.bounds.bound(adapter, request)
        return bound if bound is not None and bound <= budget else None

    def admit_chat(self, adapter: Adapter, body: JsonObject, served: ModelManifest | None = None) -> JsonObject:
        """Validate, resolve ``werk.reasoning`` and admit a chat request for ``adapter``, which
        serves ``served`` (default: the default instance's model); returns the body to send."""
        return self._admit(adapter, body, served if served is not None else self.fleet.model)[0]

    def _admit(
        self,
        adapter: Adapter,
        body: JsonObject,
        served: ModelManifest | None,
        clamp: bool = False,
        request: ChatRequest | None = None,
    ) -> tuple[JsonObject, UsageCheck | None, int | None]:
        """:meth:`admit_chat`, plus, when the fit bound admitted the request (no exact count),
        a check of the prompt tokens the backend then reports against that bound: a count above
        it withdraws the evidence (:meth:`FitBounds.observe`). With ``clamp`` the requested
        output is lowered instead of refused (module docstring); the third member is then the
        output sent, when it was lowered. ``request``: ``body`` already validated."""
        if request is None:
            request = _validated(ChatRequest, body)
        options = self.fleet.hooks.request_options(adapter, request)  # backend members werk.<name>
        if options:  # the owner's validated options reach the adapter (docs/plugin-hooks.md)
            werk = body["werk"]
            body = {**body, "werk": {**(werk if isinstance(werk, dict) else {}), **options}}
        self._check_served(request.model, served)
        limits = self._limits(adapter, served.name if request.model is not None and served is not None else None)
        applied = None
        ceiling = limits.max_output_tokens if limits is not None else None
        if clamp and ceiling is not None and request.requested_output_tokens() > ceiling:
            applied, body = ceiling, with_output(body, ceiling)
            request = request.model_copy(update=dict.fromkeys(_OUTPUT_FIELDS, None) | {"max_tokens": ceiling})
        body, request = resolve_reasoning(self.fleet.hooks, adapter, body, request, limits)  # once, for every hook
        output = request.requested_output_tokens()
        self._check_output(limits, output)
        if limits is not None and limits.context_tokens is not None:
            if self._fit_bound(adapter, request, limits.context_tokens - output) is not None:
                return body, partial(self.bounds.observe, adapter, request), applied
            needed, down = self._input_tokens(adapter, request)
            if clamp and needed < limits.context_tokens < needed + output:
                output = limits.context_tokens - needed
                applied, body = output, with_output(body, output)
            if down is not None and needed + output > limits.context_tokens:
                raise down  # the backend could not count: say so, not "too long" on a guess
            self._check_context(limits, needed, output)
        return body, None, applied

    def _check_output(self, limits: ChatLimits | None, output: int) -> None:
        """``output_limit_exceeded`` for a requested output above the model's ceiling."""
        if limits is not None and limits.max_output_tokens is not None and output > limits.max_output_tokens:
            self.stats.add(requests_rejected=1)
            raise admission_error(
                "output_limit_exceeded",
                f"requested {output} output tokens; this model allows at most {limits.max_output_tokens}",
            )

    def _check_context(self, limits: ChatLimits, needed: int, output: int) -> None:
        """``context_length_exceeded`` for ``needed`` input tokens plus the requested ``output``
        above the context; the message says when the input alone exceeds it."""
        context = limits.context_tokens
        if context is not None and needed + output > context:
            self.stats.add(requests_rejected=1)
            if needed > context:
                message = f"the input alone needs {needed} tokens; the context holds {context}"
            else:
                message = f"input plus requested output needs {needed + output} tokens; the context holds {context}"
            raise admission_error("context_length_exceeded", message)

    def _check_served(self, model: str | None, served: ModelManifest | None) -> None:
        """Without deployments, a ``model`` other than the served one is not found."""
        if self.fleet.deployments is None and model not in (None, *((served.name,) if served else ())):
            raise WerkError(ErrorCode.NOT_FOUND, "model is not served here", details={"openai_code": "model_not_found"})

    def _admit_completion(
        self,
        adapter: Adapter,
        body: JsonObject,
        served: ModelManifest | None,
        clamp: bool = False,
        request: CompletionRequest | None = None,
    ) -> tuple[JsonObject, int | None]:
        """Validate and admit a ``/v1/completions`` request (and Ollama's ``raw`` generate): the
        same output ceiling as chat, and each prompt's input (:func:`prompt_tokens`) plus the
        requested output within the context; with ``clamp``, the output lowered to fit as for
        chat. Returns the body to send and the output sent when it was lowered."""
        if request is None:
            request = _validated(CompletionRequest, body)
        self._check_served(request.model, served)
        limits = self._limits(adapter, served.name if request.model is not None and served is not None else None)
        output = request.requested_output_tokens()
        applied = None
        if clamp and limits is not None and limits.max_output_tokens is not None and output > limits.max_output_tokens:
            applied = output = limits.max_output_tokens
        self._check_output(limits, output)
        if limits is not None:
            needed = max(prompt_tokens(p) for p in request.prompts())
            context = limits.context_tokens
            if clamp and context is not None and needed < context < needed + output:
                applied = output = context - needed
            self._check_context(limits, needed, output)
        return (body if applied is None else {**body, "max_tokens": applied}), applied

    def _route(self, body: JsonObject) -> Instance | None:
        """The instance a ``/v1`` body's ``model`` names (an instance id, a served model name or
        an alias, advancing the alias's round-robin), else the default instance."""
        deployments = self.fleet.deployments
        model = body.get("model")
        if deployments is None or not isinstance(model, str):
            return self.fleet.default
        return deployments.route(model)

    def _enter(self, principal: Principal) -> Ticket | None:
        """A gate ticket for ``principal`` (the host-wide and per-key bounds), or the refusal."""
        if self.gate is None:
            return None
        try:
            return self.gate.enter(principal.id)
        except WerkError:
            self.stats.add(requests_rejected=1)
            raise

    def _seat(self, ticket: Ticket | None, adapter: Adapter, label: str) -> None:
        """Wait for a seat on the serving instance (its capacity: the backend's concurrent
        requests); a refusal is counted as rejected."""
        if ticket is None:
            return
        limits = self.fleet.hooks.chat_limits(adapter, None)
        capacity = limits.max_concurrent_requests if limits is not None else None
        queues = limits is not None and limits.engine_queues
        try:
            ticket.seat(label, capacity, client_disconnected.get(), engine_queues=queues)
        except WerkError:
            self.stats.add(instance=label, requests_rejected=1)
            raise

    def _call(self, chat: bool, what: str, body: JsonObject, principal: Principal, clamp: bool) -> InferenceResponse:
        """Serve one request inside the gate; its ticket is released when the answer closes.
        ``clamp``: a requested output above what the instance allows is clamped, not refused.
        The body is validated first: an invalid one takes no gate place and starts no instance."""
        parsed: Parsed = _validated(ChatRequest, body) if chat else _validated(CompletionRequest, body)
        ticket = self._enter(principal)
        try:
            return self._gated(_Call(what, body, parsed, ticket, clamp, principal))
        except BaseException:
            if ticket is not None:
                ticket.release()
            raise

    def _gated(self, call: _Call) -> InferenceResponse:
        instance = self._route(call.body)
        if call.chat and instance is not None and call.body.get("stream") is True and self._notice(instance):
            return self._noticed(instance, call)
        return self._serve(call, instance)

    def _notice(self, instance: Instance) -> bool:
        """Whether a streamed chat request for ``instance`` gets a loading notice now: the
        profile asks for one (the instance's ``loading_notice``, else ``[residency]``'s) and the
        instance is not ready (werk_host/service/loading.py)."""
        deployments = self.fleet.deployments
        wanted = instance.spec.loading_notice
        if wanted is None:
            wanted = deployments is not None and deployments.residency.rules.loading_notice
        return wanted and instance.view().state is not InstanceStateName.READY

    def _noticed(self, instance: Instance, call: _Call) -> InferenceResponse:
        """A 200 event stream at once: the loading notice, then (once the instance is ready and
        the request admitted) the real answer, or :class:`LoadFailed` (werk_host/service/loading.py)."""
        model = call.body.get("model")
        shown = model if isinstance(model, str) else instance.id
        served: list[InferenceResponse] = []

        def stream() -> Iterator[bytes]:
            began = time.monotonic()
            yield notice_event(instance.id, shown, f"Loading model {shown} (instance {instance.id})…\n")
            try:
                answer = self._serve(call, instance)
            except WerkError as err:
                raise LoadFailed.of(err) from err
            served.append(answer)
            yield notice_event(instance.id, shown, f"Ready in {time.monotonic() - began:.1f} s.\n\n")
            if answer.status >= 400:
                raise LoadFailed.of(_relayed_error(answer))
            yield from answer.body

        def close() -> None:
            if served:
                served[0].close()  # releases the ticket and the instance (``_tracked``)
            elif call.ticket is not None:
                call.ticket.release()

        headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", DEPLOYMENT_HEADER: instance.id}
        return InferenceResponse(status=200, headers=headers, body=stream(), close=close)

    def _serve(self, call: _Call, instance: Instance | None) -> InferenceResponse:
        """Start (or wait for) ``instance``, admit the request, seat it and forward it."""
        body, parsed, ticket = call.body, call.parsed, call.ticket
        try:
            if instance is None:
                raise no_backend(call.what)
            # in flight from before the start on: keep-alive cannot stop it under this request
            adapter = instance.use(enter=True)
            verify = None
            clamp = call.clamp or instance.spec.output_limit == "clamp"
            if isinstance(parsed, ChatRequest):
                body, verify, applied = self._admit(adapter, body, instance.manifest, clamp, parsed)
            else:
                body, applied = self._admit_completion(adapter, body, instance.manifest, clamp, parsed)
            self._seat(ticket, adapter, instance.id)
        except BaseException:
            if instance is not None:
                instance.leave()
            raise
        label = instance.id if instance is not None else DEFAULT_INSTANCE
        self.stats.add(instance=label, requests_total=1, requests_active=1, requests_clamped=int(applied is not None))
        hooks = self.fleet.hooks
        try:
            chat = call.chat
            path = "/v1/chat/completions" if chat else "/v1/completions"
            caches = self.prompt_caches
            response = caches.forward(call.principal, label, adapter, path, body) if caches is not None else None
            if response is None:
                response = hooks.chat_completion(adapter, body) if chat else hooks.text_completion(adapter, body)
            if response is None:
                raise WerkError(ErrorCode.UNSUPPORTED, f"{call.what} is not supported by backend {adapter.backend}")
            if response.status >= 400:
                response = sanitized_error(response)
            asked = body.get("model")  # a JSON document is read here: a failure is still ours to answer
            response = named(response, asked if isinstance(asked, str) else label)  # werk_host/service/naming.py
        except BaseException:
            self.stats.add(instance=label, requests_active=-1, requests_failed=0 if _client_gone() else 1)
            if instance is not None:
                instance.leave()
            raise
        if instance is not None:
            response.headers[DEPLOYMENT_HEADER] = instance.id
        if applied is not None:
            response.headers[MAX_TOKENS_HEADER] = str(applied)
        return self._tracked(response, label, instance, verify, ticket)

    def _tracked(
        self,
        response: InferenceResponse,
        label: str,
        instance: Instance | None,
        verify: UsageCheck | None = None,
        ticket: Ticket | None = None,
    ) -> InferenceResponse:
        """``response`` counted as active (and its instance in use, its gate ticket held) until
        closed, with its usage added to the totals (and its prompt tokens given to ``verify``)."""
        stats = self.stats
        state: dict[str, Any] = {"tail": b"", "failed": response.status >= 400, "closed": False}

        def body() -> Iterator[bytes]:
            tail = Tail(USAGE_TAIL_BYTES)
            try:
                for chunk in response.body:
                    tail.add(chunk)
                    yield chunk
            except GeneratorExit:
                raise
            except BaseException:
                state["failed"] = True
                raise
            finally:
                state["tail"] = tail.value()

        def close() -> None:
            if state["closed"]:
                return
            state["closed"] = True
            try:
                response.close()
            finally:
                if ticket is not None:
                    ticket.release()
                if instance is not None:
                    instance.leave()
                usage = None if state["failed"] else usage_tokens(state["tail"])
                stats.add(
                    instance=label,
                    requests_active=-1,
                    requests_failed=1 if state["failed"] else 0,
                    prompt_tokens_total=usage[0] if usage else 0,
                    completion_tokens_total=usage[1] if usage else 0,
                )
                if usage is not None and verify is not None:
                    verify(usage[0])

        source = response.source  # the body passes b"" on (werk_host/seam.py, Pumpable)
        return InferenceResponse(response.status, response.headers, body(), close, source)

    def chat_completion(
        self, principal: Principal, body: JsonObject, *, clamp_output: bool = False
    ) -> InferenceResponse:
        """``/v1/chat/completions``; ``clamp_output``: the compatibility routes' output rule
        (module docstring)."""
        return self._call(True, "chat completions", body, principal, clamp_output)

    def text_completion(
        self, principal: Principal, body: JsonObject, *, clamp_output: bool = False
    ) -> InferenceResponse:
        return self._call(False, "completions", body, principal, clamp_output)

    def list_models(self, principal: Principal) -> list[JsonObject]:
        """``/v1/models``: every instance id and alias (docs/deployments.md, "Routing"); an
        instance with its residency ``status`` and since when (docs/deployments.md, "Inventory")."""
        deployments = self.fleet.deployments
        if deployments is None:
            return []
        entries: list[JsonObject] = []
        for instance in deployments.instances.values():
            view = instance.view()
            entries.append(
                {
                    "id": instance.id,
                    "object": "model",
                    "owned_by": "werk",
                    "created": 0,
                    "status": view.status,
                    "status_since_unix_ms": view.since_unix_ms,
                }
            )
        for alias in deployments.aliases:
            entries.append({"id": alias, "object": "model", "owned_by": "werk", "created": 0})
        return entries
