"""Chat-planning DTOs: token counting, admission, limits, reasoning and deployments.

Also the request shapes ``/v1`` admission validates before a backend is called: tools, tool
choices and assistant tool calls are checked against OpenAI's function-tool shapes (anything
else, an unknown tool type included, is ``invalid_request``) but kept as the client sent them,
so that a count renders the very JSON the chat sends (docs/compat.md, "OpenAI");
:class:`CompletionRequest` is ``/v1/completions``'s request."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    PlainValidator,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from werk_host.protocol.base import (
    DEFAULT_OUTPUT_TOKENS,
    MAX_STOP_STRINGS,
    DataModel,
    JsonBool,
    JsonFloat,
    NonNegativeJsonInt,
    PositiveJsonInt,
    StrictModel,
    present_schema,
)
from werk_host.protocol.pd import Seed
from werk_host.protocol.schemas import SchemaTooLarge, check_schemas


class ReasoningTierId(StrEnum):
    NONE = "none"
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    MAX = "max"
    ULTRA = "ultra"


class ReasoningSelection(StrictModel):
    """``"default"`` or a tier id. Any other string is refused as ``invalid_reasoning_tier`` by
    the resolver (not here), so that OpenAI clients get that code."""

    tier: str = Field(
        min_length=1, max_length=32, json_schema_extra={"enum": ["default", *(t.value for t in ReasoningTierId)]}
    )
    #: Set by the host only, when it resolved ``tier`` (werk_host/service/reasoning.py): what
    #: every chat hook receives. A client that sends it is refused; not in the schema.
    resolved_budget_tokens: SkipJsonSchema[int | None] = Field(None, ge=0, le=1 << 24)


#: The name of a backend member ``werk.<name>`` (docs/plugin-hooks.md, ``werk_request_options``).
BACKEND_MEMBER_PATTERN = r"^[a-z][a-z0-9_]{0,31}$"
_BACKEND_MEMBER = re.compile(BACKEND_MEMBER_PATTERN)


class WerkChatExtension(BaseModel):
    """``werk`` on a chat request: the host's own member ``reasoning`` and, beside it, backend
    members ``werk.<name>``, each a JSON object of one backend's request options (the oMLX
    backend's ``werk.omlx``: docs/omlx.md, "Chat options"). The host checks only their shape
    here; the plugin that owns the request's adapter validates their content
    (``werk_request_options``), and a member it does not own is ``invalid_request``."""

    model_config = ConfigDict(
        extra="allow", frozen=True, json_schema_extra={"propertyNames": {"pattern": BACKEND_MEMBER_PATTERN}}
    )
    __pydantic_extra__: dict[str, dict[str, JsonValue]] = Field(init=False)
    reasoning: ReasoningSelection | None = None

    @model_validator(mode="after")
    def _backend_member_names(self) -> Self:
        for name in self.model_extra or {}:
            if not _BACKEND_MEMBER.match(name):
                raise PydanticCustomError(
                    "werk_member", "unknown member: backend members are named like werk.omlx (lowercase)"
                )
        return self

    def backend_options(self) -> dict[str, dict[str, JsonValue]]:
        """The backend members, by name (``{"omlx": {...}}``); never ``reasoning``."""
        return dict(self.model_extra or {})


class ChatRole(StrEnum):
    """OpenAI chat roles."""

    SYSTEM = "system"
    DEVELOPER = "developer"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"
    FUNCTION = "function"


class ContentPart(BaseModel):
    """One part of a message's content: ``{"type": "text", "text": ...}`` or another typed part
    (``image_url``, ``input_audio``, ...) whose other fields pass through to the backend."""

    model_config = ConfigDict(extra="allow", frozen=True)
    type: str = Field(min_length=1, max_length=64)
    text: str | None = None

    @model_validator(mode="after")
    def _text_part(self) -> Self:
        if self.type == "text" and self.text is None:
            raise ValueError("a text content part needs a text string")
        return self


# -- tools ------------------------------------------------------------------------------------

#: OpenAI's rule for a function name.
FUNCTION_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
FunctionName = Annotated[str, Field(pattern=FUNCTION_NAME_PATTERN)]


class _Shape(BaseModel):
    """A tool shape: its fields are checked, other members pass through."""

    model_config = ConfigDict(extra="allow", frozen=True)


class FunctionDefinition(_Shape):
    """``tools[].function``: ``parameters`` is a JSON Schema object."""

    name: FunctionName
    description: str | None = None
    parameters: dict[str, JsonValue] | None = None
    strict: JsonBool | None = None


class FunctionTool(_Shape):
    """One entry of ``tools``: only ``function`` tools exist here."""

    type: Literal["function"]
    function: FunctionDefinition


class CalledFunction(_Shape):
    name: FunctionName
    arguments: str


class ToolCall(_Shape):
    """One entry of an assistant message's ``tool_calls``."""

    id: str
    type: Literal["function"]
    function: CalledFunction


