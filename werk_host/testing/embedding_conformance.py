"""The conformance suite every embedding (or reranking) plugin runs against the real HTTP app,
with one fixture (docs/plugin-kit.md, "Testing"; docs/embeddings.md, "Writing an embedding
backend")::

    import pytest
    from werk_host.testing.conformance import ConformanceTarget
    from werk_host.testing.embedding_conformance import EmbeddingConformance

    class TestEmbeddingConformance(EmbeddingConformance):
        @pytest.fixture(scope="class")
        @classmethod
        def conformance_target(cls) -> ConformanceTarget:
            return ConformanceTarget(entry_point="mine", model=Path("my-embedding-model"))

The host is the one the text suite starts (:func:`~werk_host.testing.conformance_target.served_target`).
The target's instance is an embedding instance or a reranking one (its
``werk_embedding_limits`` says which); the checks of the other kind are skipped. Over HTTP:

* the capability ids the plugin declares and reports are :class:`CapabilityId` s,
  ``api.embeddings`` (or ``api.rerank``) among them and ``supported`` once a request has run;
* ``werk_embedding_limits`` is coherent and stable;
* ``POST /v1/embeddings`` answers one vector per input, of the limits' width, unit length when
  the limits say normalized, the same vector for the same input and another for another, a
  batch larger than ``max_batch_inputs`` equal (to 1e-4) to the inputs one by one, ``base64``
  equal to ``float`` at float32 precision, and ``usage`` counting the prompt tokens;
  Ollama's ``/api/embed`` answers the same vectors;
* an input over ``max_input_tokens`` is a 400 naming the limit, and with ``truncate`` a vector;
  an empty input, too many inputs, a wrong type: 400; no error message carries a path or key;
* ``POST /v1/rerank`` (a reranking instance) answers a score per document, by descending score,
  ``top_n`` cut and ``return_documents`` texts, the same scores as the documents one by one.
"""

from __future__ import annotations

import base64
import json
import math
import re
import struct
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from werk_host import hookspecs
from werk_host.protocol import CapabilityId, CapabilityStatus
from werk_host.protocol.embeddings import MAX_EMBED_INPUTS, EmbeddingLimits
from werk_host.testing.conformance_target import ConformanceHost, ConformanceTarget, served_target

__all__ = ["EmbeddingConformance", "post_json"]

_PATH = re.compile(r"(?<![\w.])/(?:[\w.-]+/)+[\w.-]+")


def post_json(base: str, path: str, body: Any, key: str | None = None, timeout: float = 300) -> tuple[int, Any]:
    """``POST`` ``body`` as JSON: ``(status, decoded answer)``, error answers included."""
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def _close(a: list[float], b: list[float], tolerance: float) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= tolerance for x, y in zip(a, b, strict=True))


