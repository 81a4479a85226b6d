"""OpenAI's speech route, ``POST /v1/audio/speech`` (docs/media.md, "Speech").

The body's fields become one :class:`~werk_host.protocol.speech.SpeechRequest` and run through
:class:`~werk_host.service.media.MediaService` (routing, the adapter's limits, the gate), as a
``kind: speech`` job does. The answer is the audio itself, ``Content-Type`` its format's
(``audio/wav``, ``audio/mpeg``, ...). OpenAI's fields: ``model``, ``input``, ``voice``,
``response_format``, ``speed``, ``instructions``, ``stream_format`` (``audio`` only: the
backends answer whole audio, so ``sse`` is refused). Werk's extensions: ``seed`` (the same
seed gives the same samples) and ``language``. An unknown field, an empty or over-long
``input``, an unknown voice, language or format, or a control the model lacks is a 400 in
OpenAI's error shape before any work.
"""

from __future__ import annotations

from typing import Any, Final

import falcon

from werk_host.errors import ErrorCode, WerkError
from werk_host.http.io import object_body, principal
from werk_host.http.media import disconnect_bound
from werk_host.service.jobs import speech_request
from werk_host.service.media import MediaService

__all__ = ["SPEECH_PATH", "add_routes"]

SPEECH_PATH: Final = "/v1/audio/speech"
_OPENAI_FIELDS: Final = frozenset(
    {"model", "input", "voice", "response_format", "speed", "instructions", "stream_format", "user"}
)
_EXTENSIONS: Final = frozenset({"seed", "language"})


class Speech:
    def __init__(self, media: MediaService) -> None:
        self.media = media

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        body = object_body(req)
        unknown = sorted(set(body) - _OPENAI_FIELDS - _EXTENSIONS)
        if unknown:
            raise WerkError(ErrorCode.INVALID_REQUEST, f"unknown field {unknown[0][:64]!r}")
        stream_format = body.get("stream_format", "audio")
        if stream_format != "audio":
            raise WerkError(ErrorCode.INVALID_REQUEST, 'stream_format must be "audio": this host answers whole audio')
        fields: dict[str, Any] = {k: v for k, v in body.items() if k not in ("stream_format", "user")}
        request = speech_request(fields, None)
        with disconnect_bound(req):
            prepared = self.media.prepare_speech(request)
            req.context.instance_id = prepared.instance.id  # the metrics label of this request
            result = self.media.speak(principal(req), prepared)
        req.context.binary = True  # the middleware keeps this content type
        resp.content_type = result.content_type
        resp.data = result.audio


def add_routes(app: falcon.App[Any, Any], media: MediaService) -> None:
    app.add_route(SPEECH_PATH, Speech(media))
