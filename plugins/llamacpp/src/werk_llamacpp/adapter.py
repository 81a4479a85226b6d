"""The llama.cpp adapter: one managed ``llama-server`` per model, probed slot state.

State model (docs/architecture.md, "llama.cpp slot use" and "Snapshot format of llama.cpp states"):

* One slot, the last one (``state_slot``), is where Werk prefills, restores and decodes
  named states; the functional probe runs there too. A lock (``slot_lock``) serializes that
  work. Ordinary ``/v1`` traffic never reaches that slot while it runs (:mod:`.slots`: every
  relayed request is pinned to a free ordinary slot; with one slot only it holds the lock).
* A prefilled state's live copy is whatever the state slot holds. The adapter remembers which
  handle the slot holds (``_slot_owner``) and forgets it whenever anything else may have used
  the slot; decode then restores the state from its snapshot before generating.
* A snapshot is the llama-server slot file followed by Werk's trailer (:mod:`.snapshot`): the
  exact prompt tokens, the acknowledged save counters and the tokens' keyed digest
  (:mod:`.integrity`). A save is kept only when the slot file's own token ids are exactly the
  prompt Werk evaluated (else a retryable ``unavailable``, nothing stored); a restore requires
  the slot file's token ids to equal the trailer's, the digest to verify under this adapter's
  key, and ``n_restored``/``n_read`` to equal the counters (``corrupt_state`` otherwise); the
  host verified the payload's size and SHA-256 before.
* Before state work the child must answer ``/health`` within :data:`HEALTH_TIMEOUT_S` (a
  stopped child is a retryable ``unavailable``, and is never probed).
* Compatibility (docs/states.md): a state's compatibility key is :meth:`LlamaCppAdapter.compat_key_of`
  (executable and help SHA-256, the KV-relevant effective arguments, model identity and files,
  cache layout). The process generation is not part of it: a state written by an earlier
  generation is restored when the compatibility key is exactly equal, the payload verifies and the
  acknowledgements are exact, and only by a generation whose functional probe passed. Only such
  a generation reports the state, prefill/decode and cross-restart capabilities as
  ``experimental``. Handoffs and live slot contents still die with their generation.

Every operation hook is a method of :class:`LlamaCppAdapter` marked ``@hookimpl(specname=...)``
(docs/plugin-kit.md): the host registers each adapter it creates with its plugin manager, so an
operation on this adapter reaches these methods. The class is built from three modules, by
concern: :mod:`.core` (the child process, the state slot's lock, the compatibility key, the probe and
capabilities), :mod:`.states` (named states on the state slot) and this one (chat: counting,
limits, reasoning profile, relaying ``/v1`` requests, session snapshots, workers, the plan, the
native log tail).
"""

from __future__ import annotations

import hashlib
import os

from werk_host.plugin import (
    ChatLimits,
    ChatRequest,
    DeploymentPlan,
    EndpointKind,
    ErrorCode,
    HostConfig,
    InferenceResponse,
    JsonObject,
    ModelManifest,
    ReasoningProfile,
    WerkError,
    WorkerObservation,
    hookimpl,
)
from werk_host.plugin.http import post_json

from . import reasoning, tools
from .binary import LlamaServerNotFound
from .core import BACKEND_ID, PLUGIN_NAME, unavailable
from .embeddings import LlamaEmbeddingAdapter, instance_pooling
from .native import NativeError
from .process import LlamaServerProcess, last_flag_value
from .promptcache import LlamaPromptCache
from .session import LlamaSessionSlot, open_session_slot
from .slots import forward_ordinary, ordinary_capacity
from .states import StateOperations

#: ChatRequest fields that do not reach the template: left out of a counted body.
_NOT_COUNTED: set[str] = {"werk", "stream", "model"}
#: The longest counted body kept as its own cache key (longer ones are kept by digest).
_KEY_TEXT_MAX = 512
_MEDIA_FLAGS = ("-mm", "--mmproj", "-mmu", "--mmproj-url")
_SECRET_FLAGS = ("--api-key", "--api-key-file", "--ssl-key-file", "--hf-token", "-hft")


