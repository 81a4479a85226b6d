"""OpenAI chat answers back into the Responses API's ``response`` object and event stream.

Requests are :mod:`werk_host.compat.responses`; see docs/compat.md, "OpenAI Responses".

**Object.** :func:`response_object` turns a ``chat.completion`` into a ``response``: the
backend's ``reasoning_content`` becomes a ``reasoning`` item (its text as ``reasoning_text``
content, no summary), the answer text a ``message`` item with one ``output_text`` part, each
tool call a ``function_call`` item (the chat call's ``id`` is its ``call_id``). A ``length``
finish is ``status: "incomplete"`` with ``incomplete_details.reason: "max_output_tokens"``
(``content_filter``: reason ``content_filter``); anything else is ``completed``. ``usage``
carries the backend's counts (``input_tokens_details.cached_tokens`` and
``output_tokens_details.reasoning_tokens`` where the backend reports them, else 0;
``cache_write_tokens`` 0: no backend reports it), or is null when the backend reports none.
The request's settings are echoed.

**Stream.** :func:`response_stream` turns the chat chunks into server-sent events, each
``event: <type>`` with ``data`` carrying the same ``type`` and a ``sequence_number`` from 0:
``response.created``, ``response.in_progress``; per output item ``response.output_item.added``,
its deltas (``response.reasoning_text.delta`` inside a ``reasoning_text`` part,
``response.output_text.delta`` inside an ``output_text`` part — each part opened by
``response.content_part.added`` — or ``response.function_call_arguments.delta``), their
``.done`` events and ``response.output_item.done``; finally ``response.completed`` (or
``response.incomplete``) with the whole response and its usage. A text or reasoning item is
done when another item begins; call items stay open until the answer ends. A backend failure
inside the stream (an error event, unreadable data, a broken connection, an end without a
finish reason) ends it with ``response.failed`` carrying a fixed message, never backend text.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Final

from pydantic import JsonValue

from werk_host.compat.responses import ResponsesRequest
from werk_host.compat.upstream import STREAM_CUT, STREAM_FAILED, as_count, as_object, first_choice, text_of, unreadable
from werk_host.seam import JsonObject
from werk_host.service.loading import LoadFailed, is_notice

log = logging.getLogger(__name__)

#: Chat ``finish_reason`` → ``incomplete_details.reason`` (other reasons complete the response).
INCOMPLETE: Final[dict[str, str]] = {"length": "max_output_tokens", "content_filter": "content_filter"}


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def usage_document(doc: JsonObject) -> JsonObject | None:
    """The Responses ``usage`` of a chat document's ``usage``, or ``None`` without one."""
    usage = as_object(doc.get("usage"))
    if usage is None:
        return None
    prompt, completion = as_count(usage.get("prompt_tokens")), as_count(usage.get("completion_tokens"))
    if prompt is None or completion is None:
        return None
    cached = as_count((as_object(usage.get("prompt_tokens_details")) or {}).get("cached_tokens"))
    reasoning = as_count((as_object(usage.get("completion_tokens_details")) or {}).get("reasoning_tokens"))
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached or 0, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning or 0},
        "total_tokens": prompt + completion,
    }


def _echo(request: ResponsesRequest) -> JsonObject:
    """The request settings a ``response`` repeats (OpenAI's defaults where none was sent)."""
    text: JsonObject = {"format": {"type": "text"}}
    if request.text is not None:
        text = request.text.model_dump(mode="json", by_alias=True, exclude_none=True)
        text.setdefault("format", {"type": "text"})
    reasoning = request.reasoning.model_dump(mode="json", exclude_none=True) if request.reasoning else {}
    tools: list[JsonValue] = [
        tool if isinstance(tool, dict) else tool.model_dump(mode="json", exclude_none=True)
        for tool in request.tools or ()
    ]
    choice = request.tool_choice
    return {
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "max_tool_calls": request.max_tool_calls,
        "metadata": dict(request.metadata or {}),
        "parallel_tool_calls": request.parallel_tool_calls if request.parallel_tool_calls is not None else True,
        "previous_response_id": None,
        "prompt_cache_key": request.prompt_cache_key,
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "safety_identifier": request.safety_identifier,
        "service_tier": request.service_tier,
        "store": False,
        "temperature": request.temperature,
        "text": text,
        "tool_choice": choice.model_dump(mode="json")
        if choice is not None and not isinstance(choice, str)
        else choice or "auto",
        "tools": tools,
        "top_logprobs": request.top_logprobs,
        "top_p": request.top_p,
        "truncation": request.truncation or "disabled",
        "user": request.user,
    }


