"""Generation admission helpers, shared by ``/werk/v1/chat/admission`` and ``/v1`` generation.

Two tools, used by :mod:`werk_host.service.inference` and :mod:`werk_host.service.planning`:

* :func:`estimate_input_tokens`, used only when a backend has no native counter. It is
  deliberately conservative (over-counts): one token per 3 UTF-8 bytes of every text field,
  plus a fixed per-message template overhead. :func:`prompt_tokens` is its ``/v1/completions``
  counterpart (a raw prompt has no template; token-id prompts are counted exactly).
* :class:`FitBounds`, the *provable fit* shortcut of ``/v1`` admission. An exact count costs
  the backend a template render and a tokenization per fresh prompt (for llama.cpp, an
  ``/apply-template`` and a ``/tokenize`` round trip). Most requests are far below the context,
  so admission first asks :meth:`FitBounds.bound` for an upper bound on the exact count computed
  without calling the backend; only when that bound plus the requested output does not fit is
  the exact count taken. Answers do not change: a request the bound admits would be admitted
  by the exact count too, and every rejection (and every near-limit admission) still comes
  from the exact count, with the same numbers in the message.

Where the bound's evidence comes from
-------------------------------------
Only from the backend's own exact counts (``werk_count_tokens``), taken once per adapter
identity (:meth:`werk_host.seam.Adapter.identity`, so a restarted or replaced backend
process is calibrated afresh), in its :data:`CALIBRATE_AFTER`-th plain admission (the earlier
ones are counted exactly: a process that answers a few requests never pays for the
calibration), on short *template-only* requests whose message contents are one
sentinel byte. They give, for the roles of the conversations admission accepts (an optional
leading ``system`` message, then ``user``/``assistant`` alternating from ``user``):

* ``lead``: the exact count of the shortest such request (``[user]`` or ``[system, user]``),
  i.e. the template's fixed part (BOS, default system prompt, generation prompt) plus the first
  messages' framing;
* ``step[role]``: the tokens one more (sentinel) message of that role adds. It is measured at
  two depths; if the two differ the template is depth-dependent and no bound is given.

For a request with those roles and contents of ``b_i`` UTF-8 bytes the bound is::

    lead + sum(step[role_i] for messages past the lead ones)
         + sum(b_i + SLACK_PER_MESSAGE) + SLACK_FIXED

It rests on two facts, and each is checked on probes before any bound is given:

1. *Every token covers at least one byte of the rendered text* (BPE and SentencePiece
   vocabularies, byte fallback included; special tokens span several bytes): content of ``b``
   bytes adds at most ``b`` tokens, plus re-tokenization where it meets template text
   (``SLACK_PER_MESSAGE``). Tokenizers that normalize text into *more* bytes (NFKC expansions)
   break it; a probe of such characters detects that.
2. *The template inserts each message's content once, verbatim, with framing that does not
   depend on the content.* Probes of several kinds (digits, whitespace runs, newlines, multi-byte
   and expanding characters) in every role must each add at most their bytes plus the slack.

A backend whose calibration or probes fail, whose template refuses the sentinel requests, or
that has no native counter gets no bound: every request is counted exactly, as before. Requests
outside the calibrated shape (tools, content parts, tool calls, names, other roles, options
that reach the template such as ``chat_template_kwargs``, ``reasoning_effort`` or ``werk``) are
counted exactly too.

The bound keeps being checked after calibration: every exact count admission takes, and the
prompt tokens the backend reports in the ``usage`` of every answer admitted on the bound, are
compared with it (:meth:`FitBounds.observe`); one above it withdraws the evidence for that
identity (logged) and the host counts every request exactly from then on. A template that
branches on content in a way the probes cannot see is the remaining assumption: the bound is a
proof for templates with per-message framing (ChatML, Llama 3, Gemma, Mistral, Phi and the
like), and a checked assumption beyond them, whose first violation is caught by the backend's
own report of what it counted.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from werk_host.errors import ErrorCode, WerkError
from werk_host.protocol import ChatRequest
from werk_host.protocol.chat import ChatRole
from werk_host.seam import Adapter

log = logging.getLogger(__name__)

BYTES_PER_TOKEN = 3
PER_MESSAGE_OVERHEAD = 8

#: Tokens allowed per message for content re-tokenizing the template text it meets.
SLACK_PER_MESSAGE = 8
#: Tokens allowed once per request (template output that varies a little, e.g. a rendered date).
SLACK_FIXED = 16
#: The content of every calibration message: one byte, so that no template skips it as empty.
SENTINEL = "x"
#: Probe contents: each must add at most its bytes plus ``SLACK_PER_MESSAGE`` tokens over the
#: sentinel in every calibrated role (digits split one per token in many vocabularies; runs of
#: whitespace; multi-byte and byte-fallback characters; U+FDFA expands 1 -> 18 characters under
#: NFKC, so a normalizing tokenizer fails it).
PROBES = (
    "0123456789" * 8,
    " " * 64,
    "\n" * 32,
    "é漢字🙂 " * 6,
    "\ufdfa" * 8,
    "x" * 48 + " the end",
)
#: Top-level request options that never reach the chat template (sampling and transport). A
#: request with any other extra option is counted exactly.
RENDER_NEUTRAL = frozenset(
    {
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "typical_p",
        "seed",
        "n",
        "stop",
        "presence_penalty",
        "frequency_penalty",
        "repeat_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "user",
        "ignore_eos",
        "cache_prompt",
        "stream_options",
    }
)
MAX_IDENTITIES = 64
#: The plain requests of one adapter identity counted exactly before it is calibrated: the
#: calibration's ~26 counts pay off over a stream of requests, not for a process that answers a
#: few (``werk run``, the first answer after a start; docs/operations.md, "Start-up").
CALIBRATE_AFTER = 4

_SYSTEM, _USER, _ASSISTANT = ChatRole.SYSTEM, ChatRole.USER, ChatRole.ASSISTANT


def estimate_input_tokens(request: ChatRequest) -> int:
    total_bytes = 0
    for message in request.messages:
        payload = message.model_dump(mode="json", exclude_none=True)
        total_bytes += len(json.dumps(payload, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    if request.tools:
        total_bytes += len(json.dumps(request.tools, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    return math.ceil(total_bytes / BYTES_PER_TOKEN) + PER_MESSAGE_OVERHEAD * len(request.messages)


def prompt_tokens(prompt: str | list[int]) -> int:
    """The input of one ``/v1/completions`` prompt: a token-id prompt's length (exact), else the
    same estimate as a message's (no backend hook counts raw text)."""
    if isinstance(prompt, list):
        return len(prompt)
    return math.ceil(len(prompt.encode("utf-8", "surrogatepass")) / BYTES_PER_TOKEN)


