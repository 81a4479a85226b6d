"""The Ollama generation API as a translation of the ``/v1`` path (docs/compat.md).

``POST /api/chat`` becomes an OpenAI chat body (:func:`chat_body`); ``POST /api/generate``
becomes one too (``system`` + ``prompt`` as a two-message conversation), or with ``raw: true``
an OpenAI completions body whose prompt is sent as it is (:func:`generate_body`). ``options``
map as follows: ``num_predict`` → ``max_tokens`` (``-1``/``-2``: no limit is sent),
``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop``, ``presence_penalty`` and
``frequency_penalty`` carry over; ``num_ctx`` is checked against the served context
(:func:`check_num_ctx`); launch settings (``num_thread``, ``num_gpu``, ...) belong to the
deployment and have no effect; any other option is refused. ``format`` becomes
``response_format``; ``think`` becomes ``werk.reasoning`` (``true``: the model's default tier,
a level: that tier; ``false`` asks for nothing here, and tier ``none`` where the serving runtime
has a verified reasoning profile, which werk_host/http/ollama.py checks). A request without messages (chat) or prompt
(generate) is Ollama's load/unload idiom (:func:`residency_answer`).

Answers: NDJSON lines by default, one JSON object with ``stream: false``; the last (or only)
object has ``done: true``, ``done_reason``, ``prompt_eval_count`` and ``eval_count`` (the
backend's usage; left out when it reports none) and ``total_duration`` (measured here, ns).
Errors are ``{"error": message}`` (:func:`error_document`), inside a stream too.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, Field, JsonValue, model_validator

from werk_host.compat.upstream import STREAM_CUT, STREAM_FAILED, Usage, as_object, first_choice, text_of, unreadable
from werk_host.deployments.durations import MAX_DURATION_TEXT, too_long
from werk_host.errors import ErrorCode, WerkError
from werk_host.protocol import StrictModel
from werk_host.protocol.base import JsonBool, JsonFloat, JsonInt, NonNegativeJsonInt, PositiveJsonInt
from werk_host.seam import JsonObject

log = logging.getLogger(__name__)

#: Options that select sampling behaviour this translation cannot express: refused by name.
UNSUPPORTED_OPTIONS: Final = frozenset(
    {
        "num_keep",
        "tfs_z",
        "typical_p",
        "min_p",
        "repeat_last_n",
        "repeat_penalty",
        "mirostat",
        "mirostat_tau",
        "mirostat_eta",
        "penalize_newline",
        "logits_all",
        "vocab_only",
        "embedding_only",
        "f16_kv",
    }
)
#: ``options`` → OpenAI field, carried over unchanged.
SAMPLING: Final = (
    ("temperature", "temperature"),
    ("top_p", "top_p"),
    ("top_k", "top_k"),
    ("seed", "seed"),
    ("presence_penalty", "presence_penalty"),
    ("frequency_penalty", "frequency_penalty"),
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
    """Ollama ``options`` (see the module docstring for what each one does here)."""

    num_predict: Annotated[JsonInt, AfterValidator(_num_predict)] | None = None
    temperature: Annotated[JsonFloat, Field(ge=0)] | None = None
    top_p: Annotated[JsonFloat, Field(ge=0, le=1)] | None = None
    top_k: NonNegativeJsonInt | None = None
    seed: JsonInt | None = None
    stop: list[Annotated[str, Field(min_length=1)]] | None = None
    num_ctx: PositiveJsonInt | None = None
    presence_penalty: Annotated[JsonFloat, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[JsonFloat, Field(ge=-2, le=2)] | None = None
    # launch settings: the deployment profile owns them; accepted, no effect
    numa: JsonBool | None = None
    num_batch: JsonInt | None = None
    num_gpu: JsonInt | None = None
    main_gpu: JsonInt | None = None
    low_vram: JsonBool | None = None
    num_thread: JsonInt | None = None
    use_mmap: JsonBool | None = None
    use_mlock: JsonBool | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: Any) -> Any:
        if isinstance(data, dict):
            refused = sorted(UNSUPPORTED_OPTIONS & set(data))
            if refused:
                raise ValueError(f"option {refused[0]} is not supported by this server")
        return data


def _not_given(data: dict[str, Any], name: str, message: str) -> None:
    if data.get(name):
        raise ValueError(message)


class OllamaMessage(StrictModel):
    role: Literal["system", "user", "assistant"]
    content: str = ""
    #: a replayed assistant turn's thinking: accepted, not sent to the model again
    thinking: str | None = None
    images: list[str] | None = None  # only empty
    tool_calls: list[JsonValue] | None = None  # only empty

    @model_validator(mode="before")
    @classmethod
    def _supported(cls, data: Any) -> Any:
        if isinstance(data, dict):
            _not_given(data, "images", "images are not supported on this route")
            _not_given(data, "tool_calls", "tool calls are not supported on this route")
        return data


Format = Literal["", "json"] | dict[str, JsonValue]
Think = JsonBool | Literal["low", "medium", "high"]


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


class OllamaChatRequest(_Generation):
    """``POST /api/chat``."""

    messages: list[OllamaMessage] = Field(default_factory=list)
    tools: list[dict[str, JsonValue]] | None = None  # only empty

    @model_validator(mode="before")
    @classmethod
    def _supported(cls, data: Any) -> Any:
        if isinstance(data, dict):
            _not_given(data, "tools", "tools are not supported on this route (use /v1/chat/completions)")
        return data


class OllamaGenerateRequest(_Generation):
    """``POST /api/generate``."""

    prompt: str | None = None
    system: str | None = None
    raw: JsonBool | None = None
    suffix: str | None = None  # only empty
    template: str | None = None  # only empty
    context: list[JsonInt] | None = None  # only empty
    images: list[str] | None = None  # only empty

    @model_validator(mode="before")
    @classmethod
    def _supported(cls, data: Any) -> Any:
        if isinstance(data, dict):
            _not_given(data, "suffix", "suffix (fill-in-the-middle) is not supported on this route")
            _not_given(data, "template", "template is not supported: the model's own chat template is used")
            _not_given(data, "context", "context is not supported: send the conversation to /api/chat")
            _not_given(data, "images", "images are not supported on this route")
            if data.get("raw") is True and (data.get("system") or data.get("format") or data.get("think")):
                raise ValueError("raw cannot be combined with system, format or think")
        return data


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


def served_name(model: str) -> str:
    """The deployment name a client's model names: Ollama's default tag ``:latest`` dropped
    (instance ids, model names and aliases never contain ``:``)."""
    return model.removesuffix(":latest")


def check_num_ctx(options: OllamaOptions | None, context_tokens: int | None) -> None:
    """``num_ctx`` above the per-request context the model is served with is refused; when the
    context is unknown (a cold instance) it is not checked. A smaller value changes nothing."""
    if options is None or options.num_ctx is None or context_tokens is None:
        return
    if options.num_ctx > context_tokens:
        raise WerkError(
            ErrorCode.INVALID_REQUEST,
            f"options.num_ctx {options.num_ctx} exceeds the {context_tokens}-token context this model is served with",
        )


def _common(request: _Generation, *, stream: bool) -> JsonObject:
    body: JsonObject = {"model": served_name(request.model), "stream": stream}
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
    if request.think is not None and request.think is not False:
        tier = "default" if request.think is True else request.think
        body["werk"] = {"reasoning": {"tier": tier}}
    return body


def chat_body(request: OllamaChatRequest) -> JsonObject:
    """The OpenAI chat body for an ``/api/chat`` request with messages."""
    body = _common(request, stream=request.streamed)
    body["messages"] = [{"role": m.role, "content": m.content} for m in request.messages]
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
    messages.append({"role": "user", "content": request.prompt or ""})
    body["messages"] = messages
    return True, body


# -- answers ---------------------------------------------------------------------------------


class Shape(StrEnum):
    """Which Ollama answer shape: ``message`` objects (chat) or ``response`` text (generate)."""

    CHAT = "chat"
    GENERATE = "generate"


def timestamp() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _piece(shape: Shape, model: str, text: str, thinking: str) -> JsonObject:
    doc: JsonObject = {"model": model, "created_at": timestamp()}
    if shape is Shape.CHAT:
        message: JsonObject = {"role": "assistant", "content": text}
        if thinking:
            message["thinking"] = thinking
        doc["message"] = message
    else:
        doc["response"] = text
        if thinking:
            doc["thinking"] = thinking
    doc["done"] = False
    return doc


def _finished(doc: JsonObject, finish: str | None, usage: Usage | None, started_ns: int) -> JsonObject:
    doc["done"] = True
    doc["done_reason"] = finish or "stop"
    doc["total_duration"] = time.monotonic_ns() - started_ns
    if usage is not None:
        doc["prompt_eval_count"] = usage.prompt_tokens
        doc["eval_count"] = usage.completion_tokens
    return doc


def _texts(choice: JsonObject, part: str) -> tuple[str, str]:
    """``(text, thinking)`` of a choice: chat ``message``/``delta`` content and reasoning, or
    completions ``text``."""
    inner = as_object(choice.get(part))
    if inner is None:
        return text_of(choice.get("text")), ""
    return text_of(inner.get("content")), text_of(inner.get("reasoning_content"))


def answer(doc: JsonObject, shape: Shape, model: str, started_ns: int) -> JsonObject:
    """The single Ollama object (``stream: false``) for an OpenAI answer document."""
    choice = first_choice(doc)
    if choice is None:
        raise unreadable()
    text, thinking = _texts(choice, "message")
    finish = choice.get("finish_reason")
    piece = _piece(shape, model, text, thinking)
    return _finished(piece, finish if isinstance(finish, str) else None, Usage.of(doc), started_ns)


def line(doc: JsonObject) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"


def answer_stream(events: Iterable[JsonObject], shape: Shape, model: str, started_ns: int) -> Iterator[bytes]:
    """NDJSON lines for the OpenAI chunks ``events``: one per text (or thinking) delta, then the
    ``done`` line. A backend failure inside the stream ends it with an ``{"error": ...}`` line
    carrying a fixed message."""
    finish: str | None = None
    usage: Usage | None = None
    try:
        for event in events:
            if "error" in event:
                log.warning("the backend reported an error inside a stream")
                yield line(error_document(STREAM_FAILED))
                return
            usage = Usage.of(event) or usage
            choice = first_choice(event)
            if choice is None:
                continue
            text, thinking = _texts(choice, "delta")
            if text or thinking:
                yield line(_piece(shape, model, text, thinking))
            reason = choice.get("finish_reason")
            if isinstance(reason, str):
                finish = reason
    except Exception as err:  # one line, no traceback (docs/operations.md, "Backend failures")
        log.warning("a backend stream failed while it was translated: %s", type(err).__name__)
        yield line(error_document(STREAM_FAILED))
        return
    if finish is None:
        yield line(error_document(STREAM_CUT))
        return
    yield line(_finished(_piece(shape, model, "", ""), finish, usage, started_ns))


def residency_answer(shape: Shape, model: str, reason: Literal["load", "unload"]) -> JsonObject:
    """The answer to a load (or unload) request: ``done`` with ``done_reason`` saying which."""
    doc = _piece(shape, model, "", "")
    doc["done"] = True
    doc["done_reason"] = reason
    return doc


def error_document(message: str) -> JsonObject:
    return {"error": message}
