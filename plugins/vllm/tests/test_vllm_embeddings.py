"""A real Werk-started vLLM embedding instance (vLLM's pooling runner over the tiny generated
Llama, CPU): the kit's embedding conformance suite, Werk's vectors against the same process's own
``/v1/embeddings``, the ``openai`` SDK through the host, and chat refused.

One ``vllm serve`` serves the whole module: the deployment host of :func:`env` starts it for its
``embed`` instance (profile option ``pooling = "mean"``); the conformance host reaches the very
same effective argv (the same options, server-wide) and therefore shares that process. The module
runs vLLM with ``--enforce-eager`` (``WERK_VLLM_ARGS``): no compilation at start-up, which halves
the start on a small CPU.
"""

from __future__ import annotations

import base64
import math
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from vllm_helpers import model_manifest
from werk_vllm import plugin
from werk_vllm import server as servers
from werk_vllm.adapter import VllmAdapter
from werk_vllm.launch import ENV_ARGS

from werk_host.plugin import HostConfig, ModelManifest
from werk_host.plugin.http import post_json
from werk_host.testing.api import Api
from werk_host.testing.conformance import ConformanceHost, ConformanceTarget
from werk_host.testing.embedding_conformance import EmbeddingConformance
from werk_host.testing.host import Host, ModelRegistry, PluginHost, build_host
from werk_host.testing.hosts import running
from werk_host.testing.markers import covers_hooks

pytestmark = pytest.mark.vllm

KEY = "sk-werk-vllm-embed-5521"
EAGER = "--enforce-eager"
#: float32 (vLLM would run this float32 checkpoint in float16 on CPU) keeps a batch equal to its
#: inputs one by one well within the suite's 1e-4.
OPTIONS: dict[str, Any] = {
    "gpu_memory_utilization": 0.1,
    "max_model_len": 512,
    "max_num_seqs": 4,
    "dtype": "float32",
    "pooling": "mean",
}
PROFILE = """
[[instance]]
id = "embed"
model = "tiny"
backend = "vllm"
options = { gpu_memory_utilization = 0.1, max_model_len = 512, max_num_seqs = 4, dtype = "float32", pooling = "mean" }
preload = true
default = true
"""
TEXTS = ["The quick brown fox jumps over the lazy dog.", "hello", "Grüße aus Köln 🌍, naïve café"]


@dataclass
class Env:
    url: str
    host: Host
    api: Api
    manifest: ModelManifest
    options: dict[str, Any]
    sdk: openai.OpenAI

    @property
    def adapter(self) -> VllmAdapter:
        assert self.host.fleet.deployments is not None
        adapter = self.host.fleet.deployments.instances["embed"].peek()
        assert isinstance(adapter, VllmAdapter)
        return adapter

    def direct(self, inputs: list[Any]) -> dict[str, Any]:
        """The same vLLM process's own ``/v1/embeddings`` answer, with the instance's key."""
        live = self.adapter.live()
        assert live is not None
        return post_json(live.pool, "/v1/embeddings", {"model": self.manifest.name, "input": inputs})


@pytest.fixture(scope="module", autouse=True)
def _eager() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ENV_ARGS, EAGER)
        yield


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, vllm_executable: Path, tiny_hf_model: Path) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("vllm-embed")
    home = root / "home"
    home.mkdir()
    manifest = model_manifest(tiny_hf_model)
    ModelRegistry(home).add(manifest)
    profile = root / "deployments.toml"
    profile.write_text(PROFILE)
    plugins = PluginHost()
    plugins.register(plugin, "vllm")
    options = {"executable": str(vllm_executable), **OPTIONS}
    config = HostConfig(
        home=home,
        api_keys=(KEY,),
        profile=profile,
        backend_options={"vllm": {"executable": str(vllm_executable)}},
    )
    started = time.monotonic()
    host = build_host(config, plugins=plugins)
    with running(host) as url:
        print(f"\n[werk-vllm] the embedding vllm serve became healthy in {time.monotonic() - started:.0f}s")
        sdk = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=120)
        yield Env(url, host, Api(url, KEY, timeout=300), manifest, options, sdk)
    assert not servers.shared_servers(), "the shared vLLM server outlived its adapters"


def _close(a: list[float], b: list[float], tolerance: float = 1e-5) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= tolerance for x, y in zip(a, b, strict=True))


# -- what the instance is ----------------------------------------------------------------------------


