"""Embedding and reranking instances of llama.cpp against the real llama-server
(werk_llamacpp/embeddings.py, docs/embeddings.md), with the real clients.

* The kit's embedding conformance suite on a generated embedding GGUF (mean pooling in its
  metadata) and on a generated reranker (rank pooling).
* ``werk models add NAME GGUF`` + ``werk serve --model NAME`` serves the file as an embedding
  instance from its metadata; the vectors equal (to 1e-5) what a bare llama-server with the same
  flags answers for the same inputs, and the usage is its count.
* One profile with an embedding instance, a reranking one and a chat instance of the same file
  (``pooling = "none"``): the ``openai`` SDK (float and its default base64), the ``ollama``
  client (``embed`` and ``embeddings``), LiteLLM's ``embedding()`` and ``llm embed`` (each from
  its pinned PyPI release in its own cached virtualenv), chat on the chat instance, and every
  route refusing the wrong kind in its own error shape.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import ollama
import openai
import pytest
from werk_llamacpp.process import ENV_ARGS
from werk_llamacpp.testing.testmodel import generate_model

from werk_host.testing.clients import client_venv
from werk_host.testing.conformance import ConformanceTarget
from werk_host.testing.embedding_conformance import EmbeddingConformance, post_json
from werk_host.testing.hosts import serve_process

pytestmark = pytest.mark.llamaserver
KEY = "sk-werk-embed-test-4410"
TEXTS = ["The quick brown fox.", "Embeddings map text to vectors.", "hello", "A fourth one."]
#: the per-slot context of the instances here (``ctx`` over 2 slots)
SLOT = 256


@pytest.fixture(scope="module")
def embedding_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_model(tmp_path_factory.mktemp("emb") / "embed.gguf", pooling="mean", ctx=1024)


@pytest.fixture(scope="module")
def reranker_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_model(tmp_path_factory.mktemp("rank") / "rank.gguf", pooling="rank", ctx=1024, seed=3)


def _options(llama_server_path: Path) -> dict[str, dict[str, object]]:
    return {"llamacpp": {"llama_server": str(llama_server_path), "parallel": 2, "ctx": 2 * SLOT}}


class TestEmbeddingConformance(EmbeddingConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(cls, llama_server_path: Path, embedding_gguf: Path) -> ConformanceTarget:
        return ConformanceTarget(
            entry_point="llamacpp", model=embedding_gguf, backend_options=_options(llama_server_path)
        )


class TestRerankConformance(EmbeddingConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(cls, llama_server_path: Path, reranker_gguf: Path) -> ConformanceTarget:
        return ConformanceTarget(
            entry_point="llamacpp", model=reranker_gguf, backend_options=_options(llama_server_path)
        )


# -- the same engine directly ------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def direct(llama_server_path: Path, embedding_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A bare llama-server with the flags Werk gives an embedding instance (module docstring)."""
    port = _free_port()
    size = str(SLOT)
    argv = [str(llama_server_path), "-m", str(embedding_gguf), "--host", "127.0.0.1", "--port", str(port)]
    argv += [
        "-np",
        "2",
        "-c",
        str(2 * SLOT),
        "--embeddings",
        "--pooling",
        "mean",
        "-ub",
        size,
        "-b",
        size,
        "--kv-unified",
    ]
    log = tmp_path_factory.mktemp("direct") / "llama-server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(log.read_text(errors="replace")[-2000:]) from None
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_models_add_then_serve_embeds_from_the_metadata_as_the_engine_does(
    tmp_path: Path, llama_server_path: Path, embedding_gguf: Path, direct: str
) -> None:
    home = tmp_path / "home"
    environ = {**os.environ, "WERK_HOME": str(home), "WERK_LLAMA_SERVER": str(llama_server_path)}
    added = subprocess.run(
        [sys.executable, "-m", "werk_host", "models", "add", "emb", str(embedding_gguf)],
        env=environ,
        capture_output=True,
        text=True,
    )
    assert added.returncode == 0, added.stderr
    args = ("--model", "emb", "--backend-option", f"llamacpp.ctx={2 * SLOT}")
    env = {"WERK_LLAMA_SERVER": str(llama_server_path)}
    with serve_process(home, *args, keys=(KEY,), env=env, drop=(ENV_ARGS,)) as served:
        inputs: list[object] = [*TEXTS, [1, 40, 41, 42]]
        status, werk = post_json(served.url, "/v1/embeddings", {"model": "emb", "input": TEXTS}, KEY)
        assert status == 200, werk
        status, engine = post_json(direct, "/v1/embeddings", {"input": TEXTS})
        assert status == 200, engine
        for ours, theirs in zip(werk["data"], sorted(engine["data"], key=lambda d: d["index"]), strict=True):
            assert max(abs(a - b) for a, b in zip(ours["embedding"], theirs["embedding"], strict=True)) <= 1e-5
        assert werk["usage"]["prompt_tokens"] == engine["usage"]["prompt_tokens"] > 0
        status, ids = post_json(served.url, "/v1/embeddings", {"model": "emb", "input": [inputs[-1]]}, KEY)
        status_direct, ids_direct = post_json(direct, "/v1/embeddings", {"input": [inputs[-1]]})
        assert status == status_direct == 200
        assert (
            max(
                abs(a - b) for a, b in zip(ids["data"][0]["embedding"], ids_direct["data"][0]["embedding"], strict=True)
            )
            <= 1e-5
        )
        status, chat = post_json(
            served.url, "/v1/chat/completions", {"model": "emb", "messages": [{"role": "user", "content": "hi"}]}, KEY
        )
        assert status == 400 and "computes embeddings" in chat["error"]["message"]


