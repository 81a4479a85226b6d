"""werk_host.plugin.openai: the answers an in-process backend writes, read by the official
``openai`` SDK from a real local HTTP server (streamed and whole, chat and text, errors) and
parsed event by event."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import openai
import pytest

from werk_host.plugin import InferenceResponse
from werk_host.plugin.openai import SSE_DONE, Reply, Usage, error_answer, error_event

MODEL = "tiny"
WORDS = ["Paris", " is", " the", " capital", " café"]
USAGE = Usage(prompt_tokens=7, completion_tokens=len(WORDS), cached_tokens=3)

Answer = Callable[[dict[str, Any]], InferenceResponse]


def _answer(body: dict[str, Any]) -> InferenceResponse:
    """What a backend hook would return for ``body``: the builders over a fixed text."""
    reply = Reply("chat" if "messages" in body else "text", MODEL)
    if body.get("model") == "refuse":
        return error_answer(400, "this model takes no requests", code="model_refused", param="model")
    if not body.get("stream"):
        return reply.answer("".join(WORDS), "stop", USAGE)
    include = bool((body.get("stream_options") or {}).get("include_usage"))

    def events() -> Iterator[bytes]:
        for word in WORDS:
            yield reply.chunk(word)
        if body.get("model") == "break":
            yield error_event("the engine failed this request")
            return
        yield reply.end("length", USAGE, include_usage=include)

    return reply.stream(events())


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # the body of a stream ends where the connection closes
    answer: Answer = staticmethod(_answer)

    def do_POST(self) -> None:  # noqa: N802 - the http.server name
        length = int(self.headers.get("Content-Length", "0"))
        response = self.answer(json.loads(self.rfile.read(length)))
        self.send_response(response.status)
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.end_headers()
        try:
            for part in response.body:
                self.wfile.write(part)
                self.wfile.flush()
        finally:
            response.close()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the http.server name
        return None


@pytest.fixture(scope="module")
def client() -> Iterator[openai.OpenAI]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-test", max_retries=0, timeout=30)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


MESSAGES: Any = [{"role": "user", "content": "What is the capital of France?"}]


def test_a_whole_chat_answer_reads_through_the_sdk(client: openai.OpenAI) -> None:
    done = client.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert done.object == "chat.completion" and done.id.startswith("chatcmpl-") and done.model == MODEL
    assert done.choices[0].message.role == "assistant"
    assert done.choices[0].message.content == "Paris is the capital café"
    assert done.choices[0].finish_reason == "stop"
    assert done.usage is not None
    assert (done.usage.prompt_tokens, done.usage.completion_tokens, done.usage.total_tokens) == (7, 5, 12)
    assert done.usage.prompt_tokens_details is not None and done.usage.prompt_tokens_details.cached_tokens == 3


def test_a_streamed_chat_answer_ends_with_its_usage(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.choices[0].delta.role is None for c in chunks[1:])
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Paris is the capital café"
    assert len({c.id for c in chunks}) == 1 and {c.object for c in chunks} == {"chat.completion.chunk"}
    assert [c.choices[0].finish_reason for c in chunks][-2:] == [None, "length"]
    assert [c.usage is not None for c in chunks] == [False] * len(WORDS) + [True]  # the final chunk's
    usage = chunks[-1].usage
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (7, 5, 12)


def test_include_usage_sends_the_usage_in_its_own_chunk(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[-2].choices[0].finish_reason == "length" and chunks[-2].usage is None
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens == 12


def test_text_completions_whole_and_streamed(client: openai.OpenAI) -> None:
    whole = client.completions.create(model=MODEL, prompt="The capital of France is")
    assert whole.object == "text_completion" and whole.id.startswith("cmpl-")
    assert whole.choices[0].text == "Paris is the capital café" and whole.choices[0].finish_reason == "stop"
    assert whole.usage is not None and whole.usage.completion_tokens == 5
    pieces = list(client.completions.create(model=MODEL, prompt="The capital of France is", stream=True))
    assert "".join(p.choices[0].text for p in pieces) == "Paris is the capital café"
    assert pieces[-1].choices[0].finish_reason == "length"
    assert pieces[-1].usage is not None and pieces[-1].usage.prompt_tokens == 7


def test_an_error_answer_is_the_sdks_typed_error(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="refuse", messages=MESSAGES)
    assert caught.value.status_code == 400
    assert caught.value.code == "model_refused" and caught.value.param == "model"
    assert caught.value.type == "invalid_request_error"
    assert caught.value.message.endswith(" - this model takes no requests")  # the SDK prefixes the status


def test_an_error_event_ends_a_stream_as_an_sdk_error(client: openai.OpenAI) -> None:
    seen: list[str] = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in client.chat.completions.create(model="break", messages=MESSAGES, stream=True):
            seen.append(chunk.choices[0].delta.content or "")
    assert "".join(seen) == "Paris is the capital café"
    assert caught.value.message == "the engine failed this request"
    assert caught.value.code == "internal" and caught.value.type == "server_error"


def _events(response: InferenceResponse) -> list[bytes]:
    raw = b"".join(response.body)
    assert raw.endswith(b"\n\n")
    return raw[:-2].split(b"\n\n")


def test_the_stream_is_server_sent_events_ending_in_done() -> None:
    reply = Reply("chat", MODEL)
    response = reply.stream(iter([reply.chunk("hé"), reply.end("stop", Usage(2, 1))]))
    assert response.status == 200 and response.headers["Content-Type"] == "text/event-stream"
    events = _events(response)
    assert events[-1] + b"\n\n" == SSE_DONE
    docs = [json.loads(e.removeprefix(b"data: ")) for e in events[:-1]]
    assert all(e.startswith(b"data: ") for e in events)
    assert "hé".encode() in events[0]  # UTF-8, not \u escapes
    assert docs[0]["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": "hé"}, "logprobs": None, "finish_reason": None}
    ]
    assert docs[1]["choices"] == [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]
    assert docs[1]["usage"] == {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}
    assert {d["id"] for d in docs} == {reply.id} and {d["created"] for d in docs} == {reply.created}


def test_a_whole_answer_has_its_length_and_no_cached_count_unless_known() -> None:
    response = Reply("text", MODEL).answer("four", "length", Usage(3, 1))
    body = b"".join(response.body)
    assert response.headers == {"Content-Type": "application/json", "Content-Length": str(len(body))}
    doc = json.loads(body)
    assert doc["usage"] == {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    assert doc["choices"] == [{"index": 0, "text": "four", "logprobs": None, "finish_reason": "length"}]


def test_error_answers_pick_their_type_by_status() -> None:
    response = error_answer(503, "the engine is loading", code="unavailable")
    assert response.status == 503
    doc = json.loads(b"".join(response.body))
    assert doc == {
        "error": {"message": "the engine is loading", "type": "server_error", "param": None, "code": "unavailable"}
    }
    events = error_event("gone", code="backend_error").split(b"\n\n")
    assert json.loads(events[0].removeprefix(b"data: "))["error"]["code"] == "backend_error"
    assert events[1] + b"\n\n" == SSE_DONE