class LlamaCppAdapter(StateOperations):
    """Adapter for one installed GGUF model served by a Werk-managed ``llama-server``."""

    backend = BACKEND_ID

    @hookimpl(specname="werk_deployment_plan")
    def plan(self) -> DeploymentPlan | None:
        """The running child's resolved placement, from its actual argv (``None`` when none runs).
        Filesystem paths and the values of secret-bearing flags become placeholders."""
        proc = self.current()
        if proc is None:
            return None
        argv = proc.argv[1:]
        shown: list[str] = []
        for i, arg in enumerate(argv):
            if i > 0 and argv[i - 1] in _SECRET_FLAGS:
                shown.append("<redacted>")
            elif os.path.isabs(arg) or os.sep in arg and os.path.exists(arg):
                shown.append("<path>")
            else:
                shown.append(arg)
        threads = last_flag_value(argv, ("-t", "--threads"))
        layers = last_flag_value(argv, ("-ngl", "--gpu-layers", "--n-gpu-layers"))
        offloaded = int(layers) if layers is not None and layers.lstrip("-").isdigit() else 0
        return DeploymentPlan(
            endpoint=EndpointKind.LOCAL,
            arguments=shown,
            threads=int(threads) if threads is not None and threads.isdigit() else None,
            parallel_slots=proc.effective_parallel() if proc.effective_parallel() > 0 else None,
            context_per_slot=self.context_per_slot(proc),
            device="cpu" if offloaded == 0 else f"gpu ({offloaded} layers offloaded)",
        )

    @hookimpl(specname="werk_log_tail")
    def native_log_tail(self, lines: int) -> list[str] | None:
        """The running child's native log tail, redacted as a startup error's is, paths and
        process ids replaced (docs/deployments.md, "Operator actions"); ``None`` when none runs."""
        proc = self.current()
        return proc.public_log_tail(lines) if proc is not None else None

    @hookimpl(specname="werk_chat_limits")
    def chat_limits(self, model: str | None) -> ChatLimits:
        """The limits the running child's launch arguments and the manifest set; kept per
        (process generation, model), since neither changes while a child runs."""
        proc = self.current()
        key = (proc.generation if proc is not None else None, model)
        kept = self._limits
        if kept is not None and kept[0] == key:
            return kept[1]
        context = self.context_per_slot(proc)
        ceilings = [c for c in (self.manifest.output_ceiling(), context - 1 if context else None) if c]
        parallel = proc.effective_parallel() if proc is not None else 0
        limits = ChatLimits(
            model=model or self.manifest.name,
            context_tokens=context,
            max_output_tokens=min(ceilings) if ceilings else None,
            # the ordinary slots (:mod:`.slots`): the state slot never serves ordinary traffic
            max_concurrent_requests=ordinary_capacity(parallel) if parallel > 0 else None,
        )
        self._limits = (key, limits)
        return limits

    @staticmethod
    def accepts_media(proc: LlamaServerProcess) -> bool:
        """Whether the child was launched with a multimodal projector (image/audio parts)."""
        return last_flag_value(proc.argv[1:], _MEDIA_FLAGS) is not None

    def count_tokens(self, request: ChatRequest) -> int:
        """The exact count of ``request`` as the chat sends it: with its tool turns and a forced
        tool choice as :func:`.tools.counted` renders them, which only a cache miss pays for."""
        # the cache key: the JSON of the request (equal bodies serialize equally, by the model's
        # own serializer; what .tools makes of it depends only on it and the model's template),
        # as is when short, else "#" and its digest (no JSON text starts with "#")
        text = request.__pydantic_serializer__.to_json(request, exclude_none=True, exclude=_NOT_COUNTED)
        key = text if len(text) <= _KEY_TEXT_MAX else b"#" + hashlib.sha256(text).digest()
        # a hit reads without the lock: each OrderedDict call on str keys is one step under the
        # interpreter lock, and a key evicted meanwhile only skips its refresh
        count = self._count_cache.get(key)
        if count is not None:
            try:
                self._count_cache.move_to_end(key)
            except KeyError:
                return count  # evicted meanwhile: nothing to refresh
            return count
        request = tools.counted(self, request)
        proc = self.process()
        if not self.accepts_media(proc) and any(
            part.type != "text" for m in request.messages if isinstance(m.content, list) for part in m.content
        ):
            # llama-server answers 500 for this; it is the request that does not fit the model.
            raise WerkError(ErrorCode.INVALID_REQUEST, "this model accepts text content parts only")
        pool = self.proxy_pool(proc)  # keep-alive connections: no TCP setup per count
        body = request.model_dump(mode="json", exclude_none=True, exclude=_NOT_COUNTED)
        try:
            text = post_json(pool, "/apply-template", body)["prompt"]
            tokens = post_json(pool, "/tokenize", {"content": text, "add_special": True, "parse_special": True})
            count = len(tokens["tokens"])
        except WerkError as err:
            if err.code is ErrorCode.INVALID_REQUEST:
                raise
            raise unavailable("llama-server could not count this request") from err
        except (KeyError, TypeError) as err:
            raise unavailable("llama-server could not count this request") from err
        with self._life:
            self._count_cache[key] = count
            while len(self._count_cache) > 256:
                self._count_cache.popitem(last=False)
        return count

    @hookimpl(specname="werk_workers")
    def workers(self) -> list[WorkerObservation]:
        proc = self.current()
        if proc is None:
            return []
        client = proc.new_client(timeout=self.config.backend_bounds.call_s)  # --backend-timeout
        try:
            slots = client.slots()
        except NativeError:
            slots = []
        finally:
            client.close()
        sizes = [s.n_ctx for s in slots if isinstance(s.n_ctx, int) and s.n_ctx > 0]
        valid = bool(slots) and len(sizes) == len(slots)
        return [
            WorkerObservation(
                model=self.manifest.name,
                backend=BACKEND_ID,
                pid=proc.pid,
                state="running",
                slots=len(slots) if slots else None,
                context_per_request_tokens=min(sizes) if valid else None,
                context_capacity_tokens=sum(sizes) if valid else None,
            )
        ]

    @hookimpl(specname="werk_count_tokens")
    def count_request(self, request: ChatRequest) -> int:
        """The exact count of the body the chat sends for ``request`` (:func:`.reasoning.counted_request`:
        a tier the host resolved becomes the thinking switch and budget; :func:`.tools.counted`:
        tool turns and a forced tool choice as :mod:`.tools` sends them). Without ``werk`` the
        request is counted as it is (the common case: no call into :mod:`.reasoning`)."""
        return self.count_tokens(request if request.werk is None else reasoning.counted_request(request))

    @hookimpl(specname="werk_reasoning_profile")
    def reasoning_profile(self, model: str | None, max_output_tokens: int) -> ReasoningProfile:
        """Tiers only where the running server's budget control is verified (:mod:`.reasoning`)."""
        return reasoning.reasoning_profile(self, model or self.manifest.name, max_output_tokens)

    @hookimpl(specname="werk_chat_completion")
    def chat_completion(self, request: JsonObject) -> InferenceResponse:
        """``request`` relayed to ``/v1/chat/completions`` on an ordinary slot (:func:`.slots.forward_ordinary`),
        a resolved ``werk.reasoning`` tier as llama-server's thinking switch and budget, tool turns
        and a forced tool choice as :mod:`.tools` makes them (the answer parsed back into the call)."""
        body, forced = tools.chat_body(self, reasoning.forwarded_chat(request))
        response = forward_ordinary(self, "/v1/chat/completions", body)
        return response if forced is None else forced.relay(response, stream=body.get("stream") is True)

    @hookimpl(specname="werk_text_completion")
    def text_completion(self, request: JsonObject) -> InferenceResponse:
        """``request`` without ``werk`` relayed to ``/v1/completions`` on an ordinary slot."""
        return forward_ordinary(self, "/v1/completions", {k: v for k, v in request.items() if k != "werk"})

    @hookimpl(specname="werk_prompt_cache")
    def prompt_cache(self) -> LlamaPromptCache | None:
        """The live process's ordinary slots as prompt caches (:mod:`.promptcache`); ``None``
        while no process runs (the host then relays without one)."""
        proc = self.current()
        return LlamaPromptCache(self, proc) if proc is not None else None

    @hookimpl(specname="werk_session_slot")
    def open_session_slot(self, model_id: str) -> LlamaSessionSlot:
        """The session slot of the live process (:mod:`.session`)."""
        return open_session_slot(self, model_id)


