"""The official ``anthropic`` and ``ollama`` clients against a served host on the reference
backend: they parse every answer and error these routes give (the same clients run against a
real llama-server in plugins/llamacpp/tests/test_llamacpp_sdks.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import anthropic
import ollama
import pytest

from tests.compat.conftest import KEY

TURNS: list[anthropic.types.MessageParam] = [
    {"role": "user", "content": "one two three"},
    {"role": "assistant", "content": "one two three"},
    {"role": "user", "content": "four five six"},
]


@contextmanager
def _anthropic(url: str, key: str = KEY) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, timeout=30) as client:
        yield client


@contextmanager
def _ollama(url: str, key: str = KEY) -> Iterator[ollama.Client]:
    with ollama.Client(host=url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as client:
        yield client


def test_anthropic_sdk(served: str) -> None:
    with _anthropic(served) as client:
        reply = client.messages.create(model="tiny", max_tokens=8, system="short", messages=TURNS)
        counted = client.messages.count_tokens(model="tiny", system="short", messages=TURNS)
        with client.messages.stream(model="tiny", max_tokens=2, system="short", messages=TURNS) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
    assert [b.text for b in reply.content if b.type == "text"] == ["four five six"]
    assert reply.stop_reason == "end_turn" and reply.model == "tiny"
    assert reply.usage.input_tokens == counted.input_tokens > 0 and reply.usage.output_tokens == 3
    assert text == "four five" and final.stop_reason == "max_tokens"
    assert (final.usage.input_tokens, final.usage.output_tokens) == (counted.input_tokens, 2)


def test_anthropic_sdk_errors(served: str) -> None:
    with _anthropic(served, "sk-wrong") as stranger, pytest.raises(anthropic.AuthenticationError):
        stranger.messages.create(model="tiny", max_tokens=8, messages=TURNS)
    with _anthropic(served) as client:
        with pytest.raises(anthropic.NotFoundError) as missing:
            client.messages.create(model="nope", max_tokens=8, messages=TURNS)
        with pytest.raises(anthropic.BadRequestError) as bad:
            client.messages.create(model="tiny", max_tokens=8, messages=[{"role": "user", "content": "word " * 70}])
    assert missing.value.request_id is not None and missing.value.request_id.startswith("req_")
    assert "the context holds" in str(bad.value)


def test_ollama_client(served: str) -> None:
    turns = [dict(t) for t in TURNS]
    with _ollama(served) as client:
        assert [m.model for m in client.list().models] == ["tiny"]
        assert [m.model for m in client.ps().models] == ["tiny"]
        assert client.show("tiny").parameters == "num_ctx 64"
        reply = client.chat(model="tiny", messages=turns, options={"num_predict": 8})
        parts = list(client.chat(model="tiny", messages=turns, options={"num_predict": 2}, stream=True))
        generated = client.generate(model="tiny", prompt="seven eight", options={"num_predict": 8})
    assert reply.message.content == "four five six" and reply.done and reply.done_reason == "stop"
    assert reply.prompt_eval_count is not None and reply.eval_count == 3
    assert "".join(p.message.content or "" for p in parts) == "four five"
    last = parts[-1]
    assert last.done and last.done_reason == "length" and last.prompt_eval_count == reply.prompt_eval_count
    assert generated.response == "seven eight"


def test_ollama_client_errors(served: str) -> None:
    with _ollama(served, "sk-wrong") as stranger, pytest.raises(ollama.ResponseError) as unauthorized:
        stranger.list()
    assert unauthorized.value.status_code == 401
    with _ollama(served) as client:
        with pytest.raises(ollama.ResponseError) as missing:
            client.chat(model="nope", messages=[{"role": "user", "content": "x"}])
        with pytest.raises(ollama.ResponseError) as bad:
            list(client.chat(model="tiny", messages=[{"role": "user", "content": "word " * 70}], stream=True))
    assert missing.value.status_code == 404 and missing.value.error == 'model "nope" is not served here (served: tiny)'
    assert bad.value.status_code == 400 and "the context holds" in bad.value.error
