"""The reference backend: an in-memory adapter plugin that implements every hook.

It is a real plugin, registered through pluggy like any other, and it implements every hook
of :mod:`werk_host.hookspecs` with the declared types, so it doubles as a worked example of
the contract. Its "backend" is trivial and deterministic:

* a prompt's state is its UTF-8 bytes (messages: their JSON); a token is a word;
* decode and completions echo a bounded number of the prompt's words;
* chat ``usage.prompt_tokens`` equals what ``werk_count_tokens`` says for the same messages
  (words per message + 2), and ``stream: true`` answers OpenAI SSE chunks ending ``[DONE]``;
* one in-process "worker", eight experts per model (``layer0.expert0`` … ``layer0.expert7``,
  alternately ``ram`` and ``external``) and an optional RAM state tier;
* one session slot for ``werk_session_snapshots`` (:class:`MemorySessionSnapshots`): the
  tokens of the last session chat, reused by the next one up to their common prefix, which its
  usage reports as ``prompt_tokens_details.cached_tokens``.

Its capability report is configurable (``statuses``, keyed by
:class:`~werk_host.protocol.CapabilityId`), so tests can check that the host's behaviour follows
every status; ``fail`` injects failures (see :meth:`MemoryAdapter.check`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import secrets
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final

from pydantic import JsonValue, ValidationError

from werk_host import hookimpl
from werk_host.backend import (
    AdapterFactory,
    CapabilityReport,
    DecodeOutput,
    DecodeWork,
    DoctorCheck,
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
from werk_host.config import HostConfig
from werk_host.errors import ErrorCode, WerkError, validation_message
from werk_host.models import ModelManifest
from werk_host.protocol import (
    CapabilityId,
    CapabilityStatus,
    ChatLimits,
    ChatMessage,
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
from werk_host.service.reasoning import budget_profile, unsupported_profile

#: The name the reference plugin registers under (``adapter.plugin_name``).
PLUGIN_NAME: Final = "testbackend"
#: The backend id its adapters report (``active_backend``).
BACKEND_ID: Final = "test-backend"
#: ``werk_chat_limits`` of every model: context and output ceiling, in words.
CONTEXT_TOKENS: Final = 64
MAX_OUTPUT_TOKENS: Final = 63
#: Experts per model in the in-memory expert table, and the size each reports.
EXPERTS_PER_MODEL: Final = 8
EXPERT_BYTES: Final = 1 << 20

#: The default capability report: persistence/restore/disk/prefix-cache/P-D experimental,
#: chat planning supported, no RAM/VRAM tier (set ``runtime.state.tier.ram`` to enable one).
EXPERIMENTAL_STATE: Final[Mapping[CapabilityId, CapabilityStatus]] = {
    CapabilityId.MODEL_RESIDENCY: CapabilityStatus.SUPPORTED,
    CapabilityId.PERSISTENCE: CapabilityStatus.EXPERIMENTAL,
    CapabilityId.RESTORE: CapabilityStatus.EXPERIMENTAL,
    CapabilityId.TIER_DISK: CapabilityStatus.EXPERIMENTAL,
    CapabilityId.TIER_RAM: CapabilityStatus.UNSUPPORTED,
    CapabilityId.TIER_VRAM: CapabilityStatus.UNSUPPORTED,
    CapabilityId.PREFIX_CACHE: CapabilityStatus.EXPERIMENTAL,
    CapabilityId.PD_PREFILL: CapabilityStatus.EXPERIMENTAL,
    CapabilityId.PD_DECODE: CapabilityStatus.EXPERIMENTAL,
    CapabilityId.PD_HANDOFF: CapabilityStatus.EXPERIMENTAL,
    CapabilityId.TOKEN_COUNT: CapabilityStatus.SUPPORTED,
    CapabilityId.ADMISSION: CapabilityStatus.SUPPORTED,
    CapabilityId.CHAT_LIMITS: CapabilityStatus.SUPPORTED,
}


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


@dataclass
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
    plugin_name: str = PLUGIN_NAME
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
    _ids: itertools.count[int] = field(default_factory=itertools.count)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.instance_id = self.instance_id or f"test:{self.model_name}"
        self.experts = self.experts or default_experts(self.model_name)

    def identity(self) -> str:
        return f"{self.instance_id}#{self.generation}"

    def restart(self) -> None:
        """Simulate a backend process restart: new generation, live handles, RAM tier and the
        session slot gone."""
        self.generation = secrets.token_hex(8)
        self.live.clear()
        self.ram.clear()
        self.session_slot = []

    def envelope(self) -> dict[str, str]:
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


def _prompt_bytes(work: PrefillWork) -> bytes:
    if isinstance(work.input, MessagesInput):
        return json.dumps([m.model_dump(mode="json") for m in work.input.messages]).encode()
    return work.input.text.encode()


def _message_text(message: ChatMessage) -> str:
    if message.content is None:
        return ""
    if isinstance(message.content, str):
        return message.content
    return " ".join(part.text for part in message.content if part.text)


def count_chat_tokens(request: ChatRequest) -> int:
    """The reference tokenizer over a chat request: each message's words plus 2."""
    return sum(len(_message_text(m).split()) + 2 for m in request.messages)


