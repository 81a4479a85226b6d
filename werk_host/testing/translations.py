"""The host's client-protocol translations, for plugin tests that check a real backend's answers
translate (docs/compat.md, "One translation layer"; docs/plugin-kit.md, "Testing").

A backend's OpenAI answer reaches Anthropic, Ollama and Responses clients through these
functions; a plugin's tests import them from here (the test kit) rather than from
``werk_host.compat``, which is outside the plugin room (tests/test_plugin_imports.py).
"""

from __future__ import annotations

from werk_host.compat.ollama import Shape as OllamaShape
from werk_host.compat.ollama import answer as ollama_answer
from werk_host.compat.ollama import answer_stream as ollama_answer_stream
from werk_host.compat.responses import ResponsesRequest
from werk_host.compat.responses import chat_body as responses_chat_body
from werk_host.compat.upstream import sse_events

__all__ = [
    "OllamaShape",
    "ResponsesRequest",
    "ollama_answer",
    "ollama_answer_stream",
    "responses_chat_body",
    "sse_events",
]
