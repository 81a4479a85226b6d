"""Ollama chat messages and tools as OpenAI ones (docs/compat.md, "Ollama").

* ``tools``: Ollama's function tools have OpenAI's shape; each becomes
  ``{"type": "function", "function": ...}`` (Ollama's top-level ``items`` is dropped), and the
  ``/v1`` path validates them as it validates any OpenAI tools.
* An assistant message's ``tool_calls`` (``{"id"?, "function": {"index"?, "name",
  "arguments": {...}}}``) become OpenAI calls with the arguments as a JSON string; a call
  without an ``id`` gets ``call_<message>_<call>`` (its positions in the conversation), so the
  same conversation always renders the same ids.
* A ``role: "tool"`` message becomes an OpenAI tool message answering one earlier call: the
  call its ``tool_call_id`` names, else the first unanswered call named ``tool_name``, else the
  first unanswered call. A tool message that answers no call keeps ``tool_call_id`` (or gets
  ``call_<message>``).
* ``images`` (base64 PNG, JPEG, GIF, WebP or BMP data, as Ollama takes them) on a user message
  become OpenAI ``image_url`` parts with a ``data:`` URL after the text; other data is refused.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, JsonValue, model_validator

from werk_host.protocol import StrictModel
from werk_host.protocol.base import JsonInt
from werk_host.seam import JsonObject

#: Leading bytes of the image formats a ``data:`` URL is labelled with.
_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"BM", "image/bmp"),
)


def image_type(data: bytes) -> str | None:
    """The MIME type of image ``data`` by its signature; ``None`` for anything else."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return next((kind for magic, kind in _SIGNATURES if data.startswith(magic)), None)


def _image(value: str) -> str:
    """An Ollama image (base64 data, optionally already a ``data:`` URL) checked as base64 of a
    known image format."""
    payload = value.partition(",")[2] if value.startswith("data:") else value
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("an image must be base64-encoded image data") from None
    if image_type(data) is None:
        raise ValueError("an image must be PNG, JPEG, GIF, WebP or BMP data")
    return payload


def data_url(image: str) -> str:
    """The ``data:`` URL of a checked base64 image."""
    return f"data:{image_type(base64.b64decode(image))};base64,{image}"


Image = Annotated[str, AfterValidator(_image)]


class CalledFunction(StrictModel):
    """``tool_calls[].function``: ``arguments`` an object (Ollama) or its JSON text."""

    name: str = Field(min_length=1, max_length=64)
    arguments: dict[str, JsonValue] | str = Field(default_factory=dict)
    index: JsonInt | None = None

    def arguments_text(self) -> str:
        """The arguments as the JSON text OpenAI carries."""
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments, ensure_ascii=False)

    @model_validator(mode="after")
    def _object(self) -> CalledFunction:
        if isinstance(self.arguments, str):
            try:
                parsed = json.loads(self.arguments)
            except ValueError:
                parsed = None
            if not isinstance(parsed, dict):
                raise ValueError("tool call arguments must be a JSON object")
        return self


class OllamaToolCall(StrictModel):
    id: str | None = Field(None, min_length=1, max_length=256)
    type: Literal["function"] | None = None
    function: CalledFunction


class OllamaMessage(StrictModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    #: a replayed assistant turn's thinking: accepted, not sent to the model again
    thinking: str | None = None
    images: list[Image] | None = None
    tool_calls: list[OllamaToolCall] | None = None
    tool_name: str | None = Field(None, max_length=256)
    tool_call_id: str | None = Field(None, min_length=1, max_length=256)

    @model_validator(mode="before")
    @classmethod
    def _as_ollama_reads(cls, data: Any) -> Any:
        """Ollama reads roles case-insensitively and a ``null`` content as empty."""
        if isinstance(data, dict):
            if isinstance(data.get("role"), str):
                data = {**data, "role": data["role"].lower()}
            if "content" in data and data["content"] is None:
                data = {**data, "content": ""}
        return data

    @model_validator(mode="after")
    def _fits_role(self) -> OllamaMessage:
        if self.images and self.role != "user":
            raise ValueError("images are accepted on user messages only")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("tool_calls are accepted on assistant messages only")
        return self


class OllamaTool(StrictModel):
    """One Ollama tool: OpenAI's function tool (``function`` is checked by the ``/v1`` path)."""

    type: Literal["function"] = "function"
    function: dict[str, JsonValue]
    items: JsonValue = None


def openai_tools(tools: Sequence[OllamaTool]) -> list[JsonValue]:
    return [{"type": "function", "function": tool.function} for tool in tools]


def _content(message: OllamaMessage) -> JsonValue:
    if not message.images:
        return message.content
    parts: list[JsonValue] = [{"type": "text", "text": message.content}] if message.content else []
    parts += [{"type": "image_url", "image_url": {"url": data_url(image)}} for image in message.images]
    return parts


def openai_messages(messages: Sequence[OllamaMessage]) -> list[JsonValue]:
    """The OpenAI messages of an Ollama conversation (see the module docstring)."""
    out: list[JsonValue] = []
    pending: list[tuple[str, str]] = []  # (id, name) of calls not answered yet, in order
    for i, message in enumerate(messages):
        doc: JsonObject = {"role": message.role, "content": _content(message)}
        if message.role == "assistant" and message.tool_calls:
            calls: list[JsonValue] = []
            for j, call in enumerate(message.tool_calls):
                call_id = call.id or f"call_{i}_{j}"
                pending.append((call_id, call.function.name))
                calls.append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": call.function.name, "arguments": call.function.arguments_text()},
                    }
                )
            doc["tool_calls"] = calls
        elif message.role == "tool":
            doc["tool_call_id"] = _answered(pending, message, i)
        out.append(doc)
    return out


def _answered(pending: list[tuple[str, str]], message: OllamaMessage, index: int) -> str:
    """The id of the call tool message ``message`` answers, taken off ``pending``."""
    chosen = next((p for p in pending if p[0] == message.tool_call_id), None)
    if chosen is None and message.tool_call_id is None:
        if message.tool_name:
            chosen = next((p for p in pending if p[1] == message.tool_name), None)
        if chosen is None and pending:
            chosen = pending[0]
    if chosen is None:
        return message.tool_call_id or f"call_{index}"
    pending.remove(chosen)
    return chosen[0]
