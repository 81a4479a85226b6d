"""Embedding instances of the transformers backend: one deployment instance of an encoder
checkpoint whose worker computes pooled, L2-normalized vectors of the last hidden state
(docs/transformers.md, "Embeddings"; docs/embeddings.md).

Which instances: the option ``pooling`` (``mean`` or ``cls``) makes an instance an embedding
instance; without it, a checkpoint that is evidently an encoder (:func:`instance_pooling`: every
``architectures`` entry a ``*ForMaskedLM``, or a base ``*Model`` of an encoder family such as
BERT, none with a causal-LM head) is one with ``mean`` pooling; any other is a chat instance
(:class:`werk_transformers.adapter.TransformersAdapter`).

The worker is the plugin's ``worker.py`` with ``--embed``: the base model (``AutoModel``), keyed
like a chat worker plus ``embed``, so a chat and an embedding instance of the same files are two
workers in the same LRU, while embedding instances of the same files share one whatever their
pooling (each request names it). Evidence (:meth:`TransformersEmbeddingAdapter.embedding_limits`, asked
once per worker generation): the vector width is the loaded model's ``hidden_size`` and must equal
the width of the probe vector the worker computed at load (and every answer's vectors are checked
against it again); ``max_input_tokens`` the smaller sane one of ``max_position_embeddings`` and
the tokenizer's ``model_max_length``; :data:`MAX_BATCH_INPUTS` inputs per call, one request at a
time (the worker's one seat). Until the worker answered, ``api.embeddings`` is ``unavailable``;
then ``supported``. ``api.rerank`` and every chat capability are ``unsupported``.

Requests: ``werk_embed`` posts the batch (strings and token-id lists as given; token ids outside
the vocabulary are ``invalid_request``) to the worker's ``/embed`` under the worker's seat;
``werk_tokenize`` is its ``/tokenize`` (special tokens included), outside the seat. Chat and
completion requests are ``invalid_request``: an embedding instance generates no text.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Final

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
    WerkError,
    hookimpl,
)
from werk_host.plugin.checkpoints import read_config
from werk_host.plugin.engines import EngineWorker
from werk_host.plugin.http import post_json

from .core import BACKEND_ID, KEY_ENV, POOL, REPORTED, WORKER
from .settings import PYTHON_ENV, Settings

__all__ = ["ENCODER_TYPES", "MAX_BATCH_INPUTS", "TransformersEmbeddingAdapter", "instance_pooling"]

#: The most inputs one worker call carries (the host splits larger requests).
MAX_BATCH_INPUTS: Final = 32
#: ``model_type`` values of encoder families whose base ``*Model`` is an embedding model.
ENCODER_TYPES: Final = frozenset(
    {
        "albert",
        "bert",
        "camembert",
        "deberta",
        "deberta-v2",
        "distilbert",
        "electra",
        "ernie",
        "megatron-bert",
        "modernbert",
        "mpnet",
        "nomic_bert",
        "rembert",
        "roberta",
        "xlm-roberta",
    }
)
_CAUSAL_HEADS: Final = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


def instance_pooling(settings: Settings, directory: Path) -> str | None:
    """The pooling of an embedding instance, ``None`` for a chat instance (module docstring)."""
    if settings.pooling is not None:
        return settings.pooling
    config = read_config(directory)
    if config is None or config.get("is_decoder") is True:
        return None
    named = config.get("architectures")
    names = [n for n in named if isinstance(n, str)] if isinstance(named, list) else []
    if not names or any(n.endswith(_CAUSAL_HEADS) for n in names):
        return None
    if all(n.endswith("ForMaskedLM") for n in names):
        return "mean"
    encoder = config.get("model_type") in ENCODER_TYPES
    return "mean" if encoder and all(n.endswith(("Model", "ForMaskedLM")) for n in names) else None


def _malformed(what: str) -> WerkError:
    return WerkError(ErrorCode.UNAVAILABLE, f"the transformers worker answered {what}", retryable=True)


class TransformersEmbeddingAdapter(EngineWorker):
    """One embedding instance of a checkpoint, served by its embedding worker (module docstring)."""

    backend = BACKEND_ID
    label = "transformers"
    python_env = PYTHON_ENV
    key_env = KEY_ENV
    worker = WORKER
    pool = POOL

    def __init__(
        self,
        config: HostConfig,
        manifest: ModelManifest,
        settings: Settings,
        directory: Path,
        pooling: str,
    ) -> None:
        self.settings = settings
        self.pooling = pooling
        self._limits: tuple[str, EmbeddingLimits, int] | None = None
        super().__init__(
            config,
            manifest,
            directory,
            python=settings.python,
            startup_timeout=settings.startup_timeout,
            runtime=(settings.device, settings.dtype, settings.threads, "embed"),
        )

    def worker_args(self) -> list[str]:
        settings = self.settings
        return ["--device", settings.device, "--dtype", settings.dtype, "--threads", str(settings.threads), "--embed"]

    # -- evidence ----------------------------------------------------------------------------
    def _measured(self) -> tuple[EmbeddingLimits, int]:
        """The limits and the vocabulary size of the live worker, asked once per generation."""
        with self.pool.use(self.slot, self._start) as started:
            generation = started.run.generation
            kept = self._limits
            if kept is not None and kept[0] == generation:
                return kept[1], kept[2]
            info = post_json(started.pool, "/info", {})
        width, hidden = info.get("dimensions"), info.get("hidden_size")
        context, vocab = info.get("max_input_tokens"), info.get("vocab_size")
        if not all(type(v) is int and v > 0 for v in (width, hidden, context, vocab)):
            raise _malformed("no embedding limits")
        if width != hidden:
            raise WerkError(
                ErrorCode.UNAVAILABLE,
                f"the model's vectors are {width} wide but its config says hidden_size {hidden}",
                retryable=False,
            )
        assert isinstance(width, int) and isinstance(context, int) and isinstance(vocab, int)
        limits = EmbeddingLimits(
            dimensions=width,
            pooling=self.pooling,
            normalized=True,
            max_input_tokens=context,
            max_batch_inputs=MAX_BATCH_INPUTS,
            max_concurrent_requests=1,
        )
        self._limits = (generation, limits, vocab)
        return limits, vocab

    @hookimpl(specname="werk_embedding_limits")
    def embedding_limits(self) -> EmbeddingLimits:
        return self._measured()[0]

    @hookimpl(specname="werk_capabilities")
    def capabilities(self) -> dict[CapabilityId, CapabilityReport]:
        alive = self.slot.alive()
        kept = self._limits
        answered = alive and kept is not None and kept[0] == self.slot.generation()
        kind = f"an embedding instance ({self.pooling} pooling)"
        reports = {cap: CapabilityReport(CapabilityStatus.UNSUPPORTED, f"{kind}: no chat") for cap in REPORTED}
        reports[CapabilityId.MODEL_RESIDENCY] = (
            CapabilityReport(CapabilityStatus.SUPPORTED, "the model is loaded in its live transformers worker")
            if alive
            else CapabilityReport(CapabilityStatus.UNAVAILABLE, "no live worker holds the model; a request loads it")
        )
        reports[CapabilityId.EMBEDDINGS] = (
            CapabilityReport(CapabilityStatus.SUPPORTED, f"the transformers worker answered as {kind}")
            if answered
            else CapabilityReport(CapabilityStatus.UNAVAILABLE, "the transformers worker has not answered yet")
        )
        reports[CapabilityId.RERANK] = CapabilityReport(
            CapabilityStatus.UNSUPPORTED, f"{kind}: the transformers backend serves no cross-encoder reranking"
        )
        return reports

    # -- requests ----------------------------------------------------------------------------
    @hookimpl(specname="werk_embed")
    def embed(self, work: EmbeddingWork) -> EmbeddingResult:
        limits, vocab = self._measured()
        for item in work.inputs:
            if isinstance(item, list) and any(t >= vocab for t in item):
                raise WerkError(ErrorCode.INVALID_REQUEST, f"a token id is outside the model's vocabulary of {vocab}")
        with self.pool.use(self.slot, self._start) as started, self.slot.hold():
            answer = post_json(started.pool, "/embed", {"inputs": list(work.inputs), "pooling": self.pooling})
        vectors, tokens = answer.get("vectors"), answer.get("prompt_tokens")
        if (
            not isinstance(vectors, list)
            or len(vectors) != len(work.inputs)
            or type(tokens) is not int
            or not all(isinstance(v, list) and all(type(x) is float and math.isfinite(x) for x in v) for v in vectors)
        ):
            raise _malformed("malformed embeddings")
        if any(len(v) != limits.dimensions for v in vectors):
            raise WerkError(
                ErrorCode.UNAVAILABLE,
                f"the transformers worker answered vectors other than {limits.dimensions} wide",
                retryable=True,
            )
        return EmbeddingResult(vectors=vectors, prompt_tokens=tokens)

    @hookimpl(specname="werk_tokenize")
    def tokenize(self, text: str) -> list[int]:
        with self.pool.use(self.slot, self._start) as started:
            answer = post_json(started.pool, "/tokenize", {"text": text})
        tokens = answer.get("tokens")
        if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
            raise _malformed("a malformed tokenization")
        return tokens

    def _no_text(self) -> WerkError:
        return WerkError(
            ErrorCode.INVALID_REQUEST,
            f"model {self.manifest.name} is an embedding instance ({self.pooling} pooling) and generates no text: "
            "use /v1/embeddings, or a chat instance of a causal-LM checkpoint",
        )

    @hookimpl(specname="werk_chat_completion")
    def chat_completion(self, request: JsonObject) -> InferenceResponse:
        raise self._no_text()

    @hookimpl(specname="werk_text_completion")
    def text_completion(self, request: JsonObject) -> InferenceResponse:
        raise self._no_text()
