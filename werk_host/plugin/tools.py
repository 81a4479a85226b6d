"""Forced tool calls for backends whose engine can constrain its output by a JSON schema but
cannot force a tool call itself (docs/plugin-kit.md, "Tool calls"; docs/compat.md, "OpenAI").

An OpenAI chat request forces a call with ``tool_choice: "required"`` (any of its ``tools``) or
``{"type": "function", "function": {"name": N}}`` (that one). A backend that cannot enforce
that natively (a chat template that renders no tools, a server that ignores ``tool_choice``)
turns it into a constrained generation with this module and parses the answer back:

* :func:`forced_call` reads the request: ``None`` when nothing is forced (no ``tool_choice``,
  ``"auto"``, ``"none"``), else a :class:`ForcedCall`. A forced choice without ``tools``, a
  named function that is not in ``tools``, or a forced choice combined with the request's own
  output constraint (``response_format`` other than ``text``, ``grammar``, ``json_schema``) is
  ``invalid_request``.
* **One call per answer.** The constrained output is exactly one call, the JSON object
  ``{"name": N, "arguments": <N's parameters>}`` (:meth:`ForcedCall.schema`: ``name`` a
  ``const``, ``arguments`` the function's ``parameters`` schema, ``{"type": "object"}`` when it
  has none; ``"required"`` is an ``anyOf`` of one such object per tool). That is the documented
  rule whatever ``parallel_tool_calls`` says: parallel calls are *permitted* by OpenAI, never
  required, and a small model given an array schema repeats calls until ``max_tokens``.
* :meth:`ForcedCall.constrained_body` is the body the engine gets: ``tool_choice`` removed, the
  schema as ``response_format`` (``json_schema``, strict); with ``render_tools`` (templates
  that do not render ``tools``) also ``tools`` and ``parallel_tool_calls`` removed and
  :meth:`ForcedCall.instruction` (each function's name, description and compact JSON-Schema
  parameters, and which call to make) added to a first system or developer message of text
  (string content, or one more text part), else put first as a system message.
* :func:`render_history` rewrites a conversation's tool turns for a template that cannot render
  them: an assistant message's ``tool_calls`` become its text, one call JSON object
  ``{"name", "arguments"}`` per line after any content (the shape the model is constrained to),
  and a ``tool`` (or legacy ``function``) message becomes a ``user`` message
  ``Result of <name> (<tool_call_id>): <content>``.
* :meth:`ForcedCall.relay` turns the engine's OpenAI answer back into a call. A whole JSON
  answer (read to its end by ``relay`` itself) gets, per choice, ``message.tool_calls`` (one
  call: ``id`` ``call_<hex>``, ``type: "function"``, ``function.name``, ``function.arguments``
  the arguments' JSON text with the whitespace outside strings removed), ``content: null`` and
  ``finish_reason: "tool_calls"``. A stream's text deltas (JSON fragments, not for the client)
  are scanned as they arrive: once the call's name is complete the first ``delta.tool_calls``
  chunk goes out (``index`` 0, ``id``, ``type``, ``function.name``, ``arguments: ""``), then each
  piece of the arguments as a further ``function.arguments`` delta; the chunk with the engine's
  ``finish_reason`` then says ``"tool_calls"``. A delta's other fields (the role, reasoning
  text) go out as they came, without the text. Every other event (a ``choices: []`` usage
  chunk, ``data: [DONE]``, anything unparsed) passes through byte for byte, so the final
  ``usage`` is exactly the engine's.
* **Output that is not one complete call.** Cut by ``max_tokens`` (``finish_reason``
  ``"length"``): the JSON answer is left as the engine sent it (the text as ``content``,
  ``"length"``); a stream sends the text as ``content`` when no call had begun, else ends the
  begun call with ``"length"`` (OpenAI's own sign of truncated arguments). Any other ending
  (a stop sequence of the request cut the JSON) is ``unavailable``, "the model did not complete
  the forced tool call" (a stream ends with that error event). Never a 500, never a made-up call.
* An answer whose status is not 200 passes through untouched.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from pydantic import JsonValue

from werk_host.errors import ErrorCode, WerkError
from werk_host.plugin.openai import json_answer, sse
from werk_host.seam import InferenceResponse, JsonObject

__all__ = [
    "CALL_ID_PREFIX",
    "ForcedCall",
    "Function",
    "forced_call",
    "functions",
    "has_tool_turns",
    "new_call_id",
    "render_history",
]

#: Every call id Werk makes starts with this (OpenAI's ``call_...``).
CALL_ID_PREFIX = "call_"
#: Request fields that constrain the output themselves: not combinable with a forced call.
_OWN_CONSTRAINTS = ("grammar", "json_schema")
_WHITESPACE = " \t\r\n"
INCOMPLETE = "the model did not complete the forced tool call"


def new_call_id() -> str:
    """A fresh random call id, ``call_`` and 24 hex digits."""
    return CALL_ID_PREFIX + secrets.token_hex(12)


def _compact(value: JsonValue) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True)
class Function:
    """One function tool of a request."""

    name: str
    description: str | None
    #: its ``parameters`` JSON Schema, ``{"type": "object"}`` when the tool has none
    parameters: dict[str, JsonValue]

    def call_schema(self) -> dict[str, JsonValue]:
        """The JSON schema of one call of this function."""
        return {
            "type": "object",
            "properties": {"name": {"const": self.name}, "arguments": self.parameters},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }


def _invalid(message: str) -> WerkError:
    return WerkError(ErrorCode.INVALID_REQUEST, message)


def functions(tools: JsonValue) -> list[Function]:
    """The function tools of a request's ``tools`` (already shape-checked by the host)."""
    found: list[Function] = []
    for tool in tools if isinstance(tools, list) else []:
        spec = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise _invalid("tools: each tool needs a function with a name")
        description = spec.get("description")
        parameters = spec.get("parameters")
        found.append(
            Function(
                name=str(spec["name"]),
                description=description if isinstance(description, str) else None,
                parameters=parameters if isinstance(parameters, dict) else {"type": "object"},
            )
        )
    return found


