"""Client-compatibility layers: the Anthropic Messages API, the OpenAI Responses API and the
Ollama API over ``/v1``.

Every route here is a translation (docs/compat.md): a request in the client's shape is
validated by a pydantic model and turned into the OpenAI chat (or completions) body that
:class:`werk_host.service.inference.InferenceService` admits, routes, counts and relays for
``/v1``; the OpenAI answer it returns (JSON or server-sent events) is turned back into the
client's shape. Admission, limits, deployment routing, disconnect cancellation and the chat
counters therefore act on all three protocols the same way.

* :mod:`werk_host.compat.upstream` reads the OpenAI answer (JSON documents, SSE events).
* :mod:`werk_host.compat.anthropic` (what the HTTP layer imports, and Anthropic's error shape)
  over :mod:`werk_host.compat.anthropic_models` (request models),
  :mod:`werk_host.compat.anthropic_request` (the request's translation, tools and thinking
  included) and :mod:`werk_host.compat.anthropic_answer` (``message`` and its event stream) is
  the Anthropic Messages translation; none of them knows HTTP.
* :mod:`werk_host.compat.ollama` (requests), :mod:`werk_host.compat.ollama_messages`
  (messages, tools, tool calls, images) and :mod:`werk_host.compat.ollama_answers` (answers,
  streams, tool calls back) are the Ollama translation.
* :mod:`werk_host.compat.ollama_models` describes served models for ``/api/tags``,
  ``/api/ps`` and ``/api/show`` (with the capabilities the serving instance has shown).
* :mod:`werk_host.compat.responses` (request models and the request's translation) and
  :mod:`werk_host.compat.responses_answer` (the ``response`` object and its event stream) are
  the OpenAI Responses API translation (``POST /v1/responses``, stateless).
* :mod:`werk_host.compat.calls` is the one piece of HTTP glue the route families share.
"""
