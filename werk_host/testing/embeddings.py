"""A reference embedding backend: the seam's embedding hooks in pure Python, for fast host tests
and as the smallest embedding adapter a plugin author can read (docs/embeddings.md, "Writing an
embedding backend").

:class:`ReferenceEmbeddingPlugin` offers one factory, backend ``refembed``, that serves any
manifest pinned to it. Its tokenizer is a BOS token (id 1) then one token per UTF-8 byte (ids
``3 + byte``); token-id inputs are taken as they are. A token's vector is drawn from a hash of
its id; an input's embedding is the mean of its tokens' vectors, L2-normalized, so the same
input always gives the same vector and a different one another, as a real engine does. Its
manifest params: ``dimensions`` (default 16), ``max_input_tokens`` (64), ``max_batch_inputs``
(4: the host's batching is exercised), ``truncatable`` (Matryoshka vectors), ``delay_s`` (each
call lasts that long, for tests of admission) and ``rerank`` (a reranking instance: a
document's score is the dot product of its and the query's embeddings). ``calls`` counts the
batches each adapter ran, ``tokenized`` the texts it tokenized; ``fail_next`` (a plugin
attribute) makes the next call fail with ``unavailable``.
"""

from __future__ import annotations

import hashlib
import math
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Final

from werk_host import hookimpl
from werk_host.config import HostConfig
from werk_host.errors import ErrorCode, WerkError
from werk_host.models import ModelManifest
from werk_host.protocol.base import CapabilityStatus
from werk_host.protocol.discovery import CapabilityId
from werk_host.protocol.embeddings import EmbeddingLimits, EmbeddingResult, EmbedInput, RerankResult
from werk_host.seam import AdapterFactory, CapabilityReport, EmbeddingWork, RerankWork

__all__ = ["EMBED_BACKEND", "ReferenceEmbeddingAdapter", "ReferenceEmbeddingPlugin", "reference_vector"]

EMBED_BACKEND: Final = "refembed"
BOS: Final = 1


def reference_tokens(text: str) -> list[int]:
    return [BOS, *(3 + b for b in text.encode())]


def _token_vector(token: int, dimensions: int) -> list[float]:
    raw = b""
    block = struct.pack("<q", token)
    while len(raw) < 4 * dimensions:
        block = hashlib.sha256(block).digest()
        raw += block
    return [(v / 2**31) for v in struct.unpack(f"<{dimensions}i", raw[: 4 * dimensions])]


def reference_vector(item: EmbedInput, dimensions: int) -> list[float]:
    """The reference backend's embedding of ``item`` (module docstring)."""
    tokens = reference_tokens(item) if isinstance(item, str) else item
    total = [0.0] * dimensions
    for token in tokens:
        for i, x in enumerate(_token_vector(token, dimensions)):
            total[i] += x
    norm = math.sqrt(math.fsum(x * x for x in total)) or 1.0
    return [x / norm for x in total]


def _dot(a: list[float], b: list[float]) -> float:
    return math.fsum(x * y for x, y in zip(a, b, strict=True))


def _param(manifest: ModelManifest, name: str, default: int) -> int:
    value = manifest.params.get(name, default)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