def test_the_instance_runs_the_pooling_runner_and_reports_from_evidence(env: Env) -> None:
    argv = env.adapter.effective_argv()
    assert argv is not None
    flags = list(argv)
    assert flags[flags.index("--runner") + 1] == "pooling" and flags[flags.index("--convert") + 1] == "embed"
    assert flags[flags.index("--pooler-config") + 1] == '{"pooling_type":"MEAN"}'
    limits = env.adapter.embedding_limits()
    assert limits is not None and not limits.rerank
    # the tiny Llama's hidden size, measured; vLLM's pooler L2-normalizes; max_model_len served
    assert (limits.dimensions, limits.pooling, limits.normalized, limits.truncatable) == (128, "mean", True, False)
    assert (limits.max_input_tokens, limits.max_batch_inputs, limits.max_concurrent_requests) == (512, 64, 4)
    status, doc = env.api.get("/werk/v1/capabilities")
    assert status == 200, doc
    caps = {c["id"]: c["status"] for c in doc["data"]}
    assert caps["api.embeddings"] == "supported" and caps["api.rerank"] == "unsupported"
    assert caps["runtime.model_residency"] == "supported"
    for cap_id in ("api.chat.token_count", "api.chat.admission", "api.chat.limits", "runtime.state.prefix_cache"):
        assert caps[cap_id] == "unsupported", cap_id


# -- the vectors are vLLM's own ------------------------------------------------------------------------


def test_vectors_through_werk_equal_vllms_own(env: Env) -> None:
    ids = env.adapter.tokenize(TEXTS[0])
    assert ids
    for inputs in (TEXTS, [ids, [5, 6, 7]]):
        direct = env.direct(inputs)
        status, doc = env.api.call("POST", "/v1/embeddings", {"model": "embed", "input": inputs})
        assert status == 200, doc
        mine = sorted(doc["data"], key=lambda d: d["index"])
        theirs = sorted(direct["data"], key=lambda d: d["index"])
        assert len(mine) == len(inputs) and all(
            _close(a["embedding"], b["embedding"]) for a, b in zip(mine, theirs, strict=True)
        )
        assert doc["usage"]["prompt_tokens"] == direct["usage"]["prompt_tokens"]
    single = env.direct([ids])["data"][0]["embedding"]
    assert _close(single, env.direct([TEXTS[0]])["data"][0]["embedding"])  # /tokenize is what vLLM feeds


def test_the_openai_sdk_embeds_through_werk(env: Env) -> None:
    direct = [d["embedding"] for d in sorted(env.direct(TEXTS)["data"], key=lambda d: d["index"])]
    floats = env.sdk.embeddings.create(model="embed", input=TEXTS, encoding_format="float")
    assert [e.index for e in floats.data] == [0, 1, 2] and floats.model
    assert all(_close(e.embedding, v) for e, v in zip(floats.data, direct, strict=True))
    assert floats.usage.prompt_tokens > 0 and floats.usage.total_tokens == floats.usage.prompt_tokens
    default = env.sdk.embeddings.create(model="embed", input=TEXTS[1])  # the SDK asks for base64 and decodes it
    assert _close(default.data[0].embedding, direct[1])
    raw = env.sdk.embeddings.create(model="embed", input=TEXTS[2], encoding_format="base64")
    encoded = raw.data[0].embedding
    assert isinstance(encoded, str)
    packed = base64.b64decode(encoded)
    assert _close(list(struct.unpack(f"<{len(packed) // 4}f", packed)), direct[2])
    assert abs(math.sqrt(math.fsum(x * x for x in direct[0])) - 1) < 1e-3


# -- an embedding instance generates nothing ------------------------------------------------------------


def test_chat_to_the_embedding_instance_is_a_400(env: Env) -> None:
    body = {"model": "embed", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    status, doc = env.api.call("POST", "/v1/chat/completions", body)
    assert status == 400, doc
    assert doc["error"]["type"] == "invalid_request_error" and "embedding instance" in doc["error"]["message"]
    with pytest.raises(openai.BadRequestError):
        env.sdk.completions.create(model="embed", prompt="Once upon a time", max_tokens=2)
    status, doc = env.api.call("POST", "/v1/rerank", {"model": "embed", "query": "q", "documents": ["d"]})
    assert status == 400, doc


def test_a_token_id_outside_the_vocabulary_is_a_400_in_werks_words(env: Env) -> None:
    status, doc = env.api.call("POST", "/v1/embeddings", {"model": "embed", "input": [[1, 99999]]})
    assert status == 400, doc
    message = doc["error"]["message"]
    assert "vocabulary" in message and "99999" not in message  # Werk's message, not vLLM's text


# -- the conformance suite, on the same process ------------------------------------------------------------


@covers_hooks("werk_embedding_limits", "werk_embed", "werk_tokenize", "werk_capabilities")
class TestEmbeddingConformance(EmbeddingConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(cls, env: Env) -> ConformanceTarget:
        return ConformanceTarget(
            plugin=plugin,
            plugin_name="vllm",
            model=env.manifest,
            model_name=env.manifest.name,
            backend_options={"vllm": dict(env.options)},
        )

    def test_the_suite_shares_the_running_process(self, conformance_host: ConformanceHost, env: Env) -> None:
        adapter = conformance_host.adapter
        assert isinstance(adapter, VllmAdapter)
        assert adapter.target.server is env.adapter.target.server  # type: ignore[union-attr]
        assert adapter.target.server.starts == 1  # type: ignore[union-attr]
