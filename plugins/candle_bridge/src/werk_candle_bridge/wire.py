"""OpenAI request bodies in, validated jobs out (docs/candle.md, "OpenAI routes").

:func:`parse_chat` and :func:`parse_completion` validate a body completely before anything is
submitted to the engine: an option the bridge does not map, or a value out of range, is
``invalid_request`` (HTTP 400) naming the option, and nothing is consumed. The answers are
written by :mod:`werk_host.plugin.openai` (:mod:`werk_candle_bridge.generation`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from pydantic import JsonValue

from werk_host.plugin import ErrorCode, WerkError
from werk_host.plugin.openai import ReplyKind

from .engine import Sampling
from .template import CHAT_ROLES, Message

__all__ = [
    "Job",
    "JobKind",
    "finish_reason",
    "parse_chat",
    "parse_completion",
]

MAX_STOP = 16
FINISH_REASONS = ("stop", "length")

#: Options mapped to the engine's sampling, shared by both routes.
_SAMPLING = (
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "stop",
    "logit_bias",
    "ignore_eos",
)
#: Options accepted only at their default value (what a client may send without asking for more).
_DEFAULT_ONLY: dict[str, tuple[JsonValue, ...]] = {
    "n": (1,),
    "logprobs": (False, None),
    "echo": (False,),
    "best_of": (1,),
    "suffix": (None,),
    "parallel_tool_calls": (None,),
}
_COMMON = frozenset({"model", "stream", "stream_options", "user", *_SAMPLING})
_CHAT_ONLY = frozenset({"messages", "max_completion_tokens", "n", "logprobs", "response_format", "parallel_tool_calls"})
_TEXT_ONLY = frozenset({"prompt", "n", "logprobs", "echo", "best_of", "suffix"})


class JobKind(StrEnum):
    CHAT = "chat"
    TEXT = "text"


@dataclass(frozen=True)
class Job:
    """A validated request: what to prompt the engine with, how to sample, how to answer."""

    kind: JobKind
    #: chat messages (``CHAT``) — rendered by the model's template
    messages: tuple[Message, ...]
    #: the raw prompt (``TEXT``)
    prompt: str
    sampling: Sampling
    stream: bool
    include_usage: bool

    @property
    def reply_kind(self) -> ReplyKind:
        """The answer's kind (:class:`werk_host.plugin.openai.Reply`)."""
        return "chat" if self.kind is JobKind.CHAT else "text"


def _bad(message: str) -> WerkError:
    return WerkError(ErrorCode.INVALID_REQUEST, message)


