"""Embedding and reranking instances of the vLLM backend: a ``vllm serve`` with vLLM's pooling
runner, served through the host's embedding hooks (docs/vllm.md, "Embeddings"; docs/embeddings.md).

Which instances (:data:`Kind`): a local instance with the ``pooling`` option is what the option
says (``mean``, ``cls``, ``last``: an embedding instance, started with ``--runner pooling
--convert embed --pooler-config {"pooling_type": ...}``; ``rank``: a reranking instance, started
with ``--runner pooling --convert classify``, :func:`werk_vllm.launch.pooling_args`). Without the
option (and for every remote endpoint) vLLM's own answer decides, once, when the instance starts
(:func:`served_kind`): vLLM registers its routes by the tasks the served model supports, so the
route that exists (``GET`` answers 405, method not allowed, where a missing route is 404) says
what it is: ``/v1/chat/completions`` a chat instance, else ``/v1/embeddings`` an embedding
instance (vLLM resolved a pooling model, e.g. a ``BertModel``), else ``/rerank`` a reranking
one. An endpoint that says none of these is a chat instance, as before.

Evidence (:func:`measure`, once per adapter, when it starts): the vector width and whether the
vectors are unit length from a real embedding of :data:`PROBE_TEXT` (vLLM's embedding pooler
L2-normalizes by default, its ``use_activation``; the probe vector's norm is checked rather than
assumed); whether vLLM shortens vectors itself (Matryoshka) from whether it accepts a
``dimensions`` of half the width; ``max_input_tokens`` vLLM's ``/v1/models`` ``max_model_len``; at
most :data:`MAX_BATCH_INPUTS` inputs per call; ``--max-num-seqs`` (when set) as the concurrent
requests. A reranker is measured by a rerank of a probe pair.

Requests: :func:`embed` posts the inputs (strings and token-id arrays as given) to vLLM's
``/v1/embeddings`` and returns the vectors in the inputs' order with vLLM's ``usage``;
:func:`rerank` posts to ``/rerank`` (every document, no ``top_n``) and returns the scores in the
documents' order; :func:`tokenize` is ``/tokenize`` with the special tokens, as an embedding
input is fed. vLLM's refusals (a token id outside the vocabulary, an over-long input) are
``invalid_request`` with Werk's own message; vLLM's text goes to the log only.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Final, Literal

from werk_host.plugin import EmbeddingLimits, EmbedInput, ErrorCode, WerkError
from werk_host.plugin.http import post_json

from .client import VllmPool, get
from .launch import RANK

__all__ = [
    "CHAT",
    "EMBED",
    "MAX_BATCH_INPUTS",
    "PROBE_TEXT",
    "RERANK",
    "Kind",
    "embed",
    "kind_of",
    "measure",
    "rerank",
    "served_kind",
    "tokenize",
]

log = logging.getLogger(__name__)

Kind = Literal["chat", "embed", "rank"]
CHAT: Final = "chat"
EMBED: Final = "embed"
RERANK: Final = "rank"
#: The most inputs one call to vLLM carries (the host splits larger requests; vLLM batches them).
MAX_BATCH_INPUTS: Final = 64
#: The text of the probe embedding (and of the probe rerank's query and document).
PROBE_TEXT: Final = "Werk measures this vLLM embedding instance."
#: How far from 1 a probe vector's L2 norm may be for the vectors to count as unit length.
NORM_TOLERANCE: Final = 1e-3
#: The pooling an instance reports when vLLM chose it from the model (no ``pooling`` option).
MODEL_POOLING: Final = "model"
#: The routes whose existence says what a vLLM server serves, in the order they are asked.
ROUTE_KINDS: Final[tuple[tuple[str, Kind], ...]] = (
    ("/v1/chat/completions", CHAT),
    ("/v1/embeddings", EMBED),
    ("/rerank", RERANK),
)
#: The statuses with which vLLM refuses a request itself (the client's inputs, not the server).
_REFUSALS: Final = frozenset({400, 413, 422})


def kind_of(pooling: str | None) -> Kind | None:
    """The kind a ``pooling`` option makes (``None``: no option, vLLM's own answer decides)."""
    if pooling is None:
        return None
    return RERANK if pooling == RANK else EMBED


def served_kind(pool: VllmPool) -> Kind:
    """What the server serves, from the routes it registered (module docstring)."""
    for path, kind in ROUTE_KINDS:
        answer = get(pool, path)
        if answer is not None and answer[0] == 405:
            return kind
    return CHAT


def _malformed(what: str) -> WerkError:
    return WerkError(ErrorCode.UNAVAILABLE, f"vLLM answered {what} Werk cannot read", retryable=True)


def _call(pool: VllmPool, path: str, body: dict[str, Any], what: str) -> dict[str, Any]:
    """``post_json`` with vLLM's refusals and failures as typed errors in Werk's own words."""
    try:
        return post_json(pool, pool.path(path), body, is_refusal=lambda status: status in _REFUSALS)
    except WerkError as err:
        if err.code is ErrorCode.INVALID_REQUEST:
            raise WerkError(
                ErrorCode.INVALID_REQUEST,
                f"vLLM refused {what}: an input it cannot take (a token id outside the model's "
                "vocabulary, or more tokens than its max_model_len)",
            ) from err
        if err.code is ErrorCode.UNAVAILABLE:
            log.warning("vLLM %s failed: %s", path, err.message)
            raise WerkError(ErrorCode.UNAVAILABLE, f"vLLM could not answer {what}", retryable=err.retryable) from err
        raise


def _usage(answer: dict[str, Any]) -> int:
    usage = answer.get("usage")
    tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
        raise _malformed("a usage")
    return tokens


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _malformed("a non-number")
    return float(value)


def _by_index(items: object, count: int, field: str, what: str) -> list[object]:
    """``items[*][field]`` placed by each item's ``index``: one per input, every index once."""
    if not isinstance(items, list) or len(items) != count:
        raise _malformed(what)
    out: list[object] = [None] * count
    seen: set[int] = set()
    for item in items:
        index = item.get("index") if isinstance(item, dict) else None
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < count or index in seen:
            raise _malformed(what)
        seen.add(index)
        out[index] = item.get(field)
    return out


def embed(
    pool: VllmPool, model: str, inputs: list[EmbedInput], dimensions: int | None = None
) -> tuple[list[list[float]], int]:
    """One vector per input, in order, and vLLM's prompt tokens (module docstring)."""
    body: dict[str, Any] = {"model": model, "input": inputs, "encoding_format": "float", "add_special_tokens": True}
    if dimensions is not None:
        body["dimensions"] = dimensions
    answer = _call(pool, "/v1/embeddings", body, "these embedding inputs")
    vectors: list[list[float]] = []
    for vector in _by_index(answer.get("data"), len(inputs), "embedding", "embeddings"):
        if not isinstance(vector, list) or not vector:
            raise _malformed("embeddings")
        vectors.append([_number(x) for x in vector])
    return vectors, _usage(answer)


def rerank(pool: VllmPool, model: str, query: str, documents: list[str]) -> tuple[list[float], int]:
    """One score per document, in the documents' order, and vLLM's prompt tokens."""
    body = {"model": model, "query": query, "documents": documents}
    answer = _call(pool, "/rerank", body, "this rerank")
    scores = [_number(s) for s in _by_index(answer.get("results"), len(documents), "relevance_score", "a rerank")]
    return scores, _usage(answer)


def tokenize(pool: VllmPool, model: str, text: str) -> list[int]:
    """The token ids vLLM feeds for ``text`` as one embedding input (special tokens included)."""
    answer = _call(pool, "/tokenize", {"model": model, "prompt": text, "add_special_tokens": True}, "this text")
    tokens = answer.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise _malformed("a tokenization")
    return tokens


def _norm(vector: list[float]) -> float:
    return math.sqrt(math.fsum(x * x for x in vector))


def _shortens(pool: VllmPool, model: str, width: int) -> bool:
    """Whether vLLM itself answers a ``dimensions`` below the width (a Matryoshka model)."""
    if width < 2:
        return False
    try:
        (vector,), _ = embed(pool, model, [PROBE_TEXT], width // 2)
    except WerkError as err:
        if err.code is ErrorCode.INVALID_REQUEST:
            return False
        raise
    return len(vector) == width // 2


def measure(
    pool: VllmPool, model: str, kind: Kind, pooling: str | None, max_model_len: int | None, max_num_seqs: int | None
) -> EmbeddingLimits:
    """The limits of an embedding or reranking instance, from the engine's answers (module docstring)."""
    if max_model_len is None:
        raise WerkError(ErrorCode.UNAVAILABLE, "vLLM did not say its max_model_len", retryable=True)
    if kind == RERANK:
        rerank(pool, model, PROBE_TEXT, [PROBE_TEXT])
        return EmbeddingLimits(
            dimensions=1,
            pooling=RANK,
            normalized=False,
            max_input_tokens=max_model_len,
            max_batch_inputs=MAX_BATCH_INPUTS,
            max_concurrent_requests=max_num_seqs,
            rerank=True,
        )
    (vector,), _ = embed(pool, model, [PROBE_TEXT])
    return EmbeddingLimits(
        dimensions=len(vector),
        pooling=pooling or MODEL_POOLING,
        normalized=abs(_norm(vector) - 1.0) <= NORM_TOLERANCE,
        max_input_tokens=max_model_len,
        max_batch_inputs=MAX_BATCH_INPUTS,
        max_concurrent_requests=max_num_seqs,
        truncatable=_shortens(pool, model, len(vector)),
    )
