"""``/werk/v1`` resources: thin adapters from HTTP to :class:`WerkControl` operations."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import falcon
from pydantic import Field, TypeAdapter, ValidationError

from werk_host.control import WerkControl
from werk_host.errors import ErrorCode, WerkError
from werk_host.http.io import parse_body, parse_query, principal, render_data, render_shared, scope
from werk_host.protocol import (
    DEFAULT_OUTPUT_TOKENS,
    ChatRequest,
    DecodeRequest,
    DeploymentActionRequest,
    DeploymentLogsQuery,
    ExpertActionRequest,
    ExpertListQuery,
    PrefillRequest,
    PromptCacheActionRequest,
    PromptCacheEntryId,
    PromptCacheListQuery,
    PromptCachePruneRequest,
    PruneRequest,
    StateActionRequest,
    StateId,
    StateListQuery,
    StrictModel,
)


class _Resource:
    def __init__(self, control: WerkControl) -> None:
        self.control = control


class InfoResource(_Resource):
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        render_data(req, resp, self.control.info(scope(req)))


class CapabilitiesResource(_Resource):
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        render_shared(req, resp, self.control.capabilities(scope(req)))


class MemoryResource(_Resource):
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        render_data(req, resp, self.control.memory())


class ObservabilityResource(_Resource):
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        render_data(req, resp, self.control.observability())


class StatesResource(_Resource):
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        query = parse_query(req, StateListQuery)
        render_shared(req, resp, self.control.list_states(scope(req), query))


_STATE_ID = TypeAdapter(StateId)


def _path_id(adapter: TypeAdapter[str], value: str, problem: str) -> str:
    """``value``, an id taken from the request path, checked by ``adapter`` (else a 400 saying
    ``problem``) before anything reads it."""
    try:
        adapter.validate_python(value)
    except ValidationError as err:
        raise WerkError(ErrorCode.INVALID_REQUEST, problem) from err
    return value


class StateActionsResource(_Resource):
    def on_post(self, req: falcon.Request, resp: falcon.Response, state_id: str) -> None:
        _path_id(_STATE_ID, state_id, "state_id is not a state id")
        request = parse_body(req, StateActionRequest)
        render_data(req, resp, self.control.state_action(scope(req), state_id, request))


class PruneResource(_Resource):
    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        request = parse_body(req, PruneRequest)
        render_data(req, resp, self.control.prune_states(principal(req), request))


class PromptCachesResource(_Resource):
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        query = parse_query(req, PromptCacheListQuery)
        render_data(req, resp, self.control.list_prompt_caches(principal(req), query))


_ENTRY_ID = TypeAdapter(PromptCacheEntryId)


class PromptCacheActionsResource(_Resource):
    def on_post(self, req: falcon.Request, resp: falcon.Response, instance: str, entry: str) -> None:
        entry_id = _path_id(_ENTRY_ID, f"{instance}/{entry}", "the path does not name a prompt cache entry")
        request = parse_body(req, PromptCacheActionRequest)
        render_data(req, resp, self.control.prompt_cache_action(principal(req), entry_id, request))


class PromptCachePruneResource(_Resource):
    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        request = parse_body(req, PromptCachePruneRequest)
        render_data(req, resp, self.control.prune_prompt_caches(principal(req), request))


class ExpertsResource(_Resource):
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        query = parse_query(req, ExpertListQuery, booleans=("allow_experimental",))
        render_data(req, resp, self.control.list_experts(scope(req), query))


class ExpertActionsResource(_Resource):
    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        request = parse_body(req, ExpertActionRequest)
        render_data(req, resp, self.control.expert_action(scope(req), request))


class PrefillResource(_Resource):
    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        request = parse_body(req, PrefillRequest)
        render_data(req, resp, self.control.prefill(scope(req), request))


class DecodeResource(_Resource):
    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        request = parse_body(req, DecodeRequest)
        render_data(req, resp, self.control.decode(scope(req), request))


class CountTokensResource(_Resource):
    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        request = parse_body(req, ChatRequest)
        render_data(req, resp, self.control.count_tokens(scope(req), request))


class AdmissionResource(_Resource):
    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        request = parse_body(req, ChatRequest)
        render_data(req, resp, self.control.admission(scope(req), request))


class ModelQuery(StrictModel):
    model: str | None = Field(None, min_length=1, max_length=256)


class ReasoningQuery(StrictModel):
    model: str | None = Field(None, min_length=1, max_length=256)
    max_output_tokens: int = Field(DEFAULT_OUTPUT_TOKENS, ge=1, le=1 << 24)


class LimitsResource(_Resource):
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        query = parse_query(req, ModelQuery)
        render_data(req, resp, self.control.chat_limits(scope(req), query.model))


class ReasoningResource(_Resource):
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        query = parse_query(req, ReasoningQuery)
        render_data(req, resp, self.control.reasoning(scope(req), query.model, query.max_output_tokens))


class DeploymentsResource(_Resource):
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        render_data(req, resp, self.control.deployments())


class DeploymentActionsResource(_Resource):
    def on_post(self, req: falcon.Request, resp: falcon.Response, instance_id: str) -> None:
        request = parse_body(req, DeploymentActionRequest)
        render_data(req, resp, self.control.deployment_action(principal(req), instance_id, request))


class DeploymentLogsResource(_Resource):
    def on_get(self, req: falcon.Request, resp: falcon.Response, instance_id: str) -> None:
        query = parse_query(req, DeploymentLogsQuery)
        render_data(req, resp, self.control.deployment_logs(principal(req), instance_id, query.lines))


class OpenApiDocument:
    """The OpenAPI document and its JSON text, made by ``make()`` once, on first use."""

    def __init__(self, make: Callable[[], dict[str, Any]]) -> None:
        self._make: Callable[[], dict[str, Any]] | None = make
        self._lock = threading.Lock()
        self._document: dict[str, Any] = {}
        self._text = ""

    def _made(self) -> None:
        with self._lock:
            if self._make is not None:
                self._document = self._make()
                self._text = json.dumps(self._document, separators=(",", ":"))
                self._make = None

    @property
    def document(self) -> dict[str, Any]:
        self._made()
        return self._document

    @property
    def text(self) -> str:
        self._made()
        return self._text


class OpenApiResource:
    """``GET /werk/v1/openapi.json``: the document inside the protocol envelope."""

    def __init__(self, document: OpenApiDocument) -> None:
        self.document = document

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        render_data(req, resp, self.document.document)


class RawOpenApiResource:
    """``GET /openapi.json``: the bare document, for standard OpenAPI tools (no key needed)."""

    def __init__(self, document: OpenApiDocument) -> None:
        self.document = document

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = "application/json"
        resp.text = self.document.text


#: (path, resource class) for every ``/werk/v1`` route.
ROUTES: tuple[tuple[str, type[_Resource]], ...] = (
    ("/werk/v1/info", InfoResource),
    ("/werk/v1/capabilities", CapabilitiesResource),
    ("/werk/v1/memory", MemoryResource),
    ("/werk/v1/observability", ObservabilityResource),
    ("/werk/v1/chat/count_tokens", CountTokensResource),
    ("/werk/v1/chat/admission", AdmissionResource),
    ("/werk/v1/chat/reasoning", ReasoningResource),
    ("/werk/v1/chat/limits", LimitsResource),
    ("/werk/v1/states", StatesResource),
    ("/werk/v1/states/prune", PruneResource),
    ("/werk/v1/states/{state_id}/actions", StateActionsResource),
    ("/werk/v1/prompt-caches", PromptCachesResource),
    ("/werk/v1/prompt-caches/prune", PromptCachePruneResource),
    ("/werk/v1/prompt-caches/{instance}/{entry}/actions", PromptCacheActionsResource),
    ("/werk/v1/experts", ExpertsResource),
    ("/werk/v1/experts/actions", ExpertActionsResource),
    ("/werk/v1/prefill", PrefillResource),
    ("/werk/v1/decode", DecodeResource),
    ("/werk/v1/deployments", DeploymentsResource),
    ("/werk/v1/deployments/{instance_id}/actions", DeploymentActionsResource),
    ("/werk/v1/deployments/{instance_id}/logs", DeploymentLogsResource),
)
