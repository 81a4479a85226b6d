"""OpenAI-compatible inference through the active adapter's hooks."""

from __future__ import annotations

from typing import Any

from werk_host.backend import InferenceResponse
from werk_host.errors import ErrorCode, WerkError
from werk_host.service.counters import ChatStats
from werk_host.service.principals import Principal
from werk_host.service.runtime import BackendRuntime


class InferenceService:
    """Serves ``/v1`` by delegating to the adapter; counts requests for observability."""

    def __init__(self, runtime: BackendRuntime, stats: ChatStats) -> None:
        self.runtime = runtime
        self.stats = stats

    def _call(self, hook: str, what: str, body: dict[str, Any]) -> InferenceResponse:
        adapter = self.runtime.require_adapter(what)
        with self.stats.request():
            response: InferenceResponse | None = self.runtime.plugins.call(hook, adapter, request=body)
        if response is None:
            raise WerkError(ErrorCode.UNSUPPORTED, f"{what} is not supported by backend {adapter.backend}")
        return response

    def chat_completion(self, principal: Principal, body: dict[str, Any]) -> InferenceResponse:
        return self._call("werk_chat_completion", "chat completions", body)

    def text_completion(self, principal: Principal, body: dict[str, Any]) -> InferenceResponse:
        return self._call("werk_text_completion", "completions", body)

    def list_models(self, principal: Principal) -> list[dict[str, Any]]:
        adapter = self.runtime.adapter
        if adapter is None:
            return []
        models: list[dict[str, Any]] | None = self.runtime.plugins.call("werk_list_models", adapter)
        return models or []
