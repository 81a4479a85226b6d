"""The transport-neutral WerkControl interface and its typed errors.

Every operation takes the authenticated :class:`Principal` (never a key) and protocol
DTOs, returns protocol DTOs, and raises :class:`WerkError`. No HTTP status codes here.
Results are immutable (frozen DTOs, tuples) and may be the very object an earlier call
returned when nothing they depend on changed (``capabilities``, ``list_states``): never mutate
one. The HTTP layer serializes such a shared object once (:func:`werk_host.http.io.render_shared`).
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
    Deployments,
    ExpertActionRequest,
    ExpertActionResult,
    ExpertListQuery,
    ExpertPage,
    MemoryReport,
    Observability,
    PrefillRequest,
    PrefillResult,
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
from werk_host.service.principals import Principal

__all__ = ["ErrorCode", "WerkControl", "WerkError", "Principal"]


class WerkControl(Protocol):
    """Every ``/werk/v1`` operation, independent of transport."""

    def info(self, principal: Principal) -> RuntimeInfo: ...
    def capabilities(self, principal: Principal) -> tuple[Capability, ...]: ...
    def memory(self, principal: Principal) -> MemoryReport: ...
    def observability(self, principal: Principal) -> Observability: ...
    def list_states(self, principal: Principal, query: StateListQuery) -> StatePage: ...
    def state_action(self, principal: Principal, state_id: str, request: StateActionRequest) -> StateActionResult: ...
    def prune_states(self, principal: Principal, request: PruneRequest) -> PruneResult: ...
    def list_experts(self, principal: Principal, query: ExpertListQuery) -> ExpertPage: ...
    def expert_action(self, principal: Principal, request: ExpertActionRequest) -> ExpertActionResult: ...
    def prefill(self, principal: Principal, request: PrefillRequest) -> PrefillResult: ...
    def decode(self, principal: Principal, request: DecodeRequest) -> DecodeResult: ...
    def count_tokens(self, principal: Principal, request: ChatRequest) -> TokenCount: ...
    def admission(self, principal: Principal, request: ChatRequest) -> Admission: ...
    def chat_limits(self, principal: Principal, model: str | None) -> ChatLimits: ...
    def reasoning(self, principal: Principal, model: str | None, max_output_tokens: int) -> ReasoningProfile: ...
    def deployments(self, principal: Principal) -> Deployments: ...
