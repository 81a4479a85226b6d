"""An Anthropic Messages request as the OpenAI chat body ``/v1/chat/completions`` takes.

:func:`chat_body` makes the body ``POST /v1/messages`` sends and :func:`count_request` the
:class:`~werk_host.protocol.ChatRequest` ``POST /v1/messages/count_tokens`` counts: both come
from :func:`_translated`, so a count renders exactly what the chat sends (its tools, system
messages and thinking switch included) and equals the answer's ``usage.input_tokens``.

The mapping (docs/compat.md, "Anthropic Messages"):

* ``system`` → a leading system message; a ``system`` entry inside ``messages`` → a system
  message at that place.
* ``user`` text and ``image`` (base64) blocks → OpenAI text and ``image_url`` (data URL) parts;
  ``tool_result`` blocks → ``role: "tool"`` messages with ``tool_call_id``, placed before the
  rest of that user turn (so they follow the assistant call they answer); their content is
  the result's text (a ``tool_reference`` block as the tool's name), prefixed ``Error: `` when
  ``is_error``.
* ``assistant`` text blocks → text parts and ``tool_use`` blocks → ``tool_calls`` (the ids kept,
  ``input`` as the arguments JSON); ``thinking``/``redacted_thinking`` blocks are dropped.
* ``tools`` → function tools (``input_schema`` as ``parameters``, its ``$schema`` member
  removed); ``tool_choice`` ``auto``/``any``/``tool``/``none`` → ``auto``/``required``/the
  named function/``none``; ``disable_parallel_tool_use`` → ``parallel_tool_calls: false``.
* ``thinking`` → the reasoning tier the caller chose from the instance's verified reasoning
  profile (:func:`thinking_tier`), sent as ``werk.reasoning.tier``.
* ``output_config.format`` (or ``output_format``) → ``response_format`` ``json_schema``.
"""

from __future__ import annotations

import json
from typing import Final

from pydantic import JsonValue

from werk_host.compat.anthropic_models import (
    CountTokensRequest,
    ImageBlock,
    InputMessage,
    MessagesRequest,
    TextBlock,
    ThinkingAdaptive,
    ThinkingDisabled,
    ThinkingEnabled,
    ToolResultBlock,
    ToolUseBlock,
)
from werk_host.protocol import ChatRequest, ReasoningProfile, ReasoningTierId
from werk_host.seam import JsonObject

#: What an error tool result's text starts with (the OpenAI tool message has no error flag).
ERROR_PREFIX: Final = "Error: "
#: The name the structured-output schema carries (OpenAI's ``json_schema`` needs one).
SCHEMA_NAME: Final = "output"


# -- thinking ----------------------------------------------------------------------------------


def thinking_tier(
    thinking: ThinkingEnabled | ThinkingAdaptive | ThinkingDisabled | None, profile: ReasoningProfile | None
) -> str | None:
    """The ``werk.reasoning.tier`` for ``thinking`` on an instance with ``profile`` (``None``:
    not known, e.g. a cold instance), or ``None`` to send none (the runtime's native default).

    * ``disabled``: ``none`` where the profile is verified, else nothing.
    * ``adaptive``: ``default``, the model's default tier (the runtime's native default where
      no reasoning control is verified).
    * ``enabled`` with ``budget_tokens`` N: on a verified profile the largest available tier whose
      budget is at most N, else (no thinking tier fits this request's output) ``default``; never
      a refusal, since the client cannot know the instance's tiers."""
    if thinking is None:
        return None
    verified = profile is not None and profile.supported
    if isinstance(thinking, ThinkingDisabled):
        return ReasoningTierId.NONE.value if verified else None
    if isinstance(thinking, ThinkingAdaptive) or profile is None or not verified:
        return "default"
    fitting = {
        tier.reasoning_tokens: tier.id.value
        for tier in profile.tiers
        if tier.available and tier.reasoning_tokens and tier.reasoning_tokens <= thinking.budget_tokens
    }
    return fitting[max(fitting)] if fitting else "default"


# -- messages ----------------------------------------------------------------------------------


def _text_parts(blocks: list[TextBlock]) -> list[JsonValue]:
    return [{"type": "text", "text": block.text} for block in blocks]


def _system(content: str | list[TextBlock]) -> JsonObject:
    return {"role": "system", "content": content if isinstance(content, str) else _text_parts(content)}


def _image(block: ImageBlock) -> JsonObject:
    source = block.source
    return {"type": "image_url", "image_url": {"url": f"data:{source.media_type};base64,{source.data}"}}


def _tool_message(block: ToolResultBlock) -> JsonObject:
    content = block.content
    if isinstance(content, str):
        text = content
    else:
        text = "\n".join(b.text if isinstance(b, TextBlock) else b.tool_name for b in content or ())
    if block.is_error:
        text = ERROR_PREFIX + text
    return {"role": "tool", "tool_call_id": block.tool_use_id, "content": text}


