"""The typed facade over operation-hook dispatch: the only way host code reaches a backend.

:class:`BackendHooks` has one method per operation hook of :mod:`werk_host.hookspecs`, with
the hook's typed arguments and result. Each call goes to the adapter's owning plugin (plus
wrapper-only plugins) through :meth:`werk_host.pluginhost.PluginHost.dispatch`, and the result
is checked against the hook's declared return type: a plugin answering with the wrong type is
a plugin defect, reported as ``internal`` naming the plugin (never passed on to crash later).
``None`` stays ``None`` ("not implemented"); :func:`needed` turns it into ``unsupported``.

Capability reports are normalised here: keys become :class:`CapabilityId` members and an
unknown key is flagged on the plugin's inventory record (``werk plugins``) instead of being
dropped silently (docs/plugin-hooks.md, "Capability ids").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from werk_host import hookspecs
from werk_host.errors import ErrorCode, WerkError
from werk_host.logs import public_log_lines
from werk_host.pluginhost import PluginHost
from werk_host.protocol.chat import ChatLimits, ChatRequest, ReasoningProfile
from werk_host.protocol.deployments import DeploymentPlan
from werk_host.protocol.discovery import CapabilityId
from werk_host.protocol.embeddings import EmbeddingLimits, EmbeddingResult, RerankResult
from werk_host.protocol.experts import ExpertActionRequest, ExpertActionResult, ExpertListQuery, ExpertPage
from werk_host.protocol.media import ImageLimits, ImageResult
from werk_host.protocol.speech import SpeechLimits, SpeechResult
from werk_host.protocol.telemetry import WorkerObservation
from werk_host.seam import (
    Adapter,
    CapabilityReport,
    DecodeOutput,
    DecodeWork,
    EmbeddingWork,
    ImageWork,
    InferenceResponse,
    JsonObject,
    MemoryOperation,
    MoveOutput,
    MoveWork,
    PrefilledState,
    PrefillWork,
    PromptCache,
    RerankWork,
    SessionSlot,
    Snapshot,
    SpeechWork,
    StoredStateRef,
)

T = TypeVar("T")
_COUNT_TOKENS = hookspecs.werk_count_tokens.__name__


def needed(result: T | None, what: str, adapter: Adapter | None) -> T:
    """``result`` itself, or ``unsupported`` when the owning plugin does not implement the hook."""
    if result is None:
        backend = adapter.backend if adapter is not None else "(none)"
        raise WerkError(ErrorCode.UNSUPPORTED, f"{what} is not supported by backend {backend}")
    return result


def _defect(plugins: PluginHost, adapter: Adapter, hook: str, expected: str) -> WerkError:
    owner = plugins.owner_of(adapter)
    return WerkError(ErrorCode.INTERNAL, f"plugin {owner} answered {hook} with something other than {expected}")


def _json_object(value: object) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) for k in value)


class BackendHooks:
    """One typed method per operation hook, dispatched to the adapter's owning plugin."""

    def __init__(self, plugins: PluginHost) -> None:
        self._plugins = plugins
        #: How many operation-hook calls that may change a backend's evidence have ended so far
        #: (:meth:`werk_host.pluginhost.PluginHost.operations` itself: read on every gate).
        self.operations: Callable[[], int] = plugins.operations

    def _one(self, adapter: Adapter, spec: object, kind: type[T], **kwargs: object) -> T | None:
        name = getattr(spec, "__name__", "")
        result = self._plugins.dispatch(name, adapter, **kwargs)
        if result is None or isinstance(result, kind):
            return result
        raise _defect(self._plugins, adapter, name, kind.__name__)

    def _many(self, adapter: Adapter, spec: object, kind: type[T], **kwargs: object) -> list[T] | None:
        name = getattr(spec, "__name__", "")
        result = self._plugins.dispatch(name, adapter, **kwargs)
        if result is None:
            return None
        if isinstance(result, list | tuple) and all(isinstance(item, kind) for item in result):
            return list(result)
        raise _defect(self._plugins, adapter, name, f"a list of {kind.__name__}")

    # -- discovery -----------------------------------------------------------------------
    def capabilities(self, adapter: Adapter) -> dict[CapabilityId, CapabilityReport] | None:
        name = hookspecs.werk_capabilities.__name__
        result = self._plugins.dispatch(name, adapter)
        if result is None:
            return None
        if not isinstance(result, Mapping):
            raise _defect(self._plugins, adapter, name, "a mapping of capability ids to reports")
        reports: dict[CapabilityId, CapabilityReport] = {}
        for key, report in result.items():
            if not isinstance(report, CapabilityReport):
                raise _defect(self._plugins, adapter, name, "CapabilityReport values")
            try:
                reports[CapabilityId(key)] = report
            except ValueError:
                self._plugins.flag(self._plugins.owner_of(adapter), f"reports unknown capability id {key!r}")
        return reports

    def compat_key(self, adapter: Adapter, model_id: str) -> dict[str, str] | None:
        name = hookspecs.werk_compat_key.__name__
        result = self._plugins.dispatch(name, adapter, model_id=model_id)
        if result is None:
            return None
        if isinstance(result, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in result.items()):
            return dict(result)
        raise _defect(self._plugins, adapter, name, "a mapping of strings to strings")

    # -- prefill/decode and states ---------------------------------------------------------
    def prefill(self, adapter: Adapter, work: PrefillWork) -> PrefilledState | None:
        return self._one(adapter, hookspecs.werk_prefill, PrefilledState, work=work)

    def snapshot(self, adapter: Adapter, state: PrefilledState) -> Snapshot | None:
        return self._one(adapter, hookspecs.werk_snapshot, Snapshot, state=state)

    def restore(self, adapter: Adapter, stored: StoredStateRef) -> PrefilledState | None:
        return self._one(adapter, hookspecs.werk_restore, PrefilledState, stored=stored)

    def decode(self, adapter: Adapter, work: DecodeWork) -> DecodeOutput | None:
        return self._one(adapter, hookspecs.werk_decode, DecodeOutput, work=work)

    def release_state(self, adapter: Adapter, handle: object) -> bool | None:
        return self._one(adapter, hookspecs.werk_release_state, bool, handle=handle)

    def state_move(self, adapter: Adapter, work: MoveWork) -> MoveOutput | None:
        return self._one(adapter, hookspecs.werk_state_move, MoveOutput, work=work)

    # -- experts ---------------------------------------------------------------------------
    def list_experts(self, adapter: Adapter, query: ExpertListQuery) -> ExpertPage | None:
        return self._one(adapter, hookspecs.werk_list_experts, ExpertPage, query=query)

    def expert_action(self, adapter: Adapter, request: ExpertActionRequest) -> ExpertActionResult | None:
        return self._one(adapter, hookspecs.werk_expert_action, ExpertActionResult, request=request)

    # -- chat planning -----------------------------------------------------------------------
    def count_tokens(self, adapter: Adapter, request: ChatRequest) -> int | None:
        count = self._plugins.dispatch(_COUNT_TOKENS, adapter, request=request)
        if count is None or (isinstance(count, int) and not isinstance(count, bool) and count >= 0):
            return count
        raise _defect(self._plugins, adapter, _COUNT_TOKENS, "a non-negative int" if isinstance(count, int) else "int")

    def request_options(self, adapter: Adapter, request: ChatRequest) -> dict[str, JsonObject]:
        """Every backend member ``werk.<name>`` of ``request``, as the adapter's own plugin
        validated it (``werk_request_options``), by name. A member it does not own is
        ``invalid_request`` (``werk.<name> is not supported by backend <id>``)."""
        validated: dict[str, JsonObject] = {}
        for name, options in request.backend_options().items():
            result = self._one(adapter, hookspecs.werk_request_options, dict, name=name, options=options)
            if result is None:
                raise WerkError(ErrorCode.INVALID_REQUEST, f"werk.{name} is not supported by backend {adapter.backend}")
            validated[name] = result
        return validated

    def chat_limits(self, adapter: Adapter, model: str | None) -> ChatLimits | None:
        return self._one(adapter, hookspecs.werk_chat_limits, ChatLimits, model=model)

    def reasoning_profile(self, adapter: Adapter, model: str | None, max_output_tokens: int) -> ReasoningProfile | None:
        return self._one(
            adapter,
            hookspecs.werk_reasoning_profile,
            ReasoningProfile,
            model=model,
            max_output_tokens=max_output_tokens,
        )

    # -- OpenAI-compatible inference ---------------------------------------------------------
    def chat_completion(self, adapter: Adapter, request: JsonObject) -> InferenceResponse | None:
        return self._one(adapter, hookspecs.werk_chat_completion, InferenceResponse, request=request)

    def text_completion(self, adapter: Adapter, request: JsonObject) -> InferenceResponse | None:
        return self._one(adapter, hookspecs.werk_text_completion, InferenceResponse, request=request)

    def session_slot(self, adapter: Adapter, model_id: str) -> SessionSlot | None:
        name = hookspecs.werk_session_slot.__name__
        result = self._plugins.dispatch(name, adapter, model_id=model_id)
        if result is None or isinstance(result, SessionSlot):
            return result
        raise _defect(self._plugins, adapter, name, "a SessionSlot object")

    def prompt_cache(self, adapter: Adapter) -> PromptCache | None:
        name = hookspecs.werk_prompt_cache.__name__
        result = self._plugins.dispatch(name, adapter)
        if result is None or isinstance(result, PromptCache):
            return result
        raise _defect(self._plugins, adapter, name, "a PromptCache object")

    # -- media (docs/media.md, "The media seam") ---------------------------------------------
    def image_limits(self, adapter: Adapter) -> ImageLimits | None:
        return self._one(adapter, hookspecs.werk_image_limits, ImageLimits)

    def generate_image(self, adapter: Adapter, work: ImageWork) -> ImageResult | None:
        return self._one(adapter, hookspecs.werk_image_generation, ImageResult, work=work)

    def speech_limits(self, adapter: Adapter) -> SpeechLimits | None:
        return self._one(adapter, hookspecs.werk_speech_limits, SpeechLimits)

    def synthesize_speech(self, adapter: Adapter, work: SpeechWork) -> SpeechResult | None:
        return self._one(adapter, hookspecs.werk_speech_synthesis, SpeechResult, work=work)

    # -- embeddings (docs/embeddings.md) ----------------------------------------------------
    def embedding_limits(self, adapter: Adapter) -> EmbeddingLimits | None:
        return self._one(adapter, hookspecs.werk_embedding_limits, EmbeddingLimits)

    def embed(self, adapter: Adapter, work: EmbeddingWork) -> EmbeddingResult | None:
        return self._one(adapter, hookspecs.werk_embed, EmbeddingResult, work=work)

    def rerank(self, adapter: Adapter, work: RerankWork) -> RerankResult | None:
        return self._one(adapter, hookspecs.werk_rerank, RerankResult, work=work)

    def tokenize(self, adapter: Adapter, text: str) -> list[int] | None:
        name = hookspecs.werk_tokenize.__name__
        result = self._plugins.dispatch(name, adapter, text=text)
        if result is None:
            return None
        if isinstance(result, list) and all(type(t) is int for t in result):
            return result
        raise _defect(self._plugins, adapter, name, "a list of token ids")

    # -- observation and memory ----------------------------------------------------------------
    def workers(self, adapter: Adapter) -> list[WorkerObservation] | None:
        return self._many(adapter, hookspecs.werk_workers, WorkerObservation)

    def memory_requirement(self, adapter: Adapter, operation: MemoryOperation, model_id: str) -> int | None:
        nbytes = self._one(adapter, hookspecs.werk_memory_requirement, int, operation=operation, model_id=model_id)
        if isinstance(nbytes, bool):
            raise _defect(self._plugins, adapter, hookspecs.werk_memory_requirement.__name__, "an int")
        return nbytes

    def deployment_plan(self, adapter: Adapter) -> DeploymentPlan | None:
        return self._one(adapter, hookspecs.werk_deployment_plan, DeploymentPlan)

    def log_tail(self, adapter: Adapter, lines: int, secrets: tuple[str, ...] = ()) -> list[str] | None:
        """The backend's own log tail (``werk_log_tail``), redacted again here
        (:func:`~werk_host.logs.public_log_lines`, with the host's ``secrets``) and cut to the
        last ``lines``."""
        found = self._many(adapter, hookspecs.werk_log_tail, str, lines=lines)
        return None if found is None else public_log_lines("\n".join(found), secrets, lines=lines)
