"""The embedding and rerank routes over the reference embedding backend, served over HTTP
(werk_host/service/embeddings.py, werk_host/http/embeddings.py, docs/embeddings.md).

Routing without a model, batching by the adapter's ``max_batch_inputs``, the per-input token
bound (the tokenizer asked only for inputs that may exceed it), truncation, ``dimensions``,
counters, the wrong kind of instance in each API's own error shape, and the gate's per-key bound
with two keys racing.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from werk_host.config import ServerLimits
from werk_host.testing.embedding_conformance import post_json
from werk_host.testing.embeddings import EMBED_BACKEND, ReferenceEmbeddingPlugin, reference_tokens, reference_vector
from werk_host.testing.hosts import LiveHost, install_model, serving
from werk_host.testing.reference import MemoryBackendPlugin

KEY_A, KEY_B = "sk-embed-a", "sk-embed-b"

PROFILE = """
[[instance]]
id = "chat"
model = "chat"
default = true

[[instance]]
id = "emb"
model = "emb"

[[instance]]
id = "mat"
model = "mat"

[[instance]]
id = "slow"
model = "slow"

[[instance]]
id = "rank"
model = "rank"
"""


@contextmanager
def embedding_host(root: Path, **config: Any) -> Iterator[tuple[LiveHost, ReferenceEmbeddingPlugin]]:
    home = root / "home"
    home.mkdir(parents=True)
    install_model(home, "chat")
    install_model(home, "emb", backend=EMBED_BACKEND, params={"max_input_tokens": 32})
    install_model(home, "mat", backend=EMBED_BACKEND, params={"truncatable": True, "dimensions": 8})
    install_model(home, "slow", backend=EMBED_BACKEND, params={"delay_s": 1.0})
    install_model(home, "rank", backend=EMBED_BACKEND, params={"rerank": True})
    profile = root / "deployments.toml"
    profile.write_text(PROFILE)
    plugin = ReferenceEmbeddingPlugin()
    with serving(
        home,
        plugin=MemoryBackendPlugin(),
        extra_plugins={EMBED_BACKEND: plugin},
        profile=profile,
        api_keys=(KEY_A, KEY_B),
        **config,
    ) as live:
        yield live, plugin


def _adapter(plugin: ReferenceEmbeddingPlugin, name: str) -> Any:
    return next(a for a in plugin.adapters if a.manifest.name == name)


def _embed(live: LiveHost, body: dict[str, Any], key: str = KEY_A) -> tuple[int, Any]:
    return post_json(live.url, "/v1/embeddings", body, key)


def test_batches_are_split_in_order_and_equal_the_engine_s_vectors(tmp_path: Path) -> None:
    with embedding_host(tmp_path) as (live, plugin):
        texts = [f"text number {i}" for i in range(10)]
        status, doc = _embed(live, {"model": "emb", "input": texts})
        assert status == 200, doc
        assert [d["index"] for d in doc["data"]] == list(range(10))
        assert [d["embedding"] for d in doc["data"]] == [reference_vector(t, 16) for t in texts]
        assert _adapter(plugin, "emb").calls == 3  # 4 + 4 + 2
        assert doc["usage"]["prompt_tokens"] == sum(len(reference_tokens(t)) for t in texts)
        assert doc["model"] == "emb"
        status, ids = _embed(live, {"model": "emb", "input": [[1, 50, 60], [1, 70]]})
        assert status == 200 and [d["embedding"] for d in ids["data"]] == [
            reference_vector([1, 50, 60], 16),
            reference_vector([1, 70], 16),
        ]
        status, observed = live.api.get("/werk/v1/observability")
        assert status == 200 and observed["data"]["chat"]["prompt_tokens_total"] >= doc["usage"]["prompt_tokens"]
        request = urllib.request.Request(live.url + "/metrics", headers={"Authorization": f"Bearer {KEY_A}"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            metrics = answer.read().decode()
        assert 'instance="emb"' in metrics


def test_the_token_bound_asks_the_tokenizer_only_near_the_limit_and_truncates_when_asked(tmp_path: Path) -> None:
    with embedding_host(tmp_path) as (live, plugin):
        assert _embed(live, {"model": "emb", "input": ["short", "also short"]})[0] == 200
        adapter = _adapter(plugin, "emb")
        assert adapter.tokenized == 0, "a short input is proven to fit without a tokenizer"
        fits = "x" * 30  # 31 tokens: within 32, but not provably by its bytes
        assert _embed(live, {"model": "emb", "input": fits})[0] == 200 and adapter.tokenized == 1
        long = "y" * 40
        status, doc = _embed(live, {"model": "emb", "input": ["ok", long]})
        assert status == 400 and doc["error"]["code"] == "context_length_exceeded"
        assert "input 1 has 41 tokens" in doc["error"]["message"] and "at most 32" in doc["error"]["message"]
        calls = adapter.calls
        status, cut = _embed(live, {"model": "emb", "input": ["ok", long], "truncate": True})
        assert status == 200 and adapter.calls == calls + 1
        assert cut["data"][1]["embedding"] == reference_vector(reference_tokens(long)[:32], 16)
        status, ids = _embed(live, {"model": "emb", "input": [5] * 33})
        assert status == 400 and "33 tokens" in ids["error"]["message"]


def test_dimensions_only_where_the_vectors_are_truncatable(tmp_path: Path) -> None:
    with embedding_host(tmp_path) as (live, _plugin):
        assert _embed(live, {"model": "emb", "input": "a", "dimensions": 16})[0] == 200
        status, doc = _embed(live, {"model": "emb", "input": "a", "dimensions": 8})
        assert status == 400 and "cannot shorten" in doc["error"]["message"]
        status, doc = _embed(live, {"model": "mat", "input": "a", "dimensions": 4})
        assert status == 200
        full = reference_vector("a", 8)[:4]
        norm = sum(x * x for x in full) ** 0.5
        assert all(abs(a - b / norm) < 1e-12 for a, b in zip(doc["data"][0]["embedding"], full, strict=True))
        assert _embed(live, {"model": "mat", "input": "a", "dimensions": 9})[0] == 400


def test_the_wrong_kind_of_instance_is_refused_in_each_api_s_shape(tmp_path: Path) -> None:
    with embedding_host(tmp_path) as (live, _plugin):
        status, doc = _embed(live, {"model": "chat", "input": "a"})
        assert status == 400 and doc["error"]["message"] == '"chat" does not support embeddings: it is a chat model'
        assert doc["error"]["type"] == "invalid_request_error"
        status, doc = post_json(live.url, "/api/embed", {"model": "chat", "input": "a"}, KEY_A)
        assert status == 400 and doc == {"error": '"chat" does not support embeddings: it is a chat model'}
        status, doc = post_json(live.url, "/api/embeddings", {"model": "nope", "prompt": "a"}, KEY_A)
        assert status == 404 and isinstance(doc["error"], str)
        status, doc = post_json(live.url, "/v1/rerank", {"model": "emb", "query": "q", "documents": ["d"]}, KEY_A)
        assert status == 400 and doc["error"]["message"] == '"emb" only computes embeddings'
        status, doc = _embed(live, {"model": "rank", "input": "a"})
        assert status == 400 and doc["error"]["message"] == '"rank" only reranks documents'
        # without a model: the first embedding instance, not the default (chat) one
        status, doc = _embed(live, {"input": "a"})
        assert status == 200 and doc["model"] == "emb"
        status, doc = post_json(live.url, "/v1/rerank", {"query": "q", "documents": ["d", "e"]}, KEY_A)
        assert status == 200 and doc["model"] == "rank"
        # Ollama's own rules: no input loads the model; an empty string is refused
        status, doc = post_json(live.url, "/api/embed", {"model": "emb"}, KEY_A)
        assert status == 200 and doc["embeddings"] == []
        assert post_json(live.url, "/api/embed", {"model": "emb", "input": ["a", ""]}, KEY_A)[0] == 400
        status, doc = post_json(live.url, "/api/embeddings", {"model": "emb", "prompt": ""}, KEY_A)
        assert status == 200 and doc == {"embedding": []}
        # Ollama's show: an embedding model's one capability, once it runs
        status, shown = post_json(live.url, "/api/show", {"model": "emb"}, KEY_A)
        assert status == 200 and shown["capabilities"] == ["embedding"]
        status, shown = post_json(live.url, "/api/show", {"model": "chat"}, KEY_A)
        assert status == 200 and "embedding" not in shown["capabilities"]


def test_a_key_at_its_bound_is_refused_while_another_key_is_served(tmp_path: Path) -> None:
    limits = ServerLimits(inference_max=4, inference_per_key=1)
    with embedding_host(tmp_path, limits=limits) as (live, plugin):
        assert _embed(live, {"model": "slow", "input": "warm"})[0] == 200
        slow_adapter = _adapter(plugin, "slow")
        results: dict[str, tuple[int, Any]] = {}

        def slow() -> None:
            results["a"] = _embed(live, {"model": "slow", "input": "held"}, KEY_A)

        worker = threading.Thread(target=slow)
        worker.start()
        deadline = time.monotonic() + 30
        while slow_adapter.calls < 2:  # the held request is inside the backend, its ticket taken
            assert time.monotonic() < deadline and worker.is_alive()
            time.sleep(0.01)
        refused = _embed(live, {"model": "emb", "input": "second"}, KEY_A)
        other = _embed(live, {"model": "emb", "input": "other key"}, KEY_B)
        worker.join()
        assert refused[0] == 429 and refused[1]["error"]["type"] == "rate_limit_error"
        assert other[0] == 200 and results["a"][0] == 200
        assert other[1]["data"][0]["embedding"] == reference_vector("other key", 16)
