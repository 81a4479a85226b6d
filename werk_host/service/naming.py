"""Relayed ``/v1`` answers name the model as the client asked for it (docs/compat.md, "OpenAI").

A backend's answer carries its own ``model``: llama-server's alias, or without one its GGUF
path; a remote server's served name. :func:`named` sets every ``"model": "…"`` member of the
answer to the name the request gave (an instance id, an alias, a model name, as sent) or,
without one, the serving instance's id (what ``/v1/models`` lists).

The rewrite is one regular-expression substitution over bytes, not a JSON parse: inside a JSON
string a quote is always escaped, so the pattern ``"model"`` followed by ``:`` and a string
only ever matches a member, never text the model wrote. In OpenAI's chat and completion
documents ``model`` is a top-level member only.

* An event stream (``text/event-stream``): each read is passed on as it came, up to its last
  line end; a line the upstream split over reads is held until its end (so a member is never
  cut in two). Events that arrived together still leave together, and a read that ends a line
  leaves at once.
* A JSON body: read whole before the status is sent (a backend answers a document only once
  it is complete, so nothing waits longer), renamed, its ``content-length`` set to the new
  length. A backend that breaks off the document is therefore answered as a failure before
  anything is sent: ``unavailable`` (503, retryable), never a short 200 (docs/operations.md,
  "Backend failures").

Error answers (status 400 and above) pass unchanged: :func:`werk_host.service.inference.sanitized_error`
already wrote them. Other media types pass unchanged.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator

from werk_host.errors import ErrorCode, WerkError
from werk_host.seam import InferenceResponse

#: The answer to a JSON document its backend broke off (the status is not sent yet).
INCOMPLETE = "the backend stopped before its answer was complete"

#: A ``model`` member whose value is a JSON string (escapes included).
_MEMBER = re.compile(rb'"model"\s*:\s*"(?:[^"\\]|\\.)*"')


def _events(chunks: Iterable[bytes], member: bytes) -> Iterator[bytes]:
    held = b""
    for chunk in chunks:
        if not chunk:  # a pumped body's "nothing yet": passed on (werk_host/seam.py, Pumpable)
            yield chunk
            continue
        data = held + chunk if held else chunk
        cut = data.rfind(b"\n") + 1
        held = data[cut:]
        if cut:
            yield _MEMBER.sub(member, data[:cut] if held else data)
    if held:
        yield _MEMBER.sub(member, held)


def named(response: InferenceResponse, model: str) -> InferenceResponse:
    """``response`` with its answer documents naming ``model`` (module docstring)."""
    if response.status >= 400:
        return response
    kind = next((v for k, v in response.headers.items() if k.lower() == "content-type"), "").lower()
    member = b'"model":' + json.dumps(model, ensure_ascii=False).encode().replace(b"\\", b"\\\\")
    source = None
    if kind.startswith("text/event-stream"):
        body: Iterator[bytes] = _events(response.body, member)
        source = response.source
    elif kind.startswith("application/json"):
        try:
            whole = _MEMBER.sub(member, b"".join(response.body))
        except Exception as err:
            response.close()
            if isinstance(err, WerkError):
                raise
            raise WerkError(ErrorCode.UNAVAILABLE, INCOMPLETE, retryable=True) from err
        for key in [k for k in response.headers if k.lower() == "content-length"]:
            response.headers[key] = str(len(whole))
        body = iter([whole])
    else:
        return response
    return InferenceResponse(response.status, response.headers, body, response.close, source)


__all__ = ["named"]