class EmbeddingConformance:
    """Subclass in an embedding plugin's tests with a class-scoped ``conformance_target`` fixture."""

    TEXTS: ClassVar[tuple[str, ...]] = (
        "The quick brown fox jumps over the lazy dog.",
        "Embeddings map text to vectors.",
        "hello",
        "A fourth sentence, different from the others.",
        "five",
        "Six is the last one.",
    )

    @pytest.fixture(scope="class")
    @classmethod
    def conformance_host(
        cls, conformance_target: ConformanceTarget, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[ConformanceHost]:
        with served_target(conformance_target, tmp_path_factory.mktemp("werk-embed-conformance") / "home") as host:
            yield host

    # -- helpers ----------------------------------------------------------------------------
    def _post(self, host: ConformanceHost, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        status, doc = post_json(host.api.base, path, {"model": host.model_name, **body}, host.key)
        if status >= 400:
            error = doc.get("error") if isinstance(doc, dict) else None
            host.errors.append(str(error.get("message", "") if isinstance(error, dict) else error))
        return status, doc

    def _limits(self, host: ConformanceHost) -> EmbeddingLimits:
        adapter = host.adapter
        limits = host.host.fleet.hooks.embedding_limits(adapter)
        assert isinstance(limits, EmbeddingLimits), f"{hookspecs.werk_embedding_limits.__name__} must answer limits"
        return limits

    def _embedding_host(self, host: ConformanceHost) -> EmbeddingLimits:
        limits = self._limits(host)
        if limits.rerank:
            pytest.skip("a reranking instance embeds nothing")
        return limits

    def _vectors(self, host: ConformanceHost, inputs: Any, **fields: Any) -> list[list[float]]:
        status, doc = self._post(host, "/v1/embeddings", {"input": inputs, **fields})
        assert status == 200, doc
        data = sorted(doc["data"], key=lambda d: d["index"])
        assert [d["index"] for d in data] == list(range(len(data)))
        return [d["embedding"] for d in data]

    # -- ids and limits ------------------------------------------------------------------------
    def test_ids_are_declared_reported_and_evidenced(self, conformance_host: ConformanceHost) -> None:
        host = conformance_host
        limits = self._limits(host)
        if limits.rerank:
            assert self._post(host, "/v1/rerank", {"query": "q", "documents": ["d"]})[0] == 200
        else:
            self._vectors(host, "evidence")
        plugins = host.host.plugins
        raw = plugins.dispatch(hookspecs.werk_capabilities.__name__, host.adapter) or {}
        assert isinstance(raw, dict), "werk_capabilities must return a mapping"
        assert not sorted(str(k) for k in raw if k not in set(CapabilityId)), "unknown capability ids reported"
        declared = {
            CapabilityId(c)
            for f in plugins.adapter_factories(host.host.config)
            if f.owner == plugins.owner_of(host.adapter)
            for c in f.capabilities
        }
        wanted = CapabilityId.RERANK if limits.rerank else CapabilityId.EMBEDDINGS
        assert wanted in declared, f"an embedding plugin declares {wanted}"
        assert not set(raw) - declared, "reported but not declared on the AdapterFactory"
        assert host.statuses()[wanted] is CapabilityStatus.SUPPORTED

    def test_limits_are_coherent_and_stable(self, conformance_host: ConformanceHost) -> None:
        limits = self._limits(conformance_host)
        assert limits.dimensions >= 1 and limits.max_input_tokens >= 1 and limits.max_batch_inputs >= 1
        assert limits.pooling, "the pooling is named"
        assert self._limits(conformance_host) == limits

    # -- vectors -----------------------------------------------------------------------------
    def test_one_vector_per_input_of_the_limits_width(self, conformance_host: ConformanceHost) -> None:
        host = conformance_host
        limits = self._embedding_host(host)
        vectors = self._vectors(host, list(self.TEXTS[:3]))
        assert len(vectors) == 3 and all(len(v) == limits.dimensions for v in vectors)
        assert all(all(isinstance(x, float) and math.isfinite(x) for x in v) for v in vectors)
        if limits.normalized:
            assert all(abs(math.sqrt(math.fsum(x * x for x in v)) - 1) < 1e-3 for v in vectors)
        again = self._vectors(host, self.TEXTS[0])[0]
        assert _close(again, vectors[0], 1e-5), "the same input gives the same vector"
        assert not _close(vectors[0], vectors[1], 1e-3), "different inputs give different vectors"

    def test_a_batch_equals_its_inputs_one_by_one(self, conformance_host: ConformanceHost) -> None:
        host = conformance_host
        limits = self._embedding_host(host)
        count = min(max(limits.max_batch_inputs + 1, len(self.TEXTS)), 2 * len(self.TEXTS))
        texts = [self.TEXTS[i % len(self.TEXTS)] + (" again" * (i // len(self.TEXTS))) for i in range(count)]
        status, doc = self._post(host, "/v1/embeddings", {"input": texts})
        assert status == 200, doc
        batch = [d["embedding"] for d in sorted(doc["data"], key=lambda d: d["index"])]
        singles = [self._vectors(host, t)[0] for t in texts]
        assert all(_close(a, b, 1e-4) for a, b in zip(batch, singles, strict=True))
        usage = doc["usage"]
        assert usage["prompt_tokens"] >= len(texts) and usage["total_tokens"] == usage["prompt_tokens"]

    def test_base64_is_the_float32_of_the_floats(self, conformance_host: ConformanceHost) -> None:
        host = conformance_host
        self._embedding_host(host)
        floats = self._vectors(host, self.TEXTS[1])[0]
        encoded = self._vectors(host, self.TEXTS[1], encoding_format="base64")[0]
        assert isinstance(encoded, str)
        raw = base64.b64decode(encoded)
        decoded = list(struct.unpack(f"<{len(raw) // 4}f", raw))
        assert _close(decoded, floats, 1e-6)

    def test_ollama_embed_answers_the_same_vectors(self, conformance_host: ConformanceHost) -> None:
        host = conformance_host
        limits = self._embedding_host(host)
        vector = self._vectors(host, self.TEXTS[2])[0]
        status, doc = self._post(host, "/api/embed", {"input": [self.TEXTS[2]]})
        assert status == 200, doc
        unit = vector if limits.normalized else [x / math.sqrt(math.fsum(y * y for y in vector)) for x in vector]
        assert _close(doc["embeddings"][0], unit, 1e-5) and doc["prompt_eval_count"] >= 1
        status, legacy = self._post(host, "/api/embeddings", {"prompt": self.TEXTS[2]})
        assert status == 200 and _close(legacy["embedding"], unit, 1e-5)

    # -- bounds ------------------------------------------------------------------------------
    def test_an_over_long_input_is_refused_or_truncated(self, conformance_host: ConformanceHost) -> None:
        host = conformance_host
        limits = self._embedding_host(host)
        long = " ".join(["word"] * (limits.max_input_tokens + 16))
        status, doc = self._post(host, "/v1/embeddings", {"input": long})
        assert status == 400, doc
        assert str(limits.max_input_tokens) in doc["error"]["message"]
        ids = [5] * (limits.max_input_tokens + 1)
        assert self._post(host, "/v1/embeddings", {"input": ids})[0] == 400
        cut = self._vectors(host, long, truncate=True)
        assert len(cut) == 1 and len(cut[0]) == limits.dimensions

    def test_bad_input_is_a_400_without_paths_or_keys(self, conformance_host: ConformanceHost) -> None:
        host = conformance_host
        self._embedding_host(host)
        for bad in ("", [], [""], 5, [1.5], {"text": "x"}, ["ok", 3], ["x"] * (MAX_EMBED_INPUTS + 1)):
            status, doc = self._post(host, "/v1/embeddings", {"input": bad})
            assert status == 400, (bad if not isinstance(bad, list) or len(bad) < 10 else "too many", doc)
            assert doc["error"]["type"] == "invalid_request_error"
        assert self._post(host, "/v1/embeddings", {"input": "x", "encoding_format": "int8"})[0] == 400
        assert self._post(host, "/v1/embeddings", {"input": "x", "dimensions": 0})[0] == 400
        assert self._post(host, "/v1/embeddings", {"input": "x", "frobnicate": 1})[0] == 400
        for message in host.errors:
            assert not _PATH.search(message), f"a path in an error message: {message!r}"
            assert host.key not in message

    # -- rerank ------------------------------------------------------------------------------
    def test_rerank_scores_every_document_in_order(self, conformance_host: ConformanceHost) -> None:
        host = conformance_host
        limits = self._limits(host)
        if not limits.rerank:
            pytest.skip("an embedding instance reranks nothing")
        documents = list(self.TEXTS)
        status, doc = self._post(host, "/v1/rerank", {"query": "fox and dog", "documents": documents})
        assert status == 200, doc
        results = doc["results"]
        assert sorted(r["index"] for r in results) == list(range(len(documents)))
        scores = [r["relevance_score"] for r in results]
        assert scores == sorted(scores, reverse=True)
        singles = {}
        for i, d in enumerate(documents):
            status, one = self._post(host, "/v1/rerank", {"query": "fox and dog", "documents": [d]})
            assert status == 200, one
            singles[i] = one["results"][0]["relevance_score"]
        assert all(abs(r["relevance_score"] - singles[r["index"]]) < 1e-4 for r in results)
        status, top = self._post(
            host, "/v1/rerank", {"query": "fox and dog", "documents": documents, "top_n": 2, "return_documents": True}
        )
        assert status == 200 and [r["index"] for r in top["results"]] == [r["index"] for r in results[:2]]
        assert all(r["document"]["text"] == documents[r["index"]] for r in top["results"])
        assert self._post(host, "/v1/rerank", {"query": "q", "documents": []})[0] == 400
        assert self._post(host, "/v1/embeddings", {"input": "x"})[0] == 400, "a reranking instance embeds nothing"
