"""The OpenAI Responses API (``POST /v1/responses``) through ``werk serve`` on a real llama-server
running the real SmolLM2-135M-Instruct, with the ``openai`` SDK's ``responses.create`` and
``responses.stream`` (docs/compat.md, "OpenAI Responses").

A text answer, streamed and not, whose ``usage.input_tokens`` equals
``/werk/v1/chat/count_tokens`` of the chat request the translation makes; a forced function call
(a named function and ``"required"``) whose arguments arrive as
``response.function_call_arguments.delta`` events and, non-streamed, as a ``function_call``
item, each valid against the tool's parameters; the follow-up turn with its
``function_call_output`` completes with text; Codex CLI's recorded first request (its tools,
``namespace`` and ``web_search`` included, a short input) streams to ``response.completed``; an
``input_image`` is a 400 on SmolLM2, which has no projector;
a client that leaves in the middle of an answer, streamed or not, stops the generation in the
llama-server child (seen in its own ``/slots`` and ``/metrics``).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from test_llamacpp_sdks import KEY as LOCAL_KEY
from test_llamacpp_sdks import LONG, STORY, Local, _read_until, _send, _wait_idle
from test_llamacpp_sdks import local as local  # the fixture: ``werk serve``'s host in this process
from werk_llamacpp.process import ENV_ARGS

from werk_host.plugin import ModelManifest
from werk_host.testing.api import Api
from werk_host.testing.host import ModelRegistry
from werk_host.testing.hosts import serve_process
from werk_host.testing.translations import ResponsesRequest, responses_chat_body

pytestmark = pytest.mark.llamaserver
KEY = "sk-werk-responses-test-7741"
MODEL = "smollm2"
REPO = Path(__file__).resolve().parents[3]
#: Codex CLI 0.171.0's first request, recorded (tests/compat/fixtures/agents/).
CODEX_FIRST = REPO / "tests" / "compat" / "fixtures" / "agents" / "codex_responses.json"
INSTRUCTIONS = "You are a helpful assistant. Answer in one short sentence."
ASK = "What is the weather in Paris?"
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "name": "get_weather", "description": "Weather in a city", "parameters": WEATHER},
    {"type": "web_search"},  # accepted and left out (docs/compat.md)
]
NAMED = {"type": "function", "name": "get_weather"}
ANSWER_TOKENS = 24


@dataclass
class Served:
    url: str
    api: Api

    def count(self, **request: Any) -> int:
        """Werk's exact count of the chat request a Responses request translates to."""
        body = responses_chat_body(ResponsesRequest.model_validate({"model": MODEL, **request}))
        counted = {k: v for k, v in body.items() if k in ("model", "messages", "tools", "tool_choice")}
        status, answer = self.api.post("/werk/v1/chat/count_tokens", counted)
        assert status == 200, answer
        tokens: int = answer["data"]["input_tokens"]
        return tokens

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, llama_server_path: Path, smollm2_gguf: Path) -> Iterator[Served]:
    """``werk serve --model smollm2`` in its own process, keyed."""
    root = tmp_path_factory.mktemp("responses")
    home = root / "home"
    home.mkdir()
    ModelRegistry(home).add(ModelManifest.from_paths(MODEL, [smollm2_gguf], backend="llama.cpp"))
    environ = {"WERK_LLAMA_SERVER": str(llama_server_path)}
    with serve_process(home, "--model", MODEL, keys=(KEY,), env=environ, drop=(ENV_ARGS,)) as served:
        url = served.url
        yield Served(url, Api(url, KEY))


def _weather(arguments: str) -> dict[str, Any]:
    """The parsed arguments of a ``get_weather`` call, checked against its parameters."""
    value = json.loads(arguments)
    assert isinstance(value, dict) and set(value) == {"city", "unit"}, value
    assert isinstance(value["city"], str) and value["unit"] in ("celsius", "fahrenheit"), value
    return value


# -- text ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["create", "create-stream", "stream-helper"])
def test_a_text_answer_with_exact_usage(served: Served, mode: str) -> None:
    options: dict[str, Any] = {
        "model": MODEL,
        "instructions": INSTRUCTIONS,
        "input": "What is the capital of France?",
        "max_output_tokens": ANSWER_TOKENS,
        "temperature": 0,
    }
    with served.client() as client:
        if mode == "create":
            answer = client.responses.create(**options)
        elif mode == "create-stream":
            events = list(client.responses.create(stream=True, **options))
            assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
            assert events[-1].type in ("response.completed", "response.incomplete")
            answer = events[-1].response
            deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
            assert deltas == answer.output_text
        else:
            with client.responses.stream(**options) as stream:
                deltas = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
                answer = stream.get_final_response()
            assert deltas == answer.output_text
    assert answer.output_text.strip() and answer.status in ("completed", "incomplete")
    assert answer.usage is not None and 0 < answer.usage.output_tokens <= ANSWER_TOKENS
    assert answer.usage.input_tokens == served.count(instructions=INSTRUCTIONS, input=options["input"])
    assert answer.usage.total_tokens == answer.usage.input_tokens + answer.usage.output_tokens


# -- forced function calls -----------------------------------------------------------------------------