def _tool_call(block: ToolUseBlock) -> JsonObject:
    arguments = json.dumps(block.input, ensure_ascii=False, separators=(",", ":"))
    return {"id": block.id, "type": "function", "function": {"name": block.name, "arguments": arguments}}


def _user(message: InputMessage) -> list[JsonValue]:
    """A user turn: its tool results first (as tool messages), then the rest as one message."""
    if isinstance(message.content, str):
        return [{"role": "user", "content": message.content}]
    results: list[JsonValue] = [_tool_message(b) for b in message.content if isinstance(b, ToolResultBlock)]
    parts: list[JsonValue] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            parts.append({"type": "text", "text": block.text})
        elif isinstance(block, ImageBlock):
            parts.append(_image(block))
    return [*results, {"role": "user", "content": parts}] if parts else results


def _assistant(message: InputMessage) -> list[JsonValue]:
    """An assistant turn: its text as text parts and its tool calls; thinking is dropped (a turn
    left with neither is dropped too)."""
    if isinstance(message.content, str):
        return [{"role": "assistant", "content": message.content}]
    parts: list[JsonValue] = [
        {"type": "text", "text": block.text} for block in message.content if isinstance(block, TextBlock)
    ]
    calls: list[JsonValue] = [_tool_call(block) for block in message.content if isinstance(block, ToolUseBlock)]
    turn: JsonObject = {"role": "assistant"}
    if parts:
        turn["content"] = parts
    if calls:
        turn["tool_calls"] = calls
    return [turn] if parts or calls else []


def openai_messages(request: CountTokensRequest) -> list[JsonValue]:
    """The OpenAI messages of a conversation: a non-empty ``system`` first, then each turn."""
    messages: list[JsonValue] = []
    if request.system:
        messages.append(_system(request.system))
    for message in request.messages:
        if message.role == "system":
            content = message.content
            messages.append(
                _system(content if isinstance(content, str) else [b for b in content if isinstance(b, TextBlock)])
            )
        elif message.role == "user":
            messages.extend(_user(message))
        else:
            messages.extend(_assistant(message))
    return messages


# -- tools -------------------------------------------------------------------------------------


def openai_tools(request: CountTokensRequest) -> list[JsonValue]:
    """The function tools for ``request.tools`` (``$schema`` removed from each input schema)."""
    tools: list[JsonValue] = []
    for tool in request.tools or ():
        function: JsonObject = {"name": tool.name}
        if tool.description is not None:
            function["description"] = tool.description
        function["parameters"] = {k: v for k, v in tool.input_schema.items() if k != "$schema"}
        if tool.strict is not None:
            function["strict"] = tool.strict
        tools.append({"type": "function", "function": function})
    return tools


def _tool_fields(request: CountTokensRequest, body: JsonObject) -> None:
    """``tools``, ``tool_choice`` and ``parallel_tool_calls`` on ``body`` (none without tools:
    ``auto`` and ``none`` then mean nothing)."""
    tools = openai_tools(request)
    if not tools:
        return
    body["tools"] = tools
    choice = request.tool_choice
    if choice is None:
        return
    if choice.type == "tool":
        body["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    else:
        body["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
    if choice.disable_parallel_tool_use and choice.type != "none":
        body["parallel_tool_calls"] = False


# -- bodies ------------------------------------------------------------------------------------


def _translated(request: CountTokensRequest, tier: str | None) -> JsonObject:
    """What the chat and the count share: messages, tools, structured output, the thinking tier."""
    body: JsonObject = {"model": request.model, "messages": openai_messages(request)}
    _tool_fields(request, body)
    json_format = request.json_format()
    if json_format is not None:
        schema: JsonObject = {"name": SCHEMA_NAME, "schema": json_format.schema_}
        body["response_format"] = {"type": "json_schema", "json_schema": schema}
    if tier is not None:
        body["werk"] = {"reasoning": {"tier": tier}}
    return body


def count_request(request: CountTokensRequest, tier: str | None = None, max_tokens: int | None = None) -> ChatRequest:
    """The chat request whose input ``werk_count_tokens`` counts: exactly what :func:`chat_body`
    sends for the same conversation. ``max_tokens`` is the output a thinking tier is resolved
    for (count_tokens has none of its own; the caller passes the instance's ceiling)."""
    body = _translated(request, tier)
    if max_tokens is not None and tier is not None:
        body["max_tokens"] = max_tokens
    return ChatRequest.model_validate(body)


def chat_body(request: MessagesRequest, tier: str | None = None) -> JsonObject:
    """The OpenAI chat body for ``request`` (a stream asks for its usage at the end)."""
    body = _translated(request, tier)
    body["max_tokens"] = request.max_tokens
    if request.stop_sequences:
        body["stop"] = list(request.stop_sequences)
    for name, value in (("temperature", request.temperature), ("top_p", request.top_p), ("top_k", request.top_k)):
        if value is not None:
            body[name] = value
    if request.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body
