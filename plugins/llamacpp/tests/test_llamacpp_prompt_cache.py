"""Automatic prompt caches for ordinary requests on a real llama-server behind a real Werk host
(docs/prompt-cache.md): a long prompt's KV is saved per key after the answer and restored after
a restart, verified by llama-server's own counters; keys share nothing; the budget holds; a
corrupt entry is quarantined and the request runs cold with the cold answer.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from werk_llamacpp.gguf_meta import partial_cache, read_metadata

from werk_host.plugin import HostConfig, ModelManifest
from werk_host.testing.api import Api
from werk_host.testing.host import Host, ModelRegistry, build_host
from werk_host.testing.hosts import running, settled
from werk_host.testing.markers import covers_hooks

pytestmark = pytest.mark.llamaserver
KEY_A = "sk-werk-prompt-cache-a-123456"
KEY_B = "sk-werk-prompt-cache-b-654321"
#: About 1,900 tokens on the generated model: above the 1,024-token threshold.
DOCUMENT = " ".join(f"box {i} holds {i * 7 % 13} red marbles and {i * 5 % 11} blue ones." for i in range(60))
GREEDY = {"max_tokens": 8, "temperature": 0, "seed": 3}


def ask(api: Api, document: str = DOCUMENT, question: str = "Which box holds most?") -> dict[str, Any]:
    body = {"model": "tiny", "messages": [{"role": "user", "content": f"{document}\n\n{question}"}], **GREEDY}
    status, answer = api.post("/v1/chat/completions", body)
    assert status == 200, answer
    return answer


def cached(answer: dict[str, Any]) -> int:
    return int(answer["usage"]["prompt_tokens_details"]["cached_tokens"])


def text(answer: dict[str, Any]) -> str:
    return str(answer["choices"][0]["message"]["content"])


@contextmanager
def serve(home: Path, binary: Path, model: Path, **config: Any) -> Iterator[tuple[Host, Api, Api]]:
    """A host on ``home`` (one ordinary slot and the state slot), served until the block ends;
    its close waits for prompt-cache commits in flight, as ``werk serve``'s shutdown does."""
    ModelRegistry(home).add(ModelManifest.from_paths("tiny", [model], backend="llama.cpp"))
    options = {"llama_server": str(binary), "parallel": 2, "ctx": 8192}
    host = build_host(
        HostConfig(home=home, api_keys=(KEY_A, KEY_B), model="tiny", backend_options={"llamacpp": options}, **config)
    )
    with running(host) as base:
        yield host, Api(base, KEY_A, timeout=120), Api(base, KEY_B, timeout=120)