def _chat_request(body: JsonObject) -> ChatRequest:
    try:  # ``werk`` may carry the host's resolved reasoning tier, which is not a request field
        return ChatRequest.model_validate({k: v for k, v in body.items() if k != "werk"})
    except ValidationError as err:
        raise WerkError(ErrorCode.INVALID_REQUEST, validation_message(err)) from err


def _output_tokens(body: JsonObject) -> int:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return MAX_OUTPUT_TOKENS


def _echo(text: str, limit: int) -> tuple[list[str], str]:
    words = text.split()
    return words[:limit], "length" if len(words) > limit else "stop"


def _usage(prompt: int, completion: int) -> JsonObject:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _json_response(doc: JsonObject) -> InferenceResponse:
    body = json.dumps(doc).encode()
    headers = {"Content-Type": "application/json", "Content-Length": str(len(body))}
    return InferenceResponse(200, headers, iter([body]), lambda: None)


def _sse_response(events: Iterable[JsonObject]) -> InferenceResponse:
    """Server-sent events, one ``data:`` line per event, then ``data: [DONE]``; ``close`` stops it."""
    closed = threading.Event()

    def body() -> Iterator[bytes]:
        for event in events:
            if closed.is_set():
                return
            yield b"data: " + json.dumps(event).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    return InferenceResponse(200, headers, body(), closed.set)


def _include_usage(body: JsonObject) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def session_tokens(request: ChatRequest) -> list[str]:
    """The reference tokenizer's tokens of a chat request: ``<role>``, the words, ``</>`` per
    message (as many as :func:`count_chat_tokens` counts)."""
    return [t for m in request.messages for t in (f"<{m.role}>", *_message_text(m).split(), "</>")]


@dataclass
class MemorySessionSnapshots:
    """The reference backend's session slot (``adapter.session_slot``), as ``werk chat`` uses it.

    A session chat reuses the slot's tokens up to the common prefix with its prompt (reported as
    ``prompt_tokens_details.cached_tokens``), then leaves its prompt and answer in the slot. A
    snapshot is the slot's tokens as JSON. ``fail`` switches: ``session_chat``,
    ``session_restore``, ``session_save`` (see :meth:`MemoryAdapter.check`)."""

    plugin: MemoryBackendPlugin
    adapter: MemoryAdapter

    def envelope(self) -> dict[str, str]:
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
        return self.plugin.chat_answer(adapter, request, out, finish, usage)

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


