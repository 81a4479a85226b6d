"""Issue 32's loading feedback over a real llama-server (docs/deployments.md, "Loading notice",
"Operator actions"): a streamed OpenAI chat for a cold instance, with ``loading_notice = true``,
gets the notice (``reasoning_content``, marked ``werk_notice``) before the answer, then the same
answer a warm instance gives; an operator's log tail carries the child's own native log in
``backend_lines``, without a path, the child's API key or a process id."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from werk_llamacpp.adapter import LlamaCppAdapter
from werk_llamacpp.testing.hosts import profile_host
from werk_llamacpp.testing.testmodel import generate_model

from werk_host.testing.api import Api
from werk_host.testing.host import Host
from werk_host.testing.hosts import running

pytestmark = pytest.mark.llamaserver
KEY, OPERATOR = "sk-werk-llama-notice-0123", "sk-werk-llama-notice-op-0123"
PROFILE = '[[instance]]\nid = "tiny"\nmodel = "tiny"\n[residency]\nloading_notice = true\n'


@pytest.fixture
def served(tmp_path: Path, llama_server_path: Path) -> Iterator[tuple[Host, str]]:
    model = generate_model(tmp_path / "tiny.gguf")
    host = profile_host(
        tmp_path / "home", {"tiny": model}, PROFILE, llama_server_path,
        api_keys=(KEY,), operator_api_keys=(OPERATOR,),
    )  # fmt: skip
    with running(host) as url:
        yield host, url


def _chunks(client: openai.OpenAI) -> list[Any]:
    messages: Any = [{"role": "user", "content": "hello"}]
    stream = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=4, temperature=0, seed=1, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    return list(stream)


def test_a_cold_llama_server_streams_the_notice_then_the_answer(served: tuple[Host, str]) -> None:
    host, url = served
    with openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=120) as client:
        cold = _chunks(client)
        warm = _chunks(client)
    notices = [c for c in cold if (c.model_extra or {}).get("werk_notice") == "loading"]
    assert len(notices) == 2 and cold[:2] == notices, cold[:3]
    assert "Loading model tiny" in notices[0].choices[0].delta.reasoning_content
    assert "Ready in" in notices[1].choices[0].delta.reasoning_content
    assert not any("werk_notice" in (c.model_extra or {}) for c in warm)

    def content(chunks: list[Any]) -> list[tuple[Any, Any]]:
        return [(c.choices[0].delta.content, c.choices[0].finish_reason) for c in chunks if c.choices]

    assert content(cold[2:]) == content(warm)
    assert cold[-1].usage is not None and cold[-1].usage.completion_tokens == warm[-1].usage.completion_tokens


def test_the_operator_log_tail_has_the_childs_own_log_redacted(served: tuple[Host, str]) -> None:
    host, url = served
    operator = Api(url, OPERATOR)
    status, doc = operator.get("/werk/v1/deployments/tiny/logs")
    assert status == 200 and doc["data"]["backend_lines"] is None, doc  # not loaded yet
    status, doc = operator.post("/werk/v1/deployments/tiny/actions", {"action": "load"})
    assert status == 200, doc
    status, doc = operator.get("/werk/v1/deployments/tiny/logs", lines=200)
    assert status == 200, doc
    lines = doc["data"]["backend_lines"]
    assert lines and any("<path>" in line for line in lines), lines  # the model file was named, as a placeholder
    deployments = host.fleet.deployments
    assert deployments is not None
    adapter = deployments.instances["tiny"].peek()
    assert isinstance(adapter, LlamaCppAdapter)
    proc = adapter.current()
    assert proc is not None and proc.pid is not None
    text = "\n".join(lines)
    assert proc.api_key not in text and OPERATOR not in text and KEY not in text
    assert str(proc.pid) not in text.split() and not any(os.sep + "tmp" in line for line in lines)
    assert not any(line.startswith("/") or " /" in line for line in lines)
    assert not any(line.split(" ", 1)[0].endswith("Z") for line in lines)  # not Werk's events
    status, doc = Api(url, KEY).get("/werk/v1/deployments/tiny/logs")
    assert status == 403, doc
