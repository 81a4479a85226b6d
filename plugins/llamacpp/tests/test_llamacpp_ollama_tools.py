"""The rest of Ollama's ``/api/chat`` with the official ``ollama`` SDK against ``werk serve`` on a
real llama-server running the real SmolLM2-135M-Instruct: tools, a tool-result turn, ``format``
with a JSON schema, ``think`` and ``images`` against what the instance has shown, options
(applied, or ignored as Ollama ignores them), ``/api/show`` capabilities and ``/api/embed``.

Ollama's API cannot force a tool call (it has no ``tool_choice``) and SmolLM2 does not call
tools on its own, so the translation of tool calls is checked on real OpenAI answers: the same
server's ``/v1/chat/completions`` with a forced call (JSON and streamed), fed through the Ollama
answer translation. Nothing here may be answered with a 5xx.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ollama
import pytest
from werk_llamacpp.process import ENV_ARGS

from werk_host.plugin import ModelManifest
from werk_host.testing.host import ModelRegistry
from werk_host.testing.hosts import serve_process
from werk_host.testing.translations import OllamaShape, ollama_answer, ollama_answer_stream, sse_events

pytestmark = pytest.mark.llamaserver
KEY = "sk-werk-ollama-tools-5521"
MODEL = "smollm2"
#: A 1x1 PNG.
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4//8/AAX+Av4N70a4AAAAAElFTkSuQmCC"
WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory, llama_server_path: Path, smollm2_gguf: Path) -> Iterator[str]:
    """``werk serve --model smollm2`` in its own process, keyed."""
    root = tmp_path_factory.mktemp("ollama-tools")
    home = root / "home"
    home.mkdir()
    ModelRegistry(home).add(ModelManifest.from_paths(MODEL, [smollm2_gguf], backend="llama.cpp"))
    environ = {"WERK_LLAMA_SERVER": str(llama_server_path)}
    with serve_process(home, "--model", MODEL, keys=(KEY,), env=environ, drop=(ENV_ARGS,)) as served:
        yield served.url


@pytest.fixture
def client(url: str) -> Iterator[ollama.Client]:
    with ollama.Client(host=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as sdk:
        yield sdk


def _refusal(call: Any) -> ollama.ResponseError:
    with pytest.raises(ollama.ResponseError) as err:
        call()
    assert 400 <= err.value.status_code < 500, err.value
    return err.value


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_tools_and_a_tool_result_turn_are_answered(client: ollama.Client, stream: bool) -> None:
    options = {"num_predict": 24, "temperature": 0}
    if stream:
        parts = list(client.chat(model=MODEL, messages=ASK, tools=[WEATHER], options=options, stream=True))
        assert parts[-1].done and all(not p.done for p in parts[:-1])
    else:
        assert client.chat(model=MODEL, messages=ASK, tools=[WEATHER], options=options).done
    # the follow-up turn: the call (as Ollama gives it back) and its result
    turn = [
        *ASK,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": "18 degrees celsius and sunny", "tool_name": "get_weather"},
    ]
    if stream:
        parts = list(client.chat(model=MODEL, messages=turn, tools=[WEATHER], options=options, stream=True))
        text, done = "".join(p.message.content or "" for p in parts), parts[-1]
    else:
        done = client.chat(model=MODEL, messages=turn, tools=[WEATHER], options=options)
        text = done.message.content or ""
    assert text.strip() and done.done_reason in ("stop", "length") and done.prompt_eval_count


def _v1(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    host, _, port = url.removeprefix("http://").partition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
        conn.request("POST", "/v1/chat/completions", json.dumps(body), headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_real_openai_tool_calls_become_ollamas(url: str, stream: bool) -> None:
    """A forced call on the same server's ``/v1`` path (what the host makes real on llama.cpp),
    translated as the Ollama routes translate the backend's answers."""
    forced = {"type": "function", "function": {"name": "get_weather"}}
    body = {
        "model": MODEL,
        "messages": ASK,
        "tools": [WEATHER],
        "tool_choice": forced,
        "max_tokens": 48,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    status, raw = _v1(url, body)
    assert status == 200, raw[:400]
    if stream:
        lines = b"".join(ollama_answer_stream(sse_events([raw]), OllamaShape.CHAT, MODEL, 0))
        docs = [json.loads(line) for line in lines.decode().splitlines()]
        called = [d for d in docs if d.get("message", {}).get("tool_calls")]
        assert len(called) == 1 and docs[-1]["done"] is True and docs[-1]["done_reason"] == "stop", docs
        calls = called[0]["message"]["tool_calls"]
    else:
        done = ollama_answer(json.loads(raw), OllamaShape.CHAT, MODEL, 0)
        assert done["done_reason"] == "stop", done
        calls = done["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather"]
    assert isinstance(calls[0]["function"]["arguments"].get("city"), str) and calls[0]["id"]
    # what the SDK makes of it
    message = ollama.Message.model_validate({"role": "assistant", "content": "", "tool_calls": calls})
    assert message.tool_calls is not None and message.tool_calls[0].function.name == "get_weather"


def test_format_with_a_json_schema_constrains_the_answer(client: ollama.Client) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}, "sunny": {"type": "boolean"}},
        "required": ["city", "sunny"],
    }
    for stream in (False, True):
        question = [{"role": "user", "content": "Is it sunny in Paris today? Answer in JSON."}]
        options = {"num_predict": 64, "temperature": 0}
        if stream:
            text = "".join(
                p.message.content or ""
                for p in client.chat(model=MODEL, messages=question, format=schema, options=options, stream=True)
            )
        else:
            text = client.chat(model=MODEL, messages=question, format=schema, options=options).message.content or ""
        answer = json.loads(text)
        assert set(answer) == {"city", "sunny"} and answer["city"] in ("Paris", "Rome"), answer
        assert isinstance(answer["sunny"], bool)