# -- one profile, every client ---------------------------------------------------------------------

PROFILE = """
[[instance]]
id = "emb"
model = "{embed}"
options = {{ parallel = 2, ctx = {ctx} }}

[[instance]]
id = "rank"
model = "{rank}"
options = {{ parallel = 2, ctx = {ctx} }}

[[instance]]
id = "chat"
model = "{embed}"
options = {{ parallel = 2, ctx = 2048, pooling = "none" }}

[alias.text-embedding-3-small]
replicas = ["emb"]
"""


@dataclass
class Served:
    url: str


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, llama_server_path: Path, embedding_gguf: Path, reranker_gguf: Path
) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("clients")
    profile = root / "deployments.toml"
    profile.write_text(PROFILE.format(embed=embedding_gguf, rank=reranker_gguf, ctx=2 * SLOT))
    env = {"WERK_LLAMA_SERVER": str(llama_server_path)}
    with serve_process(root / "home", "--profile", str(profile), keys=(KEY,), env=env, drop=(ENV_ARGS,)) as proc:
        yield Served(proc.url)


def _unit(vector: list[float]) -> bool:
    return abs(math.sqrt(math.fsum(x * x for x in vector)) - 1) < 1e-4


def test_the_openai_sdk_embeds_in_float_and_base64(served: Served) -> None:
    client = openai.OpenAI(base_url=served.url + "/v1", api_key=KEY)
    floats = client.embeddings.create(model="emb", input=TEXTS, encoding_format="float")
    default = client.embeddings.create(model="emb", input=TEXTS)  # the SDK asks for base64 and decodes it
    assert [d.index for d in floats.data] == list(range(len(TEXTS))) and floats.model == "emb"
    for a, b in zip(floats.data, default.data, strict=True):
        assert len(a.embedding) == 64 and _unit(a.embedding)
        assert max(abs(x - y) for x, y in zip(a.embedding, b.embedding, strict=True)) < 1e-6
    assert floats.usage.prompt_tokens == floats.usage.total_tokens > 0
    with pytest.raises(openai.BadRequestError) as chat_model:
        client.embeddings.create(model="chat", input="hello")
    assert "does not support embeddings" in str(chat_model.value)
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model="emb", input="")
    with pytest.raises(openai.BadRequestError) as too_long:
        client.embeddings.create(model="emb", input="word " * SLOT)
    assert str(SLOT) in str(too_long.value)
    cut = client.embeddings.create(model="emb", input="word " * SLOT, extra_body={"truncate": True})
    assert len(cut.data[0].embedding) == 64
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="nope", input="hello")
    answer = client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert answer.choices[0].message.content is not None
    with pytest.raises(openai.BadRequestError) as no_text:
        client.chat.completions.create(model="emb", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert "computes embeddings" in str(no_text.value)


def test_the_ollama_client_embeds_and_refuses_a_chat_model(served: Served) -> None:
    client = ollama.Client(host=served.url, headers={"Authorization": f"Bearer {KEY}"})
    both = client.embed(model="emb", input=TEXTS[:2])
    assert len(both.embeddings) == 2 and all(_unit(list(v)) for v in both.embeddings)
    one = client.embed(model="emb", input=TEXTS[0])
    assert max(abs(a - b) for a, b in zip(one.embeddings[0], both.embeddings[0], strict=True)) < 1e-6
    legacy = client.embeddings(model="emb", prompt=TEXTS[0])
    assert max(abs(a - b) for a, b in zip(legacy.embedding, both.embeddings[0], strict=True)) < 1e-6
    assert client.embed(model="emb", input="word " * SLOT).embeddings  # Ollama truncates by default
    with pytest.raises(ollama.ResponseError) as refused:
        client.embed(model="emb", input="word " * SLOT, truncate=False)
    assert refused.value.status_code == 400 and str(SLOT) in refused.value.error
    with pytest.raises(ollama.ResponseError) as chat_model:
        client.embed(model="chat", input="hello")
    assert chat_model.value.status_code == 400 and chat_model.value.error.startswith(
        '"chat" does not support embeddings'
    )


def test_rerank_in_the_jina_cohere_shape(served: Served) -> None:
    documents = ["a fox in the woods", "vectors and text", "hello there"]
    status, doc = post_json(
        served.url,
        "/v1/rerank",
        {"model": "rank", "query": "hello", "documents": documents, "top_n": 2, "return_documents": True},
        KEY,
    )
    assert status == 200, doc
    results = doc["results"]
    assert len(results) == 2 and results[0]["relevance_score"] >= results[1]["relevance_score"]
    assert all(r["document"]["text"] == documents[r["index"]] for r in results)
    assert doc["usage"]["prompt_tokens"] > 0
    status, refused = post_json(served.url, "/v1/rerank", {"model": "emb", "query": "q", "documents": ["d"]}, KEY)
    assert status == 400 and "only computes embeddings" in refused["error"]["message"]
    status, refused = post_json(served.url, "/v1/embeddings", {"model": "rank", "input": "d"}, KEY)
    assert status == 400 and "only reranks documents" in refused["error"]["message"]


#: the real embedding clients, pinned (docs/embeddings.md, "Clients")
CLIENTS = {"litellm": ("litellm", "1.80.0"), "llm": ("llm", "0.36")}


def _client_python(name: str) -> Path:
    return client_venv(*CLIENTS[name]) / "bin" / "python"


LITELLM = """
import json, sys
import litellm
answer = litellm.embedding(model="openai/emb", input=sys.argv[3:], api_base=sys.argv[1], api_key=sys.argv[2])
print(json.dumps([d["embedding"] for d in answer.data]))
"""


def test_litellm_embedding_equals_the_openai_route(served: Served) -> None:
    python = _client_python("litellm")
    run = subprocess.run(
        [str(python), "-c", LITELLM, served.url + "/v1", KEY, *TEXTS[:2]],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )
    assert run.returncode == 0, run.stderr[-2000:]
    vectors = json.loads(run.stdout.strip().splitlines()[-1])
    status, ours = post_json(served.url, "/v1/embeddings", {"model": "emb", "input": TEXTS[:2]}, KEY)
    assert status == 200
    for got, want in zip(vectors, ours["data"], strict=True):
        assert max(abs(a - b) for a, b in zip(got, want["embedding"], strict=True)) < 1e-6


def test_llm_embed_through_its_openai_plugin(served: Served, tmp_path: Path) -> None:
    python = _client_python("llm")
    env = {
        **os.environ,
        "OPENAI_BASE_URL": served.url + "/v1",
        "OPENAI_API_KEY": KEY,
        "LLM_USER_PATH": str(tmp_path / "llm"),
    }
    run = subprocess.run(
        [str(python), "-m", "llm", "embed", "-m", "3-small", "-c", TEXTS[0]],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    vector = json.loads(run.stdout)
    status, ours = post_json(served.url, "/v1/embeddings", {"model": "emb", "input": TEXTS[0]}, KEY)
    assert status == 200
    assert max(abs(a - b) for a, b in zip(vector, ours["data"][0]["embedding"], strict=True)) < 1e-6
