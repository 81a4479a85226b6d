"""The OpenAI Responses API (``POST /v1/responses``) as a translation of the ``/v1`` chat path.

Stateless only (docs/compat.md, "OpenAI Responses"): the whole conversation comes in ``input``
on every request, as Codex CLI sends it (``store: false``). A request is validated by
:class:`ResponsesRequest` and becomes the OpenAI chat body of :func:`chat_body`:

* ``instructions`` and the ``system``/``developer`` messages that open ``input`` become one
  leading system message (their texts and text parts joined by a blank line: templates take one system
  message at the start); a ``system``/``developer`` message later on stays a system message in
  place. ``message`` items become chat messages, ``input_text``/``output_text``/``refusal``
  parts text parts, ``input_image`` an ``image_url`` part (the backend refuses it without a
  projector). ``function_call`` items become the ``tool_calls`` of an assistant message (the
  assistant message just before them, when there is one), ``function_call_output`` items
  ``role: "tool"`` messages. ``reasoning`` items are accepted and left out of the prompt.
* ``function`` tools become chat function tools; the tool types of :data:`IGNORED_TOOLS` are
  accepted and left out (the model cannot call them); any other tool type is refused.
* ``tool_choice``, ``parallel_tool_calls``, ``max_output_tokens`` (``max_tokens``),
  ``temperature``, ``top_p`` and ``text.format`` (``response_format``) carry over; fields the
  backend cannot act on are accepted and have no effect; stored responses
  (``store: true``, ``previous_response_id``, ``conversation``, ``prompt``, ``background``)
  are refused.

The answer's translation back is :mod:`werk_host.compat.responses_answer`.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import Discriminator, Field, JsonValue, Tag, model_validator

from werk_host.errors import ErrorCode, WerkError
from werk_host.protocol import StrictModel
from werk_host.protocol.base import JsonBool, JsonFloat, NonNegativeJsonInt, PositiveJsonInt
from werk_host.protocol.chat import FUNCTION_NAME_PATTERN
from werk_host.seam import JsonObject

#: Tool types accepted and left out of the chat request (docs/compat.md): tools a hosted service
#: or the client's own harness would run, which the model here cannot call. Agents send them by
#: default (Codex: ``web_search``, ``namespace``), so refusing them would refuse the agent.
IGNORED_TOOLS: Final = frozenset(
    {
        "web_search",
        "web_search_preview",
        "web_search_2025_08_26",
        "web_search_preview_2025_03_11",
        "namespace",
        "tool_search",
        "local_shell",
        "shell",
        "apply_patch",
        "custom",
        "image_generation",
    }
)
#: Input item types this stateless translation takes (others are refused, naming the type).
ITEM_TYPES: Final = ("message", "function_call", "function_call_output", "reasoning")
#: ``reasoning.effort`` → Werk reasoning tier (werk_host/protocol/chat.py, ``ReasoningTierId``).
EFFORT_TIERS: Final[dict[str, str]] = {
    "none": "none",
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "max",
}

#: The largest ``max_output_tokens`` taken (a 32-bit count: far above any context served; the
#: admission then lowers it to what the instance allows, docs/compat.md, "Output budget").
MAX_OUTPUT_TOKENS: Final = 2**31 - 1

Name = Annotated[str, Field(pattern=FUNCTION_NAME_PATTERN)]
Unit = Annotated[JsonFloat, Field(ge=0, le=1)]


# -- content and items ---------------------------------------------------------------------------


class TextPart(StrictModel):
    """``input_text`` (any role), ``output_text`` (a replayed answer, with its annotations and
    logprobs, which are not sent again) or ``refusal`` (its text is the refusal)."""

    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[JsonValue] | None = None
    logprobs: list[JsonValue] | None = None


class RefusalPart(StrictModel):
    type: Literal["refusal"]
    refusal: str


class ImagePart(StrictModel):
    """``input_image`` by URL or data URL; uploaded files (``file_id``) are not available here."""

    type: Literal["input_image"]
    image_url: str = Field(min_length=1)
    detail: Literal["low", "high", "auto", "original"] | None = None


Part = Annotated[TextPart | RefusalPart | ImagePart, Field(discriminator="type")]
Content = str | Annotated[list[Part], Field(min_length=1)]


def _part_types(value: Any, where: str) -> None:
    """Refuse a content part type this route cannot take with a message naming it."""
    if not isinstance(value, list):
        return
    for part in value:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "input_image" and isinstance(part, dict) and part.get("image_url") is None:
            raise ValueError(f"{where}: input_image needs image_url (uploaded files are not available)")
        if isinstance(kind, str) and kind not in ("input_text", "output_text", "refusal", "input_image"):
            raise ValueError(f"{where}: content parts of type {kind!r} are not supported")


class MessageItem(StrictModel):
    """A ``message`` input item (``type`` may be left out, as the SDKs' easy input message does)."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Content
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None
    #: a replayed assistant message's phase label (``commentary``/``final_answer``): not sent again
    phase: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _parts(cls, data: Any) -> Any:
        if isinstance(data, dict):
            _part_types(data.get("content"), "content")
        return data


class FunctionCallItem(StrictModel):
    """A call the model made earlier, replayed. ``namespace`` is accepted and not sent."""

    type: Literal["function_call"]
    call_id: str = Field(min_length=1, max_length=256)
    name: Name
    arguments: str
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None
    namespace: str | None = None


OutputPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class FunctionCallOutputItem(StrictModel):
    """The client's result of a call: a string, or text and image parts."""

    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1, max_length=256)
    output: str | list[OutputPart]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _parts(cls, data: Any) -> Any:
        if isinstance(data, dict):
            _part_types(data.get("output"), "output")
        return data


