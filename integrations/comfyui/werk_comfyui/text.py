"""The connection, chat and prefill/decode nodes (docs/comfyui.md, "Nodes").

* **Werk Connection** → ``WERK_CONNECTION``: base URL, where the key comes from, a timeout.
* **Werk Chat** → ``STRING`` text, ``STRING`` reasoning: ``POST /v1/chat/completions`` with
  the chat options — sampling, ``werk.reasoning.tier`` and ``werk.<backend>`` members.
* **Werk Prefill** → ``WERK_STATE_HANDOFF``, ``STRING`` state id, ``INT`` prompt tokens:
  ``POST /werk/v1/prefill``. The handoff leaves only on its own socket type.
* **Werk Decode** → ``STRING`` text, ``WERK_STATE_HANDOFF`` (the next handoff, when the backend
  returns one): ``POST /werk/v1/decode`` consumes the handoff.

Prefill and decode always run again (``IS_CHANGED``): a cached handoff would be a spent one.
"""

from __future__ import annotations

from typing import Any, Final

from werk_host.client import WerkClientError, WerkProtocolClient
from werk_host.protocol import ChatRequest, DecodeRequest, PrefillRequest

from .base import MAX_SEED, MODEL_INPUT, WerkNode, choice, flag, integer, json_object, number, text
from .connection import CONNECTION, HANDOFF, KEY_SOURCES, Connection, StateHandoff, read_key
from .errors import checked, invalid, served

TIERS: Final = ("unset", "default", "none", "low", "medium", "high", "max")
MODES: Final = ("auto", "ephemeral", "memory", "disk")
MAX_TOKENS: Final = 32768


class WerkConnectionNode(WerkNode):
    RETURN_TYPES = (CONNECTION,)
    RETURN_NAMES = ("connection",)

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "base_url": ("STRING", {"default": "http://127.0.0.1:11434"}),
                "api_key_source": (list(KEY_SOURCES), {"default": "environment"}),
                "api_key_env": ("STRING", {"default": "WERK_API_KEY"}),
                "api_key_file": ("STRING", {"default": "", "tooltip": "a file holding the key (chmod 600)"}),
                "timeout_s": ("FLOAT", {"default": 120.0, "min": 1.0, "max": 3600.0}),
            }
        }

    @classmethod
    def build(cls, **inputs: Any) -> Any:
        choice(inputs, "api_key_source", KEY_SOURCES)
        number(inputs, "timeout_s", 1.0, 3600.0)
        base_url = text(inputs, "base_url")
        try:  # the URL's form only: the client checks it as it will use it (http://HOST:PORT)
            return WerkProtocolClient(str(base_url))
        except WerkClientError as err:
            raise invalid(f"base_url: {err.message}") from None

    def run(self, **inputs: Any) -> tuple[Connection]:
        self.build(**inputs)
        key = read_key(inputs["api_key_source"], inputs.get("api_key_env", ""), inputs.get("api_key_file", ""))
        with served(inputs["base_url"]):
            client = WerkProtocolClient(inputs["base_url"], key, timeout=inputs["timeout_s"])
        return (Connection(inputs["base_url"], client),)


def _werk_member(inputs: dict[str, Any]) -> dict[str, Any] | None:
    member = dict(json_object(inputs, "backend_options"))
    if "reasoning" in member:
        raise invalid("backend_options: set the reasoning tier with reasoning_tier")
    tier = choice(inputs, "reasoning_tier", TIERS)
    if tier != "unset":
        member["reasoning"] = {"tier": tier}
    return member or None


class WerkChatNode(WerkNode):
    RETURN_TYPES = ("STRING", "STRING")
    RETURN_NAMES = ("text", "reasoning")
    PLACEHOLDERS = {"prompt": "?", "system": ""}

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "connection": (CONNECTION,),
                "prompt": ("STRING", {"multiline": True, "default": ""}),
                "max_tokens": ("INT", {"default": 256, "min": 1, "max": MAX_TOKENS}),
                "temperature": ("FLOAT", {"default": 0.7, "min": 0.0, "max": 2.0, "step": 0.05}),
                "seed": ("INT", {"default": 0, "min": 0, "max": MAX_SEED}),
                "reasoning_tier": (list(TIERS), {"default": "unset"}),
            },
            "optional": {
                "system": ("STRING", {"multiline": True, "default": ""}),
                "model": MODEL_INPUT,
                "top_p": ("FLOAT", {"default": 1.0, "min": 0.01, "max": 1.0, "step": 0.01}),
                "backend_options": (
                    "STRING",
                    {"multiline": True, "default": "", "tooltip": 'werk.<backend> members, e.g. {"omlx": {...}}'},
                ),
            },
        }

    @classmethod
    def build(cls, **inputs: Any) -> ChatRequest:
        system = text(inputs, "system", required=False)
        messages: list[dict[str, str | None]] = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": text(inputs, "prompt")})
        body: dict[str, Any] = {
            "model": text(inputs, "model", required=False, limit=256),
            "messages": messages,
            "max_tokens": integer(inputs, "max_tokens", 1, MAX_TOKENS),
            "temperature": number(inputs, "temperature", 0.0, 2.0),
            "seed": integer(inputs, "seed", 0, MAX_SEED),
        }
        if "top_p" in inputs and number(inputs, "top_p", 0.01, 1.0) < 1.0:
            body["top_p"] = inputs["top_p"]
        werk = _werk_member(inputs)
        if werk is not None:
            body["werk"] = werk
        if body["model"] is None:
            del body["model"]
        return checked(lambda: ChatRequest.model_validate(body), {"werk": "backend_options"})

    def run(self, connection: Connection, **inputs: Any) -> tuple[str, str]:
        request = self.build(**inputs)
        with served(connection.base_url):
            completion = connection.client.chat(request)
        message = completion["choices"][0].get("message") or {}
        content = message.get("content")
        reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
        return (content if isinstance(content, str) else "", reasoning if isinstance(reasoning, str) else "")