def forced_call(body: Mapping[str, JsonValue]) -> ForcedCall | None:
    """The request's forced tool choice, or ``None`` when it forces none (module docstring)."""
    choice = body.get("tool_choice")
    if choice is None or choice in ("auto", "none"):
        return None
    named: str | None = None
    if isinstance(choice, dict):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str):
            raise _invalid('tool_choice must name a function: {"type": "function", "function": {"name": ...}}')
        named = name
    elif choice != "required":
        raise _invalid('tool_choice must be "none", "auto", "required" or a named function')
    tools = functions(body.get("tools"))
    if not tools:
        raise _invalid("tool_choice forces a tool call, but the request has no tools")
    if named is not None and named not in {f.name for f in tools}:
        raise _invalid("tool_choice names a function that is not in tools")
    response_format = body.get("response_format")
    own = isinstance(response_format, dict) and response_format.get("type") not in (None, "text")
    if own or any(body.get(name) is not None for name in _OWN_CONSTRAINTS):
        raise _invalid("a forced tool_choice cannot be combined with response_format, grammar or json_schema")
    chosen = tuple(f for f in tools if named is None or f.name == named)
    return ForcedCall(chosen, named)


def has_tool_turns(messages: JsonValue) -> bool:
    """Whether a conversation holds tool turns (:func:`render_history` would change it)."""
    return isinstance(messages, list) and any(
        isinstance(m, dict) and (m.get("role") in ("tool", "function") or m.get("tool_calls") or m.get("function_call"))
        for m in messages
    )


