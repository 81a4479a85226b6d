"""Admission on ``/v1/completions`` and Ollama's ``raw`` generate (issue 28, item 8): the body
is validated as OpenAI's completions request, and the output ceiling and context are enforced
as on the chat route, in each API's own error shape, before the backend is called."""

from __future__ import annotations

from typing import Any

import falcon.testing
import pytest

from tests.compat.conftest import KEY
from werk_host.testing.reference import CONTEXT_TOKENS, MAX_OUTPUT_TOKENS

AUTH = {"Authorization": f"Bearer {KEY}"}


def _post(client: falcon.testing.TestClient, path: str, body: object) -> falcon.testing.Result:
    return client.simulate_post(path, json=body, headers=AUTH)


def _chat_stats(client: falcon.testing.TestClient) -> dict[str, int]:
    stats: dict[str, int] = client.simulate_get("/werk/v1/observability", headers=AUTH).json["data"]["chat"]
    return stats


def _openai_error(result: falcon.testing.Result) -> dict[str, Any]:
    assert result.status_code == 400, result.text
    error: dict[str, Any] = result.json["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    return error


@pytest.mark.parametrize(
    "body",
    [
        {"model": True, "prompt": "hi"},
        {"model": 0, "prompt": "hi"},
        {"model": [], "prompt": "hi"},
        {"model": {}, "prompt": "hi"},
        {"model": "tiny", "prompt": "hi", "max_tokens": 0},
        {"model": "tiny", "prompt": "hi", "max_tokens": 1.5},
        {"model": "tiny", "prompt": "hi", "max_tokens": True},
        {"model": "tiny", "prompt": "hi", "max_tokens": "2"},
        {"model": "tiny"},
        {"model": "tiny", "prompt": []},
        {"model": "tiny", "prompt": [1, "two"]},
        {"model": "tiny", "prompt": [[]]},
        {"model": "tiny", "prompt": [-1]},
        {"model": "tiny", "prompt": True},
        {"model": "tiny", "prompt": "hi", "stream": "yes"},
        {"model": "tiny", "prompt": "hi", "n": 0},
        {"model": "tiny", "prompt": "hi", "echo": 1},
        {"model": "tiny", "prompt": "hi", "stop": 5},
        {"model": "tiny", "prompt": "hi", "temperature": "hot"},
    ],
)
def test_malformed_completions_are_400(client: falcon.testing.TestClient, body: dict[str, Any]) -> None:
    before = _chat_stats(client)["requests_total"]
    assert _openai_error(_post(client, "/v1/completions", {"max_tokens": 2, **body}))["code"] == "invalid_request"
    assert _chat_stats(client)["requests_total"] == before  # the backend never saw it


def test_an_unknown_model_is_404(client: falcon.testing.TestClient) -> None:
    result = _post(client, "/v1/completions", {"model": "nope", "prompt": "hi", "max_tokens": 2})
    assert result.status_code == 404 and result.json["error"]["code"] == "model_not_found", result.text


def test_output_above_the_ceiling_is_refused(client: falcon.testing.TestClient) -> None:
    before = _chat_stats(client)
    result = _post(client, "/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": MAX_OUTPUT_TOKENS + 1})
    assert _openai_error(result)["code"] == "output_limit_exceeded"
    after = _chat_stats(client)
    assert after["requests_rejected"] == before["requests_rejected"] + 1
    assert after["requests_total"] == before["requests_total"]
    # without max_tokens the request is admitted as 256 output tokens, as on the chat route
    assert _openai_error(_post(client, "/v1/completions", {"prompt": "hi"}))["code"] == "output_limit_exceeded"


@pytest.mark.parametrize(
    "prompt",
    [
        "x" * (3 * CONTEXT_TOKENS),  # the estimate: one token per 3 bytes
        list(range(CONTEXT_TOKENS)),
        [[1, 2], list(range(CONTEXT_TOKENS))],  # each prompt must fit
        ["short", "y" * (3 * CONTEXT_TOKENS)],
    ],
    ids=["text", "token ids", "token-id prompts", "text prompts"],
)
def test_input_beyond_the_context_is_refused(client: falcon.testing.TestClient, prompt: object) -> None:
    result = _post(client, "/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": 1})
    assert _openai_error(result)["code"] == "context_length_exceeded"


def test_admitted_completions_keep_unknown_options(client: falcon.testing.TestClient) -> None:
    body = {"model": "tiny", "prompt": ["one two", "three"], "max_tokens": 8, "ignore_eos": True}
    result = _post(client, "/v1/completions", body)
    assert result.status_code == 200, result.text
    assert [c["text"] for c in result.json["choices"]] == ["one two", "three"]
    near = "x" * (3 * (CONTEXT_TOKENS - 4))
    assert _post(client, "/v1/completions", {"prompt": near, "max_tokens": 4, "seed": 1}).status_code == 200


@pytest.mark.parametrize("num_predict", [MAX_OUTPUT_TOKENS + 1, 100_000])
def test_ollama_raw_generate_is_admitted(client: falcon.testing.TestClient, num_predict: int) -> None:
    """``num_predict`` is a ceiling (docs/compat.md, "Output budget"): above the model's it is
    clamped to the ceiling, then to what the context leaves after the (estimated) input."""
    before = _chat_stats(client)
    body = {"model": "tiny", "prompt": "one two", "raw": True, "stream": False, "options": {"num_predict": num_predict}}
    result = _post(client, "/api/generate", body)
    assert result.status_code == 200, result.text
    applied = int(result.headers["x-werk-max-tokens-applied"])
    assert applied <= MAX_OUTPUT_TOKENS and applied + 3 == CONTEXT_TOKENS  # "one two": 7 bytes, 3 estimated tokens
    after = _chat_stats(client)
    assert after["requests_rejected"] == before["requests_rejected"]
    assert after["requests_total"] == before["requests_total"] + 1
    assert after["requests_clamped"] == before["requests_clamped"] + 1


def test_ollama_raw_generate_beyond_the_context_is_refused(client: falcon.testing.TestClient) -> None:
    prompt = "x" * (3 * CONTEXT_TOKENS)
    body = {"model": "tiny", "prompt": prompt, "raw": True, "stream": False, "options": {"num_predict": 1}}
    result = _post(client, "/api/generate", body)
    assert result.status_code == 400 and "context" in result.json["error"], result.text
    body["prompt"] = "one two"
    assert _post(client, "/api/generate", body).status_code == 200