class NamedFunction(_Shape):
    name: FunctionName


class NamedToolChoice(_Shape):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


def _kept(shape: Any, message: str | None = None) -> PlainValidator:
    """Validate a value as ``shape`` (documented as ``shape`` too) and keep the value as sent.
    A failure names the first failing member, or says ``message`` when one is given."""
    adapter: TypeAdapter[Any] = TypeAdapter(shape)

    def check(value: Any) -> Any:
        try:
            adapter.validate_python(value)
        except ValidationError as err:
            if message is not None:
                text = message
            else:
                first = err.errors(include_input=False, include_url=False)[0]
                where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"]).lstrip(".")
                text = f"{where}: {first['msg']}" if where else first["msg"]
            raise PydanticCustomError("tool_shape", "{text}", {"text": text}) from None
        return value

    return PlainValidator(check, json_schema_input_type=shape)


Tools = Annotated[list[dict[str, JsonValue]], _kept(list[FunctionTool])]
ToolCalls = Annotated[list[dict[str, JsonValue]], _kept(list[ToolCall])]
ToolChoiceValue = Annotated[
    str | dict[str, JsonValue],
    _kept(ToolChoice, 'must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}'),
]


# -- sampling and output fields (docs/compat.md, "OpenAI") ------------------------------------

#: OpenAI's ``temperature`` range.
Temperature = Annotated[JsonFloat, Field(ge=0, le=2)]
#: ``logit_bias``: token ids (integers written as strings) mapped to a bias in [-100, 100].
LogitBias = dict[Annotated[str, Field(pattern=r"^[0-9]{1,10}$")], Annotated[JsonFloat, Field(ge=-100, le=100)]]
#: ``stop``: a string or a list of strings, at most the host's bound on stop strings.
Stop = StrictStr | Annotated[list[StrictStr], Field(max_length=MAX_STOP_STRINGS)]


class JsonSchemaFormat(_Shape):
    """``response_format.json_schema``: ``schema``, when sent, is a JSON Schema object."""

    schema_: dict[str, JsonValue] | None = Field(None, alias="schema")


class ResponseFormat(_Shape):
    """``response_format``: ``text``, ``json_object`` or ``json_schema`` (with ``json_schema``)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> Self:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError('a "json_schema" response_format needs json_schema')
        return self


ResponseFormatValue = Annotated[dict[str, JsonValue], _kept(ResponseFormat)]


#: Fields that let an assistant message go without content.
_CALL_FIELDS = ("tool_calls", "function_call")
#: The same rule as JSON Schema, for the OpenAPI document.
_CONTENT_RULE: list[JsonValue] = [
    present_schema("content"),
    *(present_schema(call, role="assistant") for call in _CALL_FIELDS),
]


class ChatMessage(BaseModel):
    """An OpenAI chat message; content may be text or content parts; tool fields pass through.

    ``content`` is required except on an assistant message that carries ``tool_calls`` (or the
    legacy ``function_call``), as OpenAI's API requires."""

    model_config = ConfigDict(
        extra="allow",
        frozen=True,
        json_schema_extra={"anyOf": _CONTENT_RULE},
    )
    role: ChatRole
    content: str | list[ContentPart] | None = None
    tool_calls: ToolCalls | None = None
    name: StrictStr | None = None
    tool_call_id: StrictStr | None = None

    @model_validator(mode="after")
    def _content_present(self) -> Self:
        if self.content is None:
            extra = self.model_extra or {}
            calls = self.tool_calls is not None or extra.get("function_call") is not None
            if self.role is not ChatRole.ASSISTANT or not calls:
                raise ValueError(f"a {self.role.value} message needs content")
        return self