class WerkPrefillNode(WerkNode):
    RETURN_TYPES = (HANDOFF, "STRING", "INT")
    RETURN_NAMES = ("handoff", "state_id", "prompt_tokens")
    PLACEHOLDERS = {"text": "?"}

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "connection": (CONNECTION,),
                "model": ("STRING", {"default": ""}),
                "text": ("STRING", {"multiline": True, "default": ""}),
                "mode": (list(MODES), {"default": "auto"}),
                "pin": ("BOOLEAN", {"default": False}),
                "allow_experimental": ("BOOLEAN", {"default": False}),
            }
        }

    @classmethod
    def IS_CHANGED(cls, **inputs: Any) -> float:
        return float("nan")  # never equal to itself: a handoff is never taken from the cache

    @classmethod
    def build(cls, **inputs: Any) -> PrefillRequest:
        body = {
            "model_id": text(inputs, "model", limit=256),
            "input": {"type": "text", "text": text(inputs, "text", limit=512 << 10)},
            "policy": {"mode": choice(inputs, "mode", MODES), "pin": flag(inputs, "pin")},
            "allow_experimental": flag(inputs, "allow_experimental") or None,
        }
        return checked(lambda: PrefillRequest.model_validate(body), {"model_id": "model", "input.text": "text"})

    def run(self, connection: Connection, **inputs: Any) -> tuple[StateHandoff, str, int]:
        request = self.build(**inputs)
        with served(connection.base_url):
            result = connection.client.prefill(request)
        handoff = StateHandoff(connection, result.handoff, result.state_id, result.prompt_tokens)
        return (handoff, result.state_id or "", result.prompt_tokens)


class WerkDecodeNode(WerkNode):
    RETURN_TYPES = ("STRING", HANDOFF)
    RETURN_NAMES = ("text", "next_handoff")

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "handoff": (HANDOFF,),
                "max_tokens": ("INT", {"default": 256, "min": 1, "max": 4096}),
                "temperature": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 2.0, "step": 0.05}),
                "seed": ("INT", {"default": 0, "min": 0, "max": MAX_SEED}),
                "allow_experimental": ("BOOLEAN", {"default": False}),
            },
            "optional": {"stop": ("STRING", {"multiline": True, "default": "", "tooltip": "one stop string a line"})},
        }

    @classmethod
    def IS_CHANGED(cls, **inputs: Any) -> float:
        return float("nan")

    @classmethod
    def build(cls, **inputs: Any) -> DecodeRequest:
        stops = [line for line in (text(inputs, "stop", required=False) or "").splitlines() if line]
        body = {
            "handoff": "placeholder",  # the real one is put in by run(), once every input passed
            "max_tokens": integer(inputs, "max_tokens", 1, 4096),
            "temperature": number(inputs, "temperature", 0.0, 2.0),
            "seed": integer(inputs, "seed", 0, MAX_SEED),
            "stop": stops or None,
            "allow_experimental": flag(inputs, "allow_experimental"),
        }
        return checked(lambda: DecodeRequest.model_validate(body))

    def run(self, handoff: StateHandoff, **inputs: Any) -> tuple[str, StateHandoff | None]:
        if not isinstance(handoff, StateHandoff):
            raise invalid("handoff: connect a Werk Prefill node's handoff output")
        checked_request = self.build(**inputs)  # every input checked before the handoff is spent
        request = checked_request.model_copy(update={"handoff": handoff.take()})
        connection = handoff.connection
        with served(connection.base_url):
            result = connection.client.decode(request)
        following = None
        if result.handoff is not None:
            following = StateHandoff(connection, result.handoff, handoff.state_id, handoff.prompt_tokens)
        return (result.text, following)
