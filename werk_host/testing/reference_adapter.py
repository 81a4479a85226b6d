"""The reference adapter: every operation of the hook API is one of its methods.

Each operation is a method marked ``@hookimpl(specname="werk_...")``; the host registers each
adapter it creates with the plugin manager, so a call on this adapter reaches these methods
(plus wrapper plugins), never another adapter's (docs/plugin-hooks.md). The backend is trivial
and deterministic (:mod:`werk_host.testing.reference`).
"""

from __future__ import annotations

import itertools
import json
import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from pydantic import JsonValue

from werk_host import hookimpl
from werk_host.errors import ErrorCode, WerkError
from werk_host.protocol import (
    CapabilityId,
    CapabilityStatus,
    ChatLimits,
    ChatRequest,
    DeploymentPlan,
    EndpointKind,
    ExpertActionKind,
    ExpertActionRequest,
    ExpertActionResult,
    ExpertListQuery,
    ExpertPage,
    ExpertSummary,
    ExpertTier,
    MessagesInput,
    ReasoningProfile,
    Tier,
    WorkerObservation,
)
from werk_host.seam import (
    CapabilityReport,
    DecodeOutput,
    DecodeWork,
    InferenceResponse,
    JsonObject,
    MemoryOperation,
    MoveOutput,
    MoveWork,
    PrefilledState,
    PrefillWork,
    Snapshot,
    StoredStateRef,
)
from werk_host.service.reasoning import budget_profile, unsupported_profile
from werk_host.testing.reference_base import (
    BACKEND_ID,
    CONTEXT_TOKENS,
    EXPERIMENTAL_STATE,
    EXPERT_BYTES,
    EXPERTS_PER_MODEL,
    MAX_OUTPUT_TOKENS,
    _chat_request,
    _echo,
    _include_usage,
    _json_response,
    _message_text,
    _output_tokens,
    _sse_response,
    _usage,
    chat_answer,
    count_chat_tokens,
    session_tokens,
)
from werk_host.testing.reference_cache import MemoryPromptCache, MemorySlot


def default_experts(model_id: str) -> dict[str, ExpertSummary]:
    """The initial expert table of ``model_id``: even experts in ``ram``, odd ones ``external``."""
    return {
        f"layer0.expert{i}": ExpertSummary(
            id=f"layer0.expert{i}",
            model_id=model_id,
            tier=ExpertTier.RAM if i % 2 == 0 else ExpertTier.EXTERNAL,
            bytes=EXPERT_BYTES,
            hotness=round(1.0 - i / EXPERTS_PER_MODEL, 3),
            pinned=False,
        )
        for i in range(EXPERTS_PER_MODEL)
    }