class ChatRequest(BaseModel):
    """The OpenAI chat-completions request shape, as accepted by counting and admission.

    Unknown OpenAI options are kept (``extra="allow"``) and validated by the backend's template.
    """

    model_config = ConfigDict(extra="allow", frozen=True)
    model: str | None = Field(None, min_length=1, max_length=256)
    messages: list[ChatMessage] = Field(min_length=1)
    tools: Tools | None = None
    tool_choice: ToolChoiceValue | None = None
    max_tokens: PositiveJsonInt | None = None
    max_completion_tokens: PositiveJsonInt | None = None
    stream: JsonBool | None = None
    temperature: Temperature | None = None
    seed: Seed | None = None
    stop: Stop | None = None
    logit_bias: LogitBias | None = None
    response_format: ResponseFormatValue | None = None
    reasoning_effort: str | None = None
    werk: WerkChatExtension | None = None

    @model_validator(mode="after")
    def _schemas_bounded(self) -> Self:
        """Every schema that may become a grammar within :data:`~werk_host.protocol.schemas.SCHEMA_BOUNDS`."""
        schemas: list[tuple[str, Any]] = []
        for index, tool in enumerate(self.tools or ()):
            function = tool.get("function")
            if isinstance(function, dict) and "parameters" in function:
                schemas.append((f"tools[{index}].function.parameters", function["parameters"]))
        json_schema = (self.response_format or {}).get("json_schema")
        if isinstance(json_schema, dict) and "schema" in json_schema:
            schemas.append(("response_format.json_schema.schema", json_schema["schema"]))
        try:
            check_schemas(schemas)
        except SchemaTooLarge as err:
            raise PydanticCustomError("schema_bound", "{text}", {"text": str(err)}) from None
        return self

    def requested_output_tokens(self) -> int:
        explicit = self.max_completion_tokens or self.max_tokens
        return explicit if explicit is not None else DEFAULT_OUTPUT_TOKENS

    def backend_options(self) -> dict[str, dict[str, JsonValue]]:
        """The backend members of ``werk`` (:meth:`WerkChatExtension.backend_options`)."""
        return self.werk.backend_options() if self.werk is not None else {}


TokenId = Annotated[StrictInt, Field(ge=0)]
Prompt = (
    str
    | Annotated[list[str], Field(min_length=1)]
    | Annotated[list[TokenId], Field(min_length=1)]
    | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)]
)


class CompletionRequest(BaseModel):
    """The OpenAI (legacy) completions request shape, as ``/v1/completions`` admission checks it.

    Only the fields OpenAI's API defines are validated; other options are kept
    (``extra="allow"``) for the backend, as on the chat route."""

    model_config = ConfigDict(extra="allow", frozen=True)
    model: str | None = Field(None, min_length=1, max_length=256)
    prompt: Prompt
    max_tokens: PositiveJsonInt | None = None
    stream: JsonBool | None = None
    stream_options: dict[str, JsonValue] | None = None
    echo: JsonBool | None = None
    n: PositiveJsonInt | None = None
    best_of: PositiveJsonInt | None = None
    logprobs: NonNegativeJsonInt | None = None
    logit_bias: LogitBias | None = None
    seed: Seed | None = None
    stop: Stop | None = None
    suffix: str | None = None
    temperature: Temperature | None = None
    top_p: JsonFloat | None = None
    presence_penalty: JsonFloat | None = None
    frequency_penalty: JsonFloat | None = None
    user: str | None = None

    def requested_output_tokens(self) -> int:
        return self.max_tokens if self.max_tokens is not None else DEFAULT_OUTPUT_TOKENS

    def prompts(self) -> list[str | list[int]]:
        """Each prompt of the request (one completion is generated per prompt)."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        if all(isinstance(p, int) for p in self.prompt):
            return [[p for p in self.prompt if isinstance(p, int)]]
        return [p for p in self.prompt if not isinstance(p, int)]


class TokenCount(DataModel):
    model: str
    input_tokens: int


class Admission(DataModel):
    model: str
    input_tokens: int
    max_output_tokens: int
    context_tokens: int | None
    token_count_method: Literal["native", "estimate"]


class ChatLimits(DataModel):
    schema_version: Literal[1] = 1
    model: str
    context_tokens: int | None
    max_output_tokens: int | None
    max_concurrent_requests: int | None
    #: The host's alone, never serialized (``GET /werk/v1/chat/limits`` has the protocol's fields
    #: only): a request beyond the capacity waits in the backend's own scheduler (a continuously
    #: batching engine such as vLLM, a remote server with its own admission), so an unknown
    #: capacity does not hold the instance to ``werk serve --inference-slots``
    #: (docs/operations.md, "Inference concurrency").
    engine_queues: SkipJsonSchema[bool] = Field(default=False, exclude=True)

    #: built at import, as the request models are: every chat's admission reads an instance's limits
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=False)


class ReasoningLimits(DataModel):
    context_tokens: int | None
    output_tokens: int
    answer_reserve_tokens: int | None
    reasoning_tokens: int | None


class ReasoningTier(DataModel):
    id: ReasoningTierId
    label: str
    available: bool
    reasoning_tokens: int | None
    minimum_output_tokens: int


class ReasoningProfile(DataModel):
    schema_version: Literal[1] = 1
    model: str | None
    backend: str | None
    supported: bool
    source: str | None
    default_tier: ReasoningTierId | None
    default_adjusted_to_limits: bool
    limits: ReasoningLimits | None
    tiers: list[ReasoningTier]
