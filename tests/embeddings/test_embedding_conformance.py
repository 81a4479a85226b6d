"""The embedding conformance suite (werk_host/testing/embedding_conformance.py) over the reference
embedding backend, as an embedding and as a reranking instance: the kit's suite passes against the
smallest embedding adapter, as a plugin's would."""

from __future__ import annotations

import pytest

from werk_host.models import ModelManifest
from werk_host.testing.conformance_target import ConformanceTarget
from werk_host.testing.embedding_conformance import EmbeddingConformance
from werk_host.testing.embeddings import EMBED_BACKEND, ReferenceEmbeddingPlugin
from werk_host.testing.markers import covers_hooks


def _target(tmp_path_factory: pytest.TempPathFactory, **params: object) -> ConformanceTarget:
    weights = tmp_path_factory.mktemp("refembed") / "embed.bin"
    weights.write_bytes(b"reference embedding weights")
    manifest = ModelManifest.from_paths("embed", [weights], backend=EMBED_BACKEND, params=params)
    return ConformanceTarget(plugin=ReferenceEmbeddingPlugin(), plugin_name=EMBED_BACKEND, model=manifest)


@covers_hooks("werk_embedding_limits", "werk_embed", "werk_tokenize", "werk_capabilities")
class TestReferenceEmbeddingConformance(EmbeddingConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(cls, tmp_path_factory: pytest.TempPathFactory) -> ConformanceTarget:
        return _target(tmp_path_factory)


@covers_hooks("werk_embedding_limits", "werk_rerank", "werk_tokenize")
class TestReferenceRerankConformance(EmbeddingConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(cls, tmp_path_factory: pytest.TempPathFactory) -> ConformanceTarget:
        return _target(tmp_path_factory, rerank=True)