def test_show_capabilities_come_from_the_instance(client: ollama.Client) -> None:
    client.chat(model=MODEL, messages=ASK, options={"num_predict": 1})  # running: its evidence is there
    shown = client.show(f"{MODEL}:latest")
    # SmolLM2 takes tools (its server renders requests with them), has no verified reasoning
    # profile and no multimodal projector
    assert shown.capabilities == ["completion", "tools"]


def test_think_images_and_embed_are_refused_in_ollamas_shape(client: ollama.Client) -> None:
    thinking = _refusal(lambda: client.chat(model=MODEL, messages=ASK, think=True, options={"num_predict": 4}))
    assert thinking.status_code == 400 and thinking.error == f'"{MODEL}" does not support thinking'
    assert client.chat(model=MODEL, messages=ASK, think=False, options={"num_predict": 4}).done
    picture = [{"role": "user", "content": "What is in this picture?", "images": [PNG]}]
    images = _refusal(lambda: client.chat(model=MODEL, messages=picture))
    assert images.error == f'"{MODEL}" does not support images: the instance serving it takes text only'
    with pytest.raises(ollama.ResponseError) as embed:
        client.embed(model=MODEL, input="hello")
    assert embed.value.status_code == 400 and "does not support embeddings" in embed.value.error


def _text(client: ollama.Client, options: dict[str, Any]) -> str:
    reply = client.chat(model=MODEL, messages=[{"role": "user", "content": "Tell me a story."}], options=options)
    assert reply.eval_count is not None and reply.eval_count <= options["num_predict"]
    return reply.message.content or ""


def test_options_are_applied_or_ignored_as_ollama_does(client: ollama.Client) -> None:
    hot = {"num_predict": 24, "temperature": 2.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    # seed and temperature reach the sampler: the same seed samples the same text, another does not
    assert _text(client, {**hot, "seed": 7}) == _text(client, {**hot, "seed": 7})
    assert _text(client, {**hot, "seed": 7}) != _text(client, {**hot, "seed": 8})
    # num_predict is respected; above the ceiling it is clamped, not refused
    short = client.chat(model=MODEL, messages=ASK, options={"num_predict": 3, "temperature": 0})
    assert short.eval_count == 3 and short.done_reason == "length"
    clamped = client.chat(model=MODEL, messages=ASK, options={"num_predict": 1 << 30, "temperature": 0, "stop": ["."]})
    assert clamped.done
    # options Ollama itself ignores, and those that cannot change a running instance
    ignored = {"mirostat": 2, "tfs_z": 0.5, "penalize_newline": True, "num_ctx": 1 << 20, "numa": True, "made_up": 1}
    assert client.chat(model=MODEL, messages=ASK, options={**ignored, "num_predict": 4, "repeat_penalty": 1.3}).done
    wrong = _refusal(lambda: client.chat(model=MODEL, messages=ASK, options={"temperature": "warm"}))
    assert "temperature" in wrong.error
