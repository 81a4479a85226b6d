"""The loading notice: what a streamed chat request sees while its cold instance starts.

Contract (docs/deployments.md, "Loading notice"; off unless the profile's ``[residency]`` or the
instance says ``loading_notice = true``): a chat request with ``stream: true`` whose instance is
not ready (cold, starting, stopping, or failed and due for another try) is answered at once with
status 200 and ``text/event-stream``; the stream begins with notice chunks — OpenAI chat chunks
whose delta carries only ``reasoning_content``, marked ``"werk_notice": "loading"`` at the top
level, the way llama-swap's ``sendLoadingState`` writes its progress into the reasoning field —
one when the wait begins and one when the instance is ready. Then the real answer's chunks follow
exactly as they would without the notice (its usage included). The translations of
werk_host/compat/ show the notice in their own grammar (Anthropic: a ``thinking`` block of its
own, closed before the answer's blocks; Ollama: the ``thinking`` field of an NDJSON line) and
leave it out where there is no place for it (Responses).

A failure after the notice began the answer — the start failed or was refused, the wait for it
timed out, the request was not admitted (a context too long), the backend refused it — can no
longer change the status: it is raised as :class:`LoadFailed`, which each route ends its stream
with, in that API's error event carrying the host's public message (never a backend's text).
Headers are sent once, before the instance is ready: ``X-Werk-Deployment`` is among them, but
``X-Werk-Max-Tokens-Applied`` is not (the clamp is only known once the instance is ready).
"""

from __future__ import annotations

import json
import time
from typing import Final

from werk_host.errors import WerkError
from werk_host.seam import JsonObject

#: The top-level mark of a notice chunk (clients that do not know it ignore it).
NOTICE_FIELD: Final = "werk_notice"


class LoadFailed(WerkError):
    """A failure inside a stream that a loading notice began: its message is the host's own
    public text, which the translations may show (module docstring)."""

    @classmethod
    def of(cls, err: WerkError) -> LoadFailed:
        return cls(err.code, err.message, retryable=err.retryable, details=err.details)


def is_notice(chunk: JsonObject) -> bool:
    """Whether an OpenAI chunk is a loading notice (module docstring)."""
    return chunk.get(NOTICE_FIELD) == "loading"


def notice_event(instance_id: str, model: str, text: str) -> bytes:
    """One notice chunk as a server-sent event."""
    chunk = {
        "id": f"werk-loading-{instance_id}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": {"role": "assistant", "reasoning_content": text}, "finish_reason": None}],
        NOTICE_FIELD: "loading",
    }
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"
