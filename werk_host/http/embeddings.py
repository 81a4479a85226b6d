"""The embedding and rerank routes (docs/embeddings.md): OpenAI's ``POST /v1/embeddings``,
``POST /v1/rerank`` (the Jina/Cohere shape llama-server and vLLM accept), and Ollama's
``POST /api/embed`` and older ``POST /api/embeddings``.

Each validates its whole body (:mod:`werk_host.protocol.embeddings`, Ollama's
:class:`~werk_host.compat.ollama.OllamaEmbedRequest`) before anything runs, then takes the one
path of :class:`~werk_host.service.embeddings.EmbeddingService` (routing, the adapter's limits,
the gate, counting). Errors are each API's own shape (chosen by path in werk_host/http/app.py).

* ``/v1/embeddings`` answers ``{"object": "list", "data": [{"object": "embedding", "index",
  "embedding"}], "model", "usage": {"prompt_tokens", "total_tokens"}}``; with
  ``encoding_format: "base64"`` each ``embedding`` is the base64 of its little-endian float32
  values (what the ``openai`` SDK decodes). An input over the model's limit is a 400 unless the
  body says ``truncate: true`` (Werk's extension).
* ``/v1/rerank`` answers ``{"id", "model", "usage", "results": [{"index", "relevance_score",
  "document"?}]}``, the results by descending score, cut to ``top_n``; ``document``
  (``{"text"}``) with ``return_documents: true``.
* ``/api/embed`` answers ``{"model", "embeddings", "total_duration", "load_duration",
  "prompt_eval_count"}`` with unit-length vectors, truncating over-long inputs unless
  ``truncate: false`` (Ollama's default and rule); ``/api/embeddings`` answers ``{"embedding"}``
  for its one ``prompt``. As in Ollama, a request with no input (or an empty ``prompt``) only
  loads the model and answers no vectors.
"""

from __future__ import annotations

import base64
import secrets
import struct
from typing import Any, Final

import falcon

from werk_host.errors import ErrorCode, WerkError
from werk_host.http.io import parse_body, principal
from werk_host.http.media import disconnect_bound
from werk_host.protocol.embeddings import EmbeddingsRequest, EmbedInput, RerankRequest
from werk_host.service.embeddings import Embedded, EmbeddingService, normalized

__all__ = ["EMBEDDINGS_PATH", "RERANK_PATH", "OllamaEmbed", "add_routes"]

EMBEDDINGS_PATH: Final = "/v1/embeddings"
RERANK_PATH: Final = "/v1/rerank"


def _float32_base64(vector: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def _named(req: falcon.Request, embedded_instance: str, asked: str | None) -> str:
    req.context.instance_id = embedded_instance  # the metrics label of this request
    return asked if asked is not None else embedded_instance


class Embeddings:
    """``POST /v1/embeddings`` (module docstring)."""

    def __init__(self, service: EmbeddingService) -> None:
        self.service = service

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        request = parse_body(req, EmbeddingsRequest)
        with disconnect_bound(req):
            done = self.service.embed(
                principal(req),
                request.model,
                request.inputs(),
                truncate=request.truncate is True,
                dimensions=request.dimensions,
            )
        model = _named(req, done.instance.id, request.model)
        encode = _float32_base64 if request.encoding_format == "base64" else None
        data = [
            {"object": "embedding", "index": i, "embedding": encode(v) if encode is not None else v}
            for i, v in enumerate(done.vectors)
        ]
        usage = {"prompt_tokens": done.prompt_tokens, "total_tokens": done.prompt_tokens}
        resp.media = {"object": "list", "data": data, "model": model, "usage": usage}


class Rerank:
    """``POST /v1/rerank`` (module docstring)."""

    def __init__(self, service: EmbeddingService) -> None:
        self.service = service

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        request = parse_body(req, RerankRequest)
        texts = request.texts()
        with disconnect_bound(req):
            done = self.service.rerank(principal(req), request.model, request.query, texts)
        model = _named(req, done.instance.id, request.model)
        order = sorted(range(len(texts)), key=lambda i: -done.scores[i])[: request.top_n]
        results: list[dict[str, Any]] = []
        for i in order:
            result: dict[str, Any] = {"index": i, "relevance_score": done.scores[i]}
            if request.return_documents:
                result["document"] = {"text": texts[i]}
            results.append(result)
        usage = {"prompt_tokens": done.prompt_tokens, "total_tokens": done.prompt_tokens}
        resp.media = {"id": f"rerank-{secrets.token_hex(12)}", "model": model, "usage": usage, "results": results}


class OllamaEmbed:
    """Ollama's ``POST /api/embed`` and, with ``legacy``, ``POST /api/embeddings`` (module
    docstring)."""

    def __init__(self, service: EmbeddingService, *, legacy: bool) -> None:
        self.service = service
        self.legacy = legacy

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        from werk_host.compat.ollama import OllamaEmbedRequest

        request = parse_body(req, OllamaEmbedRequest)
        if self.legacy:
            if request.input is not None:
                raise WerkError(ErrorCode.INVALID_REQUEST, "/api/embeddings takes prompt; use /api/embed for input")
            inputs: list[EmbedInput] = [request.prompt] if request.prompt else []
        else:
            if request.prompt is not None:
                raise WerkError(ErrorCode.INVALID_REQUEST, "/api/embed takes input; prompt is for /api/embeddings")
            given = request.input
            inputs = [given] if isinstance(given, str) else list(given or [])
            if any(not text for text in inputs):
                raise WerkError(ErrorCode.INVALID_REQUEST, "input must not contain an empty string")
        with disconnect_bound(req):
            done = self.service.embed(
                principal(req),
                request.model,
                inputs,
                truncate=request.truncate is not False,
                dimensions=request.dimensions,
            )
        _named(req, done.instance.id, request.model)
        vectors = self._unit(done)
        if self.legacy:
            resp.media = {"embedding": vectors[0] if vectors else []}
            return
        resp.media = {
            "model": request.model,
            "embeddings": vectors,
            "total_duration": int(done.seconds * 1e9),
            "load_duration": int(done.load_seconds * 1e9),
            "prompt_eval_count": done.prompt_tokens,
        }

    @staticmethod
    def _unit(done: Embedded) -> list[list[float]]:
        """Ollama's vectors are unit length; a backend's that are already are passed as they are."""
        if done.limits.normalized:
            return done.vectors
        return [normalized(v) for v in done.vectors]


def add_routes(app: falcon.App[Any, Any], service: EmbeddingService) -> None:
    app.add_route(EMBEDDINGS_PATH, Embeddings(service))
    app.add_route(RERANK_PATH, Rerank(service))
