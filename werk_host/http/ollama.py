"""Ollama routes under ``/api``: tags, ps, version, show, chat, generate and embed
(the embed routes are werk_host/http/embeddings.py's).

Thin resources over :mod:`werk_host.compat.ollama` and :mod:`werk_host.compat.ollama_models`
(docs/compat.md). Generation is served by the same inference service as ``/v1`` (admission,
routing, counters, disconnect cancellation). Every error on these paths is Ollama's
``{"error": message}`` (:func:`render_error`, chosen by path in werk_host/http/app.py). The
host's key rule holds: a keyed server wants ``Authorization: Bearer`` (the ollama clients send
it from ``OLLAMA_API_KEY`` or their ``headers``).

``keep_alive`` acts on deployment residency (docs/deployments.md, "Lifecycle"), as in Ollama:
``0`` stops the serving instance once the request is done and no other request uses it; another
value sets how long the serving instance stays loaded once idle (negative: forever), instead of
the profile's ``keep_alive`` (:meth:`~werk_host.deployments.instances.Instance.hold`); a request
without it returns the instance to the profile's. A request without messages or prompt loads the
instance(s) its model names, with the same ``keep_alive`` rule, or with ``keep_alive: 0`` stops
them (those in use once their requests end; one still starting is a 409). That is an
operator's request (docs/deployments.md, "Residency"): a client that is not an operator has
its ``keep_alive`` clamped into the profile's bounds (never shorter than the profile's, never
past its ``keep_alive_max``, never replacing an operator's setting), so it can neither stop
nor pin a shared instance; its unload request is 403.

The translator (:mod:`werk_host.compat.ollama`, with its pydantic models) is imported on the
first request that needs it, not when the app is built (docs/operations.md, "Where the start-up
time goes").
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any, Final, Protocol

import falcon

from werk_host import __version__
from werk_host.compat import calls, ollama_models
from werk_host.compat.ollama_models import Evidence
from werk_host.compat.upstream import sse_events
from werk_host.control import WerkControl
from werk_host.deployments.instances import Instance
from werk_host.deployments.registry import DEPLOYMENT_HEADER
from werk_host.errors import ErrorCode, WerkError
from werk_host.http.embeddings import OllamaEmbed
from werk_host.http.io import parse_body, principal, scope
from werk_host.http.middleware import OLLAMA_PREFIX
from werk_host.protocol import ChatRequest
from werk_host.protocol.base import DEFAULT_OUTPUT_TOKENS
from werk_host.protocol.deployments import InstanceStateName
from werk_host.seam import InferenceResponse, JsonObject
from werk_host.service.embeddings import EmbeddingService
from werk_host.service.fleet import Fleet
from werk_host.service.principals import Principal

if TYPE_CHECKING:
    from werk_host.compat.ollama import OllamaChatRequest, OllamaGenerateRequest, Shape


class Inference(Protocol):
    def chat_completion(
        self, principal: Principal, body: JsonObject, *, clamp_output: bool = False
    ) -> InferenceResponse: ...
    def text_completion(
        self, principal: Principal, body: JsonObject, *, clamp_output: bool = False
    ) -> InferenceResponse: ...


def _json(resp: falcon.Response, status: int, doc: JsonObject) -> None:
    resp.status = status
    resp.content_type = "application/json; charset=utf-8"
    resp.text = json.dumps(doc)


def render_error(resp: falcon.Response, status: int, error: WerkError) -> None:
    """A typed error in Ollama's shape (the app's error mapper calls this for these paths)."""
    from werk_host.compat import ollama as translate

    if error.code is ErrorCode.UNAUTHORIZED:
        resp.set_header("WWW-Authenticate", "Bearer")
    _json(resp, status, translate.error_document(error.public_message()))


def _not_served() -> WerkError:
    return WerkError(ErrorCode.NOT_FOUND, "model is not served here")


#: A 1x1 PNG: the image the vision probe has the serving instance count.
PROBE_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4//8/AAX+Av4N70a4AAAAAElFTkSuQmCC"
_TEXT: Final = {"type": "text", "text": "?"}
#: What each probe asks the serving instance to count: a user message with an image (vision),
#: a user message with one function tool (tools).
PROBES: Final[dict[str, dict[str, Any]]] = {
    "vision": {
        "messages": [
            {
                "role": "user",
                "content": [_TEXT, {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PROBE_PNG}"}}],
            }
        ]
    },
    "tools": {
        "messages": [{"role": "user", "content": "?"}],
        "tools": [{"type": "function", "function": {"name": "probe", "parameters": {"type": "object"}}}],
    },
}


class _Resource:
    def __init__(self, control: WerkControl, inference: Inference, fleet: Fleet) -> None:
        self.control = control
        self.inference = inference
        self.fleet = fleet

    def replicas(self, model: str) -> tuple[Instance, ...]:
        """The instances ``model`` names; 404 naming it and what is served, as the chat path
        answers (docs/deployments.md, "Routing")."""
        deployments = self.fleet.deployments
        if deployments is None:
            raise _not_served()
        found = deployments.replicas(model)
        if not found:
            raise deployments.not_served(model)
        return found

    def context_of(self, req: falcon.Request, name: str) -> int | None:
        """The served per-request context of ``name``; ``None`` when it is not known now."""
        try:
            return self.control.chat_limits(scope(req), name).context_tokens
        except WerkError as err:
            if err.code is ErrorCode.NOT_FOUND:
                raise
            return None

    def thinks(self, req: falcon.Request, name: str, output_tokens: int) -> bool | None:
        """Whether ``name`` has a verified reasoning profile (docs/protocol.md, "Reasoning");
        ``None`` while one of its instances is cold (no profile yet)."""
        if any(r.peek() is None for r in self.replicas(name)):
            return None
        try:
            return self.control.reasoning(scope(req), name, output_tokens).supported
        except WerkError as err:
            if err.code is ErrorCode.NOT_FOUND:
                raise
            return False  # the capability is not offered: no verified profile

    def accepts(self, req: falcon.Request, name: str, probe: str) -> bool | None:
        """Whether the instance serving ``name`` takes what :data:`PROBES` ``probe`` holds (an
        image, a tool): it counts that request (the counting hook answers ``invalid_request``
        for content the model cannot take, docs/plugin-hooks.md); ``None`` when it cannot tell
        (no count offered, a failure). Counting starts a cold instance: callers that must not
        start one check first."""
        request = ChatRequest.model_validate({"model": name, **PROBES[probe]})
        try:
            self.control.count_tokens(scope(req), request)
        except WerkError as err:
            if err.code is ErrorCode.NOT_FOUND:
                raise
            return False if err.code is ErrorCode.INVALID_REQUEST else None
        return True


class Tags(_Resource):
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        _json(resp, 200, ollama_models.tags(self.fleet.deployments))


class Ps(_Resource):
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        doc = ollama_models.running(self.fleet.deployments, lambda name: self.context_of(req, name))
        _json(resp, 200, doc)


class Version(_Resource):
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        _json(resp, 200, {"version": __version__})


class Show(_Resource):
    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        """The model's facts and the capabilities its instances have shown; a cold instance is
        not started, so what only a running instance shows (thinking, vision) is left out
        until it runs."""
        from werk_host.compat import ollama as translate

        request = parse_body(req, translate.OllamaShowRequest)
        name = request.requested
        replicas = self.replicas(name)
        ready = all(r.peek() is not None for r in replicas)
        embedding = ready and all(self._embeds(r) for r in replicas)
        evidence = Evidence(
            embedding=embedding if ready else None,
            tools=self.accepts(req, name, "tools") if ready else None,
            thinking=self.thinks(req, name, DEFAULT_OUTPUT_TOKENS),
            vision=self.accepts(req, name, "vision") if ready else None,
        )
        _json(resp, 200, ollama_models.show(replicas, self.context_of(req, name), evidence))

    def _embeds(self, instance: Instance) -> bool:
        adapter = instance.peek()
        if adapter is None:
            return False
        limits = self.fleet.hooks.embedding_limits(adapter)
        return limits is not None and not limits.rerank


class _Generation(_Resource):
    def _prepare(
        self, req: falcon.Request, request: OllamaChatRequest | OllamaGenerateRequest, body: JsonObject
    ) -> None:
        """What the serving instance must show before ``body`` is sent (docs/compat.md,
        "Ollama"). ``think``: the instances ``model`` names are started (the request needs
        them anyway) so that their reasoning profile is known; ``true`` or a level where there
        is no verified profile is Ollama's 400 ``"<model>" does not support thinking``;
        ``false`` asks for tier ``none`` where there is one (thinking off), else nothing.
        ``images``: an instance that cannot take them is a 400 saying so."""
        name = request.model
        if request.think is not None:
            for instance in self.replicas(name):
                instance.use()
            options = request.options
            wanted = options.num_predict if options is not None and options.num_predict else 0
            supported = self.thinks(req, name, wanted if wanted > 0 else DEFAULT_OUTPUT_TOKENS)
            if request.thinks and not supported:
                raise WerkError(ErrorCode.INVALID_REQUEST, f"{json.dumps(request.model)} does not support thinking")
            if request.think is False:
                body.pop("werk", None)
                if supported:
                    body["werk"] = {"reasoning": {"tier": "none"}}
        if request.has_images and self.accepts(req, name, "vision") is False:
            raise WerkError(
                ErrorCode.INVALID_REQUEST,
                f"{json.dumps(request.model)} does not support images: the instance serving it takes text only",
            )

    def _residency(
        self, req: falcon.Request, resp: falcon.Response, shape: Shape, model: str, keep_alive: float | None
    ) -> None:
        """Ollama's load/unload idiom: start every instance ``model`` names and hold it for
        ``keep_alive`` (or stop them, for ``0``: operators only; a client's load is what its
        first request would do anyway, held within the profile's bounds)."""
        from werk_host.compat import ollama as translate

        replicas = self.replicas(model)
        unload = keep_alive == 0
        operator = principal(req).operator
        if unload and not operator:
            raise WerkError(ErrorCode.FORBIDDEN, "unloading a shared model needs an operator key")
        for instance in replicas:
            if unload:
                self._unload(instance)
            else:
                instance.use()
                instance.hold(keep_alive, operator=operator)
        _json(resp, 200, translate.residency_answer(shape, model, "unload" if unload else "load"))

    @staticmethod
    def _unload(instance: Instance) -> None:
        """Stop ``instance`` now, or, while requests use it, once they end (its keep_alive set to
        0, as a request's ``keep_alive: 0`` does); an instance that is starting cannot be either:
        409 (docs/compat.md, "keep_alive and residency")."""
        if instance.stop("unloaded by an operator (keep_alive 0)"):
            return
        instance.hold(0, operator=True)
        if instance.view().state is InstanceStateName.STARTING:
            raise WerkError(
                ErrorCode.CONFLICT,
                f"instance {instance.id} is starting; unload it once it is ready",
                details={"reason": "starting"},
            )

    def _keep(self, req: falcon.Request, served_by: str | None, keep_alive: float | None) -> None:
        """Apply ``keep_alive`` to the instance that served the request (:meth:`Instance.hold`,
        clamped for a client that is not an operator): ``0`` stops it once this request and any
        other on it are done."""
        deployments = self.fleet.deployments
        instance = deployments.instances.get(served_by) if deployments is not None and served_by else None
        if instance is not None:
            instance.hold(keep_alive, operator=principal(req).operator)

    def _serve(
        self,
        req: falcon.Request,
        resp: falcon.Response,
        call: calls.Call,
        body: JsonObject,
        *,
        shape: Shape,
        model: str,
        stream: bool,
        keep_alive: float | None,
        started_ns: int,
    ) -> None:
        from werk_host.compat import ollama as translate

        response = calls.invoke(req, resp, call, body, clamp_output_tokens=True)  # num_predict is a ceiling
        if response.status >= 400:
            status, text = calls.failure(response)
            _json(resp, status, translate.error_document(text))
            return
        self._keep(req, response.headers.get(DEPLOYMENT_HEADER), keep_alive)
        if stream:
            resp.content_type = "application/x-ndjson"
            events = sse_events(response.body)
            translated = translate.answer_stream(events, shape, model, started_ns)
            resp.stream = calls.streamed(response, translated, events)
            return
        _json(resp, 200, translate.answer(calls.document(response), shape, model, started_ns))


class Chat(_Generation):
    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        from werk_host.compat import ollama as translate

        started = time.monotonic_ns()
        request = parse_body(req, translate.OllamaChatRequest)
        if not request.messages:
            self._residency(req, resp, translate.Shape.CHAT, request.model, request.keep_alive_s)
            return
        body = translate.chat_body(request)
        self._prepare(req, request, body)
        self._serve(
            req,
            resp,
            self.inference.chat_completion,
            body,
            shape=translate.Shape.CHAT,
            model=request.model,
            stream=request.streamed,
            keep_alive=request.keep_alive_s,
            started_ns=started,
        )


class Generate(_Generation):
    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        from werk_host.compat import ollama as translate

        started = time.monotonic_ns()
        request = parse_body(req, translate.OllamaGenerateRequest)
        if not request.prompt:
            self._residency(req, resp, translate.Shape.GENERATE, request.model, request.keep_alive_s)
            return
        chat, body = translate.generate_body(request)
        self._prepare(req, request, body)
        self._serve(
            req,
            resp,
            self.inference.chat_completion if chat else self.inference.text_completion,
            body,
            shape=translate.Shape.GENERATE,
            model=request.model,
            stream=request.streamed,
            keep_alive=request.keep_alive_s,
            started_ns=started,
        )


#: (path under ``/api``, resource class) of every Ollama route.
ROUTES: tuple[tuple[str, type[_Resource]], ...] = (
    ("/tags", Tags),
    ("/ps", Ps),
    ("/version", Version),
    ("/show", Show),
    ("/chat", Chat),
    ("/generate", Generate),
)


def add_routes(
    app: falcon.App[Any, Any], control: WerkControl, inference: Inference, fleet: Fleet, embeddings: EmbeddingService
) -> None:
    for path, resource in ROUTES:
        app.add_route(OLLAMA_PREFIX + path, resource(control, inference, fleet))
    # embed and the older embeddings: the embedding service's path (werk_host/http/embeddings.py)
    app.add_route(OLLAMA_PREFIX + "/embed", OllamaEmbed(embeddings, legacy=False))
    app.add_route(OLLAMA_PREFIX + "/embeddings", OllamaEmbed(embeddings, legacy=True))
