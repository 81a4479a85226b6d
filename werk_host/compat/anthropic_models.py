"""The Anthropic Messages request models (docs/compat.md, "Anthropic Messages").

``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` bodies are validated here before
anything is translated. Unknown fields are refused (400), as Anthropic's API does; the fields
Werk accepts are those :mod:`werk_host.compat.anthropic_request` translates, and those that
cannot change a local answer (``metadata``, ``service_tier``, ``cache_control``, ...), accepted
and ignored as docs/compat.md lists them. What would change the answer if it were ignored is
refused with a message that names the rule: a server tool (``web_search_...``, ``bash_...``),
a non-empty ``mcp_servers``, ``compaction``, an image by URL or file id, a document block.

Content blocks by role: ``user`` takes ``text``, ``image`` (base64) and ``tool_result``;
``assistant`` takes ``text``, ``tool_use``, ``thinking`` and ``redacted_thinking``; a ``system``
entry inside ``messages`` (a mid-conversation system message) takes text.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import Field, JsonValue, model_validator

from werk_host.protocol import StrictModel
from werk_host.protocol.base import JsonBool, JsonFloat, NonNegativeJsonInt, PositiveJsonInt
from werk_host.protocol.chat import FUNCTION_NAME_PATTERN

#: The content block types each role may send.
ROLE_BLOCKS: Final[dict[str, tuple[str, ...]]] = {
    "user": ("text", "image", "tool_result"),
    "assistant": ("text", "tool_use", "thinking", "redacted_thinking"),
    "system": ("text",),
}
#: The image media types Anthropic accepts.
IMAGE_TYPES: Final = ("image/jpeg", "image/png", "image/gif", "image/webp")
#: The id rule of Anthropic's ``tool_use`` blocks.
TOOL_ID_PATTERN: Final = r"^[a-zA-Z0-9_-]{1,256}$"

CacheControl = dict[str, JsonValue]


class TextBlock(StrictModel):
    """A text content block. ``cache_control`` is accepted and has no effect (prompt prefixes
    are reused automatically where the backend can); ``citations`` is accepted on replayed turns."""

    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None
    citations: list[dict[str, JsonValue]] | None = None


class Base64Source(StrictModel):
    type: Literal["base64"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: str = Field(min_length=1)


class ImageBlock(StrictModel):
    """An image, base64 only: Werk fetches no URLs and has no Files API."""

    type: Literal["image"]
    source: Base64Source
    cache_control: CacheControl | None = None

    @model_validator(mode="before")
    @classmethod
    def _base64_only(cls, data: Any) -> Any:
        source = data.get("source") if isinstance(data, dict) else None
        kind = source.get("type") if isinstance(source, dict) else None
        if kind == "url":
            raise ValueError("image source type 'url' is not supported: Werk fetches no URLs; send the image as base64")
        if kind == "file":
            raise ValueError("image source type 'file' is not supported: Werk has no Files API; send it as base64")
        return data


class ToolUseBlock(StrictModel):
    """A tool call of an earlier assistant turn."""

    type: Literal["tool_use"]
    id: str = Field(pattern=TOOL_ID_PATTERN)
    name: str = Field(min_length=1, max_length=256)
    input: dict[str, JsonValue]
    cache_control: CacheControl | None = None
    #: who called the tool (programmatic tool calling): accepted, not used
    caller: dict[str, JsonValue] | None = None


class ToolReferenceBlock(StrictModel):
    """A tool search result naming a deferred tool (``defer_loading``). Werk offers every tool
    from the start, so the reference only says which tool was found: its name is the text."""

    type: Literal["tool_reference"]
    tool_name: str = Field(min_length=1, max_length=256)
    cache_control: CacheControl | None = None


class ToolResultBlock(StrictModel):
    """The result of a tool call: text (a string, or text and tool reference blocks), optionally
    an error."""

    type: Literal["tool_result"]
    tool_use_id: str = Field(pattern=TOOL_ID_PATTERN)
    content: str | list[Annotated[TextBlock | ToolReferenceBlock, Field(discriminator="type")]] | None = None
    is_error: JsonBool | None = None
    cache_control: CacheControl | None = None

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, data: Any) -> Any:
        content = data.get("content") if isinstance(data, dict) else None
        if isinstance(content, list):
            for block in content:
                kind = block.get("type") if isinstance(block, dict) else None
                if kind not in ("text", "tool_reference"):
                    raise ValueError(
                        f"tool_result content: {_named(kind)} blocks are not supported, only text and tool_reference"
                    )
        return data


class ThinkingBlock(StrictModel):
    """A thinking block sent back in an assistant turn: accepted and not sent to the model."""

    type: Literal["thinking"]
    thinking: str
    signature: str | None = None
    cache_control: CacheControl | None = None


class RedactedThinkingBlock(StrictModel):
    """Accepted and not sent to the model (Werk never produces one)."""

    type: Literal["redacted_thinking"]
    data: str


ContentBlock = Annotated[
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
    Field(discriminator="type"),
]


def _named(kind: object) -> str:
    return repr(kind) if isinstance(kind, str) and len(kind) <= 64 else "untyped"


def _check_blocks(value: object, role: object, where: str) -> None:
    """Refuse a content block its role may not send, naming what the role takes."""
    allowed = ROLE_BLOCKS.get(role, ()) if isinstance(role, str) else ()
    if not isinstance(value, list) or not allowed:
        return
    for block in value:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind not in allowed:
            raise ValueError(f"{where}: {_named(kind)} blocks are not supported here ({', '.join(allowed)} are)")


class TurnOutputConfig(StrictModel):
    """``output_config`` on one message (Claude Code's per-turn control): ``effort`` and
    ``task_budget`` are accepted and have no effect, as on the request."""

    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    task_budget: dict[str, JsonValue] | None = None


class InputMessage(StrictModel):
    role: Literal["user", "assistant", "system"]
    content: str | Annotated[list[ContentBlock], Field(min_length=1)]
    output_config: TurnOutputConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _blocks_of_the_role(cls, data: Any) -> Any:
        if isinstance(data, dict):
            _check_blocks(data.get("content"), data.get("role"), f"a {data.get('role')} message")
        return data


class Tool(StrictModel):
    """A custom (client) tool: ``name``, ``description`` and a JSON Schema ``input_schema``.

    ``cache_control``, ``defer_loading``, ``eager_input_streaming``, ``input_examples`` and
    ``allowed_callers`` are accepted and have no effect; ``strict`` is passed on. The name rule
    is the one function tools have on ``/v1`` (Werk serves tools as OpenAI function tools)."""

    type: Literal["custom"] | None = None
    name: str = Field(pattern=FUNCTION_NAME_PATTERN)
    description: str | None = None
    input_schema: dict[str, JsonValue]
    cache_control: CacheControl | None = None
    strict: JsonBool | None = None
    defer_loading: JsonBool | None = None
    eager_input_streaming: JsonBool | None = None
    input_examples: list[dict[str, JsonValue]] | None = None
    allowed_callers: list[str] | None = None

    @model_validator(mode="before")
    @classmethod
    def _custom_only(cls, data: Any) -> Any:
        if isinstance(data, dict):
            kind = data.get("type")
            if kind is not None and kind != "custom":
                raise ValueError(
                    f"tool type {_named(kind)} is an Anthropic server tool; Werk serves custom tools only "
                    "(name, description, input_schema)"
                )
            schema = data.get("input_schema")
            if isinstance(schema, dict) and schema.get("type") != "object":
                raise ValueError('input_schema must be a JSON Schema with "type": "object"')
        return data


class ToolChoice(StrictModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = Field(None, min_length=1, max_length=256)
    disable_parallel_tool_use: JsonBool | None = None

    @model_validator(mode="after")
    def _name_for_tool(self) -> ToolChoice:
        if (self.type == "tool") != (self.name is not None):
            raise ValueError('tool_choice: "name" goes with type "tool" and only with it')
        return self


class ThinkingEnabled(StrictModel):
    type: Literal["enabled"]
    #: Anthropic's rule: at least 1,024
    budget_tokens: Annotated[PositiveJsonInt, Field(ge=1024)]
    display: Literal["summarized", "omitted", "updates"] | None = None
    block_binding: dict[str, JsonValue] | None = None


class ThinkingAdaptive(StrictModel):
    type: Literal["adaptive"]
    display: Literal["summarized", "omitted", "updates"] | None = None
    block_binding: dict[str, JsonValue] | None = None


class ThinkingDisabled(StrictModel):
    type: Literal["disabled"]


Thinking = Annotated[ThinkingEnabled | ThinkingAdaptive | ThinkingDisabled, Field(discriminator="type")]


class JsonOutputFormat(StrictModel):
    """Structured output: the answer's text follows ``schema`` (the backend's JSON-schema mode)."""

    type: Literal["json_schema"]
    schema_: dict[str, JsonValue] = Field(alias="schema")


class OutputConfig(StrictModel):
    """``effort`` and ``task_budget`` are accepted and have no effect; ``format`` is honoured."""

    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: JsonOutputFormat | None = None
    task_budget: dict[str, JsonValue] | None = None


class ContextManagement(StrictModel):
    """Accepted; no edit is applied (answers report ``applied_edits: []``)."""

    edits: list[dict[str, JsonValue]] | None = None


class Metadata(StrictModel):
    """Accepted and not used."""

    user_id: str | None = Field(None, max_length=256)


class CountTokensRequest(StrictModel):
    """``POST /v1/messages/count_tokens``: the conversation whose input is counted."""

    model: str = Field(min_length=1, max_length=256)
    messages: list[InputMessage] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    #: the older name of ``output_config.format``
    output_format: JsonOutputFormat | None = None
    context_management: ContextManagement | None = None
    #: only empty: Werk connects to no MCP servers (see :meth:`_what_werk_cannot_do`)
    mcp_servers: list[dict[str, JsonValue]] | None = None
    #: automatic prompt caching: accepted, no effect (see TextBlock)
    cache_control: CacheControl | None = None

    @model_validator(mode="before")
    @classmethod
    def _what_werk_cannot_do(cls, data: Any) -> Any:
        if isinstance(data, dict):
            _check_blocks(data.get("system"), "system", "system")
            if data.get("mcp_servers"):
                raise ValueError("mcp_servers: Werk connects to no MCP servers; send their tools as custom tools")
        return data

    @model_validator(mode="after")
    def _tool_choice_names_a_tool(self) -> CountTokensRequest:
        choice = self.tool_choice
        if choice is None or choice.type in ("auto", "none"):
            return self
        names = {tool.name for tool in self.tools or ()}
        if not names:
            raise ValueError(f'tool_choice: type "{choice.type}" needs tools')
        if choice.name is not None and choice.name not in names:
            raise ValueError("tool_choice.name: no tool of that name is in tools")
        return self

    def json_format(self) -> JsonOutputFormat | None:
        """The structured-output format asked for (``output_config.format`` or ``output_format``)."""
        if self.output_config is not None and self.output_config.format is not None:
            return self.output_config.format
        return self.output_format


class MessagesRequest(CountTokensRequest):
    """``POST /v1/messages``."""

    max_tokens: PositiveJsonInt
    stop_sequences: list[Annotated[str, Field(min_length=1)]] | None = None
    temperature: Annotated[JsonFloat, Field(ge=0, le=1)] | None = None
    top_p: Annotated[JsonFloat, Field(ge=0, le=1)] | None = None
    top_k: NonNegativeJsonInt | None = None
    stream: JsonBool | None = None
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    #: code-execution containers: accepted, no effect (Werk runs no server tools)
    container: str | dict[str, JsonValue] | None = None
    inference_geo: str | None = Field(None, max_length=64)
    speed: Literal["standard", "fast"] | None = None
    #: request diagnostics (prompt-cache miss reasons): accepted, none are reported
    diagnostics: dict[str, JsonValue] | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_compaction(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("compaction") is not None:
            raise ValueError("compaction: Werk does not summarize conversations")
        return data
