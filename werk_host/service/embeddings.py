"""Embeddings and reranking for every route (docs/embeddings.md).

:class:`EmbeddingService` is the one path an embedding or rerank request takes, whichever route
it came by (OpenAI ``/v1/embeddings``, Ollama ``/api/embed`` and ``/api/embeddings``,
``/v1/rerank``). The contract:

* **Which instance.** ``model`` names an instance id, a served model name or an alias (the
  deployment set's own routing, as for chats); without one, the first running instance that
  is of the kind asked (its adapter's limits say so), else the first cold instance whose backend
  declares ``api.embeddings`` (``api.rerank`` for a rerank). The instance's adapter then says
  what it is (``werk_embedding_limits``): ``None`` (a chat instance) or the wrong kind (an
  embedding instance asked to rerank, or the reverse) is ``invalid_request`` naming the model,
  before any work.
* **Admission as for chats.** A request holds a gate ticket (the host-wide and per-key bounds,
  docs/operations.md, "Inference concurrency") and a seat on its instance (its
  ``max_concurrent_requests``), and keeps the instance in use (no keep-alive unload under it)
  until it ends.
* **Every input checked before any is embedded.** An input's tokens are bounded by
  ``max_input_tokens``. A text whose UTF-8 length plus :data:`SPECIAL_MARGIN` fits is proven to
  fit without a tokenizer (every token of the byte-level and SentencePiece tokenizers covers at
  least one byte, beyond a few special and prefix tokens); a longer one is tokenized by the
  backend (``werk_tokenize``). One over the limit is ``invalid_request`` naming the input, its
  tokens and the limit, unless the client asked to ``truncate``: then its first
  ``max_input_tokens`` token ids are embedded. Token-id inputs are checked by their length.
  For a rerank, each query and document pair is checked the same way (never truncated).
* **Batches.** The inputs go to the backend in batches of at most ``max_batch_inputs``, in
  order; the vectors come back in the inputs' order, each of the adapter's ``dimensions``
  (a backend answer of another count or width is ``unavailable``, never passed on).
* **``dimensions``.** The model's own width is always accepted; a smaller one only where the
  adapter says its vectors are truncatable (Matryoshka): the first ``d`` components,
  renormalized. Anything else is ``invalid_request``.
* **Counting.** Each request counts in its instance's ``requests_total`` (``requests_failed``,
  ``requests_rejected``) and its prompt tokens in ``prompt_tokens_total``, in
  ``/werk/v1/observability`` and ``/metrics``; the answer's ``usage`` carries the same count.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final

from werk_host.deployments.instances import Instance
from werk_host.errors import ErrorCode, WerkError
from werk_host.protocol.discovery import CapabilityId
from werk_host.protocol.embeddings import EmbeddingLimits, EmbedInput
from werk_host.seam import Adapter, EmbeddingWork, RerankWork, client_disconnected
from werk_host.service.counters import ChatStats
from werk_host.service.fleet import Fleet
from werk_host.service.gate import InferenceGate, Ticket
from werk_host.service.principals import Principal

__all__ = ["SPECIAL_MARGIN", "Embedded", "EmbeddingService", "Reranked", "normalized"]

#: Tokens a text may take beyond its UTF-8 bytes: special tokens (BOS, EOS, CLS, SEP) and a
#: SentencePiece prefix space (module docstring, "Every input checked").
SPECIAL_MARGIN: Final = 8


@dataclass(frozen=True)
class Embedded:
    """The vectors of one request, in the inputs' order, and what served them."""

    vectors: list[list[float]]
    prompt_tokens: int
    instance: Instance
    limits: EmbeddingLimits
    seconds: float
    load_seconds: float


@dataclass(frozen=True)
class Reranked:
    """One score per document, in the documents' order, and what served them."""

    scores: list[float]
    prompt_tokens: int
    instance: Instance


@dataclass(frozen=True)
class _Admitted:
    """One admitted request's scope: its instance, adapter, limits and gate ticket."""

    stats: ChatStats
    instance: Instance
    adapter: Adapter
    limits: EmbeddingLimits
    ticket: Ticket | None

    def seat(self) -> None:
        """A seat on the instance (its ``max_concurrent_requests``); a refusal counts as rejected."""
        if self.ticket is None:
            return
        try:
            self.ticket.seat(self.instance.id, self.limits.max_concurrent_requests, client_disconnected.get())
        except WerkError:
            self.stats.add(instance=self.instance.id, requests_rejected=1)
            raise


def normalized(vector: list[float]) -> list[float]:
    """``vector`` scaled to unit L2 norm (a zero vector unchanged)."""
    norm = math.sqrt(math.fsum(x * x for x in vector))
    return [x / norm for x in vector] if norm > 0 else vector