class MemoryBackendPlugin:
    """The reference plugin object: offers :class:`MemoryAdapter` and implements every hook.

    Keyword arguments become every created adapter's initial settings; created adapters are
    kept in ``adapters`` (newest last).
    """

    #: The name to register it under (``werk_host.testing.hosts.make_host`` reads it).
    name: Final = PLUGIN_NAME

    def __init__(
        self,
        *,
        statuses: Mapping[CapabilityId, CapabilityStatus] | None = None,
        fail: Iterable[str] = (),
        memory_requirement: int | None = None,
        max_pinned_experts: int | None = None,
    ) -> None:
        self.statuses = dict(statuses if statuses is not None else EXPERIMENTAL_STATE)
        self.fail = set(fail)
        self.memory_requirement = memory_requirement
        self.max_pinned_experts = max_pinned_experts
        self.adapters: list[MemoryAdapter] = []

    def create(self, config: HostConfig, model: ModelManifest | None) -> MemoryAdapter:
        adapter = MemoryAdapter(
            model_name=model.name if model else "none",
            statuses=dict(self.statuses),
            fail=set(self.fail),
            memory_requirement=self.memory_requirement,
            max_pinned_experts=self.max_pinned_experts,
        )
        self.adapters.append(adapter)
        return adapter

    # -- discovery -------------------------------------------------------------------------
    @hookimpl
    def werk_adapter_factories(self, config: HostConfig) -> list[AdapterFactory]:
        known = {c.value for c in CapabilityId}
        declared = tuple(CapabilityId(k) for k in self.statuses if k in known)
        return [
            AdapterFactory(
                BACKEND_ID,
                lambda m: m is not None,
                self.create,
                "in-memory reference backend (werk_host.testing)",
                capabilities=declared,
            )
        ]

    @hookimpl
    def werk_doctor_checks(self, config: HostConfig) -> list[DoctorCheck]:
        return [DoctorCheck("testbackend.engine", "ok", "the reference backend runs in process")]

    @hookimpl
    def werk_cli_commands(self, subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
        """The reference backend adds no ``werk`` commands (werk-llamacpp's ``werk llamacpp`` does)."""

    @hookimpl
    def werk_capabilities(self, adapter: MemoryAdapter) -> Mapping[CapabilityId, CapabilityReport]:
        return {k: CapabilityReport(v, f"reference adapter reports {v.value}") for k, v in adapter.statuses.items()}

    @hookimpl
    def werk_producer_envelope(self, adapter: MemoryAdapter, model_id: str) -> dict[str, str]:
        return adapter.envelope()

    # -- prefill/decode and states ---------------------------------------------------------
    @hookimpl
    def werk_prefill(self, adapter: MemoryAdapter, work: PrefillWork) -> PrefilledState:
        adapter.check("prefill")
        data = _prompt_bytes(work)
        if data.startswith(b"FAIL"):
            raise WerkError(ErrorCode.INTERNAL, "injected prefill failure for this prompt")
        return PrefilledState(
            handle=adapter.store(data),
            prompt_tokens=len(data.split()),
            envelope=adapter.envelope(),
            snapshot_capable="no-snapshot" not in adapter.fail,
            bytes=len(data),
        )

    @hookimpl
    def werk_snapshot(self, adapter: MemoryAdapter, state: PrefilledState) -> Snapshot:
        adapter.check("snapshot")
        data = adapter.live.get(state.handle) if isinstance(state.handle, int) else None
        if data is None:
            raise WerkError(ErrorCode.UNAVAILABLE, "the live state is gone")
        return Snapshot(chunks=[data[i : i + 7] for i in range(0, len(data), 7)], size=len(data), close=lambda: None)

    @hookimpl
    def werk_restore(self, adapter: MemoryAdapter, stored: StoredStateRef) -> PrefilledState:
        adapter.check("restore")
        with stored.open_payload() as payload:
            data = payload.read()
        return PrefilledState(adapter.store(data), len(data.split()), adapter.envelope(), True, bytes=len(data))

    @hookimpl
    def werk_decode(self, adapter: MemoryAdapter, work: DecodeWork) -> DecodeOutput:
        adapter.check("decode")
        data = adapter.live.get(work.handle) if isinstance(work.handle, int) else None
        if data is None:
            if work.stored is None:
                raise WerkError(ErrorCode.UNAVAILABLE, "live state is gone and nothing is stored")
            adapter.calls.append("restore")
            with work.stored.open_payload() as payload:
                data = payload.read()
        out, finish = _echo(data.decode(errors="replace"), work.options.max_tokens)
        text = " ".join(out)
        if "huge-text" in adapter.fail:
            text = "x" * ((1 << 20) + 1)
        next_state = None
        if "continue" in adapter.fail:
            next_state = PrefilledState(None, len(out), adapter.envelope(), False)
        return DecodeOutput(text=text, completion_tokens=len(out), finish_reason=finish, next_state=next_state)

    @hookimpl
    def werk_release_state(self, adapter: MemoryAdapter, handle: object) -> bool:
        if not isinstance(handle, int):
            return False
        with adapter._lock:
            return adapter.live.pop(handle, None) is not None

    @hookimpl
    def werk_state_move(self, adapter: MemoryAdapter, work: MoveWork) -> MoveOutput:
        """RAM tier moves (promote to ``ram``, demote back to ``disk``) while the adapter reports
        ``runtime.state.tier.ram`` as anything but ``unsupported``."""
        adapter.check("move")
        if adapter.status(CapabilityId.TIER_RAM) is CapabilityStatus.UNSUPPORTED:
            raise WerkError(ErrorCode.UNSUPPORTED, "the reference backend's RAM tier is off")
        state_id = work.state.state_id
        if work.target_tier is Tier.RAM:
            changed = state_id not in adapter.ram
            if changed and not work.dry_run:
                with work.state.open_payload() as payload:
                    adapter.ram[state_id] = payload.read()
            return MoveOutput(Tier.RAM, changed)
        if work.target_tier is Tier.DISK:
            changed = state_id in adapter.ram
            if not work.dry_run:
                adapter.ram.pop(state_id, None)
            return MoveOutput(Tier.DISK, changed)
        tier = work.target_tier.value if work.target_tier else "(none)"
        raise WerkError(ErrorCode.UNSUPPORTED, f"the reference backend has no {tier} tier")

    # -- experts ---------------------------------------------------------------------------
    @hookimpl
    def werk_list_experts(self, adapter: MemoryAdapter, query: ExpertListQuery) -> ExpertPage:
        adapter.check("list_experts")
        rows = [
            e
            for e in adapter.experts.values()
            if (query.model_id is None or e.model_id == query.model_id) and (query.tier is None or e.tier is query.tier)
        ]
        start = 0
        if query.cursor is not None:
            if not query.cursor.startswith("o") or not query.cursor[1:].isdigit():
                raise WerkError(ErrorCode.INVALID_REQUEST, "invalid cursor")
            start = int(query.cursor[1:])
        end = start + query.limit
        return ExpertPage(experts=rows[start:end], next_cursor=f"o{end}" if end < len(rows) else None)

    @hookimpl
    def werk_expert_action(self, adapter: MemoryAdapter, request: ExpertActionRequest) -> ExpertActionResult:
        adapter.check("expert_action")
        if request.model_id != adapter.model_name:
            raise WerkError(ErrorCode.NOT_FOUND, f"unknown model {request.model_id!r}")
        unknown = [i for i in request.expert_ids if i not in adapter.experts]
        if unknown:
            raise WerkError(ErrorCode.NOT_FOUND, f"unknown expert {unknown[0]!r}")
        if request.action is ExpertActionKind.PREFETCH and request.target_tier is not Tier.RAM:
            raise WerkError(ErrorCode.INVALID_REQUEST, "the reference backend holds experts in ram only")
        action = request.action
        after: dict[str, ExpertSummary] = {}
        for expert_id in request.expert_ids:
            expert = adapter.experts[expert_id]
            if action in (ExpertActionKind.PREFETCH, ExpertActionKind.PIN):
                update: dict[str, object] = {"tier": ExpertTier.RAM}
                if action is ExpertActionKind.PIN:
                    update["pinned"] = True
            elif action is ExpertActionKind.UNPIN:
                update = {"pinned": False}
            else:
                update = {"tier": ExpertTier.EXTERNAL, "pinned": False}
            after[expert_id] = expert.model_copy(update=update)
        table = {**adapter.experts, **after}
        pins = sum(e.pinned for e in table.values())
        if adapter.max_pinned_experts is not None and pins > adapter.max_pinned_experts:
            raise WerkError(ErrorCode.RESOURCE_EXHAUSTED, f"at most {adapter.max_pinned_experts} experts can be pinned")
        changed = any(after[i] != adapter.experts[i] for i in after)
        if not request.dry_run:
            adapter.experts = table
        return ExpertActionResult(experts=list(after.values()), changed=changed, dry_run=request.dry_run)

    # -- chat planning -----------------------------------------------------------------------
    @hookimpl
    def werk_count_tokens(self, adapter: MemoryAdapter, request: ChatRequest) -> int:
        adapter.check("count")
        return count_chat_tokens(request)

    @hookimpl
    def werk_chat_limits(self, adapter: MemoryAdapter, model: str | None) -> ChatLimits:
        return ChatLimits(
            model=model or adapter.model_name,
            context_tokens=CONTEXT_TOKENS,
            max_output_tokens=MAX_OUTPUT_TOKENS,
            max_concurrent_requests=1,
        )

    @hookimpl
    def werk_reasoning_profile(
        self, adapter: MemoryAdapter, model: str | None, max_output_tokens: int
    ) -> ReasoningProfile:
        """Tiers from ``max_output_tokens`` alone (no launch budget, thinking on); a closed
        adapter is a cold runtime and answers ``supported=False``."""
        name = model or adapter.model_name
        if adapter.closed:
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
    @hookimpl
    def werk_chat_completion(self, adapter: MemoryAdapter, request: JsonObject) -> InferenceResponse:
        """Echo the last message's words (bounded by ``max_tokens``); usage is exact."""
        adapter.check("chat")
        chat = _chat_request(request)
        out, finish = _echo(_message_text(chat.messages[-1]), _output_tokens(request))
        return self.chat_answer(adapter, request, out, finish, _usage(count_chat_tokens(chat), len(out)))

    def chat_answer(
        self, adapter: MemoryAdapter, request: JsonObject, out: list[str], finish: str, usage: JsonObject
    ) -> InferenceResponse:
        """The chat-completion response (streamed when asked) carrying ``out`` and ``usage``."""
        ident, created = f"chatcmpl-{secrets.token_hex(8)}", int(time.time())
        head: JsonObject = {"id": ident, "created": created, "model": adapter.model_name}
        if request.get("stream") is True:
            return _sse_response(self._chat_chunks(head, out, finish, usage if _include_usage(request) else None))
        message: JsonObject = {"role": "assistant", "content": " ".join(out)}
        choice: JsonObject = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        return _json_response({**head, "object": "chat.completion", "choices": [choice], "usage": usage})

    @hookimpl
    def werk_session_snapshots(self, adapter: MemoryAdapter, model_id: str) -> MemorySessionSnapshots:
        return MemorySessionSnapshots(self, adapter)

    @staticmethod
    def _chat_chunks(head: JsonObject, out: list[str], finish: str, usage: JsonObject | None) -> Iterator[JsonObject]:
        def chunk(delta: JsonObject, finish_reason: str | None = None) -> JsonObject:
            choice: JsonObject = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
            return {**head, "object": "chat.completion.chunk", "choices": [choice]}

        yield chunk({"role": "assistant", "content": ""})
        for i, word in enumerate(out):
            yield chunk({"content": word if i == 0 else f" {word}"})
        yield chunk({}, finish)
        if usage is not None:
            yield {**head, "object": "chat.completion.chunk", "choices": [], "usage": usage}

    @hookimpl
    def werk_text_completion(self, adapter: MemoryAdapter, request: JsonObject) -> InferenceResponse:
        """Legacy completions: echo each prompt's words (bounded by ``max_tokens``)."""
        adapter.check("completion")
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
            "model": adapter.model_name,
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
    @hookimpl
    def werk_workers(self, adapter: MemoryAdapter) -> list[WorkerObservation]:
        """Its one in-process worker (no separate process, so no pid)."""
        return [
            WorkerObservation(
                model=adapter.model_name,
                backend=BACKEND_ID,
                pid=None,
                state="stopped" if adapter.closed else "ready",
                slots=1,
                context_per_request_tokens=CONTEXT_TOKENS,
                context_capacity_tokens=CONTEXT_TOKENS,
            )
        ]

    @hookimpl
    def werk_deployment_plan(self, adapter: MemoryAdapter) -> DeploymentPlan | None:
        """Its fixed in-process placement: one slot of the whole context, on the CPU."""
        if adapter.closed:
            return None
        return DeploymentPlan(
            endpoint=EndpointKind.LOCAL,
            arguments=["--in-memory"],
            threads=1,
            parallel_slots=1,
            context_per_slot=CONTEXT_TOKENS,
            device="cpu",
        )

    @hookimpl
    def werk_memory_requirement(self, adapter: MemoryAdapter, operation: MemoryOperation, model_id: str) -> int | None:
        return adapter.memory_requirement


__all__ = [
    "BACKEND_ID",
    "CONTEXT_TOKENS",
    "EXPERIMENTAL_STATE",
    "EXPERTS_PER_MODEL",
    "MAX_OUTPUT_TOKENS",
    "PLUGIN_NAME",
    "MemoryAdapter",
    "MemoryBackendPlugin",
    "MemorySessionSnapshots",
    "count_chat_tokens",
    "default_experts",
    "session_tokens",
]
