"""The output budget (docs/compat.md, "Output budget"): a ``max_tokens`` above the instance's
ceiling is clamped on the Anthropic and Ollama routes (to the ceiling and to what the context
leaves after the input), named in ``X-Werk-Max-Tokens-Applied`` and counted in
``requests_clamped``; ``/v1`` keeps ``output_limit_exceeded`` unless the instance's profile says
``output_limit = "clamp"``. The reference backend serves a 64-token context and a 63-token
output ceiling, and echoes the last message."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import falcon.testing
import pytest

from tests.compat.conftest import KEY
from werk_host.deployments.profile import ProfileError, parse_profile
from werk_host.server import Host
from werk_host.testing.hosts import backend_host
from werk_host.testing.reference import CONTEXT_TOKENS, MAX_OUTPUT_TOKENS

AUTH = {"Authorization": f"Bearer {KEY}"}
#: three words and the reference's two per message: 5 input tokens
WORDS = [{"role": "user", "content": "one two three"}]
INPUT = 5
PROFILE = '[[instance]]\nid = "tiny"\nmodel = "tiny"\noutput_limit = "clamp"\n'


def _clamped(client: falcon.testing.TestClient) -> int:
    count: int = client.simulate_get("/werk/v1/observability", headers=AUTH).json["data"]["chat"]["requests_clamped"]
    return count


def test_anthropic_max_tokens_is_a_ceiling(client: falcon.testing.TestClient) -> None:
    before = _clamped(client)
    body = {"model": "tiny", "max_tokens": 32000, "messages": WORDS}
    result = client.simulate_post("/v1/messages", json=body, headers=AUTH)
    assert result.status_code == 200, result.text
    # the ceiling (63) then the context: 64 - 5 input tokens
    assert result.headers["x-werk-max-tokens-applied"] == str(CONTEXT_TOKENS - INPUT)
    assert result.json["usage"] == {"input_tokens": INPUT, "output_tokens": 3}
    streamed = client.simulate_post("/v1/messages", json={**body, "stream": True}, headers=AUTH)
    assert streamed.status_code == 200 and streamed.headers["x-werk-max-tokens-applied"] == str(CONTEXT_TOKENS - INPUT)
    fits = client.simulate_post("/v1/messages", json={**body, "max_tokens": 10}, headers=AUTH)
    assert fits.status_code == 200 and "x-werk-max-tokens-applied" not in fits.headers
    assert _clamped(client) == before + 2


def test_an_input_that_leaves_no_room_is_still_refused(client: falcon.testing.TestClient) -> None:
    body = {"model": "tiny", "max_tokens": 32000, "messages": [{"role": "user", "content": "word " * 70}]}
    result = client.simulate_post("/v1/messages", json=body, headers=AUTH)
    assert result.status_code == 400 and "the context holds" in result.json["error"]["message"]


def test_ollama_num_predict_is_a_ceiling(client: falcon.testing.TestClient) -> None:
    before = _clamped(client)
    body: dict[str, Any] = {"model": "tiny", "messages": WORDS, "stream": False, "options": {"num_predict": 5000}}
    result = client.simulate_post("/api/chat", json=body, headers=AUTH)
    assert result.status_code == 200, result.text
    assert result.headers["x-werk-max-tokens-applied"] == str(CONTEXT_TOKENS - INPUT)
    assert result.json["message"]["content"] == "one two three"
    # no num_predict: the 256 tokens admission assumes are above the ceiling, and clamped too
    assert client.simulate_post("/api/chat", json={**body, "options": {}}, headers=AUTH).status_code == 200
    generated = client.simulate_post(
        "/api/generate", json={"model": "tiny", "prompt": "four five", "raw": True, "stream": False}, headers=AUTH
    )
    # a raw text prompt's input is the estimator's: one token per 3 bytes ("four five": 3)
    assert generated.status_code == 200 and generated.headers["x-werk-max-tokens-applied"] == str(CONTEXT_TOKENS - 3)
    assert _clamped(client) == before + 3


def test_openai_keeps_output_limit_exceeded(client: falcon.testing.TestClient) -> None:
    body = {"model": "tiny", "max_tokens": 1000, "messages": WORDS}
    result = client.simulate_post("/v1/chat/completions", json=body, headers=AUTH)
    assert result.status_code == 400 and result.json["error"]["code"] == "output_limit_exceeded"
    assert "x-werk-max-tokens-applied" not in result.headers


@pytest.fixture
def clamping(tmp_path: Path) -> Iterator[falcon.testing.TestClient]:
    home = tmp_path / "home"
    home.mkdir()
    path = tmp_path / "deployments.toml"
    path.write_text(PROFILE)
    host: Host
    host, _ = backend_host(home, profile=path, operator_api_keys=(KEY,))
    try:
        yield falcon.testing.TestClient(host.app)
    finally:
        host.close()


def test_a_profile_can_clamp_openai_requests(clamping: falcon.testing.TestClient) -> None:
    before = _clamped(clamping)
    for path, body in (
        ("/v1/chat/completions", {"model": "tiny", "max_completion_tokens": 1000, "messages": WORDS}),
        ("/v1/completions", {"model": "tiny", "max_tokens": 1000, "prompt": "four five"}),
    ):
        result = clamping.simulate_post(path, json=body, headers=AUTH)
        assert result.status_code == 200, result.text
        assert int(result.headers["x-werk-max-tokens-applied"]) <= MAX_OUTPUT_TOKENS
    assert _clamped(clamping) == before + 2


def _parse(text: str) -> Any:
    return parse_profile(text, source="p.toml", known_model=lambda name: name == "tiny")


def test_output_limit_in_a_profile() -> None:
    assert _parse(PROFILE).instances[0].output_limit == "clamp"
    assert _parse(PROFILE.replace('output_limit = "clamp"\n', "")).instances[0].output_limit == "refuse"
    with pytest.raises(ProfileError) as err:
        _parse(PROFILE.replace('"clamp"', '"truncate"'))
    assert 'instance[0].output_limit: "truncate" is not one of refuse, clamp' in str(err.value)