@dataclass
class ReferenceEmbeddingAdapter:
    """One instance of a ``refembed`` model (module docstring)."""

    plugin: ReferenceEmbeddingPlugin
    manifest: ModelManifest
    backend: str = EMBED_BACKEND
    instance_id: str = ""
    calls: int = 0
    tokenized: int = 0
    closed: bool = False

    def __post_init__(self) -> None:
        self.instance_id = f"{EMBED_BACKEND}:{self.manifest.name}"
        self.rerank_mode = self.manifest.params.get("rerank") is True
        self.limits = EmbeddingLimits(
            dimensions=_param(self.manifest, "dimensions", 16),
            pooling="rank" if self.rerank_mode else "mean",
            normalized=True,
            max_input_tokens=_param(self.manifest, "max_input_tokens", 64),
            max_batch_inputs=_param(self.manifest, "max_batch_inputs", 4),
            truncatable=self.manifest.params.get("truncatable") is True,
            max_concurrent_requests=2,
            rerank=self.rerank_mode,
        )

    def identity(self) -> str:
        return f"{self.instance_id}#0"

    def close(self) -> None:
        self.closed = True

    @hookimpl(specname="werk_capabilities")
    def capabilities(self) -> dict[CapabilityId, CapabilityReport]:
        here = "the reference embedder is in this process"
        kind = "reranks" if self.rerank_mode else "embeds"
        no = CapabilityReport(CapabilityStatus.UNSUPPORTED, f"this instance {kind}")
        yes = CapabilityReport(CapabilityStatus.SUPPORTED, here)
        if self.rerank_mode:
            return {CapabilityId.EMBEDDINGS: no, CapabilityId.RERANK: yes}
        return {CapabilityId.EMBEDDINGS: yes, CapabilityId.RERANK: no}

    @hookimpl(specname="werk_embedding_limits")
    def embedding_limits(self) -> EmbeddingLimits:
        return self.limits

    def _call(self, size: int) -> None:
        assert size <= self.limits.max_batch_inputs, "the host bounds the batch"
        self.calls += 1
        delay = self.manifest.params.get("delay_s", 0)
        if isinstance(delay, int | float) and delay > 0:
            time.sleep(delay)
        if self.plugin.fail_next:
            self.plugin.fail_next = False
            raise WerkError(ErrorCode.UNAVAILABLE, "the reference embedder stopped", retryable=True)

    @hookimpl(specname="werk_embed")
    def embed(self, work: EmbeddingWork) -> EmbeddingResult:
        if self.rerank_mode:
            raise WerkError(ErrorCode.INVALID_REQUEST, "a reranking instance embeds nothing")
        self._call(len(work.inputs))
        tokens = [reference_tokens(x) if isinstance(x, str) else x for x in work.inputs]
        assert all(len(t) <= self.limits.max_input_tokens for t in tokens), "the host bounds every input"
        vectors = [reference_vector(t, self.limits.dimensions) for t in tokens]
        return EmbeddingResult(vectors=vectors, prompt_tokens=sum(len(t) for t in tokens))

    @hookimpl(specname="werk_rerank")
    def rerank(self, work: RerankWork) -> RerankResult:
        self._call(len(work.documents))
        width = self.limits.dimensions
        query = reference_vector(work.query, width)
        scores = [_dot(query, reference_vector(d, width)) for d in work.documents]
        tokens = sum(len(reference_tokens(work.query)) + len(reference_tokens(d)) for d in work.documents)
        return RerankResult(scores=scores, prompt_tokens=tokens)

    @hookimpl(specname="werk_tokenize")
    def tokenize(self, text: str) -> list[int]:
        self.tokenized += 1
        return reference_tokens(text)


@dataclass
class ReferenceEmbeddingPlugin:
    """The plugin object (register it as ``PLUGIN_NAME``)."""

    PLUGIN_NAME: str = EMBED_BACKEND
    adapters: list[ReferenceEmbeddingAdapter] = field(default_factory=list)
    fail_next: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def create(self, config: HostConfig, model: ModelManifest | None) -> ReferenceEmbeddingAdapter:
        if model is None:
            raise WerkError(ErrorCode.INVALID_REQUEST, "the reference embedding backend needs a model")
        adapter = ReferenceEmbeddingAdapter(self, model)
        with self.lock:
            self.adapters.append(adapter)
        return adapter

    @hookimpl
    def werk_adapter_factories(self, config: HostConfig) -> list[AdapterFactory]:
        return [
            AdapterFactory(
                EMBED_BACKEND,
                lambda m: m is not None and m.backend == EMBED_BACKEND,
                self.create,
                "reference embeddings from hashed byte tokens (tests)",
                (CapabilityId.EMBEDDINGS, CapabilityId.RERANK),
            )
        ]
