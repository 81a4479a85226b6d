"""werk_host.compat.upstream.coalesced: a translated stream writes once per backend read, and
never holds a piece while it waits for the backend."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from werk_host.compat.anthropic_answer import message_stream
from werk_host.compat.anthropic_models import MessagesRequest
from werk_host.compat.upstream import SseEvents, coalesced, sse_events


def _event(doc: object) -> bytes:
    return f"data: {json.dumps(doc)}\n\n".encode()


def _token(text: str, finish: str | None = None) -> bytes:
    return _event({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]})


USAGE = _event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 6}})
#: the backend's reads: several events in one read, one alone, one split across reads
READS = [
    _token("alpha") + _token("beta") + _token("gamma"),
    _token("delta"),
    _token("eps")[:10],
    _token("eps")[10:] + _token("zeta", "stop") + USAGE + b"data: [DONE]\n\n",
]
REQUEST = MessagesRequest.model_validate(
    {"model": "m", "max_tokens": 8, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
)


def test_one_write_per_read_and_nothing_held_while_the_backend_computes() -> None:
    log: list[tuple[str, bytes]] = []

    def backend() -> Iterator[bytes]:
        for raw in READS:
            log.append(("read", raw))
            yield raw

    plain = b"".join(message_stream(sse_events(list(READS)), REQUEST))
    events = sse_events(backend())
    writes = []
    for piece in coalesced(message_stream(events, REQUEST), events):
        log.append(("write", piece))
        writes.append(piece)
    same = re.compile(rb'"msg_[^"]*"')  # each message has its own id
    assert same.sub(b"id", b"".join(writes)) == same.sub(b"id", plain)  # the same bytes, fewer writes
    assert len(writes) < plain.count(b"event: ")
    # every token reached the client before the backend was read again
    for text, next_read in (("gamma", 1), ("delta", 2)):
        at = [i for i, (kind, _) in enumerate(log) if kind == "read"][next_read]
        assert f'"{text}"'.encode() in b"".join(data for kind, data in log[:at] if kind == "write")


def test_a_failure_sends_what_was_made_before_it() -> None:
    events = SseEvents([_token("a") + _token("b")])

    def translation() -> Iterator[bytes]:
        for doc in events:
            yield json.dumps(doc).encode()
            raise RuntimeError("translation failed")

    out = []
    with pytest.raises(RuntimeError):
        for piece in coalesced(translation(), events):
            out.append(piece)
    assert out and b'"a"' in out[0]


def test_held_bytes_are_bounded() -> None:
    many = _token("x" * 1000) * 200 + b"data: [DONE]\n\n"
    events = sse_events([many])
    writes = list(coalesced((json.dumps(doc).encode() for doc in events), events))
    assert len(writes) > 1 and all(len(w) <= 64 * 1024 + 2000 for w in writes)
