"""Embedding and reranking instances of llama.cpp: one managed ``llama-server`` started with
``--embeddings --pooling <type>`` (or ``--reranking``), served through the host's embedding hooks
(docs/embeddings.md; docs/deployments.md, "Embedding instances").

Which instances: a llama.cpp instance is an embedding instance when its ``pooling`` option says
so (``mean``, ``cls``, ``last``; ``rank`` for a reranker), or, without the option, when the GGUF
header's ``<arch>.pooling_type`` names a pooling (:func:`instance_pooling`); ``pooling = "none"``
keeps a chat instance of such a file. A chat instance and an embedding instance of one file are
two profile instances, two children.

The child: ``-np <parallel>`` slots of ``<ctx / parallel>`` tokens each, with the physical and
logical batch (``-ub``, ``-b``) set to the per-slot context, so that any input up to the per-slot
context fits one batch (llama-server refuses an embedding input above its physical batch), and
``--kv-unified``: with a cache split per slot, this llama-server build embeds a batch of inputs of
different lengths wrongly (the longer ones' vectors differ from the same inputs one by one; the
conformance suite's batch check), with one unified cache it gives exactly the one-by-one vectors.
A reranking instance runs one slot (``-np 1``, whatever ``parallel`` says): its rank pooling of
several sequences in one batch gives other scores than the documents one by one, even with one
unified cache, so its documents are scored one sequence at a time.
No ``--slot-save-path``: an embedding instance keeps no states. ``--alias`` is the manifest name.

Evidence (:meth:`LlamaEmbeddingAdapter.embedding_limits`, read once per child): the vector width
and whether vectors are unit length from a real embedding of a probe text (a rerank of a probe
pair for a reranker), the per-slot context from ``/props``; the most inputs per call is
:data:`MAX_BATCH_INPUTS`; the concurrent requests are the slots. Until a child answered, the
capabilities say ``unavailable``; afterwards ``api.embeddings`` (or ``api.rerank``) is
``supported`` and every state, prefill/decode and chat capability ``unsupported``.

Requests: ``werk_embed`` posts the batch (strings and token-id lists as given) to the child's
``/v1/embeddings`` and returns its vectors in the inputs' order with its ``usage``; ``werk_rerank``
posts to ``/v1/rerank`` with ``top_n`` = every document and returns the scores in the documents'
order; ``werk_tokenize`` is ``/tokenize`` with the special tokens. Chat and completion requests
are ``invalid_request`` (an embedding instance generates no text). A child that died is started
again on the next request.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import replace
from typing import Any, Final

from werk_host.plugin import (
    CapabilityId,
    CapabilityReport,
    CapabilityStatus,
    EmbeddingLimits,
    EmbeddingResult,
    EmbeddingWork,
    ErrorCode,
    HostConfig,
    InferenceResponse,
    JsonObject,
    ModelManifest,
    RerankResult,
    RerankWork,
    WerkError,
    hookimpl,
)
from werk_host.plugin.http import ConnectionPool, post_json

from .binary import find_llama_server
from .capabilities import REPORTED_CAPABILITIES
from .core import BACKEND_ID, start_child
from .gguf_meta import GgufError, read_metadata, trained_context
from .modelfiles import release_wanted
from .native import NativeError
from .options import POOLINGS
from .process import LlamaServerProcess

__all__ = ["POOLINGS", "LlamaEmbeddingAdapter", "instance_pooling"]

log = logging.getLogger(__name__)

#: GGUF ``<arch>.pooling_type`` values (llama.cpp's ``llama_pooling_type``).
_GGUF_POOLING: Final = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}
#: The most inputs one backend call carries (the host splits larger requests).
MAX_BATCH_INPUTS: Final = 64
#: The per-slot context when neither ``ctx`` nor the GGUF header says one.
DEFAULT_SLOT_CONTEXT: Final = 512
#: The per-slot context's default bound (inputs of embedding models are short).
MAX_DEFAULT_SLOT_CONTEXT: Final = 8192
_PROBE_TEXT: Final = "Werk embedding probe."


def gguf_pooling(manifest: ModelManifest) -> str | None:
    """The pooling the GGUF header names (``None``: none, or not readable)."""
    try:
        meta = read_metadata(manifest.primary_path)
    except (GgufError, OSError):
        return None
    arch = meta.get("general.architecture")
    value = meta.get(f"{arch}.pooling_type") if isinstance(arch, str) else None
    return _GGUF_POOLING.get(value) if isinstance(value, int) and not isinstance(value, bool) else None


def instance_pooling(manifest: ModelManifest, options: dict[str, Any]) -> str | None:
    """The pooling of an embedding instance, ``None`` for a chat instance (module docstring)."""
    chosen = options.get("pooling")
    found = chosen if isinstance(chosen, str) else gguf_pooling(manifest)
    return None if found in (None, "none") else found


class LlamaEmbeddingAdapter:
    """One embedding (or reranking) instance's managed ``llama-server`` (module docstring)."""

    backend = BACKEND_ID

    def __init__(self, config: HostConfig, manifest: ModelManifest, options: dict[str, Any], pooling: str) -> None:
        self.config = config
        self.manifest = manifest
        self.pooling = pooling
        self.rerank_mode = pooling == "rank"
        self.instance_id = f"llamacpp:{manifest.name}"
        self.binary_path = find_llama_server(options.get("llama_server"))
        # a reranker runs one slot (module docstring): the option is not honoured, and says so
        self.parallel = 1 if self.rerank_mode else int(options.get("parallel", 2))
        if self.rerank_mode and int(options.get("parallel", 1)) != 1:
            log.warning("%s: a reranking instance runs one llama-server slot; parallel is ignored", manifest.name)
        if "ctx" in options:
            self.slot_context = max(int(options["ctx"]) // self.parallel, 1)
        else:
            trained = self._trained_context()
            self.slot_context = min(trained or DEFAULT_SLOT_CONTEXT, MAX_DEFAULT_SLOT_CONTEXT)
        self.threads = int(options["threads"]) if "threads" in options else None
        self._life = threading.RLock()
        self._process: LlamaServerProcess | None = None
        self._pool: ConnectionPool | None = None
        self._limits: tuple[str, EmbeddingLimits] | None = None
        self.closed = False

    def _trained_context(self) -> int | None:
        try:
            return trained_context(read_metadata(self.manifest.primary_path))
        except (GgufError, OSError):
            return None

    def _args(self) -> list[str]:
        size = str(self.slot_context)
        mode = ["--reranking"] if self.rerank_mode else ["--embeddings", "--pooling", self.pooling]
        return [*mode, "-ub", size, "-b", size, "--kv-unified", "--alias", self.manifest.name]

    # -- the child -------------------------------------------------------------------------
    def process(self) -> LlamaServerProcess:
        """The live child, starting a fresh one when none is alive."""
        with self._life:
            if self.closed:
                raise WerkError(ErrorCode.UNAVAILABLE, "the llama.cpp adapter is shut down", retryable=True)
            proc = self._process
            if proc is not None and proc.alive():
                return proc
            if proc is not None:
                log.warning("llama-server (embeddings, %s) is gone; starting a fresh one", proc.generation[:8])
                proc.stop()
                if self._pool is not None:
                    self._pool.close()
                self._pool, self._limits = None, None
            proc = LlamaServerProcess(
                self.manifest.primary_path,
                binary=self.binary_path,
                parallel=self.parallel,
                ctx=self.parallel * self.slot_context,
                work_dir=self.config.home / "backends" / "llamacpp",
                threads=self.threads,
                extra_args=self._args(),
                slot_save=False,
                cache_release=release_wanted(self.config.model_cache_release),
            )
            start_child(proc)
            self._process = proc
            # an embedding answer is an inference answer: the first-byte bound is its wait, not the
            # short calls' (docs/operations.md, "Backend failures")
            bounds = replace(self.config.backend_bounds, call_s=self.config.backend_bounds.first_byte_s)
            self._pool = ConnectionPool(proc.host, proc.port or 0, api_key=proc.api_key, bounds=bounds)
            return proc

    def _connection(self) -> tuple[LlamaServerProcess, ConnectionPool]:
        proc = self.process()
        pool = self._pool
        assert pool is not None
        return proc, pool

    def identity(self) -> str:
        proc = self._process
        return f"{self.instance_id}#{proc.generation if proc is not None and proc.alive() else 'none'}"

    def close(self) -> None:
        with self._life:
            self.closed = True
            proc, self._process = self._process, None
            if self._pool is not None:
                self._pool.close()
            self._pool = None
        if proc is not None:
            proc.stop()

    # -- evidence ----------------------------------------------------------------------------
    @hookimpl(specname="werk_embedding_limits")
    def embedding_limits(self) -> EmbeddingLimits:
        proc, pool = self._connection()
        kept = self._limits
        if kept is not None and kept[0] == proc.generation:
            return kept[1]
        with self._life:  # the child's own client is one connection
            return self._measured(proc, pool)

    def _measured(self, proc: LlamaServerProcess, pool: ConnectionPool) -> EmbeddingLimits:
        kept = self._limits
        if kept is not None and kept[0] == proc.generation:
            return kept[1]
        assert proc.client is not None
        try:
            props = proc.client.props()
        except NativeError as err:
            raise WerkError(ErrorCode.UNAVAILABLE, "llama-server is not answering", retryable=True) from err
        settings = props.get("default_generation_settings")
        n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
        context = min(n_ctx, self.slot_context) if isinstance(n_ctx, int) and n_ctx > 0 else self.slot_context
        if self.rerank_mode:
            self._rerank(pool, _PROBE_TEXT, [_PROBE_TEXT])
            width, unit = 1, False
        else:
            vector = self._embed(pool, [_PROBE_TEXT])[0][0]
            width = len(vector)
            unit = abs(math.sqrt(math.fsum(x * x for x in vector)) - 1.0) < 1e-4
        limits = EmbeddingLimits(
            dimensions=width,
            pooling=self.pooling,
            normalized=unit,
            max_input_tokens=context,
            max_batch_inputs=MAX_BATCH_INPUTS,
            max_concurrent_requests=proc.effective_parallel(),
            rerank=self.rerank_mode,
        )
        self._limits = (proc.generation, limits)
        return limits

    @hookimpl(specname="werk_capabilities")
    def capabilities(self) -> dict[CapabilityId, CapabilityReport]:
        proc, kept = self._process, self._limits
        answered = proc is not None and proc.alive() and kept is not None and kept[0] == proc.generation
        mine = CapabilityId.RERANK if self.rerank_mode else CapabilityId.EMBEDDINGS
        other = CapabilityId.EMBEDDINGS if self.rerank_mode else CapabilityId.RERANK
        kind = "a reranking" if self.rerank_mode else f"an embedding ({self.pooling} pooling)"
        reports = {
            cap: CapabilityReport(CapabilityStatus.UNSUPPORTED, f"{kind} instance: no chat, no states")
            for cap in REPORTED_CAPABILITIES
        }
        alive = proc is not None and proc.alive()
        reports[CapabilityId.MODEL_RESIDENCY] = CapabilityReport(
            CapabilityStatus.SUPPORTED if alive else CapabilityStatus.UNAVAILABLE,
            "weights loaded in the managed llama-server" if alive else "no live llama-server; a request starts one",
        )
        reports[mine] = (
            CapabilityReport(CapabilityStatus.SUPPORTED, f"llama-server answered as {kind} instance")
            if answered
            else CapabilityReport(CapabilityStatus.UNAVAILABLE, "llama-server has not answered yet")
        )
        reports[other] = CapabilityReport(CapabilityStatus.UNSUPPORTED, f"{kind} instance")
        return reports

    # -- requests ----------------------------------------------------------------------------
    @staticmethod
    def _embed(pool: ConnectionPool, inputs: list[Any]) -> tuple[list[list[float]], int]:
        answer = post_json(pool, "/v1/embeddings", {"input": inputs})
        data = answer.get("data")
        if not isinstance(data, list) or len(data) != len(inputs):
            raise WerkError(ErrorCode.UNAVAILABLE, "llama-server answered malformed embeddings", retryable=True)
        vectors: list[list[float]] = [[] for _ in inputs]
        for item in data:
            index = item.get("index") if isinstance(item, dict) else None
            vector = item.get("embedding") if isinstance(item, dict) else None
            if not isinstance(index, int) or not 0 <= index < len(inputs) or not isinstance(vector, list):
                raise WerkError(ErrorCode.UNAVAILABLE, "llama-server answered malformed embeddings", retryable=True)
            vectors[index] = vector
        return vectors, _prompt_tokens(answer)

    @staticmethod
    def _rerank(pool: ConnectionPool, query: str, documents: list[str]) -> tuple[list[float], int]:
        body = {"query": query, "documents": documents, "top_n": len(documents)}
        answer = post_json(pool, "/v1/rerank", body)
        results = answer.get("results")
        scores: list[float | None] = [None] * len(documents)
        for item in results if isinstance(results, list) else []:
            index = item.get("index") if isinstance(item, dict) else None
            score = item.get("relevance_score") if isinstance(item, dict) else None
            if isinstance(index, int) and 0 <= index < len(documents) and isinstance(score, int | float):
                scores[index] = float(score)
        if any(s is None for s in scores):
            raise WerkError(ErrorCode.UNAVAILABLE, "llama-server answered a malformed rerank", retryable=True)
        return [s for s in scores if s is not None], _prompt_tokens(answer)

    @hookimpl(specname="werk_embed")
    def embed(self, work: EmbeddingWork) -> EmbeddingResult:
        if self.rerank_mode:
            raise WerkError(ErrorCode.INVALID_REQUEST, "a reranking instance computes no embeddings")
        vectors, tokens = self._embed(self._connection()[1], list(work.inputs))
        return EmbeddingResult(vectors=vectors, prompt_tokens=tokens)

    @hookimpl(specname="werk_rerank")
    def rerank(self, work: RerankWork) -> RerankResult:
        if not self.rerank_mode:
            raise WerkError(ErrorCode.INVALID_REQUEST, "an embedding instance reranks nothing")
        scores, tokens = self._rerank(self._connection()[1], work.query, list(work.documents))
        return RerankResult(scores=scores, prompt_tokens=tokens)

    @hookimpl(specname="werk_tokenize")
    def tokenize(self, text: str) -> list[int]:
        answer = post_json(self._connection()[1], "/tokenize", {"content": text, "add_special": True})
        tokens = answer.get("tokens")
        if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
            raise WerkError(ErrorCode.UNAVAILABLE, "llama-server answered a malformed tokenization", retryable=True)
        return tokens

    def _no_text(self) -> WerkError:
        kind = "reranks documents" if self.rerank_mode else "computes embeddings"
        return WerkError(
            ErrorCode.INVALID_REQUEST,
            f"model {self.manifest.name} {kind} and generates no text: use a chat instance of the model",
        )

    @hookimpl(specname="werk_chat_completion")
    def chat_completion(self, request: JsonObject) -> InferenceResponse:
        raise self._no_text()

    @hookimpl(specname="werk_text_completion")
    def text_completion(self, request: JsonObject) -> InferenceResponse:
        raise self._no_text()

    @hookimpl(specname="werk_log_tail")
    def native_log_tail(self, lines: int) -> list[str] | None:
        proc = self._process
        return proc.public_log_tail(lines) if proc is not None and proc.alive() else None


def _prompt_tokens(answer: dict[str, Any]) -> int:
    usage = answer.get("usage")
    tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return tokens if isinstance(tokens, int) and tokens >= 0 else 0
