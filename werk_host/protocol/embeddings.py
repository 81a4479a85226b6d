"""Embedding and rerank DTOs: the requests of every embedding route, what an embedding backend
offers, and its vectors and scores (docs/embeddings.md).

The routes (OpenAI ``POST /v1/embeddings``, Ollama ``POST /api/embed`` and ``/api/embeddings``,
``POST /v1/rerank``) each validate their body here, then hand the one service
(werk_host/service/embeddings.py) a list of inputs: strings or token-id arrays.

* :class:`EmbeddingsRequest` is OpenAI's body: ``input`` a string, an array of strings, an
  array of token ids or an array of such arrays (each 1 to :data:`MAX_EMBED_INPUTS` items, no
  empty string, no empty array), ``encoding_format`` ``float`` (default) or ``base64``
  (little-endian float32, OpenAI's encoding), ``dimensions``, ``user``. Werk's one extension is
  ``truncate`` (default ``false``: an input over the model's limit is a 400 naming the limit).
* :class:`RerankRequest` is the Jina/Cohere shape llama-server and vLLM accept: ``query``,
  ``documents`` (strings, or objects with a ``text``), ``top_n``, ``return_documents``.
* :class:`EmbeddingLimits` is what an embedding adapter says about itself
  (``werk_embedding_limits``), from evidence: the vector width it measured, its pooling, whether
  its vectors are L2-normalized, the longest input in tokens, the most inputs per backend call
  and its concurrent requests; ``rerank`` for a reranking instance (which embeds nothing).
* :class:`EmbeddingResult` is one vector per input with the prompt tokens the backend counted;
  :class:`RerankResult` one score per document, in the documents' order.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import Field, StrictInt, StrictStr

from werk_host.protocol.base import DataModel, JsonBool, PositiveJsonInt, StrictModel

#: The most inputs one request may carry (OpenAI's bound on an ``input`` array).
MAX_EMBED_INPUTS: Final = 2048
#: The most documents one rerank request may carry.
MAX_RERANK_DOCUMENTS: Final = 1024
#: The longest string input, in characters (a bound before any tokenizer runs).
MAX_EMBED_INPUT_CHARS: Final = 256 * 1024
#: A token id's bound (a 32-bit vocabulary index).
MAX_TOKEN_ID: Final = 2**31 - 1

Text = Annotated[StrictStr, Field(min_length=1, max_length=MAX_EMBED_INPUT_CHARS)]
TokenIds = Annotated[
    list[Annotated[StrictInt, Field(ge=0, le=MAX_TOKEN_ID)]], Field(min_length=1, max_length=MAX_EMBED_INPUT_CHARS)
]
#: One input a backend embeds: text, or the token ids of an already tokenized text.
EmbedInput = str | list[int]


class EmbeddingsRequest(StrictModel):
    """OpenAI's ``POST /v1/embeddings`` body (module docstring)."""

    model: Annotated[StrictStr, Field(min_length=1, max_length=256)] | None = None
    input: (
        Text
        | Annotated[list[Text], Field(min_length=1, max_length=MAX_EMBED_INPUTS)]
        | TokenIds
        | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_EMBED_INPUTS)]
    )
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: PositiveJsonInt | None = None
    user: Annotated[StrictStr, Field(max_length=256)] | None = None
    truncate: JsonBool | None = None

    def inputs(self) -> list[EmbedInput]:
        """``input`` as a list of inputs, each a string or a list of token ids."""
        value = self.input
        if isinstance(value, str):
            return [value]
        if value and isinstance(value[0], int):
            return [list(value)]  # one token array
        return list(value)  # type: ignore[arg-type]  # strings or token arrays


class RerankDocument(StrictModel):
    """A document given as an object (Cohere's older shape): its ``text``."""

    text: Text


class RerankRequest(StrictModel):
    """``POST /v1/rerank`` (module docstring)."""

    model: Annotated[StrictStr, Field(min_length=1, max_length=256)] | None = None
    query: Text
    documents: Annotated[list[Text | RerankDocument], Field(min_length=1, max_length=MAX_RERANK_DOCUMENTS)]
    top_n: PositiveJsonInt | None = None
    return_documents: JsonBool | None = None

    def texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]


class EmbeddingLimits(DataModel):
    """What an embedding adapter offers (module docstring)."""

    dimensions: int = Field(ge=1)
    pooling: str
    normalized: bool
    max_input_tokens: int = Field(ge=1)
    max_batch_inputs: int = Field(ge=1)
    max_concurrent_requests: int | None = Field(default=None, ge=1)
    #: the first ``d`` components of a vector are themselves an embedding (Matryoshka): the
    #: host may then answer ``dimensions`` by truncating and renormalizing
    truncatable: bool = False
    rerank: bool = False


class EmbeddingResult(DataModel):
    """One vector per input, in order, and the prompt tokens the backend counted."""

    vectors: list[list[float]]
    prompt_tokens: int = Field(ge=0)


class RerankResult(DataModel):
    """One relevance score per document, in the documents' order, and the prompt tokens."""

    scores: list[float]
    prompt_tokens: int = Field(ge=0)
