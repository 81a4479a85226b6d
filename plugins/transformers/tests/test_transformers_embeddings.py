"""Embeddings on the real engine: the kit's embedding conformance suite against the transformers
worker serving a tiny random-weight BERT (an encoder checkpoint, so ``mean`` pooling without the
option); its vectors equal what plain transformers computes for the same inputs; a ``cls``
instance of the same files shares the worker; a chat request to an embedding instance is a 400.
One worker for the whole class."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from werk_transformers.adapter import POOL, TransformersEmbeddingAdapter, create_adapter
from werk_transformers.testing import tiny_encoder

from werk_host.plugin import CapabilityId, CapabilityStatus, EmbeddingWork, HostConfig
from werk_host.plugin.checkpoints import checkpoint_manifest
from werk_host.testing.conformance_target import ConformanceHost, ConformanceTarget
from werk_host.testing.embedding_conformance import EmbeddingConformance, post_json

pytestmark = pytest.mark.engine

TEXTS = ["The quick brown fox jumps over the lazy dog.", "hello", "Embeddings map text to vectors, 12345."]
#: Plain transformers, no Werk: the same checkpoint's base model, mean pooling over the attention
#: mask and the first token, L2-normalized; the texts (argv, JSON) padded into one batch.
REFERENCE = """
import json, sys, torch, transformers
transformers.utils.logging.disable_progress_bar()
texts = json.loads(sys.argv[2])
tokenizer = transformers.AutoTokenizer.from_pretrained(sys.argv[1])
model = transformers.AutoModel.from_pretrained(sys.argv[1]).eval()
batch = tokenizer(texts, padding=True, return_tensors="pt")
with torch.inference_mode():
    hidden = model(**batch).last_hidden_state
mask = batch["attention_mask"].unsqueeze(-1).float()
mean = (hidden * mask).sum(1) / mask.sum(1)
unit = lambda v: torch.nn.functional.normalize(v, p=2, dim=-1).tolist()
ids = [tokenizer(t)["input_ids"] for t in texts]
json.dump({"mean": unit(mean), "cls": unit(hidden[:, 0]), "ids": ids}, sys.stdout)
"""


def _close(a: list[list[float]], b: list[list[float]], tolerance: float = 1e-5) -> bool:
    return len(a) == len(b) and all(
        len(u) == len(v) and all(abs(x - y) <= tolerance for x, y in zip(u, v, strict=True))
        for u, v in zip(a, b, strict=True)
    )


@pytest.fixture(scope="session")
def encoder(engine: str) -> Path:
    return tiny_encoder(engine)


@pytest.fixture(scope="class")
def reference(engine: str, encoder: Path) -> Iterator[Callable[[], dict[str, Any]]]:
    """Plain transformers' vectors of :data:`TEXTS`, computed beside the host's start."""
    run = subprocess.Popen(
        [engine, "-c", REFERENCE, str(encoder), json.dumps(TEXTS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"},
    )
    answer: dict[str, Any] = {}

    def result() -> dict[str, Any]:
        if not answer:
            out, err = run.communicate(timeout=120)
            assert run.returncode == 0, err
            answer.update(json.loads(out))
        return answer

    yield result
    run.kill()
    run.wait()


class TestEmbeddings(EmbeddingConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(
        cls, encoder: Path, engine: str, reference: Callable[[], dict[str, Any]]
    ) -> ConformanceTarget:
        # No pooling option: the checkpoint (a BertModel) makes it a mean-pooling embedding instance.
        return ConformanceTarget(
            entry_point="transformers",
            model=encoder,
            backend_options={"transformers": {"python": engine, "device": "cpu", "threads": 1}},
        )

    def test_vectors_equal_plain_transformers(
        self, conformance_host: ConformanceHost, reference: Callable[[], dict[str, Any]]
    ) -> None:
        host = conformance_host
        expected = reference()

        def embed(inputs: list[Any]) -> tuple[list[list[float]], int]:
            body = {"model": host.model_name, "input": inputs}
            status, doc = post_json(host.api.base, "/v1/embeddings", body, host.key)
            assert status == 200, doc
            return [d["embedding"] for d in sorted(doc["data"], key=lambda d: d["index"])], doc["usage"][
                "prompt_tokens"
            ]

        vectors, tokens = embed(list(TEXTS))
        assert _close(vectors, expected["mean"]), "Werk's mean pooling is transformers' own"
        assert tokens == sum(len(i) for i in expected["ids"])
        by_ids, _ = embed(expected["ids"][::-1])
        assert _close(by_ids, expected["mean"][::-1]), "token ids embed like their text"
        limits = host.host.fleet.hooks.embedding_limits(host.adapter)
        assert limits is not None and (limits.dimensions, limits.pooling, limits.normalized) == (32, "mean", True)
        assert limits.max_input_tokens == 128  # max_position_embeddings, below the tokenizer's 512

    def test_a_cls_instance_of_the_same_files_shares_the_worker(
        self, conformance_host: ConformanceHost, engine: str, encoder: Path, reference: Callable[[], dict[str, Any]]
    ) -> None:
        host = conformance_host
        options = {"transformers": {"python": engine, "device": "cpu", "threads": 1, "pooling": "cls"}}
        adapter = create_adapter(HostConfig(home=host.home, backend_options=options), checkpoint_manifest(encoder))
        try:
            assert isinstance(adapter, TransformersEmbeddingAdapter)
            served = host.adapter
            assert isinstance(served, TransformersEmbeddingAdapter)
            assert adapter.slot is served.slot and POOL.loaded() == 1
            result = adapter.embed(EmbeddingWork(list(TEXTS), lambda: False))
            assert _close(result.vectors, reference()["cls"]), "Werk's CLS pooling is transformers' own"
            assert adapter.embedding_limits().pooling == "cls"
        finally:
            adapter.close()
        assert served.slot.alive(), "the host's instance keeps the shared worker"

    def test_a_chat_request_to_an_embedding_instance_is_a_400(self, conformance_host: ConformanceHost) -> None:
        host = conformance_host
        body = {"model": host.model_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        status, doc = post_json(host.api.base, "/v1/chat/completions", body, host.key)
        assert status == 400, doc
        assert "embedding instance" in doc["error"]["message"]
        statuses = host.statuses()
        assert statuses[CapabilityId.RERANK] is CapabilityStatus.UNSUPPORTED
        assert statuses[CapabilityId.TOKEN_COUNT] is CapabilityStatus.UNSUPPORTED
