"""The Ollama generation API as a translation of the ``/v1`` path (docs/compat.md, "Ollama").

``POST /api/chat`` becomes an OpenAI chat body (:func:`chat_body`): messages, tools, tool calls,
tool results and images as :mod:`werk_host.compat.ollama_messages` says. ``POST /api/generate``
becomes one too (``system`` + ``prompt`` (+ ``images``) as a two-message conversation), or with
``raw: true`` an OpenAI completions body whose prompt is sent as it is (:func:`generate_body`).

``options`` (:class:`OllamaOptions`), as Ollama reads them: ``num_predict`` → ``max_tokens``
(``-1``/``-2``: no limit is sent); ``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop``,
``presence_penalty`` and ``frequency_penalty`` carry over as the OpenAI fields;
``min_p``, ``typical_p``, ``repeat_penalty`` and ``repeat_last_n`` carry over under the same
names (llama-server's sampling fields); ``num_ctx``, ``num_keep`` and the launch settings
(``num_thread``, ``num_gpu``, ...) are accepted with no effect (the deployment fixes the
context and how the instance runs); any other option is ignored, as Ollama ignores options it
does not know. A known option of the wrong type is refused.

``format`` becomes ``response_format``; ``think`` becomes ``werk.reasoning`` (``true``: the
model's default tier, a level: that tier), which werk_host/http/ollama.py checks against the
serving instance's verified reasoning profile (and turns ``false`` into tier ``none`` where
there is one). A request without messages (chat) or prompt (generate) is Ollama's load/unload
idiom. Answers: :mod:`werk_host.compat.ollama_answers`.
"""

from __future__ import annotations

import logging
import re
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, ConfigDict, Field, JsonValue, model_validator

from werk_host.compat.ollama_answers import (
    Shape,
    answer,
    answer_stream,
    error_document,
    line,
    residency_answer,
    timestamp,
)
from werk_host.compat.ollama_messages import Image, OllamaMessage, OllamaTool, data_url, openai_messages, openai_tools
from werk_host.compat.upstream import STREAM_CUT, STREAM_FAILED
from werk_host.deployments.durations import MAX_DURATION_TEXT, too_long
from werk_host.protocol import StrictModel
from werk_host.protocol.base import JsonBool, JsonFloat, JsonInt, NonNegativeJsonInt, PositiveJsonInt
from werk_host.seam import JsonObject

__all__ = [
    "STREAM_CUT",
    "STREAM_FAILED",
    "OllamaChatRequest",
    "OllamaGenerateRequest",
    "OllamaMessage",
    "OllamaOptions",
    "OllamaShowRequest",
    "Shape",
    "answer",
    "answer_stream",
    "chat_body",
    "error_document",
    "generate_body",
    "keep_alive_seconds",
    "line",
    "residency_answer",
    "timestamp",
]

log = logging.getLogger(__name__)

#: ``options`` → the body field it becomes, carried over unchanged.
SAMPLING: Final = (
    ("temperature", "temperature"),
    ("top_p", "top_p"),
    ("top_k", "top_k"),
    ("seed", "seed"),
    ("presence_penalty", "presence_penalty"),
    ("frequency_penalty", "frequency_penalty"),
    ("min_p", "min_p"),
    ("typical_p", "typical_p"),
    ("repeat_penalty", "repeat_penalty"),
    ("repeat_last_n", "repeat_last_n"),
)

# -- keep_alive ------------------------------------------------------------------------------

