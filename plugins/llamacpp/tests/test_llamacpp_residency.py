"""Residency is the operator's (docs/deployments.md, "Residency") over a real llama-server: with
two client keys, key B's ``keep_alive: 0`` (on a generation, or Ollama's unload idiom) neither
stops the shared instance nor its llama-server child, so key A's live handoff still decodes
(200, not 410); an operator key's unload does stop it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from werk_llamacpp.testing.hosts import profile_host
from werk_llamacpp.testing.testmodel import generate_model

from werk_host.testing.api import Api
from werk_host.testing.host import Host
from werk_host.testing.hosts import running

pytestmark = pytest.mark.llamaserver
KEY_A, KEY_B, OPERATOR = "sk-werk-llama-a-0123", "sk-werk-llama-b-0123", "sk-werk-llama-op-0123"
PROFILE = '[[instance]]\nid = "tiny"\nmodel = "tiny"\npreload = true\nkeep_alive = "10m"\n'


@pytest.fixture
def served(tmp_path: Path, llama_server_path: Path) -> Iterator[tuple[Host, str]]:
    model = generate_model(tmp_path / "tiny.gguf")
    host = profile_host(
        tmp_path / "home", {"tiny": model}, PROFILE, llama_server_path,
        api_keys=(KEY_A, KEY_B), operator_api_keys=(OPERATOR,),
    )  # fmt: skip
    with running(host) as url:
        yield host, url


def _handoff(api: Api) -> str:
    body: dict[str, Any] = {"model_id": "tiny", "input": {"type": "text", "text": "a b c"}, "allow_experimental": True}
    status, doc = api.post("/werk/v1/prefill", {**body, "policy": {"mode": "ephemeral", "reuse": "disabled"}})
    assert status == 200, doc
    handoff: str = doc["data"]["handoff"]
    return handoff


def _decode(api: Api, handoff: str) -> int:
    status, _ = api.post("/werk/v1/decode", {"handoff": handoff, "max_tokens": 2, "allow_experimental": True})
    return status


def _pid(api: Api) -> int | None:
    status, doc = api.get("/werk/v1/deployments")
    assert status == 200, doc
    pid: int | None = doc["data"]["inventory"][0]["pid"]
    return pid


def test_another_keys_keep_alive_zero_leaves_the_shared_instance_and_its_handoffs(served: tuple[Host, str]) -> None:
    _, url = served
    a, b, operator = Api(url, KEY_A), Api(url, KEY_B), Api(url, OPERATOR)
    pid = _pid(a)
    handoff = _handoff(a)
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "options": {"num_predict": 2}}
    status, doc = b.post("/api/chat", {**chat, "stream": False, "keep_alive": 0})
    assert status == 200, doc
    assert _decode(a, handoff) == 200  # not 410: the llama-server child is the same one
    handoff = _handoff(a)
    status, doc = b.post("/api/generate", {"model": "tiny", "keep_alive": 0})
    assert status == 403 and "operator" in doc["error"], doc
    assert _pid(a) == pid and pid is not None
    assert _decode(a, handoff) == 200
    handoff = _handoff(a)
    status, doc = operator.post("/api/generate", {"model": "tiny", "keep_alive": 0})
    assert status == 200 and doc["done_reason"] == "unload", doc
    assert _pid(a) is None and _decode(a, handoff) == 410  # an operator's unload: documented
