"""Tool shapes and ``/v1/completions`` admission on a real llama-server (issue 28, items 7, 8).

llama-server itself rejects malformed tools (the host relayed that as 502 ``backend_error``,
and a count of them as 503 ``unavailable``); the host now refuses them as 400 before the child
sees them. Valid tools, in whatever member order the client wrote them, are counted exactly as
the chat renders them (the template renders each tool with ``tojson``). ``/v1/completions`` and
Ollama's ``raw`` generate are admitted like chat: the output ceiling (a ceiling Ollama clamps) and the context.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from werk_llamacpp.process import ENV_ARGS

from werk_host.plugin import HostConfig, ModelManifest
from werk_host.testing.api import Api
from werk_host.testing.host import ModelRegistry, build_host
from werk_host.testing.hosts import running

pytestmark = pytest.mark.llamaserver
KEY = "sk-werk-tools-test-0123456789"
MODEL = "tools"
CONTEXT = 512  # -c 1024 over -np 2
CEILING = 64

#: ChatML that renders each tool as JSON (so a count proves which JSON was rendered).
TEMPLATE = """\
{%- if tools %}<|im_start|>system
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}<|im_end|>
{% endif %}
{%- for message in messages %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

QUESTION: list[dict[str, Any]] = [{"role": "user", "content": "what is the weather in paris?"}]
BAD_TOOLS: list[Any] = [
    [{}],
    [{"type": "function"}],
    [{"type": "function", "function": {}}],
    [{"type": "code_interpreter"}],
]


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory, llama_server_path: Path, tiny_model: Path) -> Iterator[Api]:
    root = tmp_path_factory.mktemp("tools")
    home = root / "home"
    home.mkdir()
    manifest = ModelManifest.from_paths(MODEL, [tiny_model], backend="llama.cpp", params={"max_output_tokens": CEILING})
    ModelRegistry(home).add(manifest)
    (root / "chat.jinja").write_text(TEMPLATE)
    config = HostConfig(
        home=home,
        api_keys=(KEY,),
        model=MODEL,
        backend_options={
            "llamacpp": {"llama_server": str(llama_server_path), "parallel": 2, "ctx": 2 * CONTEXT, "threads": 1}
        },
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ENV_ARGS, f"--chat-template-file {shlex.quote(str(root / 'chat.jinja'))}")
        host = build_host(config)
    with running(host) as base:
        yield Api(base, KEY)


@pytest.mark.parametrize("tools", BAD_TOOLS, ids=["empty", "no-function", "empty-function", "code-interpreter"])
def test_malformed_tools_are_400_everywhere(api: Api, tools: Any) -> None:
    status, doc = api.post(
        "/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "tools": tools, "max_tokens": 2}
    )
    assert status == 400 and doc["error"]["code"] == "invalid_request", doc
    for path in ("/werk/v1/chat/count_tokens", "/werk/v1/chat/admission"):
        status, doc = api.post(path, {"messages": QUESTION, "tools": tools})
        assert status == 400 and doc["error"]["code"] == "invalid_request", (path, doc)
        assert doc["error"]["retryable"] is False


@pytest.mark.parametrize("calls", ["x", [{}]])
def test_malformed_tool_calls_are_400(api: Api, calls: Any) -> None:
    messages = [*QUESTION, {"role": "assistant", "content": None, "tool_calls": calls}]
    status, doc = api.post("/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 2})
    assert status == 400 and doc["error"]["code"] == "invalid_request", doc


def test_valid_tools_are_counted_as_the_chat_renders_them(api: Api) -> None:
    """Members in an unusual order and an extra member: the count equals the chat's usage."""
    tool = {
        "function": {
            "parameters": {"properties": {"city": {"type": "string"}}, "type": "object"},
            "name": "get_weather",
            "description": "the weather in a city",
        },
        "type": "function",
    }
    status, counted = api.post("/werk/v1/chat/count_tokens", {"messages": QUESTION, "tools": [tool]})
    assert status == 200, counted
    body = {"model": MODEL, "messages": QUESTION, "tools": [tool], "max_tokens": 2, "temperature": 0}
    status, answer = api.post("/v1/chat/completions", body)
    assert status == 200, answer
    assert answer["usage"]["prompt_tokens"] == counted["data"]["input_tokens"]


def test_completions_are_admitted(api: Api) -> None:
    status, doc = api.post("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": CEILING + 1})
    assert status == 400 and doc["error"]["code"] == "output_limit_exceeded", doc
    status, doc = api.post("/v1/completions", {"model": MODEL, "prompt": "x " * (2 * CONTEXT), "max_tokens": 8})
    assert status == 400 and doc["error"]["code"] == "context_length_exceeded", doc
    status, doc = api.post("/v1/completions", {"model": MODEL, "prompt": [1] * CONTEXT, "max_tokens": 8})
    assert status == 400 and doc["error"]["code"] == "context_length_exceeded", doc
    for bad in ({"model": True}, {"model": []}, {"max_tokens": 0}, {"max_tokens": 1.5}):
        status, doc = api.post("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2, **bad})
        assert status == 400 and doc["error"]["code"] == "invalid_request", (bad, doc)
    status, doc = api.post("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 3, "ignore_eos": True})
    assert status == 200 and doc["usage"]["completion_tokens"] == 3, doc


def test_ollama_raw_generate_is_admitted(api: Api) -> None:
    body: dict[str, Any] = {"model": MODEL, "prompt": "hi", "raw": True, "stream": False}
    # num_predict is a ceiling in Ollama's API: above the model's it is clamped, not refused
    # (docs/compat.md, "Output budget")
    status, doc = api.post("/api/generate", {**body, "options": {"num_predict": 100_000}})
    assert status == 200 and 0 < doc["eval_count"] <= CEILING, doc
    status, doc = api.post("/api/generate", {**body, "options": {"num_predict": 3}})
    assert status == 200 and doc["eval_count"] <= 3, doc