_UNITS: Final = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"[-+]?(?:0|(?:(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|μs|ms|s|m|h))+)")
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def keep_alive_seconds(value: str | float) -> float:
    """Seconds of an Ollama ``keep_alive``: a number of seconds or a Go duration string
    (``"5m"``, ``"1h30m"``, ``"0"``); negative means forever (``inf``). A finite value above
    :data:`~werk_host.deployments.durations.MAX_DURATION_S` (one year) is refused."""
    if isinstance(value, str):
        if _DURATION.fullmatch(value) is None:
            raise ValueError('keep_alive must be seconds or a duration such as "5m", "1h30m" or "0"')
        seconds = sum(float(n) * _UNITS[unit] for n, unit in _DURATION_PART.findall(value))
        seconds = -seconds if value.startswith("-") else seconds
    else:
        seconds = float(value)
    if seconds < 0:
        return float("inf")
    if too_long(seconds):
        raise ValueError(f"keep_alive must be at most {MAX_DURATION_TEXT} (one year); negative keeps the model forever")
    return seconds


KeepAlive = Annotated[str | JsonFloat, AfterValidator(keep_alive_seconds)]

# -- requests --------------------------------------------------------------------------------


def _num_predict(value: int) -> int:
    if value < 1 and value not in (-1, -2):
        raise ValueError("num_predict must be a positive number of tokens, -1 (no limit) or -2 (fill the context)")
    return value


