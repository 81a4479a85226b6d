"""Run one validated request on a loaded model and answer it in OpenAI's shapes.

The prompt is tokenized before submission (exact ``prompt_tokens`` for admission of
``/v1/completions``, which the host does not admit itself). The engine streams every request
(module :mod:`werk_candle_bridge.engine`); for the client:

* **streamed**: the first piece is awaited inside the hook, so a request that fails before any
  output gets a real error status; later pieces are relayed as they come. A failure after the
  stream started ends it with an OpenAI-shaped error event (the HTTP status is already sent).
* **not streamed**: the pieces are gathered inside the hook and sent as one document.

A client that goes away stops the generation: after every piece the hook polls
:data:`werk_host.plugin.client_disconnected` (captured when the hook is called, so the check
also works while the body streams), and closing the response drops the engine's stream, which
cancels the sequence. The engine's iterator cannot be interrupted while it waits for the first
piece (queue and prefill): a client gone by then is noticed at that piece.

Engine failures and panics become ``internal`` (the engine's own text goes to the server log,
never to the client); the engine and the host keep serving.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from werk_host.plugin import ErrorCode, InferenceResponse, WerkError, client_disconnected
from werk_host.plugin.http import ClientGone
from werk_host.plugin.openai import Reply, Usage, error_event

from .engine import Engine, EngineFailure, EngineStream, Piece
from .residency import SharedModel, Ticket
from .template import RAW_ROLE
from .wire import Job, JobKind, finish_reason

__all__ = ["FAILED", "run"]

log = logging.getLogger(__name__)

#: The public message of a request the engine failed.
FAILED = "the candle engine failed this request"


def _admission(openai_code: str, message: str) -> WerkError:
    return WerkError(ErrorCode.INVALID_REQUEST, message, details={"openai_code": openai_code})


def _check_text_admission(job: Job, prompt_tokens: int, engine: Engine, ceiling: int | None) -> None:
    """The host's chat admission rules, applied to a completions request."""
    requested = job.sampling.max_tokens
    if ceiling is not None and requested is not None and requested > ceiling:
        raise _admission(
            "output_limit_exceeded", f"requested {requested} output tokens; this model allows at most {ceiling}"
        )
    context = engine.max_sequence_length
    if context is not None and prompt_tokens + (requested or 1) > context:
        raise _admission(
            "context_length_exceeded",
            f"input plus requested output needs {prompt_tokens + (requested or 1)} tokens; the context holds {context}",
        )


def _failed(shared: SharedModel, reply: Reply, err: EngineFailure) -> WerkError:
    log.error("candle: model %s failed request %s (%s): %s", shared.name, reply.id, err.what, err.detail)
    return WerkError(ErrorCode.INTERNAL, FAILED)


class _Run:
    """One request in the engine: its stream, traffic ticket and disconnect check."""

    def __init__(self, shared: SharedModel, stream: EngineStream, ticket: Ticket, prompt_tokens: int) -> None:
        self.shared = shared
        self.stream = stream
        self.ticket = ticket
        self.prompt_tokens = prompt_tokens
        self.completion_pieces = 0
        self.finish: str | None = None
        check = client_disconnected.get()
        self._gone: Callable[[], bool] = check if check is not None else (lambda: False)

    def gone(self) -> bool:
        return self._gone()

    def next(self) -> Piece | None:
        piece = self.stream.next()
        if piece is not None:
            self.ticket.generating()
            self.completion_pieces += 1 if piece.text else 0
            self.finish = piece.finish_reason or self.finish
        return piece

    def usage(self) -> Usage:
        """The engine's usage; without one (never seen), the exact prompt count and the pieces."""
        usage = self.stream.usage
        if usage is None:
            log.warning("candle: model %s sent no usage; counting pieces", self.shared.name)
            return Usage(self.prompt_tokens, self.completion_pieces)
        return usage

    def close(self) -> None:
        self.stream.close()
        self.ticket.done()


def run(shared: SharedModel, job: Job, ceiling: int | None) -> InferenceResponse:
    """Serve ``job`` on ``shared`` (module docstring). ``ceiling`` is the manifest's output
    ceiling. Raises ``invalid_request``, ``unavailable`` (the model cannot be loaded),
    ``internal`` (the engine failed) or :class:`ClientGone`."""
    engine = shared.engine()
    prompt = job.prompt if job.kind is JobKind.TEXT else shared.renderer().render(job.messages)
    reply = Reply(job.reply_kind, shared.name)
    try:
        prompt_tokens = len(engine.tokenize(prompt))
    except EngineFailure as err:
        raise _failed(shared, reply, err) from err
    if job.kind is JobKind.TEXT:
        _check_text_admission(job, prompt_tokens, engine, ceiling)
    ticket = shared.ticket()
    try:
        stream = engine.open(prompt, job.sampling, RAW_ROLE)
    except EngineFailure as err:
        ticket.done()
        raise _failed(shared, reply, err) from err
    work = _Run(shared, stream, ticket, prompt_tokens)
    try:
        if job.stream:
            return _streamed(work, job, reply)
        return _whole(work, reply)
    except BaseException:
        work.close()
        raise


def _whole(work: _Run, reply: Reply) -> InferenceResponse:
    parts: list[str] = []
    try:
        while (piece := work.next()) is not None:
            parts.append(piece.text)
            if work.gone():
                raise ClientGone()
    except EngineFailure as err:
        raise _failed(work.shared, reply, err) from err
    usage = work.usage()
    work.shared.prefix.observe(usage)
    work.close()
    return reply.answer("".join(parts), finish_reason(work.finish), usage)


def _streamed(work: _Run, job: Job, reply: Reply) -> InferenceResponse:
    try:
        first = work.next()
    except EngineFailure as err:
        raise _failed(work.shared, reply, err) from err
    if work.gone():
        raise ClientGone()

    def body() -> Iterator[bytes]:
        piece = first
        try:
            while piece is not None:
                if piece.text:
                    yield reply.chunk(piece.text, None)
                if work.gone():
                    return
                piece = work.next()
            usage = work.usage()
            work.shared.prefix.observe(usage)
            yield reply.end(finish_reason(work.finish), usage, include_usage=job.include_usage)
        except EngineFailure as err:
            _failed(work.shared, reply, err)
            yield error_event(FAILED)
        finally:
            work.close()

    return reply.stream(body(), work.close)