def _text(content: JsonValue) -> str:
    """A message's content as text (the text parts of a list, joined by newlines)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _call_text(call: JsonValue) -> str | None:
    """One assistant tool call (or legacy ``function_call``) as the JSON the model is asked for."""
    function = call.get("function") if isinstance(call, dict) else None
    if isinstance(call, dict) and function is None and "name" in call:
        function = call  # the legacy function_call has name/arguments itself
    if not isinstance(function, dict):
        return None
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):  # else kept as the string the client sent
            arguments = json.loads(arguments)
    return _compact({"name": function.get("name"), "arguments": arguments})


def render_history(messages: list[JsonValue]) -> list[JsonValue]:
    """``messages`` with their tool turns as plain text turns (module docstring)."""
    names: dict[str, str] = {}
    out: list[JsonValue] = []
    for message in messages:
        if not isinstance(message, dict):
            out.append(message)
            continue
        role = message.get("role")
        calls = message.get("tool_calls")
        legacy = message.get("function_call")
        if role == "assistant" and (calls or legacy):
            listed = calls if isinstance(calls, list) else [legacy]
            for call in listed:
                if isinstance(call, dict) and isinstance(call.get("id"), str):
                    function = call.get("function")
                    if isinstance(function, dict) and isinstance(function.get("name"), str):
                        names[str(call["id"])] = str(function["name"])
            lines = [_text(message.get("content"))] if _text(message.get("content")) else []
            lines += [text for text in map(_call_text, listed) if text is not None]
            kept = {k: v for k, v in message.items() if k not in ("content", "tool_calls", "function_call")}
            out.append({**kept, "content": "\n".join(lines)})
        elif role in ("tool", "function"):
            call_id = message.get("tool_call_id")
            name = message.get("name")
            if not isinstance(name, str):
                name = names.get(call_id, "the function") if isinstance(call_id, str) else "the function"
            where = f" ({call_id})" if isinstance(call_id, str) else ""
            out.append({"role": "user", "content": f"Result of {name}{where}: {_text(message.get('content'))}"})
        else:
            out.append(message)
    return out


@dataclass
class _Scan:
    """The incremental scan of one call's JSON text (:meth:`ForcedCall.relay`): the call's
    name once its string is complete, and the arguments value as it arrives, without the
    whitespace outside strings. Whether the whole text is one valid call is decided at the end
    (:meth:`call`), by parsing it."""

    raw: list[str] = field(default_factory=list)
    depth: int = 0
    in_string: bool = False
    escaped: bool = False
    phase: str = "key"  # in the call object: reading a "key", before the "colon", or a "value"
    token: list[str] = field(default_factory=list)  # the call object's string being read
    key: str | None = None  # the key whose value is being read
    name: str | None = None
    capturing: bool = False  # inside the arguments value
    arguments: list[str] = field(default_factory=list)  # compact arguments text so far
    sent: int = 0  # how much of ``arguments`` went out

    def feed(self, text: str) -> None:
        self.raw.append(text)
        for ch in text:
            self._char(ch)

    def _char(self, ch: str) -> None:
        if self.in_string:
            self._keep(ch)
            if self.escaped:
                self.escaped = False
            elif ch == "\\":
                self.escaped = True
            elif ch == '"':
                self.in_string = False
                if self.depth == 1 and not self.capturing:
                    self._string_done()
            return
        if ch in _WHITESPACE:
            return
        if self.depth == 1:
            if not self.capturing and self.phase == "value" and self.key == "arguments" and ch not in ",}":
                self.capturing = True  # the arguments value begins
            if ch == ":":
                self.phase = "value"
                return
            if ch in ",}":
                self.capturing = False
                self.phase, self.key = "key", None
                if ch == "}":
                    self.depth = 0
                return
        if ch == '"':
            self.in_string = True
            if self.depth == 1 and not self.capturing:
                self.token = []
            self._keep(ch)
        elif ch in "{[":
            self.depth += 1
            if self.depth > 1:
                self._keep(ch)
        elif ch in "}]":
            self.depth -= 1
            self._keep(ch)
        else:
            self._keep(ch)

    def _keep(self, ch: str) -> None:
        if self.capturing:
            self.arguments.append(ch)
        elif self.depth == 1:
            self.token.append(ch)

    def _string_done(self) -> None:
        try:
            value = json.loads("".join(self.token))
        except ValueError:
            value = None
        self.token = []
        if self.phase == "key":
            self.key = value if isinstance(value, str) else None
            self.phase = "colon"
        elif self.key == "name" and isinstance(value, str):
            self.name = value

    def unsent(self) -> str:
        """The arguments text not yet sent, marked as sent."""
        text = "".join(self.arguments[self.sent :])
        self.sent = len(self.arguments)
        return text

    def call(self, allowed: set[str]) -> tuple[str, str] | None:
        """``(name, arguments)`` when the whole text is exactly one complete call, else ``None``."""
        try:
            doc = json.loads("".join(self.raw))
        except ValueError:
            return None
        if not isinstance(doc, dict) or set(doc) != {"name", "arguments"} or doc["name"] not in allowed:
            return None
        arguments = "".join(self.arguments)
        try:
            same = json.loads(arguments) == doc["arguments"]
        except ValueError:
            same = False
        return (str(doc["name"]), arguments) if same and self.name == doc["name"] else None


def _scan(text: str) -> _Scan:
    scan = _Scan()
    scan.feed(text)
    return scan


@dataclass(frozen=True)
class ForcedCall:
    """One request's forced tool choice (module docstring)."""

    functions: tuple[Function, ...]
    #: the function named by ``tool_choice``; ``None`` for ``"required"``
    name: str | None = None

    @property
    def names(self) -> set[str]:
        return {f.name for f in self.functions}

    def schema(self) -> dict[str, JsonValue]:
        """The JSON schema of the one call the answer must be."""
        if len(self.functions) == 1:
            return self.functions[0].call_schema()
        return {"anyOf": [f.call_schema() for f in self.functions]}

    def response_format(self) -> dict[str, JsonValue]:
        """OpenAI's ``response_format`` carrying :meth:`schema`."""
        return {"type": "json_schema", "json_schema": {"name": "tool_call", "strict": True, "schema": self.schema()}}

    def instruction(self) -> str:
        """The system-message text describing the functions and the call to make."""
        which = f"Call the function {self.name} now." if self.name else "Call one of these functions now."
        lines = [
            "You can call functions. To call one, answer with only a JSON object: "
            '{"name": <function name>, "arguments": <an object matching its parameters>}. ' + which,
            "",
            "Functions:",
        ]
        for f in self.functions:
            about = f" {f.description.strip()}" if f.description and f.description.strip() else ""
            lines.append(f"- {f.name}:{about} Parameters (JSON Schema): {_compact(f.parameters)}")
        return "\n".join(lines)

    def constrained_body(self, body: JsonObject, *, render_tools: bool) -> JsonObject:
        """The body the engine gets (module docstring)."""
        dropped = ("tool_choice", "tools", "parallel_tool_calls") if render_tools else ("tool_choice",)
        out: JsonObject = {k: v for k, v in body.items() if k not in dropped}
        if render_tools:
            out["messages"] = _with_system(body.get("messages"), self.instruction())
        out["response_format"] = self.response_format()
        return out

    def relay(self, response: InferenceResponse, *, stream: bool) -> InferenceResponse:
        """The engine's answer to :meth:`constrained_body` as OpenAI tool calls (module
        docstring). A JSON answer is read to its end here; a stream is rewritten as it flows."""
        if response.status != 200:
            return response
        if stream:
            return InferenceResponse(response.status, response.headers, self.events(response.body), response.close)
        try:
            raw = b"".join(response.body)
        finally:
            response.close()
        try:
            doc = json.loads(raw)
        except ValueError as err:
            raise WerkError(ErrorCode.UNAVAILABLE, "the backend's answer was not JSON", retryable=True) from err
        if not isinstance(doc, dict):
            raise WerkError(ErrorCode.UNAVAILABLE, "the backend's answer was not a JSON object", retryable=True)
        return json_answer(self.answer(doc))

    def answer(self, doc: JsonObject) -> JsonObject:
        """A whole ``chat.completion`` document with each choice's text turned into its call."""
        choices = doc.get("choices")
        if not isinstance(choices, list):
            return doc
        rewritten: list[JsonValue] = []
        for choice in choices:
            if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
                rewritten.append(choice)
                continue
            message = choice["message"]
            assert isinstance(message, dict)
            content = message.get("content")
            call = _scan(content).call(self.names) if isinstance(content, str) else None
            if call is None:
                if choice.get("finish_reason") == "length":
                    rewritten.append(choice)  # cut short: the text and "length", as sent
                    continue
                raise WerkError(ErrorCode.UNAVAILABLE, INCOMPLETE)
            tool_call: JsonValue = {
                "id": new_call_id(),
                "type": "function",
                "function": {"name": call[0], "arguments": call[1]},
            }
            kept = {k: v for k, v in message.items() if k not in ("content", "tool_calls")}
            new_message: JsonObject = {**kept, "role": "assistant", "content": None, "tool_calls": [tool_call]}
            rewritten.append({**choice, "message": new_message, "finish_reason": "tool_calls"})
        return {**doc, "choices": rewritten}

    def events(self, body: Iterable[bytes]) -> Iterator[bytes]:
        """A ``text/event-stream`` body with its text deltas turned into ``delta.tool_calls``."""
        streams: dict[int, _Streamed] = {}
        pending = b""
        for chunk in body:
            pending += chunk
            while b"\n\n" in pending:
                event, pending = pending.split(b"\n\n", 1)
                out = self._event(event + b"\n\n", streams)
                if out:
                    yield out
        if pending:
            yield pending

    def _event(self, event: bytes, streams: dict[int, _Streamed]) -> bytes:
        text = event.decode("utf-8", errors="replace").strip()
        if not text.startswith("data:"):
            return event
        try:
            doc = json.loads(text[len("data:") :])
        except ValueError:
            return event  # [DONE] and anything else that is not a chunk
        choices = doc.get("choices") if isinstance(doc, dict) else None
        if not isinstance(doc, dict) or not isinstance(choices, list) or not choices:
            return event  # the usage chunk and errors pass byte for byte
        out: list[JsonValue] = []
        for choice in choices:
            if not isinstance(choice, dict) or not isinstance(choice.get("delta"), dict):
                out.append(choice)
                continue
            index = choice.get("index", 0)
            state = streams.setdefault(index if isinstance(index, int) else 0, _Streamed())
            out.extend(state.step(choice, self.names))
        # one choice per chunk; what else the engine's chunk held (usage, timings) stays on its last
        head = {k: v for k, v in doc.items() if k not in ("choices", "usage")}
        events = [sse({**head, "choices": [c]}) for c in out[:-1]]
        if out:
            events.append(sse({**doc, "choices": [out[-1]]}))
        return b"".join(events)