def scraped(api: Api) -> str:
    """``GET /metrics`` as text."""
    request = urllib.request.Request(api.base + "/metrics", headers={"Authorization": f"Bearer {KEY_A}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return str(response.read().decode())


def entries(home: Path) -> list[Path]:
    return sorted(home.glob("prompt-cache/*/p_*/st_*/payload.bin"))


@covers_hooks("werk_prompt_cache")
def test_a_restart_restores_the_prompt_and_answers_as_cold(
    tmp_path: Path, llama_server_path: Path, tiny_model: Path
) -> None:
    with serve(tmp_path, llama_server_path, tiny_model) as (_host, a, _b):
        cold = ask(a)
        assert cached(cold) == 0 and cold["usage"]["prompt_tokens"] >= 1024
    assert len(entries(tmp_path)) == 1  # saved after the answer, committed before the host closed
    with serve(tmp_path, llama_server_path, tiny_model) as (host, a, _b):
        warm = ask(a)
        counters = settled(host)
        scrape = scraped(a)
    assert cached(warm) >= cold["usage"]["prompt_tokens"] - 1  # llama-server's own count
    assert 'werk_chat_prompt_cache_misses_total{instance="tiny"} 0.0' in scrape
    assert f'werk_prompt_cache_bytes{{instance="tiny"}} {float(entries(tmp_path)[0].stat().st_size)}' in scrape
    assert text(warm) == text(cold)
    # restored once: by the warm start of the new process (before the request), or on the
    # request's path when the request came first
    assert counters.prompt_cache_prewarms + counters.prompt_cache_hits == 1 and counters.prompt_cache_misses == 0


def test_two_keys_share_nothing(tmp_path: Path, llama_server_path: Path, tiny_model: Path) -> None:
    with serve(tmp_path, llama_server_path, tiny_model) as (_host, a, b):
        assert cached(ask(a)) == 0
        assert cached(ask(b)) == 0  # the same document, the same slot: erased first
        assert cached(ask(a)) > 0  # and back: A's own entry, restored over B's erased tokens
    with serve(tmp_path, llama_server_path, tiny_model) as (_host, a, b):
        first_b = ask(b, question="And the fewest?")
        assert cached(first_b) > 0  # B's own entry
    other = tmp_path / "other"
    with serve(other, llama_server_path, tiny_model) as (_host, a, _b):
        ask(a)
    with serve(other, llama_server_path, tiny_model) as (_host, _a, b):
        assert cached(ask(b)) == 0  # A's entry is never B's


def test_a_zero_budget_saves_and_restores_nothing(tmp_path: Path, llama_server_path: Path, tiny_model: Path) -> None:
    with serve(tmp_path, llama_server_path, tiny_model, prompt_cache_budget=0) as (_host, a, _b):
        ask(a)
    assert entries(tmp_path) == []
    with serve(tmp_path, llama_server_path, tiny_model, prompt_cache_budget=0) as (_host, a, _b):
        assert cached(ask(a)) == 0


def test_a_corrupt_entry_is_quarantined_and_the_request_runs_cold(
    tmp_path: Path, llama_server_path: Path, tiny_model: Path
) -> None:
    with serve(tmp_path, llama_server_path, tiny_model) as (_host, a, _b):
        cold = ask(a)
    (payload,) = entries(tmp_path)
    data = bytearray(payload.read_bytes())
    data[len(data) // 2] ^= 0xFF
    payload.write_bytes(bytes(data))
    with serve(tmp_path, llama_server_path, tiny_model) as (host, a, _b):
        again = ask(a)
        counters = settled(host)
    assert cached(again) == 0 and text(again) == text(cold)
    assert counters.prompt_cache_hits == 0 and counters.prompt_cache_misses == 1
    assert payload not in entries(tmp_path)  # quarantined (a fresh, intact entry replaced it)


def test_the_budget_is_never_exceeded(tmp_path: Path, llama_server_path: Path, tiny_model: Path) -> None:
    with serve(tmp_path, llama_server_path, tiny_model) as (_host, a, _b):
        ask(a)
    (first,) = entries(tmp_path)
    budget = first.stat().st_size * 3 // 2  # room for one entry, not two
    home = tmp_path / "budget"
    with serve(home, llama_server_path, tiny_model, prompt_cache_budget=budget) as (_host, a, _b):
        for n in range(3):
            ask(a, document=f"Part {n}. " + DOCUMENT)
            assert sum(p.stat().st_size for p in entries(home)) <= budget
    with serve(home, llama_server_path, tiny_model, prompt_cache_budget=budget) as (_host, a, _b):
        assert cached(ask(a, document="Part 2. " + DOCUMENT)) > 0  # the most recent one was kept
        assert cached(ask(a, document="Part 0. " + DOCUMENT)) < 64  # evicted: only the chat header is shared


def test_anthropic_and_ollama_report_the_reuse(tmp_path: Path, llama_server_path: Path, tiny_model: Path) -> None:
    content = f"{DOCUMENT}\n\nWhich box holds most?"
    with serve(tmp_path, llama_server_path, tiny_model) as (_host, a, _b):
        cold = ask(a)
    with serve(tmp_path, llama_server_path, tiny_model) as (_host, a, _b):
        status, message = a.post(
            "/v1/messages", {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": content}]}
        )
        assert status == 200, message
        usage = message["usage"]
        assert usage["cache_read_input_tokens"] > 0
        assert usage["input_tokens"] + usage["cache_read_input_tokens"] == cold["usage"]["prompt_tokens"]
        status, chat = a.post(
            "/api/chat",
            {
                "model": "tiny",
                "stream": False,
                "messages": [{"role": "user", "content": content}],
                "options": {"num_predict": 4},
            },
        )
        assert status == 200, chat
        assert 0 < chat["prompt_eval_count"] < cold["usage"]["prompt_tokens"]  # what it evaluated, not what it reused


def test_partial_caches_are_read_from_the_model_header(tiny_model: Path) -> None:
    assert partial_cache(read_metadata(tiny_model)) is None  # plain llama: full KV in the slot file
    assert (
        partial_cache({"general.architecture": "gemma3", "gemma3.attention.sliding_window": 1024}) == "sliding-window"
    )
    assert partial_cache({"general.architecture": "gemma3", "gemma3.attention.sliding_window": 0}) is None
    assert partial_cache({"general.architecture": "mamba", "mamba.ssm.state_size": 16}) == "recurrent"
    assert partial_cache({"general.architecture": "llama4", "llama4.attention.chunk_size": 8192}) == "sliding-window"
    assert partial_cache({"general.architecture": "lfm2", "lfm2.shortconv.l_cache": 3}) == "recurrent"
    assert partial_cache({"general.architecture": "rwkv7", "rwkv7.wkv.head_size": 64}) == "recurrent"
    assert partial_cache({"general.architecture": 7}) is None
