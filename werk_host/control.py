"""The transport-neutral WerkControl interface and its typed errors.

An operation takes the request's :class:`RequestScope` (the authenticated :class:`Principal`,
never a key, and the instance it addresses) where it needs either, and protocol DTOs; it
returns protocol DTOs and raises :class:`WerkError`. No HTTP status codes here. Results are
immutable (frozen DTOs, tuples): never mutate one. The two listings (``capabilities``,
``list_states``) come as a :class:`~werk_host.service.cache.Shared` from the service's cache
layer, handed out again while their stamps are unchanged, with their JSON text made once.
"""

from __future__ import annotations

from typing import Protocol

from werk_host.errors import ErrorCode, WerkError
from werk_host.protocol import (
    Admission,
    Capability,
    ChatLimits,
    ChatRequest,
    DecodeRequest,
    DecodeResult,
    DeploymentActionRequest,
    DeploymentActionResult,
    DeploymentLogs,
    Deployments,
    ExpertActionRequest,
    ExpertActionResult,
    ExpertListQuery,
    ExpertPage,
    MemoryReport,
    Observability,
    PrefillRequest,
    PrefillResult,
    PromptCacheActionRequest,
    PromptCacheActionResult,
    PromptCacheList,
    PromptCacheListQuery,
    PromptCachePruneRequest,
    PruneRequest,
    PruneResult,
    ReasoningProfile,
    RuntimeInfo,
    StateActionRequest,
    StateActionResult,
    StateListQuery,
    StatePage,
    TokenCount,
)
from werk_host.service.cache import Shared
from werk_host.service.principals import Principal
from werk_host.service.scope import RequestScope

__all__ = ["ErrorCode", "WerkControl", "WerkError", "Principal", "RequestScope"]


class WerkControl(Protocol):
    """Every ``/werk/v1`` operation, independent of transport. An operation that acts for a
    caller or on an instance takes the request's :class:`RequestScope` (its principal and
    instance, resolved once by the transport); one that reads host-wide state takes nothing."""

    def info(self, scope: RequestScope) -> RuntimeInfo: ...
    def capabilities(self, scope: RequestScope) -> Shared[tuple[Capability, ...]]: ...
    def memory(self) -> MemoryReport: ...
    def observability(self) -> Observability: ...
    def list_states(self, scope: RequestScope, query: StateListQuery) -> Shared[StatePage]: ...
    def state_action(self, scope: RequestScope, state_id: str, request: StateActionRequest) -> StateActionResult: ...
    def prune_states(self, principal: Principal, request: PruneRequest) -> PruneResult: ...
    def list_prompt_caches(self, principal: Principal, query: PromptCacheListQuery) -> PromptCacheList: ...
    def prompt_cache_action(
        self, principal: Principal, entry_id: str, request: PromptCacheActionRequest
    ) -> PromptCacheActionResult: ...
    def prune_prompt_caches(self, principal: Principal, request: PromptCachePruneRequest) -> PruneResult: ...
    def list_experts(self, scope: RequestScope, query: ExpertListQuery) -> ExpertPage: ...
    def expert_action(self, scope: RequestScope, request: ExpertActionRequest) -> ExpertActionResult: ...
    def prefill(self, scope: RequestScope, request: PrefillRequest) -> PrefillResult: ...
    def decode(self, scope: RequestScope, request: DecodeRequest) -> DecodeResult: ...
    def count_tokens(self, scope: RequestScope, request: ChatRequest) -> TokenCount: ...
    def admission(self, scope: RequestScope, request: ChatRequest) -> Admission: ...
    def chat_limits(self, scope: RequestScope, model: str | None) -> ChatLimits: ...
    def reasoning(self, scope: RequestScope, model: str | None, max_output_tokens: int) -> ReasoningProfile: ...
    def deployments(self) -> Deployments: ...
    def deployment_action(
        self, principal: Principal, instance_id: str, request: DeploymentActionRequest
    ) -> DeploymentActionResult: ...
    def deployment_logs(self, principal: Principal, instance_id: str, lines: int) -> DeploymentLogs: ...