def _too_long(index: int, tokens: int, limit: int, truncatable: bool) -> WerkError:
    hint = " (ask for truncation to embed its first tokens)" if truncatable else ""
    return WerkError(
        ErrorCode.INVALID_REQUEST,
        f"input {index} has {tokens} tokens; this model takes at most {limit} tokens per input{hint}",
        details={"openai_code": "context_length_exceeded"},
    )


class EmbeddingService:
    """The embedding and rerank path of every route (module docstring)."""

    def __init__(self, fleet: Fleet, stats: ChatStats, gate: InferenceGate | None = None) -> None:
        self.fleet = fleet
        self.stats = stats
        self.gate = gate

    # -- instances -------------------------------------------------------------------------
    def resolve(self, model: str | None, *, rerank: bool = False) -> Instance:
        """The instance serving ``model`` (module docstring, "Which instance")."""
        capability = CapabilityId.RERANK if rerank else CapabilityId.EMBEDDINGS
        deployments = self.fleet.deployments
        if deployments is not None and model is not None:
            return deployments.route(model)
        if deployments is not None:
            cold: Instance | None = None
            for instance in deployments.instances.values():
                if capability not in instance.factory.capabilities:
                    continue
                adapter = instance.peek()
                if adapter is None:
                    cold = cold or instance
                    continue
                limits = self.fleet.hooks.embedding_limits(adapter)
                if limits is not None and limits.rerank == rerank:
                    return instance
            if cold is not None:
                return cold
        default = self.fleet.default
        if default is None:
            what = "reranking" if rerank else "embeddings"
            raise WerkError(ErrorCode.UNSUPPORTED, f"{what} is not supported: no backend adapter is active")
        if deployments is None and model is not None and model != default.id and model != default.manifest.name:
            raise WerkError(ErrorCode.NOT_FOUND, "model is not served here", details={"openai_code": "model_not_found"})
        return default

    def _limits(self, name: str, adapter: Adapter, rerank: bool) -> EmbeddingLimits:
        limits = self.fleet.hooks.embedding_limits(adapter)
        if limits is None:
            what = "reranking" if rerank else "embeddings"
            message = f"{json.dumps(name)} does not support {what}: it is a chat model"
            raise WerkError(ErrorCode.INVALID_REQUEST, message)
        if limits.rerank != rerank:
            does = "reranks documents" if limits.rerank else "computes embeddings"
            raise WerkError(ErrorCode.INVALID_REQUEST, f"{json.dumps(name)} only {does}")
        return limits

    @contextmanager
    def _admitted(
        self, principal: Principal, instance: Instance, name: str | None, rerank: bool
    ) -> Iterator[_Admitted]:
        """``instance``'s adapter and limits under a gate ticket, the instance in use throughout
        (module docstring, "Admission"); the seat is taken (:meth:`_Admitted.seat`) once the
        inputs are checked."""
        ticket = None
        if self.gate is not None:
            try:
                ticket = self.gate.enter(principal.id)
            except WerkError:
                self.stats.add(instance=instance.id, requests_rejected=1)
                raise
        try:
            adapter = instance.use(enter=True)
            try:
                limits = self._limits(name or instance.id, adapter, rerank)
                yield _Admitted(self.stats, instance, adapter, limits, ticket)
            finally:
                instance.leave()
        finally:
            if ticket is not None:
                ticket.release()

    # -- checks ----------------------------------------------------------------------------
    def _fit(
        self, adapter: Adapter, limits: EmbeddingLimits, index: int, item: EmbedInput, truncate: bool
    ) -> EmbedInput:
        """``item`` as it is embedded: unchanged when it fits, its first tokens when it does not
        and ``truncate`` (module docstring, "Every input checked")."""
        limit = limits.max_input_tokens
        if isinstance(item, list):
            if len(item) <= limit:
                return item
            if truncate:
                return item[:limit]
            raise _too_long(index, len(item), limit, True)
        if len(item) + SPECIAL_MARGIN <= limit and len(item.encode()) + SPECIAL_MARGIN <= limit:
            return item
        ids = self.fleet.hooks.tokenize(adapter, item)
        if ids is None or len(ids) <= limit:
            return item  # without a tokenizer the backend's own bound answers
        if truncate:
            return ids[:limit]
        raise _too_long(index, len(ids), limit, True)

    def _fit_pair(self, adapter: Adapter, limits: EmbeddingLimits, index: int, query: str, document: str) -> None:
        limit = limits.max_input_tokens
        if len(query.encode()) + len(document.encode()) + 2 * SPECIAL_MARGIN <= limit:
            return
        tokenize = self.fleet.hooks.tokenize
        first, second = tokenize(adapter, query), tokenize(adapter, document)
        if first is None or second is None:
            return
        if len(first) + len(second) > limit:
            raise _too_long(index, len(first) + len(second), limit, False)

    @staticmethod
    def _dimensions(instance: Instance, limits: EmbeddingLimits, dimensions: int | None) -> int | None:
        """The width to cut the vectors to, ``None`` for the model's own (module docstring)."""
        if dimensions is None or dimensions == limits.dimensions:
            return None
        if dimensions < limits.dimensions and limits.truncatable:
            return dimensions
        raise WerkError(
            ErrorCode.INVALID_REQUEST,
            f"model {instance.id} returns {limits.dimensions}-dimensional vectors"
            + ("" if limits.truncatable else " and cannot shorten them")
            + f"; dimensions {dimensions} is not available",
        )

    # -- running ---------------------------------------------------------------------------
    def embed(
        self,
        principal: Principal,
        model: str | None,
        inputs: list[EmbedInput],
        *,
        truncate: bool = False,
        dimensions: int | None = None,
    ) -> Embedded:
        """The vectors of ``inputs`` for ``principal`` (module docstring)."""
        instance = self.resolve(model)
        began = time.monotonic()
        with self._admitted(principal, instance, model, False) as admitted:
            adapter, limits = admitted.adapter, admitted.limits
            loaded = time.monotonic() - began
            width = self._dimensions(instance, limits, dimensions)
            items = [self._fit(adapter, limits, i, item, truncate) for i, item in enumerate(inputs)]
            admitted.seat()
            vectors, tokens = self._run(instance, adapter, limits, items)
        if width is not None:
            vectors = [normalized(v[:width]) for v in vectors]
        return Embedded(vectors, tokens, instance, limits, time.monotonic() - began, loaded)

    def rerank(self, principal: Principal, model: str | None, query: str, documents: list[str]) -> Reranked:
        """One relevance score per document for ``query`` (module docstring)."""
        instance = self.resolve(model, rerank=True)
        with self._admitted(principal, instance, model, True) as admitted:
            adapter, limits = admitted.adapter, admitted.limits
            for i, document in enumerate(documents):
                self._fit_pair(adapter, limits, i, query, document)
            admitted.seat()
            scores, tokens = self._scores(instance, adapter, limits, query, documents)
        return Reranked(scores, tokens, instance)

    @staticmethod
    def _cancelled() -> Callable[[], bool]:
        gone = client_disconnected.get()
        return gone if gone is not None else lambda: False

    @contextmanager
    def _counted(self, instance: Instance) -> Iterator[Callable[[int], None]]:
        """One request counted active on ``instance`` while it runs; the callback adds its
        prompt tokens; a failure (not a client that went away) counts as failed."""
        stats, label = self.stats, instance.id
        stats.add(instance=label, requests_total=1, requests_active=1)
        try:
            yield lambda tokens: stats.add(instance=label, prompt_tokens_total=tokens)
        except BaseException:
            gone = client_disconnected.get()
            stats.add(instance=label, requests_failed=0 if gone is not None and gone() else 1)
            raise
        finally:
            stats.add(instance=label, requests_active=-1)

    def _scores(
        self, instance: Instance, adapter: Adapter, limits: EmbeddingLimits, query: str, documents: list[str]
    ) -> tuple[list[float], int]:
        cancelled = self._cancelled()
        scores: list[float] = []
        tokens = 0
        step = limits.max_batch_inputs
        with self._counted(instance) as count:
            for start in range(0, len(documents), step):
                batch = documents[start : start + step]
                result = self.fleet.hooks.rerank(adapter, RerankWork(query, batch, cancelled))
                if result is None:
                    raise WerkError(ErrorCode.UNSUPPORTED, f"reranking is not supported by backend {adapter.backend}")
                if len(result.scores) != len(batch) or not all(math.isfinite(s) for s in result.scores):
                    raise WerkError(ErrorCode.UNAVAILABLE, "the backend answered a malformed rerank", retryable=True)
                scores += result.scores
                tokens += result.prompt_tokens
            count(tokens)
        return scores, tokens

    def _run(
        self, instance: Instance, adapter: Adapter, limits: EmbeddingLimits, items: list[EmbedInput]
    ) -> tuple[list[list[float]], int]:
        cancelled = self._cancelled()
        vectors: list[list[float]] = []
        tokens = 0
        step = limits.max_batch_inputs
        with self._counted(instance) as count:
            for start in range(0, len(items), step):
                batch = items[start : start + step]
                result = self.fleet.hooks.embed(adapter, EmbeddingWork(batch, cancelled))
                if result is None:
                    raise WerkError(ErrorCode.UNSUPPORTED, f"embeddings are not supported by backend {adapter.backend}")
                if len(result.vectors) != len(batch) or any(len(v) != limits.dimensions for v in result.vectors):
                    raise WerkError(ErrorCode.UNAVAILABLE, "the backend answered malformed embeddings", retryable=True)
                vectors += result.vectors
                tokens += result.prompt_tokens
            count(tokens)
        return vectors, tokens