class ReasoningItem(StrictModel):
    """A reasoning item passed back: accepted, not sent to the model again."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[JsonValue] = Field(default_factory=list)
    content: list[JsonValue] | None = None
    encrypted_content: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


Item = Annotated[MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem, Field(discriminator="type")]


def _item_types(value: Any) -> Any:
    """Give a typeless message its type; refuse item types this route cannot take, by name,
    and a ``function_call_output`` whose ``call_id`` no earlier ``function_call`` has (an orphan
    result: the model would see an answer to a call it never made)."""
    if not isinstance(value, list):
        return value
    items = []
    calls: set[object] = set()
    for index, item in enumerate(value):
        if isinstance(item, dict) and "type" not in item and "role" in item:
            item = {**item, "type": "message"}
        kind = item.get("type") if isinstance(item, dict) else None
        if isinstance(kind, str) and kind not in ITEM_TYPES:
            detail = " (stored items are not available)" if kind == "item_reference" else ""
            raise ValueError(f"input[{index}]: items of type {kind!r} are not supported{detail}")
        call_id = item.get("call_id") if isinstance(item, dict) else None
        if kind == "function_call" and isinstance(call_id, str):
            calls.add(call_id)
        elif kind == "function_call_output" and isinstance(call_id, str) and call_id not in calls:
            raise ValueError(f"input[{index}]: function_call_output answers no earlier function_call with its call_id")
        items.append(item)
    return items


# -- tools -----------------------------------------------------------------------------------------


class FunctionTool(StrictModel):
    """A Responses function tool (flat: ``name`` beside ``type``)."""

    type: Literal["function"]
    name: Name
    description: str | None = None
    parameters: dict[str, JsonValue] | None = None
    strict: JsonBool | None = None
    #: deferred loading (tool search) is not available: the tool is offered at once
    defer_loading: JsonBool | None = None


class NamedFunction(StrictModel):
    type: Literal["function"]
    name: Name


class AllowedTools(StrictModel):
    """``allowed_tools``: only the named function tools are offered, with ``mode``."""

    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: list[dict[str, JsonValue]] = Field(min_length=1)


ToolChoice = Literal["none", "auto", "required"] | NamedFunction | AllowedTools


def _tool_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return "function" if kind == "function" else "other"


#: A function tool (validated) or a tool of an ignored type (kept as sent, for the answer's echo).
Tool = Annotated[
    Annotated[FunctionTool, Tag("function")] | Annotated[dict[str, JsonValue], Tag("other")],
    Discriminator(_tool_kind),
]


def _tool_types(value: Any) -> Any:
    if not isinstance(value, list):
        return value
    for index, tool in enumerate(value):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if not isinstance(kind, str):  # nothing to keep or leave out by: never dropped unseen
            raise ValueError(f"tools[{index}]: a tool is an object with a string type")
        if kind != "function" and kind not in IGNORED_TOOLS:
            raise ValueError(f"tools[{index}]: tools of type {kind!r} are not supported (only function tools)")
    return value


def _tool_choice_type(value: Any) -> Any:
    kind = value.get("type") if isinstance(value, dict) else None
    if isinstance(kind, str) and kind not in ("function", "allowed_tools"):
        raise ValueError(f"tool_choice: forcing a tool of type {kind!r} is not supported (only function tools)")
    return value


# -- the request -----------------------------------------------------------------------------------


class Reasoning(StrictModel):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class TextFormat(StrictModel):
    """``text.format``: ``text``, ``json_object`` or ``json_schema`` (``name`` and ``schema``)."""

    type: Literal["text", "json_object", "json_schema"]
    name: Annotated[str, Field(pattern=FUNCTION_NAME_PATTERN)] | None = None
    schema_: dict[str, JsonValue] | None = Field(None, alias="schema")
    strict: JsonBool | None = None
    description: str | None = None

    @model_validator(mode="after")
    def _schema(self) -> TextFormat:
        if self.type == "json_schema" and (self.name is None or self.schema_ is None):
            raise ValueError("a json_schema format needs name and schema")
        return self


class Text(StrictModel):
    format: TextFormat | None = None
    #: accepted, no effect (the model's length is what it is)
    verbosity: Literal["low", "medium", "high"] | None = None


def _absent(data: dict[str, Any], name: str, why: str) -> None:
    value = data.get(name)
    if value is not None and value is not False:
        raise ValueError(f"{name} is not supported: {why}")


class ResponsesRequest(StrictModel):
    """``POST /v1/responses`` (docs/compat.md, "OpenAI Responses"). Unknown fields are 400, as
    OpenAI's API answers them."""

    model: str = Field(min_length=1, max_length=256)
    input: str | Annotated[list[Item], Field(max_length=4096)] | None = None
    instructions: str | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: JsonBool | None = None
    max_output_tokens: Annotated[PositiveJsonInt, Field(le=MAX_OUTPUT_TOKENS)] | None = None
    temperature: Annotated[JsonFloat, Field(ge=0, le=2)] | None = None
    top_p: Unit | None = None
    stream: JsonBool | None = None
    reasoning: Reasoning | None = None
    text: Text | None = None
    store: JsonBool | None = None
    # refused when set (stored state is not kept): checked in _stateless
    previous_response_id: str | None = None
    conversation: JsonValue = None
    prompt: JsonValue = None
    background: JsonBool | None = None
    # accepted, no effect
    include: list[Annotated[str, Field(max_length=128)]] | None = None
    metadata: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] | None = None
    client_metadata: dict[str, JsonValue] | None = None
    prompt_cache_key: str | None = Field(None, max_length=1024)
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    safety_identifier: str | None = Field(None, max_length=256)
    user: str | None = Field(None, max_length=256)
    service_tier: Literal["auto", "default", "flex", "scale", "priority", "fast"] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    stream_options: dict[str, JsonValue] | None = None
    max_tool_calls: NonNegativeJsonInt | None = None
    top_logprobs: NonNegativeJsonInt | None = None
    access_programs: dict[str, JsonValue] | None = None

    @model_validator(mode="before")
    @classmethod
    def _stateless(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if data.get("store") is True:
            raise ValueError("store: true is not supported: responses are not stored (send store: false)")
        for name in ("previous_response_id", "conversation", "prompt", "background"):
            _absent(data, name, "responses are not stored; send the whole conversation in input")
        if data.get("top_logprobs") not in (None, 0):
            raise ValueError("top_logprobs is not supported: log probabilities are not returned")
        if data.get("tools") is not None:
            data = {**data, "tools": _tool_types(data["tools"])}
        if data.get("tool_choice") is not None:
            _tool_choice_type(data["tool_choice"])
        if data.get("input") is not None:
            data = {**data, "input": _item_types(data["input"])}
        return data

    def function_tools(self) -> list[FunctionTool]:
        return [tool for tool in self.tools or () if isinstance(tool, FunctionTool)]


# -- request translation -------------------------------------------------------------------------


def _parts(content: list[TextPart | RefusalPart | ImagePart]) -> list[JsonValue]:
    parts: list[JsonValue] = []
    for part in content:
        if isinstance(part, ImagePart):
            image: JsonObject = {"url": part.image_url}
            if part.detail in ("low", "high", "auto"):
                image["detail"] = part.detail
            parts.append({"type": "image_url", "image_url": image})
        else:
            parts.append({"type": "text", "text": part.refusal if isinstance(part, RefusalPart) else part.text})
    return parts


def _content(content: Content) -> JsonValue:
    return content if isinstance(content, str) else _parts(content)


def _invalid(message: str) -> WerkError:
    return WerkError(ErrorCode.INVALID_REQUEST, message)


def _text(content: Content, where: str) -> str:
    """The text of a system message's content, its parts joined by a blank line (images cannot be
    instructions)."""
    if isinstance(content, str):
        return content
    if any(isinstance(part, ImagePart) for part in content):
        raise _invalid(f"{where}: a system or developer message cannot carry images")
    return "\n\n".join(
        p.refusal if isinstance(p, RefusalPart) else p.text for p in content if not isinstance(p, ImagePart)
    )


def _output(output: str | list[TextPart | ImagePart]) -> JsonValue:
    """A call's result as tool message content: text, or parts when it carries images."""
    if isinstance(output, str):
        return output
    if any(isinstance(part, ImagePart) for part in output):
        return _parts(list(output))
    return "".join(part.text for part in output if isinstance(part, TextPart))


def openai_messages(request: ResponsesRequest) -> list[JsonObject]:
    """The chat messages of ``request`` (see the module docstring); ``invalid_request`` when
    there are none or a system message carries an image."""
    items: list[Any] = [MessageItem(role="user", content=request.input)] if isinstance(request.input, str) else []
    if isinstance(request.input, list):
        items = list(request.input)
    system = [request.instructions] if request.instructions else []
    start = 0
    while start < len(items) and isinstance(items[start], MessageItem) and items[start].role in ("system", "developer"):
        system.append(_text(items[start].content, f"input[{start}]"))
        start += 1
    messages: list[JsonObject] = []
    if any(system):
        messages.append({"role": "system", "content": "\n\n".join(s for s in system if s)})
    for index, item in enumerate(items[start:], start):
        if isinstance(item, MessageItem):
            if item.role in ("system", "developer"):
                messages.append({"role": "system", "content": _text(item.content, f"input[{index}]")})
            else:
                messages.append({"role": item.role, "content": _content(item.content)})
        elif isinstance(item, FunctionCallItem):
            call: JsonObject = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                calls = last.setdefault("tool_calls", [])
                assert isinstance(calls, list)
                calls.append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": _output(item.output)})
        # ReasoningItem: accepted, not sent again (docs/compat.md)
    if not messages:
        raise _invalid("input: the request has no messages to answer")
    return messages


def _tools(request: ResponsesRequest) -> tuple[list[JsonValue], JsonValue]:
    """``(chat tools, chat tool_choice or None)``."""
    tools = request.function_tools()
    choice = request.tool_choice
    if isinstance(choice, AllowedTools):
        allowed = {t.get("name") for t in choice.tools if t.get("type") == "function"}
        tools = [tool for tool in tools if tool.name in allowed]
    chat_tools: list[JsonValue] = []
    for tool in tools:
        function: JsonObject = {"name": tool.name}
        for name, value in (("description", tool.description), ("parameters", tool.parameters)):
            if value is not None:
                function[name] = value
        if tool.strict is not None:
            function["strict"] = tool.strict
        chat_tools.append({"type": "function", "function": function})
    names = {tool.name for tool in tools}
    chat_choice: JsonValue = None
    if isinstance(choice, NamedFunction):
        if choice.name not in names:
            raise _invalid(f"tool_choice: no function tool is named {choice.name!r}")
        chat_choice = {"type": "function", "function": {"name": choice.name}}
    elif isinstance(choice, AllowedTools) or choice == "required":
        mode = choice.mode if isinstance(choice, AllowedTools) else "required"
        if not tools:
            raise _invalid(f"tool_choice: {mode!r} needs at least one function tool")
        chat_choice = mode
    elif choice is not None and tools:
        chat_choice = choice
    return chat_tools, chat_choice


def _response_format(text: Text | None) -> JsonObject | None:
    form = text.format if text is not None else None
    if form is None or form.type == "text":
        return None
    if form.type == "json_object":
        return {"type": "json_object"}
    schema: JsonObject = {"name": form.name, "schema": form.schema_}
    if form.strict is not None:
        schema["strict"] = form.strict
    if form.description is not None:
        schema["description"] = form.description
    return {"type": "json_schema", "json_schema": schema}


def chat_body(request: ResponsesRequest, reasoning_tier: str | None = None) -> JsonObject:
    """The OpenAI chat body for ``request`` (a stream asks for its usage at the end).
    ``reasoning_tier`` is the Werk tier ``reasoning.effort`` maps to where the serving instance
    has verified reasoning control (werk_host/http/responses.py decides); ``None``: none."""
    body: JsonObject = {"model": request.model, "messages": list(openai_messages(request))}
    tools, choice = _tools(request)
    if tools:
        body["tools"] = tools
        if choice is not None:
            body["tool_choice"] = choice
        if request.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = request.parallel_tool_calls
    if request.max_output_tokens is not None:
        body["max_tokens"] = request.max_output_tokens
    for name, value in (("temperature", request.temperature), ("top_p", request.top_p)):
        if value is not None:
            body[name] = value
    response_format = _response_format(request.text)
    if response_format is not None:
        body["response_format"] = response_format
    if reasoning_tier is not None:
        body["werk"] = {"reasoning": {"tier": reasoning_tier}}
    if request.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def effort_tier(request: ResponsesRequest) -> str | None:
    """The Werk tier ``reasoning.effort`` names, if any (:data:`EFFORT_TIERS`)."""
    effort = request.reasoning.effort if request.reasoning is not None else None
    return EFFORT_TIERS[effort] if effort is not None else None