@dataclass(frozen=True)
class PlainShape:
    """What the bound needs of a request: whether it opens with ``system``, its roles after the
    lead messages, and every content's UTF-8 size."""

    system_led: bool
    tail_roles: tuple[ChatRole, ...]
    content_bytes: tuple[int, ...]


def plain_shape(request: ChatRequest) -> PlainShape | None:
    """The shape of a request the calibration covers, else ``None`` (count it exactly)."""
    if request.tools is not None or request.tool_choice is not None or request.response_format is not None:
        return None  # a response format may reach the template as tools do
    if request.reasoning_effort is not None or request.werk is not None:
        return None  # werk.reasoning may reach the template (the backend counts it rendered)
    if request.model_extra and not RENDER_NEUTRAL.issuperset(request.model_extra):
        return None
    roles: list[ChatRole] = []
    sizes: list[int] = []
    for message in request.messages:
        named = message.name is not None or message.tool_call_id is not None
        if message.model_extra or named or message.tool_calls is not None or not isinstance(message.content, str):
            return None
        roles.append(message.role)
        sizes.append(len(message.content.encode("utf-8", "surrogatepass")))
    system_led = roles[0] is _SYSTEM
    lead = 2 if system_led else 1
    if len(roles) < lead:
        return None
    for i, role in enumerate(roles[lead - 1 :]):
        if role is not (_USER if i % 2 == 0 else _ASSISTANT):
            return None
    return PlainShape(system_led, tuple(roles[lead:]), tuple(sizes))


@dataclass(frozen=True)
class TemplateEvidence:
    """Exact sentinel counts of one adapter identity (see the module docstring)."""

    lead: dict[bool, int]  # system-led -> count of [user] / [system, user]; a missing key: no bound
    step: dict[ChatRole, int]

    def bound(self, shape: PlainShape) -> int | None:
        lead = self.lead.get(shape.system_led)
        if lead is None:
            return None
        framing = lead + sum(self.step[role] for role in shape.tail_roles)
        return framing + sum(shape.content_bytes) + SLACK_PER_MESSAGE * len(shape.content_bytes) + SLACK_FIXED


Count = Callable[[Adapter, ChatRequest], int | None]


class _Refused(Exception):
    """The backend could not count a calibration request: no bound for this branch."""


def _conversation(roles: Sequence[ChatRole], contents: dict[int, str] | None = None) -> ChatRequest:
    contents = contents or {}
    return ChatRequest.model_validate(
        {"messages": [{"role": role.value, "content": contents.get(i, SENTINEL)} for i, role in enumerate(roles)]}
    )