def envelope(
    request: ResponsesRequest,
    response_id: str,
    created: int,
    status: str,
    output: list[JsonValue],
    usage: JsonObject | None,
    reason: str | None = None,
) -> JsonObject:
    """A ``response`` object."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": reason} if reason is not None else None,
        "model": request.model,
        "output": output,
        "usage": usage,
        **_echo(request),
    }


def _status(finish: JsonValue) -> tuple[str, str | None]:
    """``(response status, incomplete reason)`` of a chat finish reason."""
    reason = INCOMPLETE.get(finish) if isinstance(finish, str) else None
    return ("incomplete", reason) if reason is not None else ("completed", None)


def reasoning_item(item_id: str, text: str, status: str) -> JsonObject:
    return {
        "type": "reasoning",
        "id": item_id,
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "status": status,
    }


def output_text(text: str) -> JsonObject:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str | None, status: str) -> JsonObject:
    content: list[JsonValue] = [output_text(text)] if text is not None else []
    return {"type": "message", "id": item_id, "role": "assistant", "status": status, "content": content}


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> JsonObject:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def response_object(doc: JsonObject, request: ResponsesRequest) -> JsonObject:
    """The ``response`` for an OpenAI ``chat.completion`` document."""
    choice = first_choice(doc)
    if choice is None:
        raise unreadable()
    message = as_object(choice.get("message")) or {}
    status, reason = _status(choice.get("finish_reason"))
    item_status = "incomplete" if status == "incomplete" else "completed"
    output: list[JsonValue] = []
    reasoning = text_of(message.get("reasoning_content"))
    if reasoning:
        output.append(reasoning_item(new_id("rs"), reasoning, item_status))
    text = text_of(message.get("content"))
    if text:
        output.append(message_item(new_id("msg"), text, item_status))
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        call = as_object(call) or {}
        function = as_object(call.get("function")) or {}
        call_id = text_of(call.get("id")) or new_id("call")
        name, arguments = text_of(function.get("name")), text_of(function.get("arguments"))
        output.append(call_item(new_id("fc"), call_id, name, arguments, item_status))
    return envelope(request, new_id("resp"), int(time.time()), status, output, usage_document(doc), reason)


# -- stream ----------------------------------------------------------------------------------------


def sse(data: JsonObject) -> bytes:
    """One server-sent event, named by its ``type``."""
    return f"event: {data['type']}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


@dataclass
class _Item:
    """An output item being streamed: ``kind`` ``reasoning``, ``message`` or ``function_call``."""

    kind: str
    index: int
    id: str
    text: str = ""
    call_id: str = ""
    name: str = ""

    def document(self, status: str) -> JsonObject:
        if self.kind == "reasoning":
            return reasoning_item(self.id, self.text, status)
        if self.kind == "message":
            return message_item(self.id, self.text, status)
        return call_item(self.id, self.call_id, self.name, self.text, status)

    def opened(self) -> JsonObject:
        """The item as ``response.output_item.added`` shows it."""
        if self.kind == "reasoning":
            return {"type": "reasoning", "id": self.id, "summary": [], "content": [], "status": "in_progress"}
        if self.kind == "message":
            return message_item(self.id, None, "in_progress")
        return call_item(self.id, self.call_id, self.name, "", "in_progress")


@dataclass
class _Stream:
    """The state of one translated stream: its events in order, numbered."""

    request: ResponsesRequest
    id: str = field(default_factory=lambda: new_id("resp"))
    created: int = field(default_factory=lambda: int(time.time()))
    sequence: int = 0
    items: list[_Item] = field(default_factory=list)
    #: the open text or reasoning item (at most one)
    current: _Item | None = None
    #: open call items by the chat call's index
    calls: dict[int, _Item] = field(default_factory=dict)
    #: finished items by output index
    done: dict[int, JsonObject] = field(default_factory=dict)

    def output(self) -> list[JsonValue]:
        return [self.done[index] for index in sorted(self.done)]

    def event(self, kind: str, **data: JsonValue) -> bytes:
        payload: JsonObject = {"type": kind, "sequence_number": self.sequence, **data}
        self.sequence += 1
        return sse(payload)

    def lifecycle(self, kind: str, status: str, usage: JsonObject | None = None, reason: str | None = None) -> bytes:
        output = self.output() if status != "in_progress" else []
        doc = envelope(self.request, self.id, self.created, status, output, usage, reason)
        return self.event(kind, response=doc)

    def _open(self, kind: str, prefix: str, call_id: str = "", name: str = "") -> tuple[_Item, list[bytes]]:
        item = _Item(kind, len(self.items), new_id(prefix), call_id=call_id, name=name)
        self.items.append(item)
        return item, [self.event("response.output_item.added", output_index=item.index, item=item.opened())]

    def text(self, kind: str, delta: str) -> Iterator[bytes]:
        """A delta of reasoning (``kind`` ``reasoning``) or answer text (``message``)."""
        item = self.current
        if item is None or item.kind != kind:
            yield from self.close_current("completed")
            item, events = self._open(kind, "rs" if kind == "reasoning" else "msg")
            yield from events
            self.current = item
            part: JsonObject = {"type": "reasoning_text", "text": ""} if kind == "reasoning" else output_text("")
            yield self.event(
                "response.content_part.added", item_id=item.id, output_index=item.index, content_index=0, part=part
            )
        item.text += delta
        where: JsonObject = {"item_id": item.id, "output_index": item.index, "content_index": 0, "delta": delta}
        if kind == "reasoning":
            yield self.event("response.reasoning_text.delta", **where)
        else:
            yield self.event("response.output_text.delta", **where, logprobs=[])

    def call(self, index: int, call_id: str, name: str, arguments: str) -> Iterator[bytes]:
        """A piece of the tool call with chat index ``index``."""
        item = self.calls.get(index)
        if item is None:
            yield from self.close_current("completed")
            item, events = self._open("function_call", "fc", call_id or new_id("call"), name)
            self.calls[index] = item
            yield from events
        elif name and not item.name:
            item.name = name
        if arguments:
            item.text += arguments
            yield self.event(
                "response.function_call_arguments.delta", item_id=item.id, output_index=item.index, delta=arguments
            )

    def close_current(self, status: str) -> Iterator[bytes]:
        item, self.current = self.current, None
        if item is None:
            return
        where: JsonObject = {"item_id": item.id, "output_index": item.index, "content_index": 0}
        part: JsonObject
        if item.kind == "reasoning":
            yield self.event("response.reasoning_text.done", **where, text=item.text)
            part = {"type": "reasoning_text", "text": item.text}
        else:
            yield self.event("response.output_text.done", **where, text=item.text, logprobs=[])
            part = output_text(item.text)
        yield self.event("response.content_part.done", **where, part=part)
        yield from self._item_done(item, status)

    def _item_done(self, item: _Item, status: str) -> Iterator[bytes]:
        document = item.document(status)
        self.done[item.index] = document
        yield self.event("response.output_item.done", output_index=item.index, item=document)

    def close_all(self, status: str) -> Iterator[bytes]:
        yield from self.close_current(status)
        for item in sorted(self.calls.values(), key=lambda i: i.index):
            yield self.event(
                "response.function_call_arguments.done", item_id=item.id, output_index=item.index, arguments=item.text
            )
            yield from self._item_done(item, status)
        self.calls.clear()

    def failed(self, message: str) -> bytes:
        doc = envelope(self.request, self.id, self.created, "failed", self.output(), None)
        doc["error"] = {"code": "server_error", "message": message}
        return self.event("response.failed", response=doc)


def _deltas(state: _Stream, choice: JsonObject) -> Iterator[bytes]:
    delta = as_object(choice.get("delta")) or {}
    reasoning = text_of(delta.get("reasoning_content"))
    if reasoning:
        yield from state.text("reasoning", reasoning)
    text = text_of(delta.get("content"))
    if text:
        yield from state.text("message", text)
    calls = delta.get("tool_calls")
    for position, call in enumerate(calls if isinstance(calls, list) else ()):
        call = as_object(call) or {}
        index = as_count(call.get("index"))
        function = as_object(call.get("function")) or {}
        yield from state.call(
            index if index is not None else position,
            text_of(call.get("id")),
            text_of(function.get("name")),
            text_of(function.get("arguments")),
        )


def response_stream(events: Iterable[JsonObject], request: ResponsesRequest) -> Iterator[bytes]:
    """The Responses event stream for the OpenAI chunks ``events`` (see the module docstring)."""
    state = _Stream(request)
    yield state.lifecycle("response.created", "in_progress")
    yield state.lifecycle("response.in_progress", "in_progress")
    finish: JsonValue = None
    usage: JsonObject | None = None
    try:
        for event in events:
            if "error" in event:
                log.warning("the backend reported an error inside a stream")
                yield state.failed(STREAM_FAILED)
                return
            if is_notice(event):  # no place for it in this grammar (werk_host/service/loading.py)
                continue
            usage = usage_document(event) or usage
            choice = first_choice(event)
            if choice is None:
                continue
            yield from _deltas(state, choice)
            if isinstance(choice.get("finish_reason"), str):
                finish = choice["finish_reason"]
    except LoadFailed as err:  # the host's own public reason (werk_host/service/loading.py)
        yield state.failed(err.public_message())
        return
    except Exception as err:  # one line, no traceback (docs/operations.md, "Backend failures")
        log.warning("a backend stream failed while it was translated: %s", type(err).__name__)
        yield state.failed(STREAM_FAILED)
        return
    if finish is None:
        yield state.failed(STREAM_CUT)
        return
    status, reason = _status(finish)
    yield from state.close_all("incomplete" if status == "incomplete" else "completed")
    kind = "response.incomplete" if status == "incomplete" else "response.completed"
    yield state.lifecycle(kind, status, usage, reason)
