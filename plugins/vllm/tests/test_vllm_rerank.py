"""A real Werk-started vLLM reranking instance (``pooling = "rank"``: vLLM's pooling runner over
the tiny generated Llama as a one-label ``LlamaForSequenceClassification``, a cross-encoder, CPU):
the kit's conformance suite for a reranker, Werk's scores against the same process's own
``/rerank``, and chat refused.

One ``vllm serve`` (with ``--enforce-eager``, as in test_vllm_embeddings.py) serves the module: the
conformance suite's host starts it, and the module's own checks use that host.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from vllm_helpers import model_manifest
from werk_vllm import plugin
from werk_vllm.adapter import VllmAdapter
from werk_vllm.launch import ENV_ARGS

from werk_host.plugin import CapabilityId, CapabilityStatus
from werk_host.plugin.http import post_json
from werk_host.testing.conformance import ConformanceHost, ConformanceTarget
from werk_host.testing.embedding_conformance import EmbeddingConformance
from werk_host.testing.markers import covers_hooks

pytestmark = pytest.mark.vllm

OPTIONS: dict[str, Any] = {
    "gpu_memory_utilization": 0.1,
    "max_model_len": 512,
    "max_num_seqs": 4,
    "dtype": "float32",
    "pooling": "rank",
}
QUERY = "Where do rivers flow?"
DOCUMENTS = ["Rivers flow into the ocean.", "The quick brown fox jumps over the lazy dog.", "hello"]


@covers_hooks("werk_embedding_limits", "werk_rerank", "werk_tokenize")
class TestRerankConformance(EmbeddingConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(cls, vllm_executable: Path, tiny_hf_classifier: Path) -> Iterator[ConformanceTarget]:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(ENV_ARGS, "--enforce-eager")
            yield ConformanceTarget(
                plugin=plugin,
                plugin_name="vllm",
                model=model_manifest(tiny_hf_classifier, "reranker"),
                model_name="reranker",
                backend_options={"vllm": {"executable": str(vllm_executable), **OPTIONS}},
            )

    def test_the_instance_is_a_measured_cross_encoder(self, conformance_host: ConformanceHost) -> None:
        adapter = conformance_host.adapter
        assert isinstance(adapter, VllmAdapter)
        argv = list(adapter.effective_argv() or ())
        assert argv[argv.index("--runner") + 1] == "pooling" and argv[argv.index("--convert") + 1] == "classify"
        limits = adapter.embedding_limits()
        assert limits is not None and limits.rerank and limits.pooling == "rank"
        assert (limits.max_input_tokens, limits.max_concurrent_requests) == (512, 4)
        caps = conformance_host.statuses()
        assert caps[CapabilityId.RERANK] is CapabilityStatus.SUPPORTED
        assert caps[CapabilityId.EMBEDDINGS] is CapabilityStatus.UNSUPPORTED

    def test_scores_through_werk_equal_vllms_own(self, conformance_host: ConformanceHost) -> None:
        adapter = conformance_host.adapter
        assert isinstance(adapter, VllmAdapter)
        live = adapter.live()
        assert live is not None
        body: Any = {"model": "reranker", "query": QUERY, "documents": DOCUMENTS}
        direct = post_json(live.pool, "/rerank", body)
        theirs = {r["index"]: r["relevance_score"] for r in direct["results"]}
        status, doc = conformance_host.call("POST", "/v1/rerank", body)
        assert status == 200, doc
        results = doc["results"]
        assert isinstance(results, list) and len(results) == len(DOCUMENTS)
        for result in results:
            assert isinstance(result, dict)
            index, score = result["index"], result["relevance_score"]
            assert isinstance(index, int) and isinstance(score, float)
            assert abs(score - theirs[index]) <= 1e-5
        usage = doc["usage"]
        assert isinstance(usage, dict) and usage["prompt_tokens"] == direct["usage"]["prompt_tokens"]

    def test_chat_to_the_reranking_instance_is_a_400(self, conformance_host: ConformanceHost) -> None:
        body: Any = {"model": "reranker", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        status, doc = conformance_host.call("POST", "/v1/chat/completions", body)
        assert status == 400, doc
        error = doc["error"]
        assert isinstance(error, dict) and "reranking instance" in str(error["message"])