#: What ``werk serve`` says when no llama-server is found (no path: it may reach an error body).
LLAMA_SERVER_MISSING = (
    "llama-server not found: run `werk llamacpp build` (builds and caches it once), "
    "or set WERK_LLAMA_SERVER to an executable llama-server, or put llama-server on PATH"
)


def create_adapter(config: HostConfig, manifest: ModelManifest | None) -> LlamaCppAdapter | LlamaEmbeddingAdapter:
    """A chat instance's adapter, or an embedding instance's (:mod:`.embeddings`: its
    ``pooling`` option or the GGUF header's pooling type)."""
    if manifest is None:
        raise WerkError(ErrorCode.INVALID_REQUEST, "the llama.cpp backend needs a model")
    options = dict(config.backend_options.get(PLUGIN_NAME, {}))
    pooling = instance_pooling(manifest, options)
    adapter: LlamaCppAdapter | LlamaEmbeddingAdapter
    try:
        if pooling is not None:
            adapter = LlamaEmbeddingAdapter(config, manifest, options, pooling)
        else:
            adapter = LlamaCppAdapter(config, manifest, options)
    except LlamaServerNotFound as err:
        raise WerkError(ErrorCode.UNAVAILABLE, LLAMA_SERVER_MISSING, retryable=False) from err
    adapter.process()  # residency: the child starts with werk serve
    return adapter


def accepts(manifest: ModelManifest | None) -> bool:
    if manifest is None:
        return False
    if manifest.backend is not None:
        return manifest.backend in (BACKEND_ID, PLUGIN_NAME)
    try:
        with open(manifest.primary_path, "rb") as handle:
            return handle.read(4) == b"GGUF"
    except OSError:
        return False