@pytest.mark.parametrize("choice", [NAMED, "required"], ids=["named", "required"])
def test_a_forced_call_non_streamed_then_its_output_completes(served: Served, choice: Any) -> None:
    options: dict[str, Any] = {"model": MODEL, "tools": TOOLS, "tool_choice": choice, "max_output_tokens": 64}
    with served.client() as client:
        answer = client.responses.create(input=ASK, **options)
        calls = [item for item in answer.output if item.type == "function_call"]
        assert answer.status == "completed" and len(calls) == 1, answer.output
        call = calls[0]
        assert call.name == "get_weather" and call.call_id and call.status == "completed"
        _weather(call.arguments)
        assert answer.usage is not None
        assert answer.usage.input_tokens == served.count(input=ASK, tools=TOOLS, tool_choice=choice)
        # the follow-up turn: the call and its output passed back, no tool forced
        followup: list[Any] = [
            {"role": "user", "content": ASK},
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature": 18}'},
        ]
        final = client.responses.create(model=MODEL, input=followup, tools=TOOLS, max_output_tokens=ANSWER_TOKENS)
    assert final.status in ("completed", "incomplete") and final.output_text.strip()
    assert final.usage is not None and final.usage.input_tokens == served.count(input=followup, tools=TOOLS)


@pytest.mark.parametrize("choice", [NAMED, "required"], ids=["named", "required"])
def test_a_forced_call_streams_its_arguments(served: Served, choice: Any) -> None:
    with (
        served.client() as client,
        client.responses.stream(
            model=MODEL,
            input=ASK,
            tools=TOOLS,
            tool_choice=choice,
            max_output_tokens=64,
        ) as stream,
    ):
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    added = [e for e in events if e.type == "response.output_item.added" and e.item.type == "function_call"]
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(added) == 1 and deltas and len(done) == 1, kinds
    assert "".join(deltas) == done[0].arguments
    assert kinds.index("response.function_call_arguments.done") < kinds.index("response.completed")
    calls = [item for item in final.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].arguments == done[0].arguments
    _weather(calls[0].arguments)
    assert final.usage is not None
    assert final.usage.input_tokens == served.count(input=ASK, tools=TOOLS, tool_choice=choice)


# -- images --------------------------------------------------------------------------------------------

#: A 1x1 PNG.
PIXEL = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="


def test_an_image_is_400_on_a_model_without_a_projector(served: Served) -> None:
    content = [{"type": "input_text", "text": "What is this?"}, {"type": "input_image", "image_url": PIXEL}]
    with served.client() as client, pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=MODEL, input=[{"role": "user", "content": content}], max_output_tokens=8)
    assert refused.value.status_code == 400 and "text content parts only" in refused.value.message


# -- Codex ---------------------------------------------------------------------------------------------


def test_codex_first_request_shape_streams_to_completion(served: Served) -> None:
    """Codex's recorded body as sent (stream, developer and user input_text messages, its function
    tools, a namespace tool and web_search, reasoning summary, include, prompt_cache_key,
    client_metadata), with a short input so that it fits SmolLM2's context."""
    body = json.loads(CODEX_FIRST.read_text())["body"]
    body["model"] = MODEL
    body["input"] = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "say hi"}]},
    ]
    body["tools"] = [t for t in body["tools"] if t["type"] != "function" or t["name"] == "exec_command"]
    assert {t["type"] for t in body["tools"]} == {"function", "namespace", "web_search"}
    status, events = _sse(served, body)
    assert status == 200, events
    kinds = [e["type"] for e in events]
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete"), kinds
    final = events[-1]["response"]
    assert final["output"] and final["usage"]["input_tokens"] == served.count(
        **{k: body[k] for k in ("input", "tools", "tool_choice")}
    )


def _sse(served: Served, body: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
    """POST ``body`` as Codex does (``Accept: text/event-stream``); its events, parsed."""
    import http.client

    host, port = served.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    try:
        conn.request(
            "POST",
            "/v1/responses",
            json.dumps(body),
            {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json", "Accept": "text/event-stream"},
        )
        resp = conn.getresponse()
        text = resp.read().decode()
    finally:
        conn.close()
    if resp.status != 200:
        return resp.status, [json.loads(text)]
    events = []
    for block in text.strip().split("\n\n"):
        name, data = block.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        events.append(event)
    return resp.status, events


# -- a client that leaves stops the generation --------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_a_client_that_leaves_stops_the_generation(local: Local, stream: bool) -> None:
    body = {"model": MODEL, "input": STORY, "max_output_tokens": LONG, "temperature": 0, "stream": stream}
    before = local.predicted()
    counters = local.api.get("/werk/v1/observability")[1]["data"]["chat"]
    sock = _send(local, "/v1/responses", body, {"Authorization": f"Bearer {LOCAL_KEY}"})
    if stream:
        _read_until(sock, b"response.output_text.delta", 5)  # tokens are streaming back
    else:
        deadline = time.monotonic() + 30
        while not local.generating():  # generating, nothing sent back yet
            assert time.monotonic() < deadline
            time.sleep(0.01)
    assert local.generating()
    sock.shutdown(socket.SHUT_RDWR)  # the client goes away
    sock.close()
    _wait_idle(local, timeout=10, every=0.05 if stream else 1.3)
    predicted = local.predicted() - before
    assert predicted < LONG / 4, predicted  # stopped well before the end
    after = local.api.get("/werk/v1/observability")[1]["data"]["chat"]
    assert after["requests_active"] == 0 and after["requests_total"] == counters["requests_total"] + 1
    assert after["requests_failed"] == counters["requests_failed"]  # a client leaving is not a failure