@dataclass
class _Streamed:
    """One streamed choice's scan and what of its call went out."""

    scan: _Scan = field(default_factory=_Scan)
    call_id: str = field(default_factory=new_call_id)
    started: bool = False

    @staticmethod
    def _choice(index: JsonValue, delta: JsonObject, finish: str | None = None) -> JsonObject:
        return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}

    def _call_delta(self, index: JsonValue, piece: JsonObject) -> JsonObject:
        return self._choice(index, {"tool_calls": [{"index": 0, **piece}]})

    def step(self, choice: JsonObject, allowed: set[str]) -> list[JsonValue]:
        """The choices that replace ``choice``: its text is scanned, never sent as such."""
        delta = choice["delta"]
        assert isinstance(delta, dict)
        index = choice.get("index", 0)
        content = delta.get("content")
        if isinstance(content, str) and content:
            self.scan.feed(content)
        rest = {k: v for k, v in delta.items() if k != "content"}
        out: list[JsonValue] = []
        if rest:  # the role, reasoning text and the like: kept, without the scanned text
            out.append(self._choice(index, {**rest, "content": None} if "role" in rest else rest))
        if not self.started and self.scan.name in allowed:
            self.started = True
            head: JsonObject = {"name": self.scan.name, "arguments": ""}
            out.append(self._call_delta(index, {"id": self.call_id, "type": "function", "function": head}))
        piece = self.scan.unsent() if self.started else ""
        if piece:
            out.append(self._call_delta(index, {"function": {"arguments": piece}}))
        finish = choice.get("finish_reason")
        if finish is None:
            return out
        if self.started and self.scan.call(allowed) is not None:
            out.append({**choice, "delta": {}, "finish_reason": "tool_calls"})
        elif finish == "length":
            if not self.started:  # no call began: the text is the answer, cut short
                out.append(self._choice(index, {"content": "".join(self.scan.raw)}))
            out.append({**choice, "delta": {}, "finish_reason": "length"})
        else:
            raise WerkError(ErrorCode.UNAVAILABLE, INCOMPLETE)
        return out


def _with_system(messages: JsonValue, text: str) -> list[JsonValue]:
    """``messages`` with ``text`` appended to the first message when it is a system/developer
    message of text (a string, or text parts: then as one more text part), else as a new first
    system message."""
    listed = list(messages) if isinstance(messages, list) else []
    first = listed[0] if listed else None
    if not isinstance(first, dict) or first.get("role") not in ("system", "developer"):
        return [{"role": "system", "content": text}, *listed]
    content = first.get("content")
    if isinstance(content, str):
        listed[0] = {**first, "content": f"{content}\n\n{text}" if content else text}
    elif isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        listed[0] = {**first, "content": [*content, {"type": "text", "text": text}]}
    else:
        return [{"role": "system", "content": text}, *listed]
    return listed