def calibrate(adapter: Adapter, count: Count) -> TemplateEvidence | None:
    """Evidence for ``adapter`` from about 25 exact counts of short sentinel requests, or ``None``
    when the backend has no counter, refuses them, or a check fails (module docstring)."""

    def exact(roles: Sequence[ChatRole], contents: dict[int, str] | None = None) -> int:
        try:
            n = count(adapter, _conversation(roles, contents))
        except WerkError as err:
            if err.code is ErrorCode.UNAVAILABLE:
                raise
            raise _Refused from err
        if n is None:
            raise _Refused
        return n

    def probed(roles: Sequence[ChatRole], at: int, base: int) -> bool:
        return all(exact(roles, {at: p}) <= base + len(p.encode()) + SLACK_PER_MESSAGE for p in PROBES)

    u, a = _USER, _ASSISTANT
    try:
        chain = [exact([u, a, u, a, u][:n]) for n in range(1, 6)]
    except _Refused:
        return None
    steps_a = (chain[1] - chain[0], chain[3] - chain[2])
    steps_u = (chain[2] - chain[1], chain[4] - chain[3])
    if steps_a[0] != steps_a[1] or steps_u[0] != steps_u[1]:
        log.info("no admission bound for %s: the template's framing depends on depth", adapter.instance_id)
        return None
    step = {a: max(steps_a[0], 0), u: max(steps_u[0], 0)}
    try:
        if not (probed([u], 0, chain[0]) and probed([u, a], 1, chain[1])):
            log.info("no admission bound for %s: a probe added more tokens than bytes", adapter.instance_id)
            return None
    except _Refused:
        return None
    lead = {False: chain[0]}
    try:
        system = [exact([_SYSTEM, u, a, u][:n]) for n in range(2, 5)]
        if probed([_SYSTEM, u], 0, system[0]):
            lead[True] = system[0]
            step = {a: max(step[a], system[1] - system[0]), u: max(step[u], system[2] - system[1])}
    except _Refused:
        pass  # this template refuses system-led sentinels: those requests are counted exactly
    return TemplateEvidence(lead=lead, step=step)


class FitBounds:
    """Per adapter identity, calibrated evidence and the bound it gives (module docstring).

    Thread-safe. Calibration runs once per identity, in its :data:`CALIBRATE_AFTER`-th plain
    admission (the ones before are counted exactly); requests admitted meanwhile by other
    threads are counted exactly."""

    def __init__(self, count: Count) -> None:
        self._count = count
        self._evidence: OrderedDict[str, TemplateEvidence | None] = OrderedDict()
        self._asked: OrderedDict[str, int] = OrderedDict()  # plain admissions before calibration
        self._lock = threading.Lock()
        self._calibrating = threading.Lock()

    def bound(self, adapter: Adapter, request: ChatRequest) -> int | None:
        """An upper bound on the exact input-token count of ``request``, or ``None``."""
        shape = plain_shape(request)
        if shape is None:
            return None
        key = adapter.identity()
        with self._lock:
            known = key in self._evidence
            evidence = self._evidence.get(key)
            if not known:
                asked = self._asked[key] = self._asked.pop(key, 0) + 1
                while len(self._asked) > MAX_IDENTITIES:
                    self._asked.popitem(last=False)
        if not known:
            if asked < CALIBRATE_AFTER:
                return None
            evidence = self._calibrate(adapter, key)
        return evidence.bound(shape) if evidence is not None else None

    def observe(self, adapter: Adapter, request: ChatRequest, exact: int) -> None:
        """Check an exact count of ``request`` (taken by admission, or reported by the backend as
        an answer's prompt tokens) against the bound; one above it withdraws the evidence."""
        shape = plain_shape(request)
        if shape is None:
            return
        key = adapter.identity()
        with self._lock:
            evidence = self._evidence.get(key)
            bound = evidence.bound(shape) if evidence is not None else None
            if bound is None or exact <= bound:
                return
            self._evidence[key] = None
        log.warning(
            "admission bound withdrawn for %s: an exact count (%d) exceeded the bound (%d); counting exactly",
            adapter.instance_id,
            exact,
            bound,
        )

    def _calibrate(self, adapter: Adapter, key: str) -> TemplateEvidence | None:
        if not self._calibrating.acquire(blocking=False):
            return None
        try:
            with self._lock:
                if key in self._evidence:
                    return self._evidence[key]
            try:
                evidence = calibrate(adapter, self._count)
            except WerkError:
                return None  # unavailable now: calibrate on a later request
            if adapter.identity() != key:
                return None  # the process changed under the calibration
            with self._lock:
                self._evidence[key] = evidence
                self._asked.pop(key, None)
                while len(self._evidence) > MAX_IDENTITIES:
                    self._evidence.popitem(last=False)
            return evidence
        finally:
            self._calibrating.release()