@dataclass(eq=False)
class MemoryAdapter:
    """The reference adapter. Tests may change any field while it is live.

    ``statuses`` is its capability report; ``fail`` names injected failures (see
    :meth:`check`); ``calls`` logs every operation it ran; ``memory_requirement`` is what
    ``werk_memory_requirement`` answers; ``max_pinned_experts`` bounds pins (``None``: no
    bound); ``live`` holds prefilled states by handle, ``ram`` states moved to the RAM tier by
    state id, ``experts`` the model's expert table.
    """

    model_name: str
    instance_id: str = ""
    backend: str = BACKEND_ID
    #: the plugin that created it (``None``: built by hand); its session slot's owner
    plugin: object = None
    statuses: dict[CapabilityId, CapabilityStatus] = field(default_factory=lambda: dict(EXPERIMENTAL_STATE))
    fail: set[str] = field(default_factory=set)
    generation: str = field(default_factory=lambda: secrets.token_hex(8))
    live: dict[int, bytes] = field(default_factory=dict)
    ram: dict[str, bytes] = field(default_factory=dict)
    experts: dict[str, ExpertSummary] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    closed: bool = False
    memory_requirement: int | None = None
    max_pinned_experts: int | None = None
    session_slot: list[str] = field(default_factory=list)
    #: ordinary slots offered as prompt caches (``werk_prompt_cache``; 0: none, the hook answers
    #: ``None``): :mod:`werk_host.testing.reference_cache`
    prompt_cache: int = 0
    #: the context of one request (``werk_chat_limits``)
    context_tokens: int = CONTEXT_TOKENS
    #: more lines of its "native log" (``werk_log_tail``), after one per operation in ``calls``
    native_log: list[str] = field(default_factory=list)
    _prompt_cache: MemoryPromptCache | None = None
    _ids: itertools.count[int] = field(default_factory=itertools.count)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.instance_id = self.instance_id or f"test:{self.model_name}"
        self.experts = self.experts or default_experts(self.model_name)

    @property
    def plugin_name(self) -> str | None:
        """The name of the plugin that created it (its ``name``, which must be the name it is
        registered under); ``None`` when built by hand."""
        name = getattr(self.plugin, "name", None)
        return name if isinstance(name, str) else None

    def identity(self) -> str:
        return f"{self.instance_id}#{self.generation}"

    def restart(self) -> None:
        """Simulate a backend process restart: new generation, live handles, RAM tier and the
        session slot gone."""
        self.generation = secrets.token_hex(8)
        self.live.clear()
        self.ram.clear()
        self.session_slot = []
        self._prompt_cache = None

    def compat_key_now(self) -> dict[str, str]:
        return {"backend": BACKEND_ID, "model": self.model_name, "generation": self.generation, "layout": "1"}

    def close(self) -> None:
        self.closed = True

    def status(self, cap: CapabilityId) -> CapabilityStatus:
        """The status this adapter reports for ``cap`` (omitted ids are ``unsupported``)."""
        return self.statuses.get(cap, CapabilityStatus.UNSUPPORTED)

    def check(self, op: str) -> None:
        """Log ``op`` in ``calls``, then fail it if asked: ``fail`` holding ``op`` raises a typed
        ``internal`` error, holding ``crash:<op>`` raises an unexpected ``RuntimeError``.

        Other switches: ``no-snapshot`` (prefilled states are not snapshot-capable),
        ``huge-text`` (decode answers 1 MiB + 1 of text), ``continue`` (decode returns a next
        state). Operation names: prefill, snapshot, restore, decode, move, list_experts,
        expert_action, count, chat, completion, session_chat, session_restore, session_save."""
        self.calls.append(op)
        if op in self.fail:
            raise WerkError(ErrorCode.INTERNAL, f"injected {op} failure")
        if f"crash:{op}" in self.fail:
            raise RuntimeError(f"injected {op} crash")

    def store(self, data: bytes) -> int:
        """Hold ``data`` as a live state; returns its handle."""
        with self._lock:
            handle = next(self._ids)
            self.live[handle] = data
        return handle

    # -- operations (hook implementations) ------------------------------------------------
    @hookimpl(specname="werk_capabilities")
    def capabilities(self) -> Mapping[CapabilityId, CapabilityReport]:
        return {k: CapabilityReport(v, f"reference adapter reports {v.value}") for k, v in self.statuses.items()}

    @hookimpl(specname="werk_compat_key")
    def compat_key(self, model_id: str) -> dict[str, str]:
        return self.compat_key_now()

    # -- prefill/decode and states ---------------------------------------------------------
    @hookimpl(specname="werk_prefill")
    def prefill(self, work: PrefillWork) -> PrefilledState:
        self.check("prefill")
        data = _prompt_bytes(work)
        if data.startswith(b"FAIL"):
            raise WerkError(ErrorCode.INTERNAL, "injected prefill failure for this prompt")
        return PrefilledState(
            handle=self.store(data),
            prompt_tokens=len(data.split()),
            compat_key=self.compat_key_now(),
            snapshot_capable="no-snapshot" not in self.fail,
            bytes=len(data),
        )

    @hookimpl(specname="werk_snapshot")
    def snapshot(self, state: PrefilledState) -> Snapshot:
        self.check("snapshot")
        data = self.live.get(state.handle) if isinstance(state.handle, int) else None
        if data is None:
            raise WerkError(ErrorCode.UNAVAILABLE, "the live state is gone")
        return Snapshot(chunks=[data[i : i + 7] for i in range(0, len(data), 7)], size=len(data), close=lambda: None)

    @hookimpl(specname="werk_restore")
    def restore(self, stored: StoredStateRef) -> PrefilledState:
        self.check("restore")
        with stored.open_payload() as payload:
            data = payload.read()
        return PrefilledState(self.store(data), len(data.split()), self.compat_key_now(), True, bytes=len(data))

    @hookimpl(specname="werk_decode")
    def decode(self, work: DecodeWork) -> DecodeOutput:
        self.check("decode")
        data = self.live.get(work.handle) if isinstance(work.handle, int) else None
        if data is None:
            if work.stored is None:
                raise WerkError(ErrorCode.UNAVAILABLE, "live state is gone and nothing is stored")
            self.calls.append("restore")
            with work.stored.open_payload() as payload:
                data = payload.read()
        out, finish = _echo(data.decode(errors="replace"), work.options.max_tokens)
        text = " ".join(out)
        if "huge-text" in self.fail:
            text = "x" * ((1 << 20) + 1)
        next_state = None
        if "continue" in self.fail:
            next_state = PrefilledState(None, len(out), self.compat_key_now(), False)
        return DecodeOutput(text=text, completion_tokens=len(out), finish_reason=finish, next_state=next_state)

    @hookimpl(specname="werk_release_state")
    def release_state(self, handle: object) -> bool:
        if not isinstance(handle, int):
            return False
        with self._lock:
            return self.live.pop(handle, None) is not None

    @hookimpl(specname="werk_state_move")
    def state_move(self, work: MoveWork) -> MoveOutput:
        """RAM tier moves (promote to ``ram``, demote back to ``disk``) while the adapter reports
        ``runtime.state.tier.ram`` as anything but ``unsupported``."""
        self.check("move")
        if self.status(CapabilityId.TIER_RAM) is CapabilityStatus.UNSUPPORTED:
            raise WerkError(ErrorCode.UNSUPPORTED, "the reference backend's RAM tier is off")
        state_id = work.state.state_id
        if work.target_tier is Tier.RAM:
            changed = state_id not in self.ram
            if changed and not work.dry_run:
                with work.state.open_payload() as payload:
                    self.ram[state_id] = payload.read()
            return MoveOutput(Tier.RAM, changed)
        if work.target_tier is Tier.DISK:
            changed = state_id in self.ram
            if not work.dry_run:
                self.ram.pop(state_id, None)
            return MoveOutput(Tier.DISK, changed)
        tier = work.target_tier.value if work.target_tier else "(none)"
        raise WerkError(ErrorCode.UNSUPPORTED, f"the reference backend has no {tier} tier")

    # -- experts ---------------------------------------------------------------------------
    @hookimpl(specname="werk_list_experts")
    def list_experts(self, query: ExpertListQuery) -> ExpertPage:
        self.check("list_experts")
        rows = [
            e
            for e in self.experts.values()
            if (query.model_id is None or e.model_id == query.model_id) and (query.tier is None or e.tier is query.tier)
        ]
        start = 0
        if query.cursor is not None:
            if not query.cursor.startswith("o") or not query.cursor[1:].isdigit():
                raise WerkError(ErrorCode.INVALID_REQUEST, "invalid cursor")
            start = int(query.cursor[1:])
        end = start + query.limit
        return ExpertPage(experts=rows[start:end], next_cursor=f"o{end}" if end < len(rows) else None)

    @hookimpl(specname="werk_expert_action")
    def expert_action(self, request: ExpertActionRequest) -> ExpertActionResult:
        self.check("expert_action")
        if request.model_id != self.model_name:
            raise WerkError(ErrorCode.NOT_FOUND, f"unknown model {request.model_id!r}")
        unknown = [i for i in request.expert_ids if i not in self.experts]
        if unknown:
            raise WerkError(ErrorCode.NOT_FOUND, f"unknown expert {unknown[0]!r}")
        if request.action is ExpertActionKind.PREFETCH and request.target_tier is not Tier.RAM:
            raise WerkError(ErrorCode.INVALID_REQUEST, "the reference backend holds experts in ram only")
        action = request.action
        after: dict[str, ExpertSummary] = {}
        for expert_id in request.expert_ids:
            expert = self.experts[expert_id]
            if action in (ExpertActionKind.PREFETCH, ExpertActionKind.PIN):
                update: dict[str, object] = {"tier": ExpertTier.RAM}
                if action is ExpertActionKind.PIN:
                    update["pinned"] = True
            elif action is ExpertActionKind.UNPIN:
                update = {"pinned": False}
            else:
                update = {"tier": ExpertTier.EXTERNAL, "pinned": False}
            after[expert_id] = expert.model_copy(update=update)
        table = {**self.experts, **after}
        pins = sum(e.pinned for e in table.values())
        if self.max_pinned_experts is not None and pins > self.max_pinned_experts:
            raise WerkError(ErrorCode.RESOURCE_EXHAUSTED, f"at most {self.max_pinned_experts} experts can be pinned")
        changed = any(after[i] != self.experts[i] for i in after)
        if not request.dry_run:
            self.experts = table
        return ExpertActionResult(experts=list(after.values()), changed=changed, dry_run=request.dry_run)

    # -- chat planning -----------------------------------------------------------------------
    @hookimpl(specname="werk_request_options")
    def request_options(self, name: str, options: JsonObject) -> JsonObject | None:
        return None  # owns no werk.<name> member: the host refuses every one

    @hookimpl(specname="werk_count_tokens")
    def count_tokens(self, request: ChatRequest) -> int:
        self.check("count")
        return count_chat_tokens(request)

    @hookimpl(specname="werk_chat_limits")
    def chat_limits(self, model: str | None) -> ChatLimits:
        return ChatLimits(
            model=model or self.model_name,
            context_tokens=self.context_tokens,
            max_output_tokens=MAX_OUTPUT_TOKENS,
            max_concurrent_requests=max(1, self.prompt_cache),
        )

    @hookimpl(specname="werk_reasoning_profile")
    def reasoning_profile(self, model: str | None, max_output_tokens: int) -> ReasoningProfile:
        """Tiers from ``max_output_tokens`` alone (no launch budget, thinking on); a closed
        adapter is a cold runtime and answers ``supported=False``."""
        name = model or self.model_name
        if self.closed:
            return unsupported_profile(name, BACKEND_ID)
        return budget_profile(
            model=name,
            backend=BACKEND_ID,
            context_tokens=None,
            output_tokens=max_output_tokens,
            launch_budget=-1,
            thinking_enabled=True,
        )

    # -- OpenAI-compatible inference ---------------------------------------------------------
    @hookimpl(specname="werk_chat_completion")
    def chat_completion(self, request: JsonObject) -> InferenceResponse:
        """Echo the last message's words (bounded by ``max_tokens``); usage is exact."""
        self.check("chat")
        chat = _chat_request(request)
        out, finish = _echo(_message_text(chat.messages[-1]), _output_tokens(request))
        return chat_answer(self.model_name, request, out, finish, _usage(count_chat_tokens(chat), len(out)))

    @hookimpl(specname="werk_prompt_cache")
    def open_prompt_cache(self) -> MemoryPromptCache | None:
        """The :attr:`prompt_cache` slots as prompt caches; ``None`` when there are none."""
        if self.prompt_cache <= 0:
            return None
        with self._lock:
            if self._prompt_cache is None or len(self._prompt_cache.slots) != self.prompt_cache:
                self._prompt_cache = MemoryPromptCache(self, [MemorySlot() for _ in range(self.prompt_cache)])
            return self._prompt_cache

    @hookimpl(specname="werk_session_slot")
    def open_session_slot(self, model_id: str) -> MemorySessionSlot:
        return MemorySessionSlot(self.plugin, self)

    @hookimpl(specname="werk_text_completion")
    def text_completion(self, request: JsonObject) -> InferenceResponse:
        """Legacy completions: echo each prompt's words (bounded by ``max_tokens``)."""
        self.check("completion")
        prompt = request.get("prompt")
        prompts: list[JsonValue] = prompt if isinstance(prompt, list) else [prompt]
        if not prompts or not all(isinstance(p, str) for p in prompts):
            raise WerkError(ErrorCode.INVALID_REQUEST, "prompt must be a string or a list of strings")
        texts = [p for p in prompts if isinstance(p, str)]
        limit = _output_tokens(request)
        echoed = [_echo(text, limit) for text in texts]
        completion = sum(len(out) for out, _ in echoed)
        usage = _usage(sum(len(text.split()) for text in texts), completion)
        head: JsonObject = {
            "id": f"cmpl-{secrets.token_hex(8)}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
        }
        choices: list[JsonValue] = [
            {"index": i, "text": " ".join(out), "finish_reason": finish, "logprobs": None}
            for i, (out, finish) in enumerate(echoed)
        ]
        if request.get("stream") is True:
            events: list[JsonObject] = [{**head, "choices": [choice]} for choice in choices]
            if _include_usage(request):
                events.append({**head, "choices": [], "usage": usage})
            return _sse_response(events)
        return _json_response({**head, "choices": choices, "usage": usage})

    # -- observation and memory ----------------------------------------------------------------
    @hookimpl(specname="werk_workers")
    def workers(self) -> list[WorkerObservation]:
        """Its one in-process worker (no separate process, so no pid)."""
        return [
            WorkerObservation(
                model=self.model_name,
                backend=BACKEND_ID,
                pid=None,
                state="stopped" if self.closed else "ready",
                slots=1,
                context_per_request_tokens=CONTEXT_TOKENS,
                context_capacity_tokens=CONTEXT_TOKENS,
            )
        ]

    @hookimpl(specname="werk_deployment_plan")
    def deployment_plan(self) -> DeploymentPlan | None:
        """Its fixed in-process placement: one slot of the whole context, on the CPU."""
        if self.closed:
            return None
        return DeploymentPlan(
            endpoint=EndpointKind.LOCAL,
            arguments=["--in-memory"],
            threads=1,
            parallel_slots=1,
            context_per_slot=CONTEXT_TOKENS,
            device="cpu",
        )

    @hookimpl(specname="werk_log_tail")
    def log_tail(self, lines: int) -> list[str] | None:
        """Its "native log": the model it loaded, one line per operation it ran, then
        ``native_log``; ``None`` once closed (nothing runs)."""
        if self.closed:
            return None
        log = [f"loaded model {self.model_name}", *(f"ran {op}" for op in self.calls), *self.native_log]
        return log[-lines:] if lines > 0 else []

    @hookimpl(specname="werk_memory_requirement")
    def memory_bound(self, operation: MemoryOperation, model_id: str) -> int | None:
        return self.memory_requirement


