"""OpenAI-compatible inference through the active adapter's hooks, with admission.

Generation admission runs before the backend is called: a requested output above the
model's output ceiling is ``output_limit_exceeded``; input plus requested output above the
per-request context is ``context_length_exceeded``. The input is the backend's exact count
when it has one, else the shared estimator of :mod:`werk_host.service.admission`.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from werk_host.backend import Adapter, InferenceResponse
from werk_host.errors import ErrorCode, WerkError, validation_message
from werk_host.protocol import ChatLimits, ChatRequest
from werk_host.service.admission import estimate_input_tokens
from werk_host.service.counters import ChatStats
from werk_host.service.principals import Principal
from werk_host.service.reasoning import apply_reasoning_tier
from werk_host.service.runtime import BackendRuntime


def admission_error(openai_code: str, message: str) -> WerkError:
    return WerkError(ErrorCode.INVALID_REQUEST, message, details={"openai_code": openai_code})


class InferenceService:
    """Serves ``/v1`` by delegating to the adapter; counts requests for observability."""

    def __init__(self, runtime: BackendRuntime, stats: ChatStats) -> None:
        self.runtime = runtime
        self.stats = stats

    def _limits(self, adapter: Adapter, model: str | None) -> ChatLimits | None:
        limits: ChatLimits | None = self.runtime.plugins.call("werk_chat_limits", adapter, model=model)
        return limits

    def _input_tokens(self, adapter: Adapter, request: ChatRequest) -> int:
        try:
            count: int | None = self.runtime.plugins.call("werk_count_tokens", adapter, request=request)
        except WerkError as err:
            if err.code not in (ErrorCode.UNSUPPORTED, ErrorCode.UNAVAILABLE):
                raise
            count = None
        return count if count is not None else estimate_input_tokens(request)

    def admit_chat(self, adapter: Adapter, body: dict[str, Any]) -> dict[str, Any]:
        """Validate, resolve ``werk.reasoning`` and admit a chat request; returns the body to send."""
        try:
            request = ChatRequest.model_validate(body)
        except ValidationError as err:
            raise WerkError(ErrorCode.INVALID_REQUEST, validation_message(err)) from err
        model = request.model if request.model in self.runtime.model_ids() else None
        if request.model is not None and model is None:
            raise WerkError(ErrorCode.NOT_FOUND, "model is not served here", details={"openai_code": "model_not_found"})
        limits = self._limits(adapter, model)
        body = apply_reasoning_tier(self.runtime.plugins, adapter, body, request, limits)
        output = request.requested_output_tokens()
        if limits is not None and limits.max_output_tokens is not None and output > limits.max_output_tokens:
            self.stats.add(requests_rejected=1)
            raise admission_error(
                "output_limit_exceeded",
                f"requested {output} output tokens; this model allows at most {limits.max_output_tokens}",
            )
        if limits is not None and limits.context_tokens is not None:
            needed = self._input_tokens(adapter, request) + output
            if needed > limits.context_tokens:
                self.stats.add(requests_rejected=1)
                raise admission_error(
                    "context_length_exceeded",
                    f"input plus requested output needs {needed} tokens; the context holds {limits.context_tokens}",
                )
        return body

    def _call(self, hook: str, what: str, body: dict[str, Any]) -> InferenceResponse:
        adapter = self.runtime.require_adapter(what)
        if hook == "werk_chat_completion":
            body = self.admit_chat(adapter, body)
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