def _number(body: Mapping[str, JsonValue], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _bad(f"{name} must be a number")
    if not low <= value <= high:
        raise _bad(f"{name} must be between {low:g} and {high:g}")
    return float(value)


def _integer(body: Mapping[str, JsonValue], name: str, low: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"{name} must be an integer")
    if value < low:
        raise _bad(f"{name} must be at least {low}")
    return value


def _stop(value: JsonValue) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise _bad("stop must be a non-empty string or a list of non-empty strings")
    if len(stops) > MAX_STOP:
        raise _bad(f"stop takes at most {MAX_STOP} strings")
    return tuple(str(s) for s in stops)


def _logit_bias(value: JsonValue) -> tuple[tuple[int, float], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise _bad("logit_bias must map token ids to numbers")
    out: list[tuple[int, float]] = []
    for key, bias in value.items():
        if not key.isdigit() or isinstance(bias, bool) or not isinstance(bias, int | float):
            raise _bad("logit_bias must map token ids to numbers")
        if not -100 <= bias <= 100:
            raise _bad("logit_bias values must be between -100 and 100")
        out.append((int(key), float(bias)))
    return tuple(out)


def _check_names(body: Mapping[str, JsonValue], allowed: frozenset[str]) -> None:
    unknown = sorted(k for k in body if k not in allowed and k != "werk")
    if unknown:
        raise _bad(f"the candle backend does not support these options: {', '.join(unknown)}")
    for name, defaults in _DEFAULT_ONLY.items():
        if name in body and body[name] not in defaults:
            raise _bad(f"the candle backend supports {name} only at its default")


def _flag(body: Mapping[str, JsonValue], name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _bad(f"{name} must be true or false")
    return value


def _sampling(body: Mapping[str, JsonValue], max_tokens: int | None) -> Sampling:
    return Sampling(
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 0.0, 100.0),
        top_p=_number(body, "top_p", 0.0, 1.0),
        top_k=_integer(body, "top_k", 0),
        min_p=_number(body, "min_p", 0.0, 1.0),
        presence_penalty=_number(body, "presence_penalty", -2.0, 2.0),
        frequency_penalty=_number(body, "frequency_penalty", -2.0, 2.0),
        repetition_penalty=_number(body, "repetition_penalty", 1e-6, 100.0),
        stop=_stop(body.get("stop")),
        logit_bias=_logit_bias(body.get("logit_bias")),
        ignore_eos=_flag(body, "ignore_eos"),
    )


def _streaming(body: Mapping[str, JsonValue]) -> tuple[bool, bool]:
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise _bad("stream_options needs stream: true")
    if not isinstance(options, dict) or any(k != "include_usage" for k in options):
        raise _bad("stream_options takes only include_usage")
    include = options.get("include_usage", False)
    if not isinstance(include, bool):
        raise _bad("stream_options.include_usage must be true or false")
    return stream, include


def _content(message: Mapping[str, JsonValue], index: int) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise _bad(f"messages[{index}]: the candle backend takes text content only")
            texts.append(str(part["text"]))
        return "\n".join(texts)
    raise _bad(f"messages[{index}] needs text content")


def chat_messages(raw: JsonValue) -> tuple[Message, ...]:
    """The conversation of an OpenAI ``messages`` list: roles ``system``, ``developer``, ``user``
    and ``assistant`` with text (text parts are joined by newlines; ``name`` is ignored). Tools,
    tool messages and non-text parts are ``invalid_request``."""
    if not isinstance(raw, list) or not raw:
        raise _bad("messages must be a non-empty list")
    out: list[Message] = []
    for index, message in enumerate(raw):
        if not isinstance(message, dict):
            raise _bad(f"messages[{index}] must be an object")
        role = message.get("role")
        if not isinstance(role, str) or role not in CHAT_ROLES:
            raise _bad(f"messages[{index}]: the candle backend takes the roles {', '.join(sorted(CHAT_ROLES))}")
        extra = sorted(k for k in message if k not in ("role", "content", "name"))
        if extra:
            raise _bad(f"messages[{index}]: the candle backend does not support {', '.join(extra)}")
        out.append(Message(role, _content(message, index)))
    return tuple(out)


def parse_chat(body: Mapping[str, JsonValue], ceiling: int | None) -> Job:
    """Validate a chat-completions body (module docstring). ``ceiling`` caps an absent
    ``max_tokens`` (the manifest's output ceiling)."""
    _check_names(body, _COMMON | _CHAT_ONLY)
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        raise _bad("the candle backend supports response_format only as {'type': 'text'}")
    explicit = _integer(body, "max_completion_tokens", 1) or _integer(body, "max_tokens", 1)
    stream, include_usage = _streaming(body)
    return Job(
        kind=JobKind.CHAT,
        messages=chat_messages(body.get("messages")),
        prompt="",
        sampling=_sampling(body, explicit if explicit is not None else ceiling),
        stream=stream,
        include_usage=include_usage,
    )


def parse_completion(body: Mapping[str, JsonValue], ceiling: int | None) -> Job:
    """Validate a (legacy) completions body: ``prompt`` is one string (or a list of exactly one)."""
    _check_names(body, _COMMON | _TEXT_ONLY)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise _bad("prompt must be a non-empty string (token arrays and batches are not supported)")
    explicit = _integer(body, "max_tokens", 1)
    stream, include_usage = _streaming(body)
    return Job(
        kind=JobKind.TEXT,
        messages=(),
        prompt=prompt,
        sampling=_sampling(body, explicit if explicit is not None else ceiling),
        stream=stream,
        include_usage=include_usage,
    )


def finish_reason(engine_reason: str | None) -> str:
    """OpenAI's ``finish_reason`` for the engine's (``stop`` and ``length`` pass through)."""
    return engine_reason if engine_reason in FINISH_REASONS else "stop"