def _prompt_bytes(work: PrefillWork) -> bytes:
    if isinstance(work.input, MessagesInput):
        return json.dumps([m.model_dump(mode="json") for m in work.input.messages]).encode()
    return work.input.text.encode()


@dataclass
class MemorySessionSlot:
    """The reference backend's session slot (``adapter.session_slot``), as ``werk chat`` uses it.

    A session chat reuses the slot's tokens up to the common prefix with its prompt (reported as
    ``prompt_tokens_details.cached_tokens``), then leaves its prompt and answer in the slot. A
    snapshot is the slot's tokens as JSON. ``fail`` switches: ``session_chat``,
    ``session_restore``, ``session_save`` (see :meth:`MemoryAdapter.check`)."""

    plugin: object
    adapter: MemoryAdapter

    def session_key(self) -> dict[str, str]:
        return {"backend": BACKEND_ID, "model": self.adapter.model_name, "layout": "session-1"}

    def chat(self, request: JsonObject) -> InferenceResponse:
        adapter = self.adapter
        adapter.check("session_chat")
        chat = _chat_request(request)
        prompt = session_tokens(chat)
        slot = adapter.session_slot
        same = [a == b for a, b in zip(slot, prompt, strict=False)]
        cached = same.index(False) if False in same else len(same)
        out, finish = _echo(_message_text(chat.messages[-1]), _output_tokens(request))
        adapter.session_slot = [*prompt, *out]
        usage: JsonObject = {**_usage(len(prompt), len(out)), "prompt_tokens_details": {"cached_tokens": cached}}
        return chat_answer(adapter.model_name, request, out, finish, usage)

    def restore(self, stored: StoredStateRef) -> int:
        adapter = self.adapter
        try:
            adapter.check("session_restore")
            with stored.open_payload() as payload:
                tokens = json.loads(payload.read())
            if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
                raise WerkError(ErrorCode.CORRUPT_STATE, "not a reference session snapshot")
        except (WerkError, ValueError) as err:
            adapter.session_slot = []
            if isinstance(err, WerkError):
                raise
            raise WerkError(ErrorCode.CORRUPT_STATE, "not a reference session snapshot") from err
        adapter.session_slot = tokens
        return len(tokens)

    def save(self) -> Snapshot:
        self.adapter.check("session_save")
        data = json.dumps(self.adapter.session_slot).encode()
        return Snapshot(chunks=[data[i : i + 64] for i in range(0, len(data), 64)], size=len(data), close=lambda: None)

    def cached_tokens(self, usage_event: JsonObject) -> int | None:
        usage = usage_event.get("usage")
        details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        return cached if isinstance(cached, int) and not isinstance(cached, bool) and cached >= 0 else None