class OllamaOptions(StrictModel):
    """Ollama ``options`` (see the module docstring for what each one does here); options it
    does not name are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    num_predict: Annotated[JsonInt, AfterValidator(_num_predict)] | None = None
    temperature: Annotated[JsonFloat, Field(ge=0)] | None = None
    top_p: Annotated[JsonFloat, Field(ge=0, le=1)] | None = None
    top_k: NonNegativeJsonInt | None = None
    seed: JsonInt | None = None
    stop: list[Annotated[str, Field(min_length=1)]] | None = None
    presence_penalty: Annotated[JsonFloat, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[JsonFloat, Field(ge=-2, le=2)] | None = None
    min_p: Annotated[JsonFloat, Field(ge=0, le=1)] | None = None
    typical_p: Annotated[JsonFloat, Field(ge=0, le=1)] | None = None
    repeat_penalty: Annotated[JsonFloat, Field(ge=0)] | None = None
    repeat_last_n: Annotated[JsonInt, Field(ge=-1)] | None = None
    # accepted, no effect: the deployment fixes the context and how the instance runs
    num_ctx: PositiveJsonInt | None = None
    num_keep: JsonInt | None = None
    num_batch: JsonInt | None = None
    num_gpu: JsonInt | None = None
    main_gpu: JsonInt | None = None
    num_thread: JsonInt | None = None
    use_mmap: JsonBool | None = None

    @model_validator(mode="before")
    @classmethod
    def _note_ignored(cls, data: Any) -> Any:
        if isinstance(data, dict):
            ignored = set(data) - set(cls.model_fields)
            if ignored:
                log.debug("ignored %d Ollama option(s) this server does not know", len(ignored))
        return data


Format = Literal["", "json"] | dict[str, JsonValue]
Think = JsonBool | Literal["low", "medium", "high", "max"]


class _Generation(StrictModel):
    model: str = Field(min_length=1, max_length=256)
    format: Format | None = None
    options: OllamaOptions | None = None
    stream: JsonBool | None = None
    keep_alive: KeepAlive | None = None
    think: Think | None = None

    @property
    def streamed(self) -> bool:
        """Ollama streams unless told ``stream: false``."""
        return self.stream is not False

    @property
    def keep_alive_s(self) -> float | None:
        """``keep_alive`` in seconds (``inf``: forever; the validator already converted it);
        ``None`` when the request has none."""
        return keep_alive_seconds(self.keep_alive) if self.keep_alive is not None else None

    @property
    def thinks(self) -> bool:
        """Whether the request asks for thinking (``true`` or a level)."""
        return self.think is not None and self.think is not False


class OllamaChatRequest(_Generation):
    """``POST /api/chat``."""

    messages: list[OllamaMessage] = Field(default_factory=list)
    tools: list[OllamaTool] | None = None

    @property
    def has_images(self) -> bool:
        return any(m.images for m in self.messages)


def _not_given(data: dict[str, Any], name: str, message: str) -> None:
    if data.get(name):
        raise ValueError(message)


class OllamaGenerateRequest(_Generation):
    """``POST /api/generate``."""

    prompt: str | None = None
    system: str | None = None
    raw: JsonBool | None = None
    suffix: str | None = None  # only empty
    template: str | None = None  # only empty
    context: list[JsonInt] | None = None  # only empty
    images: list[Image] | None = None

    @model_validator(mode="before")
    @classmethod
    def _supported(cls, data: Any) -> Any:
        if isinstance(data, dict):
            _not_given(data, "suffix", "suffix (fill-in-the-middle) is not supported on this route")
            _not_given(data, "template", "template is not supported: the model's own chat template is used")
            _not_given(data, "context", "context is not supported: send the conversation to /api/chat")
            if data.get("raw") is True and (
                data.get("system") or data.get("format") or data.get("think") or data.get("images")
            ):
                raise ValueError("raw cannot be combined with system, format, think or images")
        return data

    @property
    def has_images(self) -> bool:
        return bool(self.images)


class OllamaShowRequest(StrictModel):
    """``POST /api/show``: ``model`` (or the older ``name``)."""

    model: str | None = Field(None, min_length=1, max_length=256)
    name: str | None = Field(None, min_length=1, max_length=256)
    verbose: JsonBool | None = None

    @model_validator(mode="after")
    def _named(self) -> OllamaShowRequest:
        if self.model is None and self.name is None:
            raise ValueError("model is required")
        return self

    @property
    def requested(self) -> str:
        return self.model or self.name or ""


class OllamaEmbedRequest(StrictModel):
    """``POST /api/embed`` (``input``) and the older ``POST /api/embeddings`` (``prompt``)."""

    model: str = Field(min_length=1, max_length=256)
    input: str | list[str] | None = None
    prompt: str | None = None
    truncate: JsonBool | None = None
    dimensions: PositiveJsonInt | None = None
    options: OllamaOptions | None = None
    keep_alive: KeepAlive | None = None


def _common(request: _Generation, *, stream: bool) -> JsonObject:
    body: JsonObject = {"model": request.model, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    options = request.options
    if options is not None:
        if options.num_predict is not None and options.num_predict > 0:
            body["max_tokens"] = options.num_predict
        for name, field in SAMPLING:
            value = getattr(options, name)
            if value is not None:
                body[field] = value
        if options.stop:
            body["stop"] = list(options.stop)
    if request.format == "json":
        body["response_format"] = {"type": "json_object"}
    elif isinstance(request.format, dict):
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "response", "schema": request.format}}
    if request.thinks:
        tier = "default" if request.think is True else request.think
        body["werk"] = {"reasoning": {"tier": tier}}
    return body


def chat_body(request: OllamaChatRequest) -> JsonObject:
    """The OpenAI chat body for an ``/api/chat`` request with messages."""
    body = _common(request, stream=request.streamed)
    body["messages"] = openai_messages(request.messages)
    if request.tools:
        body["tools"] = openai_tools(request.tools)
    return body


def generate_body(request: OllamaGenerateRequest) -> tuple[bool, JsonObject]:
    """``(chat, body)`` for an ``/api/generate`` request with a prompt: an OpenAI chat body, or
    with ``raw`` a completions body."""
    body = _common(request, stream=request.streamed)
    if request.raw:
        body["prompt"] = request.prompt or ""
        return False, body
    messages: list[JsonValue] = []
    if request.system:
        messages.append({"role": "system", "content": request.system})
    content: JsonValue = request.prompt or ""
    if request.images:
        parts: list[JsonValue] = [{"type": "text", "text": request.prompt}] if request.prompt else []
        content = parts + [{"type": "image_url", "image_url": {"url": data_url(i)}} for i in request.images]
    messages.append({"role": "user", "content": content})
    body["messages"] = messages
    return True, body
